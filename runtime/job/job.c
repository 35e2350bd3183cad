/*
 * job.c -- a spec's job as a library (manta_job.h): records, services,
 * placement, replicas, readiness, the node watchdog and failover, scale and
 * drain, the run method.
 *
 * The job's records in Redis are manta_schema.h's: the driver record (what
 * `manta scale` and `status` read), the groups in spec order with their
 * wanted sizes, and each replica's directory record, to which start_replica
 * adds what the replica holds, so that placement later knows what is used
 * where and failover can re-create it elsewhere from its own record.
 *
 * Placement is first-fit over the live nodes, local node first, then node
 * ids in order (manta_spec_place). Every wait turns the ctx's loop, so the
 * watchdog (a one-second timer) runs during all of them.
 */
#include "job_internal.h"
#include "manta_schema.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* A node whose heartbeat stopped while its process still holds its
 * mailbox: not dead, but watched (and fatal after node_stall_ms). */
typedef struct stall {
    char id[64];
    int64_t since; /* when the watchdog first saw it silent */
    bool seen;     /* still silent at the last look */
} stall;

#define MAX_STALLS 64
struct manta_job {
    manta_ctx *m;
    const manta_spec *spec;
    manta_spec *owned; /* the spec manta_job_attach loaded */
    manta_job_options o;
    mj_services *sv;
    uint64_t watchdog; /* timer id; 0: none */
    int fatal;         /* a cause that ends the job (MANTA_E*), 0: none */
    char fatal_msg[1024];
    int64_t redis_down_since; /* the watchdog's first failed read of a streak; 0: none */
    stall stalls[MAX_STALLS];
    manta_future *run; /* the run method's call, once made */
    bool stopped;
    bool recorded; /* manta_job_start wrote the records: free removes them */
    size_t nodes;
};

#define DEFAULT_READY_S       60
#define DEFAULT_DRAIN_MS      120000
#define STOP_MS               30000 /* a drained actor's fini */
#define WATCH_EVERY_MS        1000
#define PROBE_MS              1000  /* a node's socket: connect within this */
#define DIAGNOSE_MS           2000  /* a dead actor's node: asked again this long */
#define DEFAULT_STALL_MS      60000 /* a silent node whose process lives: fatal after */
#define DEFAULT_REDIS_DOWN_MS 30000 /* Redis unreachable this long: fatal */

#define say(j, ...) mj_say((j)->o.log, __VA_ARGS__)

static bool interrupted(const manta_job_t *j)
{
    return j->o.interrupt && *j->o.interrupt;
}

/* ---- nodes and placement ---- */

/* The job's live nodes with what is free on each, in placement order. */
typedef struct node_list {
    size_t n, cap;
    char **ids;
    manta_spec_capacity *free;
} node_list;

static void nodes_free(node_list *nl)
{
    for (size_t i = 0; i < nl->n; i++) free(nl->ids[i]);
    free(nl->ids);
    free(nl->free);
    memset(nl, 0, sizeof *nl);
}

static int nodes_push(node_list *nl, const char *id, manta_spec_capacity c)
{
    if (nl->n == nl->cap) {
        size_t cap = nl->cap ? 2 * nl->cap : 16;
        char **ids = realloc(nl->ids, cap * sizeof *ids);
        if (ids) nl->ids = ids;
        manta_spec_capacity *f = ids ? realloc(nl->free, cap * sizeof *f) : NULL;
        if (!f) return manta_fail(MANTA_ENOMEM, "node list of %zu nodes", cap);
        nl->free = f;
        nl->cap = cap;
    }
    if (!(nl->ids[nl->n] = strdup(id))) return manta_fail(MANTA_ENOMEM, "node id %s", id);
    nl->free[nl->n++] = c;
    return 0;
}

/* Does node a come before node b? The local (driver's) node first, so it
 * fills before the others, then node ids in order. */
static bool node_before(const char *a, const char *b, const char *local)
{
    bool la = !strcmp(a, local), lb = !strcmp(b, local);
    if (la != lb) return la;
    return strcmp(a, b) < 0;
}

/* Placement is first-fit: make the order deterministic (insertion sort:
 * a job has few nodes). */
static void nodes_sort(manta_ctx *m, node_list *nl)
{
    for (size_t i = 1; i < nl->n; i++) {
        for (size_t k = i; k > 0 && node_before(nl->ids[k], nl->ids[k - 1], manta_node_id(m));
             k--) {
            char *id = nl->ids[k];
            manta_spec_capacity c = nl->free[k];
            nl->ids[k] = nl->ids[k - 1], nl->free[k] = nl->free[k - 1];
            nl->ids[k - 1] = id, nl->free[k - 1] = c;
        }
    }
    for (size_t i = 0; i < nl->n; i++) nl->free[i].name = nl->ids[i];
}

static int read_nodes(manta_ctx *m, node_list *nl)
{
    memset(nl, 0, sizeof *nl);
    manta_reg_node_list all;
    int rc = manta_reg_node_list_read(m, &all);
    if (rc) return rc;
    for (size_t i = 0; i < all.n && rc == 0; i++) {
        const manta_reg_node *n = &all.v[i].rec;
        if (n->state != MANTA_ACTOR_ALIVE) continue;
        manta_spec_capacity c = {.cpu = n->cpu, .gpu = n->gpu, .memory_bytes = n->memory};
        rc = nodes_push(nl, all.v[i].id, c);
    }
    manta_reg_node_list_free(&all);
    if (rc == 0) nodes_sort(m, nl);
    if (rc) nodes_free(nl);
    return rc;
}

static void subtract_one(node_list *nl, const manta_reg_actor *a)
{
    for (size_t k = 0; a->info.node[0] && k < nl->n; k++) {
        if (strcmp(nl->ids[k], a->info.node)) continue;
        nl->free[k].cpu -= a->cpu;
        nl->free[k].gpu -= a->gpu;
        nl->free[k].memory_bytes =
            nl->free[k].memory_bytes > a->memory ? nl->free[k].memory_bytes - a->memory : 0;
    }
}

/* Subtract what running actors already hold on each node. */
static void subtract_usage(manta_ctx *m, node_list *nl)
{
    manta_reg_names names;
    if (manta_reg_actor_names(m, &names) != 0) return;
    for (size_t i = 0; i < names.n; i++) {
        manta_reg_actor a;
        if (manta_reg_actor_read(m, names.v[i], &a) == 0) subtract_one(nl, &a);
    }
    manta_reg_names_free(&names);
}

/* Is `path` a resource of group g ("groups.G.resources.KEY")? */
static bool resource_of(const char *path, const char *g)
{
    size_t gl = strlen(g);
    return !strncmp(path, "groups.", 7) && !strncmp(path + 7, g, gl) &&
           !strncmp(path + 7 + gl, ".resources.", 11);
}

/* Whether derived default i is one to tell: any (d NULL), or a resource
 * of one of the groups d[0..n). */
static bool derived_wanted(const manta_spec *s, size_t i, const manta_spec_demand *d, size_t n)
{
    for (size_t k = 0; d && k < n; k++)
        if (resource_of(s->derived[i].path, d[k].group)) return true;
    return !d;
}

/* The defaults the program put into the spec (manta_spec_options.defaults)
 * that derived_wanted picks, those with the same reason together: "P V and
 * P2 V2 are defaults (WHY): set them in the spec or with --set to choose
 * others", "; " between reasons. "" when there are none. */
static void describe_derived(const manta_spec *s, const manta_spec_demand *d, size_t n, char *out,
                             size_t cap)
{
    size_t used = 0;
    out[0] = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = used < cap ? snprintf(out + used, cap - used, __VA_ARGS__) : 0;                   \
        used = w_ < 0 ? cap : used + (size_t)w_;                                                   \
    } while (0)
    for (size_t i = 0; i < s->n_derived; i++) {
        const char *why = s->derived[i].why;
        bool told = false;
        for (size_t j = 0; j < i && !told; j++)
            told = derived_wanted(s, j, d, n) && !strcmp(s->derived[j].why, why);
        if (told || !derived_wanted(s, i, d, n)) continue;
        size_t count = 0, total = 0;
        for (size_t k = i; k < s->n_derived; k++)
            total += derived_wanted(s, k, d, n) && !strcmp(s->derived[k].why, why);
        PUT("%s", used ? "; " : "");
        for (size_t k = i; k < s->n_derived; k++) {
            if (!derived_wanted(s, k, d, n) || strcmp(s->derived[k].why, why)) continue;
            count++;
            PUT("%s%s %s",
                count == 1       ? ""
                : count == total ? " and "
                                 : ", ",
                s->derived[k].path, s->derived[k].value);
        }
        PUT(" %s (%s): set %s in the spec or with --set to choose %s",
            total > 1 ? "are defaults" : "is a default", why, total > 1 ? "them" : "it",
            total > 1 ? "others" : "another");
    }
#undef PUT
    if (used >= cap && cap > 4) memcpy(out + cap - 4, "...", 4);
}

/* Place `n` demands on the live nodes (less what is in use when
 * `subtract`); fills *nl and node_of (one entry per replica). */
static int place(manta_job_t *j, const manta_spec_demand *d, size_t n, bool subtract,
                 bool whole_spec, node_list *nl, size_t *node_of)
{
    int rc = read_nodes(j->m, nl);
    if (rc) return rc;
    if (subtract) subtract_usage(j->m, nl);
    j->nodes = nl->n;
    char why[512] = "no live node";
    if (nl->n == 0 || manta_spec_place(d, n, nl->free, nl->n, MANTA_SPEC_FIRST_FIT, whole_spec,
                                       node_of, why, sizeof why) != 0) {
        nodes_free(nl);
        /* The note goes whole into the message (of 511 bytes); the free list is cut first. */
        char note[400] = "; ";
        describe_derived(j->spec, d, n, note + 2, sizeof note - 2);
        if (!note[2]) note[0] = 0;
        int room = 480 - (int)strlen(j->spec->job) - (int)strlen(note);
        if (room < 40) room = 40;
        return manta_fail(MANTA_ESPAWN, "job %s: placement: %.*s%s%s", j->spec->job, room, why,
                          (int)strlen(why) > room ? "..." : "", note);
    }
    return 0;
}

/* ---- replicas ---- */

static size_t group_index(const manta_spec *s, const char *group)
{
    size_t g = 0;
    while (g < s->n_groups && strcmp(s->groups[g].name, group)) g++;
    return g;
}

/* Start replica `replica` of group g on node `node` without waiting. */
static int start_replica(manta_job_t *j, size_t g, int replica, const char *node, manta_actor **out)
{
    const manta_spec_group *grp = &j->spec->groups[g];
    char *payload = NULL, name[128];
    size_t len = 0;
    if (manta_spec_init_payload(j->spec, g, replica, &payload, &len) != 0)
        return manta_fail(MANTA_ENOMEM, "init payload of %s-%d", grp->name, replica);
    snprintf(name, sizeof name, "%s-%d", grp->name, replica);
    manta_actor_options o = {.cls = grp->class_name,
                             .name = name,
                             .args = payload,
                             .args_len = len,
                             .max_restarts = grp->max_restarts,
                             .node = node,
                             .library = grp->library_path,
                             .no_wait = 1,
                             .gpu = grp->gpu};
    int rc = manta_actor_create(j->m, &o, out);
    free(payload);
    if (rc) return rc; /* the message names the actor */
    return manta_reg_actor_set_placement(j->m, name, grp->name, grp->cpu, grp->gpu,
                                         grp->memory_bytes);
}

/* Wait until all n are ready, up to timeout_ms (<= 0: ready_timeout_s). */
static int wait_all_ready(manta_job_t *j, manta_actor **actors, size_t n, int timeout_ms)
{
    double tmo = j->o.ready_timeout_s > 0 ? j->o.ready_timeout_s : DEFAULT_READY_S;
    int64_t until = manta_now_ms() + (timeout_ms > 0 ? timeout_ms : (int64_t)(tmo * 1000));
    for (size_t i = 0; i < n; i++) {
        int64_t left = until - manta_now_ms();
        int rc = manta_actor_wait_ready(j->m, actors[i], left > 0 ? (int)left : 1);
        if (rc) return rc; /* the message names the actor */
        if (interrupted(j)) return manta_fail(MANTA_ECLOSED, "job %s: interrupted", j->spec->job);
    }
    return 0;
}

/* ---- node watchdog and failover ---- */

static int64_t node_timeout_ms(const manta_job_t *j)
{
    if (j->o.node_timeout_ms > 0) return j->o.node_timeout_ms;
    const char *v = getenv("MANTA_NODE_TIMEOUT_MS");
    return v && atoll(v) > 0 ? atoll(v) : 5000;
}

/* What re-creating an actor needs, from its own directory record. */
typedef struct actor_record {
    char *cls, *lib, *group; /* lib: "" for a built-in class */
    char *args;
    size_t args_len;
    int max_restarts;
    manta_spec_demand d;
} actor_record;

static void actor_record_free(actor_record *ar)
{
    free(ar->cls), free(ar->lib), free(ar->group), free(ar->args);
}

static int read_actor_record(manta_ctx *m, const char *name, actor_record *ar)
{
    memset(ar, 0, sizeof *ar);
    manta_reg_actor *rec = malloc(sizeof *rec);
    if (!rec) return manta_fail(MANTA_ENOMEM, "directory record of %s", name);
    int rc = manta_reg_actor_read(m, name, rec);
    if (rc == 0 && !rec->cls[0]) rc = MANTA_ENOTFOUND;
    if (rc == MANTA_ENOTFOUND) manta_fail(rc, "actor %s has no directory record", name);
    void *args = NULL;
    if (rc == 0) rc = manta_reg_actor_args(m, name, &args, &ar->args_len);
    if (rc == 0) {
        ar->cls = strdup(rec->cls);
        ar->lib = strdup(rec->library);
        ar->group = strdup(rec->group);
        ar->args = args ? args : malloc(1);
        args = NULL;
        if (!ar->cls || !ar->lib || !ar->group || !ar->args) {
            actor_record_free(ar);
            rc = manta_fail(MANTA_ENOMEM, "directory record of %s", name);
        }
    }
    if (rc == 0) {
        ar->max_restarts = rec->max_restarts;
        ar->d = (manta_spec_demand){ar->group, 1, rec->cpu, rec->gpu, rec->memory};
    }
    free(args);
    free(rec);
    return rc;
}

/* Re-create one actor of a dead node on a node with room. */
static void move_actor(manta_job_t *j, const char *name, const char *dead_node)
{
    manta_ctx *m = j->m;
    actor_record ar;
    if (read_actor_record(m, name, &ar) != 0) return;
    /* The old record goes; the name is taken again by the new incarnation. */
    if (manta_reg_actor_forget(m, name) != 0)
        say(j, "node %s died; forgetting actor %s: %s", dead_node, name, manta_last_error());
    node_list nl;
    size_t where = 0;
    if (place(j, &ar.d, 1, true, false, &nl, &where) != 0) {
        say(j, "node %s died; no room for actor %s elsewhere: %s", dead_node, name,
            manta_last_error());
        if (manta_reg_actor_mark_lost(m, name, ar.cls, dead_node,
                                      "its node died and no other node had room") != 0)
            say(j, "marking actor %s lost: %s", name, manta_last_error());
        actor_record_free(&ar);
        return;
    }
    manta_actor_options o = {.cls = ar.cls,
                             .name = name,
                             .args = ar.args,
                             .args_len = ar.args_len,
                             .max_restarts = ar.max_restarts,
                             .node = nl.ids[where],
                             .library = ar.lib[0] ? ar.lib : NULL,
                             .no_wait = 1,
                             .gpu = ar.d.gpu};
    manta_actor *a;
    if (manta_actor_create(m, &o, &a) == 0) {
        if (manta_reg_actor_set_placement(m, name, ar.group, ar.d.cpu, ar.d.gpu,
                                          ar.d.memory_bytes) != 0)
            say(j, "actor %s: recording its placement: %s", name, manta_last_error());
        say(j, "node %s died; actor %s restarted on node %s", dead_node, name, nl.ids[where]);
    } else {
        say(j, "node %s died; restarting actor %s: %s", dead_node, name, manta_last_error());
    }
    nodes_free(&nl);
    actor_record_free(&ar);
}

/* Declare node `id` dead and move its actors. */
static void node_died(manta_job_t *j, const char *id, int64_t silent_ms, const char *why)
{
    manta_ctx *m = j->m;
    say(j, "node %s: no heartbeat for %.1f s and %s: declared dead", id, (double)silent_ms / 1000,
        why);
    if (manta_reg_node_set_state(m, id, MANTA_ACTOR_DEAD) != 0 || manta_reg_node_leave(m, id) != 0)
        say(j, "node %s: %s", id, manta_last_error());
    manta_reg_names names;
    if (manta_reg_actor_names(m, &names) == 0) {
        for (size_t k = 0; k < names.n; k++) {
            manta_reg_actor a;
            if (manta_reg_actor_read(m, names.v[k], &a) == 0 && !strcmp(a.info.node, id))
                move_actor(j, names.v[k], id);
        }
        manta_reg_names_free(&names);
    } else {
        say(j, "node %s: listing its actors: %s", id, manta_last_error());
    }
    /* The record stays, saying dead: an agent that was only cut off sees it
     * when its heartbeat comes back, and joins again (node.c). */
}

/* The first cause that ends the job wins; manta_job_wait returns it. */
static void set_fatal(manta_job_t *j, int code, const char *msg)
{
    if (j->fatal) return;
    j->fatal = code;
    snprintf(j->fatal_msg, sizeof j->fatal_msg, "%s", msg);
    say(j, "%s", msg);
}

static int64_t env_ms(int64_t given, const char *var, int64_t def)
{
    if (given > 0) return given;
    const char *v = getenv(var);
    return v && atoll(v) > 0 ? atoll(v) : def;
}

/* The watchdog's own Redis reads failed: Redis is gone (being restarted,
 * or for good). Fatal once that has lasted redis_down_ms. */
static void redis_trouble(manta_job_t *j)
{
    int64_t now = manta_now_ms(),
            limit = env_ms(j->o.redis_down_ms, "MANTA_REDIS_DOWN_MS", DEFAULT_REDIS_DOWN_MS);
    char why[512];
    snprintf(why, sizeof why, "%s", manta_last_error());
    if (!j->redis_down_since) {
        j->redis_down_since = now;
        say(j, "job %s: Redis does not answer (%s); the job fails if it lasts %.0f s", j->spec->job,
            why, (double)limit / 1000);
        return;
    }
    if (now - j->redis_down_since < limit) return;
    char msg[1024];
    snprintf(msg, sizeof msg,
             "job %s: Redis has not answered for %.0f s (limit %.0f s, MANTA_REDIS_DOWN_MS): %s",
             j->spec->job, (double)(now - j->redis_down_since) / 1000, (double)limit / 1000, why);
    set_fatal(j, MANTA_EREDIS, msg);
}

static stall *stall_find(manta_job_t *j, const char *id, bool add, int64_t age_ms)
{
    stall *free_slot = NULL;
    for (size_t i = 0; i < MAX_STALLS; i++) {
        if (j->stalls[i].id[0] && !strcmp(j->stalls[i].id, id)) return &j->stalls[i];
        if (!j->stalls[i].id[0] && !free_slot) free_slot = &j->stalls[i];
    }
    if (!add || !free_slot) return NULL;
    snprintf(free_slot->id, sizeof free_slot->id, "%s", id);
    free_slot->since = manta_now_ms() - age_ms;
    return free_slot;
}

/* A silent node whose process still holds its mailbox: stopped or starved,
 * not dead. Its actors stay where they are; after node_stall_ms the job
 * fails naming it (a node stopped for good would hang the job). */
static void node_stalled(manta_job_t *j, const manta_reg_node_entry *e)
{
    stall *st = stall_find(j, e->id, false, 0);
    if (!st) {
        st = stall_find(j, e->id, true, e->age_ms);
        say(j,
            "node %s: no heartbeat for %.1f s, but its process still holds its mailbox %s "
            "(stopped or overloaded): not declared dead",
            e->id, (double)e->age_ms / 1000, e->rec.endpoint);
        if (!st) return; /* more stalled nodes than slots: said, not timed */
    }
    st->seen = true;
    int64_t limit = env_ms(j->o.node_stall_ms, "MANTA_NODE_STALL_MS", DEFAULT_STALL_MS);
    if (e->age_ms < limit) return;
    char msg[1024];
    snprintf(msg, sizeof msg,
             "node %s (pid %d on %s): no heartbeat for %.0f s while its process holds its "
             "mailbox (stopped?); limit %.0f s (MANTA_NODE_STALL_MS): the job cannot go on",
             e->id, e->rec.pid, e->rec.host, (double)e->age_ms / 1000, (double)limit / 1000);
    set_fatal(j, MANTA_ETIMEDOUT, msg);
}

/* Nodes: a silent one is probed; dead only when its socket says so. A
 * stalled node whose heartbeat came back is said once. */
static void watch_nodes(manta_job_t *j)
{
    manta_reg_node_list nodes;
    if (manta_reg_node_list_read(j->m, &nodes) != 0) {
        redis_trouble(j);
        return;
    }
    if (j->redis_down_since)
        say(j, "job %s: Redis answers again after %.1f s", j->spec->job,
            (double)(manta_now_ms() - j->redis_down_since) / 1000);
    j->redis_down_since = 0;
    for (size_t i = 0; i < MAX_STALLS; i++) j->stalls[i].seen = false;
    int64_t limit = node_timeout_ms(j);
    for (size_t i = 0; i < nodes.n && !j->fatal; i++) {
        const manta_reg_node_entry *e = &nodes.v[i];
        if (e->age_ms <= limit) continue;
        mj_node_liveness l = mj_probe_endpoint(e->rec.endpoint, PROBE_MS);
        if (l == MJ_NODE_PRESENT)
            node_stalled(j, e);
        else
            node_died(j, e->id, e->age_ms,
                      l == MJ_NODE_GONE ? "its mailbox refuses connections"
                                        : "its endpoint cannot be probed");
    }
    manta_reg_node_list_free(&nodes);
    for (size_t i = 0; i < MAX_STALLS; i++) {
        stall *st = &j->stalls[i];
        if (!st->id[0] || st->seen) continue;
        say(j, "node %s: heartbeat again after %.1f s of silence", st->id,
            (double)(manta_now_ms() - st->since) / 1000);
        memset(st, 0, sizeof *st);
    }
}

/* A group whose every replica is gone for good (dead after its restarts,
 * failed, lost with its node) ends the job: the others cannot do its work.
 * A group being moved or scaled has no records for a moment; only records
 * that exist count. */
static void watch_groups(manta_job_t *j)
{
    manta_reg_names names;
    if (manta_reg_actor_names(j->m, &names) != 0) {
        redis_trouble(j);
        return;
    }
    size_t ng = j->spec->n_groups;
    size_t *present = calloc(ng ? ng : 1, sizeof *present),
           *gone = calloc(ng ? ng : 1, sizeof *gone);
    char(*example)[700] = calloc(ng ? ng : 1, sizeof *example);
    manta_reg_actor *a = malloc(sizeof *a);
    for (size_t k = 0; present && gone && example && a && k < names.n; k++) {
        if (manta_reg_actor_read(j->m, names.v[k], a) != 0) continue;
        size_t g = group_index(j->spec, a->group);
        if (g == ng) continue;
        present[g]++;
        if (a->info.state != MANTA_ACTOR_DEAD && a->info.state != MANTA_ACTOR_FAILED) continue;
        if (gone[g]++ == 0)
            snprintf(example[g], sizeof example[g], "%s: %s: %.500s", names.v[k],
                     manta_actor_state_name(a->info.state), a->error[0] ? a->error : "no reason");
    }
    for (size_t g = 0; present && gone && example && g < ng && !j->fatal; g++) {
        if (!present[g] || gone[g] < present[g]) continue;
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "group %s: every replica is gone for good (%zu of %zu; %s): the job cannot go on",
                 j->spec->groups[g].name, gone[g], present[g], example[g]);
        set_fatal(j, MANTA_EDIED, msg);
    }
    free(present), free(gone), free(example), free(a);
    manta_reg_names_free(&names);
}

/* The watchdog, every WATCH_EVERY_MS: services, nodes, groups. */
static void watchdog(void *arg)
{
    manta_job_t *j = arg;
    if (!j->fatal) {
        int rc = mj_services_watch(j->sv);
        if (rc) set_fatal(j, rc, manta_last_error());
    }
    if (!j->fatal) watch_nodes(j);
    if (!j->fatal && !j->redis_down_since) watch_groups(j);
    j->watchdog = manta_timer_add(j->m, WATCH_EVERY_MS, watchdog, j);
}

/* Why did the run method's actor die? What the watchdog knows, else a
 * look at the services and the nodes now (an agent's death kills its
 * actors at once, before its heartbeat is old enough for the watchdog). */
static void diagnose(manta_job_t *j, char *out, size_t cap)
{
    out[0] = 0;
    if (!j->fatal) {
        int rc = mj_services_watch(j->sv);
        if (rc) set_fatal(j, rc, manta_last_error());
    }
    if (j->fatal) {
        snprintf(out, cap, "; %s", j->fatal_msg);
        return;
    }
    manta_reg_node_list nodes;
    if (manta_reg_node_list_read(j->m, &nodes) != 0) {
        snprintf(out, cap, "; Redis: %s", manta_last_error());
        return;
    }
    /* A SIGKILLed agent's children get their death signal when its spawning
     * thread exits, which can be a moment before its last thread closes the
     * listening socket: a node that still takes connections is asked again
     * for up to DIAGNOSE_MS before it is called alive. */
    bool any_gone = false;
    int64_t until = manta_now_ms() + DIAGNOSE_MS;
    for (;;) {
        for (size_t i = 0; i < nodes.n && !any_gone; i++)
            any_gone = mj_probe_endpoint(nodes.v[i].rec.endpoint, PROBE_MS) == MJ_NODE_GONE;
        if (any_gone || manta_now_ms() >= until) break;
        usleep(100 * 1000);
    }
    for (size_t i = 0; i < nodes.n && any_gone; i++) {
        const manta_reg_node_entry *e = &nodes.v[i];
        if (mj_probe_endpoint(e->rec.endpoint, PROBE_MS) != MJ_NODE_GONE) continue;
        /* Dead for certain: out of the node set, so that the shutdown does
         * not wait on its mailbox. */
        if (manta_reg_node_set_state(j->m, e->id, MANTA_ACTOR_DEAD) != 0 ||
            manta_reg_node_leave(j->m, e->id) != 0)
            say(j, "node %s: %s", e->id, manta_last_error());
        size_t used = strlen(out);
        snprintf(out + used, cap - used,
                 "; node %s (pid %d on %s) is gone: its mailbox refuses connections, and its "
                 "actors died with it",
                 e->id, e->rec.pid, e->rec.host);
    }
    manta_reg_node_list_free(&nodes);
}

/* ---- start ---- */

static int record_job(manta_job_t *j)
{
    manta_ctx *m = j->m;
    /* Claim the job atomically: of two drivers starting it, one wins. */
    int holder = 0;
    int rc = manta_reg_driver_claim(m, (int)getpid(), &holder);
    if (rc == MANTA_EEXIST) {
        char pidbuf[16] = "?";
        if (holder > 0) snprintf(pidbuf, sizeof pidbuf, "%d", holder);
        return manta_fail(MANTA_EEXIST, "job %s is already running (driver pid %s); stop it first",
                          j->spec->job, pidbuf);
    }
    if (rc) return rc;
    j->recorded = true;
    manta_reg_driver *d = calloc(1, sizeof *d);
    if (!d) return manta_fail(MANTA_ENOMEM, "job %s: driver record", j->spec->job);
    d->pid = (int)getpid();
    snprintf(d->host, sizeof d->host, "localhost");
    gethostname(d->host, sizeof d->host - 1);
    size_t used = 0;
    for (size_t i = 0; i < j->o.n_sets && rc == 0; i++) {
        int n = snprintf(d->sets + used, sizeof d->sets - used, "%s\n", j->o.sets[i]);
        if (n < 0 || (size_t)n >= sizeof d->sets - used)
            rc = manta_fail(MANTA_EINVAL, "job %s: the --set overrides are longer than %zu bytes",
                            j->spec->job, sizeof d->sets - 1);
        else
            used += (size_t)n;
    }
    const char *spec = j->o.spec_path ? j->o.spec_path : "",
               *dir = j->o.run_dir ? j->o.run_dir : "";
    if (rc == 0 && (strlen(spec) >= sizeof d->spec || strlen(dir) >= sizeof d->run_dir))
        rc = manta_fail(MANTA_EINVAL, "job %s: spec path or run folder longer than %zu bytes",
                        j->spec->job, sizeof d->spec - 1);
    if (rc == 0) {
        snprintf(d->spec, sizeof d->spec, "%s", spec);
        snprintf(d->run_dir, sizeof d->run_dir, "%s", dir);
        rc = manta_reg_driver_write(m, d); /* started_ms 0: now */
    }
    free(d);
    for (size_t g = 0; g < j->spec->n_groups && rc == 0; g++) {
        const manta_spec_group *grp = &j->spec->groups[g];
        rc = manta_reg_group_add(m, grp->name, grp->class_name, grp->replicas);
    }
    return rc;
}

/* Undo record_job after a failed start, so that the name can start again. */
static void unrecord_job(manta_job_t *j)
{
    int rc = manta_reg_driver_forget(j->m);
    for (size_t g = 0; g < j->spec->n_groups && rc == 0; g++)
        rc = manta_reg_group_forget(j->m, j->spec->groups[g].name);
    if (rc) say(j, "job %s: removing its records: %s", j->spec->job, manta_last_error());
}

/* Place every replica, then start them all at once and wait for them. */
static int start_all_replicas(manta_job_t *j)
{
    const manta_spec *s = j->spec;
    manta_spec_demand *dem = calloc(s->n_groups, sizeof *dem);
    if (!dem) return manta_fail(MANTA_ENOMEM, "demands of %zu groups", s->n_groups);
    manta_spec_demands(s, dem);
    size_t total = manta_spec_total_replicas(dem, s->n_groups);
    size_t *node_of = calloc(total ? total : 1, sizeof *node_of);
    manta_actor **actors = calloc(total ? total : 1, sizeof *actors);
    node_list nl = {0};
    int rc = !node_of || !actors ? manta_fail(MANTA_ENOMEM, "%zu replicas", total) : 0;
    if (rc == 0 && total) rc = place(j, dem, s->n_groups, false, true, &nl, node_of);
    int64_t t0 = manta_now_ms();
    size_t k = 0;
    for (size_t g = 0; g < s->n_groups && rc == 0 && total; g++)
        for (int r = 0; r < s->groups[g].replicas && rc == 0; r++, k++)
            rc = start_replica(j, g, r, nl.ids[node_of[k]], &actors[k]);
    if (rc == 0) rc = wait_all_ready(j, actors, total, 0);
    if (rc == 0)
        say(j, "job %s: %zu actors ready in %.2f s on %zu node(s)", s->job, total,
            (double)(manta_now_ms() - t0) / 1000, j->nodes);
    nodes_free(&nl);
    free(dem), free(node_of), free(actors);
    return rc;
}

static manta_job_t *job_new(manta_ctx *m, const manta_spec *spec, const manta_job_options *o)
{
    manta_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        manta_fail(MANTA_ENOMEM, "job %s", spec->job);
        return NULL;
    }
    j->m = m;
    j->spec = spec;
    if (o) j->o = *o;
    return j;
}

int manta_job_start(manta_ctx *m, const manta_spec *spec, const manta_job_options *o,
                    manta_job_t **out)
{
    if (out) *out = NULL;
    if (!m || !spec || !out) return manta_fail(MANTA_EINVAL, "manta_job_start: NULL argument");
    if (manta_attached(m))
        return manta_fail(MANTA_EINVAL,
                          "manta_job_start: job %s: the ctx is attached to another "
                          "driver's job (use manta_job_attach)",
                          spec->job);
    manta_job_t *j = job_new(m, spec, o);
    if (!j) return MANTA_ENOMEM;
    /* What the program chose where the spec said nothing (a GPU share), said once. */
    char told[1024];
    describe_derived(spec, NULL, 0, told, sizeof told);
    if (told[0]) say(j, "%s", told);
    int rc = record_job(j);
    if (rc == 0 && !j->o.no_services)
        rc = mj_services_start(spec, j->o.log_dir, j->o.interrupt, j->o.log, &j->sv);
    if (rc == 0) rc = start_all_replicas(j);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", manta_last_error());
        manta_job_free(j);
        return manta_fail(rc, "%s", why);
    }
    /* While the job runs, nodes that stop heart-beating are declared dead
     * and their actors re-created on nodes with room. */
    if (!j->o.no_watchdog) j->watchdog = manta_timer_add(m, WATCH_EVERY_MS, watchdog, j);
    *out = j;
    return 0;
}

/* ---- attach ---- */

/* The recorded overrides (one a line, in `buf`, cut in place) then extra. */
static const char **attach_sets(char *buf, const manta_spec_options *so, size_t *n)
{
    size_t cap = (so ? so->n_sets : 0) + 1;
    for (const char *p = buf; *p; p++) cap += *p == '\n';
    const char **v = calloc(cap, sizeof *v);
    if (!v) return NULL;
    *n = 0;
    for (char *p = buf, *nl; *p && (nl = strchr(p, '\n')); p = nl + 1) {
        *nl = 0;
        v[(*n)++] = p;
    }
    for (size_t i = 0; so && i < so->n_sets; i++) v[(*n)++] = so->sets[i];
    return v;
}

int manta_job_attach(manta_ctx *m, const manta_spec_options *so, manta_spec_errors *errs,
                     manta_job_t **out)
{
    if (out) *out = NULL;
    if (!m || !out) return manta_fail(MANTA_EINVAL, "manta_job_attach: NULL argument");
    manta_reg_driver *d = malloc(sizeof *d);
    if (!d) return manta_fail(MANTA_ENOMEM, "driver record of job %s", manta_job(m));
    int drc = manta_reg_driver_read(m, d);
    if (drc == 0 && !d->spec[0])
        drc = manta_fail(MANTA_ENOTFOUND, "job %s was started without a spec file to attach with",
                         manta_job(m));
    char spec_path[sizeof d->spec];
    snprintf(spec_path, sizeof spec_path, "%s", d->spec);
    char *sets = drc == 0 ? strdup(d->sets) : NULL;
    free(d);
    if (drc) return drc; /* ENOTFOUND: "job J is not running" */
    size_t n = 0;
    const char **v = sets ? attach_sets(sets, so, &n) : NULL;
    if (!v) {
        free(sets);
        return manta_fail(MANTA_ENOMEM, "overrides of job %s", manta_job(m));
    }
    manta_spec_options o = so ? *so : (manta_spec_options){0};
    o.sets = v;
    o.n_sets = n;
    manta_spec_errors own;
    manta_spec_errors_init(&own);
    manta_spec *spec = manta_spec_load_file(spec_path, &o, errs ? errs : &own);
    free(v), free(sets);
    int rc = spec ? 0 : mj_spec_fail(errs ? errs : &own, spec_path);
    manta_spec_errors_destroy(&own);
    if (rc) return rc;
    manta_job_t *j = job_new(m, spec, NULL);
    if (!j) {
        manta_spec_free(spec);
        return MANTA_ENOMEM;
    }
    j->owned = spec;
    *out = j;
    return 0;
}

/* ---- scale and drain ---- */

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The indices I of the GROUP-I in the directory, sorted; *n of them. */
static int replicas_present(manta_job_t *j, const char *group, int **out, size_t *n)
{
    manta_reg_names names;
    int rc = manta_reg_actor_names(j->m, &names);
    if (rc) return rc;
    int *idx = malloc((names.n + 1) * sizeof *idx);
    if (!idx) {
        manta_reg_names_free(&names);
        return manta_fail(MANTA_ENOMEM, "replicas of %s", group);
    }
    size_t glen = strlen(group), k = 0;
    for (size_t i = 0; i < names.n; i++) {
        const char *an = names.v[i];
        if (strncmp(an, group, glen) || an[glen] != '-') continue;
        char *e;
        errno = 0;
        long v = strtol(an + glen + 1, &e, 10);
        if (*e || e == an + glen + 1 || v < 0 || v > INT_MAX || errno) continue;
        idx[k++] = (int)v;
    }
    manta_reg_names_free(&names);
    qsort(idx, k, sizeof *idx, int_cmp);
    *out = idx;
    *n = k;
    return 0;
}

/* Add `add` replicas at the lowest free indices. */
static int grow(manta_job_t *j, size_t g, const int *have, size_t nhave, int add, int timeout_ms)
{
    const manta_spec_group *grp = &j->spec->groups[g];
    manta_spec_demand d = {grp->name, add, grp->cpu, grp->gpu, grp->memory_bytes};
    size_t *node_of = calloc((size_t)add, sizeof *node_of);
    manta_actor **made = calloc((size_t)add, sizeof *made);
    node_list nl = {0};
    int rc = !node_of || !made ? manta_fail(MANTA_ENOMEM, "%d new replicas", add) : 0;
    if (rc == 0) rc = place(j, &d, 1, true, false, &nl, node_of);
    size_t at = 0, n = 0;
    for (int idx = 0; rc == 0 && (int)n < add; idx++) {
        while (at < nhave && have[at] < idx) at++;
        if (at < nhave && have[at] == idx) continue;
        rc = start_replica(j, g, idx, nl.ids[node_of[n]], &made[n]);
        if (rc == 0) n++;
    }
    if (rc == 0) rc = wait_all_ready(j, made, n, timeout_ms);
    nodes_free(&nl);
    free(node_of), free(made);
    return rc;
}

/* Drain the `drop` highest-numbered replicas all at once, then stop them. */
static int shrink(manta_job_t *j, const char *group, const int *have, size_t nhave, int drop,
                  int timeout_ms)
{
    manta_actor **victims = calloc((size_t)drop, sizeof *victims);
    manta_future **fs = calloc((size_t)drop, sizeof *fs);
    if (!victims || !fs) {
        free(victims), free(fs);
        return manta_fail(MANTA_ENOMEM, "draining %d replicas", drop);
    }
    size_t nv = 0;
    for (size_t i = nhave; i-- > 0 && (int)nv < drop;) {
        char an[128];
        snprintf(an, sizeof an, "%s-%d", group, have[i]);
        if (manta_actor_lookup(j->m, an, &victims[nv]) != 0) continue;
        fs[nv] = manta_call_timeout(j->m, victims[nv], "drain", NULL, 0, timeout_ms);
        if (fs[nv]) nv++;
    }
    manta_wait(fs, nv, nv, -1);
    int rc = 0;
    for (size_t i = 0; i < nv; i++) {
        int st = manta_future_status(fs[i]);
        if (st != 0 && st != MANTA_ENOMETHOD && rc == 0)
            rc = manta_fail(st, "drain %s: %s", manta_actor_name(victims[i]),
                            manta_future_error(fs[i]));
        manta_future_free(fs[i]);
        int sr = manta_actor_stop(j->m, victims[i], STOP_MS);
        if (sr && rc == 0)
            rc = manta_fail(sr, "stop %s: %s", manta_actor_name(victims[i]), manta_last_error());
    }
    free(victims), free(fs);
    return rc;
}

int manta_job_scale(manta_job_t *job, const char *group, int n, int timeout_ms)
{
    if (!job || !group || n < 0)
        return manta_fail(MANTA_EINVAL, "manta_job_scale: %s", n < 0 ? "n < 0" : "NULL argument");
    size_t g = group_index(job->spec, group);
    if (g == job->spec->n_groups)
        return manta_fail(MANTA_ENOTFOUND, "job %s has no group '%s'", job->spec->job, group);
    int *have = NULL;
    size_t nhave = 0;
    int rc = replicas_present(job, group, &have, &nhave);
    if (rc) return rc;
    if ((size_t)n > nhave)
        rc = grow(job, g, have, nhave, n - (int)nhave, timeout_ms);
    else if ((size_t)n < nhave)
        rc = shrink(job, group, have, nhave, (int)nhave - n,
                    timeout_ms > 0 ? timeout_ms : DEFAULT_DRAIN_MS);
    free(have);
    if (rc) return rc;
    return manta_reg_group_set_wanted(job->m, group, n);
}

int manta_job_replicas(manta_job_t *job, const char *group)
{
    if (!job || !group) return manta_fail(MANTA_EINVAL, "manta_job_replicas: NULL argument");
    if (group_index(job->spec, group) == job->spec->n_groups)
        return manta_fail(MANTA_ENOTFOUND, "job %s has no group '%s'", job->spec->job, group);
    int *have = NULL;
    size_t n = 0;
    int rc = replicas_present(job, group, &have, &n);
    free(have);
    return rc ? rc : (int)n;
}

int manta_job_drain(manta_job_t *job, const char *actor, int timeout_ms)
{
    if (!job || !actor) return manta_fail(MANTA_EINVAL, "manta_job_drain: NULL argument");
    manta_actor *a;
    if (manta_actor_lookup(job->m, actor, &a) != 0)
        return manta_fail(MANTA_ENOTFOUND, "job %s has no actor %s", job->spec->job, actor);
    manta_future *f = manta_call_timeout(job->m, a, "drain", NULL, 0,
                                         timeout_ms > 0 ? timeout_ms : DEFAULT_DRAIN_MS);
    int st = f ? manta_get(f, -1, NULL, NULL) : MANTA_ENOMEM;
    int rc = 0;
    if (st != 0 && st != MANTA_ENOMETHOD)
        rc = manta_fail(st, "drain %s: %s", actor, f ? manta_future_error(f) : "no future");
    manta_future_free(f);
    int sr = manta_actor_stop(job->m, a, STOP_MS);
    if (sr && rc == 0) rc = manta_fail(sr, "stop %s: %s", actor, manta_last_error());
    return rc;
}

/* ---- the run method ---- */

typedef struct run_call {
    const char *group, *method;
    double timeout_s;
} run_call;

static bool run_section(const manta_spec *s, run_call *rc)
{
    const manta_spec_node *run = manta_spec_find(s->root, "run");
    if (!run) return false;
    *rc = (run_call){NULL, "run", 3600};
    manta_spec_get_str(run, "group", NULL, &rc->group, NULL);
    manta_spec_get_str(run, "method", "run", &rc->method, NULL);
    manta_spec_get_double(run, "timeout_s", 3600, &rc->timeout_s, NULL);
    return true;
}

int manta_job_run_method(manta_job_t *job, manta_future **out)
{
    if (out) *out = NULL;
    if (!job || !out) return manta_fail(MANTA_EINVAL, "manta_job_run_method: NULL argument");
    run_call rc;
    if (!run_section(job->spec, &rc))
        return manta_fail(MANTA_ENOTFOUND, "%s: no run: section", job->spec->file);
    char name[128];
    snprintf(name, sizeof name, "%s-0", rc.group ? rc.group : "");
    manta_actor *a;
    if (!rc.group || manta_actor_lookup(job->m, name, &a) != 0)
        return manta_fail(MANTA_ENOTFOUND, "run: no actor %s to call", name);
    *out = manta_call_timeout(job->m, a, rc.method, NULL, 0, (int)(rc.timeout_s * 1000));
    return *out ? 0 : manta_fail(MANTA_ENOMEM, "run: calling %s.%s", name, rc.method);
}

/* One step of a wait: up to `ms` on the run call, or on the loop. */
static int wait_step(manta_job_t *job, int ms)
{
    if (job->run) return manta_get(job->run, ms, NULL, NULL);
    manta_poll(job->m, ms);
    return MANTA_EPENDING;
}

static int run_answer(manta_job_t *job, int st, const void **reply, size_t *len)
{
    if (st == 0) return manta_get(job->run, 0, reply, len);
    run_call rc;
    run_section(job->spec, &rc);
    char cause[1536] = "";
    if (st == MANTA_EDIED || st == MANTA_ETIMEDOUT) {
        diagnose(job, cause, sizeof cause);
    } else {
        /* The run method failed of its own accord, maybe because a group it needs is gone (a
         * controller that counts the errors of its calls can give up before the next watchdog
         * tick): look at the groups now and name it. */
        if (!job->fatal && !job->redis_down_since) watch_groups(job);
        if (job->fatal) snprintf(cause, sizeof cause, "; %s", job->fatal_msg);
    }
    return manta_fail(st, "%s-0.%s: %s: %s%s", rc.group, rc.method, manta_strerror(st),
                      manta_future_error(job->run), cause);
}

int manta_job_wait(manta_job_t *job, int timeout_ms, const void **reply, size_t *len)
{
    if (reply) *reply = NULL;
    if (len) *len = 0;
    if (!job) return manta_fail(MANTA_EINVAL, "manta_job_wait: NULL job");
    run_call rcall;
    if (!job->run && run_section(job->spec, &rcall)) {
        int rc = manta_job_run_method(job, &job->run);
        if (rc) return rc;
    }
    int64_t t0 = manta_now_ms(), until = timeout_ms < 0 ? INT64_MAX : t0 + timeout_ms;
    for (;;) {
        if (interrupted(job))
            return manta_fail(MANTA_ECLOSED, "job %s: interrupted", job->spec->job);
        if (job->stopped) {
            job->stopped = false;
            if (!job->run) return 0;
            return manta_fail(MANTA_ECLOSED, "job %s: stopped", job->spec->job);
        }
        if (job->fatal) return manta_fail(job->fatal, "%s", job->fatal_msg);
        int64_t left = until - manta_now_ms();
        if (left <= 0) return MANTA_EPENDING;
        int st = wait_step(job, left < 100 ? (int)left : 100);
        if (st != MANTA_EPENDING) return run_answer(job, st, reply, len);
        if (job->o.tick) job->o.tick(job, (double)(manta_now_ms() - t0) / 1000, job->o.tick_arg);
    }
}

void manta_job_stop(manta_job_t *job)
{
    if (job) job->stopped = true;
}

void manta_job_free(manta_job_t *job)
{
    if (!job) return;
    if (job->watchdog) manta_timer_cancel(job->m, job->watchdog);
    if (job->recorded) unrecord_job(job);
    mj_services_stop(job->sv);
    manta_future_free(job->run);
    manta_spec_free(job->owned);
    free(job);
}

const manta_spec *manta_job_spec(const manta_job_t *job)
{
    return job ? job->spec : NULL;
}

manta_ctx *manta_job_ctx(const manta_job_t *job)
{
    return job ? job->m : NULL;
}

size_t manta_job_node_count(const manta_job_t *job)
{
    return job ? job->nodes : 0;
}
