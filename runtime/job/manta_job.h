/*
 * manta_job.h -- a job of a spec file, run from C: what `manta run` does,
 * as a library.
 *
 * A job is the actor graph a spec describes (runtime/spec/manta_spec.h):
 * every group's replicas, named GROUP-0, GROUP-1, ..., placed on the nodes
 * of the job that have room, plus the `services:` the spec names (processes
 * that are not actors, such as a tool server), plus the spec's `run:`
 * method. manta_job_start() records the job in Redis, starts the services,
 * places and starts every replica at once and waits until all are ready.
 * While the job runs, a node watchdog (a timer on the ctx's loop) declares
 * nodes whose heartbeat stopped dead and re-creates their actors on nodes
 * with room; it runs whenever the loop turns (manta_job_wait, manta_get,
 * manta_poll ...). It also supervises the services (restarted as their
 * `restart:` says) and ends the job (manta_job_wait returns the cause) when
 * something it needs is gone for good: a service not restarted, a group
 * whose every replica is dead or failed, a node stalled past
 * node_stall_ms, Redis unreachable past redis_down_ms. Groups grow and shrink with
 * manta_job_scale(), also from another process that attached to the job (manta_job_attach).
 *
 *     manta_ctx *m;
 *     if (manta_init(&m, &(manta_options){.classes = my_classes, .job = spec->job}) != 0)
 *         return 1;
 *     manta_job_t *job;
 *     if (manta_job_start(m, spec, NULL, &job) != 0) { ... manta_last_error() ... }
 *     const void *reply; size_t len;
 *     int rc = manta_job_wait(job, -1, &reply, &len);   // the spec's run: method
 *     manta_job_free(job);
 *     manta_shutdown(m);
 *
 * Errors: functions that can fail return 0 or a negative MANTA_E* code from
 * manta.h, and manta_last_error() gives a message naming what failed (the
 * group, the actor, the node, the service). Progress lines (a service
 * started, a node declared dead, an actor moved) go to the log stream of
 * the options (stderr by default).
 *
 * Ownership: a manta_job_t borrows its manta_ctx and, from manta_job_start,
 * its manta_spec; both must outlive it. manta_job_attach loads the spec
 * itself and the job owns that one. Free a job with manta_job_free() before
 * manta_shutdown() of its ctx. The actors of a job belong to the ctx: a
 * driver's manta_shutdown() stops them all and deletes the job's keys.
 *
 * Threads: like the ctx, a job belongs to the thread that called
 * manta_init(); nothing here is thread-safe.
 */
#ifndef MANTA_JOB_H
#define MANTA_JOB_H

#include "manta.h"
#include "manta_spec.h"

#include <signal.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* manta_job_t, not manta_job: manta_job() in manta.h names a ctx's job namespace. */
typedef struct manta_job manta_job_t;

typedef struct manta_job_options {
    /* Recorded in the job's driver record so that another process can
     * attach and scale with the same spec (manta_job_attach): the spec
     * file's absolute path and the overrides it was loaded with. NULL / 0:
     * not recorded, and manta_job_attach on this job fails. */
    const char *spec_path;
    const char *const *sets;
    size_t n_sets;
    const char *run_dir;    /* recorded for `manta status`; NULL: none */
    const char *log_dir;    /* services' output goes to LOG_DIR/NAME.log; NULL: inherited */
    int no_services;        /* 1: do not start the spec's services (the caller runs them) */
    int no_watchdog;        /* 1: no node watchdog and failover */
    double ready_timeout_s; /* start and scale: wait for readiness; 0: 60 */
    /* A node without a heartbeat for this long is declared dead; 0: env
     * MANTA_NODE_TIMEOUT_MS, else 5000. */
    int64_t node_timeout_ms;
    /* A silent node is declared dead only when its mailbox refuses
     * connections (its process is gone) or its machine does not answer. One
     * whose process still holds its mailbox (stopped, starved) keeps its
     * actors; after this long without a heartbeat the job fails naming it.
     * 0: env MANTA_NODE_STALL_MS, else 60000. */
    int64_t node_stall_ms;
    /* The watchdog's Redis reads failing this long fail the job (the
     * embedded redis-server is restarted with its data by the core first).
     * 0: env MANTA_REDIS_DOWN_MS, else 30000. */
    int64_t redis_down_ms;
    /* When set and nonzero, waits end: manta_job_start and manta_job_wait
     * return MANTA_ECLOSED. A signal handler may set it. */
    const volatile sig_atomic_t *interrupt;
    /* Called about every 100 ms from manta_job_wait with the seconds since
     * the wait began (may be NULL). It may scale, drain, kill actors and
     * call manta_job_stop(). */
    void (*tick)(manta_job_t *job, double elapsed_s, void *arg);
    void *tick_arg;
    FILE *log; /* progress lines; NULL: stderr */
} manta_job_options;

/* Start the job of `spec` on the driver ctx `m` (not attached; manta_init
 * with .job = spec->job so that keys and records meet). In order: says the
 * spec's derived defaults (spec->derived) on the log, records
 * the job (driver record and groups), starts the services (and waits until
 * each one's port accepts connections), places every replica first-fit on
 * the job's live nodes, starts them all at once, waits until all are ready,
 * and arms the node watchdog. `o` may be NULL (all defaults); it is copied,
 * but its strings and `interrupt` must outlive the job.
 * Returns 0 and *out, or (with *out NULL and the services stopped):
 *   MANTA_EINVAL   m attached, a NULL argument, or a bad `services:` entry
 *   MANTA_EEXIST   a driver of a job of that name is running (its pid in the
 *                  message); m is then marked attached, so manta_shutdown
 *                  leaves that job alone
 *   MANTA_EREDIS   the records could not be written
 *   MANTA_ESPAWN   a service did not start or its port is taken; no room to
 *                  place the replicas; an actor could not be started
 *   MANTA_ETIMEDOUT an actor was not ready within ready_timeout_s
 *   MANTA_ECLOSED  interrupted (o->interrupt)
 *   MANTA_ENOMEM   out of memory
 * After a failure the job's records are removed again (the same name can
 * start later); actors started before it stay until manta_shutdown(m). */
int manta_job_start(manta_ctx *m, const manta_spec *spec, const manta_job_options *o,
                    manta_job_t **out);

/* Join a job that another process drives, on a ctx made with
 * manta_options.attach: reads the driver record and loads the spec it was
 * started with, the recorded overrides first, then `so->sets` (so may be
 * NULL; its class_exists, user and defaults are used as given: pass the
 * driver's defaults to get the spec it runs). No services, no
 * watchdog. Spec errors go to `errs` when it is not NULL.
 * Returns 0 and *out, or MANTA_EINVAL (NULL argument; the spec does not
 * load: "spec FILE: N error(s)"), MANTA_ENOTFOUND (the job is not running,
 * or it was started without a spec path), MANTA_ENOMEM. */
int manta_job_attach(manta_ctx *m, const manta_spec_options *so, manta_spec_errors *errs,
                     manta_job_t **out);

/* Make GROUP have n replicas. Growing places the new replicas (the lowest
 * free indices) on nodes with room, starts them with the spec's settings
 * and waits until they are ready, up to timeout_ms (<= 0: ready_timeout_s).
 * Shrinking asks the highest-numbered replicas to `drain` (a class without
 * that method is stopped at once) all at once, waiting up to timeout_ms
 * (<= 0: 120 s), then stops them. On success the group's wanted count is recorded.
 * Returns 0, MANTA_EINVAL (n < 0), MANTA_ENOTFOUND (no such group),
 * MANTA_ESPAWN (no room; an actor could not start), MANTA_ETIMEDOUT (not
 * ready, or a drain ran out), the error of a failed drain or stop,
 * MANTA_EREDIS, MANTA_ENOMEM. Works on attached jobs. */
int manta_job_scale(manta_job_t *job, const char *group, int n, int timeout_ms);

/* How many replicas GROUP has in the directory now (any state), or
 * MANTA_EINVAL, MANTA_ENOTFOUND (no such group), MANTA_EREDIS. */
int manta_job_replicas(manta_job_t *job, const char *group);

/* Drain one actor of the job by name (its `drain` method, if the class has
 * one, within timeout_ms; <= 0: 120 s), then stop it.
 * Returns 0, MANTA_ENOTFOUND, or the error of the drain or the stop. */
int manta_job_drain(manta_job_t *job, const char *actor, int timeout_ms);

/* Call the spec's `run: {group, method, timeout_s}` on GROUP-0 (method
 * default "run", timeout default 3600 s) and return its future in *out
 * (the caller frees it). Returns 0, MANTA_ENOTFOUND (no `run:` section, or
 * no GROUP-0), or the error of manta_call. */
int manta_job_run_method(manta_job_t *job, manta_future **out);

/* Run the job: turn the loop (with the watchdog and the tick) until the
 * spec's run method answers, or, without `run:`, until the job is stopped.
 * On 0, *reply and *len (either may be NULL) hold the run method's answer,
 * owned by the job and valid until manta_job_free.
 * Returns 0 (answered; or stopped by manta_job_stop without `run:`), the
 * run method's error (MANTA_EREMOTE, MANTA_ETIMEDOUT, MANTA_EDIED ...; the
 * message names GROUP-0.METHOD and the actor's text, and for a death what
 * the watchdog found: a node gone, a service gone), the watchdog's fatal
 * cause (MANTA_EDIED: a service or group gone for good; MANTA_ESPAWN: a
 * service's restart failed; MANTA_ETIMEDOUT: a node stalled; MANTA_EREDIS:
 * Redis gone; the message names it), MANTA_EPENDING
 * (timeout_ms ran out; < 0 waits for ever; the call stays in flight and a
 * later wait continues it), MANTA_ECLOSED (interrupted or stopped while the
 * run method was in flight), MANTA_ENOTFOUND (no GROUP-0 to call). */
int manta_job_wait(manta_job_t *job, int timeout_ms, const void **reply, size_t *len);

/* Ask manta_job_wait to return (from a tick, a timer or a method). */
void manta_job_stop(manta_job_t *job);

/* Stop the watchdog and the services, remove the job's records if
 * manta_job_start wrote them (the job no longer runs: the name can start
 * again), free the job (and the spec it owns). The actors stay: they belong
 * to the ctx. NULL is a no-op. Call before manta_shutdown() of the job's
 * ctx. */
void manta_job_free(manta_job_t *job);

const manta_spec *manta_job_spec(const manta_job_t *job);
manta_ctx *manta_job_ctx(const manta_job_t *job);
/* Live nodes of the job when the replicas were placed (start) or last
 * placed (scale). */
size_t manta_job_node_count(const manta_job_t *job);

#ifdef __cplusplus
}
#endif
#endif
