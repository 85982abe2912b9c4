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
# The VIPL C library's install, conformance suite and examples need a C
# compiler and pkg-config.
need_pkgs=()
command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
command -v pkg-config >/dev/null 2>&1 || need_pkgs+=(pkg-config)
# The libfabric provider (crates/uvia-fabric) is generated from libfabric's
# headers with bindgen, which needs libclang; its tests run fi_info and
# fi_pingpong.
[ -f /usr/include/rdma/providers/fi_prov.h ] || need_pkgs+=(libfabric-dev)
command -v fi_info >/dev/null 2>&1 || need_pkgs+=(libfabric-bin)
# (libclang itself: libclang-cpp, which other packages bring, is not it.)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1 \
    || ls /usr/lib/*/libclang-[0-9]*.so* >/dev/null 2>&1 || need_pkgs+=(libclang-dev)
# Its libfabric 2.x tests pip-install the MPICH wheel (which bundles
# libfabric 2.x) into a virtual environment of their own.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
# MPI over the provider: Open MPI (its ofi MTL) with ready-made MPI programs
# (mpi4py for Debian's python3, NetPIPE), and unshare for the test hosts'
# launcher agent.
# (openmpi-bin alone brings mpicc without mpi.h: the header is checked.)
echo '#include <mpi.h>' | mpicc -E -x c - >/dev/null 2>&1 || need_pkgs+=(openmpi-bin libopenmpi-dev)
/usr/bin/python3 -c 'import mpi4py' >/dev/null 2>&1 || need_pkgs+=(python3-mpi4py)
command -v NPopenmpi >/dev/null 2>&1 || need_pkgs+=(netpipe-openmpi)
command -v unshare >/dev/null 2>&1 || need_pkgs+=(util-linux)
# The tool's tests run one real peer of `uvia peers` (UCX's ucx_perftest).
command -v ucx_perftest >/dev/null 2>&1 || need_pkgs+=(ucx-utils)
if [ "${#need_pkgs[@]}" -gt 0 ] && [ "$(id -u)" -eq 0 ]; then
    echo "uvia: installing ${need_pkgs[*]} for the C API's programs and the libfabric provider" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
