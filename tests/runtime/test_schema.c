/*
 * test_schema.c -- the Redis schema, the Redis URL parser and ACL users,
 * against real redis-servers.
 *
 *   - addresses: redis://host takes the default port; users, passwords with
 *     escapes, IPv6 and databases round-trip through parse and format;
 *   - ACL: a redis-server whose default user is off and whose only user is
 *     alice; manta_init with redis://alice:pw@host:port/db starts a job
 *     whose actors (separate processes, handed the URL) authenticate too;
 *     a wrong password fails with an error naming the user;
 *   - records: the typed reads and writes of actor, node, driver and group
 *     records and their state names; a lost actor's record; the node list
 *     in id order with heartbeat ages; the driver claim, taken once and
 *     refused to a second driver; groups listed in the order added; the
 *     job values listed; the records a failed start removes;
 *   - references: several actor processes and the driver add and drop
 *     references to the same objects at once; the count stays exact, and of
 *     many concurrent last releases exactly one frees the object.
 */
#include "manta.h"
#include "manta_schema.h"
#include "testutil.h"

#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static test_redis redis;

/* ---- an actor that churns references ---- */

typedef struct churn_arg {
    manta_obj_id id;
    int rounds;
} churn_arg;

/* ref then release, `rounds` times: the count must come back where it was. */
static int m_churn(manta_req *c, void *st, const void *arg, size_t len)
{
    if (len != sizeof(churn_arg)) return MANTA_EINVAL;
    churn_arg a;
    memcpy(&a, arg, sizeof a);
    manta_ctx *m = manta_req_ctx(c);
    for (int i = 0; i < a.rounds; i++) {
        int rc = manta_obj_ref(m, &a.id);
        if (rc == 0) rc = manta_obj_release(m, &a.id);
        if (rc) return manta_reply_error(c, rc, "round %d: %s", i, manta_last_error());
    }
    return 0;
}

/* Drop one reference; answer 1 if this release freed the object. */
static int m_drop(manta_req *c, void *st, const void *arg, size_t len)
{
    if (len != sizeof(manta_obj_id)) return MANTA_EINVAL;
    manta_obj_id id;
    memcpy(&id, arg, sizeof id);
    char owner[192];
    int freed = 0;
    int rc = manta_reg_obj_release(manta_req_ctx(c), id.s, &freed, owner, sizeof owner);
    if (rc) return manta_reply_error(c, rc, "%s", manta_last_error());
    return manta_reply(c, &freed, sizeof freed);
}

/* Add one reference; answer the code. */
static int m_ref(manta_req *c, void *st, const void *arg, size_t len)
{
    if (len != sizeof(manta_obj_id)) return MANTA_EINVAL;
    manta_obj_id id;
    memcpy(&id, arg, sizeof id);
    int rc = manta_obj_ref(manta_req_ctx(c), &id);
    return manta_reply(c, &rc, sizeof rc);
}

static int m_ping(manta_req *c, void *st, const void *arg, size_t len)
{
    return manta_reply(c, "pong", 4);
}

static const manta_method h_methods[] = {
    {"churn", m_churn}, {"drop", m_drop}, {"ref", m_ref}, {"ping", m_ping}, {NULL, NULL}};
static const manta_class hclass = {"hammer", 0, NULL, NULL, h_methods};
static const manta_class *const classes[] = {&hclass, NULL};

static manta_ctx *start_job(const char *url, const char *job)
{
    manta_ctx *m = NULL;
    manta_options o = {.redis_url = url, .job = job, .classes = classes, .call_timeout_ms = 30000};
    int rc = manta_init(&m, &o);
    if (rc) fprintf(stderr, "manta_init %s: %s\n", url, manta_last_error());
    assert_int_equal(rc, 0);
    return m;
}

static manta_actor *make(manta_ctx *m, const char *name)
{
    manta_actor *a = NULL;
    int rc = manta_actor_create(m, &(manta_actor_options){.cls = "hammer", .name = name}, &a);
    if (rc) fprintf(stderr, "create %s: %s\n", name, manta_last_error());
    assert_int_equal(rc, 0);
    return a;
}

/* ---- addresses ---- */

static void test_url_parse_and_format(void **unused)
{
    manta_redis_addr a;
    char why[128], url[512];
    assert_int_equal(manta_redis_url_parse("redis://cache.local", &a, why, sizeof why), 0);
    assert_string_equal(a.host, "cache.local");
    assert_int_equal(a.port, MANTA_REDIS_DEFAULT_PORT);
    assert_int_equal(a.port, 6379);
    assert_string_equal(a.user, "");
    assert_int_equal(a.db, 0);

    assert_int_equal(
        manta_redis_url_parse("redis://alice:p%40ss%3Aw@10.1.2.3:7001/4", &a, why, sizeof why), 0);
    assert_string_equal(a.user, "alice");
    assert_string_equal(a.password, "p@ss:w");
    assert_int_equal(a.port, 7001);
    assert_int_equal(a.db, 4);
    assert_int_equal(manta_redis_url_format(&a, url, sizeof url), 0);
    assert_string_equal(url, "redis://alice:p%40ss%3Aw@10.1.2.3:7001/4");

    assert_int_equal(manta_redis_url_parse("redis://[::1]", &a, why, sizeof why), 0);
    assert_int_equal(manta_redis_url_format(&a, url, sizeof url), 0);
    assert_string_equal(url, "redis://[::1]:6379");

    /* Every formatted address parses back to itself. */
    manta_redis_addr b = {.port = 1, .db = 9};
    snprintf(b.host, sizeof b.host, "h");
    snprintf(b.user, sizeof b.user, "u s/e@r");
    snprintf(b.password, sizeof b.password, "%%:@/?#[] x");
    assert_int_equal(manta_redis_url_format(&b, url, sizeof url), 0);
    assert_int_equal(manta_redis_url_parse(url, &a, why, sizeof why), 0);
    assert_memory_equal(&a, &b, sizeof a);

    char tiny[12];
    assert_int_equal(manta_redis_url_format(&b, tiny, sizeof tiny), MANTA_EINVAL);

    assert_int_equal(manta_redis_url_parse("redis://h:99999", &a, why, sizeof why), MANTA_EINVAL);
    assert_string_equal(why, "port out of range");
    assert_non_null(strstr(manta_last_error(), "redis://h:99999"));
    assert_non_null(strstr(manta_last_error(), "port out of range"));
}

/* ---- ACL users ---- */

/* Count a job's keys in database `db`, authenticating as alice. */
static long count_as_alice(const test_redis *r, int db, const char *job)
{
    redisContext *c = redisConnect("127.0.0.1", r->port);
    if (!c || c->err) return -1;
    redisReply *rep = redisCommand(c, "AUTH alice pw");
    freeReplyObject(rep);
    freeReplyObject(redisCommand(c, "SELECT %d", db));
    rep = redisCommand(c, "KEYS manta:%s:*", job);
    long n = rep && rep->type == REDIS_REPLY_ARRAY ? (long)rep->elements : -1;
    freeReplyObject(rep);
    redisFree(c);
    return n;
}

static void test_acl_user(void **unused)
{
    test_redis acl;
    static const char *const extra[] = {"--user", "default", "off", "--user", "alice", "on",
                                        ">pw",    "~*",      "&*",  "+@all",  NULL};
    test_redis_start_args(&acl, extra);
    char url[256];

    /* The right user: driver, node agent and actor all authenticate. */
    snprintf(url, sizeof url, "redis://alice:pw@127.0.0.1:%d/2", acl.port);
    manta_ctx *m = start_job(url, "acl-ok");
    manta_actor *a = make(m, "pinger");
    manta_future *f = manta_call(m, a, "ping", NULL, 0);
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, 10000, &d, &n), 0);
    assert_memory_equal(d, "pong", 4);
    manta_future_free(f);
    assert_true(count_as_alice(&acl, 2, "acl-ok") > 0);
    assert_int_equal(count_as_alice(&acl, 0, "acl-ok"), 0);
    manta_shutdown(m);
    assert_int_equal(count_as_alice(&acl, 2, "acl-ok"), 0);

    /* A wrong password: a clear error naming the user and the server. */
    snprintf(url, sizeof url, "redis://alice:wrong@127.0.0.1:%d", acl.port);
    m = NULL;
    assert_int_equal(manta_init(&m, &(manta_options){.redis_url = url, .classes = classes}),
                     MANTA_EREDIS);
    assert_null(m);
    assert_non_null(strstr(manta_last_error(), "AUTH as user 'alice' failed"));
    assert_non_null(strstr(manta_last_error(), "127.0.0.1"));

    /* No user at all, on a server whose default user is off. */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", acl.port);
    assert_int_equal(manta_init(&m, &(manta_options){.redis_url = url, .classes = classes}),
                     MANTA_EREDIS);
    assert_non_null(strstr(manta_last_error(), "NOAUTH"));

    /* The parsed form, as the CLI and the spec pass it. */
    manta_redis_addr addr;
    snprintf(url, sizeof url, "redis://alice:pw@127.0.0.1:%d", acl.port);
    assert_int_equal(manta_redis_url_parse(url, &addr, NULL, 0), 0);
    assert_int_equal(manta_init(&m, &(manta_options){.redis = &addr,
                                                     .redis_url = "redis://ignored:1",
                                                     .no_local_node = 1,
                                                     .classes = classes}),
                     0);
    assert_string_equal(manta_redis_url(m), url);
    manta_shutdown(m);
    test_redis_stop(&acl);
}

/* ---- records ---- */

static void test_records(void **unused)
{
    for (int s = MANTA_ACTOR_STARTING; s <= MANTA_ACTOR_STOPPED; s++)
        assert_int_equal(manta_actor_state_parse(manta_actor_state_name(s)), s);
    assert_int_equal(manta_actor_state_parse("zombie"), MANTA_ACTOR_UNKNOWN);
    assert_string_equal(manta_actor_state_name((manta_actor_state)99), "unknown");

    manta_ctx *m = start_job(redis.url, "records");
    char key[MANTA_REG_KEY_MAX], big[400];
    assert_int_equal(manta_reg_key(m, MANTA_REG_ACTOR, "x", key, sizeof key), 0);
    assert_string_equal(key, "manta:records:actor:x");
    assert_int_equal(manta_reg_key(m, MANTA_REG_ACTORS, NULL, key, sizeof key), 0);
    assert_string_equal(key, "manta:records:actors");
    assert_int_equal(manta_reg_key(m, MANTA_REG_ACTOR, NULL, key, sizeof key), MANTA_EINVAL);
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(manta_reg_key(m, MANTA_REG_OBJ, big, key, sizeof key), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "longer than"));

    /* An actor's record, as the node agent writes it and the actor updates it. */
    manta_actor *a = make(m, "rec");
    manta_reg_actor rec;
    assert_int_equal(manta_reg_actor_read(m, "rec", &rec), 0);
    assert_int_equal(rec.info.state, MANTA_ACTOR_ALIVE);
    assert_string_equal(rec.cls, "hammer");
    assert_int_equal(rec.info.incarnation, 1);
    assert_true(rec.info.pid > 0);
    assert_true(rec.info.endpoint[0] != 0);
    manta_actor_info info;
    assert_int_equal(manta_actor_info_get(m, a, &info), 0);
    assert_int_equal(info.state, MANTA_ACTOR_ALIVE);
    assert_int_equal(manta_reg_actor_set_placement(m, "rec", "g", 1.5, 2, 4096), 0);
    assert_int_equal(manta_reg_actor_read(m, "rec", &rec), 0);
    assert_string_equal(rec.group, "g");
    assert_true(rec.cpu == 1.5 && rec.gpu == 2 && rec.memory == 4096);
    assert_int_equal(manta_reg_actor_claim(m, "rec", "hammer"), MANTA_EEXIST);
    manta_reg_actor none;
    assert_int_equal(manta_reg_actor_read(m, "nobody", &none), MANTA_ENOTFOUND);
    assert_int_equal(none.info.state, MANTA_ACTOR_UNKNOWN);
    manta_reg_names names;
    assert_int_equal(manta_reg_actor_names(m, &names), 0);
    assert_int_equal(names.n, 1);
    assert_string_equal(names.v[0], "rec");
    manta_reg_names_free(&names);

    /* An actor whose node died with no room elsewhere: dead, still listed. */
    assert_int_equal(manta_reg_actor_mark_lost(m, "lost-1", "hammer", "gone", "its node died"), 0);
    manta_reg_actor lost;
    assert_int_equal(manta_reg_actor_read(m, "lost-1", &lost), 0);
    assert_int_equal(lost.info.state, MANTA_ACTOR_DEAD);
    assert_string_equal(lost.info.node, "gone");
    assert_string_equal(lost.cls, "hammer");
    assert_string_equal(lost.error, "its node died");
    assert_int_equal(manta_reg_actor_names(m, &names), 0);
    assert_int_equal(names.n, 2);
    manta_reg_names_free(&names);
    assert_int_equal(manta_reg_actor_forget(m, "lost-1"), 0);
    assert_int_equal(manta_reg_actor_read(m, "lost-1", &lost), MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_actor_names(m, &names), 0);
    assert_int_equal(names.n, 1);
    manta_reg_names_free(&names);

    /* The local node agent's record. */
    assert_int_equal(manta_reg_node_ids(m, &names), 0);
    assert_int_equal(names.n, 1);
    manta_reg_node node;
    assert_int_equal(manta_reg_node_read(m, names.v[0], &node), 0);
    assert_int_equal(node.state, MANTA_ACTOR_ALIVE);
    assert_true(node.cpu >= 1 && node.memory > 0 && node.pid > 0);
    assert_string_equal(node.transport, "ipc");
    assert_true(node.endpoint[0] != 0);
    assert_string_equal(rec.info.node, names.v[0]);

    /* The node list: every node with its record and heartbeat age, by id. */
    manta_reg_node other = {.cpu = 3, .gpu = 1, .memory = 1 << 20, .pid = 7};
    snprintf(other.endpoint, sizeof other.endpoint, "tcp://127.0.0.1:1");
    snprintf(other.host, sizeof other.host, "elsewhere");
    snprintf(other.transport, sizeof other.transport, "tcp");
    assert_int_equal(manta_reg_node_register(m, "0-other", &other), 0);
    manta_reg_node_list nl;
    assert_int_equal(manta_reg_node_list_read(m, &nl), 0);
    assert_int_equal(nl.n, 2);
    assert_string_equal(nl.v[0].id, "0-other"); /* '0' sorts before the local id */
    assert_string_equal(nl.v[1].id, names.v[0]);
    assert_int_equal(nl.v[0].rec.state, MANTA_ACTOR_ALIVE);
    assert_true(nl.v[0].rec.cpu == 3 && nl.v[0].rec.gpu == 1 && nl.v[0].rec.memory == 1 << 20);
    assert_string_equal(nl.v[0].rec.host, "elsewhere");
    for (size_t i = 0; i < nl.n; i++) assert_true(nl.v[i].age_ms >= 0 && nl.v[i].age_ms < 10000);
    manta_reg_node_list_free(&nl);
    assert_int_equal(manta_reg_node_set_state(m, "0-other", MANTA_ACTOR_DEAD), 0);
    assert_int_equal(manta_reg_node_read(m, "0-other", &node), 0);
    assert_int_equal(node.state, MANTA_ACTOR_DEAD);
    assert_int_equal(manta_reg_node_forget(m, "0-other"), 0);
    assert_int_equal(manta_reg_node_read(m, "0-other", &node), MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_node_list_read(m, &nl), 0);
    assert_int_equal(nl.n, 1);
    assert_string_equal(nl.v[0].id, names.v[0]);
    manta_reg_node_list_free(&nl);
    manta_reg_names_free(&names);

    /* The job's driver and group records (the job module's). */
    manta_reg_driver drv = {.pid = 42, .started_ms = 1234};
    snprintf(drv.spec, sizeof drv.spec, "/x/job.yaml");
    snprintf(drv.sets, sizeof drv.sets, "a=1\nb=2\n");
    assert_int_equal(manta_reg_driver_read(m, &drv), MANTA_ENOTFOUND);
    /* The claim: one driver gets it, a second is refused and told who holds
     * it, and its ctx then leaves the job alone at shutdown. */
    int holder = -1;
    assert_int_equal(manta_reg_driver_claim(m, 42, &holder), 0);
    assert_int_equal(holder, 0);
    manta_ctx *second = NULL;
    manta_options so = {.redis_url = redis.url, .job = "records", .classes = classes, .attach = 1};
    assert_int_equal(manta_init(&second, &so), 0);
    assert_int_equal(manta_reg_driver_claim(second, 43, &holder), MANTA_EEXIST);
    assert_int_equal(holder, 42);
    assert_non_null(strstr(manta_last_error(), "pid 42"));
    assert_true(manta_attached(second));
    manta_shutdown(second);
    assert_int_equal(manta_reg_driver_read(m, &drv), 0);
    assert_int_equal(drv.pid, 42);
    drv.pid = 42, drv.started_ms = 1234;
    snprintf(drv.spec, sizeof drv.spec, "/x/job.yaml");
    snprintf(drv.sets, sizeof drv.sets, "a=1\nb=2\n");
    assert_int_equal(manta_reg_driver_write(m, &drv), 0);
    manta_reg_driver back;
    assert_int_equal(manta_reg_driver_read(m, &back), 0);
    assert_int_equal(back.pid, 42);
    assert_int_equal(back.started_ms, 1234);
    assert_string_equal(back.sets, "a=1\nb=2\n");
    assert_int_equal(manta_reg_group_add(m, "learners", "hammer", 2), 0);
    assert_int_equal(manta_reg_group_add(m, "actors", "hammer", 3), 0);
    assert_int_equal(manta_reg_group_set_wanted(m, "actors", 5), 0);
    char cls[32];
    int wanted;
    assert_int_equal(manta_reg_group_read(m, "actors", cls, sizeof cls, &wanted), 0);
    assert_string_equal(cls, "hammer");
    assert_int_equal(wanted, 5);
    assert_int_equal(manta_reg_group_read(m, "nope", cls, sizeof cls, &wanted), MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_group_names(m, &names), 0);
    assert_int_equal(names.n, 2);
    assert_string_equal(names.v[0], "learners");
    assert_string_equal(names.v[1], "actors");
    manta_reg_names_free(&names);
    /* started 0: stamped now. */
    drv.started_ms = 0;
    assert_int_equal(manta_reg_driver_write(m, &drv), 0);
    assert_int_equal(manta_reg_driver_read(m, &back), 0);
    assert_true(manta_reg_age_ms(back.started_ms) >= 0 &&
                manta_reg_age_ms(back.started_ms) < 10000);
    /* A failed start's undo: driver, group list and groups go. */
    assert_int_equal(manta_reg_driver_forget(m), 0);
    assert_int_equal(manta_reg_group_forget(m, "learners"), 0);
    assert_int_equal(manta_reg_group_forget(m, "actors"), 0);
    assert_int_equal(manta_reg_driver_read(m, &back), MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_group_read(m, "actors", cls, sizeof cls, &wanted), MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_group_names(m, &names), 0);
    assert_int_equal(names.n, 0);
    manta_reg_names_free(&names);
    assert_int_equal(manta_reg_driver_claim(m, 44, &holder), 0); /* free again */
    assert_int_equal(manta_reg_driver_forget(m), 0);

    /* The job values, for `manta status`. */
    assert_int_equal(manta_reg_kv_names(m, &names), 0);
    assert_int_equal(names.n, 0);
    assert_int_equal(manta_kv_set(m, "alpha", "1", 1), 0);
    assert_int_equal(manta_kv_set(m, "beta.2", "22", 2), 0);
    assert_int_equal(manta_reg_kv_names(m, &names), 0);
    assert_int_equal(names.n, 2);
    int alpha_first = !strcmp(names.v[0], "alpha");
    assert_string_equal(names.v[alpha_first ? 0 : 1], "alpha");
    assert_string_equal(names.v[alpha_first ? 1 : 0], "beta.2");
    manta_reg_names_free(&names);

    /* A collective group's rendezvous. */
    assert_int_equal(manta_reg_coll_join(m, "g", 2, 0), 0);
    assert_int_equal(manta_reg_coll_join(m, "g", 3, 1), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "rank 1 says world 3"));
    char seen[2] = {0}, ep[64];
    int present = 0;
    assert_int_equal(manta_reg_coll_seen(m, "g", 2, seen, &present), 0);
    assert_int_equal(present, 1);
    assert_int_equal(manta_reg_coll_join(m, "g", 2, 1), 0);
    assert_int_equal(manta_reg_coll_seen(m, "g", 2, seen, &present), 0);
    assert_int_equal(present, 2);
    assert_int_equal(manta_reg_coll_get_str(m, "g", MANTA_REG_COLL_EP "0", ep, sizeof ep),
                     MANTA_ENOTFOUND);
    assert_int_equal(manta_reg_coll_put(m, "g", MANTA_REG_COLL_EP "0", "ipc://x", 7), 0);
    assert_int_equal(manta_reg_coll_get_str(m, "g", MANTA_REG_COLL_EP "0", ep, sizeof ep), 0);
    assert_string_equal(ep, "ipc://x");
    assert_int_equal(manta_reg_coll_get(m, "g", MANTA_REG_COLL_EP "0", ep, 3), MANTA_EPROTO);
    assert_int_equal(manta_reg_coll_leave(m, "g", 0, 2, 1), 0);
    assert_int_equal(test_redis_count(&redis, "manta:records:coll:g"), 1);
    assert_int_equal(manta_reg_coll_leave(m, "g", 1, 2, 1), 0);
    assert_int_equal(test_redis_count(&redis, "manta:records:coll:g"), 0);
    assert_int_equal(manta_reg_coll_join(m, "h", 2, 1), 0);
    assert_int_equal(manta_reg_coll_leave(m, "h", 1, 2, 0), 0);
    assert_int_equal(test_redis_count(&redis, "manta:records:coll:*"), 0);

    /* A value too long for its typed field is an error, not a cut. */
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_non_null(c);
    freeReplyObject(redisCommand(c, "HSET manta:records:actor:rec group %s", big));
    redisFree(c);
    assert_int_equal(manta_reg_actor_read(m, "rec", &rec), MANTA_EPROTO);
    assert_non_null(strstr(manta_last_error(), "field group"));

    manta_shutdown(m);
    assert_int_equal(test_redis_count(&redis, "manta:records:*"), 0);
}

/* ---- references under concurrency ---- */

enum { NACTORS = 4, ROUNDS = 300 };

static long long refs_of(manta_ctx *m, const manta_obj_id *id)
{
    long long n = -1;
    assert_int_equal(manta_reg_obj_refs(m, id->s, &n), 0);
    return n;
}

/* Every actor churns every object at once, and the driver too. */
static void churn_all(manta_ctx *m, manta_actor **as, const manta_obj_id *ids, size_t nids)
{
    manta_future *fs[NACTORS * 2];
    size_t nf = 0;
    for (int i = 0; i < NACTORS; i++) {
        churn_arg ca = {.id = ids[i % nids], .rounds = ROUNDS};
        fs[nf++] = manta_call(m, as[i], "churn", &ca, sizeof ca);
    }
    for (int r = 0; r < ROUNDS; r++) {
        assert_int_equal(manta_obj_ref(m, &ids[r % nids]), 0);
        assert_int_equal(manta_obj_release(m, &ids[r % nids]), 0);
    }
    assert_int_equal(manta_wait(fs, nf, nf, 60000), (int)nf);
    for (size_t i = 0; i < nf; i++) {
        if (manta_future_status(fs[i]) != 0) fprintf(stderr, "%s\n", manta_future_error(fs[i]));
        assert_int_equal(manta_future_status(fs[i]), 0);
        manta_future_free(fs[i]);
    }
}

/* K+1 holders release at once: exactly one of them frees. */
static void race_last_release(manta_ctx *m, manta_actor **as, const manta_obj_id *id)
{
    for (int i = 0; i < NACTORS; i++) assert_int_equal(manta_obj_ref(m, id), 0);
    assert_int_equal(refs_of(m, id), NACTORS + 1);
    manta_future *fs[NACTORS];
    for (int i = 0; i < NACTORS; i++) fs[i] = manta_call(m, as[i], "drop", id, sizeof *id);
    char owner[192];
    int freed_here = 0, freed = 0;
    int rc = manta_reg_obj_release(m, id->s, &freed_here, owner, sizeof owner);
    assert_int_equal(rc, 0);
    freed += freed_here;
    assert_int_equal(manta_wait(fs, NACTORS, NACTORS, 30000), NACTORS);
    for (int i = 0; i < NACTORS; i++) {
        const void *d;
        size_t n;
        assert_int_equal(manta_get(fs[i], 0, &d, &n), 0);
        assert_int_equal(n, sizeof(int));
        int f;
        memcpy(&f, d, sizeof f);
        freed += f;
        manta_future_free(fs[i]);
    }
    assert_int_equal(freed, 1);
    long long refs;
    assert_int_equal(manta_reg_obj_refs(m, id->s, &refs), MANTA_ENOTFOUND);
    assert_int_equal(manta_obj_ref(m, id), MANTA_ENOTFOUND);
    assert_int_equal(manta_obj_release(m, id), MANTA_ENOTFOUND);
}

/* A reference added while the last one is released either comes first
 * (the object lives on with one reference) or fails (the object is gone):
 * never a reference to a deleted object, never a record brought back. */
static void race_ref_and_release(manta_ctx *m, manta_actor *a)
{
    int kept = 0, lost = 0;
    for (int i = 0; i < 100; i++) {
        manta_obj_id id;
        assert_int_equal(manta_put(m, "x", 1, &id), 0);
        manta_future *f = manta_call(m, a, "ref", &id, sizeof id);
        assert_int_equal(manta_obj_release(m, &id), 0);
        const void *d;
        size_t n;
        int rc;
        assert_int_equal(manta_get(f, 10000, &d, &n), 0);
        memcpy(&rc, d, sizeof rc);
        manta_future_free(f);
        long long refs = -1;
        int have = manta_reg_obj_refs(m, id.s, &refs);
        if (rc == 0) {
            assert_int_equal(have, 0);
            assert_int_equal(refs, 1);
            assert_int_equal(manta_obj_release(m, &id), 0);
            kept++;
        } else {
            assert_int_equal(rc, MANTA_ENOTFOUND);
            assert_int_equal(have, MANTA_ENOTFOUND);
            lost++;
        }
    }
    assert_int_equal(kept + lost, 100);
}

static void test_concurrent_refs(void **unused)
{
    manta_ctx *m = start_job(redis.url, "refs");
    manta_actor *as[NACTORS];
    for (int i = 0; i < NACTORS; i++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", i);
        as[i] = make(m, name);
    }
    /* One small (inline) and one large (held by the driver) object. */
    size_t big = 200000;
    char *bytes = malloc(big);
    assert_non_null(bytes);
    memset(bytes, 7, big);
    manta_obj_id ids[2];
    assert_int_equal(manta_put(m, "small", 5, &ids[0]), 0);
    assert_int_equal(manta_put(m, bytes, big, &ids[1]), 0);

    churn_all(m, as, ids, 2);
    assert_int_equal(refs_of(m, &ids[0]), 1);
    assert_int_equal(refs_of(m, &ids[1]), 1);

    /* The last release frees: the record, and the owner's bytes. */
    for (int k = 0; k < 2; k++) race_last_release(m, as, &ids[k]);
    race_ref_and_release(m, as[0]);
    void *data;
    size_t len;
    assert_int_equal(manta_obj_get(m, &ids[1], &data, &len, 5000), MANTA_ENOTFOUND);
    assert_int_equal(test_redis_count(&redis, "manta:refs:obj:*"), 0);
    free(bytes);
    manta_shutdown(m);
    assert_int_equal(test_redis_count(&redis, "manta:refs:*"), 0);
}

int main(void)
{
    if (getenv("MANTA_ROLE")) { /* started as an actor or node agent */
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    test_redis_start(&redis);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse_and_format),
        cmocka_unit_test(test_acl_user),
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_concurrent_refs),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
