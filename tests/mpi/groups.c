/* groups.c: communicators built from groups without a parent communicator (MPI-4), which Open
 * MPI 5 numbers through PMIx_Group_construct with PMIX_GROUP_ASSIGN_CONTEXT_ID, checked by
 * every rank. Needs an even number of ranks, at least 4.
 *
 * 1. MPI_Comm_create_from_group over the even and over the odd world ranks (two groups
 *    constructed at once, distinct tags): an allreduce of the world ranks over each, and a
 *    ring message, give the group's sum and neighbour.
 * 2. MPI_Intercomm_create_from_groups between the first and the second half of the world:
 *    an allreduce over the intercommunicator returns the remote half's sum.
 * 3. Both again (new tags), so that every rank holds four group-made communicators at once;
 *    messages on one never reach another.
 *
 * Prints "rank R of N: ok" when every check passed, else "rank R of N: FAILED ..." and exits 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

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

/* The world ranks first, first+step, ... below size. */
static MPI_Group strided(MPI_Group world, int first, int step)
{
    int ranges[1][3] = {{first, size - 1, step}};
    MPI_Group g;
    int rc = MPI_Group_range_incl(world, 1, ranges, &g);
    if (rc != MPI_SUCCESS)
        fail("group range", rc);
    return g;
}

static int sum_of(int first, int last, int step)
{
    int s = 0;
    for (int r = first; r <= last; r += step)
        s += r;
    return s;
}

/* Even or odd ranks: an allreduce and a ring shift over the new communicator. */
static MPI_Comm parity_comm(MPI_Group world, const char *round)
{
    int parity = rank % 2;
    MPI_Group mine = strided(world, parity, 2);
    char tag[64];
    snprintf(tag, sizeof tag, "greedy-%s-%s", parity ? "odd" : "even", round);
    MPI_Comm comm;
    int rc = MPI_Comm_create_from_group(mine, tag, MPI_INFO_NULL, MPI_ERRORS_RETURN, &comm);
    if (rc != MPI_SUCCESS)
        fail("MPI_Comm_create_from_group", rc);
    MPI_Group_free(&mine);
    int n, me, total = 0;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    if (n != size / 2 || me != rank / 2)
        fail("parity communicator has the wrong shape", MPI_SUCCESS);
    rc = MPI_Allreduce(&rank, &total, 1, MPI_INT, MPI_SUM, comm);
    if (rc != MPI_SUCCESS)
        fail("allreduce over the parity communicator", rc);
    if (total != sum_of(parity, size - 1, 2))
        fail("parity allreduce sum", MPI_SUCCESS);
    int from = -1;
    rc = MPI_Sendrecv(&rank, 1, MPI_INT, (me + 1) % n, 7, &from, 1, MPI_INT, (me + n - 1) % n, 7,
                      comm, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        fail("ring over the parity communicator", rc);
    if (from != 2 * ((me + n - 1) % n) + parity)
        fail("ring neighbour", MPI_SUCCESS);
    return comm;
}

/* First half to second half: the allreduce over the intercommunicator is the remote sum. */
static MPI_Comm halves_comm(MPI_Group world, const char *round)
{
    int half = size / 2, upper = rank >= half;
    int lo_range[1][3] = {{0, half - 1, 1}}, hi_range[1][3] = {{half, size - 1, 1}};
    MPI_Group lo, hi;
    MPI_Group_range_incl(world, 1, lo_range, &lo);
    MPI_Group_range_incl(world, 1, hi_range, &hi);
    char tag[64];
    snprintf(tag, sizeof tag, "greedy-halves-%s", round);
    MPI_Comm inter;
    int rc = MPI_Intercomm_create_from_groups(upper ? hi : lo, 0, upper ? lo : hi, 0, tag,
                                              MPI_INFO_NULL, MPI_ERRORS_RETURN, &inter);
    if (rc != MPI_SUCCESS)
        fail("MPI_Intercomm_create_from_groups", rc);
    MPI_Group_free(&lo);
    MPI_Group_free(&hi);
    int remote = 0, total = 0;
    MPI_Comm_remote_size(inter, &remote);
    if (remote != half)
        fail("intercommunicator remote size", MPI_SUCCESS);
    rc = MPI_Allreduce(&rank, &total, 1, MPI_INT, MPI_SUM, inter);
    if (rc != MPI_SUCCESS)
        fail("allreduce over the intercommunicator", rc);
    int want = upper ? sum_of(0, half - 1, 1) : sum_of(half, size - 1, 1);
    if (total != want)
        fail("intercommunicator allreduce sum", MPI_SUCCESS);
    return inter;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 4 || size % 2)
        fail("needs an even number of ranks, at least 4", MPI_SUCCESS);
    MPI_Group world;
    MPI_Comm_group(MPI_COMM_WORLD, &world);

    MPI_Comm parity1 = parity_comm(world, "1");
    MPI_Comm halves1 = halves_comm(world, "1");
    MPI_Comm parity2 = parity_comm(world, "2");
    MPI_Comm halves2 = halves_comm(world, "2");

    /* Same tag, same peers, four communicators: each message arrives on its own one. */
    MPI_Comm comms[4] = {parity1, halves1, parity2, halves2};
    for (int i = 0; i < 4; i++) {
        int total = 0, one = i + 1;
        int rc = MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, comms[i]);
        if (rc != MPI_SUCCESS)
            fail("allreduce over a kept communicator", rc);
        if (total != (i + 1) * size / 2)
            fail("a message crossed communicators", MPI_SUCCESS);
    }
    for (int i = 0; i < 4; i++)
        MPI_Comm_free(&comms[i]);
    MPI_Group_free(&world);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d of %d: ok\n", rank, size);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
