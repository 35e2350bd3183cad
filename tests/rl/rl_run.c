/* Run: build/tests/rl/rl_run examples/calc_agent.yaml [--calc-server ["ARGS"]] [--set k=v]...
 *
 * A stand-alone `manta run` for RL specs: creates every actor of the spec,
 * calls the controller's run method and prints its summary. With
 * --calc-server it first starts examples/calc_server.py on a free port
 * (ARGS, e.g. "--latency-ms 50 --latency-dist lognormal", go to it) and
 * points tools.0.url at it. */
#include "launch.h"

#include <manta_actors.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CALC_SERVER
#define CALC_SERVER "examples/calc_server.py"
#endif

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
    const char *sets[64];
    size_t n_sets = 0;
    const char *spec = NULL, *calc_args = NULL;
    int calc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < 60)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--calc-server")) {
            calc = 1;
            if (i + 1 < argc && argv[i + 1][0] == '-' && argv[i + 1][1] == '-' &&
                strcmp(argv[i + 1], "--set"))
                calc_args = argv[++i];
        } else
            spec = argv[i];
    }
    if (!spec) {
        fprintf(stderr, "usage: rl_run SPEC [--calc-server [\"ARGS\"]] [--set path=value]...\n");
        manta_shutdown(m);
        return 2;
    }
    int pid = -1, port = 0;
    char url[128];
    if (calc) {
        pid = rl_start_calc_server(CALC_SERVER, calc_args, &port);
        if (pid < 0) {
            fprintf(stderr, "cannot start %s\n", CALC_SERVER);
            manta_shutdown(m);
            return 1;
        }
        snprintf(url, sizeof url, "tools.0.url=http://127.0.0.1:%d/mcp", port);
        sets[n_sets++] = url;
    }
    char *summary = NULL;
    rl_launch_opts o = {.spec_path = spec, .sets = sets, .n_sets = n_sets};
    int rc = rl_launch(m, &o, &summary);
    if (summary) printf("%s\n", summary);
    free(summary);
    manta_shutdown(m);
    rl_stop_process(pid);
    return rc ? 1 : 0;
}
