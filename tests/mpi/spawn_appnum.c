/* spawn_appnum.c: MPI_Comm_spawn_multiple of two commands, each child knowing its own.
 *
 * The parent job spawns two copies of this program over MPI_COMM_WORLD: command 0 with the
 * argument "a" and 1 process, command 1 with "b" and 2 processes. Each child checks that its
 * world has 3 ranks and that its MPI_APPNUM attribute is its command's index (0 for "a", 1
 * for "b"), prints "child R of 3: arg X appnum N", and sends N to parent rank 0, which prints
 * "rank 0: child C appnum N" for each child. Every rank exits 0 when the checks held, 1 (with
 * a "FAILED" line) otherwise.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = -1, size = -1, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        int *appnum = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
        int n = flag ? *appnum : -1;
        const char *arg = argc > 1 ? argv[1] : "";
        int want = strcmp(arg, "a") == 0 ? 0 : 1;
        printf("child %d of %d: arg %s appnum %d\n", rank, size, arg, n);
        if (size != 3 || n != want) {
            printf("child %d: FAILED size %d appnum %d (want 3, %d)\n", rank, size, n, want);
            ok = 0;
        }
        MPI_Send(&n, 1, MPI_INT, 0, 9, parent);
        MPI_Comm_disconnect(&parent);
    } else {
        char *cmds[2] = {argv[0], argv[0]};
        char *args_a[] = {"a", NULL}, *args_b[] = {"b", NULL};
        char **args[2] = {args_a, args_b};
        int procs[2] = {1, 2};
        MPI_Info infos[2] = {MPI_INFO_NULL, MPI_INFO_NULL};
        int codes[3] = {-1, -1, -1};
        MPI_Comm children = MPI_COMM_NULL;
        int err = MPI_Comm_spawn_multiple(2, cmds, args, procs, infos, 0, MPI_COMM_WORLD,
                                          &children, codes);
        if (err != MPI_SUCCESS) {
            printf("rank %d: FAILED spawn error %d\n", rank, err);
            ok = 0;
        } else {
            for (int c = 0; rank == 0 && c < 3; c++) {
                int n = -1;
                MPI_Recv(&n, 1, MPI_INT, c, 9, children, MPI_STATUS_IGNORE);
                printf("rank 0: child %d appnum %d\n", c, n);
                if (n != (c == 0 ? 0 : 1)) {
                    printf("rank 0: FAILED child %d appnum %d\n", c, n);
                    ok = 0;
                }
            }
            MPI_Comm_disconnect(&children);
        }
    }
    fflush(stdout);
    MPI_Finalize();
    return ok ? 0 : 1;
}
