/* gather1k.c: tests/tools/libi-bench.sh's libgreedy runner. The front end launches one daemon
 * per host, every daemon gathers 1024 bytes to the master (greedy_gather), the master checks
 * them and sends the front end "SIZE TOTAL"; the front end checks TOTAL == N * 1024 and exits 0.
 *
 *   gather1k job JOBID N        one daemon on every node of running Slurm job JOBID (N nodes)
 *   gather1k rsh RSH HOST...    one daemon on each HOST through greedyrun over RSH
 *
 * The same program is the front end and, started by it with PMI_RANK set, every daemon (as
 * libgreedy/examples/c/hostnames.c). The front end prints the milliseconds of its phases on
 * stderr: launch (greedy_fe_launch returned), first (the master's message arrived: every
 * daemon started and gathered), wait (the launcher exited). */
#include <greedy/libi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PIECE 1024

static int fail(const char *what)
{
    fprintf(stderr, "gather1k: %s: %s\n", what, greedy_last_error());
    return 1;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int daemon_main(void)
{
    greedy_member *me;
    if (greedy_member_init(&me)) return fail("member init");
    unsigned rank = greedy_member_rank(me), size = greedy_member_size(me);

    unsigned char piece[PIECE];
    memset(piece, (int)(rank & 0xff), sizeof piece);
    void *all;
    size_t *lens;
    if (greedy_gather(me, 0, piece, sizeof piece, &all, &lens)) return fail("gather");
    if (rank == 0) {
        /* Count only what arrived whole and right: rank r's piece is PIECE bytes of r. */
        size_t total = 0;
        const unsigned char *from = all;
        for (unsigned r = 0; r < size; r++) {
            int good = lens[r] == PIECE;
            for (size_t i = 0; good && i < lens[r]; i++) good = from[i] == (r & 0xff);
            if (good) total += lens[r];
            from += lens[r];
        }
        char report[64];
        int n = snprintf(report, sizeof report, "%u %zu", size, total);
        if (greedy_member_send_fe(me, report, (size_t)n)) return fail("send");
    }
    greedy_free(all);
    greedy_free(lens);
    return greedy_member_finalize(me) ? fail("finalize") : 0;
}

int main(int argc, char **argv)
{
    if (getenv("PMI_RANK")) return daemon_main();
    int job = argc == 4 && strcmp(argv[1], "job") == 0;
    if (!job && !(argc >= 4 && strcmp(argv[1], "rsh") == 0)) {
        fprintf(stderr, "usage: %s job JOBID N | rsh RSH HOST...\n", argv[0]);
        return 2;
    }

    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0) return 1;
    self[len] = '\0';

    greedy_backend backend = {0};
    greedy_host *hosts = NULL;
    size_t nhosts = 0;
    unsigned want;
    if (job) {
        backend.kind = GREEDY_BACKEND_SLURM_JOB;
        backend.job = (unsigned)atoi(argv[2]);
        backend.step = -1; /* every node of the job, one daemon each */
        want = (unsigned)atoi(argv[3]);
    } else {
        backend.kind = GREEDY_BACKEND_RSH;
        backend.rsh = argv[2];
        nhosts = (size_t)(argc - 3);
        hosts = calloc(nhosts, sizeof *hosts);
        if (!hosts) return 1;
        for (size_t i = 0; i < nhosts; i++) {
            hosts[i].name = argv[3 + i];
            hosts[i].count = 1;
        }
        want = (unsigned)nhosts;
    }
    greedy_proc_dist dist = {.program = self, .hosts = hosts, .nhosts = nhosts};

    double t0 = now_ms();
    greedy_fe *fe;
    greedy_session *session;
    if (greedy_fe_init(&fe)) return fail("init");
    if (greedy_fe_launch(fe, &dist, 1, &backend, &session)) return fail("launch");
    double t_launch = now_ms();
    void *report;
    size_t report_len;
    if (greedy_fe_recv(session, 600000, &report, &report_len)) return fail("recv");
    double t_first = now_ms();
    unsigned size = 0;
    size_t total = 0;
    char text[64] = "";
    memcpy(text, report, report_len < sizeof text - 1 ? report_len : sizeof text - 1);
    greedy_free(report);
    int parsed = sscanf(text, "%u %zu", &size, &total) == 2;
    int code = 0;
    if (greedy_fe_wait(session, &code)) return fail("wait");
    double t_wait = now_ms();
    greedy_session_free(session);
    greedy_fe_finalize(fe);
    free(hosts);
    fprintf(stderr, "gather1k: phases ms: launch %.0f first %.0f wait %.0f\n", t_launch - t0,
            t_first - t_launch, t_wait - t_first);
    printf("%u daemons, %zu bytes gathered\n", size, total);
    if (!parsed || size != want || total != (size_t)want * PIECE) {
        fprintf(stderr, "gather1k: expected %u daemons and %zu bytes, got \"%s\"\n", want,
                (size_t)want * PIECE, text);
        return 1;
    }
    return code;
}
