/*
 * internal.h -- what the runtime's files share and users never see.
 *
 * Layering inside runtime/core: util (errors, clock, id table) -> envelope
 * (wire format) -> loop (poll set, timers, watches) -> redis_async, peer,
 * call, serve (what runs on the loop) -> registry (Redis) -> objects, actor
 * process, node agent -> context (manta_init).
 */
#ifndef MANTA_INTERNAL_H
#define MANTA_INTERNAL_H

#include "manta.h"
#include "manta_schema.h"

#include <hiredis/hiredis.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <zmq.h>

/* Payloads up to this size travel inside the msgpack envelope; larger ones
 * as their own frame, so they are never copied into msgpack. */
#define MN_INLINE_MAX 8192
/* Objects up to this size live inline in Redis. */
#define MN_OBJ_INLINE_MAX 65536
/* Nested dispatch depth: a method waiting on a future serves other callers;
 * past this depth new calls wait in the deferred queue instead. */
#define MN_MAX_DEPTH 32

/* ---- util.c ---- */
int mn_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t mn_now_ms(void);  /* monotonic */
int64_t mn_wall_ms(void); /* wall clock */
void mn_random_hex(char *out, size_t nhex);
/* The runtime's own warnings: a log line at level warn (log.c). */
void mn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One log line (log.c): JSON in actors and node agents, text in the driver. */
void mn_log_line(manta_log_level level, const char *msg);
/* End this process (an actor, a node agent, a forked helper) without running
 * atexit handlers: flush stdio, and in a sanitizer build first run
 * LeakSanitizer's check (which _exit skips) when code is 0; leaks found make
 * the exit code MN_EXIT_LEAKED and the report goes where ASAN_OPTIONS sends
 * it. */
#define MN_EXIT_LEAKED 23
_Noreturn void mn_exit(int code);
char *mn_strdup(const char *s);
/* The environment of a child process: ours without MANTA_* variables
 * (except those starting with a prefix in keep, NULL-terminated), plus
 * vars, whose values replace inherited ones of the same name. One
 * allocation: free() it. NULL if out of memory. */
typedef struct mn_var {
    const char *name, *value;
} mn_var;
char **mn_child_env(const char *const *keep, const mn_var *vars, size_t nvars);
/* This program's path (/proc/self/exe) into out[n]; EINVAL if too long. */
int mn_self_exe(char *out, size_t n);

/* An open-addressing map from uint64 keys to pointers (key 0 is reserved). */
typedef struct mn_idmap {
    uint64_t *keys;
    void **vals;
    size_t cap, len, used; /* used counts tombstones too */
} mn_idmap;
int mn_idmap_put(mn_idmap *t, uint64_t key, void *val);
void *mn_idmap_get(const mn_idmap *t, uint64_t key);
void *mn_idmap_del(mn_idmap *t, uint64_t key);
void mn_idmap_free(mn_idmap *t);

/* ---- envelope.c: the wire format ---- */
enum { MN_CALL = 1, MN_REPLY = 2, MN_ERROR = 3, MN_CAST = 4 };

/* A decoded envelope. For calls and casts `method` is set; for replies and
 * errors `status` is. Strings and the inline payload point into the frame. */
typedef struct mn_env {
    uint32_t version;
    int kind;
    uint64_t id;
    const char *method;
    size_t method_len;
    int status;
    const void *payload;
    size_t payload_len;
    int nframes; /* extra frames that follow (0 or 1) */
} mn_env;

/* Encode and send an envelope on `sock`, prefixed by `route` (a ROUTER peer
 * id) when route_len > 0. Small payloads are inlined; large ones go as one
 * extra frame. If `frame` is non-NULL it is sent as the payload frame
 * without a copy (ownership passes on success). */
int mn_env_send(void *sock, const void *route, size_t route_len, int kind, uint64_t id,
                const char *method, int status, const void *payload, size_t len, zmq_msg_t *frame);
/* Free this thread's envelope buffer (a thread that sent calls ends). */
void mn_env_thread_done(void);
/* Decode a frame. Returns 0 or EPROTO with a message naming the field. */
int mn_env_decode(const void *buf, size_t len, mn_env *e, char *err, size_t errlen);

/* A bounds-checked msgpack reader for untrusted bytes (system methods'
 * arguments): it points into the buffer and never allocates, so no count
 * announced in the bytes can make it reserve memory. Each read returns 0,
 * or -1 when the bytes end or the next value has another type. */
typedef struct mn_mp {
    const unsigned char *p, *end;
} mn_mp;
#define MN_MP_MAX_DEPTH 16
void mn_mp_init(mn_mp *c, const void *buf, size_t len);
/* A map header; refused when its 2*n entries cannot fit the bytes left. */
int mn_mp_map(mn_mp *c, uint32_t *n);
int mn_mp_str(mn_mp *c, const char **s, size_t *len);
int mn_mp_bin(mn_mp *c, const void **data, size_t *len);
int mn_mp_int(mn_mp *c, int64_t *v);
int mn_mp_num(mn_mp *c, double *v); /* an integer or a float, as a double */
int mn_mp_nil(mn_mp *c);            /* consumes a nil; -1 (and nothing read) if none */
/* Skip one value of any type, nested at most MN_MP_MAX_DEPTH deep. */
int mn_mp_skip(mn_mp *c);

/* Limits set on every socket that receives from other processes, so that
 * ZeroMQ refuses what is too large before it allocates (ZMQ_MAXMSGSIZE: a
 * frame over it closes the connection as soon as its header is read) and no
 * receive queue grows without bound (ZMQ_RCVHWM, per connection: a full
 * queue stops reading that connection, so the sender waits; nothing is
 * dropped). A frame up to twice max_message still gets the polite EMSGSIZE
 * answer from the mailbox. Send queues stay unbounded: every send is
 * non-blocking, and replies and casts must not be lost (back-pressure on
 * calls is max_pending). */
#define MN_RCVHWM          1000
#define MN_OBJ_REQUEST_MAX (64 * 1024) /* an object server's requests: an id */
/* Set ZMQ_MAXMSGSIZE (max_frame bytes) and ZMQ_RCVHWM on `sock`. */
int mn_limit_socket(void *sock, int64_t max_frame);
/* The ZMQ_MAXMSGSIZE of a process's mailbox and call sockets. */
int64_t mn_max_frame(const manta_ctx *m);

/* ---- auth.c: CURVE on every socket, a ZAP handler, key files ---- */
/* Decide whether this process uses CURVE (manta_options.curve, MANTA_CURVE)
 * and find its keys (MANTA_KEYS, manta_options.keys_file, else a new pair
 * in RUN_DIR/curve.key for a driver that owns its job). Call once the run
 * folder exists and Redis is connected: a member (not the owner) reads the
 * job's security record there. Returns 0 or a code with a message naming
 * the cause. */
int mn_auth_setup(manta_ctx *m, const manta_options *opts);
/* The job's owner, once Redis is up: write the job's security record. */
int mn_auth_publish(manta_ctx *m);
/* Make `sock` a CURVE server with the job's key, checked by this process's
 * ZAP handler (started on first use); a no-op when CURVE is off. Call
 * before zmq_bind. Thread-safe (the object server's thread calls it). */
int mn_auth_server(manta_ctx *m, void *sock);
/* Make `sock` a CURVE client presenting the job's key pair; a no-op when
 * CURVE is off. Call before zmq_connect. */
int mn_auth_client(manta_ctx *m, void *sock);
/* Count a refused connection and log it (the first ten, then one in a
 * hundred, so a flood cannot fill the log). Thread-safe. */
void mn_auth_refused(manta_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- loop.c: the event loop (poll set, timers, fd watches, hooks) ---- */
typedef struct mn_io mn_io;
typedef struct mn_timer mn_timer;
typedef struct mn_loop_hook mn_loop_hook;
/* Serve an I/O source that polled ready; returns how many events it
 * handled (messages, replies, ...), for manta_poll_once's count. */
typedef int (*mn_io_fn)(manta_ctx *m, void *arg, int revents);

/* A layer above the loop (calls, serving, async Redis) plugs in with one
 * const table, the way Redis's networking plugs into ae.c: the loop knows
 * no layer by name. */
struct mn_loop_hook {
    /* The earliest time (mn_now_ms) this layer needs a turn, or INT64_MAX. */
    int64_t (*due)(manta_ctx *m);
    /* After each turn's I/O and timers: returns how many events it handled. */
    int (*run)(manta_ctx *m);
    /* At mn_loop_free: release what the layer holds. */
    void (*fini)(manta_ctx *m);
};
#define MN_LOOP_MAX_HOOKS 8

/* Add a ZeroMQ socket (sock) or a file descriptor (sock NULL, fd) to the
 * poll set. events: ZMQ_POLLIN | ZMQ_POLLOUT; 0 keeps it registered but not
 * polled. NULL when out of memory. The entry stays valid until mn_io_del. */
mn_io *mn_io_add(manta_ctx *m, void *sock, int fd, short events, mn_io_fn fn, void *arg);
void mn_io_events(manta_ctx *m, mn_io *io, short events);
/* Remove an entry; safe from inside its own callback and nested turns. */
void mn_io_del(manta_ctx *m, mn_io *io);
/* Register a layer once (again: no-op). MANTA_ENOMEM past the table's size. */
int mn_loop_hook_add(manta_ctx *m, const mn_loop_hook *h);
/* One turn: wait up to timeout_ms (-1: until something is due) for I/O,
 * serve what is ready, run due timers and the hooks. Returns the number of
 * events handled (>= 0) or a negative MANTA_E* code. Reentrant: a callback
 * may turn the loop again (nested dispatch). */
int mn_loop_once(manta_ctx *m, int timeout_ms);
/* Run every hook's fini, then free the poll set, timers and watches. */
void mn_loop_free(manta_ctx *m);

/* ---- redis_async.c: non-blocking Redis on the loop ---- */
/* A reply handler: r is the reply (NULL when the link failed or a command
 * ran past MN_AREDIS_TIMEOUT_MS; manta_last_error() says why); the reply is
 * freed after it returns. A handler must not turn the loop. */
typedef void (*mn_aredis_fn)(manta_ctx *m, redisReply *r, void *arg);
#define MN_AREDIS_TIMEOUT_MS 5000
/* Queue a command on the process's second, non-blocking Redis link
 * (connected and authenticated on first use). fn may be NULL: an error
 * reply is then logged. Returns 0, or a code when the command could not be
 * queued (fn is not called then). */
int mn_aredis_command(manta_ctx *m, mn_aredis_fn fn, void *arg, const char *fmt, ...);

/* ---- peer.c: DEALER sockets to other processes, their death and return ---- */
typedef struct mn_peer mn_peer;
typedef struct mn_held mn_held;

struct manta_actor {
    manta_ctx *ctx;
    char *name; /* NULL for an object owner peer */
    mn_peer *peer;
    manta_actor *next;
};

struct mn_peer {
    manta_ctx *ctx;
    char *endpoint;
    void *sock;         /* DEALER */
    void *mon;          /* PAIR on the socket monitor */
    mn_io *io, *io_mon; /* in the poll set while calls are pending */
    size_t pending;
    int incarnation;                /* last known, from the directory */
    bool suspect;                   /* disconnected: check the directory before trusting */
    bool dead;                      /* directory says dead for good */
    bool reconnected;               /* the socket connected (again) since its last zmq_connect */
    bool connected;                 /* zmq_connect done (lazily: see mn_peer_connect) */
    int64_t connect_ms;             /* when zmq_connect was last called */
    bool looking;                   /* a directory lookup is in flight */
    bool handshake_failed;          /* the last connection closed during its handshake */
    int64_t next_check;             /* when to look at the directory again */
    mn_held *held_head, *held_tail; /* sends waiting for the lookup */
    manta_actor *owner;             /* the handle, for named actors */
    mn_peer *next;
};

mn_peer *mn_peer_get(manta_ctx *m, const char *endpoint);
int mn_peer_connect(mn_peer *p);
/* A call was made (pending 0 -> 1) or resolved (1 -> 0): poll it or not. */
void mn_peer_busy(manta_ctx *m, mn_peer *p, bool busy);
/* May a message go to this peer now? */
enum { MN_SEND, MN_HOLD, MN_DEAD };
int mn_peer_admit(manta_ctx *m, mn_peer *p);
/* Keep a message until the peer's directory lookup answers (MN_HOLD): it
 * is then sent in order, or dropped if the actor is dead (a call's future
 * then resolves EDIED). frame's ownership passes on success. */
int mn_peer_hold(manta_ctx *m, mn_peer *p, int kind, uint64_t id, const char *method,
                 const void *arg, size_t len, zmq_msg_t *frame);
/* Read a peer's monitor (deaths, reconnects); returns the events read. */
int mn_peer_recv_monitor(manta_ctx *m, mn_peer *p);
/* Suspect peers with calls pending: the next lookup due, and start them. */
int64_t mn_peers_due(manta_ctx *m);
int mn_peers_check(manta_ctx *m);
void mn_peers_free(manta_ctx *m);

/* ---- call.c: calls and futures ---- */
struct manta_future {
    manta_ctx *ctx;
    mn_peer *peer;
    uint64_t id;
    int64_t deadline;
    int status; /* EPENDING until resolved */
    zmq_msg_t env_msg, frame_msg;
    bool have_env, have_frame;
    const void *data;
    size_t len;
    char *error;
    void *owned; /* bytes the future holds itself (an inline object) */
    double t0;   /* made (mn_metrics_clock), for the call latency */
};

manta_future *mn_call_peer(manta_ctx *m, mn_peer *p, const char *method, const void *arg,
                           size_t len, int timeout_ms, zmq_msg_t *frame);
void mn_fail_peer_calls(manta_ctx *m, mn_peer *p, int code, const char *why);
/* The pending future of call `id` to `p`, or NULL (resolved, freed, other). */
manta_future *mn_call_find(manta_ctx *m, mn_peer *p, uint64_t id);
void mn_call_resolve(manta_ctx *m, manta_future *f, int status, const char *error);
/* Receive replies on a peer's socket; returns how many. */
int mn_recv_replies(manta_ctx *m, mn_peer *p);

/* ---- serve.c: the mailbox ---- */
typedef struct mn_deferred mn_deferred;

struct manta_req {
    manta_ctx *ctx;
    zmq_msg_t route;
    uint64_t id;
    char method[128];
    bool answered, deferred, is_cast, returned;
    double t0; /* received (mn_metrics_clock), for the served-call latency */
};

int mn_mailbox_bind(manta_ctx *m, const char *endpoint);
int mn_stats_pack(const manta_stats *s, msgpack_sbuffer *out);

typedef struct mn_heap_item {
    int64_t deadline;
    uint64_t id;
} mn_heap_item;

typedef enum { MN_ROLE_DRIVER, MN_ROLE_ACTOR, MN_ROLE_NODE } mn_role;

struct manta_ctx {
    mn_role role;
    void *zmq;
    redisContext *redis;
    manta_redis_addr redis_addr; /* where Redis is (parsed once) */
    char *redis_url;             /* the same as a URL, password included: for children */
    pid_t redis_pid;             /* embedded server, driver only */
    char *redis_dir;
    int redis_restarts;       /* of the embedded server, after it died */
    int redis_backoff_ms;     /* the blocking link: wait before the next connect */
    int64_t redis_retry_at;   /* no connect attempt before (monotonic ms); 0: now */
    int64_t redis_down_since; /* first failed connect of a streak; 0: linked */
    char job[64];
    char self[128];
    char *libraries; /* driver: the node agents' library allow-list, ':'-separated */
    char node[64];
    char rundir[160]; /* /tmp/manta-JOB: ipc sockets */
    char *transport, *host, *log_dir;
    size_t max_pending, max_message;
    int call_timeout_ms;
    const manta_class *const *classes;

    /* caller side */
    mn_idmap calls; /* id -> future */
    uint64_t next_id;
    size_t pending;
    mn_heap_item *heap;
    size_t heap_len, heap_cap;
    mn_peer *peers;
    manta_actor *actors;
    int npeers;

    /* serving side (actors and node agents) */
    void *mailbox; /* ROUTER */
    char endpoint[192];
    const manta_class *cls;
    void *state;
    int depth;
    int active_routes[MN_MAX_DEPTH + 1];
    zmq_msg_t active_msgs[MN_MAX_DEPTH + 1];
    mn_deferred *deferred_head, *deferred_tail;
    bool stopping;
    int (*system_method)(manta_ctx *m, manta_req *c, const mn_env *e, const void *arg,
                         size_t len); /* node agent's and internal methods */

    /* loop */
    mn_timer *timers;
    uint64_t next_timer;
    mn_io *io_head, *io_tail, *io_removed;
    size_t nio;
    zmq_pollitem_t *items;
    size_t nitems, items_cap;
    bool items_dirty;
    int loop_depth; /* nested turns: removed entries are freed at depth 0 */
    const mn_loop_hook *hooks[MN_LOOP_MAX_HOOKS];
    int nhooks;
    int nsuspect; /* peers that are suspect */
    struct mn_aredis *aredis;
    int64_t next_heartbeat;

    /* objects */
    struct mn_objstore *objs;

    /* driver */
    bool attached;
    pid_t node_pid;
    char node_endpoint[192];
    manta_actor *node_handle;

    manta_stats stats;

    /* auth.c */
    bool curve;           /* CURVE on this process's sockets */
    manta_keys keys;      /* the job's pair and allow-list */
    char keys_path[4096]; /* their file: handed to children as MANTA_KEYS */
    unsigned char allow_bin[MANTA_KEYS_MAX_ALLOW + 1][32]; /* admitted client keys */
    size_t nallow_bin;
    bool zap_started;
    _Atomic uint64_t auth_refused; /* counted by any thread; copied to stats */
    void *mb_mon;                  /* PAIR on the mailbox's monitor (handshake failures) */
    mn_io *mb_mon_io;
    struct mn_metrics *metrics; /* metrics.c: NULL until a series is used */
};

/* ---- registry.c: the link to Redis (schema.c: the records) ---- */
/* Take a parsed address as this ctx's Redis (its URL too). */
int mn_redis_set_addr(manta_ctx *m, const manta_redis_addr *a);
int mn_redis_connect(manta_ctx *m);
int mn_redis_start_embedded(manta_ctx *m);
void mn_redis_stop_embedded(manta_ctx *m);
/* Run a command; returns the reply (caller frees) or NULL with mn_fail set. */
redisReply *mn_redis(manta_ctx *m, const char *fmt, ...);
redisReply *mn_redis_v(manta_ctx *m, const char *fmt, va_list ap);
redisReply *mn_redis_argv(manta_ctx *m, int argc, const char **argv, const size_t *lens);
/* An actor's manta_actor_info (manta_reg_actor_read's info). */
int mn_directory_read(manta_ctx *m, const char *name, manta_actor_info *info);
/* This machine (and mount namespace): hostname, boot id and /tmp's inode. */
const char *mn_host_id(void);
/* The endpoint a caller here should use: the local ipc one when the actor
 * is on this machine and has one, else its shared one. */
const char *mn_pick_endpoint(const manta_actor_info *info);
int mn_delete_job_keys(manta_ctx *m); /* schema.c */
/* The job's security record (schema.c): the owner writes whether CURVE is on
 * and the job's public key (or ""); members read it. Read: ENOTFOUND when
 * there is none, EPROTO when malformed. */
int mn_reg_security_write(manta_ctx *m, int curve, const char *public_key);
int mn_reg_security_read(manta_ctx *m, int *curve, char *public_key, size_t cap);
/* Remove a folder and the files in it (one level: sockets, logs). */
void mn_remove_dir(const char *dir);
/* Create a folder only this user can use (mode 0700), or accept one that
 * exists only if it is a real directory (not a link) owned by this user with
 * mode 0700. Returns 0, or MANTA_ESYS with an error naming `what` and the
 * path. */
int mn_private_dir(const char *path, const char *what);
/* 1 if `s` is 1..max characters of [A-Za-z0-9._-] (job and actor names:
 * they become file names, keys and routing ids), else 0. */
int mn_valid_name(const char *s, size_t max);

/* node.c: the most GPUs one agent gives out (and one actor asks for) */
#define MN_MAX_GPUS 64

/* ---- metrics.c: this process's series (manta_metric_*) ---- */
typedef struct mn_metrics mn_metrics;
double mn_metrics_clock(void);                   /* monotonic seconds, sub-microsecond */
void mn_metrics_served(manta_ctx *m, double t0); /* a call received at t0 was answered */
void mn_metrics_made(manta_ctx *m, double t0);   /* a call made at t0 resolved */
void mn_metrics_backlog(manta_ctx *m, int n);    /* n messages were waiting at a wake-up */
void mn_metrics_publish(manta_ctx *m);           /* the record, asynchronously (heartbeat) */
void mn_metrics_free(manta_ctx *m);
/* serve.c: calls waiting in the deferred queue. */
size_t mn_deferred_count(const manta_ctx *m);

/* ---- objects.c ---- */
void mn_objstore_free(manta_ctx *m);

/* ---- actor.c / node.c ---- */
const manta_class *mn_find_class(manta_ctx *m, const char *name, const char *library);
int mn_actor_main(manta_ctx *m); /* never returns */
int mn_node_main(manta_ctx *m);  /* never returns */
int mn_node_spawn_local(manta_ctx *m);
/* The driver's library allow-list (manta_options.libraries, then
 * MANTA_LIBRARIES) as one ':'-separated string in m->libraries, handed to
 * node agents it starts. EINVAL for a path with ':' in it. */
int mn_node_libraries_set(manta_ctx *m, const manta_options *opts);
/* The node agent's reading of a `spawn` request's payload, on its own (for
 * the fuzz harness): 0, or EPROTO/EINVAL with the reason in err. */
int mn_node_parse_spawn(const void *arg, size_t len, char *err, size_t errlen);

#endif
