/* Prints route/default's split sizes straight from libslurmfull, for tests/slurm/route.sh to
 * compare with route/greedy's fallback (greedy-route kary): one line per (hosts, tree_width),
 * "N W s1 s2 ...". Declares the one internal export it calls (Debian ships no internal headers);
 * its contract is in src/common/slurm_route.c@slurm-22-05-8-1. */
#include <slurm/slurm.h>
#include <stdint.h>
#include <stdio.h>

extern int slurm_route_split_hostlist_treewidth(hostlist_t hl, hostlist_t **sp_hl, int *count,
                                                uint16_t tree_width);
extern void slurm_xfree(void **item);

int main(int argc, char **argv) {
    int max_n = 200, max_w = 60;
    for (int n = 1; n <= max_n; n++) {
        for (int w = 1; w <= max_w; w++) {
            hostlist_t hl = slurm_hostlist_create(NULL);
            char name[32];
            for (int i = 1; i <= n; i++) {
                snprintf(name, sizeof name, "h%d", i);
                slurm_hostlist_push_host(hl, name);
            }
            hostlist_t *sp = NULL;
            int count = 0;
            if (slurm_route_split_hostlist_treewidth(hl, &sp, &count, (uint16_t)w) != 0)
                return 1;
            printf("%d %d", n, w);
            for (int j = 0; j < count; j++) {
                printf(" %d", slurm_hostlist_count(sp[j]));
                slurm_hostlist_destroy(sp[j]);
            }
            printf("\n");
            slurm_xfree((void **)&sp);
            slurm_hostlist_destroy(hl);
        }
    }
    return 0;
}
