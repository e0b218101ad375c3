/* init_time.c: when did this rank get past MPI_Init? For tests/slurm/mpi-bench.sh.
 *
 * Prints "init <rank> <size> <CLOCK_REALTIME seconds>" right after MPI_Init (every emulated
 * host shares the machine's clock, so the bench script compares it with srun's start), then an
 * MPI_Allreduce whose result is checked, a barrier and MPI_Finalize. Exits 1 on a wrong sum.
 */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("init %d %d %ld.%09ld\n", rank, size, (long)ts.tv_sec, ts.tv_nsec);
    fflush(stdout);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return sum == (long)size * (size + 1) / 2 ? 0 : 1;
}
