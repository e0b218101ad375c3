/* libgreedy: the LIBI interface over greedy's launch tree, for tool builders.
 *
 * A front end launches a process distribution (programs on hosts) through a back end and
 * exchanges messages with the session master (rank 0); the members call collectives that
 * greedy's agents carry over their authenticated overlay along the greedy tree.
 *
 * Every call returns 0 on success and -1 on failure; greedy_last_error() then says why (on
 * the failing thread, naming the host, rank or argument at fault). Buffers the library
 * returns are freed with greedy_free(). A handle is used by one thread at a time. Guide:
 * docs/tool-builders.md. Link: pkg-config --cflags --libs greedy-libi. */
#ifndef GREEDY_LIBI_H
#define GREEDY_LIBI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- front end ---- */

/** A front end: the launcher it uses ($GREEDYRUN, else greedyrun on PATH). */
typedef struct greedy_fe greedy_fe;
/** A launched session. */
typedef struct greedy_session greedy_session;

/** One host of a distribution and its number of processes. */
typedef struct greedy_host {
    const char *name;
    unsigned count;
} greedy_host;

/** One program on some hosts. argv and env are NULL-terminated (argv without the program;
 * env as "NAME=value"); either may be NULL. nhosts == 0: the back end's nodes, one each
 * (only in a distribution of one group). */
typedef struct greedy_proc_dist {
    const char *program;
    const char *const *argv;
    const char *const *env;
    const greedy_host *hosts;
    size_t nhosts;
} greedy_proc_dist;

/** How members start. */
typedef enum greedy_backend_kind {
    GREEDY_BACKEND_RSH = 0,       /* greedyrun over the remote shell `rsh` (ssh, rsh, srun) */
    GREEDY_BACKEND_SESSION = 1,   /* on the greedy session whose socket is `session` */
    GREEDY_BACKEND_SRUN = 2,      /* one srun --mpi=greedy step of this allocation */
    GREEDY_BACKEND_SLURM_JOB = 3  /* beside Slurm job `job` (step `step`, -1: the whole job) */
} greedy_backend_kind;

/** A back end; unused fields are ignored. bcast: files copied to node-local storage on every
 * host before the members start, down the launch tree (NULL-terminated, or NULL; RSH and
 * SESSION back ends); members find them in $GREEDY_BCAST, a program among them runs its copy. */
typedef struct greedy_backend {
    greedy_backend_kind kind;
    const char *rsh;
    const char *session;
    unsigned job;
    int step;
    const char *const *bcast;
} greedy_backend;

int greedy_fe_init(greedy_fe **fe);
int greedy_fe_launch(greedy_fe *fe, const greedy_proc_dist *dists, size_t ndists,
                     const greedy_backend *backend, greedy_session **session);
/** Sends len bytes to the master (its greedy_member_recv_fe). */
int greedy_fe_send(greedy_session *session, const void *data, size_t len);
/** The master's next message; timeout_ms < 0 waits for ever. Free *data with greedy_free. */
int greedy_fe_recv(greedy_session *session, int timeout_ms, void **data, size_t *len);
/** Waits for every member's end; *exit_code is the launcher's: 0 when every member exited 0
 * (the call returns 0), else the first failure's, with -1 and greedy_last_error() saying
 * which rank on which host. */
int greedy_fe_wait(greedy_session *session, int *exit_code);
/** Ends every member (SIGTERM, then SIGKILL) and waits. */
int greedy_fe_kill(greedy_session *session, int *exit_code);
/** Frees a session (killing it if it still runs). */
void greedy_session_free(greedy_session *session);
int greedy_fe_finalize(greedy_fe *fe);

/* ---- members ---- */

/** This process as a member of the session that started it. */
typedef struct greedy_member greedy_member;

int greedy_member_init(greedy_member **member);
unsigned greedy_member_rank(const greedy_member *member);
unsigned greedy_member_size(const greedy_member *member);
int greedy_barrier(greedy_member *member);
/** root's len bytes on every member, in *out (*out_len). */
int greedy_broadcast(greedy_member *member, unsigned root, const void *data, size_t len,
                     void **out, size_t *out_len);
/** Part r of root's `size` parts (parts[r], lens[r]) on member r; parts ignored elsewhere. */
int greedy_scatter(greedy_member *member, unsigned root, const void *const *parts,
                   const size_t *lens, void **out, size_t *out_len);
/** On root: every member's data back to back in *out, their lengths in *lens (size of them);
 * elsewhere *out = *lens = NULL. */
int greedy_gather(greedy_member *member, unsigned root, const void *data, size_t len,
                  void **out, size_t **lens);
/** greedy_gather's result on every member. */
int greedy_allgather(greedy_member *member, const void *data, size_t len, void **out,
                     size_t **lens);
/** Master only: to and from the front end. */
int greedy_member_send_fe(greedy_member *member, const void *data, size_t len);
int greedy_member_recv_fe(greedy_member *member, void **data, size_t *len);
/** Leaves the session (this member's exit then ends nothing) and frees member. */
int greedy_member_finalize(greedy_member *member);

/* ---- both ---- */

/** Why the last call on this thread failed ("" if none); valid until the next call. */
const char *greedy_last_error(void);
/** Frees a buffer libgreedy returned. */
void greedy_free(void *buffer);

#ifdef __cplusplus
}
#endif

#endif
