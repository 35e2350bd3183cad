/*
 * fuzz_envelope.c -- libFuzzer harness for mn_env_decode (runtime/core/
 * envelope.c): the first frame of every message a mailbox, a node agent or
 * an object server receives, straight from the socket.
 *
 * Besides "no crash, no sanitizer report" it checks the decoder's contract:
 * on success every pointer it returns lies inside the input frame.
 */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const uint8_t *buf, size_t len, const void *p, size_t n)
{
    if (!p) {
        if (n) abort();
        return;
    }
    const uint8_t *q = p;
    if (q < buf || q > buf + len || n > (size_t)(buf + len - q)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly `size` bytes, so reads past the frame are caught. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    mn_env e;
    char err[256];
    if (mn_env_decode(buf, size, &e, err, sizeof err) == 0) {
        if (e.kind == MN_CALL || e.kind == MN_CAST) {
            if (!e.method) abort();
            inside(buf, size, e.method, e.method_len);
        }
        inside(buf, size, e.payload, e.payload_len);
        if (e.nframes < 0 || e.nframes > 1) abort();
    } else if (!memchr(err, 0, sizeof err)) {
        abort(); /* the message must be a terminated string */
    }
    free(buf);
    return 0;
}
