/*
 * rl_util.c - the RL helpers' error convention, msgpack lookups, the one
 * reader of init arguments and settings, clock, logging and the glue that
 * lets the runtime's HTTP client run inside an actor's event loop (the
 * pattern of README.md "Tools over MCP": watch callbacks become
 * manta_watch_fd, the client's deadline a one-shot loop timer).
 */
#include "rl_util.h"

#include "manta_actors.h"

#include <manta_kernels.h>

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ---- */

static _Thread_local char last_error[512];

int rl_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* Also the runtime's: a class init that fails with it has the runtime
     * carry the reason to whoever created the actor (not only to its log). */
    manta_fail(code, "%s", last_error);
    return code;
}

const char *rl_last_error(void)
{
    return last_error;
}

const char *rl_mp_describe(const msgpack_object *o, char *out, size_t cap)
{
    if (!o) {
        snprintf(out, cap, "nothing");
        return out;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        snprintf(out, cap, "nil");
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        snprintf(out, cap, "%s", o->via.boolean ? "true" : "false");
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        snprintf(out, cap, "%" PRIu64, o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        snprintf(out, cap, "%" PRId64, o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        snprintf(out, cap, "%g", o->via.f64);
        break;
    case MSGPACK_OBJECT_STR: {
        int n = o->via.str.size > 40 ? 40 : (int)o->via.str.size;
        snprintf(out, cap, "\"%.*s%s\"", n, o->via.str.ptr, o->via.str.size > 40 ? "..." : "");
        break;
    }
    case MSGPACK_OBJECT_ARRAY:
        snprintf(out, cap, "an array");
        break;
    case MSGPACK_OBJECT_MAP:
        snprintf(out, cap, "a map");
        break;
    default:
        snprintf(out, cap, "binary data");
        break;
    }
    return out;
}

/* Bytes after the type byte b that hold a length (1, 2, 4) or 0. */
static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* The layout of a msgpack object after its type byte b: `nb` bytes of a
 * big-endian length that adds to the bytes to skip, `skip` fixed bytes,
 * `count` bytes of an array (1) or map (2) item count, `items` items that
 * follow inline (fixarray, fixmap). -1 for the unused byte 0xc1. */
typedef struct layout {
    int nb, count, per;
    uint64_t skip, items;
} layout;

static int layout_of(unsigned b, layout *l)
{
    *l = (layout){0};
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return 0;
    if (b >= 0x80 && b <= 0x8f) return l->items = 2 * (uint64_t)(b & 0x0f), 0;
    if (b >= 0x90 && b <= 0x9f) return l->items = b & 0x0f, 0;
    if (b >= 0xa0 && b <= 0xbf) return l->skip = b & 0x1f, 0;
    switch (b) {
    case 0xc4: /* bin8, str8 */
    case 0xd9:
        return l->nb = 1, 0;
    case 0xc5:
    case 0xda:
        return l->nb = 2, 0;
    case 0xc6:
    case 0xdb:
        return l->nb = 4, 0;
    case 0xc7: /* ext: length, then a type byte */
        return l->nb = 1, l->skip = 1, 0;
    case 0xc8:
        return l->nb = 2, l->skip = 1, 0;
    case 0xc9:
        return l->nb = 4, l->skip = 1, 0;
    case 0xcc: /* uint8, int8 */
    case 0xd0:
        return l->skip = 1, 0;
    case 0xcd:
    case 0xd1:
    case 0xd4: /* fixext1: type and one byte */
        return l->skip = 2, 0;
    case 0xd5:
        return l->skip = 3, 0;
    case 0xca:
    case 0xce:
    case 0xd2:
        return l->skip = 4, 0;
    case 0xd6:
        return l->skip = 5, 0;
    case 0xcb:
    case 0xcf:
    case 0xd3:
        return l->skip = 8, 0;
    case 0xd7:
        return l->skip = 9, 0;
    case 0xd8:
        return l->skip = 17, 0;
    case 0xdc: /* array16, array32, map16, map32 */
        return l->count = 2, l->per = 1, 0;
    case 0xdd:
        return l->count = 4, l->per = 1, 0;
    case 0xde:
        return l->count = 2, l->per = 2, 0;
    case 0xdf:
        return l->count = 4, l->per = 2, 0;
    default:
        return -1;
    }
}

/* Walk one msgpack object: every header inside buf, every announced item
 * backed by at least one byte. 0 when valid. */
static int mp_check(const unsigned char *p, size_t len)
{
    size_t at = 0;
    uint64_t items = 1; /* still to read */
    while (items > 0) {
        layout l;
        if (at >= len || layout_of(p[at++], &l)) return -1;
        items--;
        if (l.count) {
            if (len - at < (size_t)l.count) return -1;
            l.items = (uint64_t)l.per * be(p + at, l.count);
            at += (size_t)l.count;
        }
        if (l.nb) {
            if (len - at < (size_t)l.nb) return -1;
            l.skip += be(p + at, l.nb);
            at += (size_t)l.nb;
        }
        if (l.skip > len - at) return -1;
        at += (size_t)l.skip;
        items += l.items;
        if (items > len - at) return -1; /* each item needs a byte at least */
    }
    return 0;
}

int rl_unpack(msgpack_unpacked *u, const void *buf, size_t len)
{
    if (!buf || mp_check(buf, len))
        return rl_fail(MANTA_EINVAL, "not one well-formed msgpack object (%zu bytes)", len);
    if (msgpack_unpack_next(u, buf, len, NULL) != MSGPACK_UNPACK_SUCCESS)
        return rl_fail(MANTA_EINVAL, "msgpack object could not be unpacked (%zu bytes)", len);
    return 0;
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
        /* in range, or the default: casting NaN or a float outside int64
         * to an integer is undefined behaviour (found by the traj fuzzer) */
        if (!(o->via.f64 >= -9.2233720368547758e18 && o->via.f64 < 9.2233720368547758e18))
            return def;
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

/* ---- init arguments ---- */

/* The sections the RL classes own whose keys a group's settings may give
 * too (rl_keys.c: the MANTA_SPEC_IN_SETTINGS ones). */
static const manta_spec_key *owned_section(const char *k, size_t n)
{
    const manta_spec_key *d = manta_spec_key_find(rl_spec_sections, k, n);
    return d && (d->flags & MANTA_SPEC_IN_SETTINGS) ? d : NULL;
}

const manta_spec_key *rl_key_find(const char *section, const char *key)
{
    if (!key) return NULL;
    if (!section) return manta_spec_key_find(rl_settings_keys, key, strlen(key));
    const manta_spec_key *sec = manta_spec_key_find(rl_spec_sections, section, strlen(section));
    return sec ? manta_spec_key_find(sec->keys, key, strlen(key)) : NULL;
}

static int listed(const manta_spec_key *keys, const char *k, size_t n)
{
    return manta_spec_key_find(keys, k, n) != NULL;
}

static void args_failv(rl_args *a, const char *fmt, va_list ap)
{
    if (a->rc) return;
    a->rc = MANTA_EINVAL;
    vsnprintf(a->err, sizeof a->err, fmt, ap);
    rl_fail(a->rc, "%s", a->err);
}

static void args_fail(rl_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void args_fail(rl_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    args_failv(a, fmt, ap);
    va_end(ap);
}

/* Every key of map m must be in keys; `where` prefixes the error. */
static void check_keys(rl_args *a, const msgpack_object *m, const manta_spec_key *keys,
                       const char *where)
{
    for (uint32_t i = 0; m && m->type == MSGPACK_OBJECT_MAP && i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) {
            args_fail(a, "%s: a key that is not a string", where);
            return;
        }
        if (!listed(keys, k->via.str.ptr, k->via.str.size)) {
            args_fail(a, "%s.%.*s: unknown key", where, (int)k->via.str.size, k->via.str.ptr);
            return;
        }
    }
}

/* The group's settings: flat keys from every owned section or group_keys,
 * or a nested map per owned section. */
static void check_settings(rl_args *a)
{
    const msgpack_object *m = a->settings;
    char where[160];
    snprintf(where, sizeof where, "groups.%s.settings", a->group);
    for (uint32_t i = 0; m && i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR) {
            args_fail(a, "%s: a key that is not a string", where);
            return;
        }
        const char *ks = k->via.str.ptr;
        size_t kn = k->via.str.size;
        const manta_spec_key *sec = owned_section(ks, kn);
        if (sec && v->type == MSGPACK_OBJECT_MAP) {
            char sub[200];
            snprintf(sub, sizeof sub, "%s.%.*s", where, (int)kn, ks);
            check_keys(a, v, sec->keys, sub);
            continue;
        }
        int known = listed(rl_settings_keys, ks, kn);
        for (size_t j = 0; rl_spec_sections[j].name && !known; j++)
            if (rl_spec_sections[j].flags & MANTA_SPEC_IN_SETTINGS)
                known = listed(rl_spec_sections[j].keys, ks, kn);
        if (!known) {
            args_fail(a, "%s.%.*s: unknown key", where, (int)kn, ks);
            return;
        }
    }
}

int rl_args_fail(rl_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    args_failv(a, fmt, ap);
    va_end(ap);
    return a->rc;
}

int rl_args_open(rl_args *a, const void *buf, size_t len)
{
    memset(a, 0, sizeof *a);
    msgpack_unpacked_init(&a->u);
    snprintf(a->group, sizeof a->group, "?");
    if (rl_unpack(&a->u, buf, len)) {
        args_fail(a, "init argument: %s", rl_last_error());
        return a->rc;
    }
    a->root = &a->u.data;
    if (a->root->type != MSGPACK_OBJECT_MAP) {
        args_fail(a, "init argument: expected a map (manta_spec_init_payload)");
        return a->rc;
    }
    const msgpack_object *g = rl_mp_get(a->root, "group");
    if (g && g->type == MSGPACK_OBJECT_STR) rl_mp_str(g, a->group, sizeof a->group, "?");
    a->settings = rl_mp_get(a->root, "settings");
    a->sections = rl_mp_get(a->root, "sections");
    if (a->settings && a->settings->type == MSGPACK_OBJECT_NIL) a->settings = NULL;
    if (a->sections && a->sections->type == MSGPACK_OBJECT_NIL) a->sections = NULL;
    if (a->settings && a->settings->type != MSGPACK_OBJECT_MAP) {
        char d[64];
        args_fail(a, "groups.%s.settings: expected a map, got %s", a->group,
                  rl_mp_describe(a->settings, d, sizeof d));
        return a->rc;
    }
    if (a->sections && a->sections->type != MSGPACK_OBJECT_MAP) {
        args_fail(a, "init argument: sections: expected a map");
        return a->rc;
    }
    for (size_t i = 0; rl_spec_sections[i].name; i++) {
        const manta_spec_key *decl = &rl_spec_sections[i];
        if (decl->type != MANTA_SPEC_K_MAP) continue; /* tools: env.c reads each entry */
        const msgpack_object *sec = rl_mp_get(a->sections, decl->name);
        if (!sec || sec->type == MSGPACK_OBJECT_NIL) continue;
        if (sec->type != MSGPACK_OBJECT_MAP) {
            char d[64];
            args_fail(a, "%s: expected a map, got %s", decl->name,
                      rl_mp_describe(sec, d, sizeof d));
            return a->rc;
        }
        check_keys(a, sec, decl->keys, decl->name);
    }
    check_settings(a);
    return a->rc;
}

int rl_args_close(rl_args *a, manta_ctx *m)
{
    if (a->rc) {
        rl_log(m, "%s", a->err);
        rl_fail(a->rc, "%s", a->err);
    }
    msgpack_unpacked_destroy(&a->u);
    return a->rc;
}

/* Find a setting and name the spec key it came from. */
static const msgpack_object *lookup(rl_args *a, const char *section, const char *key, char *path,
                                    size_t cap)
{
    const msgpack_object *v;
    if (section && !section[0]) { /* a field of the payload itself */
        snprintf(path, cap, "init argument: %s", key);
        v = rl_mp_get(a->root, key);
        return v && v->type != MSGPACK_OBJECT_NIL ? v : NULL;
    }
    if (section) {
        v = rl_mp_get(rl_mp_get(a->settings, section), key);
        if (v && v->type != MSGPACK_OBJECT_NIL) {
            snprintf(path, cap, "groups.%s.settings.%s.%s", a->group, section, key);
            return v;
        }
    }
    v = rl_mp_get(a->settings, key);
    if (v && v->type != MSGPACK_OBJECT_NIL) {
        snprintf(path, cap, "groups.%s.settings.%s", a->group, key);
        return v;
    }
    if (!section) return NULL;
    v = rl_mp_get(rl_mp_get(a->sections, section), key);
    snprintf(path, cap, "%s.%s", section, key);
    return v && v->type != MSGPACK_OBJECT_NIL ? v : NULL;
}

static const char *type_word(manta_spec_ktype t)
{
    switch (t) {
    case MANTA_SPEC_K_INT:
        return "an integer";
    case MANTA_SPEC_K_NUM:
        return "a number";
    case MANTA_SPEC_K_STR:
        return "a string";
    case MANTA_SPEC_K_BOOL:
        return "a boolean";
    case MANTA_SPEC_K_MAP:
        return "a mapping";
    case MANTA_SPEC_K_LIST:
        return "a list";
    default:
        return "something";
    }
}

/* The reader and the declaration must agree (type ANY: only that the key
 * is declared). A mismatch is a bug in actors/, reported as one. */
static int check_declared(rl_args *a, const char *section, const char *key, manta_spec_ktype type,
                          double def, const char *sdef, double lo, double hi)
{
    if (a->rc || (section && !section[0])) return a->rc; /* "": a payload field */
    const manta_spec_key *k = rl_key_find(section, key);
    const char *sec = section ? section : "settings";
    if (!k) {
        args_fail(a, "internal error: %s.%s is read but not declared in actors/rl_keys.c", sec,
                  key);
        return a->rc;
    }
    if (type == MANTA_SPEC_K_ANY) return 0;
    bool computed = k->def && k->def[0] == '(';
    if (k->type != type)
        args_fail(a, "internal error: %s.%s is read as %s but declared as %s (actors/rl_keys.c)",
                  sec, key, type_word(type), type_word(k->type));
    else if ((type == MANTA_SPEC_K_INT || type == MANTA_SPEC_K_NUM) && (k->lo != lo || k->hi != hi))
        args_fail(a,
                  "internal error: %s.%s is read with range [%g, %g] but declared with [%g, %g] "
                  "(actors/rl_keys.c)",
                  sec, key, lo, hi, k->lo, k->hi);
    else if ((type == MANTA_SPEC_K_INT || type == MANTA_SPEC_K_NUM) && !computed &&
             (k->def ? strtod(k->def, NULL) : 0) != def)
        args_fail(a,
                  "internal error: %s.%s is read with default %g but declared with %s "
                  "(actors/rl_keys.c)",
                  sec, key, def, k->def ? k->def : "none");
    else if (type == MANTA_SPEC_K_STR && !computed &&
             strcmp(k->def ? k->def : "", sdef ? sdef : ""))
        args_fail(a,
                  "internal error: %s.%s is read with default \"%s\" but declared with \"%s\" "
                  "(actors/rl_keys.c)",
                  sec, key, sdef ? sdef : "", k->def ? k->def : "");
    return a->rc;
}

int rl_arg_declared(rl_args *a, const char *section, const char *key, manta_spec_ktype type,
                    double def, const char *sdef, double lo, double hi)
{
    return check_declared(a, section, key, type, def, sdef, lo, hi);
}

const msgpack_object *rl_arg_get(rl_args *a, const char *section, const char *key)
{
    char path[256];
    if (check_declared(a, section, key, MANTA_SPEC_K_ANY, 0, NULL, 0, 0)) return NULL;
    return a->root ? lookup(a, section, key, path, sizeof path) : NULL;
}

int rl_arg_error(rl_args *a, const char *section, const char *key, const char *fmt, ...)
{
    char path[256], msg[256];
    if (a->rc) return a->rc;
    if (!a->root || !lookup(a, section, key, path, sizeof path))
        snprintf(path, sizeof path, "%s%s%s", section ? section : "", section ? "." : "", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    args_fail(a, "%s: %s", path, msg);
    return a->rc;
}

int64_t rl_arg_int(rl_args *a, const char *section, const char *key, int64_t def, int64_t lo,
                   int64_t hi)
{
    char path[256], d[64];
    check_declared(a, section, key, MANTA_SPEC_K_INT, (double)def, NULL, (double)lo, (double)hi);
    if (a->rc || !a->root) return def;
    const msgpack_object *v = lookup(a, section, key, path, sizeof path);
    if (!v) return def;
    int64_t x;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX)
        x = (int64_t)v->via.u64;
    else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        x = v->via.i64;
    else {
        args_fail(a, "%s: expected an integer, got %s", path, rl_mp_describe(v, d, sizeof d));
        return def;
    }
    if (x < lo || x > hi) {
        args_fail(a, "%s: %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", path, x, lo, hi);
        return def;
    }
    return x;
}

double rl_arg_num(rl_args *a, const char *section, const char *key, double def, double lo,
                  double hi)
{
    char path[256], d[64];
    check_declared(a, section, key, MANTA_SPEC_K_NUM, def, NULL, lo, hi);
    if (a->rc || !a->root) return def;
    const msgpack_object *v = lookup(a, section, key, path, sizeof path);
    if (!v) return def;
    double x;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        x = (double)v->via.u64;
    else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        x = (double)v->via.i64;
    else if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64)
        x = v->via.f64;
    else {
        args_fail(a, "%s: expected a number, got %s", path, rl_mp_describe(v, d, sizeof d));
        return def;
    }
    if (!isfinite(x) || x < lo || x > hi) {
        args_fail(a, "%s: %g is out of range [%g, %g]", path, x, lo, hi);
        return def;
    }
    return x;
}

const char *rl_arg_str(rl_args *a, const char *section, const char *key, char *out, size_t cap,
                       const char *def)
{
    char path[256], d[64];
    snprintf(out, cap, "%s", def ? def : "");
    check_declared(a, section, key, MANTA_SPEC_K_STR, 0, def, 0, 0);
    if (a->rc || !a->root) return out;
    const msgpack_object *v = lookup(a, section, key, path, sizeof path);
    if (!v) return out;
    if (v->type != MSGPACK_OBJECT_STR) {
        args_fail(a, "%s: expected a string, got %s", path, rl_mp_describe(v, d, sizeof d));
        return out;
    }
    if (v->via.str.size >= cap) {
        args_fail(a, "%s: longer than %zu bytes", path, cap - 1);
        return out;
    }
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = 0;
    return out;
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
    (void)m; /* the line names the actor itself (log.c) */
    manta_log(MANTA_LOG_INFO, "%s", buf);
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
    if (!g->http)
        return rl_fail(MANTA_ENOMEM, "HTTP client: manta_http_new failed (out of memory or curl)");
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

/* ---- paths inside the run folder ---- */

const char *rl_run_dir_read(rl_args *a, char *out, size_t cap)
{
    char job[64], dflt[128];
    rl_arg_str(a, "", "job", job, sizeof job, "job");
    snprintf(dflt, sizeof dflt, "runs/%s", job);
    return rl_arg_str(a, "rl", "run_dir", out, cap, dflt);
}

/* Join comp[0..n) as "/c0/c1/..." into out ("/" for none); -1 when too long. */
static int join_abs(char *out, size_t cap, char *const *comp, int n)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(out + at, cap - at, "/%s", comp[i]);
        if (w < 0 || (size_t)w >= cap - at) return -1;
        at += (size_t)w;
    }
    if (n == 0) snprintf(out, cap, "/");
    return 0;
}

int rl_path_inside(const char *what, const char *root, int root_ok, const char *path, size_t len,
                   char *out, size_t cap, size_t *existing)
{
    char req[PATH_MAX], top[PATH_MAX], cand[2 * PATH_MAX + 2], probe[2 * PATH_MAX + 2];
    char base[PATH_MAX];
    if (len == 0 || len >= sizeof req || memchr(path, 0, len))
        return rl_fail(MANTA_EINVAL, "%s: a path of %zu bytes (1 to %zu, no NUL byte)", what, len,
                       sizeof req - 1);
    memcpy(req, path, len);
    req[len] = 0;
    struct stat st;
    if (!realpath(root, top))
        return rl_fail(MANTA_EINVAL, "%s: %s: the run folder %s cannot be resolved: %s", what, req,
                       root, strerror(errno));
    if (stat(top, &st) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return rl_fail(MANTA_EINVAL,
                       "%s: %s: the run folder %s is not a folder of this user (uid %d)", what, req,
                       top, (int)geteuid());
    snprintf(cand, sizeof cand, "%s%s%s", req[0] == '/' ? "" : top, req[0] == '/' ? "" : "/", req);
    /* The components, "" and "." dropped; ".." refused outright (it would
     * need resolving against links that may change before the write). */
    char *comp[PATH_MAX / 2], *save = NULL;
    int n = 0;
    for (char *c = strtok_r(cand, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (!strcmp(c, ".")) continue;
        if (!strcmp(c, ".."))
            return rl_fail(MANTA_EINVAL,
                           "%s: %s is outside the run folder %s (\"..\" is not allowed)", what, req,
                           top);
        comp[n++] = c;
    }
    /* The deepest part that exists, resolved (links and all): it must be
     * the run folder or below it. What follows it is created later, by
     * mkdir or O_EXCL, which never follow a link. */
    int k = n;
    for (; k >= 0; k--) {
        if (join_abs(probe, sizeof probe, comp, k))
            return rl_fail(MANTA_EINVAL, "%s: %s: path too long", what, req);
        if (realpath(probe, base)) break;
        if (errno != ENOENT && errno != ENOTDIR)
            return rl_fail(MANTA_EINVAL, "%s: %s: %s: %s", what, req, probe, strerror(errno));
    }
    if (k < 0)
        return rl_fail(MANTA_EINVAL, "%s: %s: no part of it exists (the run folder is %s)", what,
                       req, top);
    size_t tl = strlen(top);
    int inside =
        !strncmp(base, top, tl) &&
        (base[tl] == '/' || (base[tl] == 0 && (k < n || root_ok)) || (tl == 1 && base[tl] != 0));
    if (!inside) {
        char shown[PATH_MAX + 32] = "";
        join_abs(probe, sizeof probe, comp, k);
        if (strcmp(probe, base)) snprintf(shown, sizeof shown, " (%s resolves to %s)", probe, base);
        return rl_fail(MANTA_EINVAL, "%s: %s is %s the run folder %s%s", what, req,
                       !strcmp(base, top) ? "not a path inside" : "outside", top, shown);
    }
    if (stat(base, &st) || st.st_uid != geteuid())
        return rl_fail(MANTA_EINVAL,
                       "%s: %s: %s in the run folder %s is not owned by this user (uid %d)", what,
                       req, base, top, (int)geteuid());
    size_t at = strlen(base);
    if (at >= cap) return rl_fail(MANTA_EINVAL, "%s: %s: path too long", what, req);
    memcpy(out, base, at + 1);
    if (existing) *existing = at;
    for (int i = k; i < n; i++) {
        int w = snprintf(out + at, cap - at, "/%s", comp[i]);
        if (w < 0 || (size_t)w >= cap - at)
            return rl_fail(MANTA_EINVAL, "%s: %s: path too long", what, req);
        /* realpath said ENOENT for a dangling link too: it must not be there at all */
        if (i == k && lstat(out, &st) == 0)
            return rl_fail(MANTA_EINVAL,
                           "%s: %s: %s is a link to nothing, which may lead out of the run "
                           "folder %s",
                           what, req, out, top);
        at += (size_t)w;
    }
    return 0;
}

int rl_mkdirs_new(const char *path, size_t existing, int last)
{
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof tmp) return rl_fail(MANTA_EINVAL, "%s: path too long", path);
    memcpy(tmp, path, n + 1);
    for (size_t i = existing + 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != 0) continue;
        if (tmp[i] == 0 && !last) break;
        char c = tmp[i];
        tmp[i] = 0;
        if (mkdir(tmp, 0755) != 0)
            return rl_fail(MANTA_ESYS, "cannot create folder %s: %s", tmp, strerror(errno));
        tmp[i] = c;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int rl_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
