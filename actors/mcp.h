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
 * own JSON-RPC id and callback; at most max_connections of them are on the
 * wire (each on a kept-alive connection), the rest wait in order. Calls made
 * before the handshake is done wait for it (the first call starts it). If
 * the server forgets the session (404), the client runs the handshake again
 * and sends the request once more. Transport failures are retried with
 * back-off (see "Outcomes" below); the session is ended (DELETE) when the
 * client is freed.
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

/* The protocol revision sent in initialize by default. The server answers
 * with the revision it will speak; the client works with every dated
 * revision from MCP_PROTOCOL_OLDEST on ("YYYY-MM-DD": 2024-11-05,
 * 2025-03-26, 2025-06-18, 2025-11-25 and any later one, spoken as the
 * newest it knows). Any other answer fails the handshake with MANTA_EPROTO
 * and a message naming the revision the server offered; a session the
 * server opened for it is ended (DELETE) rather than left behind. */
#define MCP_PROTOCOL_VERSION "2025-11-25"
#define MCP_PROTOCOL_OLDEST  "2024-11-05"

/* True when the client can speak revision v (see above). */
bool mcp_protocol_supported(const char *v);

/* Errors: 0 or a MANTA_E* code (manta.h; manta_strerror, manta_errname).
 * A callback reports one of these:
 *   MANTA_ETIMEDOUT  no complete answer within timeout_ms (or no connection
 *                    within connect_timeout_ms)
 *   MANTA_ECONNECT   refused or unreachable
 *   MANTA_ERESOLVE   the host name did not resolve
 *   MANTA_ETLS       TLS handshake or certificate check failed
 *   MANTA_EHTTP      a status outside 2xx (http_status says which), or a
 *                    redirect not followed (see mcp_url)
 *   MANTA_ERPC       a JSON-RPC error object (rpc_code says which)
 *   MANTA_EJSON      the body, or an SSE event's data, is not JSON
 *   MANTA_EPROTO     not a valid MCP answer (Content-Type, JSON-RPC version,
 *                    id, an SSE stream without our response, protocol version)
 *   MANTA_ETOOL      the tool result has isError: true
 *   MANTA_EMSGSIZE   the answer is over max_body
 *   MANTA_ETRANSFER  the connection broke mid-answer (reset, hang-up)
 *   MANTA_ESESSION   the server forgot the session twice
 *   MANTA_ECLOSED    the client was freed first
 *   MANTA_EINVAL     (mcp_call_tool_text) the tool's text argument cannot be
 *                    found from its inputSchema
 *   MANTA_ENOMEM
 *
 * Outcomes. Each error falls in one of two classes (mcp_classify):
 *   policy     the caller's request was at fault, and its text says how:
 *              ETOOL (isError: true, e.g. a validation message), ERPC
 *              -32602 (invalid params: an unknown tool, bad arguments),
 *              EMSGSIZE (the input made an answer over max_body);
 *   transport  the server, the network or the configuration failed, not
 *              the request: ECONNECT, ERESOLVE, ETIMEDOUT, ETRANSFER, EHTTP,
 *              EJSON, EPROTO, ESESSION, ETLS, EINVAL, ECLOSED and the other
 *              ERPC codes (-32603 internal error, ...).
 * Transport failures are retried with exponential back-off (max_retries,
 * backoff_ms doubled per retry up to backoff_max_ms, each jittered to
 * 50-100%) except those a retry cannot mend (EHTTP other than 5xx, ETLS,
 * EINVAL, ENOMEM, ECLOSED, a refused protocol version); the callback then
 * sees the last attempt's error, with "(after N attempts)" in its message
 * and attempts = N. A tools/call may therefore run more than once on the
 * server when an answer was lost (a timeout, a 5xx, a reset): tools should
 * be idempotent, as RL tools (pure functions of their input) usually are.
 *
 * UTF-8. Requests are always valid UTF-8 JSON: in the arguments (keys and
 * strings at any depth) and the tool name, every maximal ill-formed byte
 * subsequence is replaced by U+FFFD (EF BF BD), as WHATWG and Python's
 * errors="replace" do (mcp_utf8_fix); valid text goes unchanged. */

/* Client settings. Fill with mcp_config_init, then set url and the rest. */
typedef struct mcp_config {
    const char *url;              /* required: the MCP endpoint */
    const char *protocol_version; /* default MCP_PROTOCOL_VERSION */
    const char *client_name;      /* clientInfo.name, default "manta" */
    const char *client_version;   /* clientInfo.version, default "0.1" */
    long timeout_ms;              /* per HTTP request, default 30000 */
    long connect_timeout_ms;      /* default 5000 */
    size_t max_body;              /* answer size limit, default 16 MiB */
    int max_retries;              /* retries of a transport failure, default 5 */
    long backoff_ms;              /* first back-off, default 250 */
    long backoff_max_ms;          /* back-off cap, default 4000 */
    int max_connections;          /* requests on the wire at once (each holds
                                     one kept-alive connection), default 16;
                                     more wait in order in the client */
    const char *const *headers;   /* extra request headers "Name: value", */
    size_t n_headers;             /*   e.g. "Authorization: Bearer ..." */
} mcp_config;

/* Fills cfg with the defaults above (url NULL). */
void mcp_config_init(mcp_config *cfg);

/* The class of a result (see "Outcomes" above). */
typedef enum mcp_outcome {
    MCP_OUTCOME_OK = 0,
    MCP_OUTCOME_POLICY,    /* the request's fault: show it to whoever made it */
    MCP_OUTCOME_TRANSPORT, /* the server's or the network's: not the request's */
} mcp_outcome;

/* The class of err (rpc_code for MANTA_ERPC). Pure; thread-safe. */
mcp_outcome mcp_classify(int err, int rpc_code);
/* "ok", "policy", "transport". */
const char *mcp_outcome_name(mcp_outcome o);

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
    long http_status;    /* of the answer, 0 when none arrived */
    int rpc_code;        /* the JSON-RPC error code for MANTA_ERPC, else 0 */
    int64_t rpc_id;      /* the JSON-RPC id of the request */
    double elapsed_ms;   /* from the call to the callback, retries included */
    mcp_outcome outcome; /* mcp_classify(err, rpc_code) */
    int attempts;        /* 1 + retries made */
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
    uint64_t retries;                 /* requests sent again after a transport failure */
    uint64_t redirects;               /* 307/308 answers followed */
    uint64_t sessions_closed;         /* DELETEs sent to end a session */
    uint64_t max_on_wire;             /* most requests on the wire at once */
    uint64_t queued; /* requests that waited for a connection (max_connections all in use) */
} mcp_stats;

typedef struct mcp_client mcp_client;

/* Creates a client for cfg->url on http (borrowed: it must outlive the
 * client and be driven by the same thread). Copies cfg. Sends nothing yet.
 * Returns NULL when cfg->url is NULL or memory runs out. */
mcp_client *mcp_new(manta_http_client *http, const mcp_config *cfg);

/* Frees the client. Pending requests end first: their callbacks fire
 * inside this call with MANTA_ECLOSED. If a session is open, a DELETE with
 * its Mcp-Session-Id ending it is sent without waiting for the answer (the
 * HTTP client completes it later: see mcp_close_all). May be called from a
 * callback of this client. mcp_free(NULL) is a no-op. */
void mcp_free(mcp_client *m);

/* Frees the n clients in ms (NULL entries skipped; all on http) and then
 * drives http (manta_http_step) until nothing is in flight on it (their
 * session DELETEs answered), at most timeout_ms, so that the sessions
 * really end on the servers before http is freed. Not from a callback. */
void mcp_close_all(mcp_client *const *ms, size_t n, manta_http_client *http, int timeout_ms);

/* Redirects: a 307 or 308 answer whose Location has the same origin
 * (scheme, host, port) is followed, at most 5 times per request, with the
 * same method and body; the client then keeps using the new URL (so a
 * server that redirects /mcp to /mcp/ costs one extra round trip, once).
 * Other redirects fail with MANTA_EHTTP naming the Location. mcp_url is
 * the URL in use now (valid until the next drive). */
const char *mcp_url(const mcp_client *m);

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

/* tools/call of a tool that takes one text: arguments {arg: text}, text
 * being len bytes (made valid UTF-8, see above; a NUL ends it). arg NULL:
 * the argument is found from the tool's inputSchema (mcp_tool_text_arg),
 * listing the tools first when the client has no list yet; when it cannot
 * be found, cb gets MANTA_EINVAL with the reason, a transport-class
 * outcome (the configuration is at fault, not the text). Returns and fires
 * as mcp_call_tool. */
int mcp_call_tool_text(mcp_client *m, const char *name, const char *arg, const char *text,
                       size_t len, mcp_done_fn cb, void *cb_arg);

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

/* Lists the tools (tools/list) and waits for the answer, driving http with
 * manta_http_step for at most timeout_ms (retries included): for start-up
 * code that needs the tools before it can go on. Returns 0, or the error
 * with a message in why[cap]. Not from a callback. */
int mcp_list_tools_wait(mcp_client *m, int timeout_ms, char *why, size_t cap);

/* The argument that receives a tool's text when the configuration names
 * none: in tools (a tools/list array), the tool named `tool` must have an
 * inputSchema with exactly one required property, of type "string"; its
 * name goes to out[cap]. Returns 0, or MANTA_EINVAL with why[cap] saying
 * what is wrong (the tool is missing, naming those there are; no or
 * several required properties, naming them; a non-string type). Pure. */
int mcp_tool_text_arg(const cJSON *tools, const char *tool, char *out, size_t cap, char *why,
                      size_t why_cap);

/* Replaces every maximal ill-formed subsequence of s[len] by U+FFFD (see
 * "Outcomes" above). Returns a new NUL-terminated string (the caller
 * frees it) and its length in *out_len (may be NULL), or NULL when out of
 * memory. A NUL byte in s is kept (it is valid UTF-8; JSON escapes it). */
char *mcp_utf8_fix(const char *s, size_t len, size_t *out_len);

/* Errors by kind, with the first few messages of each kind, for logs and
 * run summaries. A plain value (no heap); the caller owns it and keeps it
 * consistent (one thread). kind is a short name such as manta_errname(err)
 * ("ETOOL", "ECONNECT") or a caller's own ("EUNKNOWN"). */
#define MCP_ERRORS_KINDS   24
#define MCP_ERRORS_SAMPLES 3
#define MCP_ERRORS_TEXT    200
typedef struct mcp_error_kind {
    char kind[16];
    mcp_outcome outcome;
    uint64_t count;
    int n_samples;
    char samples[MCP_ERRORS_SAMPLES][MCP_ERRORS_TEXT]; /* cut to fit, valid UTF-8 */
} mcp_error_kind;
typedef struct mcp_errors {
    mcp_error_kind kinds[MCP_ERRORS_KINDS];
    int n_kinds;
    uint64_t total;
    uint64_t dropped_kinds; /* errors of kinds beyond MCP_ERRORS_KINDS (counted in total) */
} mcp_errors;

/* Counts one error of kind with message; returns true when the message was
 * kept as one of the first MCP_ERRORS_SAMPLES of its kind (log it then). */
bool mcp_errors_add(mcp_errors *e, const char *kind, mcp_outcome outcome, const char *message);
/* {"ETOOL": {"outcome": "policy", "count": 3, "first": ["...", ...]}, ...};
 * NULL when out of memory. The caller owns it. */
cJSON *mcp_errors_json(const mcp_errors *e);

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
