/* pmix_two_jobs.c: a libpmix client of one of two jobs served by the same PMIx servers.
 *
 * 1. Its own job's size (PMIX_JOB_SIZE), local size (PMIX_LOCAL_SIZE) and node count
 *    (PMIX_NUM_NODES) are EXPECT_SIZE, EXPECT_LOCAL_SIZE and EXPECT_NODES.
 * 2. Each rank puts "greedy-ns" = its namespace, fences over its whole job (with the data, or
 *    without it when FENCE_COLLECT=0, so that the gets below are direct modex), and reads every
 *    peer's value: each must name this rank's own namespace. With FENCE_COLLECT=both, it does
 *    so with the data, then again under the key "greedy-ns2" without it (direct modex).
 *    With OTHER_READY set (rank 0 only), it then waits for that file (the other namespace is
 *    added at run time) before step 3; then FENCE_ROUNDS more fences with the data, if set
 *    (while the other namespace's ranks start and fence).
 * 3. With OTHER_NS set (rank 0 only): the other namespace's PMIX_JOB_SIZE and PMIX_NUM_NODES
 *    (job-level keys from this node's registration) are OTHER_SIZE and OTHER_NODES (then it
 *    creates the file OTHER_SEEN, if set, so the agents remove the other job only now). Then, once
 *    the file OTHER_GONE exists (the other job has been
 *    removed from this node's server): PMIx_Get of the other namespace's rank 0 and a fence
 *    naming the other namespace must both fail, each within its 5 s PMIX_TIMEOUT (never
 *    hang); each prints its status and how long it took.
 * 4. A last fence over its own job (the server keeps serving after the other job left).
 *
 * Prints "rank R of N: ok" when every check passed, else "rank R of N: FAILED ..." and exits 1.
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

static unsigned get_u32(const pmix_proc_t *who, const char *key)
{
    pmix_value_t *v = NULL;
    check(key, PMIx_Get(who, key, NULL, 0, &v));
    unsigned n = v->type == PMIX_UINT32 ? v->data.uint32 : 0;
    PMIX_VALUE_RELEASE(v);
    return n;
}

static void own_job(void)
{
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    size = get_u32(&job, PMIX_JOB_SIZE);
    if (size != (unsigned)atoi(getenv("EXPECT_SIZE")))
        fail("job size is not EXPECT_SIZE", PMIX_ERROR);
    if (get_u32(&job, PMIX_LOCAL_SIZE) != (unsigned)atoi(getenv("EXPECT_LOCAL_SIZE")))
        fail("local size is not EXPECT_LOCAL_SIZE", PMIX_ERROR);
    if (get_u32(&job, PMIX_NUM_NODES) != (unsigned)atoi(getenv("EXPECT_NODES")))
        fail("node count is not EXPECT_NODES", PMIX_ERROR);
}

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != NULL && strcmp(v, value) == 0;
}

static void fence_all(int with_data)
{
    pmix_proc_t all;
    pmix_info_t collect;
    size_t ninfo = with_data ? 1 : 0;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, NULL, PMIX_BOOL);
    check("fence", PMIx_Fence(&all, 1, ninfo ? &collect : NULL, ninfo));
    PMIX_INFO_DESTRUCT(&collect);
}

static void exchange(const char *key, int with_data)
{
    pmix_value_t val;
    PMIX_VALUE_LOAD(&val, me.nspace, PMIX_STRING);
    check("put", PMIx_Put(PMIX_GLOBAL, key, &val));
    PMIX_VALUE_DESTRUCT(&val);
    check("commit", PMIx_Commit());
    fence_all(with_data);
    for (unsigned r = 0; r < size; r++) {
        pmix_proc_t peer;
        pmix_value_t *got = NULL;
        PMIX_LOAD_PROCID(&peer, me.nspace, r);
        check("get a peer's value", PMIx_Get(&peer, key, NULL, 0, &got));
        if (got->type != PMIX_STRING || strcmp(got->data.string, me.nspace) != 0)
            fail("a peer's value names another namespace", PMIX_ERROR);
        PMIX_VALUE_RELEASE(got);
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void other_job_level(const char *other)
{
    pmix_proc_t them;
    PMIX_LOAD_PROCID(&them, other, PMIX_RANK_WILDCARD);
    unsigned n = get_u32(&them, PMIX_JOB_SIZE), nodes = get_u32(&them, PMIX_NUM_NODES);
    if (n != (unsigned)atoi(getenv("OTHER_SIZE")) || nodes != (unsigned)atoi(getenv("OTHER_NODES")))
        fail("the other namespace's job-level keys are wrong", PMIX_ERROR);
    printf("rank 0: other namespace: %u ranks on %u nodes\n", n, nodes);
    const char *seen = getenv("OTHER_SEEN");
    if (seen != NULL)
        fclose(fopen(seen, "w"));
}

static void other_job(const char *other, const char *gone)
{
    for (int i = 0; i < 600 && access(gone, F_OK) != 0; i++)
        usleep(100 * 1000);
    if (access(gone, F_OK) != 0)
        fail("the other job was never removed", PMIX_ERROR);
    pmix_proc_t them;
    pmix_value_t *got = NULL;
    pmix_info_t timeout;
    int secs = 5;
    PMIX_INFO_LOAD(&timeout, PMIX_TIMEOUT, &secs, PMIX_INT);
    PMIX_LOAD_PROCID(&them, other, 0);
    double t = now();
    pmix_status_t rc = PMIx_Get(&them, "greedy-ns", &timeout, 1, &got);
    if (rc == PMIX_SUCCESS)
        fail("got the other namespace's data", PMIX_ERROR);
    if (now() - t > 5.0)
        fail("a get of the other namespace hung", PMIX_ERR_TIMEOUT);
    printf("rank 0: get of the other namespace: %s in %.1f s\n", PMIx_Error_string(rc), now() - t);
    PMIX_LOAD_PROCID(&them, other, PMIX_RANK_WILDCARD);
    t = now();
    rc = PMIx_Fence(&them, 1, &timeout, 1);
    if (rc == PMIX_SUCCESS)
        fail("a fence naming the other namespace succeeded", PMIX_ERROR);
    if (now() - t > 6.0)
        fail("a fence naming the other namespace hung", PMIX_ERR_TIMEOUT);
    printf("rank 0: fence naming the other namespace: %s in %.1f s\n", PMIx_Error_string(rc),
           now() - t);
    PMIX_INFO_DESTRUCT(&timeout);
}

int main(void)
{
    alarm(60);
    check("init", PMIx_Init(&me, NULL, 0));
    own_job();
    int with_data = !env_is("FENCE_COLLECT", "0");
    exchange("greedy-ns", with_data);
    if (env_is("FENCE_COLLECT", "both"))
        exchange("greedy-ns2", 0);
    const char *other = getenv("OTHER_NS");
    const char *ready = getenv("OTHER_READY");
    for (int i = 0; other != NULL && me.rank == 0 && ready != NULL && i < 600 &&
                    access(ready, F_OK) != 0;
         i++)
        usleep(100 * 1000);
    const char *rounds = getenv("FENCE_ROUNDS");
    for (int i = 0; rounds != NULL && i < atoi(rounds); i++)
        fence_all(1);
    if (other != NULL && me.rank == 0) {
        other_job_level(other);
        other_job(other, getenv("OTHER_GONE"));
    }
    fence_all(with_data);
    printf("rank %u of %u: ok\n", me.rank, size);
    fflush(stdout);
    check("finalize", PMIx_Finalize(NULL, 0));
    return 0;
}
