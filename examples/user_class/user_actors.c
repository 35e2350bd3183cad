/* Build: part of the tree (target user_actors -> libuser_actors.so)
 * Run:   ./build/manta run build/examples/user_class/user_class.yaml
 *
 * User actor classes in a shared library, launched from a spec by the stock
 * `manta` CLI: the library exports a NULL-terminated `manta_classes` table,
 * and the spec's groups name it with `library:`. Each actor's init gets the
 * msgpack map the launcher builds ({job, group, replica, replicas, settings,
 * sections}); this example reads its settings from it.
 *
 * Classes: "squarer" squares int64s; "summer" has the job's `run` method: it
 * spreads `items` numbers over the `workers` squarers (found by name,
 * squarer-0 ... squarer-N-1) and answers a JSON line with the sum. */
#include <manta.h>

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read settings.KEY as an integer from the init payload; def if absent. */
static int64_t setting(const void *args, size_t len, const char *key, int64_t def)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int64_t v = def;
    if (msgpack_unpack_next(&u, args, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object *k = &u.data.via.map.ptr[i].key, *s = &u.data.via.map.ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR || k->via.str.size != 8 ||
                memcmp(k->via.str.ptr, "settings", 8) || s->type != MSGPACK_OBJECT_MAP)
                continue;
            for (uint32_t j = 0; j < s->via.map.size; j++) {
                msgpack_object *sk = &s->via.map.ptr[j].key, *sv = &s->via.map.ptr[j].val;
                if (sk->type == MSGPACK_OBJECT_STR && sk->via.str.size == strlen(key) &&
                    !memcmp(sk->via.str.ptr, key, sk->via.str.size) &&
                    (sv->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                     sv->type == MSGPACK_OBJECT_NEGATIVE_INTEGER))
                    v = sv->via.i64;
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    return v;
}

static int square(manta_req *call, void *state, const void *arg, size_t len)
{
    int64_t x;
    if (len != sizeof x) return manta_reply_error(call, MANTA_EINVAL, "square: want an int64");
    memcpy(&x, arg, sizeof x);
    x *= x;
    return manta_reply(call, &x, sizeof x);
}

typedef struct summer {
    int64_t workers, items;
} summer;

static int summer_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    summer *s = state;
    s->workers = setting(args, len, "workers", 2);
    s->items = setting(args, len, "items", 1000);
    return s->workers > 0 && s->items > 0 ? 0 : MANTA_EINVAL;
}

static int run(manta_req *call, void *state, const void *arg, size_t len)
{
    summer *s = state;
    manta_ctx *m = manta_req_ctx(call);
    manta_actor *w[64];
    int n = s->workers < 64 ? (int)s->workers : 64;
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "squarer-%d", i);
        if (manta_actor_lookup(m, name, &w[i]) != 0)
            return manta_reply_error(call, MANTA_ENOTFOUND, "no worker %s", name);
    }
    manta_future **fs = calloc((size_t)s->items, sizeof *fs);
    for (int64_t i = 0; i < s->items; i++) fs[i] = manta_call(m, w[i % n], "square", &i, sizeof i);
    int64_t sum = 0, failed = 0;
    for (int64_t i = 0; i < s->items; i++) {
        const void *d;
        size_t dl;
        int64_t v;
        if (manta_get(fs[i], 30000, &d, &dl) == 0 && dl == sizeof v) {
            memcpy(&v, d, sizeof v);
            sum += v;
        } else {
            failed++;
        }
        manta_future_free(fs[i]);
    }
    free(fs);
    char out[160];
    int k = snprintf(out, sizeof out,
                     "{\"items\": %lld, \"workers\": %d, \"sum\": %lld, \"failed\": %lld}",
                     (long long)s->items, n, (long long)sum, (long long)failed);
    return manta_reply(call, out, (size_t)k);
}

static const manta_method squarer_methods[] = {{"square", square}, {NULL, NULL}};
static const manta_method summer_methods[] = {{"run", run}, {NULL, NULL}};
static const manta_class squarer = {"squarer", 0, NULL, NULL, squarer_methods};
static const manta_class summer_class = {"summer", sizeof(summer), summer_init, NULL,
                                         summer_methods};

/* What the runtime looks up with dlsym. */
const manta_class *const manta_classes[] = {&squarer, &summer_class, NULL};
