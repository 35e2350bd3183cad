/*
 * test_envelope.c -- the wire format's decoder on good, truncated, corrupted
 * and random input: it accepts exactly the documented shape and never reads
 * outside the frame (run under ASan).
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_truncations_and_noise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
