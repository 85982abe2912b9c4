# Sourced by the project's scripts: makes sure a Rust toolchain is on PATH,
# installing Debian's when the machine has none.
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "uvia: no cargo found; installing Debian's Rust toolchain" >&2
    if [ "$(id -u)" -ne 0 ]; then
        echo "uvia: run as root (or install cargo) to continue" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc >/dev/null
fi
# The udp tests and `--netns` make test hosts with the `ip` command.
if ! command -v ip >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "uvia: installing iproute2 (the ip command) for the test hosts" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
