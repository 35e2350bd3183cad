/*
 * internal.h -- what the runtime's files share and users never see.
 *
 * Layering inside runtime/: util (errors, clock, id table) -> envelope (wire
 * format) -> loop (poll, timers, peers, futures, serving) -> registry (Redis)
 * -> objects, actor process, node agent -> context (manta_init).
 */
#ifndef MANTA_INTERNAL_H
#define MANTA_INTERNAL_H

#include "manta.h"
#include "manta_schema.h"

#include <hiredis/hiredis.h>
#include <msgpack.h>
#include <stdarg.h>
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
void mn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *mn_strdup(const char *s);
/* The environment of a child process: ours without MANTA_* variables
 * (except those starting with a prefix in keep, NULL-terminated), plus
 * vars. One allocation: free() it. NULL if out of memory. */
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

/* ---- loop.c: peers, futures, serving ---- */
typedef struct mn_peer mn_peer;
typedef struct mn_timer mn_timer;
typedef struct mn_watch mn_watch;
typedef struct mn_deferred mn_deferred;

struct manta_actor {
    manta_ctx *ctx;
    char *name; /* NULL for an object owner peer */
    mn_peer *peer;
    manta_actor *next;
};

struct mn_peer {
    manta_ctx *ctx;
    char *endpoint;
    void *sock; /* DEALER */
    void *mon;  /* PAIR on the socket monitor */
    size_t pending;
    int incarnation;    /* last known, from the directory */
    bool suspect;       /* disconnected: check the directory before trusting */
    bool dead;          /* directory says dead for good */
    bool reconnected;   /* the socket connected again after a disconnect */
    bool connected;     /* zmq_connect done (lazily: see mn_peer_connect) */
    int64_t next_check; /* when to look at the directory again */
    manta_actor *owner; /* the handle, for named actors */
    mn_peer *next;
};

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
};

struct manta_req {
    manta_ctx *ctx;
    zmq_msg_t route;
    uint64_t id;
    char method[128];
    bool answered, deferred, is_cast, returned;
};

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
    char job[64];
    char self[128];
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
    mn_watch *watches;
    zmq_pollitem_t *items;
    size_t nitems, items_cap;
    bool items_dirty;
    int64_t next_heartbeat;

    /* objects */
    struct mn_objstore *objs;

    /* driver */
    bool attached;
    pid_t node_pid;
    char node_endpoint[192];
    manta_actor *node_handle;

    manta_stats stats;
};

int mn_loop_once(manta_ctx *m, int timeout_ms);
mn_peer *mn_peer_get(manta_ctx *m, const char *endpoint);
int mn_peer_connect(mn_peer *p);
manta_future *mn_call_peer(manta_ctx *m, mn_peer *p, const char *method, const void *arg,
                           size_t len, int timeout_ms, zmq_msg_t *frame);
int mn_mailbox_bind(manta_ctx *m, const char *endpoint);
void mn_loop_free(manta_ctx *m);
void mn_fail_peer_calls(manta_ctx *m, mn_peer *p, int code, const char *why);
int mn_stats_pack(const manta_stats *s, msgpack_sbuffer *out);

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
/* Older spelling of manta_reg_key (kind as text); new code uses manta_schema.h. */
void mn_key(const manta_ctx *m, char *out, size_t n, const char *kind, const char *name);
int mn_redis_hget_str(manta_ctx *m, const char *key, const char *field, char *out, size_t n);
/* An actor's manta_actor_info (manta_reg_actor_read's info). */
int mn_directory_read(manta_ctx *m, const char *name, manta_actor_info *info);
/* This machine (and mount namespace): hostname, boot id and /tmp's inode. */
const char *mn_host_id(void);
/* The endpoint a caller here should use: the local ipc one when the actor
 * is on this machine and has one, else its shared one. */
const char *mn_pick_endpoint(const manta_actor_info *info);
int mn_delete_job_keys(manta_ctx *m); /* schema.c */
/* Remove a folder and the files in it (one level: sockets, logs). */
void mn_remove_dir(const char *dir);

/* ---- objects.c ---- */
void mn_objstore_free(manta_ctx *m);

/* ---- actor.c / node.c ---- */
const manta_class *mn_find_class(manta_ctx *m, const char *name, const char *library);
int mn_actor_main(manta_ctx *m); /* never returns */
int mn_node_main(manta_ctx *m);  /* never returns */
int mn_node_spawn_local(manta_ctx *m);

#endif
