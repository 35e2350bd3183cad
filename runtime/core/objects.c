/*
 * objects.c -- the object registry: put, get, references.
 *
 * An object is bytes with an id and a reference count, recorded in Redis as
 * manta:JOB:obj:ID {size, refs, data | owner} (schema.c). References
 * change atomically in Redis (one Lua script each), so processes that ref
 * and release the same object at once never lose a count. Small objects (<= 64 KiB)
 * live inline in that record. A large one stays in the memory of the
 * process that put it (its owner), and the record names the owner's object
 * endpoint; fetchers call that endpoint ("get" with the id) and receive the
 * bytes as one frame, sent from the owner's buffer without a copy.
 *
 * The owner's object endpoint is served by a thread of its own, so objects
 * stay fetchable while the owner's event loop is busy (a learner in a
 * training step, a driver between calls). The thread and the main loop share
 * only the table below, under a mutex. A buffer is freed when its object is
 * released and no send of it is still in flight (ZeroMQ tells us through the
 * free callback of zmq_msg_init_data).
 */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct obj {
    char id[40];
    void *data;
    size_t len;
    int pins;     /* sends in flight */
    bool dropped; /* released: free when unpinned */
    struct obj *next;
} obj;

typedef struct mn_objstore {
    pthread_t thread;
    pthread_mutex_t mu;
    obj *objs;
    void *ctl; /* inproc PAIR: tells the thread to stop */
    char endpoint[192];
    manta_ctx *m;
    bool running;
    int total_pins; /* sends in flight over all objects */
} mn_objstore;

/* The free callback needs the store: keep a pointer to it after each obj. */
typedef struct pinned {
    obj o;
    mn_objstore *store;
} pinned;

static void release_pin(void *data, void *hint)
{
    pinned *p = hint;
    mn_objstore *s = p->store;
    pthread_mutex_lock(&s->mu);
    bool free_it = --p->o.pins == 0 && p->o.dropped;
    s->total_pins--;
    pthread_mutex_unlock(&s->mu);
    if (free_it) {
        free(p->o.data);
        free(p);
    }
}

static obj *find_locked(mn_objstore *s, const char *id, obj ***prev)
{
    for (obj **pp = &s->objs; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->id, id)) {
            if (prev) *prev = pp;
            return *pp;
        }
    }
    return NULL;
}

static void drop(mn_objstore *s, const char *id)
{
    pthread_mutex_lock(&s->mu);
    obj **pp;
    obj *o = find_locked(s, id, &pp);
    bool free_it = false;
    if (o) {
        *pp = o->next;
        o->dropped = true;
        free_it = o->pins == 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (free_it) {
        free(o->data);
        free(o);
    }
}

static void serve_one(mn_objstore *s, void *sock)
{
    zmq_msg_t route, envm;
    zmq_msg_init(&route);
    zmq_msg_init(&envm);
    if (zmq_msg_recv(&route, sock, ZMQ_DONTWAIT) < 0) goto out;
    if (!zmq_msg_more(&route) || zmq_msg_recv(&envm, sock, 0) < 0) goto out;
    while (zmq_msg_more(&envm)) { /* objects are asked for by id only */
        zmq_msg_t junk;
        zmq_msg_init(&junk);
        zmq_msg_recv(&junk, sock, 0);
        int more = zmq_msg_more(&junk);
        zmq_msg_close(&junk);
        if (!more) break;
    }
    mn_env e;
    char err[256], id[40];
    const void *rt = zmq_msg_data(&route);
    size_t rl = zmq_msg_size(&route);
    if (mn_env_decode(zmq_msg_data(&envm), zmq_msg_size(&envm), &e, err, sizeof err) ||
        e.kind == MN_REPLY || e.kind == MN_ERROR || e.payload_len == 0 ||
        e.payload_len >= sizeof id) {
        const char *msg = "object server: malformed request";
        mn_env_send(sock, rt, rl, MN_ERROR, 0, NULL, MANTA_EPROTO, msg, strlen(msg), NULL);
        goto out;
    }
    memcpy(id, e.payload, e.payload_len);
    id[e.payload_len] = 0;
    if (e.method_len == 4 && !memcmp(e.method, "free", 4)) {
        drop(s, id);
        if (e.kind == MN_CALL) mn_env_send(sock, rt, rl, MN_REPLY, e.id, NULL, 0, NULL, 0, NULL);
        goto out;
    }
    pthread_mutex_lock(&s->mu);
    obj *o = find_locked(s, id, NULL);
    if (o) o->pins++, s->total_pins++;
    pthread_mutex_unlock(&s->mu);
    if (!o) {
        char msg[128];
        snprintf(msg, sizeof msg, "object %s is not held by this owner (released?)", id);
        mn_env_send(sock, rt, rl, MN_ERROR, e.id, NULL, MANTA_ENOTFOUND, msg, strlen(msg), NULL);
        goto out;
    }
    zmq_msg_t frame;
    /* Zero copy: ZeroMQ reads the owner's buffer and unpins it when sent. */
    zmq_msg_init_data(&frame, o->data, o->len, release_pin, o);
    if (mn_env_send(sock, rt, rl, MN_REPLY, e.id, NULL, 0, NULL, o->len, &frame) != 0)
        zmq_msg_close(&frame);
out:
    zmq_msg_close(&route);
    zmq_msg_close(&envm);
}

static void *store_thread(void *arg)
{
    mn_objstore *s = arg;
    manta_ctx *m = s->m;
    void *sock = zmq_socket(m->zmq, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    mn_limit_socket(sock, MN_OBJ_REQUEST_MAX); /* requests are an object id */
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    /* Without its CURVE options the server would admit anyone: then it
     * binds nothing (fetches fail; nothing is served in the clear). */
    bool secured = mn_auth_server(m, sock) == 0;
    if (!secured) mn_log("object server: %s; not serving", manta_last_error());
    void *ctl = zmq_socket(m->zmq, ZMQ_PAIR);
    zmq_connect(ctl, "inproc://mn-objstore-ctl");
    if (secured && zmq_bind(sock, s->endpoint) != 0) {
        mn_log("object server: bind %s: %s", s->endpoint, zmq_strerror(zmq_errno()));
    } else if (secured) {
        size_t n = sizeof s->endpoint;
        zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, s->endpoint, &n);
    }
    zmq_send(ctl, "up", 2, 0);
    for (;;) {
        zmq_pollitem_t it[2] = {{sock, 0, ZMQ_POLLIN, 0}, {ctl, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, -1) < 0) continue;
        if (it[1].revents) break;
        for (int i = 0; i < 256 && it[0].revents; i++) {
            int ev = 0;
            size_t el = sizeof ev;
            zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &el);
            if (!(ev & ZMQ_POLLIN)) break;
            serve_one(s, sock);
        }
    }
    zmq_close(sock);
    zmq_close(ctl);
    mn_env_thread_done();
    return NULL;
}

static int store_start(manta_ctx *m)
{
    if (m->objs) return 0;
    mn_objstore *s = calloc(1, sizeof *s);
    if (!s) return MANTA_ENOMEM;
    s->m = m;
    pthread_mutex_init(&s->mu, NULL);
    if (!strcmp(m->transport, "tcp"))
        snprintf(s->endpoint, sizeof s->endpoint, "tcp://%s:*", m->host);
    else
        snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/o%d", m->rundir, (int)getpid());
    s->ctl = zmq_socket(m->zmq, ZMQ_PAIR);
    zmq_bind(s->ctl, "inproc://mn-objstore-ctl");
    if (pthread_create(&s->thread, NULL, store_thread, s) != 0) {
        zmq_close(s->ctl);
        free(s);
        return mn_fail(MANTA_ESYS, "object server thread: cannot start");
    }
    char up[4];
    zmq_recv(s->ctl, up, sizeof up, 0); /* the endpoint is bound (or failed) */
    s->running = true;
    m->objs = s;
    return 0;
}

void mn_objstore_free(manta_ctx *m)
{
    mn_objstore *s = m->objs;
    if (!s) return;
    zmq_send(s->ctl, "stop", 4, 0);
    pthread_join(s->thread, NULL);
    zmq_close(s->ctl);
    /* Objects this process owns die with it: drop their records too. */
    pthread_mutex_lock(&s->mu);
    obj *list = s->objs;
    s->objs = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        obj *o = list;
        list = o->next;
        if (m->redis && manta_reg_obj_delete(m, o->id) != 0)
            mn_log("object %s: %s", o->id, manta_last_error());
        pthread_mutex_lock(&s->mu);
        o->dropped = true; /* if ZeroMQ still holds it, release_pin frees it */
        bool free_it = o->pins == 0;
        pthread_mutex_unlock(&s->mu);
        if (free_it) {
            free(o->data);
            free(o);
        }
    }
    /* The store stays allocated while a send is still in flight: its mutex
     * is needed by release_pin. Only a process exit follows that case. */
    pthread_mutex_lock(&s->mu);
    int inflight = s->total_pins;
    pthread_mutex_unlock(&s->mu);
    if (!inflight) {
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
    m->objs = NULL;
}

int manta_put(manta_ctx *m, const void *data, size_t len, manta_obj_id *id)
{
    if (!m || !id || (len && !data)) return mn_fail(MANTA_EINVAL, "manta_put: bad arguments");
    memcpy(id->s, "obj-", 4);
    mn_random_hex(id->s + 4, 32);
    if (len <= MN_OBJ_INLINE_MAX) return manta_reg_obj_create(m, id->s, len, data, NULL);
    int rc = store_start(m);
    if (rc) return rc;
    pinned *p = calloc(1, sizeof *p);
    void *copy = malloc(len);
    if (!p || !copy) {
        free(p), free(copy);
        return mn_fail(MANTA_ENOMEM, "manta_put: %zu bytes: out of memory", len);
    }
    memcpy(copy, data, len);
    snprintf(p->o.id, sizeof p->o.id, "%s", id->s);
    p->o.data = copy, p->o.len = len, p->store = m->objs;
    pthread_mutex_lock(&m->objs->mu);
    p->o.next = m->objs->objs;
    m->objs->objs = &p->o;
    pthread_mutex_unlock(&m->objs->mu);
    rc = manta_reg_obj_create(m, id->s, len, NULL, m->objs->endpoint);
    if (rc) drop(m->objs, id->s);
    return rc;
}

static manta_future *resolved(manta_ctx *m, int status, const char *error)
{
    manta_future *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->ctx = m;
    f->status = status;
    if (error) f->error = mn_strdup(error);
    return f;
}

manta_future *manta_obj_fetch(manta_ctx *m, const manta_obj_id *id, int timeout_ms)
{
    if (!m || !id) return resolved(m, MANTA_EINVAL, "manta_obj_fetch: bad arguments");
    void *data;
    size_t len;
    char owner[192];
    int rc = manta_reg_obj_locate(m, id->s, &data, &len, owner, sizeof owner);
    if (rc) return resolved(m, rc, manta_last_error());
    if (data) {
        /* Inline: the future keeps its own copy of the record's bytes. */
        manta_future *f = resolved(m, 0, NULL);
        if (!f) {
            free(data);
            return NULL;
        }
        f->owned = data, f->data = data, f->len = len;
        return f;
    }
    /* Owner-held: one call to the owner's object thread; the reply's frame
     * is the object, and the future keeps it. */
    mn_peer *p = mn_peer_get(m, owner);
    return p ? mn_call_peer(m, p, "get", id->s, strlen(id->s), timeout_ms > 0 ? timeout_ms : 0,
                            NULL)
             : resolved(m, MANTA_EZMQ, manta_last_error());
}

int manta_obj_get(manta_ctx *m, const manta_obj_id *id, void **data, size_t *len, int timeout_ms)
{
    if (!m || !id || !data || !len) return mn_fail(MANTA_EINVAL, "manta_obj_get: bad arguments");
    *data = NULL, *len = 0;
    manta_future *f = manta_obj_fetch(m, id, timeout_ms);
    if (!f) return MANTA_ENOMEM;
    const void *d;
    size_t n;
    int rc = manta_get(f, -1, &d, &n);
    if (rc == 0) {
        if (f->owned) { /* already ours: hand it over */
            *data = f->owned, *len = n;
            f->owned = NULL;
        } else if ((*data = malloc(n ? n : 1))) {
            memcpy(*data, d, n), *len = n;
        } else {
            rc = MANTA_ENOMEM;
        }
    } else {
        mn_fail(rc, "fetch object %s: %s", id->s, manta_future_error(f));
    }
    manta_future_free(f);
    return rc;
}

int manta_obj_ref(manta_ctx *m, const manta_obj_id *id)
{
    if (!m || !id) return mn_fail(MANTA_EINVAL, "manta_obj_ref: bad arguments");
    return manta_reg_obj_ref(m, id->s);
}

int manta_obj_release(manta_ctx *m, const manta_obj_id *id)
{
    if (!m || !id) return mn_fail(MANTA_EINVAL, "manta_obj_release: bad arguments");
    char owner[192];
    int freed;
    int rc = manta_reg_obj_release(m, id->s, &freed, owner, sizeof owner);
    if (rc || !freed || !owner[0]) return rc;
    /* The last reference went: the record is gone; free the owner's buffer. */
    if (m->objs && !strcmp(owner, m->objs->endpoint)) {
        drop(m->objs, id->s);
        return 0;
    }
    mn_peer *p = mn_peer_get(m, owner);
    if (!p) return MANTA_EZMQ;
    rc = mn_peer_connect(p);
    return rc ? rc
              : mn_env_send(p->sock, NULL, 0, MN_CAST, 0, "free", 0, id->s, strlen(id->s), NULL);
}
