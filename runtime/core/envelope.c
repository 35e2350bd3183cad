/*
 * envelope.c -- the wire format of calls and replies.
 *
 * A message is one ZeroMQ multipart message (after the ROUTER's routing
 * frame): an envelope frame, a msgpack array
 *
 *     [version, kind, id, method-or-status, inline-payload, nframes]
 *
 * and, when nframes is 1, the payload as its own frame. version is
 * MANTA_PROTOCOL_VERSION; kind is call (1), reply (2), error (3) or cast (4);
 * id is the caller's call id (0 for casts); the fourth field is the method
 * name (str) for calls and casts and a status code (int) for replies and
 * errors; inline-payload is bin or nil. An error's payload is its message.
 *
 * The envelope is packed into a per-thread msgpack_sbuffer that is reused,
 * then copied into a zmq_msg of its exact size: envelopes are small, a copy
 * of a few bytes is cheaper than a fresh 8 KiB block per message that
 * ZeroMQ's I/O thread would free (allocations crossing threads fight over
 * malloc's lock; measured: pipelined 64 B calls ran at half speed), and
 * messages up to 33 bytes then need no allocation at all. A large payload
 * is copied once into its own zmq_msg, or passed in as a zmq_msg and not
 * copied at all.
 * Decoding points into the frame: the frame must outlive the mn_env.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local msgpack_sbuffer pack_buf;

void mn_env_thread_done(void)
{
    free(pack_buf.data);
    pack_buf = (msgpack_sbuffer){0};
}

int mn_env_send(void *sock, const void *route, size_t route_len, int kind, uint64_t id,
                const char *method, int status, const void *payload, size_t len, zmq_msg_t *frame)
{
    bool big = frame != NULL || len > MN_INLINE_MAX;
    msgpack_sbuffer sb = pack_buf; /* reused: only its size is reset */
    sb.size = 0;
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint32(&pk, MANTA_PROTOCOL_VERSION);
    msgpack_pack_int(&pk, kind);
    msgpack_pack_uint64(&pk, id);
    if (kind == MN_CALL || kind == MN_CAST) {
        size_t n = strlen(method);
        msgpack_pack_str(&pk, n);
        msgpack_pack_str_body(&pk, method, n);
    } else {
        msgpack_pack_int(&pk, status);
    }
    if (big || len == 0) {
        msgpack_pack_nil(&pk);
    } else {
        msgpack_pack_bin(&pk, len);
        msgpack_pack_bin_body(&pk, payload, len);
    }
    msgpack_pack_int(&pk, big ? 1 : 0);
    pack_buf = sb; /* keep what the buffer grew to */
    if (!sb.data || sb.size == 0) return mn_fail(MANTA_ENOMEM, "envelope: out of memory");

    int flags = ZMQ_DONTWAIT;
    if (route_len) {
        if (zmq_send(sock, route, route_len, ZMQ_SNDMORE | flags) < 0) {
            return mn_fail(MANTA_EZMQ, "send routing frame: %s", zmq_strerror(zmq_errno()));
        }
    }
    zmq_msg_t em;
    if (zmq_msg_init_size(&em, sb.size) != 0)
        return mn_fail(MANTA_ENOMEM, "envelope of %zu bytes: out of memory", sb.size);
    memcpy(zmq_msg_data(&em), sb.data, sb.size);
    if (zmq_msg_send(&em, sock, (big ? ZMQ_SNDMORE : 0) | flags) < 0) {
        zmq_msg_close(&em);
        return mn_fail(MANTA_EZMQ, "send envelope: %s", zmq_strerror(zmq_errno()));
    }
    if (big) {
        zmq_msg_t pm;
        if (frame) {
            zmq_msg_init(&pm);
            zmq_msg_move(&pm, frame);
        } else {
            if (zmq_msg_init_size(&pm, len) != 0)
                return mn_fail(MANTA_ENOMEM, "payload of %zu bytes: out of memory", len);
            memcpy(zmq_msg_data(&pm), payload, len);
        }
        if (zmq_msg_send(&pm, sock, flags) < 0) {
            zmq_msg_close(&pm);
            return mn_fail(MANTA_EZMQ, "send payload: %s", zmq_strerror(zmq_errno()));
        }
    }
    return 0;
}

/* A minimal in-place msgpack reader: the envelope has a fixed shape, so a
 * cursor over the bytes is simpler and faster than msgpack_unpack, and it
 * never allocates. */
typedef struct cursor {
    const unsigned char *p, *end;
} cursor;

static int rd_be(cursor *c, size_t n, uint64_t *out)
{
    if ((size_t)(c->end - c->p) < n) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | c->p[i];
    c->p += n;
    *out = v;
    return 0;
}

/* Reads an integer; *neg set when negative. */
static int rd_int(cursor *c, int64_t *out)
{
    if (c->p >= c->end) return -1;
    unsigned char b = *c->p++;
    uint64_t v;
    if (b <= 0x7f) return *out = b, 0;
    if (b >= 0xe0) return *out = (int8_t)b, 0;
    switch (b) {
    case 0xcc:
        if (rd_be(c, 1, &v)) return -1;
        *out = (int64_t)v;
        return 0;
    case 0xcd:
        if (rd_be(c, 2, &v)) return -1;
        *out = (int64_t)v;
        return 0;
    case 0xce:
        if (rd_be(c, 4, &v)) return -1;
        *out = (int64_t)v;
        return 0;
    case 0xcf:
        if (rd_be(c, 8, &v)) return -1;
        *out = (int64_t)v;
        return 0;
    case 0xd0:
        if (rd_be(c, 1, &v)) return -1;
        *out = (int8_t)v;
        return 0;
    case 0xd1:
        if (rd_be(c, 2, &v)) return -1;
        *out = (int16_t)v;
        return 0;
    case 0xd2:
        if (rd_be(c, 4, &v)) return -1;
        *out = (int32_t)v;
        return 0;
    case 0xd3:
        if (rd_be(c, 8, &v)) return -1;
        *out = (int64_t)v;
        return 0;
    }
    return -2; /* not an integer */
}

/* Reads str or bin (want_str selects which families are accepted). */
static int rd_bytes(cursor *c, bool want_str, const void **data, size_t *len)
{
    if (c->p >= c->end) return -1;
    unsigned char b = *c->p++;
    uint64_t n;
    if (want_str && (b & 0xe0) == 0xa0) {
        n = b & 0x1f;
    } else if ((want_str && b == 0xd9) || (!want_str && b == 0xc4)) {
        if (rd_be(c, 1, &n)) return -1;
    } else if ((want_str && b == 0xda) || (!want_str && b == 0xc5)) {
        if (rd_be(c, 2, &n)) return -1;
    } else if ((want_str && b == 0xdb) || (!want_str && b == 0xc6)) {
        if (rd_be(c, 4, &n)) return -1;
    } else {
        return -2;
    }
    if ((uint64_t)(c->end - c->p) < n) return -1;
    *data = c->p, *len = (size_t)n;
    c->p += n;
    return 0;
}

int mn_env_decode(const void *buf, size_t len, mn_env *e, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    cursor c = {buf, (const unsigned char *)buf + len};
    int64_t v;
#define BAD(...) (snprintf(err, errlen, __VA_ARGS__), MANTA_EPROTO)
    if (len == 0) return BAD("empty envelope frame");
    unsigned char b = *c.p++;
    if (b != 0x96) return BAD("envelope is not a msgpack array of 6 (first byte 0x%02x)", b);
    if (rd_int(&c, &v) || v < 0) return BAD("envelope field 0 (version) is not an unsigned int");
    e->version = (uint32_t)v;
    if (e->version != MANTA_PROTOCOL_VERSION)
        return BAD("protocol version %u, this runtime speaks %d", e->version,
                   MANTA_PROTOCOL_VERSION);
    if (rd_int(&c, &v) || v < MN_CALL || v > MN_CAST)
        return BAD("envelope field 1 (kind) must be 1..4");
    e->kind = (int)v;
    if (rd_int(&c, &v)) return BAD("envelope field 2 (call id) is not an integer");
    e->id = (uint64_t)v;
    if (e->kind == MN_CALL || e->kind == MN_CAST) {
        const void *s;
        if (rd_bytes(&c, true, &s, &e->method_len) || e->method_len == 0 || e->method_len >= 128)
            return BAD("envelope field 3 (method) is not a string of 1..127 bytes");
        e->method = s;
    } else {
        if (rd_int(&c, &v)) return BAD("envelope field 3 (status) is not an integer");
        e->status = (int)v;
    }
    if (c.p < c.end && *c.p == 0xc0) {
        c.p++;
    } else if (rd_bytes(&c, false, &e->payload, &e->payload_len)) {
        return BAD("envelope field 4 (payload) is neither bin nor nil");
    }
    if (rd_int(&c, &v) || v < 0 || v > 1) return BAD("envelope field 5 (frames) must be 0 or 1");
    e->nframes = (int)v;
    if (c.p != c.end) return BAD("%zu trailing bytes after the envelope", (size_t)(c.end - c.p));
#undef BAD
    return 0;
}

/* ---- a general reader for untrusted msgpack (see internal.h) ---- */

void mn_mp_init(mn_mp *c, const void *buf, size_t len)
{
    c->p = buf;
    c->end = c->p + len;
}

int mn_mp_int(mn_mp *c, int64_t *v)
{
    cursor k = {c->p, c->end};
    if (rd_int(&k, v)) return -1;
    c->p = k.p;
    return 0;
}

int mn_mp_num(mn_mp *c, double *v)
{
    cursor k = {c->p, c->end};
    int64_t i;
    uint64_t u;
    if (k.p < k.end && (*k.p == 0xca || *k.p == 0xcb)) {
        bool wide = *k.p++ == 0xcb;
        if (rd_be(&k, wide ? 8 : 4, &u)) return -1;
        if (wide) {
            memcpy(v, &u, sizeof *v);
        } else {
            uint32_t u32 = (uint32_t)u;
            float f;
            memcpy(&f, &u32, sizeof f);
            *v = f;
        }
    } else if (rd_int(&k, &i) == 0) {
        *v = (double)i;
    } else {
        return -1;
    }
    c->p = k.p;
    return 0;
}

int mn_mp_str(mn_mp *c, const char **s, size_t *len)
{
    cursor k = {c->p, c->end};
    const void *d;
    if (rd_bytes(&k, true, &d, len)) return -1;
    *s = d;
    c->p = k.p;
    return 0;
}

int mn_mp_bin(mn_mp *c, const void **data, size_t *len)
{
    cursor k = {c->p, c->end};
    if (rd_bytes(&k, false, data, len)) return -1;
    c->p = k.p;
    return 0;
}

int mn_mp_nil(mn_mp *c)
{
    if (c->p >= c->end || *c->p != 0xc0) return -1;
    c->p++;
    return 0;
}

/* Reads an array (is_map false) or map header. Every element takes at
 * least one byte, so a count larger than the bytes left is a lie. */
static int rd_container(mn_mp *c, bool is_map, uint64_t *n)
{
    cursor k = {c->p, c->end};
    if (k.p >= k.end) return -1;
    unsigned char b = *k.p++;
    if (is_map && (b & 0xf0) == 0x80)
        *n = b & 0x0f;
    else if (!is_map && (b & 0xf0) == 0x90)
        *n = b & 0x0f;
    else if (b == (is_map ? 0xde : 0xdc)) {
        if (rd_be(&k, 2, n)) return -1;
    } else if (b == (is_map ? 0xdf : 0xdd)) {
        if (rd_be(&k, 4, n)) return -1;
    } else
        return -1;
    uint64_t least = is_map ? 2 * *n : *n;
    if (least > (uint64_t)(k.end - k.p)) return -1;
    c->p = k.p;
    return 0;
}

int mn_mp_map(mn_mp *c, uint32_t *n)
{
    uint64_t v;
    if (rd_container(c, true, &v)) return -1;
    *n = (uint32_t)v;
    return 0;
}

static int skip_value(mn_mp *c, int depth)
{
    if (c->p >= c->end || depth > MN_MP_MAX_DEPTH) return -1;
    unsigned char b = *c->p;
    uint64_t n;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return c->p++, 0;
    if ((b & 0xf0) == 0x80 || b == 0xde || b == 0xdf || (b & 0xf0) == 0x90 || b == 0xdc ||
        b == 0xdd) {
        bool is_map = (b & 0xf0) == 0x80 || b == 0xde || b == 0xdf;
        if (rd_container(c, is_map, &n)) return -1;
        for (uint64_t i = 0; i < (is_map ? 2 * n : n); i++)
            if (skip_value(c, depth + 1)) return -1;
        return 0;
    }
    int64_t iv;
    if (mn_mp_int(c, &iv) == 0) return 0;
    const void *d;
    size_t len;
    if (mn_mp_bin(c, &d, &len) == 0) return 0;
    const char *s;
    if (mn_mp_str(c, &s, &len) == 0) return 0;
    /* float 32/64, fixext 1..16, ext 8/16/32: a fixed or announced size */
    cursor k = {c->p + 1, c->end};
    uint64_t skip;
    switch (b) {
    case 0xca:
        skip = 4;
        break;
    case 0xcb:
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
    case 0xc7:
    case 0xc8:
    case 0xc9:
        if (rd_be(&k, b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4, &n)) return -1;
        skip = n + 1; /* the type byte, then the data */
        break;
    default:
        return -1;
    }
    if (skip > (uint64_t)(k.end - k.p)) return -1;
    c->p = k.p + skip;
    return 0;
}

int mn_mp_skip(mn_mp *c)
{
    return skip_value(c, 0);
}
