/*
 * test_envelope.c -- the wire format's decoder on good, truncated, corrupted
 * and random input: it accepts exactly the documented shape and never reads
 * outside the frame (run under ASan); and the bounds-checked reader of
 * untrusted msgpack (mn_mp) the same way.
 */
#include "internal.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static size_t pack(unsigned char *out, size_t cap, uint32_t ver, int kind, uint64_t id,
                   const char *method, int status, const void *payload, size_t len, int nframes)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_uint32(&pk, ver);
    msgpack_pack_int(&pk, kind);
    msgpack_pack_uint64(&pk, id);
    if (method) {
        msgpack_pack_str(&pk, strlen(method));
        msgpack_pack_str_body(&pk, method, strlen(method));
    } else {
        msgpack_pack_int(&pk, status);
    }
    if (payload) {
        msgpack_pack_bin(&pk, len);
        msgpack_pack_bin_body(&pk, payload, len);
    } else {
        msgpack_pack_nil(&pk);
    }
    msgpack_pack_int(&pk, nframes);
    size_t n = sb.size < cap ? sb.size : cap;
    memcpy(out, sb.data, n);
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static void test_good(void **unused)
{
    unsigned char buf[512];
    char err[256];
    mn_env e;
    size_t n =
        pack(buf, sizeof buf, MANTA_PROTOCOL_VERSION, MN_CALL, 1ULL << 40, "step", 0, "abc", 3, 0);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), 0);
    assert_int_equal(e.kind, MN_CALL);
    assert_true(e.id == 1ULL << 40);
    assert_int_equal(e.method_len, 4);
    assert_memory_equal(e.method, "step", 4);
    assert_int_equal(e.payload_len, 3);
    assert_memory_equal(e.payload, "abc", 3);
    n = pack(buf, sizeof buf, MANTA_PROTOCOL_VERSION, MN_ERROR, 9, NULL, MANTA_ENOMETHOD, NULL, 0,
             0);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), 0);
    assert_int_equal(e.status, MANTA_ENOMETHOD);
    assert_null(e.payload);
    /* a 300-byte payload uses bin 16; a 70000-byte one bin 32 */
    static unsigned char big[70000];
    static unsigned char bigbuf[70100];
    n = pack(bigbuf, sizeof bigbuf, MANTA_PROTOCOL_VERSION, MN_REPLY, 3, NULL, 0, big, 300, 0);
    assert_int_equal(mn_env_decode(bigbuf, n, &e, err, sizeof err), 0);
    assert_int_equal(e.payload_len, 300);
    n = pack(bigbuf, sizeof bigbuf, MANTA_PROTOCOL_VERSION, MN_REPLY, 3, NULL, 0, big, sizeof big,
             0);
    assert_int_equal(mn_env_decode(bigbuf, n, &e, err, sizeof err), 0);
    assert_int_equal(e.payload_len, sizeof big);
}

static void test_rejects(void **unused)
{
    unsigned char buf[512];
    char err[256];
    mn_env e;
    size_t n = pack(buf, sizeof buf, 2, MN_CALL, 1, "m", 0, NULL, 0, 0);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_non_null(strstr(err, "protocol version 2"));
    n = pack(buf, sizeof buf, 1, 7, 1, "m", 0, NULL, 0, 0);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_non_null(strstr(err, "kind"));
    n = pack(buf, sizeof buf, 1, MN_CALL, 1, NULL, 5, NULL, 0, 0); /* call without method */
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_non_null(strstr(err, "method"));
    n = pack(buf, sizeof buf, 1, MN_CALL, 1, "m", 0, NULL, 0, 2);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_non_null(strstr(err, "frames"));
    n = pack(buf, sizeof buf, 1, MN_CALL, 1, "m", 0, NULL, 0, 0);
    buf[n++] = 0xc0; /* trailing byte */
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_non_null(strstr(err, "trailing"));
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    n = pack(buf, sizeof buf, 1, MN_CALL, 1, longname, 0, NULL, 0, 0);
    assert_int_equal(mn_env_decode(buf, n, &e, err, sizeof err), MANTA_EPROTO);
    assert_int_equal(mn_env_decode(buf, 0, &e, err, sizeof err), MANTA_EPROTO);
}

static void test_truncations_and_noise(void **unused)
{
    unsigned char buf[512];
    char err[256];
    mn_env e;
    size_t n = pack(buf, sizeof buf, 1, MN_CALL, 123456789, "method", 0, "payload", 7, 0);
    /* every strict prefix is refused; copies on the heap let ASan see overreads */
    for (size_t k = 0; k < n; k++) {
        unsigned char *cut = malloc(k ? k : 1);
        memcpy(cut, buf, k);
        assert_int_equal(mn_env_decode(cut, k, &e, err, sizeof err), MANTA_EPROTO);
        free(cut);
    }
    /* single-byte corruptions never crash; they either decode or are refused */
    int accepted = 0;
    for (size_t k = 0; k < n; k++) {
        for (int v = 0; v < 256; v += 7) {
            unsigned char *c = malloc(n);
            memcpy(c, buf, n);
            c[k] = (unsigned char)v;
            int rc = mn_env_decode(c, n, &e, err, sizeof err);
            assert_true(rc == 0 || rc == MANTA_EPROTO);
            if (rc == 0) {
                accepted++;
                assert_true(e.payload_len <= n);
            }
            free(c);
        }
    }
    assert_true(accepted > 0); /* e.g. changes inside the payload bytes */
    /* random frames */
    srand(7);
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(rand() % 64);
        unsigned char *r = malloc(len ? len : 1);
        for (size_t j = 0; j < len; j++) r[j] = (unsigned char)rand();
        if (len) r[0] = 0x96; /* get past the first check most of the time */
        int rc = mn_env_decode(r, len, &e, err, sizeof err);
        assert_true(rc == 0 || rc == MANTA_EPROTO);
        free(r);
    }
}

/* The bounds-checked reader for untrusted msgpack (mn_mp): it walks every
 * type, refuses counts the bytes cannot back and nesting past the limit,
 * and never reads outside the buffer. */
static size_t pack_mixed(unsigned char *out, size_t cap)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "name", 4);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "abc", 3);
    msgpack_pack_str(&pk, 1);
    msgpack_pack_str_body(&pk, "n", 1);
    msgpack_pack_int64(&pk, -1234567890123);
    msgpack_pack_str(&pk, 1);
    msgpack_pack_str_body(&pk, "x", 1);
    msgpack_pack_array(&pk, 8);
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);
    msgpack_pack_double(&pk, 2.5);
    msgpack_pack_float(&pk, 1.5f);
    msgpack_pack_bin(&pk, 3);
    msgpack_pack_bin_body(&pk, "\1\2\3", 3);
    msgpack_pack_ext(&pk, 4, 7);
    msgpack_pack_ext_body(&pk, "abcd", 4);
    msgpack_pack_ext(&pk, 5, 7);
    msgpack_pack_ext_body(&pk, "abcde", 5);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    msgpack_pack_array(&pk, 0);
    size_t n = sb.size;
    assert_true(n <= cap);
    memcpy(out, sb.data, n);
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static void test_mp_reader(void **unused)
{
    unsigned char buf[256];
    size_t n = pack_mixed(buf, sizeof buf);
    mn_mp r;
    mn_mp_init(&r, buf, n);
    assert_int_equal(mn_mp_skip(&r), 0);
    assert_ptr_equal(r.p, buf + n);
    /* typed reads */
    mn_mp_init(&r, buf, n);
    uint32_t entries;
    const char *s;
    size_t sl;
    int64_t v;
    assert_int_equal(mn_mp_map(&r, &entries), 0);
    assert_int_equal(entries, 3);
    assert_int_equal(mn_mp_str(&r, &s, &sl), 0);
    assert_int_equal(mn_mp_int(&r, &v), -1); /* a string is not an int: nothing read */
    assert_int_equal(mn_mp_str(&r, &s, &sl), 0);
    assert_int_equal(sl, 3);
    assert_memory_equal(s, "abc", 3);
    assert_int_equal(mn_mp_skip(&r), 0);
    assert_int_equal(mn_mp_int(&r, &v), 0);
    assert_true(v == -1234567890123LL);
    /* every strict prefix is refused, from heap copies so ASan sees overreads */
    for (size_t k = 0; k < n; k++) {
        unsigned char *cut = malloc(k ? k : 1);
        memcpy(cut, buf, k);
        mn_mp_init(&r, cut, k);
        assert_int_equal(mn_mp_skip(&r), -1);
        free(cut);
    }
    /* counts the bytes cannot back */
    static const unsigned char lies[][8] = {{0xdd, 0xff, 0xff, 0xff, 0xff, 0, 0, 0},
                                            {0xdf, 0xff, 0xff, 0xff, 0xff, 0, 0, 0},
                                            {0xdb, 0xff, 0xff, 0xff, 0xff, 0, 0, 0},
                                            {0xc6, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0},
                                            {0xc9, 0xff, 0xff, 0xff, 0xff, 1, 0, 0},
                                            {0x9f, 0, 0, 0, 0, 0, 0, 0},
                                            {0x88, 0, 0, 0, 0, 0, 0, 0}};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        mn_mp_init(&r, lies[i], sizeof lies[i]);
        assert_int_equal(mn_mp_skip(&r), -1);
        mn_mp_init(&r, lies[i], sizeof lies[i]);
        assert_int_equal(mn_mp_map(&r, &entries), -1);
    }
    /* nesting: MN_MP_MAX_DEPTH levels pass, one more is refused */
    unsigned char deep[64];
    for (int d = MN_MP_MAX_DEPTH; d <= MN_MP_MAX_DEPTH + 1; d++) {
        memset(deep, 0x91, (size_t)d);
        deep[d] = 0xc0;
        mn_mp_init(&r, deep, (size_t)d + 1);
        assert_int_equal(mn_mp_skip(&r), d <= MN_MP_MAX_DEPTH ? 0 : -1);
    }
    /* random bytes never crash and never move past the end */
    srand(11);
    for (int i = 0; i < 50000; i++) {
        size_t len = (size_t)(rand() % 48);
        unsigned char *b = malloc(len ? len : 1);
        for (size_t j = 0; j < len; j++) b[j] = (unsigned char)rand();
        mn_mp_init(&r, b, len);
        while (r.p < r.end && mn_mp_skip(&r) == 0) {
        }
        assert_true(r.p <= r.end);
        free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_truncations_and_noise),
        cmocka_unit_test(test_mp_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
