/*
 * mcp.h - an asynchronous MCP (Model Context Protocol) client over the
 * streamable HTTP transport, built on the runtime's HTTP client.
 *
 * One mcp_client talks to one MCP endpoint (e.g. http://127.0.0.1:8000/mcp).
 * Every client message is its own POST carrying a JSON-RPC 2.0 object, with
 * "Accept: application/json, text/event-stream"; the server answers with one
 * JSON object or with an SSE stream whose events may carry notifications
 * before the response. The client runs the handshake (initialize, then the
 * notifications/initialized notification), keeps the Mcp-Session-Id the
 * server hands out and echoes it, sends MCP-Protocol-Version after the
 * handshake, and then serves tools/list and tools/call.
 *
 * Asynchronous: any number of calls may be in flight at once, each with its
 * own JSON-RPC id and callback. Calls made before the handshake is done wait
 * for it (the first call starts it). If the server forgets the session (404),
 * the client runs the handshake again and sends the request once more.
 *
 * Every callback fires exactly once per accepted request, with 0 or a
 * negative MANTA_E* code from the runtime's one table (manta.h) and a
 * message saying what went wrong: timeout, refused connection, non-2xx
 * status, JSON-RPC error object, invalid JSON, a missing or mismatched
 * response, a tool result with isError: true. Every failure is counted by
 * code. Timeouts bound every request, so nothing waits forever.
 *
 * Threading: the client is driven by its manta_http_client (manta_http_step
 * or an event loop calling manta_http_on_fd); callbacks run there. Use a
 * client only from the thread that drives its HTTP client.
 */
#ifndef MANTA_MCP_H
#define MANTA_MCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "manta_http.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The protocol revision sent in initialize by default. The client also
 * accepts a server that answers with any revision in MCP_PROTOCOL_VERSIONS. */
#define MCP_PROTOCOL_VERSION "2025-11-25"
#define MCP_PROTOCOL_VERSIONS                                                                      \
    {                                                                                              \
        "2025-11-25", "2025-06-18", "2025-03-26"                                                   \
    }

/* Errors: 0 or a MANTA_E* code (manta.h; manta_strerror, manta_errname).
 * A callback reports one of these:
 *   MANTA_ETIMEDOUT  no complete answer within timeout_ms (or no connection
 *                    within connect_timeout_ms)
 *   MANTA_ECONNECT   refused or unreachable, after connect_retries retries
 *   MANTA_ERESOLVE   the host name did not resolve, after the retries
 *   MANTA_ETLS       TLS handshake or certificate check failed
 *   MANTA_EHTTP      a status outside 2xx (http_status says which)
 *   MANTA_ERPC       a JSON-RPC error object (rpc_code says which)
 *   MANTA_EJSON      the body, or an SSE event's data, is not JSON
 *   MANTA_EPROTO     not a valid MCP answer (Content-Type, JSON-RPC version,
 *                    id, an SSE stream without our response, protocol version)
 *   MANTA_ETOOL      the tool result has isError: true
 *   MANTA_EMSGSIZE   the answer is over max_body
 *   MANTA_ETRANSFER  the connection broke mid-answer
 *   MANTA_ESESSION   the server forgot the session twice
 *   MANTA_ECLOSED    the client was freed first
 *   MANTA_EINVAL, MANTA_ENOMEM */

/* Client settings. Fill with mcp_config_init, then set url and the rest. */
typedef struct mcp_config {
    const char *url;              /* required: the MCP endpoint */
    const char *protocol_version; /* default MCP_PROTOCOL_VERSION */
    const char *client_name;      /* clientInfo.name, default "manta" */
    const char *client_version;   /* clientInfo.version, default "0.1" */
    long timeout_ms;              /* per HTTP request, default 30000 */
    long connect_timeout_ms;      /* default 5000 */
    size_t max_body;              /* answer size limit, default 16 MiB */
    int connect_retries;          /* retries when the connection fails, default 2 */
    const char *const *headers;   /* extra request headers "Name: value", */
    size_t n_headers;             /*   e.g. "Authorization: Bearer ..." */
} mcp_config;

/* Fills cfg with the defaults above (url NULL). */
void mcp_config_init(mcp_config *cfg);

/* What a callback gets. Pointers are owned by the client and valid only
 * during the callback. */
typedef struct mcp_result {
    int err;             /* 0 or a MANTA_E* code */
    const char *message; /* never NULL: "" when OK, else what went wrong */
    /* tools/call: the "text" items of result.content joined by "\n" ("" when
     * none); set for MANTA_OK and MANTA_ETOOL, NULL otherwise. */
    const char *text;
    /* The JSON-RPC "result" member (MANTA_OK, MANTA_ETOOL), else NULL. For
     * tools/list it is {"tools": [...]} with every page merged. */
    const cJSON *result;
    long http_status; /* of the answer, 0 when none arrived */
    int rpc_code;     /* the JSON-RPC error code for MANTA_ERPC, else 0 */
    int64_t rpc_id;   /* the JSON-RPC id of the request */
    double elapsed_ms;
} mcp_result;

typedef void (*mcp_done_fn)(const mcp_result *res, void *arg);

/* Counters since mcp_new. */
typedef struct mcp_stats {
    uint64_t requests;  /* JSON-RPC messages posted (handshake and resends included) */
    uint64_t calls;     /* tools/call accepted */
    uint64_t completed; /* callbacks fired */
    uint64_t ok;
    uint64_t errors[MANTA_ERR_COUNT]; /* callbacks fired, by manta_err_index(err) */
    uint64_t json_answers;            /* answers as application/json */
    uint64_t sse_answers;             /* answers as text/event-stream */
    uint64_t sse_events_skipped;      /* SSE events that were not our response */
    uint64_t handshakes;              /* initialize handshakes completed */
    uint64_t session_resends;         /* requests sent again after a lost session */
} mcp_stats;

typedef struct mcp_client mcp_client;

/* Creates a client for cfg->url on http (borrowed: it must outlive the
 * client and be driven by the same thread). Copies cfg. Sends nothing yet.
 * Returns NULL when cfg->url is NULL or memory runs out. */
mcp_client *mcp_new(manta_http_client *http, const mcp_config *cfg);

/* Frees the client. Pending requests end first: their callbacks fire inside
 * this call with MANTA_ECLOSED. If a session is open, a DELETE ending it is
 * sent without waiting for the answer (the HTTP client completes it later).
 * May be called from a callback of this client. mcp_free(NULL) is a no-op. */
void mcp_free(mcp_client *m);

/* Runs the handshake now (it also runs on its own before the first call).
 * cb (may be NULL) fires once the server has accepted
 * notifications/initialized; res->result is the initialize result. If the
 * client is already initialized, cb fires at the next drive with MANTA_OK.
 * Returns 0, or MANTA_EINVAL / MANTA_ENOMEM / MANTA_ECLOSED (cb never fires). */
int mcp_initialize(mcp_client *m, mcp_done_fn cb, void *arg);

/* tools/list, following nextCursor pages. Returns 0 or an error as above. */
int mcp_list_tools(mcp_client *m, mcp_done_fn cb, void *arg);

/* tools/call {name, arguments}. arguments is copied (NULL: {}); it must be
 * a JSON object. Returns 0 (cb fires exactly once) or MANTA_EINVAL,
 * MANTA_ENOMEM, MANTA_ECLOSED (cb never fires). */
int mcp_call_tool(mcp_client *m, const char *name, const cJSON *arguments, mcp_done_fn cb,
                  void *arg);

/* The same with arguments as JSON text ("{\"expression\":\"1+2\"}"); returns
 * MANTA_EINVAL when it is not a JSON object. */
int mcp_call_tool_json(mcp_client *m, const char *name, const char *arguments_json, mcp_done_fn cb,
                       void *arg);

/* Requests accepted whose callback has not fired. */
int mcp_in_flight(const mcp_client *m);

/* True once the handshake has completed (and the session not lost since). */
bool mcp_ready(const mcp_client *m);

/* The session id the server gave, or NULL. Valid until the next drive. */
const char *mcp_session_id(const mcp_client *m);

/* The protocol revision the server chose, or NULL before the handshake. */
const char *mcp_protocol_version(const mcp_client *m);

/* The tools of the last completed tools/list (a cJSON array owned by the
 * client, valid until the next tools/list completes), or NULL. */
const cJSON *mcp_tools(const mcp_client *m);

void mcp_get_stats(const mcp_client *m, mcp_stats *out);

/* Parses an SSE body (text/event-stream) and returns the JSON-RPC response
 * with id rpc_id, or NULL. *bad_json is set when an event's data was not
 * valid JSON, *skipped counts the other events. The caller owns the result
 * (cJSON_Delete). Exposed for tests and fuzzers. */
cJSON *mcp_sse_find_response(const char *body, size_t len, int64_t rpc_id, bool *bad_json,
                             uint64_t *skipped);

#ifdef __cplusplus
}
#endif

#endif /* MANTA_MCP_H */
