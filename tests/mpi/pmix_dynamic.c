/* pmix_dynamic.c: a libpmix client checking what Open MPI does not reach within one job.
 *
 * 1. Lookup with PMIX_WAIT: every rank but 0 looks "greedy-key" up (PMIX_WAIT, PMIX_TIMEOUT
 *    30 s) before rank 0 publishes it with an int beside it; each checks the values and that
 *    rank 0 is the publisher. Rank 1 then waits 1 s for a key nobody publishes: the lookup
 *    must fail, with PMIX_ERR_TIMEOUT.
 * 2. Ownership: rank 1 may not unpublish rank 0's key (PMIX_ERR_NO_PERMISSIONS); rank 0 may,
 *    and a lookup without wait then fails with PMIX_ERR_NOT_FOUND.
 * 3. Fences over each half of the ranks at once (with PMIX_COLLECT_DATA): each rank puts
 *    "half-RANK", and after its half's fence reads every half peer's value.
 * 4. PMIx_Connect and PMIx_Disconnect over each half.
 * 5. PMIx_Connect naming another namespace fails (one server serves one job).
 *
 * Prints "rank R of N: ok" when every check passed, else "rank R of N: FAILED ..." and exits 1.
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static void names(void)
{
    pmix_status_t rc;
    if (me.rank == 0) {
        usleep(500 * 1000); /* the others are waiting by now */
        pmix_info_t info[2];
        int n = 42;
        PMIX_INFO_LOAD(&info[0], "greedy-key", "value-0", PMIX_STRING);
        PMIX_INFO_LOAD(&info[1], "greedy-int", &n, PMIX_INT);
        check("publish", PMIx_Publish(info, 2));
        PMIX_INFO_DESTRUCT(&info[0]);
        PMIX_INFO_DESTRUCT(&info[1]);
    } else {
        pmix_pdata_t pd[2];
        pmix_info_t wait[2];
        int timeout = 30;
        PMIX_PDATA_CONSTRUCT(&pd[0]);
        PMIX_PDATA_CONSTRUCT(&pd[1]);
        PMIX_LOAD_KEY(pd[0].key, "greedy-key");
        PMIX_LOAD_KEY(pd[1].key, "greedy-int");
        PMIX_INFO_LOAD(&wait[0], PMIX_WAIT, NULL, PMIX_BOOL);
        PMIX_INFO_LOAD(&wait[1], PMIX_TIMEOUT, &timeout, PMIX_INT);
        check("lookup with wait", PMIx_Lookup(pd, 2, wait, 2));
        if (pd[0].value.type != PMIX_STRING || strcmp(pd[0].value.data.string, "value-0") != 0)
            fail("lookup: wrong string", PMIX_ERROR);
        if (pd[1].value.type != PMIX_INT || pd[1].value.data.integer != 42)
            fail("lookup: wrong int", PMIX_ERROR);
        if (pd[0].proc.rank != 0)
            fail("lookup: publisher is not rank 0", PMIX_ERROR);
        PMIX_PDATA_DESTRUCT(&pd[0]);
        PMIX_PDATA_DESTRUCT(&pd[1]);
        if (me.rank == 1) {
            timeout = 1;
            PMIX_INFO_DESTRUCT(&wait[1]);
            PMIX_INFO_LOAD(&wait[1], PMIX_TIMEOUT, &timeout, PMIX_INT);
            PMIX_PDATA_CONSTRUCT(&pd[0]);
            PMIX_LOAD_KEY(pd[0].key, "never-published");
            rc = PMIx_Lookup(pd, 1, wait, 2);
            if (rc != PMIX_ERR_TIMEOUT)
                fail("waiting for a key never published did not time out", rc);
            PMIX_PDATA_DESTRUCT(&pd[0]);
        }
        PMIX_INFO_DESTRUCT(&wait[0]);
        PMIX_INFO_DESTRUCT(&wait[1]);
    }
    check("fence", PMIx_Fence(NULL, 0, NULL, 0));
    char *keys[] = {"greedy-key", "greedy-int", NULL};
    if (me.rank == 1 && (rc = PMIx_Unpublish(keys, NULL, 0)) != PMIX_ERR_NO_PERMISSIONS)
        fail("rank 1 unpublishing rank 0's keys", rc);
    check("fence", PMIx_Fence(NULL, 0, NULL, 0));
    if (me.rank == 0)
        check("unpublish", PMIx_Unpublish(keys, NULL, 0));
    check("fence", PMIx_Fence(NULL, 0, NULL, 0));
    pmix_pdata_t pd;
    PMIX_PDATA_CONSTRUCT(&pd);
    PMIX_LOAD_KEY(pd.key, "greedy-key");
    if ((rc = PMIx_Lookup(&pd, 1, NULL, 0)) != PMIX_ERR_NOT_FOUND)
        fail("lookup after unpublish", rc);
    PMIX_PDATA_DESTRUCT(&pd);
}

/* The ranks of my half: [0, size/2) or [size/2, size). */
static size_t my_half(pmix_proc_t *procs)
{
    unsigned lo = me.rank < size / 2 ? 0 : size / 2, hi = me.rank < size / 2 ? size / 2 : size;
    for (unsigned r = lo; r < hi; r++)
        PMIX_LOAD_PROCID(&procs[r - lo], me.nspace, r);
    return hi - lo;
}

static void halves(void)
{
    pmix_proc_t procs[size];
    size_t n = my_half(procs);
    char key[32], want[32];
    snprintf(key, sizeof key, "half-%u", me.rank);
    pmix_value_t v;
    PMIX_VALUE_LOAD(&v, key, PMIX_STRING);
    check("put", PMIx_Put(PMIX_GLOBAL, key, &v));
    PMIX_VALUE_DESTRUCT(&v);
    check("commit", PMIx_Commit());
    pmix_info_t collect;
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, NULL, PMIX_BOOL);
    check("fence over my half", PMIx_Fence(procs, n, &collect, 1));
    PMIX_INFO_DESTRUCT(&collect);
    for (size_t i = 0; i < n; i++) {
        pmix_value_t *got = NULL;
        snprintf(key, sizeof key, "half-%u", procs[i].rank);
        check("get a half peer's key", PMIx_Get(&procs[i], key, NULL, 0, &got));
        snprintf(want, sizeof want, "half-%u", procs[i].rank);
        if (got->type != PMIX_STRING || strcmp(got->data.string, want) != 0)
            fail("half peer's value", PMIX_ERROR);
        PMIX_VALUE_RELEASE(got);
    }
    check("connect my half", PMIx_Connect(procs, n, NULL, 0));
    check("disconnect my half", PMIx_Disconnect(procs, n, NULL, 0));
}

static void other_namespace(void)
{
    pmix_proc_t procs[2];
    PMIX_LOAD_PROCID(&procs[0], me.nspace, me.rank);
    PMIX_LOAD_PROCID(&procs[1], "greedy-no-such-job", 0);
    pmix_info_t t;
    int timeout = 10;
    PMIX_INFO_LOAD(&t, PMIX_TIMEOUT, &timeout, PMIX_INT);
    pmix_status_t rc = PMIx_Connect(procs, 2, &t, 1);
    if (rc == PMIX_SUCCESS)
        fail("connect to another namespace succeeded", rc);
    PMIX_INFO_DESTRUCT(&t);
}

int main(int argc, char **argv)
{
    check("init", PMIx_Init(&me, NULL, 0));
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    check("job size", PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v));
    size = v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    names();
    halves();
    if (argc > 1 && strcmp(argv[1], "other-namespace") == 0 && me.rank == 0)
        other_namespace();
    check("final fence", PMIx_Fence(NULL, 0, NULL, 0));
    printf("rank %u of %u: ok\n", me.rank, size);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
