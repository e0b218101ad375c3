/*
 * forge_job.c: an attacker's LD_PRELOAD into their own srun (tests/slurm/mpi.sh, case
 * "forged"). srun is the user's process, so everything mpi/greedy's client side puts into the
 * launch environment is the user's to change: this shim rewrites GREEDY_MPI_JOB, as the
 * plugin sets it through libslurmfull's slurm_env_array_overwrite, to $FORGED_JOB (another
 * user's JOB.STEP). slurmstepd must act on its own record of the step, not on this value.
 *
 *   gcc -shared -fPIC -o forge_job.so forge_job.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int (*overwrite_fn)(char ***env, const char *name, const char *value);

int slurm_env_array_overwrite(char ***env, const char *name, const char *value)
{
	static overwrite_fn next;
	const char *forged = getenv("FORGED_JOB");

	if (!next)
		next = (overwrite_fn)dlsym(RTLD_NEXT, "slurm_env_array_overwrite");
	if (!next)
		return 0;
	if (forged && name && !strcmp(name, "GREEDY_MPI_JOB"))
		value = forged;
	return next(env, name, value);
}
