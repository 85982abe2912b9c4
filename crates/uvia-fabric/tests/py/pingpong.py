"""An mpi4py ping-pong between ranks 0 and 1: sizes 1 B to 1 MiB, each
round trip's data checked (rank 1 echoes every byte plus one), with the
median one-way time per size. Prints "mpi4py pingpong: ok" from rank 0, or
what went wrong, and exits non-zero on bad data. Run under any MPI
launcher, e.g. scripts/uvia-mpirun -n 2 python3 pingpong.py [--iters N]."""

import argparse
import statistics
import sys
import time

from mpi4py import MPI

# Each byte to the next value: rank 1's echo.
PLUS_ONE = bytes((i + 1) % 256 for i in range(256))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=100, help="round trips per size")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        if rank == 0:
            print("mpi4py pingpong: needs 2 ranks", file=sys.stderr)
        return 2
    bad = 0
    size = 1
    while size <= 1 << 20 and not bad:
        buf = bytearray(size)
        times = []
        for k in range(args.iters):
            value = (k + size) % 255
            if rank == 0:
                buf[:] = bytes([value]) * size
                t0 = time.perf_counter()
                comm.Send([buf, MPI.BYTE], dest=1, tag=k)
                comm.Recv([buf, MPI.BYTE], source=1, tag=k)
                times.append((time.perf_counter() - t0) / 2)
                if buf != bytes([value + 1]) * size:
                    first = next(i for i, b in enumerate(buf) if b != value + 1)
                    print(f"mpi4py pingpong: {size} B, byte {first} is {buf[first]}, want {value + 1}")
                    bad = 1
                    break
            elif rank == 1:
                comm.Recv([buf, MPI.BYTE], source=0, tag=k)
                buf[:] = bytes(buf).translate(PLUS_ONE)
                comm.Send([buf, MPI.BYTE], dest=0, tag=k)
        bad = comm.bcast(bad, root=0)
        if rank == 0 and not bad:
            print(f"mpi4py pingpong: {size:8d} B {statistics.median(times) * 1e6:10.2f} us one way")
        size *= 4
    if rank == 0 and not bad:
        print("mpi4py pingpong: ok")
    return bad


if __name__ == "__main__":
    sys.exit(main())
