/*
 * offsets.c: the sizes and offsets of every Slurm struct field mpi_greedy.so reads, printed as
 * the Rust `const` asserts of sys/src/raw/slurm/vXX_YY.rs, measured against one release's
 * real public header (slurm/slurm.h).
 *
 * Debian ships none of Slurm's internal headers, so the two MPI hook structs are copied below
 * from the release's own source (src/common/slurm_mpi.h before 23.02, src/interfaces/mpi.h
 * since; see the tags cited) and laid out by the compiler with the installed slurm.h types.
 *
 * Regenerate (x86_64), for the machine's Slurm and inside a release root (the root's own gcc
 * and glibc headers: `-I ROOT/usr/include` would mix two glibcs):
 *   gcc -o /tmp/offsets sys/abi/offsets.c && /tmp/offsets
 *   ROOT=$(slurm-conf/release-root 24.11); cp sys/abi/offsets.c "$ROOT/tmp/"
 *   chroot "$ROOT" gcc -Wall -o /tmp/offsets /tmp/offsets.c && chroot "$ROOT" /tmp/offsets
 * The output replaces the body of the release module's `const _: () = { ... };` block.
 */
#include <stddef.h>
#include <stdio.h>
#include <slurm/slurm.h>
#include <slurm/slurm_version.h>

#if SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(23, 2, 0)
/* src/common/slurm_mpi.h:61-78@slurm-22-05-8-1 */
typedef struct {
	uint32_t het_job_id;
	uint32_t het_job_task_offset;
	slurm_step_id_t step_id;
	slurm_step_layout_t *step_layout;
} mpi_plugin_client_info_t;

typedef struct {
	slurm_addr_t *client;
	uint32_t gtaskid;
	int ltaskid;
	uint32_t ltasks;
	uint32_t nnodes;
	uint32_t nodeid;
	uint32_t ntasks;
	slurm_addr_t *self;
	slurm_step_id_t step_id;
} mpi_plugin_task_info_t;
#define STEP_INFO mpi_plugin_client_info_t
#define TASK_INFO mpi_plugin_task_info_t
#else
/* src/interfaces/mpi.h:61-77@slurm-24-11-5-1 = :62-78@slurm-26-05-3-1 (23.11 on: no `self`) */
typedef struct {
	uint32_t het_job_id;
	uint32_t het_job_task_offset;
	slurm_step_id_t step_id;
	slurm_step_layout_t *step_layout;
} mpi_step_info_t;

typedef struct {
	slurm_addr_t *client;
	uint32_t gtaskid;
	int ltaskid;
	uint32_t ltasks;
	uint32_t nnodes;
	uint32_t nodeid;
	uint32_t ntasks;
#if SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(23, 11, 0)
	slurm_addr_t *self;
#endif
	slurm_step_id_t step_id;
} mpi_task_info_t;
#define STEP_INFO mpi_step_info_t
#define TASK_INFO mpi_task_info_t
#endif

/* src/common/read_config.h (unchanged 15.08 to 26.05): scontrol show config's pairs. */
typedef struct {
	char *name;
	char *value;
} config_key_pair_t;

#define STR_(x) #x
#define STR(x) STR_(x)
#define SIZE(t) printf("    assert!(size_of::<%s>() == %zu);\n", STR(t), sizeof(t))
#define OFF(t, f) printf("    assert!(offset_of!(%s, %s) == %zu);\n", STR(t), #f, offsetof(t, f))

int main(void)
{
	printf("    // sys/abi/offsets.c against slurm.h of Slurm %d.%02d.%d (x86_64)\n",
	       SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
	       SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
	       SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER));
	SIZE(slurm_step_id_t);
	OFF(slurm_step_id_t, job_id);
	OFF(slurm_step_id_t, step_het_comp);
	OFF(slurm_step_id_t, step_id);
	SIZE(slurm_step_layout_t);
	OFF(slurm_step_layout_t, node_cnt);
	OFF(slurm_step_layout_t, node_list);
	OFF(slurm_step_layout_t, tasks);
	OFF(slurm_step_layout_t, task_cnt);
	OFF(slurm_step_layout_t, tids);
	SIZE(STEP_INFO);
	OFF(STEP_INFO, step_id);
	OFF(STEP_INFO, step_layout);
	SIZE(TASK_INFO);
	OFF(TASK_INFO, gtaskid);
	OFF(TASK_INFO, ltaskid);
	OFF(TASK_INFO, nodeid);
	OFF(TASK_INFO, ntasks);
	OFF(TASK_INFO, step_id);
	SIZE(config_key_pair_t);
	OFF(config_key_pair_t, value);
	return 0;
}
