/*
 * fuzz_spawn.c -- libFuzzer harness for a node agent's `spawn` request as it
 * arrives: a call envelope (mn_env_decode) whose inline payload is the
 * msgpack map {name, class, library, exe, max_restarts, args}.
 *
 * The node agent's own parser (parse_spawn in runtime/core/node.c) is a
 * static function, so it is not reachable from here without a change to
 * node.c. This harness runs the same steps on the same bytes: the envelope
 * decode, then msgpack_unpack_next of the payload (what parse_spawn calls
 * today) and a walk over the resulting map that reads every key and value
 * the way a spawn parser must (string fields bounded, max_restarts an
 * integer, args a bin). When node.c exports its parser, call it here instead.
 *
 * libFuzzer's -malloc_limit_mb (the same as -rss_limit_mb unless set) turns
 * an allocation out of proportion to the input into a report.
 */
#include "internal.h"

#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touch every byte of a string or bin so that ASan sees any bad pointer. */
static unsigned touch(const char *p, uint32_t n)
{
    unsigned h = 0;
    for (uint32_t i = 0; i < n; i++) h = h * 31u + (unsigned char)p[i];
    return h;
}

static unsigned walk(const msgpack_object *o, int depth)
{
    if (depth > 64) return 0;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        return touch(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN:
        return touch(o->via.bin.ptr, o->via.bin.size);
    case MSGPACK_OBJECT_EXT:
        return touch(o->via.ext.ptr, o->via.ext.size);
    case MSGPACK_OBJECT_ARRAY: {
        unsigned h = 0;
        for (uint32_t i = 0; i < o->via.array.size; i++) h += walk(&o->via.array.ptr[i], depth + 1);
        return h;
    }
    case MSGPACK_OBJECT_MAP: {
        unsigned h = 0;
        for (uint32_t i = 0; i < o->via.map.size; i++)
            h += walk(&o->via.map.ptr[i].key, depth + 1) + walk(&o->via.map.ptr[i].val, depth + 1);
        return h;
    }
    default:
        return (unsigned)o->via.u64;
    }
}

static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    mn_env e;
    char err[256];
    if (mn_env_decode(buf, size, &e, err, sizeof err) == 0 && e.kind == MN_CALL && e.method &&
        e.method_len == 5 && !memcmp(e.method, "spawn", 5) && e.payload) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        if (msgpack_unpack_next(&u, e.payload, e.payload_len, &off) == MSGPACK_UNPACK_SUCCESS &&
            u.data.type == MSGPACK_OBJECT_MAP) {
            char name[64] = "", cls[64] = "", exe[4096] = "";
            const msgpack_object_map *mp = &u.data.via.map;
            for (uint32_t i = 0; i < mp->size; i++) {
                const msgpack_object *k = &mp->ptr[i].key, *v = &mp->ptr[i].val;
                sink += walk(v, 0);
                if (k->type != MSGPACK_OBJECT_STR || v->type != MSGPACK_OBJECT_STR) continue;
                char *dst = NULL;
                size_t cap = 0;
                if (k->via.str.size == 4 && !memcmp(k->via.str.ptr, "name", 4))
                    dst = name, cap = sizeof name;
                else if (k->via.str.size == 5 && !memcmp(k->via.str.ptr, "class", 5))
                    dst = cls, cap = sizeof cls;
                else if (k->via.str.size == 3 && !memcmp(k->via.str.ptr, "exe", 3))
                    dst = exe, cap = sizeof exe;
                if (dst && v->via.str.size < cap) {
                    memcpy(dst, v->via.str.ptr, v->via.str.size);
                    dst[v->via.str.size] = 0;
                }
            }
            sink += (unsigned)(strlen(name) + strlen(cls) + strlen(exe));
        }
        msgpack_unpacked_destroy(&u);
    }
    free(buf);
    return 0;
}
