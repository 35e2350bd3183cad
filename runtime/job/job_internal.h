/*
 * job_internal.h -- what the files of runtime/job/ share; not installed.
 *
 *   job.c      records, placement, replicas, the watchdog, scale, drain, run
 *   service.c  the spec's services: start, supervise, stop
 *   liveness.c is a node alive? its process and its socket, not only its
 *              heartbeat
 */
#ifndef MANTA_JOB_INTERNAL_H
#define MANTA_JOB_INTERNAL_H

#include "manta_job.h"

#include <signal.h>
#include <stdio.h>

/* "manta: " + the line, to f (stderr when NULL). */
void mj_say(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The spec's errors as one EINVAL message "WHAT: file:line:col: ...; ...". */
int mj_spec_fail(manta_spec_errors *errs, const char *what);
/* 1 when something accepts TCP connections on 127.0.0.1:port. */
int mj_port_open(int port);

/* ---- services (service.c) ---- */
typedef struct mj_services mj_services;
/* Start the spec's `services:` in order, each waited for on its port.
 * *out is set even on failure (stop it with mj_services_stop). Returns 0,
 * MANTA_EINVAL (a bad entry), MANTA_ESPAWN (port taken, exited, not up in
 * time), MANTA_ESYS, MANTA_ECLOSED (interrupted), MANTA_ENOMEM. log_dir and
 * interrupt must outlive the services. */
int mj_services_start(const manta_spec *spec, const char *log_dir,
                      const volatile sig_atomic_t *interrupt, FILE *log, mj_services **out);
/* Reap services that exited and restart them as their `restart:` says.
 * Returns 0, or MANTA_EDIED / MANTA_ESPAWN with a message naming the
 * service when one is gone for good (the job cannot go on). */
int mj_services_watch(mj_services *ss);
/* SIGTERM to each service's process group, SIGKILL after 3 s; frees. NULL:
 * no-op. */
void mj_services_stop(mj_services *ss);

/* ---- node liveness (liveness.c) ---- */
typedef enum {
    MJ_NODE_GONE = 0,    /* its mailbox refuses connections, or its machine does not answer */
    MJ_NODE_PRESENT = 1, /* something holds its mailbox's socket: stopped or busy, not dead */
    MJ_NODE_UNKNOWN = -1 /* the endpoint cannot be probed */
} mj_node_liveness;
/* Probe a node agent's mailbox endpoint (tcp://HOST:PORT or ipc://PATH)
 * with a connection attempt of at most timeout_ms. A stopped process still
 * holds its listening socket (the kernel completes the connection); a dead
 * one does not. */
mj_node_liveness mj_probe_endpoint(const char *endpoint, int timeout_ms);

#endif
