/* Run: build/tests/rl/rl_run examples/calc_agent.yaml [--calc-server ["ARGS"]] [--set k=v]...
 *
 * A stand-alone driver for RL specs through the job library (manta_job.h):
 * loads the spec, starts its job (placement, replicas, node watchdog), calls
 * the `run:` method and prints its answer. With --calc-server it starts
 * examples/calc_server.py on a free port itself (ARGS, e.g. "--latency-ms 50
 * --latency-dist lognormal", go to it), points tools.0.url at it and skips
 * the spec's `services:`; without it the spec's services start. */
#include "calc_server.h"

#include <manta_actors.h>
#include <manta_job.h>
#include <rl_util.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CALC_SERVER
#define CALC_SERVER "examples/calc_server.py"
#endif

#define MAX_SETS 64

static volatile sig_atomic_t g_signal;

static void on_signal(int sig)
{
    g_signal = sig;
}

typedef struct args {
    const char *spec, *calc_args;
    const char *sets[MAX_SETS + 1];
    size_t n_sets;
    int calc;
} args;

static int parse(int argc, char **argv, args *a)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (a->n_sets == MAX_SETS) {
                fprintf(stderr, "rl_run: at most %d --set\n", MAX_SETS);
                return -1;
            }
            a->sets[a->n_sets++] = argv[++i];
        } else if (!strcmp(argv[i], "--calc-server")) {
            a->calc = 1;
            if (i + 1 < argc && argv[i + 1][0] == '-' && argv[i + 1][1] == '-' &&
                strcmp(argv[i + 1], "--set"))
                a->calc_args = argv[++i];
        } else {
            a->spec = argv[i];
        }
    }
    if (a->spec) return 0;
    fprintf(stderr, "usage: rl_run SPEC [--calc-server [\"ARGS\"]] [--set path=value]...\n");
    return -1;
}

static int run(manta_ctx *m, const args *a)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    /* checked against the keys the RL classes declare, with the defaults they derive (a
     * GPU share with model.device cuda), as `manta run` does */
    manta_spec_options so = {.sets = a->sets,
                             .n_sets = a->n_sets,
                             .sections = rl_spec_sections,
                             .defaults = rl_spec_defaults};
    manta_spec *spec = manta_spec_load_file(a->spec, &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    if (!spec) return 2;
    manta_job_options jo = {.no_services = a->calc, .interrupt = &g_signal};
    manta_job_t *job = NULL;
    const void *reply;
    size_t len;
    int rc = manta_job_start(m, spec, &jo, &job);
    if (rc == 0) rc = manta_job_wait(job, -1, &reply, &len);
    if (rc == 0)
        printf("%.*s\n", (int)len, (const char *)reply);
    else
        fprintf(stderr, "rl_run: %s\n", manta_last_error());
    manta_job_free(job);
    manta_spec_free(spec);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    manta_ctx *m;
    if (manta_init(&m, &(manta_options){.classes = manta_builtin_classes,
                                        .call_timeout_ms = 60000,
                                        .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    args a = {0};
    int pid = -1, port = 0, rc = parse(argc, argv, &a) ? 2 : 0;
    char url[128];
    if (rc == 0 && a.calc) {
        pid = rl_start_calc_server(CALC_SERVER, a.calc_args, &port);
        if (pid < 0) {
            fprintf(stderr, "rl_run: cannot start %s\n", CALC_SERVER);
            rc = 1;
        }
        snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", port);
        a.sets[a.n_sets++] = url;
    }
    if (rc == 0) rc = run(m, &a);
    manta_shutdown(m);
    rl_stop_process(pid);
    return rc;
}
