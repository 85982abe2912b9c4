/*
 * The MPI ping-pong `uvia mpi` times: ranks 0 and 1, each pinned to the core
 * of its rank number, bounce one message of each size; every round trip is
 * timed on rank 0 with CLOCK_MONOTONIC. For each size rank 0 prints
 *   size <bytes> iters <n> p50 <ns> p99 <ns> mean <ns>
 * one-way times (half the round trip), after a tenth as many untimed round
 * trips (10 at least). Built by `uvia mpi` with the MPI's own mpicc; any
 * MPI launcher runs it.
 *
 * Usage: mpi_pingpong SIZES ITERS (comma-separated lists of one length:
 * bytes, and round trips for each size)
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    long nsizes = 0, niters = 0, sizes_v[64], iters_v[64];
    if (argc == 3) {
        char *a = strdup(argv[1]), *b = strdup(argv[2]);
        for (char *t = strtok(a, ","); t != NULL && nsizes < 64; t = strtok(NULL, ","))
            sizes_v[nsizes++] = atol(t);
        for (char *t = strtok(b, ","); t != NULL && niters < 64; t = strtok(NULL, ","))
            iters_v[niters++] = atol(t);
        free(a);
        free(b);
    }
    int bad = argc != 3 || nranks != 2 || nsizes == 0 || nsizes != niters;
    for (long i = 0; i < nsizes && !bad; i++)
        bad = sizes_v[i] < 0 || sizes_v[i] > (1L << 30) || iters_v[i] < 1;
    if (bad) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: mpi_pingpong SIZES ITERS (lists of one length), on 2 ranks (got %d)\n",
                    nranks);
        MPI_Finalize();
        return 2;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        perror("mpi_pingpong: pinning to a core (running unpinned)");
    for (long i = 0; i < nsizes; i++) {
        long n = sizes_v[i], iters = iters_v[i], warmup = iters / 10 > 10 ? iters / 10 : 10;
        long long *t = malloc(sizeof(long long) * (size_t)iters);
        char *b = malloc(n > 0 ? (size_t)n : 1);
        if (t == NULL || b == NULL)
            MPI_Abort(MPI_COMM_WORLD, 2);
        memset(b, 1, (size_t)n);
        MPI_Barrier(MPI_COMM_WORLD);
        for (long k = -warmup; k < iters; k++) {
            long long t0 = now_ns();
            if (rank == 0) {
                MPI_Send(b, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(b, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(b, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(b, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
            }
            if (k >= 0)
                t[k] = now_ns() - t0;
        }
        if (rank == 0) {
            double sum = 0;
            for (long k = 0; k < iters; k++)
                sum += (double)t[k];
            qsort(t, (size_t)iters, sizeof t[0], cmp);
            printf("size %ld iters %ld p50 %.1f p99 %.1f mean %.1f\n", n, iters,
                   (double)t[iters / 2] / 2, (double)t[(iters * 99) / 100] / 2,
                   sum / (double)iters / 2);
            fflush(stdout);
        }
        free(b);
        free(t);
    }
    MPI_Finalize();
    return 0;
}
