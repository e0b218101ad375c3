/* A complete libgreedy tool: one daemon per host gathers the hosts' names to the front end.
 *
 *   hostnames rsh RSH HOST:COUNT...   daemons over a remote shell (greedyrun)
 *   hostnames job JOBID               one daemon on every node of a running Slurm job
 *
 * The same program is the front end and, started by it with PMI_RANK set, every daemon. */
#include <greedy/libi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what)
{
    fprintf(stderr, "hostnames: %s: %s\n", what, greedy_last_error());
    return 1;
}

static int daemon_main(void)
{
    greedy_member *me;
    if (greedy_member_init(&me)) return fail("member init");
    unsigned rank = greedy_member_rank(me), size = greedy_member_size(me);

    /* The front end's request reaches the master, which broadcasts it. */
    void *request = NULL, *word;
    size_t request_len = 0, word_len;
    if (rank == 0 && greedy_member_recv_fe(me, &request, &request_len)) return fail("recv");
    if (greedy_broadcast(me, 0, request, request_len, &word, &word_len)) return fail("broadcast");

    char line[300];
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    int n = snprintf(line, sizeof line, "%.*s %u/%u on %s", (int)word_len, (char *)word, rank, size, host);

    void *all;
    size_t *lens;
    if (greedy_gather(me, 0, line, (size_t)n, &all, &lens)) return fail("gather");
    if (rank == 0) {
        /* One message to the front end: every daemon's line, one per rank. */
        size_t total = 0;
        for (unsigned r = 0; r < size; r++) total += lens[r] + 1;
        char *report = malloc(total), *at = report, *from = all;
        for (unsigned r = 0; r < size; r++) {
            memcpy(at, from, lens[r]);
            at += lens[r];
            *at++ = '\n';
            from += lens[r];
        }
        if (greedy_member_send_fe(me, report, total)) return fail("send");
        free(report);
    }
    greedy_free(all);
    greedy_free(lens);
    greedy_free(word);
    greedy_free(request);
    return greedy_member_finalize(me) ? fail("finalize") : 0;
}

int main(int argc, char **argv)
{
    if (getenv("PMI_RANK")) return daemon_main();
    if (argc < 3) {
        fprintf(stderr, "usage: %s rsh RSH HOST:COUNT... | job JOBID\n", argv[0]);
        return 2;
    }

    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0) return 1;
    self[len] = '\0';

    greedy_backend backend = {0};
    greedy_host hosts[64];
    size_t nhosts = 0;
    if (strcmp(argv[1], "job") == 0) {
        backend.kind = GREEDY_BACKEND_SLURM_JOB;
        backend.job = (unsigned)atoi(argv[2]);
        backend.step = -1; /* every node of the job, one daemon each */
    } else {
        backend.kind = GREEDY_BACKEND_RSH;
        backend.rsh = argv[2];
        for (int i = 3; i < argc && nhosts < 64; i++) {
            char *colon = strrchr(argv[i], ':');
            if (!colon) return 2;
            *colon = '\0';
            hosts[nhosts].name = argv[i];
            hosts[nhosts++].count = (unsigned)atoi(colon + 1);
        }
    }
    greedy_proc_dist dist = {.program = self, .hosts = hosts, .nhosts = nhosts};

    greedy_fe *fe;
    greedy_session *session;
    if (greedy_fe_init(&fe)) return fail("init");
    if (greedy_fe_launch(fe, &dist, 1, &backend, &session)) return fail("launch");
    const char *request = "hello";
    if (greedy_fe_send(session, request, strlen(request))) return fail("send");
    void *report;
    size_t report_len;
    if (greedy_fe_recv(session, 60000, &report, &report_len)) return fail("recv");
    fwrite(report, 1, report_len, stdout);
    greedy_free(report);
    int code = 0;
    if (greedy_fe_wait(session, &code)) fail("wait");
    greedy_session_free(session);
    greedy_fe_finalize(fe);
    return code;
}
