/*
 * manta_cli.h -- the `manta` command line, as a library function.
 *
 * The runtime knows nothing of the classes a program offers, so the CLI is
 * a function that a main() calls with its built-in classes; the `manta`
 * executable passes the RL classes of actors/, and a user can build their
 * own `manta` with other built-ins. Classes in shared libraries named by a
 * spec (`library:`) work with any of them.
 */
#ifndef MANTA_CLI_H
#define MANTA_CLI_H

#include "manta.h"
#include "manta_spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes of the `manta` command (documented in `manta --help`). */
enum {
    MANTA_EXIT_OK = 0,           /* done */
    MANTA_EXIT_JOB_FAILED = 1,   /* the job's run method answered an error */
    MANTA_EXIT_USAGE = 2,        /* bad command line or spec file */
    MANTA_EXIT_RUNTIME = 3,      /* Redis, spawning, placement or transport failure */
    MANTA_EXIT_TIMEOUT = 4,      /* a wait ran out (readiness, run, drain) */
    MANTA_EXIT_NOT_FOUND = 5,    /* no such job, group or actor */
    MANTA_EXIT_INTERRUPTED = 130 /* Ctrl-C / SIGTERM: torn down cleanly */
};

/* What a program builds into its `manta`. */
typedef struct manta_cli_builtins {
    const manta_class *const *classes; /* NULL-terminated built-in classes */
    /* The spec sections those classes read and the keys of their groups'
     * settings (manta_spec_options.sections and .settings): specs are
     * checked against them, and `manta help spec` prints them. May be NULL. */
    const manta_spec_key *sections;
    const manta_spec_key *settings;
    /* What those classes derive where a spec says nothing
     * (manta_spec_options.defaults; its user is `classes`): every command
     * loads specs with it, and the job's start says what it put in. May be
     * NULL. */
    int (*defaults)(manta_spec_defaults *d, const manta_spec_node *root, void *user);
} manta_cli_builtins;

/* Run the CLI with these built-ins. Returns the exit code. Not thread-safe
 * (installs signal handlers). */
int manta_cli_run(int argc, char **argv, const manta_cli_builtins *b);
/* The same with classes only (no declared sections). */
int manta_cli_main(int argc, char **argv, const manta_class *const *classes);
/* `manta keys ...` (keys.c): argv[0] is "keys". Returns the exit code. */
int manta_cli_keys(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
