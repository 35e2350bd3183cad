/*
 * schema.c -- every key, field and state name Manta keeps in Redis.
 *
 * The records of a job (manta_schema.h lists the keys, runtime/README.md
 * every field) are read and written only here, through typed functions, so
 * a field's spelling, its type and its writers are in one place. Commands
 * pass values with explicit lengths (redisCommandArgv or %b) and every
 * reply, of reads and writes alike, is checked. The reference count of an
 * object changes in one Lua script, so that two processes that ref and
 * release at once never lose a count or free an object twice.
 */
#include "internal.h"
#include "manta_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- names ---------------------------------------------------------------- */

static const char *const STATE_NAMES[] = {
    [MANTA_ACTOR_UNKNOWN] = "unknown", [MANTA_ACTOR_STARTING] = "starting",
    [MANTA_ACTOR_ALIVE] = "alive",     [MANTA_ACTOR_RESTARTING] = "restarting",
    [MANTA_ACTOR_DEAD] = "dead",       [MANTA_ACTOR_FAILED] = "failed",
    [MANTA_ACTOR_STOPPED] = "stopped",
};
#define NSTATES (sizeof STATE_NAMES / sizeof STATE_NAMES[0])

const char *manta_actor_state_name(manta_actor_state s)
{
    return (unsigned)s < NSTATES ? STATE_NAMES[s] : "unknown";
}

manta_actor_state manta_actor_state_parse(const char *name)
{
    for (size_t i = 1; name && i < NSTATES; i++)
        if (!strcmp(name, STATE_NAMES[i])) return (manta_actor_state)i;
    return MANTA_ACTOR_UNKNOWN;
}

static const char *const KIND_NAMES[] = {
    [MANTA_REG_ACTORS] = "actors",   [MANTA_REG_ACTOR] = "actor",
    [MANTA_REG_NODES] = "nodes",     [MANTA_REG_NODE] = "node",
    [MANTA_REG_OBJ] = "obj",         [MANTA_REG_KV] = "kv",
    [MANTA_REG_COLL] = "coll",       [MANTA_REG_DRIVER] = "driver",
    [MANTA_REG_GROUPS] = "groups",   [MANTA_REG_GROUP] = "group",
    [MANTA_REG_METRICS] = "metrics", [MANTA_REG_SECURITY] = "security",
};

static int named_kind(manta_reg_kind k)
{
    return k != MANTA_REG_ACTORS && k != MANTA_REG_NODES && k != MANTA_REG_DRIVER &&
           k != MANTA_REG_GROUPS && k != MANTA_REG_SECURITY;
}

int manta_reg_key(const manta_ctx *m, manta_reg_kind kind, const char *name, char *out, size_t n)
{
    if ((unsigned)kind >= sizeof KIND_NAMES / sizeof KIND_NAMES[0] || !out || !n)
        return mn_fail(MANTA_EINVAL, "registry key: bad kind %d", (int)kind);
    int len;
    if (named_kind(kind)) {
        if (!name || !*name)
            return mn_fail(MANTA_EINVAL, "registry key of a %s: no name", KIND_NAMES[kind]);
        len = snprintf(out, n, "manta:%s:%s:%s", m->job, KIND_NAMES[kind], name);
    } else {
        len = snprintf(out, n, "manta:%s:%s", m->job, KIND_NAMES[kind]);
    }
    if (len < 0 || (size_t)len >= n)
        return mn_fail(MANTA_EINVAL, "registry key of %s '%s' in job %s: longer than %zu bytes",
                       KIND_NAMES[kind], name ? name : "", m->job, n - 1);
    return 0;
}

int manta_reg_pattern(const manta_ctx *m, manta_reg_kind kind, char *out, size_t n)
{
    return manta_reg_key(m, kind, "*", out, n);
}

/* Keys of every kind, for mn_delete_job_keys. */
static void job_pattern(const manta_ctx *m, char *out, size_t n)
{
    snprintf(out, n, "manta:%s:*", m->job);
}

/* Actor record fields. */
#define F_CLASS          "class"
#define F_NODE           "node"
#define F_ENDPOINT       "endpoint"
#define F_ENDPOINT_LOCAL "endpoint_local"
#define F_HOST           "host"
#define F_PID            "pid"
#define F_INCARNATION    "incarnation"
#define F_RESTARTS       "restarts"
#define F_MAX_RESTARTS   "max_restarts"
#define F_STATE          "state"
#define F_HB             "hb"
#define F_CALLS          "calls"
#define F_ERROR          "error"
#define F_LIBRARY        "library"
#define F_ARGS           "args"
#define F_GROUP          "group"
#define F_CPU            "cpu"
#define F_GPU            "gpu"
#define F_MEMORY         "memory"
/* Node record fields beyond those. */
#define F_TRANSPORT "transport"
/* Object record fields. */
#define F_SIZE  "size"
#define F_REFS  "refs"
#define F_DATA  "data"
#define F_OWNER "owner"
/* Driver and group record fields. */
#define F_SPEC    "spec"
#define F_SETS    "sets"
#define F_RUN_DIR "run_dir"
#define F_STARTED "started"
#define F_WANTED  "wanted"
/* the job's security record */
#define F_CURVE      "curve"
#define F_PUBLIC_KEY "public_key"

/* ---- commands ---------------------------------------------------------------- */

/* Run a command whose reply only tells success; name the key on failure. */
static int run(manta_ctx *m, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = mn_redis_v(m, fmt, ap);
    va_end(ap);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    freeReplyObject(r);
    return 0;
}

/* An argv command built up field by field (HSET key f v f v ...). */
typedef struct cmd {
    const char *argv[48];
    size_t lens[48];
    char nums[16][32];
    int argc, nnum;
} cmd;

/* The records have fixed field lists well inside these bounds: running
 * past one is a bug in this file, stopped loudly. */
static void cmd_full(const char *what)
{
    mn_log("schema.c: a command's %s table is full: make cmd larger", what);
    abort();
}

static void arg(cmd *c, const void *v, size_t len)
{
    if (c->argc >= (int)(sizeof c->argv / sizeof c->argv[0])) cmd_full("argument");
    c->argv[c->argc] = v;
    c->lens[c->argc++] = len;
}

static void arg_str(cmd *c, const char *s)
{
    arg(c, s, strlen(s));
}

static void field_str(cmd *c, const char *f, const char *v)
{
    arg_str(c, f);
    arg_str(c, v);
}

static void field_num(cmd *c, const char *f, const char *fmt, ...)
{
    if (c->nnum >= (int)(sizeof c->nums / sizeof c->nums[0])) cmd_full("number");
    char *buf = c->nums[c->nnum++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, 32, fmt, ap);
    va_end(ap);
    field_str(c, f, buf);
}

static int cmd_run(manta_ctx *m, cmd *c)
{
    redisReply *r = mn_redis_argv(m, c->argc, c->argv, c->lens);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", c->argv[1], manta_last_error());
    freeReplyObject(r);
    return 0;
}

/* Copy a field's value into dst[cap]; a value that does not fit is an error
 * naming the field, never silently cut. */
static int put(char *dst, size_t cap, const char *key, const redisReply *k, const redisReply *v)
{
    if (v->len >= cap)
        return mn_fail(MANTA_EPROTO, "%s: field %s has %zu bytes, more than the %zu it may hold",
                       key, k->str, (size_t)v->len, cap - 1);
    memcpy(dst, v->str, v->len);
    dst[v->len] = 0;
    return 0;
}

/* HGETALL a record: ENOTFOUND if there is none; *out to free. */
static int hgetall(manta_ctx *m, const char *key, redisReply **out)
{
    redisReply *r = mn_redis(m, "HGETALL %s", key);
    *out = NULL;
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        freeReplyObject(r);
        return MANTA_ENOTFOUND;
    }
    *out = r;
    return 0;
}

static int read_names(manta_ctx *m, const char *key, const char *verb, manta_reg_names *out)
{
    out->v = NULL, out->n = 0;
    redisReply *r = !strcmp(verb, "LRANGE") ? mn_redis(m, "LRANGE %s 0 -1", key)
                                            : mn_redis(m, "SMEMBERS %s", key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type != REDIS_REPLY_ARRAY) {
        rc = mn_fail(MANTA_EREDIS, "%s: not a set or list", key);
    } else if (r->elements && !(out->v = calloc(r->elements, sizeof *out->v))) {
        rc = mn_fail(MANTA_ENOMEM, "%s: out of memory for %zu names", key, r->elements);
    }
    for (size_t i = 0; rc == 0 && i < r->elements; i++) {
        if (!(out->v[out->n] = strndup(r->element[i]->str, r->element[i]->len)))
            rc = mn_fail(MANTA_ENOMEM, "%s: out of memory", key);
        else
            out->n++;
    }
    freeReplyObject(r);
    if (rc) manta_reg_names_free(out);
    return rc;
}

void manta_reg_names_free(manta_reg_names *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL, l->n = 0;
}

#define KEY(kind, name)                                                                            \
    char key[MANTA_REG_KEY_MAX];                                                                   \
    do {                                                                                           \
        int krc_ = manta_reg_key(m, kind, name, key, sizeof key);                                  \
        if (krc_) return krc_;                                                                     \
    } while (0)

/* ---- actors ------------------------------------------------------------------------ */

static int actor_field(manta_reg_actor *a, const char *key, const redisReply *k,
                       const redisReply *v)
{
    const char *f = k->str, *s = v->str;
    manta_actor_info *i = &a->info;
    if (!strcmp(f, F_STATE))
        i->state = manta_actor_state_parse(s);
    else if (!strcmp(f, F_NODE))
        return put(i->node, sizeof i->node, key, k, v);
    else if (!strcmp(f, F_ENDPOINT))
        return put(i->endpoint, sizeof i->endpoint, key, k, v);
    else if (!strcmp(f, F_ENDPOINT_LOCAL))
        return put(i->endpoint_local, sizeof i->endpoint_local, key, k, v);
    else if (!strcmp(f, F_HOST))
        return put(i->host, sizeof i->host, key, k, v);
    else if (!strcmp(f, F_PID))
        i->pid = atoi(s);
    else if (!strcmp(f, F_INCARNATION))
        i->incarnation = atoi(s);
    else if (!strcmp(f, F_RESTARTS))
        i->restarts = atoi(s);
    else if (!strcmp(f, F_HB))
        i->heartbeat_ms = atoll(s);
    else if (!strcmp(f, F_CLASS))
        return put(a->cls, sizeof a->cls, key, k, v);
    else if (!strcmp(f, F_LIBRARY))
        return put(a->library, sizeof a->library, key, k, v);
    else if (!strcmp(f, F_MAX_RESTARTS))
        a->max_restarts = atoi(s);
    else if (!strcmp(f, F_CALLS))
        a->calls = strtoull(s, NULL, 10);
    else if (!strcmp(f, F_ERROR))
        return put(a->error, sizeof a->error, key, k, v);
    else if (!strcmp(f, F_GROUP))
        return put(a->group, sizeof a->group, key, k, v);
    else if (!strcmp(f, F_CPU))
        a->cpu = atof(s);
    else if (!strcmp(f, F_GPU))
        a->gpu = atof(s);
    else if (!strcmp(f, F_MEMORY))
        a->memory = strtoull(s, NULL, 10);
    return 0;
}

int manta_reg_actor_from_reply(const char *key, const redisReply *r, manta_reg_actor *out)
{
    memset(out, 0, sizeof *out);
    if (r->type == REDIS_REPLY_ERROR) return mn_fail(MANTA_EREDIS, "%s: %s", key, r->str);
    if (r->type != REDIS_REPLY_ARRAY) return mn_fail(MANTA_EREDIS, "%s: not a hash", key);
    if (r->elements == 0) return MANTA_ENOTFOUND;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i + 1 < r->elements; i += 2)
        if (r->element[i]->str && r->element[i + 1]->str)
            rc = actor_field(out, key, r->element[i], r->element[i + 1]);
    return rc;
}

int manta_reg_actor_read(manta_ctx *m, const char *name, manta_reg_actor *out)
{
    KEY(MANTA_REG_ACTOR, name);
    memset(out, 0, sizeof *out);
    redisReply *r;
    int rc = hgetall(m, key, &r);
    if (rc == MANTA_ENOTFOUND)
        return mn_fail(MANTA_ENOTFOUND, "no actor named '%s' in job %s", name, m->job);
    if (rc == 0) rc = manta_reg_actor_from_reply(key, r, out);
    freeReplyObject(r);
    return rc;
}

int manta_reg_actor_claim(manta_ctx *m, const char *name, const char *cls)
{
    KEY(MANTA_REG_ACTOR, name);
    redisReply *r = mn_redis(m, "HSETNX %s " F_CLASS " %s", key, cls);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    long long fresh = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    if (!fresh)
        return mn_fail(MANTA_EEXIST, "an actor named '%s' already exists in job %s", name, m->job);
    return 0;
}

int manta_reg_actor_create(manta_ctx *m, const char *name, const manta_reg_actor *rec,
                           const void *args, size_t args_len)
{
    KEY(MANTA_REG_ACTOR, name);
    cmd c = {0};
    arg_str(&c, "HSET");
    arg_str(&c, key);
    field_str(&c, F_NODE, rec->info.node);
    field_str(&c, F_ENDPOINT, rec->info.endpoint);
    field_str(&c, F_STATE, manta_actor_state_name(MANTA_ACTOR_STARTING));
    field_num(&c, F_MAX_RESTARTS, "%d", rec->max_restarts);
    field_str(&c, F_RESTARTS, "0");
    field_str(&c, F_INCARNATION, "1");
    field_str(&c, F_LIBRARY, rec->library);
    arg_str(&c, F_ARGS);
    arg(&c, args ? args : "", args ? args_len : 0);
    if (rec->info.endpoint_local[0]) {
        field_str(&c, F_ENDPOINT_LOCAL, rec->info.endpoint_local);
        field_str(&c, F_HOST, rec->info.host);
    }
    int rc = cmd_run(m, &c);
    if (rc) return rc;
    char set[MANTA_REG_KEY_MAX];
    rc = manta_reg_key(m, MANTA_REG_ACTORS, NULL, set, sizeof set);
    return rc ? rc : run(m, set, "SADD %s %s", set, name);
}

int manta_reg_actor_args(manta_ctx *m, const char *name, void **args, size_t *len)
{
    KEY(MANTA_REG_ACTOR, name);
    *args = NULL, *len = 0;
    redisReply *r = mn_redis(m, "HGET %s " F_ARGS, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type == REDIS_REPLY_STRING && r->len) {
        if (!(*args = malloc(r->len)))
            rc = mn_fail(MANTA_ENOMEM, "%s: %zu bytes of arguments", key, (size_t)r->len);
        else
            memcpy(*args, r->str, r->len), *len = r->len;
    }
    freeReplyObject(r);
    return rc;
}

int manta_reg_actor_set_state(manta_ctx *m, const char *name, manta_actor_state s,
                              const char *error)
{
    KEY(MANTA_REG_ACTOR, name);
    if (error)
        return run(m, key, "HSET %s " F_STATE " %s " F_ERROR " %s", key, manta_actor_state_name(s),
                   error);
    return run(m, key, "HSET %s " F_STATE " %s", key, manta_actor_state_name(s));
}

int manta_reg_actor_report(manta_ctx *m, const char *name, manta_actor_state s, int pid,
                           const char *endpoint, const char *error)
{
    KEY(MANTA_REG_ACTOR, name);
    cmd c = {0};
    arg_str(&c, "HSET");
    arg_str(&c, key);
    field_str(&c, F_STATE, manta_actor_state_name(s));
    field_num(&c, F_PID, "%d", pid);
    field_num(&c, F_HB, "%lld", (long long)mn_wall_ms());
    if (endpoint) field_str(&c, F_ENDPOINT, endpoint);
    if (error) field_str(&c, F_ERROR, error);
    return cmd_run(m, &c);
}

int manta_reg_actor_incarnate(manta_ctx *m, const char *name, int incarnation, int restarts)
{
    KEY(MANTA_REG_ACTOR, name);
    return run(m, key, "HSET %s " F_INCARNATION " %d " F_RESTARTS " %d " F_STATE " %s", key,
               incarnation, restarts, manta_actor_state_name(MANTA_ACTOR_STARTING));
}

int manta_reg_actor_set_pid(manta_ctx *m, const char *name, int pid)
{
    KEY(MANTA_REG_ACTOR, name);
    return run(m, key, "HSET %s " F_PID " %d", key, pid);
}

int manta_reg_actor_heartbeat(manta_ctx *m, const char *name, uint64_t calls)
{
    KEY(MANTA_REG_ACTOR, name);
    return run(m, key, "HSET %s " F_HB " %lld " F_CALLS " %llu", key, (long long)mn_wall_ms(),
               (unsigned long long)calls);
}

void manta_reg_actor_heartbeat_async(manta_ctx *m, const char *name, uint64_t calls)
{
    char key[MANTA_REG_KEY_MAX];
    if (manta_reg_key(m, MANTA_REG_ACTOR, name, key, sizeof key) != 0) return;
    mn_aredis_command(m, NULL, NULL, "HSET %s " F_HB " %lld " F_CALLS " %llu", key,
                      (long long)mn_wall_ms(), (unsigned long long)calls);
}

int manta_reg_actor_set_placement(manta_ctx *m, const char *name, const char *group, double cpu,
                                  double gpu, uint64_t memory)
{
    KEY(MANTA_REG_ACTOR, name);
    return run(m, key, "HSET %s " F_GROUP " %s " F_CPU " %g " F_GPU " %g " F_MEMORY " %llu", key,
               group ? group : "", cpu, gpu, (unsigned long long)memory);
}

int manta_reg_actor_mark_lost(manta_ctx *m, const char *name, const char *cls, const char *node,
                              const char *error)
{
    KEY(MANTA_REG_ACTOR, name);
    int rc = run(m, key, "HSET %s " F_CLASS " %s " F_STATE " %s " F_NODE " %s " F_ERROR " %s", key,
                 cls, manta_actor_state_name(MANTA_ACTOR_DEAD), node, error);
    char set[MANTA_REG_KEY_MAX];
    if (rc == 0) rc = manta_reg_key(m, MANTA_REG_ACTORS, NULL, set, sizeof set);
    return rc ? rc : run(m, set, "SADD %s %s", set, name);
}

int manta_reg_actor_forget(manta_ctx *m, const char *name)
{
    KEY(MANTA_REG_ACTOR, name);
    char set[MANTA_REG_KEY_MAX];
    int rc = manta_reg_key(m, MANTA_REG_ACTORS, NULL, set, sizeof set);
    char metrics[MANTA_REG_KEY_MAX];
    if (rc == 0) rc = manta_reg_key(m, MANTA_REG_METRICS, name, metrics, sizeof metrics);
    if (rc == 0) rc = run(m, key, "DEL %s %s", key, metrics);
    return rc ? rc : run(m, set, "SREM %s %s", set, name);
}

int manta_reg_actor_names(manta_ctx *m, manta_reg_names *out)
{
    KEY(MANTA_REG_ACTORS, NULL);
    return read_names(m, key, "SMEMBERS", out);
}

/* ---- nodes ------------------------------------------------------------------------ */

int manta_reg_node_register(manta_ctx *m, const char *id, const manta_reg_node *rec)
{
    KEY(MANTA_REG_NODE, id);
    char set[MANTA_REG_KEY_MAX];
    int rc = manta_reg_key(m, MANTA_REG_NODES, NULL, set, sizeof set);
    if (rc == 0) rc = run(m, set, "SADD %s %s", set, id);
    if (rc) return rc;
    cmd c = {0};
    arg_str(&c, "HSET");
    arg_str(&c, key);
    field_str(&c, F_ENDPOINT, rec->endpoint);
    field_str(&c, F_HOST, rec->host);
    field_num(&c, F_PID, "%d", rec->pid);
    field_str(&c, F_STATE, manta_actor_state_name(MANTA_ACTOR_ALIVE));
    field_num(&c, F_HB, "%lld", (long long)mn_wall_ms());
    field_num(&c, F_CPU, "%g", rec->cpu);
    field_num(&c, F_GPU, "%d", rec->gpu);
    field_num(&c, F_MEMORY, "%llu", (unsigned long long)rec->memory);
    field_str(&c, F_TRANSPORT, rec->transport);
    return cmd_run(m, &c);
}

static int node_field(manta_reg_node *n, const char *key, const redisReply *k, const redisReply *v)
{
    const char *f = k->str, *s = v->str;
    if (!strcmp(f, F_STATE))
        n->state = manta_actor_state_parse(s);
    else if (!strcmp(f, F_ENDPOINT))
        return put(n->endpoint, sizeof n->endpoint, key, k, v);
    else if (!strcmp(f, F_HOST))
        return put(n->host, sizeof n->host, key, k, v);
    else if (!strcmp(f, F_TRANSPORT))
        return put(n->transport, sizeof n->transport, key, k, v);
    else if (!strcmp(f, F_PID))
        n->pid = atoi(s);
    else if (!strcmp(f, F_HB))
        n->heartbeat_ms = atoll(s);
    else if (!strcmp(f, F_CPU))
        n->cpu = atof(s);
    else if (!strcmp(f, F_GPU))
        n->gpu = atoi(s);
    else if (!strcmp(f, F_MEMORY))
        n->memory = strtoull(s, NULL, 10);
    return 0;
}

int manta_reg_node_read(manta_ctx *m, const char *id, manta_reg_node *out)
{
    KEY(MANTA_REG_NODE, id);
    memset(out, 0, sizeof *out);
    redisReply *r;
    int rc = hgetall(m, key, &r);
    if (rc == MANTA_ENOTFOUND) return mn_fail(rc, "no node '%s' in job %s", id, m->job);
    for (size_t i = 0; rc == 0 && i + 1 < r->elements; i += 2)
        if (r->element[i]->str && r->element[i + 1]->str)
            rc = node_field(out, key, r->element[i], r->element[i + 1]);
    freeReplyObject(r);
    return rc;
}

int manta_reg_node_heartbeat(manta_ctx *m, const char *id)
{
    KEY(MANTA_REG_NODE, id);
    return run(m, key, "HSET %s " F_HB " %lld", key, (long long)mn_wall_ms());
}

int manta_reg_node_set_state(manta_ctx *m, const char *id, manta_actor_state s)
{
    KEY(MANTA_REG_NODE, id);
    return run(m, key, "HSET %s " F_STATE " %s", key, manta_actor_state_name(s));
}

int manta_reg_node_leave(manta_ctx *m, const char *id)
{
    KEY(MANTA_REG_NODES, NULL);
    return run(m, key, "SREM %s %s", key, id);
}

int manta_reg_node_forget(manta_ctx *m, const char *id)
{
    KEY(MANTA_REG_NODE, id);
    int rc = run(m, key, "DEL %s", key);
    return rc ? rc : manta_reg_node_leave(m, id);
}

int manta_reg_node_ids(manta_ctx *m, manta_reg_names *out)
{
    KEY(MANTA_REG_NODES, NULL);
    return read_names(m, key, "SMEMBERS", out);
}

int64_t manta_reg_age_ms(int64_t stamp_ms)
{
    return mn_wall_ms() - stamp_ms;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int manta_reg_node_list_read(manta_ctx *m, manta_reg_node_list *out)
{
    out->v = NULL, out->n = 0;
    manta_reg_names ids;
    int rc = manta_reg_node_ids(m, &ids);
    if (rc) return rc;
    qsort(ids.v, ids.n, sizeof *ids.v, str_cmp);
    if (ids.n && !(out->v = calloc(ids.n, sizeof *out->v)))
        rc = mn_fail(MANTA_ENOMEM, "node list of job %s: %zu nodes", m->job, ids.n);
    for (size_t i = 0; rc == 0 && i < ids.n; i++) {
        manta_reg_node_entry *e = &out->v[out->n];
        rc = manta_reg_node_read(m, ids.v[i], &e->rec);
        if (rc == MANTA_ENOTFOUND) {
            rc = 0;
            continue;
        }
        if (rc) break;
        e->id = ids.v[i], ids.v[i] = NULL; /* the entry owns it now */
        e->age_ms = e->rec.heartbeat_ms > 0 ? manta_reg_age_ms(e->rec.heartbeat_ms) : -1;
        out->n++;
    }
    manta_reg_names_free(&ids);
    if (rc) manta_reg_node_list_free(out);
    return rc;
}

void manta_reg_node_list_free(manta_reg_node_list *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->v[i].id);
    free(l->v);
    l->v = NULL, l->n = 0;
}

/* ---- objects ------------------------------------------------------------------------ */

int manta_reg_obj_create(manta_ctx *m, const char *id, size_t size, const void *data,
                         const char *owner)
{
    KEY(MANTA_REG_OBJ, id);
    if (owner)
        return run(m, key, "HSET %s " F_SIZE " %llu " F_REFS " 1 " F_OWNER " %s", key,
                   (unsigned long long)size, owner);
    return run(m, key, "HSET %s " F_SIZE " %llu " F_REFS " 1 " F_DATA " %b", key,
               (unsigned long long)size, data ? data : "", size);
}

int manta_reg_obj_locate(manta_ctx *m, const char *id, void **data, size_t *len, char *owner,
                         size_t owner_len)
{
    KEY(MANTA_REG_OBJ, id);
    *data = NULL, *len = 0;
    if (owner_len) owner[0] = 0;
    redisReply *r = mn_redis(m, "HMGET %s " F_DATA " " F_OWNER, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        rc = mn_fail(MANTA_EREDIS, "%s: HMGET: unexpected reply", key);
    } else if (r->element[0]->type == REDIS_REPLY_STRING) {
        size_t n = r->element[0]->len;
        if (!(*data = malloc(n ? n : 1)))
            rc = mn_fail(MANTA_ENOMEM, "object %s: %zu bytes: out of memory", id, n);
        else
            memcpy(*data, r->element[0]->str, n), *len = n;
    } else if (r->element[1]->type == REDIS_REPLY_STRING) {
        rc = put(owner, owner_len, key, &(redisReply){.str = F_OWNER}, r->element[1]);
    } else {
        rc = mn_fail(MANTA_ENOTFOUND, "no object %s in job %s", id, m->job);
    }
    freeReplyObject(r);
    return rc;
}

/* Both scripts see a missing record as -1: a reference is never added to,
 * or taken from, an object that is gone. */
static const char LUA_REF[] = "if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end "
                              "return redis.call('HINCRBY', KEYS[1], 'refs', 1)";
static const char LUA_RELEASE[] = "if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, ''} end "
                                  "local n = redis.call('HINCRBY', KEYS[1], 'refs', -1) "
                                  "if n > 0 then return {n, ''} end "
                                  "local o = redis.call('HGET', KEYS[1], 'owner') "
                                  "redis.call('DEL', KEYS[1]) "
                                  "return {0, o or ''}";

int manta_reg_obj_ref(manta_ctx *m, const char *id)
{
    KEY(MANTA_REG_OBJ, id);
    redisReply *r = mn_redis(m, "EVAL %s 1 %s", LUA_REF, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type != REDIS_REPLY_INTEGER)
        rc = mn_fail(MANTA_EREDIS, "%s: ref: unexpected reply", key);
    else if (r->integer < 0)
        rc = mn_fail(MANTA_ENOTFOUND, "no object %s in job %s", id, m->job);
    freeReplyObject(r);
    return rc;
}

int manta_reg_obj_release(manta_ctx *m, const char *id, int *freed, char *owner, size_t owner_len)
{
    KEY(MANTA_REG_OBJ, id);
    *freed = 0;
    if (owner_len) owner[0] = 0;
    redisReply *r = mn_redis(m, "EVAL %s 1 %s", LUA_RELEASE, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        rc = mn_fail(MANTA_EREDIS, "%s: release: unexpected reply", key);
    else if (r->element[0]->integer < 0)
        rc = mn_fail(MANTA_ENOTFOUND, "no object %s in job %s", id, m->job);
    else if (r->element[0]->integer == 0) {
        *freed = 1; /* this release took the last reference: the record is gone */
        if (r->element[1]->str)
            rc = put(owner, owner_len, key, &(redisReply){.str = F_OWNER}, r->element[1]);
    }
    freeReplyObject(r);
    return rc;
}

int manta_reg_obj_refs(manta_ctx *m, const char *id, long long *refs)
{
    KEY(MANTA_REG_OBJ, id);
    redisReply *r = mn_redis(m, "HGET %s " F_REFS, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type == REDIS_REPLY_STRING)
        *refs = atoll(r->str);
    else
        rc = mn_fail(MANTA_ENOTFOUND, "no object %s in job %s", id, m->job);
    freeReplyObject(r);
    return rc;
}

int manta_reg_obj_delete(manta_ctx *m, const char *id)
{
    KEY(MANTA_REG_OBJ, id);
    return run(m, key, "DEL %s", key);
}

/* ---- job values ------------------------------------------------------------------------ */

static int kv_key(manta_ctx *m, const char *key, char *out, size_t n)
{
    size_t len = key ? strlen(key) : 0;
    if (!m || len == 0 || len > 100)
        return mn_fail(MANTA_EINVAL, "value key '%s': 1..100 characters", key ? key : "");
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return mn_fail(MANTA_EINVAL, "value key '%s': use [A-Za-z0-9._-]", key);
    }
    return manta_reg_key(m, MANTA_REG_KV, key, out, n);
}

int manta_kv_set(manta_ctx *m, const char *key, const void *val, size_t len)
{
    char k[MANTA_REG_KEY_MAX];
    int rc = kv_key(m, key, k, sizeof k);
    if (rc) return rc;
    if (len && !val) return mn_fail(MANTA_EINVAL, "manta_kv_set %s: no value", key);
    return run(m, k, "SET %s %b", k, val ? val : "", len);
}

int manta_kv_get(manta_ctx *m, const char *key, void **val, size_t *len)
{
    char k[MANTA_REG_KEY_MAX];
    if (!val || !len) return mn_fail(MANTA_EINVAL, "manta_kv_get: bad arguments");
    *val = NULL, *len = 0;
    int rc = kv_key(m, key, k, sizeof k);
    if (rc) return rc;
    redisReply *r = mn_redis(m, "GET %s", k);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", k, manta_last_error());
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return mn_fail(MANTA_ENOTFOUND, "no value '%s' in job %s", key, m->job);
    }
    *val = malloc(r->len + 1);
    if (!*val)
        rc = mn_fail(MANTA_ENOMEM, "value '%s': %zu bytes: out of memory", key, (size_t)r->len);
    else
        memcpy(*val, r->str, r->len), ((char *)*val)[r->len] = 0, *len = r->len;
    freeReplyObject(r);
    return rc;
}

/* ---- the job: driver and groups ---------------------------------------------------------- */

int manta_reg_driver_claim(manta_ctx *m, int pid, int *holder)
{
    KEY(MANTA_REG_DRIVER, NULL);
    if (holder) *holder = 0;
    redisReply *r = mn_redis(m, "HSETNX %s " F_PID " %d", key, pid);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int type = r->type;
    long long won = r->integer;
    freeReplyObject(r);
    if (type != REDIS_REPLY_INTEGER)
        return mn_fail(MANTA_EREDIS, "%s: HSETNX answered with reply type %d", key, type);
    if (won == 1) return 0;
    m->attached = true; /* not ours to tear down */
    redisReply *h = mn_redis(m, "HGET %s " F_PID, key);
    if (h && h->type == REDIS_REPLY_STRING && holder) *holder = atoi(h->str);
    freeReplyObject(h);
    return mn_fail(MANTA_EEXIST, "job %s is already claimed by driver pid %d", m->job,
                   holder ? *holder : 0);
}

int manta_reg_driver_forget(manta_ctx *m)
{
    KEY(MANTA_REG_DRIVER, NULL);
    char list[MANTA_REG_KEY_MAX];
    int rc = manta_reg_key(m, MANTA_REG_GROUPS, NULL, list, sizeof list);
    if (rc == 0) rc = run(m, key, "DEL %s", key);
    return rc ? rc : run(m, list, "DEL %s", list);
}

int manta_reg_driver_write(manta_ctx *m, const manta_reg_driver *d)
{
    KEY(MANTA_REG_DRIVER, NULL);
    cmd c = {0};
    arg_str(&c, "HSET");
    arg_str(&c, key);
    field_num(&c, F_PID, "%d", d->pid);
    field_str(&c, F_HOST, d->host);
    field_str(&c, F_SPEC, d->spec);
    field_str(&c, F_SETS, d->sets);
    field_str(&c, F_RUN_DIR, d->run_dir);
    field_num(&c, F_STARTED, "%lld", (long long)(d->started_ms ? d->started_ms : mn_wall_ms()));
    return cmd_run(m, &c);
}

static int driver_field(manta_reg_driver *d, const char *key, const redisReply *k,
                        const redisReply *v)
{
    const char *f = k->str;
    if (!strcmp(f, F_PID))
        d->pid = atoi(v->str);
    else if (!strcmp(f, F_STARTED))
        d->started_ms = atoll(v->str);
    else if (!strcmp(f, F_HOST))
        return put(d->host, sizeof d->host, key, k, v);
    else if (!strcmp(f, F_SPEC))
        return put(d->spec, sizeof d->spec, key, k, v);
    else if (!strcmp(f, F_SETS))
        return put(d->sets, sizeof d->sets, key, k, v);
    else if (!strcmp(f, F_RUN_DIR))
        return put(d->run_dir, sizeof d->run_dir, key, k, v);
    return 0;
}

int manta_reg_driver_read(manta_ctx *m, manta_reg_driver *out)
{
    KEY(MANTA_REG_DRIVER, NULL);
    memset(out, 0, sizeof *out);
    redisReply *r;
    int rc = hgetall(m, key, &r);
    if (rc == MANTA_ENOTFOUND) return mn_fail(rc, "job %s is not running", m->job);
    for (size_t i = 0; rc == 0 && i + 1 < r->elements; i += 2)
        if (r->element[i]->str && r->element[i + 1]->str)
            rc = driver_field(out, key, r->element[i], r->element[i + 1]);
    freeReplyObject(r);
    return rc;
}

int manta_reg_group_add(manta_ctx *m, const char *name, const char *cls, int wanted)
{
    KEY(MANTA_REG_GROUP, name);
    char list[MANTA_REG_KEY_MAX];
    int rc = manta_reg_key(m, MANTA_REG_GROUPS, NULL, list, sizeof list);
    if (rc == 0)
        rc = run(m, key, "HSET %s " F_CLASS " %s " F_WANTED " %d", key, cls ? cls : "", wanted);
    return rc ? rc : run(m, list, "RPUSH %s %s", list, name);
}

int manta_reg_group_set_wanted(manta_ctx *m, const char *name, int wanted)
{
    KEY(MANTA_REG_GROUP, name);
    return run(m, key, "HSET %s " F_WANTED " %d", key, wanted);
}

int manta_reg_group_read(manta_ctx *m, const char *name, char *cls, size_t cls_len, int *wanted)
{
    KEY(MANTA_REG_GROUP, name);
    redisReply *r = mn_redis(m, "HMGET %s " F_CLASS " " F_WANTED, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !r->element[1]->str)
        rc = mn_fail(MANTA_ENOTFOUND, "no group '%s' in job %s", name, m->job);
    else if (cls && cls_len)
        rc = r->element[0]->str
                 ? put(cls, cls_len, key, &(redisReply){.str = F_CLASS}, r->element[0])
                 : (cls[0] = 0, 0);
    if (rc == 0 && wanted) *wanted = atoi(r->element[1]->str);
    freeReplyObject(r);
    return rc;
}

int manta_reg_group_names(manta_ctx *m, manta_reg_names *out)
{
    KEY(MANTA_REG_GROUPS, NULL);
    return read_names(m, key, "LRANGE", out);
}

int manta_reg_group_forget(manta_ctx *m, const char *name)
{
    KEY(MANTA_REG_GROUP, name);
    return run(m, key, "DEL %s", key);
}

/* ---- job values: listing ------------------------------------------------------------------ */

static int names_push(manta_reg_names *out, size_t *cap, const char *name, const char *key)
{
    if (out->n == *cap) {
        size_t ncap = *cap ? 2 * *cap : 16;
        char **v = realloc(out->v, ncap * sizeof *v);
        if (!v) return mn_fail(MANTA_ENOMEM, "%s: %zu names", key, ncap);
        out->v = v, *cap = ncap;
    }
    if (!(out->v[out->n] = strdup(name))) return mn_fail(MANTA_ENOMEM, "%s: out of memory", key);
    out->n++;
    return 0;
}

int manta_reg_kv_names(manta_ctx *m, manta_reg_names *out)
{
    out->v = NULL, out->n = 0;
    char pattern[MANTA_REG_KEY_MAX], cursor[32] = "0";
    int rc = manta_reg_pattern(m, MANTA_REG_KV, pattern, sizeof pattern);
    if (rc) return rc;
    size_t plen = strlen(pattern) - 1, cap = 0; /* the prefix before '*' */
    do {
        redisReply *r = mn_redis(m, "SCAN %s MATCH %s COUNT 100", cursor, pattern);
        if (!r) {
            rc = mn_fail(MANTA_EREDIS, "%s: %s", pattern, manta_last_error());
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !r->element[0]->str ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = mn_fail(MANTA_EREDIS, "%s: SCAN answered with an unexpected reply", pattern);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; rc == 0 && i < r->element[1]->elements; i++) {
            const char *k = r->element[1]->element[i]->str;
            if (k && strlen(k) > plen) rc = names_push(out, &cap, k + plen, pattern);
        }
        freeReplyObject(r);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    if (rc) manta_reg_names_free(out);
    return rc;
}

/* ---- collective groups ------------------------------------------------------------------ */

int manta_reg_coll_join(manta_ctx *m, const char *name, int world, int rank)
{
    KEY(MANTA_REG_COLL, name);
    int rc = run(m, key, "HSETNX %s " MANTA_REG_COLL_WORLD " %d", key, world);
    if (rc) return rc;
    redisReply *r = mn_redis(m, "HGET %s " MANTA_REG_COLL_WORLD, key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    if (r->type == REDIS_REPLY_STRING && atoi(r->str) != world)
        rc = mn_fail(MANTA_EINVAL, "group '%s': rank %d says world %d, another member said %s",
                     name, rank, world, r->str);
    freeReplyObject(r);
    if (rc) return rc;
    return run(m, key, "HSET %s " MANTA_REG_COLL_RANK "%d %d", key, rank, (int)getpid());
}

int manta_reg_coll_put(manta_ctx *m, const char *name, const char *field, const void *val,
                       size_t len)
{
    KEY(MANTA_REG_COLL, name);
    return run(m, key, "HSET %s %s %b", key, field, val ? val : "", len);
}

/* HGET a field: *r to free, or ENOTFOUND while it is absent. */
static int coll_field(manta_ctx *m, const char *key, const char *field, redisReply **out)
{
    redisReply *r = mn_redis(m, "HGET %s %s", key, field);
    *out = NULL;
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return MANTA_ENOTFOUND; /* not yet: the caller polls, no message */
    }
    *out = r;
    return 0;
}

int manta_reg_coll_get(manta_ctx *m, const char *name, const char *field, void *out, size_t len)
{
    KEY(MANTA_REG_COLL, name);
    redisReply *r;
    int rc = coll_field(m, key, field, &r);
    if (rc) return rc;
    if (r->len != len)
        rc = mn_fail(MANTA_EPROTO, "group '%s': field %s has %zu bytes, expected %zu", name, field,
                     (size_t)r->len, len);
    else
        memcpy(out, r->str, len);
    freeReplyObject(r);
    return rc;
}

int manta_reg_coll_get_str(manta_ctx *m, const char *name, const char *field, char *out, size_t cap)
{
    KEY(MANTA_REG_COLL, name);
    redisReply *r;
    int rc = coll_field(m, key, field, &r);
    if (rc) return rc;
    rc = put(out, cap, key, &(redisReply){.str = (char *)field}, r);
    freeReplyObject(r);
    return rc;
}

int manta_reg_coll_seen(manta_ctx *m, const char *name, int world, char *seen, int *present)
{
    KEY(MANTA_REG_COLL, name);
    redisReply *r = mn_redis(m, "HKEYS %s", key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    size_t pre = strlen(MANTA_REG_COLL_RANK);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const char *f = r->element[i]->str;
        if (!f || strncmp(f, MANTA_REG_COLL_RANK, pre)) continue;
        int k = atoi(f + pre);
        if (k >= 0 && k < world && !seen[k]) seen[k] = 1, ++*present;
    }
    freeReplyObject(r);
    return 0;
}

/* Drop the hash unless a rank is still present in it, in one step, so a
 * rank joining meanwhile keeps it. */
static const char LUA_COLL_ABANDON[] =
    "for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do "
    "if string.sub(f, 1, 2) == '" MANTA_REG_COLL_RANK "' then return 0 end end "
    "redis.call('DEL', KEYS[1]) return 1";

int manta_reg_coll_leave(manta_ctx *m, const char *name, int rank, int world, int finished)
{
    KEY(MANTA_REG_COLL, name);
    int rc =
        run(m, key, "HDEL %s " MANTA_REG_COLL_RANK "%d " MANTA_REG_COLL_EP "%d", key, rank, rank);
    if (rc) return rc;
    if (!finished) return run(m, key, "EVAL %s 1 %s", LUA_COLL_ABANDON, key);
    redisReply *r = mn_redis(m, "HINCRBY %s " MANTA_REG_COLL_DONE " 1", key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    long long done = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    return done >= world ? run(m, key, "DEL %s", key) : 0;
}

/* ---- the job's security setting ------------------------------------------------------ */

int mn_reg_security_write(manta_ctx *m, int curve, const char *public_key)
{
    KEY(MANTA_REG_SECURITY, NULL);
    return run(m, key, "HSET %s " F_CURVE " %s " F_PUBLIC_KEY " %s", key, curve ? "on" : "off",
               public_key ? public_key : "");
}

int mn_reg_security_read(manta_ctx *m, int *curve, char *public_key, size_t cap)
{
    KEY(MANTA_REG_SECURITY, NULL);
    *curve = 0;
    if (cap) public_key[0] = 0;
    redisReply *r;
    int rc = hgetall(m, key, &r);
    if (rc) return rc;
    for (size_t i = 0; rc == 0 && i + 1 < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (!k->str || !v->str) continue;
        if (!strcmp(k->str, F_CURVE) && strcmp(v->str, "on") && strcmp(v->str, "off"))
            rc = mn_fail(MANTA_EPROTO, "%s: curve is '%s', not on or off", key, v->str);
        else if (!strcmp(k->str, F_CURVE))
            *curve = !strcmp(v->str, "on");
        else if (!strcmp(k->str, F_PUBLIC_KEY))
            rc = put(public_key, cap, key, k, v);
    }
    freeReplyObject(r);
    return rc;
}

/* ---- the whole job --------------------------------------------------------------------- */

int mn_delete_job_keys(manta_ctx *m)
{
    char pattern[160], cursor[32] = "0";
    job_pattern(m, pattern, sizeof pattern);
    int rc = 0;
    do {
        redisReply *r = mn_redis(m, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r) return mn_fail(MANTA_EREDIS, "SCAN %s: %s", pattern, manta_last_error());
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            return mn_fail(MANTA_EREDIS, "SCAN %s: unexpected reply", pattern);
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            int k = run(m, keys->element[i]->str, "DEL %b", keys->element[i]->str,
                        keys->element[i]->len);
            if (k && !rc) rc = k;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------- */

void manta_reg_metrics_publish_async(manta_ctx *m, const char *name, const char *text, size_t len)
{
    char key[MANTA_REG_KEY_MAX];
    if (manta_reg_key(m, MANTA_REG_METRICS, name, key, sizeof key) != 0) return;
    mn_aredis_command(m, NULL, NULL, "SET %s %b", key, text, len);
}

int manta_reg_metrics_read(manta_ctx *m, const char *name, manta_metrics *out)
{
    KEY(MANTA_REG_METRICS, name);
    out->v = NULL, out->n = 0;
    redisReply *r = mn_redis(m, "GET %s", key);
    if (!r) return mn_fail(MANTA_EREDIS, "%s: %s", key, manta_last_error());
    int rc = r->type == REDIS_REPLY_STRING
                 ? manta_metrics_parse(r->str, r->len, out)
                 : mn_fail(MANTA_ENOTFOUND, "actor %s has published no metrics yet", name);
    freeReplyObject(r);
    return rc;
}
