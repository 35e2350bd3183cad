/*
 * fuzz_spawn.c -- libFuzzer harness for a node agent's `spawn` request as it
 * arrives: a call envelope (mn_env_decode) whose inline payload goes to the
 * agent's own parser (mn_node_parse_spawn, runtime/core/node.c), the
 * bounds-checked msgpack reader that never allocates what a header
 * announces.
 *
 * libFuzzer's -malloc_limit_mb (the same as -rss_limit_mb unless set) turns
 * an allocation out of proportion to the input into a report.
 */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so ASan sees any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    mn_env e;
    char err[256];
    if (mn_env_decode(buf, size, &e, err, sizeof err) == 0 && e.kind == MN_CALL && e.method &&
        e.method_len == 5 && !memcmp(e.method, "spawn", 5) && e.payload) {
        mn_node_parse_spawn(e.payload, e.payload_len, err, sizeof err);
    }
    /* The payload alone too: the parser must hold on any bytes. */
    mn_node_parse_spawn(buf, size, err, sizeof err);
    free(buf);
    return 0;
}
