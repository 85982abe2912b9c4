/*
 * An MPI ping-pong between ranks 0 and 1, 1 B to 1 MiB by powers of 4, ten
 * round trips a size: rank 1 adds one to every byte it echoes, rank 0
 * checks it. Prints "mpi pingpong: ok" (or what went wrong) from rank 0 and
 * exits non-zero on bad data. Built with an MPI's own mpicc;
 * tests/libfabric2.rs runs it over the provider under MPICH's libfabric.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int bad = 0;
    for (int n = 1; n <= (1 << 20) && !bad; n *= 4) {
        unsigned char *b = malloc(n);
        if (b == NULL)
            MPI_Abort(MPI_COMM_WORLD, 2);
        for (int k = 0; k < 10; k++) {
            unsigned char v = (unsigned char)(k + n);
            if (rank == 0) {
                memset(b, v, n);
                MPI_Send(b, n, MPI_BYTE, 1, k, MPI_COMM_WORLD);
                MPI_Recv(b, n, MPI_BYTE, 1, k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (int i = 0; i < n && !bad; i++)
                    if (b[i] != (unsigned char)(v + 1)) {
                        printf("mpi pingpong: %d B, byte %d is %u, want %u\n", n, i, b[i],
                               (unsigned char)(v + 1));
                        bad = 1;
                    }
            } else if (rank == 1) {
                MPI_Recv(b, n, MPI_BYTE, 0, k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (int i = 0; i < n; i++)
                    b[i]++;
                MPI_Send(b, n, MPI_BYTE, 0, k, MPI_COMM_WORLD);
            }
        }
        free(b);
        MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    if (rank == 0 && !bad)
        printf("mpi pingpong: ok\n");
    MPI_Finalize();
    return bad;
}
