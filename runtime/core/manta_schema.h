/*
 * manta_schema.h -- the Redis schema of a job, and its one owner.
 *
 * Every key, field and state name Manta keeps in Redis is spelled in
 * schema.c and nowhere else; the runtime's libraries (core, job, cli,
 * collective) read and write the records through the typed functions here.
 * Users of the actor API never need this header; the libraries beside the
 * core do. The keys of job JOB:
 *
 *   manta:JOB:actors          set of actor names
 *   manta:JOB:actor:NAME      hash: the actor's directory record (manta_reg_actor)
 *   manta:JOB:nodes           set of node ids
 *   manta:JOB:node:ID         hash: a node agent's record (manta_reg_node)
 *   manta:JOB:obj:ID          hash: an object (size, refs, data | owner)
 *   manta:JOB:kv:KEY          string: a job value (manta_kv_set)
 *   manta:JOB:coll:NAME       hash: a collective group's rendezvous
 *   manta:JOB:driver          hash: the running job's driver (manta_reg_driver)
 *   manta:JOB:groups          list of group names, in spec order
 *   manta:JOB:group:NAME      hash: a group (class, wanted)
 *   manta:JOB:metrics:NAME    string: an actor's metrics record (text; metrics.c)
 *
 * runtime/README.md lists every field. All keys of a job start with
 * manta:JOB:, so the job's end deletes them with one SCAN.
 *
 * Errors: every function returns 0 or a negative MANTA_E* code with
 * manta_last_error() naming the key; a Redis error or a lost link is
 * MANTA_EREDIS, a missing record MANTA_ENOTFOUND. Every write's reply is
 * checked. Threads: as manta.h (the ctx's thread only).
 */
#ifndef MANTA_SCHEMA_H
#define MANTA_SCHEMA_H

#include "manta.h"

#include <stddef.h>
#include <stdint.h>

struct redisReply; /* hiredis */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- keys ------------------------------------------------------------------ */

typedef enum manta_reg_kind {
    MANTA_REG_ACTORS, /* no name */
    MANTA_REG_ACTOR,
    MANTA_REG_NODES, /* no name */
    MANTA_REG_NODE,
    MANTA_REG_OBJ,
    MANTA_REG_KV,
    MANTA_REG_COLL,
    MANTA_REG_DRIVER, /* no name */
    MANTA_REG_GROUPS, /* no name */
    MANTA_REG_GROUP,
    MANTA_REG_METRICS,
    MANTA_REG_SECURITY /* no name: the job's CURVE setting, written by its owner */
} manta_reg_kind;

/* Longest key this header's callers need to hold. */
#define MANTA_REG_KEY_MAX 256

/* Write the key of a record into out[n]. EINVAL if a name is needed and
 * missing, or the key does not fit. */
int manta_reg_key(const manta_ctx *m, manta_reg_kind kind, const char *name, char *out, size_t n);
/* The SCAN pattern of every key of a kind ("manta:JOB:kv:*"); its prefix
 * before '*' is what to strip from a found key to get the name. */
int manta_reg_pattern(const manta_ctx *m, manta_reg_kind kind, char *out, size_t n);

/* A list of names read from a set or list (actors, nodes, groups). */
typedef struct manta_reg_names {
    char **v;
    size_t n;
} manta_reg_names;
void manta_reg_names_free(manta_reg_names *l);

/* ---- actors ------------------------------------------------------------------- */

/* An actor's directory record. `info` is what manta_actor_info_get shows. */
typedef struct manta_reg_actor {
    manta_actor_info info;
    char cls[128];
    char library[512];
    int max_restarts;
    uint64_t calls;   /* calls served, stamped with each heartbeat */
    char error[1024]; /* writers keep it under 600 bytes */
    /* Placement (written by the job module): what the actor holds. */
    char group[64];
    double cpu;
    double gpu;
    uint64_t memory;
} manta_reg_actor;

int manta_reg_actor_read(manta_ctx *m, const char *name, manta_reg_actor *out);
/* The same from an HGETALL reply of the record at `key` read elsewhere (the
 * loop's asynchronous link). ENOTFOUND for an empty reply (no record). */
int manta_reg_actor_from_reply(const char *key, const struct redisReply *r, manta_reg_actor *out);
/* Claim a name for a new actor (HSETNX of its class): EEXIST if taken. */
int manta_reg_actor_claim(manta_ctx *m, const char *name, const char *cls);
/* Write a claimed actor's record (state starting, incarnation 1, restarts
 * 0, its node, endpoints, max_restarts, library) with its creation
 * arguments, and add it to the actor set. */
int manta_reg_actor_create(manta_ctx *m, const char *name, const manta_reg_actor *rec,
                           const void *args, size_t args_len);
/* The creation arguments, in a new malloc'd buffer (NULL, 0 when none). */
int manta_reg_actor_args(manta_ctx *m, const char *name, void **args, size_t *len);
/* Set the state, and the error text when error is non-NULL. */
int manta_reg_actor_set_state(manta_ctx *m, const char *name, manta_actor_state s,
                              const char *error);
/* Written by the actor process itself: its state, pid, heartbeat, and its
 * endpoint (when endpoint is non-NULL) or the error (when error is). */
int manta_reg_actor_report(manta_ctx *m, const char *name, manta_actor_state s, int pid,
                           const char *endpoint, const char *error);
/* A new incarnation about to start: state starting with its counters. */
int manta_reg_actor_incarnate(manta_ctx *m, const char *name, int incarnation, int restarts);
int manta_reg_actor_set_pid(manta_ctx *m, const char *name, int pid);
/* Stamp the heartbeat (wall clock now) and the served-call counter. */
int manta_reg_actor_heartbeat(manta_ctx *m, const char *name, uint64_t calls);
/* The same without waiting: sent on the loop's asynchronous Redis link, so a
 * slow or paused Redis never stalls the mailbox; a lost beat is not retried. */
void manta_reg_actor_heartbeat_async(manta_ctx *m, const char *name, uint64_t calls);
/* Record what the actor holds, for placement. */
int manta_reg_actor_set_placement(manta_ctx *m, const char *name, const char *group, double cpu,
                                  double gpu, uint64_t memory);
/* Mark an actor dead on a node that is gone, keeping it listed. */
int manta_reg_actor_mark_lost(manta_ctx *m, const char *name, const char *cls, const char *node,
                              const char *error);
/* Delete the record and leave the actor set. */
int manta_reg_actor_forget(manta_ctx *m, const char *name);
int manta_reg_actor_names(manta_ctx *m, manta_reg_names *out);

/* ---- nodes ---------------------------------------------------------------------- */

typedef struct manta_reg_node {
    manta_actor_state state; /* ALIVE, or DEAD once the watchdog gave up on it */
    char endpoint[192];
    char host[256];
    int pid;
    int64_t heartbeat_ms;
    double cpu; /* resources offered for placement */
    int gpu;
    uint64_t memory;
    char transport[8];
} manta_reg_node;

/* Join the node set, then write the record with state alive (in that order:
 * whoever waits for "alive" then finds the node when it places actors). */
int manta_reg_node_register(manta_ctx *m, const char *id, const manta_reg_node *rec);
int manta_reg_node_read(manta_ctx *m, const char *id, manta_reg_node *out);
int manta_reg_node_heartbeat(manta_ctx *m, const char *id);
int manta_reg_node_set_state(manta_ctx *m, const char *id, manta_actor_state s);
/* Leave the node set (the record stays until manta_reg_node_forget). */
int manta_reg_node_leave(manta_ctx *m, const char *id);
int manta_reg_node_forget(manta_ctx *m, const char *id);
int manta_reg_node_ids(manta_ctx *m, manta_reg_names *out);

/* Every node of the node set with its record, by id. */
typedef struct manta_reg_node_entry {
    char *id;
    manta_reg_node rec;
    int64_t age_ms; /* since its last heartbeat, by this host's wall clock; -1: none */
} manta_reg_node_entry;
typedef struct manta_reg_node_list {
    manta_reg_node_entry *v;
    size_t n;
} manta_reg_node_list;
/* A node in the set whose record is gone (being forgotten) is left out. */
int manta_reg_node_list_read(manta_ctx *m, manta_reg_node_list *out);
void manta_reg_node_list_free(manta_reg_node_list *l);
/* Milliseconds since a wall-clock stamp of a record (heartbeat, started),
 * by this host's clock. */
int64_t manta_reg_age_ms(int64_t stamp_ms);

/* ---- objects ----------------------------------------------------------------------- */

/* A new object record with one reference: its bytes inline, or its owner's
 * object endpoint (owner non-NULL) for one held in the owner's memory. */
int manta_reg_obj_create(manta_ctx *m, const char *id, size_t size, const void *data,
                         const char *owner);
/* Where an object is: *data (malloc'd, caller frees) for an inline one,
 * else owner[] set. ENOTFOUND if there is no such object. */
int manta_reg_obj_locate(manta_ctx *m, const char *id, void **data, size_t *len, char *owner,
                         size_t owner_len);
/* Add a reference to an existing object, atomically (one Lua script):
 * ENOTFOUND if it is gone. */
int manta_reg_obj_ref(manta_ctx *m, const char *id);
/* Drop a reference atomically; the release that takes the count to zero
 * deletes the record in the same step and gets *freed = 1 and the owner
 * endpoint ("" for an inline object). ENOTFOUND if it is gone. */
int manta_reg_obj_release(manta_ctx *m, const char *id, int *freed, char *owner, size_t owner_len);
/* The current reference count, or ENOTFOUND. */
int manta_reg_obj_refs(manta_ctx *m, const char *id, long long *refs);
int manta_reg_obj_delete(manta_ctx *m, const char *id);

/* ---- the job: driver and groups ------------------------------------------------------- */

typedef struct manta_reg_driver {
    int pid;
    char host[256];
    char spec[4096];  /* the spec file's path */
    char sets[16384]; /* the --set overrides, one per line */
    char run_dir[4096];
    int64_t started_ms; /* wall clock; 0 when writing: now */
} manta_reg_driver;

/* Claim the job for driver `pid` (HSETNX of the pid field), atomically: of
 * two drivers starting one job, one gets 0 and the other EEXIST with
 * *holder set to the pid recorded (0 if unreadable). The refused ctx then
 * counts as attached (manta_attached), so that its shutdown leaves the
 * running job alone. */
int manta_reg_driver_claim(manta_ctx *m, int pid, int *holder);
/* Write the driver record. ENOTFOUND from read when no job is running. */
int manta_reg_driver_write(manta_ctx *m, const manta_reg_driver *d);
int manta_reg_driver_read(manta_ctx *m, manta_reg_driver *out);
/* Delete the driver record and the group list (undoing a failed start). */
int manta_reg_driver_forget(manta_ctx *m);
/* Add a group (appended to the group list) with its class and wanted size. */
int manta_reg_group_add(manta_ctx *m, const char *name, const char *cls, int wanted);
int manta_reg_group_set_wanted(manta_ctx *m, const char *name, int wanted);
int manta_reg_group_read(manta_ctx *m, const char *name, char *cls, size_t cls_len, int *wanted);
/* In the order they were added. */
int manta_reg_group_names(manta_ctx *m, manta_reg_names *out);
int manta_reg_group_forget(manta_ctx *m, const char *name);

/* ---- job values ---------------------------------------------------------------------- */

/* The keys of every job value (manta_kv_set), in no particular order. */
int manta_reg_kv_names(manta_ctx *m, manta_reg_names *out);

/* ---- collective groups -------------------------------------------------------------- */

/* The rendezvous hash of collective group `name`: fields world (set by the
 * first member), r.RANK (a member's pid: present), ep.RANK (its endpoint),
 * nccl_id (rank 0's NCCL unique id), done (ranks finished; the last one
 * deletes the hash). */
#define MANTA_REG_COLL_WORLD "world"
#define MANTA_REG_COLL_DONE  "done"
#define MANTA_REG_COLL_RANK  "r."
#define MANTA_REG_COLL_EP    "ep."
#define MANTA_REG_COLL_NCCL  "nccl_id"

/* Join group `name` as `rank` of `world`: the first member sets world
 * (HSETNX), a member that disagrees gets EINVAL naming both sizes; then
 * r.RANK is set to this process's pid (present). */
int manta_reg_coll_join(manta_ctx *m, const char *name, int world, int rank);
/* Publish a field's bytes (ep.RANK, nccl_id). */
int manta_reg_coll_put(manta_ctx *m, const char *name, const char *field, const void *val,
                       size_t len);
/* Read a field of exactly len bytes: ENOTFOUND while not yet published,
 * EPROTO if it has another size. */
int manta_reg_coll_get(manta_ctx *m, const char *name, const char *field, void *out, size_t len);
/* Read a text field into out[cap]: ENOTFOUND while not yet published,
 * EPROTO if it does not fit. */
int manta_reg_coll_get_str(manta_ctx *m, const char *name, const char *field, char *out,
                           size_t cap);
/* Mark seen[k] = 1 for every rank k < world present (r.k); *present counts
 * the ranks marked so far (seen[] may carry marks from earlier calls). */
int manta_reg_coll_seen(manta_ctx *m, const char *name, int world, char *seen, int *present);
/* Leave: drop r.RANK and ep.RANK. finished=1: count into done, and the
 * world-th one out deletes the hash. finished=0 (a failed join): delete the
 * hash in one step if no rank is left waiting in it. */
int manta_reg_coll_leave(manta_ctx *m, const char *name, int rank, int world, int finished);

/* ---- metrics ------------------------------------------------------------------------ *
 *
 * An actor's metrics record (manta:JOB:metrics:NAME): every series of its
 * table (manta_metric_add ... in manta.h) and the runtime's own, written
 * whole with each heartbeat. Deleted with the actor's record
 * (manta_reg_actor_forget) and with the job. */

#define MANTA_METRIC_BUCKETS 18 /* histogram buckets: 17 bounds, then above the top */
/* Upper bounds of the histogram buckets, in seconds (0.1 ms .. 60 s). */
extern const double manta_metric_bounds[MANTA_METRIC_BUCKETS - 1];

typedef enum manta_metric_type {
    MANTA_METRIC_COUNTER,
    MANTA_METRIC_GAUGE,
    MANTA_METRIC_HISTOGRAM
} manta_metric_type;

/* One series: for a counter or a gauge `value`; for a histogram `value` is
 * the sum, `count` the observations and buckets[b] those in bucket b (not
 * cumulative; the last one: above the top bound). kind "" for none. */
typedef struct manta_metric {
    manta_metric_type type;
    char name[MANTA_METRIC_NAME_MAX + 1], kind[MANTA_METRIC_NAME_MAX + 1];
    double value;
    uint64_t count;
    uint64_t buckets[MANTA_METRIC_BUCKETS];
} manta_metric;

typedef struct manta_metrics {
    manta_metric *v;
    size_t n;
} manta_metrics;

/* This process's record as text (*out malloc'd, the caller frees): what its
 * heartbeat publishes. EINVAL, ENOMEM. */
int manta_metrics_record(manta_ctx *m, char **out, size_t *len);
/* Parse a record: 0, or EPROTO naming the line that is not a series,
 * ENOMEM. *out to free with manta_metrics_free. */
int manta_metrics_parse(const char *text, size_t len, manta_metrics *out);
void manta_metrics_free(manta_metrics *l); /* NULL and an empty list are fine */
/* The series (name, kind: NULL for none) of a list, or NULL. */
const manta_metric *manta_metrics_find(const manta_metrics *l, const char *name, const char *kind);
/* The upper bound of the bucket holding quantile q (0..1) of a histogram;
 * NAN when it has no observations, INFINITY when above the top bound. */
double manta_metric_quantile(const manta_metric *s, double q);

/* Write an actor's record on the loop's asynchronous link (a lost write is
 * replaced by the next heartbeat's). */
void manta_reg_metrics_publish_async(manta_ctx *m, const char *name, const char *text, size_t len);
/* Read and parse an actor's record: ENOTFOUND when it has published none
 * yet, EREDIS, EPROTO, ENOMEM. */
int manta_reg_metrics_read(manta_ctx *m, const char *name, manta_metrics *out);

#ifdef __cplusplus
}
#endif
#endif
