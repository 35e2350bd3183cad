/*
 * launch.c - a small launcher with the behaviour of `manta run` (see
 * launch.h), so that the RL tests and the benchmark do not depend on the CLI.
 */
#include "launch.h"

#include <manta_actors.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int rl_launch_replica(manta_ctx *m, const manta_spec *spec, const char *group, int replica)
{
    size_t g;
    for (g = 0; g < spec->n_groups; g++)
        if (!strcmp(spec->groups[g].name, group)) break;
    if (g == spec->n_groups) return MANTA_ENOTFOUND;
    char *args;
    size_t len;
    if (manta_spec_init_payload(spec, g, replica, &args, &len)) return MANTA_ENOMEM;
    char name[96];
    snprintf(name, sizeof name, "%s-%d", group, replica);
    manta_actor *a;
    manta_actor_options ao = {.cls = spec->groups[g].class_name,
                              .name = name,
                              .args = args,
                              .args_len = len,
                              .max_restarts = spec->groups[g].max_restarts,
                              .ready_timeout_ms = 60000};
    int rc = manta_actor_create(m, &ao, &a);
    free(args);
    if (rc) fprintf(stderr, "launch: create %s: %s\n", name, manta_last_error());
    return rc;
}

int rl_launch(manta_ctx *m, const rl_launch_opts *o, char **summary)
{
    *summary = NULL;
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = o->sets, .n_sets = o->n_sets};
    manta_spec *spec = manta_spec_load_file(o->spec_path, &so, &errs);
    if (!spec) {
        manta_spec_errors_print(&errs, stderr);
        manta_spec_errors_destroy(&errs);
        return MANTA_EINVAL;
    }
    manta_spec_errors_destroy(&errs);
    int rc = 0;
    for (size_t g = 0; g < spec->n_groups && !rc; g++)
        for (int r = 0; r < spec->groups[g].replicas && !rc; r++)
            rc = rl_launch_replica(m, spec, spec->groups[g].name, r);
    const char *group = "controller", *method = "run";
    int64_t timeout_s = 900;
    manta_spec_get_str(spec->root, "run.group", "controller", &group, NULL);
    manta_spec_get_str(spec->root, "run.method", "run", &method, NULL);
    manta_spec_get_int(spec->root, "run.timeout_s", 900, &timeout_s, NULL);
    manta_actor *ctl = NULL;
    char name[96];
    snprintf(name, sizeof name, "%s-0", group);
    if (!rc) rc = manta_actor_lookup(m, name, &ctl);
    if (!rc) {
        double t0 = now_s();
        manta_future *f = manta_call_timeout(m, ctl, method, "", 0, (int)timeout_s * 1000);
        const void *d;
        size_t n;
        for (;;) {
            rc = manta_get(f, 100, &d, &n);
            if (rc != MANTA_EPENDING) break;
            if (o->tick) o->tick(m, spec, now_s() - t0, o->arg);
        }
        if (rc == 0) {
            *summary = malloc(n + 1);
            if (*summary) memcpy(*summary, d, n), (*summary)[n] = 0;
        } else {
            fprintf(stderr, "launch: %s.%s: %s\n", name, method, manta_future_error(f));
        }
        manta_future_free(f);
    }
    manta_spec_free(spec);
    return rc;
}

int rl_start_calc_server(const char *script, const char *extra, int *port)
{
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]), close(fds[1]);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec python3 %s --port 0 %s", script, extra ? extra : "");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[128] = "";
    *port = 0;
    if (f && fgets(line, sizeof line, f)) sscanf(line, "PORT %d", port);
    if (f) fclose(f);
    if (*port <= 0) {
        rl_stop_process(pid);
        return -1;
    }
    return pid;
}

void rl_stop_process(int pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}
