/* spawn_multiple.c: MPI_Comm_spawn_multiple across hosts, and the ways a spawn must fail.
 *
 * Usage: spawn_multiple MODE [HOST_A HOST_B]
 *   across A B  the parent job (every rank takes part; root 0) spawns two programs with one call:
 *               2 copies of this program with argument "child" on host A and 1 copy on host B
 *               (info "host"). Each child sends the parent root its line "R APPNUM WHERE" (WHERE:
 *               "node<GREEDY_NODE>" under greedyrun, else the host name); the
 *               root prints "parent: child R app K on H", checks the error codes, the remote
 *               group's size (3) and every child's app number, and all ranks exit 0 if so, 1
 *               if not. A child prints "child R of N app K: parent size P" first.
 *   missing     spawns a program that does not exist
 *   many        spawns 4096 copies (more than any test allocation has slots)
 *               both print "rank R: spawn error class C" and exit 0 when the spawn failed, 3 when
 *               it succeeded.
 *   crash       spawns one child that exits 7 before MPI_Finalize, then waits for it in a
 *               barrier: the launcher must end the job with the child's code, naming it.
 *   universe    prints "rank R: universe U" (MPI_UNIVERSE_SIZE, or -1 when not set) and exits 0.
 * Errors are returned (MPI_ERRORS_RETURN on WORLD and SELF) so a failed spawn prints, never
 * aborts.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE 256

static int child(MPI_Comm parent, int argc, char **argv)
{
    int rank, size, psize, *appnum = NULL, flag = 0;
    char host[128] = "", line[LINE];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_remote_size(parent, &psize);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    /* Where the child runs: greedy's node number when it is greedy's, else the host name. */
    const char *node = getenv("GREEDY_NODE");
    if (node)
        snprintf(host, sizeof host, "node%s", node);
    else
        gethostname(host, sizeof host - 1);
    int app = flag ? *appnum : -1;
    printf("child %d of %d app %d: parent size %d\n", rank, size, app, psize);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "crash") == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
        exit(7);
    }
    snprintf(line, sizeof line, "%d %d %s", rank, app, host);
    MPI_Send(line, LINE, MPI_CHAR, 0, 1, parent);
    /* Every parent has reached every child before any child exits: MPICH over UCX shared
     * memory fails a parent still connecting to a child that has gone. */
    MPI_Barrier(parent);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
}

static int failing(const char *what, int rank)
{
    char *cmd = (char *)(strcmp(what, "missing") == 0 ? "/nonexistent/greedy-spawn-child"
                                                       : "/bin/true");
    int n = strcmp(what, "many") == 0 ? 4096 : 1;
    int *codes = calloc(n, sizeof *codes);
    MPI_Comm inter = MPI_COMM_NULL;
    int err = MPI_Comm_spawn(cmd, MPI_ARGV_NULL, n, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
                             codes);
    free(codes);
    if (err == MPI_SUCCESS) {
        printf("rank %d: spawn of %s x%d succeeded\n", rank, what, n);
        return 3;
    }
    int cls = -1;
    MPI_Error_class(err, &cls);
    printf("rank %d: spawn error class %d\n", rank, cls);
    return 0;
}

static int across(int rank, const char *a, const char *b, char *self)
{
    char *cmds[2] = {self, self};
    char *args0[] = {"child", NULL}, *args1[] = {"child", NULL};
    char **argvs[2] = {args0, args1};
    int counts[2] = {2, 1}, codes[3] = {-1, -1, -1};
    MPI_Info infos[2];
    MPI_Info_create(&infos[0]);
    MPI_Info_create(&infos[1]);
    MPI_Info_set(infos[0], "host", a);
    MPI_Info_set(infos[1], "host", b);
    MPI_Comm inter = MPI_COMM_NULL;
    int err = MPI_Comm_spawn_multiple(2, cmds, argvs, counts, infos, 0, MPI_COMM_WORLD, &inter,
                                      codes);
    if (err != MPI_SUCCESS) {
        int cls = -1;
        MPI_Error_class(err, &cls);
        printf("rank %d: spawn_multiple error class %d\n", rank, cls);
        return 1;
    }
    int ok = 1, remote = 0;
    MPI_Comm_remote_size(inter, &remote);
    if (remote != 3) {
        printf("rank %d: remote size %d, not 3\n", rank, remote);
        ok = 0;
    }
    if (rank == 0) {
        for (int i = 0; i < 3; i++)
            if (codes[i] != MPI_SUCCESS) {
                printf("parent: error code %d of child %d\n", codes[i], i);
                ok = 0;
            }
        for (int i = 0; i < remote; i++) {
            char line[LINE];
            int r = -1, app = -1;
            char host[128] = "";
            MPI_Recv(line, LINE, MPI_CHAR, i, 1, inter, MPI_STATUS_IGNORE);
            sscanf(line, "%d %d %127s", &r, &app, host);
            printf("parent: child %d app %d on %s\n", r, app, host);
            if (r != i || app != (i < 2 ? 0 : 1))
                ok = 0;
        }
    }
    MPI_Barrier(inter);
    MPI_Comm_disconnect(&inter);
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL)
        return child(parent, argc, argv);
    int rank = -1, status = 2;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "across") == 0 && argc > 3) {
        status = across(rank, argv[2], argv[3], argv[0]);
    } else if (strcmp(mode, "missing") == 0 || strcmp(mode, "many") == 0) {
        status = failing(mode, rank);
    } else if (strcmp(mode, "universe") == 0) {
        int *universe = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &universe, &flag);
        printf("rank %d: universe %d\n", rank, flag ? *universe : -1);
        status = 0;
    } else if (strcmp(mode, "crash") == 0) {
        char *args[] = {"crash", NULL};
        MPI_Comm inter = MPI_COMM_NULL;
        int err = MPI_Comm_spawn(argv[0], args, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter,
                                 MPI_ERRCODES_IGNORE);
        printf("rank %d: spawned the crashing child (error %d)\n", rank, err);
        fflush(stdout);
        if (err == MPI_SUCCESS)
            MPI_Barrier(inter); /* the child never enters it */
        status = 4;
    } else {
        fprintf(stderr, "usage: spawn_multiple across HOST_A HOST_B | missing | many | crash | universe\n");
    }
    fflush(stdout);
    MPI_Finalize();
    return status;
}
