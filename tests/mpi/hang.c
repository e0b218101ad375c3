/* hang.c: a hung MPI job for greedy-stack, the way STAT finds one: rank STUCK (default the
 * last) spins in compute() for ever, every other rank waits in MPI_Barrier for it.
 *
 * Usage: hang [STUCK]   Prints "rank R of N ready" once past MPI_Init, so a test knows when
 * every rank is in place. Build with -g -O0 (or -fno-inline) so the frames keep their names. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static volatile unsigned long spins;

__attribute__((noinline)) static void compute(void)
{
    for (;;) spins++;
}

__attribute__((noinline)) static void wait_for_the_others(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int stuck = argc > 1 ? atoi(argv[1]) : size - 1;
    printf("rank %d of %d ready\n", rank, size);
    fflush(stdout);
    if (rank == stuck) compute();
    wait_for_the_others();
    MPI_Finalize();
    return 0;
}
