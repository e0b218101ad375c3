/* pmix_spawn.c: a plain libpmix client spawning as MPICH does over PMIx (mpir_pmix.inc).
 *
 * Parent rank 0 puts "greedy-port" = "port-of-<its namespace>", commits, spawns 2 copies of
 * this program (PMIx_Spawn), then fences with the data over the child namespace and itself
 * (MPICH's pmix_fence_nspace_proc: the child's wildcard, then the parent proc). Each child
 * reads PMIX_PARENT_ID (must be the parent's rank 0), its PMIX_APPNUM (0), PMIX_SPAWNED
 * (true) and its job size (2), runs the same fence, then gets "greedy-port" from the parent.
 * Other parent ranks only initialize and finalize. With CHILD_ABORT=1, child rank 1 calls
 * PMIx_Abort(5, "child 1 gives up") instead of fencing (the whole family must end).
 *
 * Prints "parent 0: spawned <ns>, fenced" or "child R: parent <ns>:<rank> says <value>";
 * on any failure "FAILED ..." and exit 1.
 */
#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pmix_proc_t me;

static void check(const char *what, pmix_status_t rc)
{
    if (rc != PMIX_SUCCESS) {
        printf("%s:%u: FAILED %s (%s)\n", me.nspace, me.rank, what, PMIx_Error_string(rc));
        fflush(stdout);
        exit(1);
    }
}

static void fence_with(const char *child_ns, const pmix_proc_t *parent)
{
    pmix_proc_t procs[2];
    PMIX_LOAD_PROCID(&procs[0], child_ns, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&procs[1], parent->nspace, parent->rank);
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    check("fence over the child and its parent", PMIx_Fence(procs, 2, &info, 1));
}

static void child(const pmix_proc_t *parent)
{
    pmix_value_t *v = NULL;
    pmix_proc_t wild;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    check("PMIX_JOB_SIZE", PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v));
    unsigned size = v->data.uint32;
    check("PMIX_APPNUM", PMIx_Get(&me, PMIX_APPNUM, NULL, 0, &v));
    unsigned appnum = v->data.uint32;
    check("PMIX_SPAWNED", PMIx_Get(&wild, PMIX_SPAWNED, NULL, 0, &v));
    bool spawned = v->data.flag;
    if (size != 2 || appnum != 0 || !spawned || parent->rank != 0) {
        printf("child %u: FAILED size %u appnum %u spawned %d parent rank %u\n", me.rank, size,
               appnum, spawned, parent->rank);
        exit(1);
    }
    if (me.rank == 1 && getenv("CHILD_ABORT") && strcmp(getenv("CHILD_ABORT"), "1") == 0) {
        PMIx_Abort(5, "child 1 gives up", NULL, 0);
        exit(5);
    }
    fence_with(me.nspace, parent);
    check("the parent's port", PMIx_Get(parent, "greedy-port", NULL, 0, &v));
    char want[PMIX_MAX_NSLEN + 16];
    snprintf(want, sizeof want, "port-of-%s", parent->nspace);
    if (v->type != PMIX_STRING || strcmp(v->data.string, want) != 0) {
        printf("child %u: FAILED the parent's port is not %s\n", me.rank, want);
        exit(1);
    }
    printf("child %u: parent %s:%u says %s\n", me.rank, parent->nspace, parent->rank,
           v->data.string);
}

static void parent(const char *self)
{
    pmix_value_t port;
    char text[PMIX_MAX_NSLEN + 16];
    snprintf(text, sizeof text, "port-of-%s", me.nspace);
    PMIX_VALUE_LOAD(&port, text, PMIX_STRING);
    check("put", PMIx_Put(PMIX_GLOBAL, "greedy-port", &port));
    check("commit", PMIx_Commit());
    pmix_app_t app;
    PMIX_APP_CONSTRUCT(&app);
    app.cmd = strdup(self);
    app.argv = calloc(2, sizeof(char *));
    app.argv[0] = strdup(self);
    app.maxprocs = 2;
    char child_ns[PMIX_MAX_NSLEN + 1] = "";
    check("spawn", PMIx_Spawn(NULL, 0, &app, 1, child_ns));
    fence_with(child_ns, &me);
    printf("parent 0: spawned %s, fenced\n", child_ns);
}

int main(int argc, char **argv)
{
    (void)argc;
    check("init", PMIx_Init(&me, NULL, 0));
    pmix_value_t *v = NULL;
    pmix_info_t optional;
    bool yes = true;
    /* A job's own ranks have no parent: answered at once, not waited for. */
    PMIX_INFO_LOAD(&optional, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    if (PMIx_Get(&me, PMIX_PARENT_ID, &optional, 1, &v) == PMIX_SUCCESS && v->type == PMIX_PROC) {
        pmix_proc_t parent_id = *v->data.proc;
        child(&parent_id);
    } else if (me.rank == 0) {
        parent(argv[0]);
    }
    fflush(stdout);
    check("finalize", PMIx_Finalize(NULL, 0));
    return 0;
}
