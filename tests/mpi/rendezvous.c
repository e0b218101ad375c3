/* rendezvous.c: two separate jobs find each other by name and connect.
 *
 * usage: rendezvous accept NAME | rendezvous connect NAME
 *
 * accept: rank 0 opens a port and publishes it as NAME (MPI_Publish_name); the job accepts
 *         one connection on it, then unpublishes NAME and closes the port.
 * connect: rank 0 looks NAME up (MPI_Lookup_name), trying again every 100 ms for up to 60 s
 *          (the other job may not have published it yet); the job connects to it.
 * Then both: an allreduce over the intercommunicator (each accept rank gives 1, each connect
 * rank 1000, so each side receives the other's size, scaled), and a disconnect.
 *
 * Prints "rank R of N (accept|connect): ok" when the other side's sum is right, else a
 * FAILED line naming the call, and exits 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, size;
static const char *role = "?";

static void check(const char *what, int rc)
{
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        printf("rank %d of %d (%s): FAILED %s: %s\n", rank, size, role, what, msg);
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The port published as `name`, waiting for up to 60 s for it to be published. */
static void lookup(const char *name, char *port)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = MPI_Lookup_name(name, MPI_INFO_NULL, port);
        if (rc == MPI_SUCCESS)
            return;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60)
            check("MPI_Lookup_name (60 s)", rc);
        usleep(100000);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (argc != 3 || (strcmp(argv[1], "accept") && strcmp(argv[1], "connect"))) {
        if (rank == 0)
            fprintf(stderr, "usage: %s accept|connect NAME\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    role = argv[1];
    const char *name = argv[2];
    int accepting = strcmp(role, "accept") == 0;
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm inter;
    if (accepting) {
        if (rank == 0) {
            check("MPI_Open_port", MPI_Open_port(MPI_INFO_NULL, port));
            check("MPI_Publish_name", MPI_Publish_name(name, MPI_INFO_NULL, port));
        }
        check("MPI_Comm_accept",
              MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter));
    } else {
        if (rank == 0)
            lookup(name, port);
        check("MPI_Comm_connect",
              MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter));
    }
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    int remote = 0;
    MPI_Comm_remote_size(inter, &remote);
    int mine = accepting ? 1 : 1000, sum = 0;
    check("MPI_Allreduce", MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, inter));
    int expected = remote * (accepting ? 1000 : 1);
    if (accepting && rank == 0) {
        check("MPI_Unpublish_name", MPI_Unpublish_name(name, MPI_INFO_NULL, port));
        check("MPI_Close_port", MPI_Close_port(port));
    }
    check("MPI_Comm_disconnect", MPI_Comm_disconnect(&inter));
    if (sum != expected) {
        printf("rank %d of %d (%s): FAILED the other side's sum is %d, not %d\n", rank, size,
               role, sum, expected);
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("rank %d of %d (%s): ok\n", rank, size, role);
    MPI_Finalize();
    return 0;
}
