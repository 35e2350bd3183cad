/*
 * rl_util.c - msgpack lookups, settings, clock, logging and the glue that
 * lets the runtime's HTTP client run inside an actor's event loop (the
 * pattern of README.md "Tools over MCP": watch callbacks become
 * manta_watch_fd, the client's deadline a one-shot loop timer).
 */
#include "rl_util.h"

#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Bytes after the type byte b that hold a length (1, 2, 4) or 0. */
static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Walk one msgpack object: every header inside buf, every announced item
 * backed by at least one byte. 0 when valid. */
static int mp_check(const unsigned char *p, size_t len)
{
    size_t at = 0;
    uint64_t items = 1; /* still to read */
    while (items > 0) {
        if (at >= len) return -1;
        unsigned b = p[at++];
        items--;
        uint64_t skip = 0, more = 0;
        int nb = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            skip = 0;
        } else if (b >= 0x80 && b <= 0x8f) {
            more = 2 * (uint64_t)(b & 0x0f);
        } else if (b >= 0x90 && b <= 0x9f) {
            more = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4:
            case 0xd9:
                nb = 1;
                break; /* bin8, str8 */
            case 0xc5:
            case 0xda:
                nb = 2;
                break;
            case 0xc6:
            case 0xdb:
                nb = 4;
                break;
            case 0xc7:
                nb = 1, skip = 1;
                break; /* ext8: len, type */
            case 0xc8:
                nb = 2, skip = 1;
                break;
            case 0xc9:
                nb = 4, skip = 1;
                break;
            case 0xca:
                skip = 4;
                break;
            case 0xcb:
                skip = 8;
                break;
            case 0xcc:
            case 0xd0:
                skip = 1;
                break;
            case 0xcd:
            case 0xd1:
                skip = 2;
                break;
            case 0xce:
            case 0xd2:
                skip = 4;
                break;
            case 0xcf:
            case 0xd3:
                skip = 8;
                break;
            case 0xd4:
                skip = 2;
                break;
            case 0xd5:
                skip = 3;
                break;
            case 0xd6:
                skip = 5;
                break;
            case 0xd7:
                skip = 9;
                break;
            case 0xd8:
                skip = 17;
                break;
            case 0xdc:
            case 0xdd:
            case 0xde:
            case 0xdf: {
                int w = (b == 0xdc || b == 0xde) ? 2 : 4;
                if (len - at < (size_t)w) return -1;
                uint64_t c = be(p + at, w);
                at += (size_t)w;
                more = b >= 0xde ? 2 * c : c;
                break;
            }
            default:
                return -1; /* 0xc1: never used */
            }
        }
        if (nb) { /* a length field */
            if (len - at < (size_t)nb) return -1;
            skip += be(p + at, nb);
            at += (size_t)nb;
        }
        if (skip > len - at) return -1;
        at += (size_t)skip;
        items += more;
        if (items > len - at) return -1; /* each item needs a byte at least */
    }
    return 0;
}

int rl_unpack(msgpack_unpacked *u, const void *buf, size_t len)
{
    if (!buf || mp_check(buf, len)) return -1;
    return msgpack_unpack_next(u, buf, len, NULL) == MSGPACK_UNPACK_SUCCESS ? 0 : -1;
}

const msgpack_object *rl_mp_get(const msgpack_object *o, const char *key)
{
    if (!o || o->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            !memcmp(k->via.str.ptr, key, kl))
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

const msgpack_object *rl_mp_path(const msgpack_object *o, const char *path)
{
    char key[128];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key) return NULL;
        memcpy(key, path, n);
        key[n] = 0;
        o = rl_mp_get(o, key);
        path += n + (dot ? 1 : 0);
    }
    return o;
}

int64_t rl_mp_int(const msgpack_object *o, int64_t def)
{
    if (!o) return def;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (int64_t)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return (int64_t)o->via.f64;
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean;
    default:
        return def;
    }
}

double rl_mp_num(const msgpack_object *o, double def)
{
    if (!o) return def;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return def;
    }
}

const char *rl_mp_str(const msgpack_object *o, char *out, size_t cap, const char *def)
{
    if (!o || o->type != MSGPACK_OBJECT_STR) {
        snprintf(out, cap, "%s", def ? def : "");
        return out;
    }
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    memcpy(out, o->via.str.ptr, n);
    out[n] = 0;
    return out;
}

void rl_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void rl_pack_kv_int(msgpack_packer *pk, const char *k, int64_t v)
{
    rl_pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

void rl_pack_kv_num(msgpack_packer *pk, const char *k, double v)
{
    rl_pack_str(pk, k);
    msgpack_pack_double(pk, v);
}

void rl_pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    rl_pack_str(pk, k);
    rl_pack_str(pk, v ? v : "");
}

void rl_pack_kv_bin(msgpack_packer *pk, const char *k, const void *p, size_t n)
{
    rl_pack_str(pk, k);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, n ? p : "", n);
}

const msgpack_object *rl_setting(const msgpack_object *args, const char *key, const char *section)
{
    const msgpack_object *v = rl_mp_get(rl_mp_get(args, "settings"), key);
    if (v && v->type != MSGPACK_OBJECT_NIL) return v;
    if (!section) return NULL;
    v = rl_mp_get(rl_mp_get(rl_mp_get(args, "sections"), section), key);
    return v && v->type != MSGPACK_OBJECT_NIL ? v : NULL;
}

int64_t rl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double rl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void rl_log(manta_ctx *m, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[%s] %s\n", m ? manta_self(m) : "?", buf);
    fflush(stderr);
}

/* ---- HTTP glue ---- */

static void glue_fd(void *arg, int fd, int rev)
{
    rl_http_glue *g = arg;
    manta_http_on_fd(
        g->http, fd,
        (short)(((rev & MANTA_POLLIN) ? POLLIN : 0) | ((rev & MANTA_POLLOUT) ? POLLOUT : 0)));
}

static void glue_watch(int fd, short ev, void *arg)
{
    rl_http_glue *g = arg;
    manta_watch_fd(g->ctx, fd,
                   ((ev & POLLIN) ? MANTA_POLLIN : 0) | ((ev & POLLOUT) ? MANTA_POLLOUT : 0),
                   glue_fd, g);
}

static void glue_expired(void *arg)
{
    rl_http_glue *g = arg;
    g->timer = 0;
    manta_http_on_fd(g->http, -1, 0);
}

static void glue_timer(int ms, void *arg)
{
    rl_http_glue *g = arg;
    if (g->timer) manta_timer_cancel(g->ctx, g->timer);
    g->timer = ms < 0 ? 0 : manta_timer_add(g->ctx, ms, glue_expired, g);
}

int rl_http_glue_start(rl_http_glue *g, manta_ctx *m, const manta_http_config *cfg)
{
    g->ctx = m;
    g->timer = 0;
    g->http = manta_http_new(cfg);
    if (!g->http) return -1;
    manta_http_set_watch(g->http, glue_watch, g);
    manta_http_set_timer(g->http, glue_timer, g);
    return 0;
}

void rl_http_glue_stop(rl_http_glue *g)
{
    if (!g->http) return;
    manta_http_set_watch(g->http, NULL, NULL);
    manta_http_set_timer(g->http, NULL, NULL);
    if (g->timer) manta_timer_cancel(g->ctx, g->timer);
    g->timer = 0;
    manta_http_free(g->http);
    g->http = NULL;
}
