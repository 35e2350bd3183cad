/*
 * mcp.c - the MCP client over streamable HTTP (contract in mcp.h).
 *
 * Each JSON-RPC message is a request record (mcp_req) that lives on exactly
 * one of two lists: `queued` (waiting for the handshake) or `inflight` (its
 * POST is with the HTTP client). The handshake is itself two records: the
 * initialize request and then the notifications/initialized notification;
 * when the second is accepted the client is ready and the queue is sent.
 *
 * An answer is checked in layers, and the first layer that fails decides the
 * error kind: transport (timeout, refused, too large), HTTP status, content
 * type (JSON body or SSE stream), JSON syntax, JSON-RPC shape and id, the
 * JSON-RPC error member, and finally the MCP result itself (isError).
 *
 * Callbacks may free the client. To keep that safe, every entry from the
 * HTTP layer counts itself in `depth`; mcp_free inside a callback only marks
 * the client dying, ends everything pending, and the memory goes when the
 * outermost entry returns.
 */
#include "mcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* A tools/list that keeps handing out cursors is cut off here. */
#define MAX_LIST_PAGES 100
/* Redirects followed per request before giving up (a loop, most likely). */
#define MAX_REDIRECTS 5

enum req_kind {
    K_INIT,        /* initialize (internal) */
    K_NOTE_INIT,   /* notifications/initialized (internal) */
    K_INIT_WAITER, /* mcp_initialize's callback, waiting for the handshake */
    K_LIST,        /* tools/list */
    K_CALL,        /* tools/call */
};

enum client_state { S_NEW, S_INIT, S_READY };

typedef struct mcp_req {
    struct mcp_client *m;
    struct mcp_req *prev, *next;
    enum req_kind kind;
    const char *method;
    cJSON *params;
    int64_t id; /* JSON-RPC id of the last send; 0 for a notification */
    mcp_done_fn cb;
    void *arg;
    uint64_t http_id;
    unsigned session_gen; /* the handshake it was sent under */
    bool resent;          /* already sent again after a lost session */
    bool with_session;    /* sent with an Mcp-Session-Id header */
    bool orphan;          /* the client is gone; only free it */
    bool backoff;         /* http_id is a back-off timer, not a POST */
    int tries;            /* retries made after transport failures */
    int redirects;        /* redirects followed */
    int pages;
    cJSON *acc; /* tools/list: tools gathered so far */
    char *text; /* mcp_call_tool_text without arg: the text, until the arg is known */
    /* An SSE answer watched while it streams: the response, once seen. */
    size_t sse_scanned; /* body bytes already parsed (whole events) */
    cJSON *early;
    bool early_bad;
    uint64_t early_skipped;
    double start_ms;
} mcp_req;

struct mcp_client {
    manta_http_client *http;
    char *url, *protocol_version, *client_name, *client_version;
    char **headers;
    size_t n_headers;
    long timeout_ms, connect_timeout_ms;
    size_t max_body;
    int max_retries, max_conn;
    long backoff_ms, backoff_max_ms;
    uint64_t rng;

    enum client_state state;
    bool version_rejected; /* the last handshake failed on the protocol version */
    unsigned gen;          /* handshakes completed */
    char *session_id;
    char *server_version;
    cJSON *init_result;
    cJSON *tools;
    int64_t next_id;
    mcp_req *queued, *inflight;
    mcp_req *backlog;    /* ready to post, waiting for a free connection */
    mcp_req *need_tools; /* text calls waiting for tools/list to find their argument */
    bool listing;        /* the tools/list for need_tools is in flight */
    int on_wire;         /* POSTs with the HTTP client now */
    int n_user;          /* requests with a callback still to fire */
    mcp_stats stats;
    int depth;
    bool dying;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

void mcp_config_init(mcp_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->protocol_version = MCP_PROTOCOL_VERSION;
    cfg->client_name = "manta";
    cfg->client_version = "0.1";
    cfg->timeout_ms = 30000;
    cfg->connect_timeout_ms = 5000;
    cfg->max_body = (size_t)16 << 20;
    cfg->max_retries = 5;
    cfg->backoff_ms = 250;
    cfg->backoff_max_ms = 4000;
    cfg->max_connections = 16;
}

/* "YYYY-MM-DD", from MCP_PROTOCOL_OLDEST on. */
bool mcp_protocol_supported(const char *v)
{
    if (!v || strlen(v) != 10) return false;
    for (int i = 0; i < 10; i++) {
        bool dash = i == 4 || i == 7;
        if (dash ? v[i] != '-' : (v[i] < '0' || v[i] > '9')) return false;
    }
    return strcmp(v, MCP_PROTOCOL_OLDEST) >= 0;
}

mcp_outcome mcp_classify(int err, int rpc_code)
{
    switch (err) {
    case MANTA_OK:
        return MCP_OUTCOME_OK;
    case MANTA_ETOOL:
    case MANTA_EMSGSIZE:
        return MCP_OUTCOME_POLICY;
    case MANTA_ERPC:
        return rpc_code == -32602 ? MCP_OUTCOME_POLICY : MCP_OUTCOME_TRANSPORT;
    default:
        return MCP_OUTCOME_TRANSPORT;
    }
}

const char *mcp_outcome_name(mcp_outcome o)
{
    switch (o) {
    case MCP_OUTCOME_OK:
        return "ok";
    case MCP_OUTCOME_POLICY:
        return "policy";
    default:
        return "transport";
    }
}

/* ---- lists ------------------------------------------------------------- */

static void req_link(mcp_req **head, mcp_req *r)
{
    r->prev = NULL;
    r->next = *head;
    if (*head) (*head)->prev = r;
    *head = r;
}

/* Appends at the tail so queued requests go out in the order made. */
static void req_append(mcp_req **head, mcp_req *r)
{
    r->next = NULL;
    if (!*head) {
        r->prev = NULL;
        *head = r;
        return;
    }
    mcp_req *t = *head;
    while (t->next) t = t->next;
    t->next = r;
    r->prev = t;
}

static void req_unlink(mcp_req **head, mcp_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (*head == r)
        *head = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void req_free(mcp_req *r)
{
    if (!r) return;
    cJSON_Delete(r->params);
    cJSON_Delete(r->acc);
    cJSON_Delete(r->early);
    free(r->text);
    free(r);
}

static bool user_kind(enum req_kind k)
{
    return k == K_INIT_WAITER || k == K_LIST || k == K_CALL;
}

/* ---- completion -------------------------------------------------------- */

static void on_http(const manta_http_result *res, void *arg);

/* Whether a failure of a user request may be mended by sending it again. */
static bool retryable(const mcp_client *m, const mcp_req *r, const mcp_result *res)
{
    if (!user_kind(r->kind) || m->dying || r->tries >= m->max_retries) return false;
    if (mcp_classify(res->err, res->rpc_code) != MCP_OUTCOME_TRANSPORT) return false;
    switch (res->err) {
    case MANTA_EHTTP:
        return res->http_status >= 500;
    case MANTA_ETLS:
    case MANTA_EINVAL:
    case MANTA_ENOMEM:
    case MANTA_ECLOSED:
    case MANTA_ECANCELED:
        return false;
    case MANTA_EPROTO:
        return !m->version_rejected;
    default:
        return true;
    }
}

/* Back-off before retry n (1-based): backoff_ms doubled per retry up to
 * backoff_max_ms, then jittered to [d/2, d] so that many requests that
 * failed together (a server restart) do not come back together. */
static long backoff_for(mcp_client *m, int n)
{
    long d = m->backoff_ms;
    for (int i = 1; i < n && d < m->backoff_max_ms; i++) d *= 2;
    if (d > m->backoff_max_ms) d = m->backoff_max_ms;
    m->rng ^= m->rng << 13, m->rng ^= m->rng >> 7, m->rng ^= m->rng << 17;
    if (d > 1) d = d / 2 + (long)(m->rng % (uint64_t)(d - d / 2 + 1));
    return d;
}

/* Puts r to sleep before its next try; false when no timer could be set. */
static bool schedule_retry(mcp_client *m, mcp_req *r)
{
    long delay = backoff_for(m, r->tries + 1);
    if (manta_http_after(m->http, delay, on_http, r, &r->http_id) != 0) return false;
    r->tries++;
    r->backoff = true;
    m->stats.retries++;
    req_link(&m->inflight, r);
    return true;
}

/* Fires r's callback with res (filling the common fields), counts it and
 * frees r; or, for a transport failure that a retry may mend, schedules
 * the retry instead. r must be on no list. */
static void req_complete(mcp_client *m, mcp_req *r, mcp_result *res)
{
    if (!res->message) res->message = "";
    if (res->err != MANTA_OK && retryable(m, r, res) && schedule_retry(m, r)) return;
    char msg[1024];
    if (res->err != MANTA_OK && r->tries > 0) {
        snprintf(msg, sizeof msg, "%s (after %d attempts)", res->message, r->tries + 1);
        res->message = msg;
    }
    res->rpc_id = r->id;
    res->elapsed_ms = now_ms() - r->start_ms;
    res->outcome = mcp_classify(res->err, res->rpc_code);
    res->attempts = r->tries + 1;
    if (user_kind(r->kind)) {
        m->n_user--;
        m->stats.completed++;
        if (res->err == MANTA_OK)
            m->stats.ok++;
        else
            m->stats.errors[manta_err_index(res->err)]++;
        if (r->cb) {
            m->depth++;
            r->cb(res, r->arg);
            m->depth--;
        }
    }
    req_free(r);
}

static void req_fail(mcp_client *m, mcp_req *r, int err, long status, const char *msg)
{
    mcp_result res;
    memset(&res, 0, sizeof res);
    res.err = err;
    res.http_status = status;
    res.message = msg;
    req_complete(m, r, &res);
}

/* Ends every queued request with err (after a failed handshake, or on
 * free); those that may retry go to sleep instead. A retry cannot join
 * the queue inside this loop: it waits for its timer first. */
static void fail_queue(mcp_client *m, int err, const char *msg)
{
    while (m->queued) {
        mcp_req *r = m->queued;
        req_unlink(&m->queued, r);
        req_fail(m, r, err, 0, msg);
    }
}

/* Ends every request waiting for a connection (on free). */
static void fail_backlog(mcp_client *m, int err, const char *msg)
{
    while (m->backlog) {
        mcp_req *r = m->backlog;
        req_unlink(&m->backlog, r);
        req_fail(m, r, err, 0, msg);
    }
}

static void really_free(mcp_client *m)
{
    for (size_t i = 0; i < m->n_headers; i++) free(m->headers[i]);
    free(m->headers);
    free(m->url);
    free(m->protocol_version);
    free(m->client_name);
    free(m->client_version);
    free(m->session_id);
    free(m->server_version);
    cJSON_Delete(m->init_result);
    cJSON_Delete(m->tools);
    free(m);
}

/* ---- sending ----------------------------------------------------------- */

static int on_body(const char *content_type, const char *body, size_t len, void *arg);

static char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static char *fmt_header(const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 3;
    char *h = malloc(n);
    if (h) snprintf(h, n, "%s: %s", name, value);
    return h;
}

/* Posts r (a new JSON-RPC id unless it is a notification) and puts it on the
 * in-flight list. Returns MANTA_OK, or an error with r untouched elsewhere. */
static int req_post(mcp_client *m, mcp_req *r)
{
    bool note = r->kind == K_NOTE_INIT;
    cJSON *o = cJSON_CreateObject();
    if (!o) return MANTA_ENOMEM;
    int64_t id = note ? 0 : m->next_id++;
    bool ok = cJSON_AddStringToObject(o, "jsonrpc", "2.0") != NULL;
    if (!note) ok &= cJSON_AddNumberToObject(o, "id", (double)id) != NULL;
    ok &= cJSON_AddStringToObject(o, "method", r->method) != NULL;
    if (r->params) {
        cJSON *p = cJSON_Duplicate(r->params, 1);
        ok &= p && cJSON_AddItemToObject(o, "params", p);
    }
    char *body = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!body) return MANTA_ENOMEM;

    /* Content-Type, Accept, session, protocol version, then the user's. */
    size_t nh = 0;
    char *own[2] = {NULL, NULL};
    const char **hdrs = malloc((4 + m->n_headers) * sizeof *hdrs);
    if (!hdrs) {
        free(body);
        return MANTA_ENOMEM;
    }
    hdrs[nh++] = "Content-Type: application/json";
    hdrs[nh++] = "Accept: application/json, text/event-stream";
    bool ok_h = true;
    if (r->kind != K_INIT && m->session_id) {
        own[0] = fmt_header("Mcp-Session-Id", m->session_id);
        if (own[0]) hdrs[nh++] = own[0];
        ok_h &= own[0] != NULL;
    }
    if (r->kind != K_INIT && m->server_version) {
        own[1] = fmt_header("MCP-Protocol-Version", m->server_version);
        if (own[1]) hdrs[nh++] = own[1];
        ok_h &= own[1] != NULL;
    }
    if (!ok_h) {
        free(own[0]);
        free(own[1]);
        free(hdrs);
        free(body);
        return MANTA_ENOMEM;
    }
    for (size_t i = 0; i < m->n_headers; i++) hdrs[nh++] = m->headers[i];

    manta_http_request hr;
    manta_http_request_init(&hr);
    hr.method = "POST";
    hr.url = m->url;
    hr.headers = hdrs;
    hr.n_headers = nh;
    hr.body = body;
    hr.body_len = strlen(body);
    hr.timeout_ms = m->timeout_ms;
    hr.connect_timeout_ms = m->connect_timeout_ms;
    hr.max_body = m->max_body;
    /* Retries are this client's (req_complete), with the MCP layer's view
     * of what failed; the HTTP layer sends each POST once. */
    hr.max_retries = 0;
    hr.on_body = on_body;
    hr.on_body_arg = r;
    cJSON_Delete(r->early);
    r->early = NULL;
    r->sse_scanned = 0;
    r->early_bad = false;
    r->early_skipped = 0;
    int rc = manta_http_submit(m->http, &hr, on_http, r, &r->http_id);
    free(own[0]);
    free(own[1]);
    free(hdrs);
    free(body);
    if (rc != 0) return rc == MANTA_ENOMEM ? MANTA_ENOMEM : MANTA_EINVAL;
    r->id = id;
    r->session_gen = m->gen;
    r->with_session = r->kind != K_INIT && m->session_id != NULL;
    r->backoff = false;
    req_link(&m->inflight, r);
    m->stats.requests++;
    m->on_wire++;
    if ((uint64_t)m->on_wire > m->stats.max_on_wire) m->stats.max_on_wire = (uint64_t)m->on_wire;
    return MANTA_OK;
}

/* Posts r when a connection is free, else keeps it in the backlog (the
 * handshake's own messages first). Returns MANTA_OK or req_post's error. */
static int req_send(mcp_client *m, mcp_req *r)
{
    if (m->on_wire < m->max_conn) return req_post(m, r);
    m->stats.queued++;
    if (r->kind == K_INIT || r->kind == K_NOTE_INIT)
        req_link(&m->backlog, r);
    else
        req_append(&m->backlog, r);
    return MANTA_OK;
}

/* Posts from the backlog while connections are free. A request whose
 * session went away while it waited joins the handshake queue instead. */
static void pump_backlog(mcp_client *m)
{
    while (m->backlog && m->on_wire < m->max_conn && !m->dying) {
        mcp_req *r = m->backlog;
        req_unlink(&m->backlog, r);
        bool handshake = r->kind == K_INIT || r->kind == K_NOTE_INIT;
        if (!handshake && m->state != S_READY) {
            req_append(&m->queued, r);
            continue;
        }
        int err = req_post(m, r);
        if (err == MANTA_OK) continue;
        if (handshake) {
            req_free(r);
            m->state = S_NEW;
            fail_queue(m, err, "initialize: could not send the request");
        } else {
            req_fail(m, r, err, 0, "could not send the request");
        }
    }
}

static mcp_req *req_new(mcp_client *m, enum req_kind kind, const char *method, cJSON *params,
                        mcp_done_fn cb, void *arg)
{
    mcp_req *r = calloc(1, sizeof *r);
    if (!r) {
        cJSON_Delete(params);
        return NULL;
    }
    r->m = m;
    r->kind = kind;
    r->method = method;
    r->params = params;
    r->cb = cb;
    r->arg = arg;
    r->start_ms = now_ms();
    return r;
}

static void start_handshake(mcp_client *m)
{
    m->state = S_INIT;
    cJSON *p = cJSON_CreateObject();
    cJSON *info = cJSON_CreateObject();
    bool ok = p && info;
    if (ok) {
        ok &= cJSON_AddStringToObject(p, "protocolVersion", m->protocol_version) != NULL;
        ok &= cJSON_AddObjectToObject(p, "capabilities") != NULL;
        ok &= cJSON_AddStringToObject(info, "name", m->client_name) != NULL;
        ok &= cJSON_AddStringToObject(info, "version", m->client_version) != NULL;
        ok &= cJSON_AddItemToObject(p, "clientInfo", info);
        if (ok) info = NULL;
    }
    cJSON_Delete(info);
    mcp_req *r = ok ? req_new(m, K_INIT, "initialize", p, NULL, NULL) : NULL;
    if (!ok) cJSON_Delete(p);
    int err = r ? req_send(m, r) : MANTA_ENOMEM;
    if (err != MANTA_OK) {
        req_free(r);
        m->state = S_NEW;
        fail_queue(m, err, "initialize: could not send the request");
    }
}

/* Sends r now if the client is ready, else queues it (starting the handshake
 * when none runs). Returns MANTA_OK or the error of a failed send. */
static int req_dispatch(mcp_client *m, mcp_req *r)
{
    if (m->state == S_READY && r->kind != K_INIT_WAITER) return req_send(m, r);
    req_append(&m->queued, r);
    if (m->state == S_NEW) start_handshake(m);
    return MANTA_OK;
}

/* ---- answers ----------------------------------------------------------- */

/* The HTTP client's codes are already the runtime's; only a cancel, which
 * this client makes only while closing, reads as closed. */
static int map_http_err(int e)
{
    return e == MANTA_ECANCELED ? MANTA_ECLOSED : e;
}

/* Copies up to max bytes of s into out as printable text, for messages. */
static void snippet(char *out, size_t cap, const char *s, size_t len, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < len && i < max && n + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : ' ';
    }
    if (len > max && n + 4 < cap) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

static bool media_is(const char *ctype, const char *want)
{
    if (!ctype) return false;
    size_t n = strlen(want);
    if (strncasecmp(ctype, want, n) != 0) return false;
    return ctype[n] == '\0' || ctype[n] == ';' || ctype[n] == ' ';
}

static bool id_matches(const cJSON *msg, int64_t id)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, "id");
    return cJSON_IsNumber(v) && v->valuedouble == (double)id;
}

static bool is_response(const cJSON *msg)
{
    return cJSON_IsObject(msg) && (cJSON_GetObjectItemCaseSensitive(msg, "result") ||
                                   cJSON_GetObjectItemCaseSensitive(msg, "error"));
}

/* SSE: events are blocks of "field: value" lines ended by a blank line;
 * "data" lines of one event join with "\n"; lines starting with ':' are
 * comments; a line may end in CRLF, LF or CR. An event cut off by the end of
 * the stream is dropped, as the SSE rules say, so a truncated stream yields
 * no response rather than half of one. */
cJSON *mcp_sse_find_response(const char *body, size_t len, int64_t rpc_id, bool *bad_json,
                             uint64_t *skipped)
{
    char *data = NULL;
    size_t dlen = 0, dcap = 0;
    bool has_data = false;
    cJSON *found = NULL;
    size_t pos = 0;
    if (len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0) pos = 3;
    while (pos < len && !found) {
        size_t e = pos;
        while (e < len && body[e] != '\n' && body[e] != '\r') e++;
        if (e == len) break; /* an unterminated last line: the stream was cut */
        const char *line = body + pos;
        size_t n = e - pos;
        pos = e + 1;
        if (body[e] == '\r' && pos < len && body[pos] == '\n') pos++;

        if (n == 0) { /* blank line: dispatch the event */
            if (has_data) {
                if (dlen && data[dlen - 1] == '\n') dlen--;
                cJSON *msg = cJSON_ParseWithLength(data, dlen);
                if (!msg) {
                    if (bad_json) *bad_json = true;
                } else if (is_response(msg) && id_matches(msg, rpc_id)) {
                    found = msg;
                } else {
                    if (skipped) (*skipped)++;
                    cJSON_Delete(msg);
                }
            }
            dlen = 0;
            has_data = false;
            continue;
        }
        if (line[0] == ':') continue;
        const char *colon = memchr(line, ':', n);
        size_t flen = colon ? (size_t)(colon - line) : n;
        if (flen != 4 || memcmp(line, "data", 4) != 0) continue; /* event, id, retry */
        const char *v = colon ? colon + 1 : line + n;
        size_t vlen = (size_t)(line + n - v);
        if (vlen && *v == ' ') v++, vlen--;
        if (dlen + vlen + 2 > dcap) {
            size_t cap = dcap ? dcap : 256;
            while (cap < dlen + vlen + 2) cap *= 2;
            char *d = realloc(data, cap);
            if (!d) break;
            data = d;
            dcap = cap;
        }
        memcpy(data + dlen, v, vlen);
        dlen += vlen;
        data[dlen++] = '\n';
        has_data = true;
    }
    free(data);
    return found;
}

/* The end of the last complete SSE event in body[from, len): the offset just
 * after its blank line, or from when there is none yet. A CR as the last byte
 * may be the first half of a CRLF, so it does not count yet. */
static size_t sse_complete_prefix(const char *b, size_t from, size_t len)
{
    size_t pos = from, last = from;
    while (pos < len) {
        size_t e = pos;
        while (e < len && b[e] != '\n' && b[e] != '\r') e++;
        if (e == len) break;
        size_t next = e + 1;
        if (b[e] == '\r') {
            if (next == len) break;
            if (b[next] == '\n') next++;
        }
        if (e == pos) last = next;
        pos = next;
    }
    return last;
}

/* Watches an SSE answer as it arrives and ends the transfer as soon as our
 * response is in: a server may keep the stream open after it (the spec says
 * it SHOULD close, not MUST), and the caller should not wait for that. */
static int on_body(const char *content_type, const char *body, size_t len, void *arg)
{
    mcp_req *r = arg;
    if (r->early || !media_is(content_type, "text/event-stream")) return 0;
    size_t end = sse_complete_prefix(body, r->sse_scanned, len);
    if (end == r->sse_scanned) return 0;
    bool bad = false;
    uint64_t skipped = 0;
    cJSON *found =
        mcp_sse_find_response(body + r->sse_scanned, end - r->sse_scanned, r->id, &bad, &skipped);
    r->sse_scanned = end;
    r->early_bad |= bad;
    r->early_skipped += skipped;
    if (!found) return 0;
    r->early = found;
    return 1;
}

static void on_delete_done(const manta_http_result *res, void *arg)
{
    /* Ending a session is a courtesy; its outcome changes nothing. */
}

/* Ends session sid on the server (DELETE with its Mcp-Session-Id) without
 * waiting for the answer. */
static void send_delete(mcp_client *m, const char *sid)
{
    char *h = fmt_header("Mcp-Session-Id", sid);
    char *v = m->server_version ? fmt_header("MCP-Protocol-Version", m->server_version) : NULL;
    if (!h) {
        free(v);
        return;
    }
    const char *hdrs[2] = {h, v};
    manta_http_request hr;
    manta_http_request_init(&hr);
    hr.method = "DELETE";
    hr.url = m->url;
    hr.headers = hdrs;
    hr.n_headers = v ? 2 : 1;
    hr.timeout_ms = 2000;
    hr.connect_timeout_ms = m->connect_timeout_ms;
    hr.max_retries = 0;
    if (manta_http_submit(m->http, &hr, on_delete_done, NULL, NULL) == 0)
        m->stats.sessions_closed++;
    free(h);
    free(v);
}

static void handshake_failed(mcp_client *m, int err, const char *why)
{
    char msg[768];
    snprintf(msg, sizeof msg, "initialize failed: %s", why);
    m->state = S_NEW;
    fail_queue(m, err, msg);
}

static void handshake_done(mcp_client *m)
{
    m->state = S_READY;
    m->gen++;
    m->stats.handshakes++;
    /* Send in the order the requests were made. A callback may free the
     * client (dying): mcp_free then empties the queue itself. */
    while (m->queued && !m->dying && m->state == S_READY) {
        mcp_req *r = m->queued;
        req_unlink(&m->queued, r);
        if (r->kind == K_INIT_WAITER) {
            mcp_result res;
            memset(&res, 0, sizeof res);
            res.result = m->init_result;
            req_complete(m, r, &res);
            continue;
        }
        int err = req_send(m, r);
        if (err != MANTA_OK) req_fail(m, r, err, 0, "could not send the request");
    }
}

static void on_init_result(mcp_client *m, const manta_http_result *hres, cJSON *result)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(result, "protocolVersion");
    /* A session id must be visible ASCII (0x21..0x7E) by the spec; anything
     * else could smuggle header lines. */
    const char *sid = manta_http_header_get(hres, "Mcp-Session-Id");
    for (const char *p = sid; p && *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
            handshake_failed(m, MANTA_EPROTO, "the Mcp-Session-Id header has invalid characters");
            return;
        }
    if (!cJSON_IsString(v) || !mcp_protocol_supported(v->valuestring)) {
        char msg[512], shown[64];
        if (cJSON_IsString(v))
            snippet(shown, sizeof shown, v->valuestring, strlen(v->valuestring), 40);
        snprintf(msg, sizeof msg,
                 "%s offered MCP protocol version \"%s\" (asked for %s); this client works "
                 "with dated versions from %s on",
                 m->url, cJSON_IsString(v) ? shown : "(none)", m->protocol_version,
                 MCP_PROTOCOL_OLDEST);
        /* Do not leave the session it opened for us behind. */
        if (sid && *sid) send_delete(m, sid);
        m->version_rejected = true;
        handshake_failed(m, MANTA_EPROTO, msg);
        return;
    }
    m->version_rejected = false;
    /* A new handshake on a live session (mcp_initialize again): end the old. */
    if (m->session_id && (!sid || strcmp(sid, m->session_id) != 0)) send_delete(m, m->session_id);
    char *nsid = xstrdup(sid && *sid ? sid : NULL);
    char *nver = strdup(v->valuestring);
    cJSON *dup = cJSON_Duplicate(result, 1);
    if (!nver || !dup || (sid && *sid && !nsid)) {
        free(nsid);
        free(nver);
        cJSON_Delete(dup);
        handshake_failed(m, MANTA_ENOMEM, "out of memory");
        return;
    }
    free(m->session_id);
    free(m->server_version);
    cJSON_Delete(m->init_result);
    m->session_id = nsid;
    m->server_version = nver;
    m->init_result = dup;

    mcp_req *note = req_new(m, K_NOTE_INIT, "notifications/initialized", NULL, NULL, NULL);
    int err = note ? req_send(m, note) : MANTA_ENOMEM;
    if (err != MANTA_OK) {
        req_free(note);
        handshake_failed(m, err, "could not send notifications/initialized");
    }
}

/* Joins the "text" items of result.content with "\n". Returns NULL only
 * when out of memory. */
static char *join_text(const cJSON *result)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(result, "content");
    size_t total = 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(it, "text");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "text") == 0 && cJSON_IsString(text))
            total += strlen(text->valuestring) + 1;
    }
    char *out = malloc(total);
    if (!out) return NULL;
    size_t n = 0;
    cJSON_ArrayForEach(it, content)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(it, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text))
            continue;
        if (n) out[n++] = '\n';
        size_t k = strlen(text->valuestring);
        memcpy(out + n, text->valuestring, k);
        n += k;
    }
    out[n] = '\0';
    return out;
}

static void on_list_result(mcp_client *m, mcp_req *r, long status, cJSON *result)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(result, "tools");
    if (!cJSON_IsArray(tools)) {
        req_fail(m, r, MANTA_EPROTO, status, "tools/list: the result has no \"tools\" array");
        return;
    }
    if (!r->acc && !(r->acc = cJSON_CreateArray())) {
        req_fail(m, r, MANTA_ENOMEM, status, "tools/list: out of memory");
        return;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        cJSON *d = cJSON_Duplicate(t, 1);
        if (!d || !cJSON_AddItemToArray(r->acc, d)) {
            cJSON_Delete(d);
            req_fail(m, r, MANTA_ENOMEM, status, "tools/list: out of memory");
            return;
        }
    }
    const cJSON *cursor = cJSON_GetObjectItemCaseSensitive(result, "nextCursor");
    if (cJSON_IsString(cursor) && cursor->valuestring[0]) {
        if (++r->pages >= MAX_LIST_PAGES) {
            req_fail(m, r, MANTA_EPROTO, status, "tools/list: more than 100 pages");
            return;
        }
        cJSON_Delete(r->params);
        r->params = cJSON_CreateObject();
        if (!r->params || !cJSON_AddStringToObject(r->params, "cursor", cursor->valuestring)) {
            req_fail(m, r, MANTA_ENOMEM, status, "tools/list: out of memory");
            return;
        }
        int err = req_dispatch(m, r);
        if (err != MANTA_OK)
            req_fail(m, r, err, status, "tools/list: could not send the next page");
        return;
    }
    cJSON *wrap = cJSON_CreateObject();
    cJSON *copy = cJSON_Duplicate(r->acc, 1);
    if (!wrap || !copy) {
        cJSON_Delete(wrap);
        cJSON_Delete(copy);
        req_fail(m, r, MANTA_ENOMEM, status, "tools/list: out of memory");
        return;
    }
    cJSON_AddItemToObject(wrap, "tools", r->acc);
    r->acc = NULL;
    cJSON_Delete(m->tools);
    m->tools = copy;
    mcp_result res;
    memset(&res, 0, sizeof res);
    res.http_status = status;
    res.result = wrap;
    req_complete(m, r, &res);
    cJSON_Delete(wrap);
}

static void on_call_result(mcp_client *m, mcp_req *r, long status, cJSON *result)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(result, "content");
    if (content && !cJSON_IsArray(content)) {
        req_fail(m, r, MANTA_EPROTO, status, "tools/call: \"content\" is not an array");
        return;
    }
    char *text = join_text(result);
    if (!text) {
        req_fail(m, r, MANTA_ENOMEM, status, "tools/call: out of memory");
        return;
    }
    mcp_result res;
    memset(&res, 0, sizeof res);
    res.http_status = status;
    res.result = result;
    res.text = text;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "isError"))) {
        res.err = MANTA_ETOOL;
        res.message = text[0] ? text : "the tool reported an error without text";
    }
    req_complete(m, r, &res);
    free(text);
}

/* A request whose session the server no longer knows (404). */
static void on_session_lost(mcp_client *m, mcp_req *r, long status)
{
    if (r->resent) {
        req_fail(m, r, MANTA_ESESSION, status,
                 "the server lost the session again right after a new handshake");
        return;
    }
    r->resent = true;
    m->stats.session_resends++;
    if (r->session_gen == m->gen && m->state == S_READY) {
        /* This session is gone: forget it and shake hands again. */
        free(m->session_id);
        m->session_id = NULL;
        m->state = S_NEW;
    }
    int err = req_dispatch(m, r);
    if (err != MANTA_OK) req_fail(m, r, err, status, "could not send the request again");
}

/* A request that failed: the handshake's requests fail the handshake (and
 * with it every request waiting for it), any other fails alone. */
static void answer_failed(mcp_client *m, mcp_req *r, int err, long status, const char *msg)
{
    if (r->kind == K_INIT || r->kind == K_NOTE_INIT) {
        req_free(r);
        handshake_failed(m, err, msg);
    } else {
        req_fail(m, r, err, status, msg);
    }
}

/* Find the JSON-RPC response to r in a 2xx answer's body, JSON or an SSE
 * stream: *doc is what was parsed (the caller deletes it), *resp the
 * response inside it (NULL in a batch without ours). */
static int parse_answer(mcp_client *m, mcp_req *r, const manta_http_result *hres, cJSON **doc,
                        const cJSON **resp, char *msg, size_t cap)
{
    char snip[256];
    if (media_is(hres->content_type, "application/json")) {
        m->stats.json_answers++;
        *doc = cJSON_ParseWithLength(hres->body, hres->body_len);
        if (!*doc) {
            snippet(snip, sizeof snip, hres->body, hres->body_len, 120);
            snprintf(msg, cap, "%s: the answer is not valid JSON (%zu bytes): %s", r->method,
                     hres->body_len, snip);
            return MANTA_EJSON;
        }
        if (cJSON_IsArray(*doc)) { /* a batch: find ours */
            const cJSON *it;
            cJSON_ArrayForEach(it, *doc) if (id_matches(it, r->id)) *resp = it;
        } else {
            *resp = *doc;
        }
        return MANTA_OK;
    }
    if (media_is(hres->content_type, "text/event-stream")) {
        m->stats.sse_answers++;
        bool bad = false;
        uint64_t skipped = 0;
        if (r->early) { /* found while the stream was still open */
            *doc = r->early;
            r->early = NULL;
            bad = r->early_bad;
            skipped = r->early_skipped;
        } else {
            *doc = mcp_sse_find_response(hres->body, hres->body_len, r->id, &bad, &skipped);
        }
        m->stats.sse_events_skipped += skipped;
        *resp = *doc;
        if (*doc) return MANTA_OK;
        snprintf(msg, cap,
                 "%s: the SSE stream ended without a response to id %lld (%llu other "
                 "events%s)",
                 r->method, (long long)r->id, (unsigned long long)skipped,
                 bad ? ", some not valid JSON" : "");
        return bad ? MANTA_EJSON : MANTA_EPROTO;
    }
    snprintf(msg, cap,
             "%s: unexpected Content-Type \"%s\" (want application/json or "
             "text/event-stream)",
             r->method, hres->content_type ? hres->content_type : "(none)");
    return MANTA_EPROTO;
}

/* Check a JSON-RPC 2.0 response to r: its *result object, or ERPC with
 * the server's *rpc_code, or EPROTO; msg says which. */
static int check_response(const mcp_req *r, const cJSON *resp, const cJSON **result, int *rpc_code,
                          char *msg, size_t cap)
{
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(resp, "jsonrpc");
    const cJSON *rerr = cJSON_GetObjectItemCaseSensitive(resp, "error");
    *result = cJSON_GetObjectItemCaseSensitive(resp, "result");
    if (!cJSON_IsObject(resp) || !cJSON_IsString(ver) || strcmp(ver->valuestring, "2.0") != 0) {
        snprintf(msg, cap, "%s: the answer is not a JSON-RPC 2.0 response", r->method);
        return MANTA_EPROTO;
    }
    if (!id_matches(resp, r->id)) {
        snprintf(msg, cap, "%s: the response id does not match the request id %lld", r->method,
                 (long long)r->id);
        return MANTA_EPROTO;
    }
    if (rerr) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(rerr, "code");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(rerr, "message");
        *rpc_code = cJSON_IsNumber(code) ? code->valueint : 0;
        snprintf(msg, cap, "%s: JSON-RPC error %d: %s", r->method, *rpc_code,
                 cJSON_IsString(text) ? text->valuestring : "(no message)");
        return MANTA_ERPC;
    }
    if (!cJSON_IsObject(*result)) {
        snprintf(msg, cap, "%s: the response has no result object", r->method);
        return MANTA_EPROTO;
    }
    return MANTA_OK;
}

/* Hand a checked result to what its request was for. */
static void on_result(mcp_client *m, mcp_req *r, const manta_http_result *hres, cJSON *result)
{
    switch (r->kind) {
    case K_INIT:
        req_free(r);
        on_init_result(m, hres, result);
        break;
    case K_LIST:
        on_list_result(m, r, hres->status, result);
        break;
    case K_CALL:
        on_call_result(m, r, hres->status, result);
        break;
    default:
        req_free(r);
        break;
    }
}

/* The origin of an http(s) URL: the length of "scheme://authority", or 0. */
static size_t origin_len(const char *url)
{
    const char *p = strstr(url, "://");
    if (!p) return 0;
    p += 3;
    size_t n = strcspn(p, "/?#");
    return (size_t)(p - url) + n;
}

/* Follows a 307/308 to the same origin: r goes again to the new URL, which
 * the client keeps. Returns true when r was sent again or ended; false
 * (with msg saying why) when the answer stands as an HTTP error. */
static bool follow_redirect(mcp_client *m, mcp_req *r, const manta_http_result *hres, char *msg,
                            size_t cap)
{
    long status = hres->status;
    const char *loc = manta_http_header_get(hres, "Location");
    size_t ol = origin_len(m->url);
    char *to = NULL;
    if (loc && loc[0] == '/' && loc[1] != '/' && ol) { /* absolute path */
        size_t n = ol + strlen(loc) + 1;
        if ((to = malloc(n))) snprintf(to, n, "%.*s%s", (int)ol, m->url, loc);
    } else if (loc && strstr(loc, "://")) { /* absolute URL: same origin only */
        size_t ll = origin_len(loc);
        if (ll == ol && strncasecmp(loc, m->url, ol) == 0) to = strdup(loc);
    }
    bool same = to != NULL && strcspn(to, "\r\n") == strlen(to);
    if ((status != 307 && status != 308) || !same || r->redirects >= MAX_REDIRECTS) {
        snprintf(msg, cap, "%s: HTTP %ld redirect from %s to %s not followed (%s)", r->method,
                 status, m->url, loc ? loc : "(no Location)",
                 !loc ? "no Location header"
                 : (status != 307 && status != 308)
                     ? "only 307 and 308 keep the POST: set the url to the new location"
                 : !same ? "another origin: set the url to it if it is meant"
                         : "too many redirects");
        free(to);
        answer_failed(m, r, MANTA_EHTTP, status, msg);
        return true;
    }
    free(m->url);
    m->url = to;
    m->stats.redirects++;
    r->redirects++;
    int err = req_send(m, r);
    if (err != MANTA_OK) answer_failed(m, r, err, status, "could not follow the redirect");
    return true;
}

/* The answer to one request: a transport failure, a lost session, an
 * HTTP error, the accepted end of the handshake, or a JSON-RPC response,
 * whose result goes on to on_result. */
static void handle_answer(mcp_client *m, mcp_req *r, const manta_http_result *hres)
{
    char msg[768];
    long status = hres->status;
    if (hres->err != MANTA_OK) {
        snprintf(msg, sizeof msg, "%s: %s", r->method, hres->message);
        answer_failed(m, r, map_http_err(hres->err), 0, msg);
        return;
    }
    if (status == 404 && r->kind != K_INIT && r->kind != K_NOTE_INIT && r->with_session) {
        on_session_lost(m, r, status);
        return;
    }
    if (status >= 300 && status <= 399 && follow_redirect(m, r, hres, msg, sizeof msg)) return;
    if (status < 200 || status > 299) {
        char snip[256];
        snippet(snip, sizeof snip, hres->body, hres->body_len, 200);
        snprintf(msg, sizeof msg, "%s: HTTP %ld from %s%s%s", r->method, status, m->url,
                 snip[0] ? ": " : "", snip);
        answer_failed(m, r, MANTA_EHTTP, status, msg);
        return;
    }
    if (r->kind == K_NOTE_INIT) { /* accepted (202, or any 2xx) */
        req_free(r);
        handshake_done(m);
        return;
    }
    cJSON *doc = NULL;        /* what was parsed (owned) */
    const cJSON *resp = NULL; /* the JSON-RPC response inside it */
    const cJSON *result = NULL;
    int rpc_code = 0;
    msg[0] = '\0';
    int err = parse_answer(m, r, hres, &doc, &resp, msg, sizeof msg);
    if (err == MANTA_OK) err = check_response(r, resp, &result, &rpc_code, msg, sizeof msg);
    if (err == MANTA_ERPC && r->kind != K_INIT) {
        /* The server's error answer is the call's result. */
        mcp_result res;
        memset(&res, 0, sizeof res);
        res.err = MANTA_ERPC;
        res.http_status = status;
        res.rpc_code = rpc_code;
        res.message = msg;
        req_complete(m, r, &res);
    } else if (err != MANTA_OK) {
        answer_failed(m, r, err, status, msg);
    } else {
        on_result(m, r, hres, (cJSON *)result);
    }
    cJSON_Delete(doc);
}

/* Ends a public entry point: frees the client if a callback fired inside it
 * asked for that. m must not be used after. */
static void leave(mcp_client *m)
{
    if (--m->depth == 0 && m->dying) really_free(m);
}

static void on_http(const manta_http_result *res, void *arg)
{
    mcp_req *r = arg;
    if (r->orphan) { /* its client is gone and its callback already fired */
        req_free(r);
        return;
    }
    mcp_client *m = r->m;
    req_unlink(&m->inflight, r);
    m->depth++;
    if (r->backoff) { /* its back-off is over: try again */
        r->backoff = false;
        if (r->kind == K_INIT_WAITER && m->state == S_READY) {
            mcp_result ok;
            memset(&ok, 0, sizeof ok);
            ok.result = m->init_result;
            req_complete(m, r, &ok);
        } else {
            int err = req_dispatch(m, r);
            if (err != MANTA_OK) req_fail(m, r, err, 0, "could not send the request again");
        }
    } else {
        m->on_wire--;
        handle_answer(m, r, res);
    }
    pump_backlog(m);
    leave(m);
}

/* ---- public API -------------------------------------------------------- */

mcp_client *mcp_new(manta_http_client *http, const mcp_config *cfg)
{
    if (!http || !cfg || !cfg->url) return NULL;
    mcp_client *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->http = http;
    m->url = strdup(cfg->url);
    m->protocol_version =
        strdup(cfg->protocol_version ? cfg->protocol_version : MCP_PROTOCOL_VERSION);
    m->client_name = strdup(cfg->client_name ? cfg->client_name : "manta");
    m->client_version = strdup(cfg->client_version ? cfg->client_version : "0.1");
    m->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
    m->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 5000;
    m->max_body = cfg->max_body ? cfg->max_body : (size_t)16 << 20;
    m->max_retries = cfg->max_retries > 0 ? cfg->max_retries : 0;
    m->backoff_ms = cfg->backoff_ms > 0 ? cfg->backoff_ms : 250;
    m->backoff_max_ms = cfg->backoff_max_ms >= m->backoff_ms ? cfg->backoff_max_ms : m->backoff_ms;
    m->max_conn = cfg->max_connections > 0 ? cfg->max_connections : 16;
    m->rng = ((uint64_t)(uintptr_t)m ^ (uint64_t)now_ms()) | 1;
    m->next_id = 1;
    bool ok = m->url && m->protocol_version && m->client_name && m->client_version;
    if (ok && cfg->n_headers) {
        m->headers = calloc(cfg->n_headers, sizeof *m->headers);
        ok = m->headers != NULL;
        for (size_t i = 0; ok && i < cfg->n_headers; i++) {
            ok = cfg->headers && cfg->headers[i] && strchr(cfg->headers[i], ':');
            if (ok) ok = (m->headers[i] = strdup(cfg->headers[i])) != NULL;
            if (ok) m->n_headers = i + 1;
        }
    }
    if (!ok) {
        really_free(m);
        return NULL;
    }
    return m;
}

void mcp_free(mcp_client *m)
{
    if (!m || m->dying) return;
    m->dying = true;
    m->depth++; /* callbacks below may call mcp_free again: a no-op now */
    fail_queue(m, MANTA_ECLOSED, "the MCP client was closed");
    fail_backlog(m, MANTA_ECLOSED, "the MCP client was closed");
    while (m->need_tools) {
        mcp_req *r = m->need_tools;
        req_unlink(&m->need_tools, r);
        req_fail(m, r, MANTA_ECLOSED, 0, "the MCP client was closed");
    }
    while (m->inflight) {
        mcp_req *r = m->inflight;
        req_unlink(&m->inflight, r);
        uint64_t hid = r->http_id;
        r->orphan = true;
        if (user_kind(r->kind)) {
            mcp_result res;
            memset(&res, 0, sizeof res);
            res.err = MANTA_ECLOSED;
            res.message = "the MCP client was closed";
            res.rpc_id = r->id;
            res.elapsed_ms = now_ms() - r->start_ms;
            res.outcome = MCP_OUTCOME_TRANSPORT;
            res.attempts = r->tries + 1;
            m->n_user--;
            m->stats.completed++;
            m->stats.errors[manta_err_index(MANTA_ECLOSED)]++;
            if (r->cb) r->cb(&res, r->arg);
        }
        /* The HTTP callback frees the orphan inside cancel. */
        if (manta_http_cancel(m->http, hid) != 0) req_free(r);
    }
    if (m->session_id) send_delete(m, m->session_id);
    leave(m);
}

int mcp_initialize(mcp_client *m, mcp_done_fn cb, void *arg)
{
    if (!m) return MANTA_EINVAL;
    if (m->dying) return MANTA_ECLOSED;
    mcp_req *r = req_new(m, K_INIT_WAITER, "initialize", NULL, cb, arg);
    if (!r) return MANTA_ENOMEM;
    m->n_user++;
    req_append(&m->queued, r);
    m->depth++; /* a failed start fires callbacks, which may free m */
    if (m->state != S_INIT) start_handshake(m);
    leave(m);
    return MANTA_OK;
}

int mcp_list_tools(mcp_client *m, mcp_done_fn cb, void *arg)
{
    if (!m) return MANTA_EINVAL;
    if (m->dying) return MANTA_ECLOSED;
    mcp_req *r = req_new(m, K_LIST, "tools/list", NULL, cb, arg);
    if (!r) return MANTA_ENOMEM;
    m->n_user++;
    m->depth++;
    int err = req_dispatch(m, r);
    if (err != MANTA_OK) {
        m->n_user--;
        req_free(r);
    }
    leave(m);
    return err;
}

/* ---- UTF-8 ------------------------------------------------------------ */

/* The length of the well-formed UTF-8 sequence at s[0..n), or 0 when it is
 * ill-formed; *bad is then the length of its maximal ill-formed subpart
 * (at least 1), which becomes one U+FFFD. Table 3-7 of the Unicode
 * standard: the second byte's range depends on the first. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned char c = s[0];
    *bad = 1;
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else
        return 0;
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *bad = i;
            return 0;
        }
        unsigned char b = s[i];
        unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = i;
            return 0;
        }
    }
    return need;
}

char *mcp_utf8_fix(const char *s, size_t len, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    /* Worst case: every byte becomes 3. */
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t bad, k = utf8_seq(u + i, len - i, &bad);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += bad;
        }
    }
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}

/* A deep copy of v with every string and key made valid UTF-8; NULL when
 * out of memory. */
static cJSON *utf8_copy(const cJSON *v)
{
    if (cJSON_IsString(v)) {
        char *f = mcp_utf8_fix(v->valuestring, strlen(v->valuestring), NULL);
        cJSON *c = f ? cJSON_CreateString(f) : NULL;
        free(f);
        return c;
    }
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) {
        cJSON *c = cJSON_Duplicate(v, 0);
        if (c && c->string && !(c->type & cJSON_StringIsConst)) {
            cJSON_free(c->string);
            c->string = NULL;
        }
        return c;
    }
    cJSON *c = cJSON_IsObject(v) ? cJSON_CreateObject() : cJSON_CreateArray();
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        cJSON *k = c ? utf8_copy(it) : NULL;
        bool ok = k != NULL;
        if (ok && cJSON_IsObject(v)) {
            char *key = mcp_utf8_fix(it->string, strlen(it->string), NULL);
            ok = key && cJSON_AddItemToObject(c, key, k);
            free(key);
        } else if (ok) {
            ok = cJSON_AddItemToArray(c, k);
        }
        if (!ok) {
            cJSON_Delete(k);
            cJSON_Delete(c);
            return NULL;
        }
    }
    return c;
}

int mcp_call_tool(mcp_client *m, const char *name, const cJSON *arguments, mcp_done_fn cb,
                  void *arg)
{
    if (!m || !name || (arguments && !cJSON_IsObject(arguments))) return MANTA_EINVAL;
    if (m->dying) return MANTA_ECLOSED;
    cJSON *p = cJSON_CreateObject();
    cJSON *a = arguments ? utf8_copy(arguments) : cJSON_CreateObject();
    char *fixed_name = mcp_utf8_fix(name, strlen(name), NULL);
    if (!p || !a || !fixed_name || !cJSON_AddStringToObject(p, "name", fixed_name) ||
        !cJSON_AddItemToObject(p, "arguments", a)) {
        cJSON_Delete(p);
        cJSON_Delete(a);
        free(fixed_name);
        return MANTA_ENOMEM;
    }
    free(fixed_name);
    mcp_req *r = req_new(m, K_CALL, "tools/call", p, cb, arg);
    if (!r) return MANTA_ENOMEM;
    m->n_user++;
    m->stats.calls++;
    m->depth++;
    int err = req_dispatch(m, r);
    if (err != MANTA_OK) {
        m->n_user--;
        m->stats.calls--;
        req_free(r);
    }
    leave(m);
    return err;
}

/* Adds {arg: r->text} to r's params; false when out of memory. */
static bool set_text_arg(mcp_req *r, const char *arg)
{
    cJSON *a = cJSON_CreateObject();
    if (!a || !cJSON_AddStringToObject(a, arg, r->text) ||
        !cJSON_AddItemToObject(r->params, "arguments", a)) {
        cJSON_Delete(a);
        return false;
    }
    return true;
}

/* The tools/list made for text calls is in: each finds its argument and
 * goes, or fails with why it could not. */
static void on_tools_for_text(const mcp_result *res, void *arg)
{
    mcp_client *m = arg;
    m->listing = false;
    while (m->need_tools) {
        mcp_req *r = m->need_tools;
        req_unlink(&m->need_tools, r);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(r->params, "name");
        char a[128], why[512], msg[768];
        if (res->err != MANTA_OK) {
            snprintf(msg, sizeof msg, "tool %s: cannot list the tools to find its argument: %s",
                     name->valuestring, res->message);
            req_fail(m, r, res->err, res->http_status, msg);
        } else if (mcp_tool_text_arg(m->tools, name->valuestring, a, sizeof a, why, sizeof why)) {
            req_fail(m, r, MANTA_EINVAL, 0, why);
        } else if (!set_text_arg(r, a)) {
            req_fail(m, r, MANTA_ENOMEM, 0, "tools/call: out of memory");
        } else {
            int err = req_dispatch(m, r);
            if (err != MANTA_OK) req_fail(m, r, err, 0, "could not send the request");
        }
    }
}

int mcp_call_tool_text(mcp_client *m, const char *name, const char *arg, const char *text,
                       size_t len, mcp_done_fn cb, void *cb_arg)
{
    if (!m || !name || (!text && len)) return MANTA_EINVAL;
    if (m->dying) return MANTA_ECLOSED;
    char a[128], why[512];
    if (!arg && m->tools && mcp_tool_text_arg(m->tools, name, a, sizeof a, why, sizeof why) == 0)
        arg = a;
    if (arg) {
        char *t = mcp_utf8_fix(text ? text : "", len, NULL);
        cJSON *args = t ? cJSON_CreateObject() : NULL;
        int rc = args && cJSON_AddStringToObject(args, arg, t)
                     ? mcp_call_tool(m, name, args, cb, cb_arg)
                     : MANTA_ENOMEM;
        cJSON_Delete(args);
        free(t);
        return rc;
    }
    /* The argument comes from the tools' schemas: list them first. */
    cJSON *p = cJSON_CreateObject();
    char *fixed = mcp_utf8_fix(name, strlen(name), NULL);
    if (!p || !fixed || !cJSON_AddStringToObject(p, "name", fixed)) {
        cJSON_Delete(p);
        free(fixed);
        return MANTA_ENOMEM;
    }
    free(fixed);
    mcp_req *r = req_new(m, K_CALL, "tools/call", p, cb, cb_arg);
    if (!r) return MANTA_ENOMEM;
    if (!(r->text = mcp_utf8_fix(text ? text : "", len, NULL))) {
        req_free(r);
        return MANTA_ENOMEM;
    }
    if (!m->listing) {
        int rc = mcp_list_tools(m, on_tools_for_text, m);
        if (rc != MANTA_OK) {
            req_free(r);
            return rc;
        }
        m->listing = true;
    }
    m->n_user++;
    m->stats.calls++;
    req_append(&m->need_tools, r);
    return MANTA_OK;
}

int mcp_call_tool_json(mcp_client *m, const char *name, const char *arguments_json, mcp_done_fn cb,
                       void *arg)
{
    if (!arguments_json) return mcp_call_tool(m, name, NULL, cb, arg);
    cJSON *a = cJSON_Parse(arguments_json);
    if (!cJSON_IsObject(a)) {
        cJSON_Delete(a);
        return MANTA_EINVAL;
    }
    int rc = mcp_call_tool(m, name, a, cb, arg);
    cJSON_Delete(a);
    return rc;
}

int mcp_in_flight(const mcp_client *m)
{
    return m ? m->n_user : 0;
}

bool mcp_ready(const mcp_client *m)
{
    return m && m->state == S_READY;
}

const char *mcp_session_id(const mcp_client *m)
{
    return m ? m->session_id : NULL;
}

const char *mcp_protocol_version(const mcp_client *m)
{
    return m ? m->server_version : NULL;
}

const cJSON *mcp_tools(const mcp_client *m)
{
    return m ? m->tools : NULL;
}

void mcp_get_stats(const mcp_client *m, mcp_stats *out)
{
    *out = m->stats;
}

const char *mcp_url(const mcp_client *m)
{
    return m ? m->url : NULL;
}

void mcp_close_all(mcp_client *const *ms, size_t n, manta_http_client *http, int timeout_ms)
{
    for (size_t i = 0; i < n; i++) mcp_free(ms[i]);
    double end = now_ms() + timeout_ms;
    while (http && manta_http_in_flight(http) > 0 && now_ms() < end) manta_http_step(http, 20);
}

typedef struct list_wait {
    bool done;
    int err;
    char *why;
    size_t cap;
} list_wait;

static void on_list_wait(const mcp_result *r, void *arg)
{
    list_wait *w = arg;
    w->done = true;
    w->err = r->err;
    if (r->err != MANTA_OK) snprintf(w->why, w->cap, "%s", r->message);
}

int mcp_list_tools_wait(mcp_client *m, int timeout_ms, char *why, size_t cap)
{
    list_wait w = {false, 0, why, cap};
    if (cap) why[0] = '\0';
    int rc = mcp_list_tools(m, on_list_wait, &w);
    if (rc != MANTA_OK) {
        snprintf(why, cap, "tools/list: %s", manta_strerror(rc));
        return rc;
    }
    double end = now_ms() + timeout_ms;
    while (!w.done && now_ms() < end) manta_http_step(m->http, 50);
    if (!w.done) {
        /* Still retrying: give up, and end the request (its callback
         * must not outlive w). A free is the only way to end it. */
        snprintf(why, cap, "tools/list of %s: no answer within %d ms", m->url, timeout_ms);
        mcp_req *r;
        for (r = m->inflight; r && r->arg != &w; r = r->next) {
        }
        if (r) {
            r->cb = NULL;
        } else {
            for (r = m->queued; r && r->arg != &w; r = r->next) {
            }
            if (!r)
                for (r = m->backlog; r && r->arg != &w; r = r->next) {
                }
            if (r) r->cb = NULL;
        }
        return MANTA_ETIMEDOUT;
    }
    return w.err;
}

int mcp_tool_text_arg(const cJSON *tools, const char *tool, char *out, size_t cap, char *why,
                      size_t why_cap)
{
    const cJSON *t, *found = NULL;
    char names[256] = "";
    size_t nl = 0;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(n)) continue;
        if (strcmp(n->valuestring, tool) == 0) found = t;
        if (nl + strlen(n->valuestring) + 3 < sizeof names)
            nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", nl ? ", " : "",
                                   n->valuestring);
    }
    if (!found) {
        snprintf(why, why_cap, "the server has no tool \"%s\" (it has: %s)", tool,
                 nl ? names : "none");
        return MANTA_EINVAL;
    }
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(found, "inputSchema");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    int n_req = cJSON_IsArray(req) ? cJSON_GetArraySize(req) : 0;
    char req_names[256] = "";
    size_t rl = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, req)
    {
        if (cJSON_IsString(it) && rl + strlen(it->valuestring) + 3 < sizeof req_names)
            rl += (size_t)snprintf(req_names + rl, sizeof req_names - rl, "%s%s", rl ? ", " : "",
                                   it->valuestring);
    }
    if (n_req != 1) {
        snprintf(why, why_cap,
                 "tool \"%s\" has %d required arguments%s%s%s: name the one that takes the "
                 "text with `arg:`",
                 tool, n_req, n_req ? " (" : "", req_names, n_req ? ")" : "");
        return MANTA_EINVAL;
    }
    const cJSON *name = cJSON_GetArrayItem(req, 0);
    const cJSON *prop =
        cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(props, name->valuestring) : NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(prop, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "string") != 0) {
        snprintf(why, why_cap,
                 "tool \"%s\": its required argument \"%s\" is of type %s, not string: "
                 "name a string argument with `arg:`",
                 tool, cJSON_IsString(name) ? name->valuestring : "?",
                 cJSON_IsString(type) ? type->valuestring : "(none given)");
        return MANTA_EINVAL;
    }
    if (strlen(name->valuestring) >= cap) {
        snprintf(why, why_cap, "tool \"%s\": argument name \"%s\" is too long", tool,
                 name->valuestring);
        return MANTA_EINVAL;
    }
    snprintf(out, cap, "%s", name->valuestring);
    return MANTA_OK;
}

/* ---- errors by kind ---------------------------------------------------- */

/* Copies s into out[cap], cut at a character boundary and valid UTF-8. */
static void copy_text(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s);
    char *f = mcp_utf8_fix(s, n, &n);
    const char *src = f ? f : "";
    if (!f) n = 0;
    if (n >= cap) {
        n = cap - 1;
        while (n && ((unsigned char)src[n] & 0xC0) == 0x80) n--; /* not mid-character */
    }
    memcpy(out, src, n);
    out[n] = '\0';
    free(f);
}

bool mcp_errors_add(mcp_errors *e, const char *kind, mcp_outcome outcome, const char *message)
{
    e->total++;
    mcp_error_kind *k = NULL;
    for (int i = 0; i < e->n_kinds && !k; i++)
        if (strcmp(e->kinds[i].kind, kind) == 0) k = &e->kinds[i];
    if (!k) {
        if (e->n_kinds == MCP_ERRORS_KINDS) {
            e->dropped_kinds++;
            return false;
        }
        k = &e->kinds[e->n_kinds++];
        memset(k, 0, sizeof *k);
        snprintf(k->kind, sizeof k->kind, "%s", kind);
        k->outcome = outcome;
    }
    k->count++;
    if (k->n_samples == MCP_ERRORS_SAMPLES) return false;
    copy_text(k->samples[k->n_samples++], MCP_ERRORS_TEXT, message ? message : "");
    return true;
}

cJSON *mcp_errors_json(const mcp_errors *e)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (int i = 0; i < e->n_kinds; i++) {
        const mcp_error_kind *k = &e->kinds[i];
        cJSON *j = cJSON_AddObjectToObject(o, k->kind);
        cJSON *first = j ? cJSON_CreateArray() : NULL;
        bool ok = first && cJSON_AddStringToObject(j, "outcome", mcp_outcome_name(k->outcome)) &&
                  cJSON_AddNumberToObject(j, "count", (double)k->count);
        for (int s = 0; ok && s < k->n_samples; s++) {
            cJSON *str = cJSON_CreateString(k->samples[s]);
            ok = str && cJSON_AddItemToArray(first, str);
            if (!ok) cJSON_Delete(str);
        }
        if (!ok || !cJSON_AddItemToObject(j, "first", first)) {
            cJSON_Delete(first);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}
