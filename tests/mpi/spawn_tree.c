/* spawn_tree.c: every rank spawns at once, and the children spawn again.
 *
 * Run with no argument (depth 0). Every rank of depth 0 and 1 spawns one copy of this program
 * at depth+1 over MPI_COMM_SELF (so all ranks spawn concurrently, as mpi4py's tests do), sends
 * its world rank to the child over the intercommunicator and waits for the child's answer
 * (the value + 1000). Every spawned rank checks its parent intercommunicator (remote size 1),
 * prints "depth D rank R of N: parent says V" and answers. Parents print
 * "depth D rank R of N: child answered A". Exits 0 when every check held, 1 otherwise (with a
 * "FAILED" line).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_DEPTH 2

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int depth = argc > 1 ? atoi(argv[1]) : 0;
    int rank = -1, size = -1, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        int psize = -1, v = -1;
        MPI_Comm_remote_size(parent, &psize);
        MPI_Recv(&v, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
        printf("depth %d rank %d of %d: parent says %d\n", depth, rank, size, v);
        if (psize != 1) {
            printf("depth %d rank %d: FAILED parent size %d\n", depth, rank, psize);
            ok = 0;
        }
        v += 1000;
        MPI_Send(&v, 1, MPI_INT, 0, 8, parent);
    }
    if (depth < MAX_DEPTH) {
        char next[16];
        snprintf(next, sizeof next, "%d", depth + 1);
        char *args[] = {next, NULL};
        MPI_Comm child = MPI_COMM_NULL;
        int code = -1;
        int err = MPI_Comm_spawn(argv[0], args, 1, MPI_INFO_NULL, 0, MPI_COMM_SELF, &child, &code);
        if (err != MPI_SUCCESS) {
            printf("depth %d rank %d: FAILED spawn error %d\n", depth, rank, err);
            ok = 0;
        } else {
            int csize = -1, answer = -1;
            MPI_Comm_remote_size(child, &csize);
            MPI_Send(&rank, 1, MPI_INT, 0, 7, child);
            MPI_Recv(&answer, 1, MPI_INT, 0, 8, child, MPI_STATUS_IGNORE);
            printf("depth %d rank %d of %d: child answered %d\n", depth, rank, size, answer);
            if (csize != 1 || answer != rank + 1000) {
                printf("depth %d rank %d: FAILED child size %d answer %d\n", depth, rank, csize,
                       answer);
                ok = 0;
            }
            MPI_Comm_disconnect(&child);
        }
    }
    if (parent != MPI_COMM_NULL)
        MPI_Comm_disconnect(&parent);
    fflush(stdout);
    MPI_Finalize();
    return ok ? 0 : 1;
}
