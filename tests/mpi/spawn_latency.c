/* spawn_latency.c: how long MPI_Comm_spawn takes, from the call to its return in the parent.
 *
 * Usage: spawn_latency N [ROUNDS]   (run as one rank)
 * The parent spawns N copies of this program ROUNDS times (default 3) in a row, each time from
 * MPI_COMM_SELF, and prints "spawn N round K took S s" per round; the call returns once every
 * child has started, finished MPI_Init and connected back. The children disconnect and finalize
 * after a barrier with the parent (not timed). Exits 0 when every spawn succeeded with N children, 1 otherwise.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        /* The parent has reached every child before any child exits: MPICH over UCX shared
         * memory fails a parent still connecting to a child that has gone. */
        MPI_Barrier(parent);
        MPI_Comm_disconnect(&parent);
        MPI_Finalize();
        return 0;
    }
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int n = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 3, status = 0;
    for (int k = 1; k <= rounds && status == 0; k++) {
        MPI_Comm inter = MPI_COMM_NULL;
        double t0 = MPI_Wtime();
        int err = MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, n, MPI_INFO_NULL, 0, MPI_COMM_SELF,
                                 &inter, MPI_ERRCODES_IGNORE);
        double took = MPI_Wtime() - t0;
        int remote = 0;
        if (err == MPI_SUCCESS)
            MPI_Comm_remote_size(inter, &remote);
        if (err != MPI_SUCCESS || remote != n) {
            printf("spawn %d round %d failed (error %d, %d children)\n", n, k, err, remote);
            status = 1;
        } else {
            printf("spawn %d round %d took %.4f s\n", n, k, took);
            MPI_Barrier(inter);
            MPI_Comm_disconnect(&inter);
        }
        fflush(stdout);
    }
    MPI_Finalize();
    return status;
}
