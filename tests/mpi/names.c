/* names.c: MPI name publishing through the wire-up service (MPI_Publish_name, MPI_Lookup_name,
 * MPI_Unpublish_name; issue 37).
 *
 * Every rank first looks up a name nobody published: it must fail at once with MPI_ERR_NAME
 * (MPI's lookup does not wait). Rank 0 publishes a port under a name and checks that
 * publishing the name again fails; every other rank looks the name up and compares the answer
 * with the port rank 0 broadcasts. Then rank 0 unpublishes the name (a second unpublish must
 * fail) and every rank's lookup must fail with MPI_ERR_NAME again.
 *
 * Errors return (MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF, where MPI 4 reports
 * errors of calls without a communicator). Prints "rank R of N: ok" and exits 0 only if every
 * check on every rank held; each failed check prints one line naming the rank.
 *
 * The "port" is a string in MPICH's format rather than one from MPI_Open_port, which Debian's
 * MPICH 4.0.2 over UCX does not support; connecting is not under test, the name service is.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static const char SERVICE[] = "greedy-names-test";

static int expect_name_error(int rank, const char *what, int err)
{
    int cls = MPI_SUCCESS;
    if (err != MPI_SUCCESS)
        MPI_Error_class(err, &cls);
    if (cls != MPI_ERR_NAME) {
        fprintf(stderr, "rank %d: %s: error class %d, expected MPI_ERR_NAME (%d)\n", rank, what,
                cls, MPI_ERR_NAME);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int ok = 1;
    char port[MPI_MAX_PORT_NAME] = "";
    char found[MPI_MAX_PORT_NAME] = "";

    ok &= expect_name_error(rank, "lookup of a name never published",
                            MPI_Lookup_name("greedy-never-published", MPI_INFO_NULL, found));

    if (rank == 0) {
        /* A port in MPICH's format, not MPI_Open_port's: Debian's MPICH 4.0.2 over UCX cannot
         * open ports ("not supported with ucx netmod"), and the name service stores any string. */
        snprintf(port, sizeof port, "tag#0$connentry#greedy-%d$", size);
        int err = MPI_Publish_name(SERVICE, MPI_INFO_NULL, port);
        if (err != MPI_SUCCESS) {
            fprintf(stderr, "rank 0: MPI_Publish_name failed (%d)\n", err);
            ok = 0;
        }
        if (MPI_Publish_name(SERVICE, MPI_INFO_NULL, port) == MPI_SUCCESS) {
            fprintf(stderr, "rank 0: publishing %s twice succeeded\n", SERVICE);
            ok = 0;
        }
    }
    MPI_Bcast(port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank != 0) {
        int err = MPI_Lookup_name(SERVICE, MPI_INFO_NULL, found);
        if (err != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: MPI_Lookup_name(%s) failed (%d)\n", rank, SERVICE, err);
            ok = 0;
        } else if (strcmp(found, port) != 0) {
            fprintf(stderr, "rank %d: looked up \"%s\", rank 0 published \"%s\"\n", rank, found,
                    port);
            ok = 0;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank == 0) {
        if (MPI_Unpublish_name(SERVICE, MPI_INFO_NULL, port) != MPI_SUCCESS) {
            fprintf(stderr, "rank 0: MPI_Unpublish_name failed\n");
            ok = 0;
        }
        if (MPI_Unpublish_name(SERVICE, MPI_INFO_NULL, port) == MPI_SUCCESS) {
            fprintf(stderr, "rank 0: unpublishing %s twice succeeded\n", SERVICE);
            ok = 0;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);

    ok &= expect_name_error(rank, "lookup after unpublish",
                            MPI_Lookup_name(SERVICE, MPI_INFO_NULL, found));

    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (ok)
        printf("rank %d of %d: ok\n", rank, size);
    fflush(stdout);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
