/* spawn.c: MPI_Comm_spawn through the wire-up service.
 *
 * A parent (no parent communicator) spawns two copies of this program with errors returned
 * (MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF, where MPI 4 reports errors of calls
 * without a communicator) and prints one line per rank:
 *   "rank R of N: spawn error class C (TEXT)"   the spawn failed with MPI error class C
 *   "rank R of N: spawned 2"                    it succeeded (the children are then merged and
 *                                               freed)
 * After a spawn, parents and children check each other over the intercommunicator: parent
 * rank 0 broadcasts 1000 + the parents' size, which each child checks against its remote size
 * ("child R of N: parent ok", exit 0; else "child R of N: parent sent X", exit 1), and the
 * children reduce their rank + 1 to parent rank 0, which checks the sum ("rank 0 of N:
 * children ok"; else "children sent X" and exit 1).
 *
 * Exits 0 if the spawn failed with an error (a launcher that does not serve spawn must say so
 * at once), 3 if it succeeded and the check passed, so a test can tell which it saw from the
 * exit code alone. The spawn's own wall time is printed as "spawn took S s" so a test can see
 * it did not wait.
 *
 * With --children-die the parents pass --die to the children, which exit 7 before MPI_Init
 * (never connecting back: the parents would wait in MPI_Comm_spawn forever unless the launcher
 * ends the job).
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--die") == 0)
        return 7;
    char *die[] = {"--die", NULL};
    int children_die = argc > 1 && strcmp(argv[1], "--children-die") == 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        int parents = -1, token = -1, mine = rank + 1;
        MPI_Comm_remote_size(parent, &parents);
        MPI_Bcast(&token, 1, MPI_INT, 0, parent);
        MPI_Reduce(&mine, NULL, 1, MPI_INT, MPI_SUM, 0, parent);
        /* Every parent has connected to every child before any child may exit: MPICH over
         * UCX shared memory fails a parent still reaching a child that has gone. */
        MPI_Barrier(parent);
        int ok = token == 1000 + parents;
        if (ok)
            printf("child %d of %d: parent ok\n", rank, size);
        else
            printf("child %d of %d: parent sent %d\n", rank, size, token);
        fflush(stdout);
        MPI_Comm_disconnect(&parent);
        MPI_Finalize();
        return ok ? 0 : 1;
    }
    MPI_Comm children = MPI_COMM_NULL;
    int codes[2] = {-1, -1};
    double t0 = MPI_Wtime();
    int err = MPI_Comm_spawn(argv[0], children_die ? die : MPI_ARGV_NULL, 2, MPI_INFO_NULL, 0,
                             MPI_COMM_WORLD, &children, codes);
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
        int token = 1000 + size, sum = -1, none = 0;
        MPI_Bcast(&token, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, children);
        MPI_Reduce(&none, &sum, 1, MPI_INT, MPI_SUM, rank == 0 ? MPI_ROOT : MPI_PROC_NULL,
                   children);
        MPI_Barrier(children);
        status = 3;
        if (rank == 0 && sum == 1 + 2) {
            printf("rank %d of %d: children ok\n", rank, size);
        } else if (rank == 0) {
            printf("rank %d of %d: children sent %d\n", rank, size, sum);
            status = 1;
        }
        MPI_Comm_disconnect(&children);
    }
    printf("rank %d of %d: spawn took %.1f s\n", rank, size, took);
    fflush(stdout);
    MPI_Finalize();
    return status;
}
