/* A PMIx client for large jobs: checks what the launcher registered and that the job wires up.
 *   - PMIx_Resolve_nodes (the node map) names EXPECT_NODES hosts, its own among them;
 *   - PMIx_Resolve_peers on its host (node and process maps) holds itself, and as many ranks
 *     as PMIX_LOCAL_SIZE says, which are PMIX_LOCAL_PEERS;
 *   - it puts a key, fences with data, and reads the key of the rank farthest from it
 *     (size-1-rank, on another host in a job placed by node).
 * Prints "maps RANK SIZE NODES ok" and exits 0, or names what is wrong on stderr and exits 1.
 * usage: pmix_maps EXPECT_NODES */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "pmix_maps rank %u: ", me.rank); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); PMIx_Finalize(NULL, 0); return 1; } while (0)

static pmix_proc_t me;

static int get_u32(const pmix_proc_t *who, const char *key, uint32_t *out)
{
    pmix_value_t *val = NULL;
    if (PMIX_SUCCESS != PMIx_Get(who, key, NULL, 0, &val) || NULL == val)
        return -1;
    int rc = PMIX_UINT32 == val->type ? (*out = val->data.uint32, 0) : -1;
    PMIX_VALUE_RELEASE(val);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    unsigned long expect_nodes = strtoul(argv[1], NULL, 10);
    if (PMIX_SUCCESS != PMIx_Init(&me, NULL, 0)) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 1;
    }
    pmix_proc_t job = me;
    job.rank = PMIX_RANK_WILDCARD;
    uint32_t size = 0, local_size = 0;
    if (get_u32(&job, PMIX_JOB_SIZE, &size)) FAIL("no PMIX_JOB_SIZE");
    if (get_u32(&job, PMIX_LOCAL_SIZE, &local_size)) FAIL("no PMIX_LOCAL_SIZE");

    char *nodes = NULL;
    if (PMIX_SUCCESS != PMIx_Resolve_nodes(me.nspace, &nodes) || !nodes) FAIL("PMIx_Resolve_nodes failed");
    unsigned long n_nodes = 1;
    for (char *c = nodes; *c; c++) n_nodes += *c == ',';
    if (n_nodes != expect_nodes) FAIL("node map has %lu hosts, expected %lu", n_nodes, expect_nodes);

    pmix_value_t *val = NULL;
    if (PMIX_SUCCESS != PMIx_Get(&me, PMIX_HOSTNAME, NULL, 0, &val) || !val || PMIX_STRING != val->type)
        FAIL("no PMIX_HOSTNAME");
    char host[256];
    snprintf(host, sizeof host, "%s", val->data.string);
    PMIX_VALUE_RELEASE(val);
    char *hosts = strdup(nodes), *save = NULL;
    int found = 0;
    for (char *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save))
        found |= !strcmp(h, host);
    if (!found) FAIL("own host %s not in the node map", host);

    pmix_proc_t *peers = NULL;
    size_t npeers = 0;
    if (PMIX_SUCCESS != PMIx_Resolve_peers(host, me.nspace, &peers, &npeers)) FAIL("PMIx_Resolve_peers(%s) failed", host);
    if (npeers != local_size) FAIL("%zu peers on %s, PMIX_LOCAL_SIZE %u", npeers, host, local_size);
    found = 0;
    for (size_t i = 0; i < npeers; i++) found |= peers[i].rank == me.rank;
    if (!found) FAIL("not among its host's peers");

    pmix_value_t v;
    PMIX_VALUE_LOAD(&v, &me.rank, PMIX_UINT32);
    if (PMIX_SUCCESS != PMIx_Put(PMIX_GLOBAL, "greedy.maps", &v)) FAIL("PMIx_Put");
    if (PMIX_SUCCESS != PMIx_Commit()) FAIL("PMIx_Commit");
    pmix_info_t collect;
    bool yes = true;
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    if (PMIX_SUCCESS != PMIx_Fence(&job, 1, &collect, 1)) FAIL("PMIx_Fence");
    pmix_proc_t far = me;
    far.rank = size - 1 - me.rank;
    uint32_t got = 0;
    if (get_u32(&far, "greedy.maps", &got) || got != far.rank) FAIL("rank %u's key missing or wrong", far.rank);
    printf("maps %u %u %lu ok\n", me.rank, size, n_nodes);
    PMIx_Finalize(NULL, 0);
    return 0;
}
