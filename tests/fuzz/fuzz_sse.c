/*
 * fuzz_sse.c -- libFuzzer harness for the MCP client's answer parsing
 * (actors/mcp.c): mcp_sse_find_response, which splits a text/event-stream
 * body into events, joins their data lines, parses each as JSON-RPC and
 * picks the response with the request's id; and the application/json path
 * (cJSON_ParseWithLength of the whole body).
 *
 * The first 8 input bytes are the JSON-RPC id to look for (little endian,
 * only the low 16 bits kept so that small ids in the seeds match); the rest
 * is the body. The body is also scanned from every offset the client's
 * incremental reader uses (after each blank line), as a stream arriving in
 * pieces does.
 */
#include "mcp.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int64_t id = (int64_t)(data[0] | (unsigned)data[1] << 8);
    size_t len = size - 2;
    char *body = malloc(len ? len : 1);
    if (!body) return 0;
    if (len) memcpy(body, data + 2, len);

    bool bad = false;
    uint64_t skipped = 0;
    cJSON *r = mcp_sse_find_response(body, len, id, &bad, &skipped);
    if (r) {
        char *s = cJSON_PrintUnformatted(r);
        free(s);
        cJSON_Delete(r);
    }
    /* From each event boundary on, as the client rescans a growing body. */
    for (size_t i = 1; i < len; i++) {
        if (body[i - 1] != '\n' || (i >= 2 && body[i - 2] != '\n' && body[i - 2] != '\r')) continue;
        r = mcp_sse_find_response(body + i, len - i, id, NULL, NULL);
        cJSON_Delete(r);
    }
    cJSON *doc = cJSON_ParseWithLength(body, len);
    cJSON_Delete(doc);
    free(body);
    return 0;
}
