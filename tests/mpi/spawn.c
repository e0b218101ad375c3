/* spawn.c: MPI_Comm_spawn through the wire-up service.
 *
 * A parent (no parent communicator) spawns two copies of this program with errors returned
 * (MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF, where MPI 4 reports errors of calls
 * without a communicator) and prints one line per rank:
 *   "rank R of N: spawn error class C (TEXT)"   the spawn failed with MPI error class C
 *   "rank R of N: spawned 2"                    it succeeded (the children are then merged and
 *                                               freed)
 * A child prints "child R of N: parent ok" and exits 0.
 *
 * With SPAWN_CHECK=1 in the environment of parent and children, both also check the
 * intercommunicator across the two namespaces: the parent prints "rank R of N: remote size S"
 * and its rank 0 sends 100+i to child i; each child prints "child R of N: parent size S" and
 * "child R of N: got V from parent 0" (V must be 100+R).
 *
 * Exits 0 if the spawn failed with an error (greedy does not serve spawn yet and must say so at
 * once), 3 if it succeeded, so a test can tell which it saw from the exit code alone. The
 * spawn's own wall time is printed as "spawn took S s" so a test can see it did not wait.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *check_env = getenv("SPAWN_CHECK");
    int check = check_env && strcmp(check_env, "1") == 0;
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        printf("child %d of %d: parent ok\n", rank, size);
        if (check) {
            int psize = -1, v = -1;
            MPI_Comm_remote_size(parent, &psize);
            printf("child %d of %d: parent size %d\n", rank, size, psize);
            MPI_Recv(&v, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
            printf("child %d of %d: got %d from parent 0\n", rank, size, v);
        }
        fflush(stdout);
        MPI_Comm_disconnect(&parent);
        MPI_Finalize();
        return 0;
    }
    MPI_Comm children = MPI_COMM_NULL;
    int codes[2] = {-1, -1};
    double t0 = MPI_Wtime();
    int err = MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD,
                             &children, codes);
    double took = MPI_Wtime() - t0;
    int status = 0;
    if (err != MPI_SUCCESS) {
        int cls = -1, len = 0;
        char text[MPI_MAX_ERROR_STRING] = "";
        MPI_Error_class(err, &cls);
        MPI_Error_string(err, text, &len);
        /* One line: the text may span several. */
        for (char *c = text; *c; c++)
            if (*c == '\n')
                *c = ' ';
        printf("rank %d of %d: spawn error class %d (%s)\n", rank, size, cls, text);
    } else {
        printf("rank %d of %d: spawned 2\n", rank, size);
        if (check) {
            int rsize = -1;
            MPI_Comm_remote_size(children, &rsize);
            printf("rank %d of %d: remote size %d\n", rank, size, rsize);
            for (int i = 0; rank == 0 && i < rsize; i++) {
                int v = 100 + i;
                MPI_Send(&v, 1, MPI_INT, i, 7, children);
            }
        }
        MPI_Comm_disconnect(&children);
        status = 3;
    }
    printf("rank %d of %d: spawn took %.1f s\n", rank, size, took);
    fflush(stdout);
    MPI_Finalize();
    return status;
}
