/*
 * actor.c -- the life of an actor process.
 *
 * Started by a node agent with its identity in the environment, the process
 * finds its class (built in to the program, or in a shared library), binds
 * its mailbox at the endpoint the agent chose, runs the class's init with
 * the creation arguments kept in its directory record, marks itself alive,
 * and serves its mailbox until asked to stop (the "__stop" method or
 * SIGTERM). A heartbeat timer stamps the directory record every second.
 *
 * Exit codes tell the node agent what happened: 0 a clean stop, 3 a failed
 * start (not restarted), anything else a crash (restarted if allowed).
 */
#include "internal.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_START_FAILED 3

static volatile sig_atomic_t got_term;

static void on_term(int sig)
{
    got_term = 1;
}

const manta_class *mn_find_class(manta_ctx *m, const char *name, const char *library)
{
    if (library && *library) {
        /* A user library exports a NULL-terminated `manta_classes` table. */
        void *h = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            mn_fail(MANTA_ENOCLASS, "load library %s: %s", library, dlerror());
            return NULL;
        }
        const manta_class *const *tab = dlsym(h, "manta_classes");
        if (!tab) {
            mn_fail(MANTA_ENOCLASS, "library %s exports no manta_classes table", library);
            return NULL;
        }
        for (; *tab; tab++)
            if (!strcmp((*tab)->name, name)) return *tab;
        mn_fail(MANTA_ENOCLASS, "no class '%s' in library %s", name, library);
        return NULL;
    }
    for (const manta_class *const *c = m->classes; c && *c; c++)
        if (!strcmp((*c)->name, name)) return *c;
    mn_fail(MANTA_ENOCLASS, "no actor class '%s' in this program", name);
    return NULL;
}

static void set_state(manta_ctx *m, manta_actor_state state, const char *error)
{
    if (manta_reg_actor_report(m, m->self, state, (int)getpid(), error ? NULL : m->endpoint,
                               error) != 0)
        mn_log("actor %s: directory update to %s: %s", m->self, manta_actor_state_name(state),
               manta_last_error());
}

static void start_failed(manta_ctx *m, const char *why)
{
    mn_log("actor %s: %s", m->self, why);
    set_state(m, MANTA_ACTOR_FAILED, why);
    _exit(EXIT_START_FAILED);
}

static void heartbeat(void *arg)
{
    manta_ctx *m = arg;
    /* Asynchronous: a slow or paused Redis must not stall the mailbox. */
    manta_reg_actor_heartbeat_async(m, m->self, m->stats.calls_served);
    mn_metrics_publish(m);
    manta_timer_add(m, 1000, heartbeat, m);
}

static int actor_system(manta_ctx *m, manta_req *c, const mn_env *e, const void *arg, size_t len)
{
    if (!strcmp(c->method, "__stop")) {
        m->stopping = true;
        return 0;
    }
    return MANTA_ENOMETHOD;
}

int mn_actor_main(manta_ctx *m)
{
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    const char *cls = getenv("MANTA_CLASS"), *lib = getenv("MANTA_LIBRARY");
    const char *endpoint = getenv("MANTA_ENDPOINT");
    if (!cls || !endpoint) start_failed(m, "MANTA_CLASS and MANTA_ENDPOINT must be set");
    m->cls = mn_find_class(m, cls, lib);
    if (!m->cls) start_failed(m, manta_last_error());
    m->state = calloc(1, m->cls->state_size ? m->cls->state_size : 1);
    if (!m->state) start_failed(m, "out of memory for the actor's state");
    if (mn_mailbox_bind(m, endpoint) != 0) start_failed(m, manta_last_error());
    /* Multi-node jobs: a second, ipc endpoint for callers on this machine. */
    const char *local = getenv("MANTA_ENDPOINT_LOCAL");
    if (local && *local && zmq_bind(m->mailbox, local) != 0)
        mn_log("actor %s: local endpoint %s: %s (callers here use %s)", m->self, local,
               zmq_strerror(zmq_errno()), m->endpoint);
    m->system_method = actor_system;

    /* The creation arguments wait in the directory record. */
    void *args;
    size_t args_len;
    if (manta_reg_actor_args(m, m->self, &args, &args_len) != 0)
        start_failed(m, manta_last_error());
    if (m->cls->init) {
        mn_fail(0, "%s", "");
        int rc = m->cls->init(m, m->state, args ? args : "", args_len);
        if (rc) {
            char why[600];
            snprintf(why, sizeof why, "init of class %s failed (%s)%s%s", m->cls->name,
                     manta_strerror(rc), manta_last_error()[0] ? ": " : "", manta_last_error());
            free(args);
            start_failed(m, why);
        }
    }
    free(args);
    set_state(m, MANTA_ACTOR_ALIVE, NULL);
    manta_timer_add(m, 1000, heartbeat, m);

    while (!m->stopping && !got_term) mn_loop_once(m, 200);

    if (m->cls->fini) m->cls->fini(m, m->state);
    set_state(m, MANTA_ACTOR_STOPPED, NULL);
    mn_objstore_free(m);
    mn_loop_free(m);
    zmq_ctx_term(m->zmq);
    mn_exit(0);
}
