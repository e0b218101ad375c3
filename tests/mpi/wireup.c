/* wireup.c: the smallest MPI program that proves a wire-up worked.
 *
 * MPI_Init, then checks that rank and size match what the launcher promised
 * (EXPECT_SIZE in the environment, when set), does an MPI_Allreduce whose
 * result every rank can predict, an MPI_Barrier, and MPI_Finalize. Exits 0
 * only if every check passed; prints one line per rank so a failing test
 * shows which rank went wrong.
 *
 * With argument "fail-before-init=R:CODE" rank R (taken from PMI_RANK, PMI_ID or PMIX_RANK, as it
 * is not yet an MPI rank) exits with CODE before MPI_Init: the launcher must
 * then fail the job fast, naming that rank and code. With "abort-after-init=R:CODE"
 * rank R calls MPI_Abort(MPI_COMM_WORLD, CODE) right after MPI_Init; with "exit-after-init=R:CODE"
 * it crashes instead (_exit(CODE) without MPI_Finalize) while the others wait in MPI_Allreduce.
 * With "sleep-before-init=R:SECS" rank R sleeps SECS before MPI_Init (the others wait in the
 * wire-up for it); with "sleep-after-init=SECS" every rank sleeps SECS after MPI_Init (a job
 * that is running): tests/chaos kills hosts there.
 *
 * With WIREUP_TIMES set in the environment each rank also prints, after MPI_Finalize,
 * "times RANK ENTERED LEFT": the wall-clock seconds (CLOCK_REALTIME) at which main began and
 * MPI_Finalize returned, so a benchmark can tell the ranks' own time from the launcher's.
 *
 * Shared by the MPICH (pmix-shim), Open MPI and Slurm end-to-end tests.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The rank the launcher gave, before MPI_Init makes it an MPI rank; NULL if none. */
static const char *launcher_rank(void)
{
    const char *env_rank = getenv("PMI_RANK");
    if (!env_rank)
        env_rank = getenv("PMI_ID");
    if (!env_rank)
        env_rank = getenv("PMIX_RANK");
    return env_rank;
}

int main(int argc, char **argv)
{
    double entered = wall_now();
    const char *before_rank = launcher_rank();
    for (int i = 1; i < argc; i++) {
        int r, code;
        if (sscanf(argv[i], "fail-before-init=%d:%d", &r, &code) == 2 && before_rank && atoi(before_rank) == r) {
            fprintf(stderr, "rank %d: exiting with %d before MPI_Init as asked\n", r, code);
            return code;
        }
        if (sscanf(argv[i], "sleep-before-init=%d:%d", &r, &code) == 2 && before_rank && atoi(before_rank) == r)
            sleep(code);
    }

    MPI_Init(&argc, &argv);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int ok = 1;

    for (int i = 1; i < argc; i++) {
        int abort_rank, code;
        if (sscanf(argv[i], "abort-after-init=%d:%d", &abort_rank, &code) == 2 && abort_rank == rank) {
            fprintf(stderr, "rank %d: calling MPI_Abort(%d) as asked\n", rank, code);
            MPI_Abort(MPI_COMM_WORLD, code);
        }
        if (sscanf(argv[i], "exit-after-init=%d:%d", &abort_rank, &code) == 2 && abort_rank == rank) {
            fprintf(stderr, "rank %d: exiting with %d after MPI_Init, without MPI_Finalize, as asked\n", rank, code);
            _exit(code);
        }
        int secs;
        if (sscanf(argv[i], "sleep-after-init=%d", &secs) == 1) {
            printf("rank %d initialised\n", rank);
            fflush(stdout);
            sleep(secs);
        }
    }

    const char *expect_size = getenv("EXPECT_SIZE");
    if (expect_size && atoi(expect_size) != size) {
        fprintf(stderr, "rank %d: size %d, expected %s\n", rank, size, expect_size);
        ok = 0;
    }
    const char *env_rank = launcher_rank();
    if (env_rank && atoi(env_rank) != rank) {
        fprintf(stderr, "rank %d: PMI rank %s differs\n", rank, env_rank);
        ok = 0;
    }

    /* Sum of (rank + 1) over all ranks is size*(size+1)/2. */
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size + 1) / 2;
    if (sum != want) {
        fprintf(stderr, "rank %d: allreduce sum %ld, expected %ld\n", rank, sum, want);
        ok = 0;
    }
    /* Max of ranks must be size-1: a second collective with a different op. */
    int top = -1;
    MPI_Allreduce(&rank, &top, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (top != size - 1) {
        fprintf(stderr, "rank %d: allreduce max %d, expected %d\n", rank, top, size - 1);
        ok = 0;
    }
    MPI_Barrier(MPI_COMM_WORLD);

    printf("rank %d of %d: %s\n", rank, size, ok ? "ok" : "FAILED");
    fflush(stdout);
    MPI_Finalize();
    if (getenv("WIREUP_TIMES")) {
        printf("times %d %.6f %.6f\n", rank, entered, wall_now());
        fflush(stdout);
    }
    return ok ? 0 : 1;
}
