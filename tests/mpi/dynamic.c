/* dynamic.c: MPI's name service and connect/accept within one job, checked by every rank.
 *
 * "names": rank 0 publishes "greedy-svc" after a pause while the others are already looking
 * it up (Open MPI's MPI_Lookup_name does not wait, so they retry until it is there, at most
 * 30 s); every rank checks the port; rank 1 (if any) may not unpublish rank 0's name; rank 0
 * unpublishes it and every lookup then fails.
 *
 * "connect=P": MPI_COMM_WORLD is split into 2P equal parts; part 2i opens a port, publishes
 * it as "greedy-pair-i" and accepts, part 2i+1 looks it up and connects (Open MPI's roots
 * then swap member lists through PMIx publish + lookup with PMIX_WAIT, and every member calls
 * PMIx_Connect). Over the intercommunicator each side sums its world ranks (MPI_Allreduce
 * returns the remote side's sum), the ranks check it, then MPI_Comm_disconnect. With P > 1
 * each pair's PMIx_Connect spans some of the nodes only. (Within one job Open MPI's
 * MPI_Comm_disconnect makes no PMIx call: the intercommunicator is not "dynamic".)
 *
 * Prints "rank R of N: ok" when every check passed, else "rank R of N: FAILED ..." and exits 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static void fail(const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (rc != MPI_SUCCESS)
        MPI_Error_string(rc, msg, &len);
    printf("rank %d of %d: FAILED %s (%s)\n", rank, size, what, msg);
    fflush(stdout);
    exit(1);
}

static void names(void)
{
    char port[MPI_MAX_PORT_NAME];
    char mine[64];
    snprintf(mine, sizeof mine, "port-of-rank-0-%d", size);
    if (rank == 0) {
        usleep(500 * 1000); /* the others look up before this is published */
        int rc = MPI_Publish_name("greedy-svc", MPI_INFO_NULL, mine);
        if (rc != MPI_SUCCESS)
            fail("publish", rc);
        /* A second publish of the same name is refused. */
        if (MPI_Publish_name("greedy-svc", MPI_INFO_NULL, "other") == MPI_SUCCESS)
            fail("second publish succeeded", MPI_SUCCESS);
    } else {
        int tries = 0, rc;
        while ((rc = MPI_Lookup_name("greedy-svc", MPI_INFO_NULL, port)) != MPI_SUCCESS) {
            if (++tries > 3000)
                fail("lookup never succeeded", rc);
            usleep(10 * 1000);
        }
        if (strcmp(port, mine) != 0)
            fail("lookup returned another port", MPI_SUCCESS);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1 && MPI_Unpublish_name("greedy-svc", MPI_INFO_NULL, mine) == MPI_SUCCESS)
        fail("rank 1 unpublished rank 0's name", MPI_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        int rc = MPI_Unpublish_name("greedy-svc", MPI_INFO_NULL, mine);
        if (rc != MPI_SUCCESS)
            fail("unpublish", rc);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (MPI_Lookup_name("greedy-svc", MPI_INFO_NULL, port) == MPI_SUCCESS)
        fail("lookup after unpublish succeeded", MPI_SUCCESS);
}

static void connect_pairs(int pairs)
{
    int parts = 2 * pairs;
    if (size % parts != 0)
        fail("size is not a multiple of 2P", MPI_SUCCESS);
    int part = rank / (size / parts), pair = part / 2, accepting = part % 2 == 0;
    MPI_Comm half, inter;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, part, rank, &half);
    if (rc != MPI_SUCCESS)
        fail("split", rc);
    char service[64], port[MPI_MAX_PORT_NAME] = "";
    snprintf(service, sizeof service, "greedy-pair-%d", pair);
    int half_rank;
    MPI_Comm_rank(half, &half_rank);
    if (accepting) {
        if (half_rank == 0) {
            if ((rc = MPI_Open_port(MPI_INFO_NULL, port)) != MPI_SUCCESS)
                fail("open port", rc);
            if ((rc = MPI_Publish_name(service, MPI_INFO_NULL, port)) != MPI_SUCCESS)
                fail("publish port", rc);
        }
        MPI_Barrier(MPI_COMM_WORLD); /* published before anyone looks */
        rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, half, &inter);
        if (rc != MPI_SUCCESS)
            fail("accept", rc);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        if (half_rank == 0 && (rc = MPI_Lookup_name(service, MPI_INFO_NULL, port)) != MPI_SUCCESS)
            fail("lookup port", rc);
        rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, half, &inter);
        if (rc != MPI_SUCCESS)
            fail("connect", rc);
    }
    int remote_size;
    MPI_Comm_remote_size(inter, &remote_size);
    if (remote_size != size / parts)
        fail("remote group size", MPI_SUCCESS);
    /* Each side's sum of world ranks arrives at the other side. */
    long mine = rank, theirs = -1, expect = 0;
    int other = accepting ? part + 1 : part - 1;
    for (int r = other * (size / parts); r < (other + 1) * (size / parts); r++)
        expect += r;
    if ((rc = MPI_Allreduce(&mine, &theirs, 1, MPI_LONG, MPI_SUM, inter)) != MPI_SUCCESS)
        fail("allreduce over the intercommunicator", rc);
    if (theirs != expect) {
        char what[96];
        snprintf(what, sizeof what, "intercommunicator sum %ld, expected %ld", theirs, expect);
        fail(what, MPI_SUCCESS);
    }
    if ((rc = MPI_Comm_disconnect(&inter)) != MPI_SUCCESS)
        fail("disconnect", rc);
    MPI_Barrier(MPI_COMM_WORLD);
    if (accepting && half_rank == 0) {
        if ((rc = MPI_Unpublish_name(service, MPI_INFO_NULL, port)) != MPI_SUCCESS)
            fail("unpublish port", rc);
        MPI_Close_port(port);
    }
    MPI_Comm_free(&half);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int pairs;
    if (argc > 1 && strcmp(argv[1], "names") == 0)
        names();
    else if (argc > 1 && sscanf(argv[1], "connect=%d", &pairs) == 1 && pairs > 0)
        connect_pairs(pairs);
    else
        fail("usage: dynamic names|connect=P", MPI_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d of %d: ok\n", rank, size);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
