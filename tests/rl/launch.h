/*
 * launch.h - what `manta run SPEC` does, as a function for the RL tests and
 * benchmarks: create every replica `<group>-<i>` of every group with
 * manta_spec_init_payload() as its init arguments, call the `run:` section's
 * method on `<group>-0`, return its reply. The caller has called
 * manta_init() with manta_builtin_classes first thing in main().
 */
#ifndef RL_LAUNCH_H
#define RL_LAUNCH_H

#include <manta.h>
#include <manta_spec.h>

typedef struct rl_launch_opts {
    const char *spec_path;
    const char *const *sets; /* "path=value" overrides */
    size_t n_sets;
    /* called about every 100 ms while `run` is in flight (may be NULL):
     * scaling tests create and drain actors from here */
    void (*tick)(manta_ctx *m, const manta_spec *spec, double elapsed_s, void *arg);
    void *arg;
} rl_launch_opts;

/* Returns 0 and a malloc'd NUL-terminated reply in *summary, or an error
 * (printed to stderr). */
int rl_launch(manta_ctx *m, const rl_launch_opts *o, char **summary);

/* Create replica `replica` of group `group` of spec (name `<group>-<replica>`). */
int rl_launch_replica(manta_ctx *m, const manta_spec *spec, const char *group, int replica);

/* Start examples/calc_server.py on a free port with extra arguments; returns
 * its pid and writes the port. -1 on failure. */
int rl_start_calc_server(const char *script, const char *extra, int *port);
void rl_stop_process(int pid);

#endif
