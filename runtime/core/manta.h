/*
 * manta.h -- the public API of the Manta actor runtime.
 *
 * Manta runs actors the way Ray does: every actor is an OS process with one
 * mailbox (a ZeroMQ ROUTER socket), spawned and restarted by the node agent
 * of its machine, found through a directory in Redis. A call returns a future
 * at once; the caller collects it with manta_get() or manta_wait(). Every
 * process, driver or actor, runs one event loop: while it waits on a future
 * it keeps serving its own mailbox, so nested and mutual calls never
 * deadlock.
 *
 * A program that uses Manta is at once the driver and the code of its actors.
 * It lists its actor classes in manta_options and calls manta_init() first
 * thing in main(). When the node agent starts the same executable as an
 * actor (or as a node agent), manta_init() runs that role and exits the
 * process; it returns only in the driver:
 *
 *     int main(int argc, char **argv) {
 *         manta_options o = {.classes = my_classes};
 *         manta_ctx *m;
 *         if (manta_init(&m, &o) != 0) return 1;     // actors never get here
 *         manta_actor *a;
 *         manta_actor_create(m, &(manta_actor_options){.cls = "echo"}, &a);
 *         manta_future *f = manta_call(m, a, "ping", "hi", 2);
 *         const void *data; size_t len;
 *         if (manta_get(f, 1000, &data, &len) == 0) ...
 *         manta_future_free(f);
 *         manta_shutdown(m);
 *     }
 *
 * Errors: functions that can fail return 0 or a negative MANTA_E* code;
 * manta_strerror() names it and manta_last_error() gives the message of the
 * last failure in this thread (what failed and where).
 *
 * Threads: a manta_ctx and everything made from it (actor handles, futures,
 * calls) belong to the thread that called manta_init(); none of it is
 * thread-safe. manta_strerror() is.
 */
#ifndef MANTA_H
#define MANTA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MANTA_PROTOCOL_VERSION 1

/* ---- Errors: one table, one strerror ------------------------------------ *
 *
 * Every library of Manta (the core, collectives, the HTTP client, the spec
 * loader) and the MCP client and RL helpers in actors/ report failures with a
 * code from this one table: 0 for success, a negative MANTA_E* otherwise,
 * each cause spelt once (a timeout is MANTA_ETIMEDOUT wherever it happens).
 * The code says what kind of failure it was; the message that goes with it
 * (manta_last_error(), or the `message` of an HTTP or MCP result) says what
 * failed and where. Codes are consecutive from 0 down, so -code indexes an
 * array of MANTA_ERR_COUNT counters (manta_err_index). New codes go at the
 * end; a code never changes its value. */
#define MANTA_ERRORS(X)                                                                            \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EPENDING, -3, "not resolved yet: the wait ran out, the future is still pending")             \
    X(ETIMEDOUT, -4, "timed out: no answer before the deadline")                                   \
    X(EDIED, -5, "actor died while the call was pending")                                          \
    X(EREMOTE, -6, "the actor's method failed")                                                    \
    X(ENOMETHOD, -7, "unknown method")                                                             \
    X(EPROTO, -8, "malformed message or wrong protocol version")                                   \
    X(EMSGSIZE, -9, "message or answer larger than its size limit")                                \
    X(EREDIS, -10, "registry (Redis) error")                                                       \
    X(EZMQ, -11, "transport (ZeroMQ) error")                                                       \
    X(ENOTFOUND, -12, "no such actor or object")                                                   \
    X(EEXIST, -13, "name already taken")                                                           \
    X(ESPAWN, -14, "could not start the actor")                                                    \
    X(ECLOSED, -15, "shut down or closed while pending")                                           \
    X(ESYS, -16, "system call failed")                                                             \
    X(ENOCLASS, -17, "unknown actor class")                                                        \
    X(EBUSY, -18, "too many calls pending")                                                        \
    X(ECONNECT, -19, "could not connect: refused or unreachable")                                  \
    X(ERESOLVE, -20, "could not resolve the host name")                                            \
    X(ETLS, -21, "TLS handshake or certificate check failed")                                      \
    X(ETRANSFER, -22, "transfer failed: connection reset, closed early or broken")                 \
    X(ECANCELED, -23, "canceled by the caller")                                                    \
    X(EHTTP, -24, "HTTP error status")                                                             \
    X(ERPC, -25, "JSON-RPC error answer")                                                          \
    X(EJSON, -26, "invalid JSON")                                                                  \
    X(ETOOL, -27, "the tool reported an error")                                                    \
    X(ESESSION, -28, "session lost: the server forgot it again")                                   \
    X(ESPEC, -29, "invalid spec")                                                                  \
    X(ENOFIT, -30, "does not fit in the free resources of the nodes")

enum {
#define MANTA_X_ENUM(name, code, text) MANTA_##name = code,
    MANTA_ERRORS(MANTA_X_ENUM)
#undef MANTA_X_ENUM
};

/* The number of codes in the table: an array of MANTA_ERR_COUNT counters is
 * indexed by manta_err_index(code). */
enum {
#define MANTA_X_COUNT(name, code, text) MANTA_ERR_INDEX_##name,
    MANTA_ERRORS(MANTA_X_COUNT)
#undef MANTA_X_COUNT
        MANTA_ERR_COUNT
};

/* The index of a code in the table: -code (0 for MANTA_OK, 1 for
 * MANTA_EINVAL ...). A code not in the table gets 0, so an array of
 * MANTA_ERR_COUNT failure counters can always be indexed with it: slot 0
 * counts no success, only failures with a foreign code. Thread-safe. */
static inline int manta_err_index(int code)
{
    return code <= 0 && code > -MANTA_ERR_COUNT ? -code : 0;
}

/* Static text for an error code ("unknown error code" for one not in the
 * table); never NULL. Thread-safe. */
const char *manta_strerror(int code);
/* Static name of an error code without its prefix ("ETIMEDOUT", "OK"), or
 * "?" for one not in the table; never NULL. Thread-safe. */
const char *manta_errname(int code);
/* The message of the last failure in this thread ("" if none). */
const char *manta_last_error(void);
/* Set this thread's last error message (printf format) and return code:
 * for libraries beside the core that report in the same convention. The
 * arguments may include manta_last_error() itself. */
int manta_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Milliseconds of a monotonic clock (for timeouts and rates). */
int64_t manta_now_ms(void);
/* Fill out[0..nhex) with random hex digits and end it with a NUL (out holds
 * nhex + 1 bytes; nhex <= 128). */
void manta_random_hex(char *out, size_t nhex);

/* ---- Types --------------------------------------------------------------- */

typedef struct manta_ctx manta_ctx;       /* the per-process runtime context */
typedef struct manta_actor manta_actor;   /* a handle to an actor (owned by the ctx) */
typedef struct manta_future manta_future; /* the result of one call (owned by the caller) */
typedef struct manta_req manta_req;       /* a call being served by an actor */

/* A method: serve one call. `arg` points into the received message and is
 * valid until the method returns. Answer with manta_reply() or
 * manta_reply_error(); a method that returns without answering sends an
 * empty reply if it returns 0, an error reply with that code otherwise.
 * A method may call other actors and wait on them. */
typedef int (*manta_method_fn)(manta_req *call, void *state, const void *arg, size_t len);

typedef struct manta_method {
    const char *name;
    manta_method_fn fn;
} manta_method;

/* An actor class: a const table, like Ray's @ray.remote class.
 * init runs once per incarnation with the creation arguments; a nonzero
 * return fails the creation (not restarted). fini runs at a clean stop. */
typedef struct manta_class {
    const char *name;
    size_t state_size; /* bytes of zeroed state handed to every callback */
    int (*init)(manta_ctx *m, void *state, const void *args, size_t len);
    void (*fini)(manta_ctx *m, void *state);
    const manta_method *methods; /* ends with {NULL, NULL} */
} manta_class;

/* ---- Redis addresses ------------------------------------------------------ */

#define MANTA_REDIS_DEFAULT_PORT 6379 /* redis://host without a port */

/* A parsed Redis address: the one form every part of Manta passes around
 * (manta_options, the spec's `redis:`, the CLI's --redis). */
typedef struct manta_redis_addr {
    int embedded;       /* 1: "embedded", start a private redis-server */
    char host[256];     /* hostname, IPv4, or IPv6 without brackets */
    int port;           /* 1..65535; MANTA_REDIS_DEFAULT_PORT when not given */
    int db;             /* /N suffix; 0 when not given */
    char user[128];     /* ACL user ("" : the default user) */
    char password[256]; /* "" for none; %XX escapes decoded */
} manta_redis_addr;

/* Parse "embedded" or redis://[[user]:password@]host[:port][/db] (IPv6 as
 * [addr]; %XX escapes in the user and password). Returns 0, or MANTA_EINVAL
 * with the reason alone (e.g. "port out of range") in why (may be NULL)
 * and "redis URL 'URL': reason" in manta_last_error(). Thread-safe apart
 * from manta_last_error, which is per thread. */
int manta_redis_url_parse(const char *url, manta_redis_addr *out, char *why, size_t why_len);
/* Write an address back as a URL, escaping what needs it; "embedded" for an
 * embedded one. Returns 0, or MANTA_EINVAL if it does not fit in n bytes. */
int manta_redis_url_format(const manta_redis_addr *a, char *out, size_t n);

typedef struct manta_options {
    /* NULL: start a private redis-server on a free loopback port with a
     * generated password (the embedded default) and stop it at shutdown.
     * Otherwise a URL for manta_redis_url_parse() ("embedded" included).
     * Env MANTA_REDIS too. Ignored when `redis` is set. */
    const char *redis_url;
    /* The same, already parsed (a spec's `redis` is one); NULL: use
     * redis_url. A user authenticates with AUTH user password. */
    const manta_redis_addr *redis;
    const char *job;                   /* key namespace; NULL: generated */
    const manta_class *const *classes; /* NULL-terminated list */
    const char *transport;             /* "ipc" (default) or "tcp" */
    const char *host;                  /* address actors bind for tcp; default 127.0.0.1 */
    size_t max_pending;                /* per-process limit on calls in flight; default 10000 */
    size_t max_message;                /* largest accepted message; default 1 GiB */
    int call_timeout_ms;               /* default deadline of a call; default 60000 */
    int no_local_node;                 /* 1: do not start a local node agent */
    /* 1: join a job that another driver owns (the CLI's scale and status):
     * no local node, and shutdown leaves the job's actors and keys alone. */
    int attach;
    const char *log_dir; /* actors' stdout/stderr go to log_dir/NAME.log */
    /* Authentication of every ZeroMQ socket (mailboxes, node agents, object
     * servers) with CURVE: "auto" (NULL: on for tcp or when a key file is
     * given, off for ipc, whose sockets live in the private 0700 run
     * folder), "on" or "off". Env MANTA_CURVE wins. See "Security" below. */
    const char *curve;
    /* The job's keys (a file made by manta_keys_write or `manta keys new`);
     * NULL: a driver makes a fresh pair at start in RUN_DIR/curve.key
     * (0600), and an attached driver reads that file. Env MANTA_KEYS wins. */
    const char *keys_file;
    /* The shared libraries the node agents may load actor classes from (a
     * spec's `library:` entries), NULL-terminated; NULL: none. A spawn that
     * names any other library is refused (ESPAWN, naming its path), so a
     * caller cannot make an agent run a constructor of its choosing. Env
     * MANTA_LIBRARIES (paths separated by ':') adds to the list; a `manta
     * node` gets its list that way. Paths are compared once resolved
     * (realpath); a bare name (dlopen's search) only matches itself. */
    const char *const *libraries;
} manta_options;

/* ---- Runtime --------------------------------------------------------------- */

/* Start the runtime in this process. In the driver it connects to (or
 * starts) Redis, starts a local node agent and returns 0 with *out set. In a
 * process started by a node agent it runs that actor or agent and calls
 * exit(): it does not return. Returns a MANTA_E* code on failure. */
int manta_init(manta_ctx **out, const manta_options *opts);

/* Stop every actor of this driver's job, the local node agent and the
 * embedded Redis; delete the job's keys; free the ctx and every handle and
 * pending future's pending state (futures not yet freed resolve ECLOSED and
 * must still be freed). NULL is a no-op. */
void manta_shutdown(manta_ctx *m);

const char *manta_job(const manta_ctx *m);
const char *manta_redis_url(const manta_ctx *m); /* with password */
const char *manta_self(const manta_ctx *m);      /* actor name, or "driver" */
const char *manta_node_id(const manta_ctx *m);   /* this process's node id */
const char *manta_transport(const manta_ctx *m); /* "ipc" or "tcp" */
const char *manta_bind_host(const manta_ctx *m); /* address tcp endpoints bind */
const char *manta_run_dir(const manta_ctx *m);   /* folder of the job's ipc sockets */
/* This machine as the runtime tells machines apart: host name, boot id, and /tmp's device and
 * inode (two processes with the same id share a kernel and its files: ipc:// endpoints, CUDA
 * IPC). */
const char *manta_host_id(void);
/* In an actor its node agent gave GPUs: lets this process also see the node's other GPUs
 * (MANTA_NODE_GPUS), listed in CUDA_VISIBLE_DEVICES after its own, so that it can map their
 * memory (CUDA IPC, peer copies) while its own devices keep their numbers (device 0 is still
 * its first). The list it was given stays in MANTA_GPUS_OWN. Call it before the process first
 * uses CUDA, which reads the variable once. Returns the count of devices now visible; 0 where
 * the actor holds no GPU or its agent named no others (nothing changes); MANTA_EINVAL for a
 * list over 64 names. */
int manta_gpu_see_node(void);
/* 1 if this ctx joined a job another driver owns (manta_options.attach, or
 * a refused driver claim): its shutdown leaves the job alone. */
int manta_attached(const manta_ctx *m);

/* Run the event loop (the mailbox, replies, timers, fd watches) for
 * timeout_ms, however many events come (0: one turn, no wait). Returns 0
 * or a negative MANTA_E* code. */
int manta_poll(manta_ctx *m, int timeout_ms);
/* Run the event loop until at least one event has been handled (a call
 * served, a reply or error received, a timer or fd watch run, a deadline
 * passed), or timeout_ms (-1: no limit), like uv_run(UV_RUN_ONCE). Returns
 * the number of events handled in the turn that had any (> 0), 0 when the
 * timeout ran out first (at once when nothing could ever wake it: no
 * mailbox, no call in flight, no timer, no watch), or a negative MANTA_E*
 * code. A loop of manta_poll_once(m, -1) is a process driven by events. */
int manta_poll_once(manta_ctx *m, int timeout_ms);

/* ---- Actors ---------------------------------------------------------------- */

typedef struct manta_actor_options {
    const char *cls;  /* class name (required) */
    const char *name; /* unique per job; NULL: generated */
    const void *args; /* creation arguments handed to init */
    size_t args_len;
    int max_restarts;     /* restarts after a crash; -1: unlimited */
    const char *node;     /* node id; NULL: the local node */
    const char *library;  /* shared library holding the class (dlopen), or NULL */
    int ready_timeout_ms; /* default 30000 */
    int no_wait;          /* 1: return at once; calls queue until it is ready */
    double gpu;           /* GPUs the node agent gives it (CUDA_VISIBLE_DEVICES; 0: none): a
                             fraction below 1 shares one device, else a whole number */
} manta_actor_options;

/* Ask a node agent to start an actor and (unless no_wait) wait until its
 * init has returned. The handle belongs to the ctx. Errors: EEXIST (name
 * taken), ENOCLASS, ESPAWN (init failed: see manta_last_error), ETIMEDOUT. */
int manta_actor_create(manta_ctx *m, const manta_actor_options *o, manta_actor **out);

/* Find a named actor of this job in the directory. ENOTFOUND if none. */
int manta_actor_lookup(manta_ctx *m, const char *name, manta_actor **out);

/* Wait until a created actor is ready (alive). */
int manta_actor_wait_ready(manta_ctx *m, manta_actor *a, int timeout_ms);

/* Kill an actor's process (SIGKILL). restart=1 lets the node agent restart
 * it as after a crash; restart=0 stops it for good. */
int manta_actor_kill(manta_ctx *m, manta_actor *a, int restart);

/* Stop an actor cleanly: it finishes the call it is serving, runs fini,
 * leaves the directory. */
int manta_actor_stop(manta_ctx *m, manta_actor *a, int timeout_ms);

/* The life of an actor as its directory record tells it. */
typedef enum manta_actor_state {
    MANTA_ACTOR_UNKNOWN = 0, /* no record, or a state this build does not know */
    MANTA_ACTOR_STARTING,    /* its process is starting; init has not returned */
    MANTA_ACTOR_ALIVE,       /* init returned: it serves calls */
    MANTA_ACTOR_RESTARTING,  /* crashed; its node agent starts a new incarnation */
    MANTA_ACTOR_DEAD,        /* crashed past max_restarts, or its node died */
    MANTA_ACTOR_FAILED,      /* init failed or the program would not start */
    MANTA_ACTOR_STOPPED      /* stopped cleanly */
} manta_actor_state;

/* "starting", "alive", ... as stored in Redis; "unknown" for anything else.
 * Static text, never NULL. Thread-safe. */
const char *manta_actor_state_name(manta_actor_state s);
/* The state a name stands for; MANTA_ACTOR_UNKNOWN if none. */
manta_actor_state manta_actor_state_parse(const char *name);

typedef struct manta_actor_info {
    manta_actor_state state;
    char node[64];
    char endpoint[128];       /* where any node reaches it (ipc:// on one machine, tcp://) */
    char endpoint_local[128]; /* ipc:// for callers on its machine (multi-node jobs), or "" */
    char host[160];           /* which machine: see endpoint_local */
    int pid;
    int incarnation;
    int restarts;
    int64_t heartbeat_ms; /* wall clock of the last heartbeat */
} manta_actor_info;

/* Read an actor's directory record. */
int manta_actor_info_get(manta_ctx *m, const manta_actor *a, manta_actor_info *out);
const char *manta_actor_name(const manta_actor *a);

/* ---- Calls and futures ------------------------------------------------------ */

/* Call `method` on actor `a` with `len` bytes of `arg` (copied once; large
 * arguments travel as their own frame). Returns a future at once; never NULL
 * unless out of memory. If max_pending calls are in flight it first serves
 * the loop until one resolves (back-pressure), up to the call's deadline. */
manta_future *manta_call(manta_ctx *m, manta_actor *a, const char *method, const void *arg,
                         size_t len);
/* Same with an explicit deadline in ms (0: the ctx default). */
manta_future *manta_call_timeout(manta_ctx *m, manta_actor *a, const char *method, const void *arg,
                                 size_t len, int timeout_ms);

/* One-way message: no reply, no future. 0 or an error code. */
int manta_cast(manta_ctx *m, manta_actor *a, const char *method, const void *arg, size_t len);

/* Wait up to timeout_ms (-1: until the call's deadline) for the future.
 * Returns 0 with *data,*len set to the reply (valid until the future is
 * freed), EPENDING if the wait ran out (the future stays pending), or the
 * code the call resolved with: ETIMEDOUT, EDIED, EREMOTE / ENOMETHOD /
 * EPROTO / EMSGSIZE (the actor's error; text in manta_future_error), ECLOSED.
 * data and len may be NULL. */
int manta_get(manta_future *f, int timeout_ms, const void **data, size_t *len);

/* Wait until at least k of the n futures have resolved, or timeout_ms.
 * Returns how many have resolved (possibly < k on timeout). */
int manta_wait(manta_future *const *fs, size_t n, size_t k, int timeout_ms);

int manta_future_done(const manta_future *f);          /* 1 once resolved */
int manta_future_status(const manta_future *f);        /* EPENDING until resolved */
const char *manta_future_error(const manta_future *f); /* error text, "" if none */
/* Free a future; if it is still pending its reply will be dropped. NULL ok. */
void manta_future_free(manta_future *f);

/* ---- Serving calls ---------------------------------------------------------- */

/* Answer a call (data copied once). Only the first answer counts. */
int manta_reply(manta_req *c, const void *data, size_t len);
int manta_reply_error(manta_req *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Keep the call after the method returns, to answer it later with
 * manta_reply*(); the answer frees it. Returns c. */
manta_req *manta_req_defer(manta_req *c);
const char *manta_req_method(const manta_req *c);
manta_ctx *manta_req_ctx(const manta_req *c);
/* Ask this actor to stop after the current call (clean exit, no restart). */
void manta_stop_self(manta_ctx *m);

/* ---- Event loop extensions ----------------------------------------------------- */

#define MANTA_POLLIN  1
#define MANTA_POLLOUT 2
typedef void (*manta_fd_fn)(void *arg, int fd, int revents);
typedef void (*manta_timer_fn)(void *arg);

/* Watch a file descriptor in the loop; events 0 removes the watch. */
int manta_watch_fd(manta_ctx *m, int fd, int events, manta_fd_fn fn, void *arg);
/* One-shot timer after `after_ms`; returns an id > 0, or 0 on failure. */
uint64_t manta_timer_add(manta_ctx *m, int64_t after_ms, manta_timer_fn fn, void *arg);
void manta_timer_cancel(manta_ctx *m, uint64_t id);

/* ---- Objects -------------------------------------------------------------------- */

/* A typed object id; crosses processes as text. */
typedef struct manta_obj_id {
    char s[40];
} manta_obj_id;

/* Store bytes as an object with one reference, held by the caller. Small
 * objects (<= 64 KiB) are kept inline in Redis; large ones stay in this
 * process's memory and are served to fetchers by its object thread, zero
 * copy. The object lives until its last reference is released, its owner
 * process ends, or the job ends. */
int manta_put(manta_ctx *m, const void *data, size_t len, manta_obj_id *id);
/* Fetch an object's bytes into a new malloc'd buffer (*data, caller frees). */
int manta_obj_get(manta_ctx *m, const manta_obj_id *id, void **data, size_t *len, int timeout_ms);
/* Fetch an object without copying it: the bytes are read in place from the
 * received frame. Returns a future (NULL only when out of memory) whose
 * manta_get() gives the object's bytes, valid until manta_future_free();
 * it resolves ENOTFOUND for an unknown or released object. */
manta_future *manta_obj_fetch(manta_ctx *m, const manta_obj_id *id, int timeout_ms);
/* Add or drop a reference. The last release frees the object everywhere. */
int manta_obj_ref(manta_ctx *m, const manta_obj_id *id);
int manta_obj_release(manta_ctx *m, const manta_obj_id *id);

/* ---- Job values ------------------------------------------------------------------- */

/* A small job-scoped registry of named values in Redis (manta:JOB:kv:KEY):
 * what a job publishes for others and for `manta status` to read, such as
 * a policy version and its ledger. Control plane: not for per-call data.
 * Values are bytes; `manta status` prints those that are text. Deleted with
 * the job. key: 1..100 of [A-Za-z0-9._-]. */
int manta_kv_set(manta_ctx *m, const char *key, const void *val, size_t len);
/* Read a value into a new malloc'd buffer (*val, NUL-terminated beyond
 * *len; the caller frees). ENOTFOUND when absent. */
int manta_kv_get(manta_ctx *m, const char *key, void **val, size_t *len);

/* ---- Log lines -------------------------------------------------------------------- *
 *
 * In an actor or a node agent (whose output goes to RUN_DIR/logs/NAME.log)
 * a line is one JSON object: {"time" (UTC, ms), "role", "actor" (its name),
 * "incarnation", "pid", "level", "msg"}; `manta logs ACTOR` pretty-prints
 * them. In the driver a line is plain text on stderr. Lines below the level
 * in MANTA_LOG_LEVEL (debug, info, warn, error; default info; `manta run
 * --log-level`) are dropped. The runtime's own warnings are lines at level
 * warn. Thread-safe (one write per line). */
typedef enum manta_log_level {
    MANTA_LOG_DEBUG,
    MANTA_LOG_INFO,
    MANTA_LOG_WARN,
    MANTA_LOG_ERROR
} manta_log_level;
void manta_log(manta_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "debug", "info", "warn", "error" -> *out; EINVAL naming the text otherwise. */
int manta_log_level_parse(const char *name, manta_log_level *out);

/* ---- Metrics ---------------------------------------------------------------------- *
 *
 * Every actor keeps counters, gauges and histograms and publishes them with
 * its heartbeat (once a second) to the registry, where `manta status` and
 * the head's Prometheus endpoint read them (manta_schema.h, "metrics"). The
 * runtime keeps its own: calls served and made, call failures by kind, the
 * latency of calls served (receipt to answer) and made (call to
 * resolution), the mailbox depth and backlog; a class adds its own here.
 * `name`: 1..48 of [a-z0-9_], not starting with a digit (counters end in
 * _total by convention, durations in _seconds); `kind`: NULL, or 1..48 of
 * [A-Za-z0-9_.:/-], exported as the label kind="..." (errors by kind, tools
 * by name). A name keeps the type it was first used with. A process holds
 * at most 256 series. Returns 0, MANTA_EINVAL (a bad name or kind, a type
 * mismatch, a negative counter step, a non-finite duration) or
 * MANTA_EBUSY (the table is full). Cheap: no I/O, no allocation after the
 * first use of a series. Threads: the ctx's thread only. */
#define MANTA_METRIC_NAME_MAX 48
/* counter += v (v >= 0) */
int manta_metric_add(manta_ctx *m, const char *name, const char *kind, double v);
/* gauge = v */
int manta_metric_set(manta_ctx *m, const char *name, const char *kind, double v);
/* histogram of durations in seconds (buckets 0.1 ms .. 60 s, then above) */
int manta_metric_observe(manta_ctx *m, const char *name, const char *kind, double seconds);

/* ---- Counters --------------------------------------------------------------------- */

typedef struct manta_stats {
    uint64_t calls_sent, casts_sent, replies_ok, replies_error;
    uint64_t timeouts, died, late_replies;
    uint64_t calls_served, casts_served;
    uint64_t bad_envelopes, bad_versions, unknown_methods, oversized, method_errors;
    /* connections to this process's sockets refused by CURVE: a client
     * without the job's keys, with another server key, or whose key is not
     * on the allow-list (each is logged with what is known of the peer) */
    uint64_t auth_refused;
} manta_stats;

void manta_stats_get(const manta_ctx *m, manta_stats *out);

/* Internal method every actor answers: its manta_stats as a msgpack map. */
#define MANTA_METHOD_STATS "__stats"

/* ---- Security: CURVE keys --------------------------------------------------------- *
 *
 * In a job with CURVE on (manta_options.curve) every socket that receives
 * from other processes is a CURVE server with the job's secret key, and
 * every socket that calls is a CURVE client that presents the job's key
 * pair. A ZAP handler in each process admits a connection only when the
 * client's public key is the job's own or one on the file's allow-list;
 * whatever a refused client sent never reaches a method. The keys travel
 * to actors and node agents as the path of their file (MANTA_KEYS in the
 * environment), never on a command line.
 *
 * The file is text: "public-key = Z85", "secret-key = Z85" and any number of
 * "allow = Z85" lines (40-character zmq_z85 keys), '#' comments. It must be
 * a regular file (not a link) owned by this user that no one else may read
 * (mode 0600 or stricter). */
#define MANTA_KEYS_MAX_ALLOW 64
#define MANTA_KEY_Z85_LEN    40

typedef struct manta_keys {
    char public_key[MANTA_KEY_Z85_LEN + 1]; /* Z85, NUL-terminated */
    char secret_key[MANTA_KEY_Z85_LEN + 1];
    size_t nallow; /* further client public keys admitted */
    char allow[MANTA_KEYS_MAX_ALLOW][MANTA_KEY_Z85_LEN + 1];
} manta_keys;

/* A fresh key pair (no allow-list). MANTA_EINVAL if libzmq has no CURVE. */
int manta_keys_generate(manta_keys *k);
/* Write keys to a new file of mode 0600 (created with O_EXCL, through no
 * link); `replace` 1 swaps an existing file atomically (rename). Returns 0,
 * or MANTA_ESYS/MANTA_EINVAL with the path in manta_last_error(). */
int manta_keys_write(const char *path, const manta_keys *k, int replace);
/* Read and check a key file (see above: owner, mode, no link, well-formed
 * keys, the public key matching the secret one). Returns 0, or
 * MANTA_ESYS/MANTA_EINVAL naming the path and line. */
int manta_keys_read(const char *path, manta_keys *k);
/* 1 if `z85` is a well-formed 40-character Z85 key, else 0. */
int manta_key_valid(const char *z85);

/* ---- Security: for libraries beside the core ----------------------------------------- *
 *
 * A library that opens ZeroMQ sockets of its own (the collectives' data
 * plane, in a ZeroMQ context of its own) protects them as the core does its
 * mailboxes. Not thread-safe with other uses of the same socket. */

/* 1 if this process's sockets use CURVE (the job's setting), else 0. */
int manta_curve_on(const manta_ctx *m);
/* Before binding `sock` (a socket of ZeroMQ context `zctx` that receives from
 * other processes): ZMQ_MAXMSGSIZE `max_frame` bytes per frame and a finite
 * ZMQ_RCVHWM (1000 messages a connection), so nothing larger is allocated;
 * with CURVE on, the job's secret key and a ZAP handler in `zctx` (bound at
 * the first call for that context, ending at its zmq_ctx_term) that admits
 * only the job's keys, counting refusals in manta_stats.auth_refused. `m`
 * must outlive `zctx`. Returns 0, or MANTA_EINVAL / MANTA_EZMQ / MANTA_ESYS
 * with a message. */
int manta_secure_server(manta_ctx *m, void *zctx, void *sock, int64_t max_frame);
/* Before connecting `sock` to such a server: with CURVE on, the job's key
 * pair and server key. Returns 0, or MANTA_EINVAL / MANTA_EZMQ. */
int manta_secure_client(manta_ctx *m, void *sock);
/* Make the private folder `path` (mode 0700), or use it when it exists only
 * if it is a real directory (not a link) owned by this user with mode 0700:
 * a folder another local user made first is refused, and left as it is.
 * `what` names it in the message ("run folder"). Returns 0, or MANTA_ESYS
 * naming the path and what is wrong. Thread-safe. */
int manta_private_dir(const char *path, const char *what);

#ifdef __cplusplus
}
#endif
#endif
