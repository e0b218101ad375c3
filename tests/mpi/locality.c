/* A PMIx client that prints where its launcher says it and its local peers run, as Open MPI
 * reads it to tell which peers share a core or a package:
 *   "locality RANK LOCALITY CPUSET"  its own PMIX_LOCALITY_STRING and PMIX_CPUSET
 *   "peer RANK PEER LOCALITY"        each local peer's PMIX_LOCALITY_STRING
 *   "unbound RANK"                   when it was given no locality.
 * The strings are PMIx_server_generate_locality_string's, as PRRTE registers them: without
 * the "hwloc:" prefix PMIx_Get_relative_locality wants (openpmix src/hwloc/pmix_hwloc.c
 * @v4.2.2), in the form Open MPI's own opal_hwloc_compute_relative_locality parses.
 * Exit 0 unless PMIx itself fails. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *get_string(const pmix_proc_t *who, const char *key)
{
    pmix_value_t *val = NULL;
    if (PMIX_SUCCESS != PMIx_Get(who, key, NULL, 0, &val) || NULL == val)
        return NULL;
    char *s = (PMIX_STRING == val->type && val->data.string) ? strdup(val->data.string) : NULL;
    PMIX_VALUE_RELEASE(val);
    return s;
}

int main(void)
{
    pmix_proc_t me;
    if (PMIX_SUCCESS != PMIx_Init(&me, NULL, 0)) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 2;
    }
    char *loc = get_string(&me, PMIX_LOCALITY_STRING);
    char *cpus = get_string(&me, PMIX_CPUSET);
    if (NULL == loc) {
        printf("unbound %u\n", me.rank);
    } else {
        printf("locality %u %s %s\n", me.rank, loc, cpus ? cpus : "-");
        pmix_proc_t job = me;
        job.rank = PMIX_RANK_WILDCARD;
        char *peers = get_string(&job, PMIX_LOCAL_PEERS);
        for (char *p = peers ? strtok(peers, ",") : NULL; p; p = strtok(NULL, ",")) {
            pmix_proc_t peer = me;
            peer.rank = (pmix_rank_t) strtoul(p, NULL, 10);
            if (peer.rank == me.rank)
                continue;
            char *ploc = get_string(&peer, PMIX_LOCALITY_STRING);
            printf("peer %u %u %s\n", me.rank, peer.rank, ploc ? ploc : "-");
            free(ploc);
        }
        free(peers);
    }
    fflush(stdout);
    free(loc);
    free(cpus);
    PMIx_Finalize(NULL, 0);
    return 0;
}
