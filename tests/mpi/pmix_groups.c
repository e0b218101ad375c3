/* pmix_groups.c: a libpmix client constructing PMIx groups as Open MPI 5 does for
 * MPI_Comm_create_from_group and MPI_Intercomm_create_from_groups (ompi/communicator/
 * comm_cid.c@v5.0.10: PMIx_Group_construct with PMIX_GROUP_ASSIGN_CONTEXT_ID and a
 * PMIX_GROUP_INFO carrying PMIX_GROUP_LOCAL_CID, then PMIx_Group_destruct). Needs an even
 * number of ranks, at least 4.
 *
 * 1. The whole job: every rank gets a context id, and reads a remote member's
 *    PMIX_GROUP_LOCAL_CID qualified by it (the group info travelled with the endpoint data).
 * 2. The even and the odd ranks at once, as two groups.
 * 3. The whole job again.
 * Each rank prints "rank R: group NAME ctxid C" per group (the test checks that members agree
 * and groups differ), destructs each group, and prints "rank R of N: ok" when every check
 * passed, else "rank R of N: FAILED ..." and exits 1.
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pmix_proc_t me;
static unsigned size;

static void fail(const char *what, pmix_status_t rc)
{
    printf("rank %u of %u: FAILED %s (%s)\n", me.rank, size, what, PMIx_Error_string(rc));
    fflush(stdout);
    exit(1);
}

static void check(const char *what, pmix_status_t rc)
{
    if (rc != PMIX_SUCCESS)
        fail(what, rc);
}

/* Constructs group `name` over ranks first, first+step, ...; returns its context id. */
static size_t construct(const char *name, unsigned first, unsigned step)
{
    unsigned n = 0;
    pmix_proc_t procs[64];
    for (unsigned r = first; r < size && n < 64; r += step, n++)
        PMIX_LOAD_PROCID(&procs[n], me.nspace, r); /* a macro: no n++ inside */
    size_t local_cid = 100 + me.rank;
    pmix_data_array_t darray;
    PMIX_DATA_ARRAY_CONSTRUCT(&darray, 1, PMIX_INFO);
    PMIX_INFO_LOAD((pmix_info_t *)darray.array, PMIX_GROUP_LOCAL_CID, &local_cid, PMIX_SIZE);
    pmix_info_t info[2];
    PMIX_INFO_LOAD(&info[0], PMIX_GROUP_ASSIGN_CONTEXT_ID, NULL, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_GROUP_INFO, &darray, PMIX_DATA_ARRAY);
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    check(name, PMIx_Group_construct(name, procs, n, info, 2, &results, &nresults));
    size_t ctxid = 0;
    int found = 0;
    for (size_t i = 0; i < nresults; i++) {
        if (PMIX_CHECK_KEY(&results[i], PMIX_GROUP_CONTEXT_ID)) {
            pmix_status_t rc;
            PMIX_VALUE_GET_NUMBER(rc, &results[i].value, ctxid, size_t);
            check("context id type", rc);
            found = 1;
        }
    }
    if (!found)
        fail("no PMIX_GROUP_CONTEXT_ID in the results", PMIX_ERR_NOT_FOUND);
    if (results != NULL)
        PMIX_INFO_FREE(results, nresults);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    PMIX_DATA_ARRAY_DESTRUCT(&darray);
    printf("rank %u: group %s ctxid %zu\n", me.rank, name, ctxid);
    return ctxid;
}

/* The group-local id `peer` gave, as Open MPI's ompi_comm_get_remote_cid reads it. */
static void check_remote_cid(unsigned peer, size_t ctxid)
{
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, me.nspace, peer);
    pmix_info_t q[2];
    unsigned timeout = 30;
    PMIX_INFO_LOAD(&q[0], PMIX_TIMEOUT, &timeout, PMIX_UINT32);
    PMIX_INFO_LOAD(&q[1], PMIX_GROUP_CONTEXT_ID, &ctxid, PMIX_SIZE);
    PMIX_INFO_SET_QUALIFIER(&q[1]);
    pmix_value_t *v = NULL;
    check("get a member's PMIX_GROUP_LOCAL_CID", PMIx_Get(&p, PMIX_GROUP_LOCAL_CID, q, 2, &v));
    if (v->type != PMIX_SIZE || v->data.size != 100 + peer)
        fail("a member's PMIX_GROUP_LOCAL_CID", PMIX_ERROR);
    PMIX_VALUE_RELEASE(v);
}

static void destruct(const char *name)
{
    check(name, PMIx_Group_destruct(name, NULL, 0));
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a rank killed at the deadline still tells how far */
    check("init", PMIx_Init(&me, NULL, 0));
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    check("job size", PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v));
    size = v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    if (size < 4 || size % 2)
        fail("needs an even number of ranks, at least 4", PMIX_ERR_BAD_PARAM);

    size_t all = construct("greedy-all-1", 0, 1);
    check_remote_cid((me.rank + 1) % size, all);
    destruct("greedy-all-1");

    const char *parity = me.rank % 2 ? "greedy-odd" : "greedy-even";
    construct(parity, me.rank % 2, 2);
    destruct(parity);

    construct("greedy-all-2", 0, 1);
    destruct("greedy-all-2");

    check("final fence", PMIx_Fence(NULL, 0, NULL, 0));
    printf("rank %u of %u: ok\n", me.rank, size);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
