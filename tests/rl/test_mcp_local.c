/*
 * test_mcp_local.c - the MCP client (actors/mcp.h) against a small MCP
 * server written here: a thread per connection on a loopback port, HTTP/1.1
 * with keep-alive, JSON answers, and knobs for what a real server does on
 * a bad day (a protocol version, 503s, resets, slow tools, redirects). It
 * needs nothing but the C libraries the project already uses, so it runs in
 * CI; tests/rl/test_mcp_sdk.c does the same against the official SDK.
 *
 * What it shows: every dated protocol version from 2024-11-05 on works and
 * another one is refused naming it (and its session is ended); same-origin
 * 307/308 redirects are followed, others are not; 5xx, resets and refused
 * connections are retried with back-off and, when they persist, reported as
 * transport failures with their reason; the connection limit holds with
 * connections kept alive; argument bytes that are not UTF-8 reach the server
 * as U+FFFD in valid UTF-8 JSON; the session ends with the client; and the
 * pure helpers (text argument from a schema, error tallies) do what the
 * header says.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "manta_http.h"
#include "mcp.h"

/* ---- the server -------------------------------------------------------- */

typedef struct srv {
    int fd, port;
    pthread_t acceptor;
    atomic_int stop;
    pthread_mutex_t mu;
    /* knobs (under mu) */
    char version[32]; /* protocolVersion answered */
    int fail_calls;   /* answer the next N tools/call with 503 */
    int reset_calls;  /* drop the connection on the next N tools/call */
    int delay_ms;     /* each tools/call takes this long */
    /* what it saw (under mu) */
    int accepted, open, max_open, threads;
    int busy, max_busy; /* requests being answered at once */
    int calls, sessions, deletes, bad_utf8;
    char deleted_sid[64], last_text[256];
} srv;

static srv S;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Strict UTF-8 check, written apart from the client's own fixer. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], k, cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0)
            k = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            k = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            k = 3, cp = c & 0x07;
        else
            return false;
        for (unsigned j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        static const unsigned min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

static void send_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        b += k, n -= (size_t)k;
    }
}

static void respond(int fd, int status, const char *extra_headers, const char *body)
{
    char head[512];
    size_t n = strlen(body);
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                     "%zu\r\n%s\r\n",
                     status, n, extra_headers ? extra_headers : "");
    send_all(fd, head, (size_t)h);
    send_all(fd, body, n);
}

static void rpc_result(int fd, const cJSON *id, cJSON *result, const char *extra)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "jsonrpc", "2.0");
    cJSON_AddItemToObject(o, "id", cJSON_Duplicate(id, 0));
    cJSON_AddItemToObject(o, "result", result);
    char *t = cJSON_PrintUnformatted(o);
    respond(fd, 200, extra, t);
    free(t);
    cJSON_Delete(o);
}

static cJSON *text_result(const char *text, bool is_error)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *c = cJSON_AddArrayToObject(r, "content");
    cJSON *item = cJSON_CreateObject();
    cJSON_AddStringToObject(item, "type", "text");
    cJSON_AddStringToObject(item, "text", text);
    cJSON_AddItemToArray(c, item);
    cJSON_AddBoolToObject(r, "isError", is_error);
    return r;
}

static const char *TOOLS =
    "[{\"name\":\"echo\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"text\":{\"type\":"
    "\"string\"}},\"required\":[\"text\"]}},"
    "{\"name\":\"add\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
    "\"number\"},\"b\":{\"type\":\"number\"}},\"required\":[\"a\",\"b\"]}},"
    "{\"name\":\"count\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":"
    "\"integer\"},\"note\":{\"type\":\"string\"}},\"required\":[\"n\"]}},"
    "{\"name\":\"free\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"s\":{\"type\":"
    "\"string\"}}}}]";

/* One request; returns false when the connection must be dropped. */
static bool handle(int fd, const char *method, const char *path, const char *sid, const char *body,
                   size_t blen)
{
    char loc[256];
    if (!strcmp(path, "/old")) {
        respond(fd, 307, "Location: /new/\r\n", "");
        return true;
    }
    if (!strcmp(path, "/abs")) {
        snprintf(loc, sizeof loc, "Location: http://127.0.0.1:%d/mcp\r\n", S.port);
        respond(fd, 308, loc, "");
        return true;
    }
    if (!strcmp(path, "/away")) {
        snprintf(loc, sizeof loc, "Location: http://localhost:%d/mcp\r\n", S.port);
        respond(fd, 307, loc, "");
        return true;
    }
    if (!strcmp(path, "/moved")) {
        respond(fd, 301, "Location: /mcp\r\n", "");
        return true;
    }
    if (!strcmp(path, "/loop")) {
        respond(fd, 307, "Location: /loop\r\n", "");
        return true;
    }
    if (!strcmp(method, "DELETE")) {
        pthread_mutex_lock(&S.mu);
        S.deletes++;
        snprintf(S.deleted_sid, sizeof S.deleted_sid, "%s", sid);
        pthread_mutex_unlock(&S.mu);
        respond(fd, 200, NULL, "");
        return true;
    }
    if (!valid_utf8((const unsigned char *)body, blen)) {
        pthread_mutex_lock(&S.mu);
        S.bad_utf8++;
        pthread_mutex_unlock(&S.mu);
        respond(fd, 400, NULL, "{\"error\":\"Parse error: invalid unicode\"}");
        return true;
    }
    cJSON *req = cJSON_ParseWithLength(body, blen);
    const cJSON *m = cJSON_GetObjectItem(req, "method"), *id = cJSON_GetObjectItem(req, "id");
    const char *mn = cJSON_IsString(m) ? m->valuestring : "";
    bool keep = true;
    if (!strcmp(mn, "initialize")) {
        pthread_mutex_lock(&S.mu);
        int n = ++S.sessions;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "protocolVersion", S.version);
        pthread_mutex_unlock(&S.mu);
        cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "capabilities"), "tools");
        cJSON *info = cJSON_AddObjectToObject(r, "serverInfo");
        cJSON_AddStringToObject(info, "name", "local");
        cJSON_AddStringToObject(info, "version", "1");
        char h[64];
        snprintf(h, sizeof h, "Mcp-Session-Id: sess-%d\r\n", n);
        rpc_result(fd, id, r, h);
    } else if (!strncmp(mn, "notifications/", 14)) {
        respond(fd, 202, NULL, "");
    } else if (!strcmp(mn, "tools/list")) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddItemToObject(r, "tools", cJSON_Parse(TOOLS));
        rpc_result(fd, id, r, NULL);
    } else if (!strcmp(mn, "tools/call")) {
        pthread_mutex_lock(&S.mu);
        S.calls++;
        int fail = S.fail_calls > 0 ? S.fail_calls-- : 0;
        int reset = !fail && S.reset_calls > 0 ? S.reset_calls-- : 0;
        int delay = S.delay_ms;
        pthread_mutex_unlock(&S.mu);
        const cJSON *p = cJSON_GetObjectItem(req, "params");
        const cJSON *name = cJSON_GetObjectItem(p, "name");
        const cJSON *text = cJSON_GetObjectItem(cJSON_GetObjectItem(p, "arguments"), "text");
        if (delay) usleep((useconds_t)delay * 1000);
        if (fail) {
            respond(fd, 503, NULL, "{\"detail\":\"busy\"}");
        } else if (reset) {
            struct linger l = {1, 0}; /* close with RST */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            keep = false;
        } else if (cJSON_IsString(name) && !strcmp(name->valuestring, "echo")) {
            pthread_mutex_lock(&S.mu);
            snprintf(S.last_text, sizeof S.last_text, "%s",
                     cJSON_IsString(text) ? text->valuestring : "");
            pthread_mutex_unlock(&S.mu);
            if (cJSON_IsString(text))
                rpc_result(fd, id, text_result(text->valuestring, false), NULL);
            else
                rpc_result(fd, id, text_result("text: field required", true), NULL);
        } else {
            char e[256];
            snprintf(e, sizeof e,
                     "{\"jsonrpc\":\"2.0\",\"id\":%d,\"error\":{\"code\":-32602,\"message\":"
                     "\"Unknown tool: %s\"}}",
                     id ? id->valueint : 0, cJSON_IsString(name) ? name->valuestring : "?");
            respond(fd, 200, NULL, e);
        }
    } else {
        respond(fd, 200, NULL,
                "{\"jsonrpc\":\"2.0\",\"id\":0,\"error\":{\"code\":-32601,\"message\":\"no\"}}");
    }
    cJSON_Delete(req);
    return keep;
}

/* Reads requests off one connection until it closes or the server stops. */
static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char *buf = malloc(1 << 20);
    size_t len = 0;
    for (;;) {
        char *end = NULL;
        while (!(end = memmem(buf, len, "\r\n\r\n", 4))) {
            struct pollfd p = {fd, POLLIN, 0};
            int pr = poll(&p, 1, 100);
            if (atomic_load(&S.stop)) goto out;
            if (pr <= 0) continue;
            ssize_t k = recv(fd, buf + len, (1 << 20) - 1 - len, 0);
            if (k <= 0) goto out;
            len += (size_t)k;
        }
        *end = '\0';
        char method[16] = "", path[128] = "", sid[64] = "";
        sscanf(buf, "%15s %127s", method, path);
        size_t clen = 0;
        for (char *l = strstr(buf, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
            if (!strncasecmp(l + 2, "Content-Length:", 15)) clen = strtoul(l + 17, NULL, 10);
            if (!strncasecmp(l + 2, "Mcp-Session-Id:", 15)) sscanf(l + 17, " %63s", sid);
        }
        size_t hlen = (size_t)(end - buf) + 4;
        while (len < hlen + clen) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) {
                if (atomic_load(&S.stop)) goto out;
                continue;
            }
            ssize_t k = recv(fd, buf + len, (1 << 20) - 1 - len, 0);
            if (k <= 0) goto out;
            len += (size_t)k;
        }
        pthread_mutex_lock(&S.mu);
        if (++S.busy > S.max_busy) S.max_busy = S.busy;
        pthread_mutex_unlock(&S.mu);
        bool keep = handle(fd, method, path, sid, buf + hlen, clen);
        pthread_mutex_lock(&S.mu);
        S.busy--;
        pthread_mutex_unlock(&S.mu);
        if (!keep) goto out;
        memmove(buf, buf + hlen + clen, len - hlen - clen);
        len -= hlen + clen;
    }
out:
    close(fd);
    free(buf);
    pthread_mutex_lock(&S.mu);
    S.open--;
    S.threads--;
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

static void *accept_main(void *arg)
{
    while (!atomic_load(&S.stop)) {
        struct pollfd p = {S.fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(S.fd, NULL, NULL);
        if (c < 0) continue;
        pthread_mutex_lock(&S.mu);
        S.accepted++;
        if (++S.open > S.max_open) S.max_open = S.open;
        S.threads++;
        pthread_mutex_unlock(&S.mu);
        pthread_t t;
        if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)c) == 0)
            pthread_detach(t);
        else
            close(c);
    }
    return NULL;
}

static int srv_start(void **state)
{
    memset(&S, 0, sizeof S);
    pthread_mutex_init(&S.mu, NULL);
    snprintf(S.version, sizeof S.version, "%s", MCP_PROTOCOL_VERSION);
    S.fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(S.fd, (struct sockaddr *)&a, sizeof a) || listen(S.fd, 64) ||
        getsockname(S.fd, (struct sockaddr *)&a, &al))
        return -1;
    S.port = ntohs(a.sin_port);
    return pthread_create(&S.acceptor, NULL, accept_main, NULL);
}

static int srv_stop(void **state)
{
    atomic_store(&S.stop, 1);
    pthread_join(S.acceptor, NULL);
    close(S.fd);
    for (int i = 0; i < 100; i++) { /* connection threads notice within 100 ms */
        pthread_mutex_lock(&S.mu);
        int left = S.threads;
        pthread_mutex_unlock(&S.mu);
        if (!left) return 0;
        usleep(10000);
    }
    return -1;
}

/* Resets the knobs and counters between tests. */
static int srv_reset(void **state)
{
    pthread_mutex_lock(&S.mu);
    snprintf(S.version, sizeof S.version, "%s", MCP_PROTOCOL_VERSION);
    S.fail_calls = S.reset_calls = S.delay_ms = 0;
    S.max_open = S.open;
    S.accepted = 0;
    S.calls = S.deletes = S.bad_utf8 = 0;
    S.deleted_sid[0] = S.last_text[0] = '\0';
    pthread_mutex_unlock(&S.mu);
    return 0;
}

static int srv_get(const int *field)
{
    pthread_mutex_lock(&S.mu);
    int v = *field;
    pthread_mutex_unlock(&S.mu);
    return v;
}

/* ---- the client side ---------------------------------------------------- */

typedef struct got {
    int fired, err, attempts;
    long status;
    mcp_outcome outcome;
    char message[1024], text[512];
    double elapsed_ms;
} got;

static void on_done(const mcp_result *r, void *arg)
{
    got *g = arg;
    g->fired++;
    g->err = r->err;
    g->attempts = r->attempts;
    g->status = r->http_status;
    g->outcome = r->outcome;
    g->elapsed_ms = r->elapsed_ms;
    snprintf(g->message, sizeof g->message, "%s", r->message);
    snprintf(g->text, sizeof g->text, "%s", r->text ? r->text : "");
}

typedef struct client {
    manta_http_client *http;
    mcp_client *mcp;
} client;

static client open_at(const char *path, int port, int retries, int max_conn)
{
    client c;
    c.http = manta_http_new(NULL);
    assert_non_null(c.http);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.url = url;
    cfg.timeout_ms = 5000;
    cfg.max_retries = retries;
    cfg.backoff_ms = 20;
    cfg.backoff_max_ms = 80;
    if (max_conn) cfg.max_connections = max_conn;
    c.mcp = mcp_new(c.http, &cfg);
    assert_non_null(c.mcp);
    return c;
}

static void drain(client *c)
{
    double end = now_ms() + 20000;
    while (mcp_in_flight(c->mcp) > 0) {
        assert_true(now_ms() < end);
        manta_http_step(c->http, 50);
    }
}

static void close_client(client *c)
{
    mcp_close_all(&c->mcp, 1, c->http, 3000);
    manta_http_free(c->http);
}

static void echo(client *c, const char *text, got *g)
{
    memset(g, 0, sizeof *g);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "text", text);
    assert_int_equal(mcp_call_tool(c->mcp, "echo", a, on_done, g), MANTA_OK);
    cJSON_Delete(a);
    drain(c);
    assert_int_equal(g->fired, 1);
}

/* ---- tests ------------------------------------------------------------- */

static void test_utf8_fix(void **state)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain", "plain"},
        {"\xcf\x80\xe2\x89\x88\xf0\x9f\x99\x82", "\xcf\x80\xe2\x89\x88\xf0\x9f\x99\x82"},
        {"a\xff"
         "b",
         "a\xEF\xBF\xBD"
         "b"},
        {"\xc3", "\xEF\xBF\xBD"},                                 /* cut at the end */
        {"\xe2\x89", "\xEF\xBF\xBD"},                             /* one maximal subpart */
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},                 /* overlong: two */
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate */
        {"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > 10FFFF */
        {"\xf0\x9f\x99x", "\xEF\xBF\xBDx"},
        {"\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        char *f = mcp_utf8_fix(cases[i].in, strlen(cases[i].in), &n);
        assert_non_null(f);
        assert_string_equal(f, cases[i].out);
        assert_int_equal(n, strlen(cases[i].out));
        assert_true(valid_utf8((const unsigned char *)f, n));
        free(f);
    }
    /* Every byte string of length 3 comes out valid. */
    for (uint32_t v = 0; v < (1u << 24); v += 251) {
        unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        size_t n;
        char *f = mcp_utf8_fix((const char *)b, 3, &n);
        assert_true(valid_utf8((const unsigned char *)f, n));
        if (valid_utf8(b, 3)) assert_memory_equal(f, b, 3);
        free(f);
    }
}

static void test_protocol_versions(void **state)
{
    assert_true(mcp_protocol_supported("2024-11-05"));
    assert_true(mcp_protocol_supported("2025-03-26"));
    assert_true(mcp_protocol_supported("2025-06-18"));
    assert_true(mcp_protocol_supported("2025-11-25"));
    assert_true(mcp_protocol_supported("2027-01-01"));
    assert_false(mcp_protocol_supported("2024-10-07"));
    assert_false(mcp_protocol_supported("1.0"));
    assert_false(mcp_protocol_supported("2025-1-250"));
    assert_false(mcp_protocol_supported(NULL));

    static const char *const ok[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2031-02-03"};
    for (size_t i = 0; i < 4; i++) {
        pthread_mutex_lock(&S.mu);
        snprintf(S.version, sizeof S.version, "%s", ok[i]);
        pthread_mutex_unlock(&S.mu);
        client c = open_at("/mcp", S.port, 0, 0);
        got g;
        echo(&c, "hi", &g);
        assert_int_equal(g.err, MANTA_OK);
        assert_string_equal(g.text, "hi");
        assert_string_equal(mcp_protocol_version(c.mcp), ok[i]);
        close_client(&c);
    }

    /* A version it cannot speak: refused once (no retry) with the version
     * named, and the session the server opened is ended. */
    pthread_mutex_lock(&S.mu);
    snprintf(S.version, sizeof S.version, "1.0");
    S.deletes = S.calls = 0;
    pthread_mutex_unlock(&S.mu);
    client c = open_at("/mcp", S.port, 5, 0);
    got g;
    echo(&c, "hi", &g);
    assert_int_equal(g.err, MANTA_EPROTO);
    assert_int_equal(g.outcome, MCP_OUTCOME_TRANSPORT);
    assert_int_equal(g.attempts, 1);
    assert_non_null(strstr(g.message, "offered MCP protocol version \"1.0\""));
    assert_non_null(strstr(g.message, "from 2024-11-05 on"));
    mcp_close_all(&c.mcp, 1, c.http, 3000);
    manta_http_free(c.http);
    assert_int_equal(srv_get(&S.deletes), 1);
    assert_int_equal(srv_get(&S.calls), 0);
}

static void test_redirects(void **state)
{
    client c = open_at("/old", S.port, 0, 0);
    got g;
    echo(&c, "one", &g);
    assert_int_equal(g.err, MANTA_OK);
    char want[128];
    snprintf(want, sizeof want, "http://127.0.0.1:%d/new/", S.port);
    assert_string_equal(mcp_url(c.mcp), want);
    echo(&c, "two", &g);
    assert_int_equal(g.err, MANTA_OK);
    mcp_stats st;
    mcp_get_stats(c.mcp, &st);
    assert_int_equal(st.redirects, 1); /* the new URL is kept */
    close_client(&c);

    c = open_at("/abs", S.port, 0, 0);
    echo(&c, "x", &g);
    assert_int_equal(g.err, MANTA_OK);
    close_client(&c);

    static const struct {
        const char *path, *why;
    } no[] = {{"/away", "another origin"},
              {"/moved", "only 307 and 308"},
              {"/loop", "too many redirects"}};
    for (size_t i = 0; i < 3; i++) {
        c = open_at(no[i].path, S.port, 3, 0);
        echo(&c, "x", &g);
        if (g.err != MANTA_EHTTP || !strstr(g.message, no[i].why))
            fail_msg("%s: %s %s", no[i].path, manta_errname(g.err), g.message);
        assert_int_equal(g.attempts, 1); /* a 3xx is not retried */
        close_client(&c);
    }
}

static void test_retry_5xx_and_reset(void **state)
{
    client c = open_at("/mcp", S.port, 3, 0);
    got g;
    echo(&c, "warm", &g); /* the handshake, so that only calls fail below */
    pthread_mutex_lock(&S.mu);
    S.fail_calls = 2;
    pthread_mutex_unlock(&S.mu);
    echo(&c, "after two 503s", &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "after two 503s");
    assert_int_equal(g.attempts, 3);

    pthread_mutex_lock(&S.mu);
    /* Two resets: libcurl itself sends once more when a kept-alive
     * connection dies before answering; the second, on a new connection,
     * is ours to retry. */
    S.reset_calls = 2;
    pthread_mutex_unlock(&S.mu);
    echo(&c, "after a reset", &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.attempts, 2);

    /* 503 for good: a transport failure with its reason, after the limit. */
    pthread_mutex_lock(&S.mu);
    S.fail_calls = 100;
    pthread_mutex_unlock(&S.mu);
    echo(&c, "never", &g);
    assert_int_equal(g.err, MANTA_EHTTP);
    assert_int_equal(g.status, 503);
    assert_int_equal(g.outcome, MCP_OUTCOME_TRANSPORT);
    assert_int_equal(g.attempts, 4);
    assert_non_null(strstr(g.message, "HTTP 503"));
    assert_non_null(strstr(g.message, "after 4 attempts"));
    mcp_stats st;
    mcp_get_stats(c.mcp, &st);
    assert_int_equal(st.retries, 2 + 1 + 3);
    pthread_mutex_lock(&S.mu);
    S.fail_calls = 0;
    pthread_mutex_unlock(&S.mu);

    /* The policy's own mistakes are not retried. */
    memset(&g, 0, sizeof g);
    assert_int_equal(mcp_call_tool_json(c.mcp, "nope", "{}", on_done, &g), MANTA_OK);
    drain(&c);
    assert_int_equal(g.err, MANTA_ERPC);
    assert_int_equal(g.outcome, MCP_OUTCOME_POLICY);
    assert_int_equal(g.attempts, 1);
    assert_non_null(strstr(g.message, "Unknown tool: nope"));
    memset(&g, 0, sizeof g);
    assert_int_equal(mcp_call_tool_json(c.mcp, "echo", "{}", on_done, &g), MANTA_OK);
    drain(&c);
    assert_int_equal(g.err, MANTA_ETOOL);
    assert_int_equal(g.outcome, MCP_OUTCOME_POLICY);
    assert_string_equal(g.message, "text: field required");
    close_client(&c);
}

static void test_refused(void **state)
{
    /* A port with nothing on it. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
    close(s);
    client c = open_at("/mcp", ntohs(a.sin_port), 3, 0);
    got g;
    double t0 = now_ms();
    echo(&c, "x", &g);
    assert_int_equal(g.err, MANTA_ECONNECT);
    assert_int_equal(g.outcome, MCP_OUTCOME_TRANSPORT);
    assert_int_equal(g.attempts, 4);
    assert_non_null(strstr(g.message, "initialize failed"));
    assert_non_null(strstr(g.message, "after 4 attempts"));
    /* Back-off 20, 40, 80 ms, each jittered to at least half. */
    assert_true(now_ms() - t0 >= 70);
    mcp_stats st;
    mcp_get_stats(c.mcp, &st);
    assert_int_equal(st.retries, 3);
    assert_int_equal(st.errors[manta_err_index(MANTA_ECONNECT)], 1);

    /* The tally a summary shows: counts by kind and the first messages. */
    mcp_errors e;
    memset(&e, 0, sizeof e);
    assert_true(mcp_errors_add(&e, manta_errname(g.err), g.outcome, g.message));
    for (int i = 0; i < 5; i++)
        assert_int_equal(mcp_errors_add(&e, "ETOOL", MCP_OUTCOME_POLICY, "division by zero"),
                         i < MCP_ERRORS_SAMPLES);
    assert_int_equal(e.n_kinds, 2);
    assert_int_equal(e.total, 6);
    cJSON *j = mcp_errors_json(&e);
    const cJSON *k = cJSON_GetObjectItem(j, "ECONNECT");
    assert_int_equal(cJSON_GetObjectItem(k, "count")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(k, "outcome")->valuestring, "transport");
    assert_non_null(
        strstr(cJSON_GetArrayItem(cJSON_GetObjectItem(k, "first"), 0)->valuestring, "refused"));
    k = cJSON_GetObjectItem(j, "ETOOL");
    assert_int_equal(cJSON_GetObjectItem(k, "count")->valueint, 5);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(k, "first")), MCP_ERRORS_SAMPLES);
    cJSON_Delete(j);
    close_client(&c);
}

static void test_non_utf8_arguments(void **state)
{
    client c = open_at("/mcp", S.port, 0, 0);
    got g;
    echo(&c,
         "2\xff+\xc3\x28"
         "3",
         &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "2\xEF\xBF\xBD+\xEF\xBF\xBD(3");
    pthread_mutex_lock(&S.mu);
    assert_string_equal(S.last_text, "2\xEF\xBF\xBD+\xEF\xBF\xBD(3");
    pthread_mutex_unlock(&S.mu);
    /* Keys and nested strings too; numbers and the rest unchanged. */
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "text", "ok");
    cJSON_AddStringToObject(a, "k\xfe", "v");
    cJSON *arr = cJSON_AddArrayToObject(a, "list");
    cJSON_AddItemToArray(arr, cJSON_CreateString("\xed\xa0\x80"));
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(1.5));
    cJSON_AddItemToArray(arr, cJSON_CreateTrue());
    memset(&g, 0, sizeof g);
    assert_int_equal(mcp_call_tool(c.mcp, "echo", a, on_done, &g), MANTA_OK);
    cJSON_Delete(a);
    drain(&c);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(srv_get(&S.bad_utf8), 0);
    close_client(&c);
}

static void test_connection_limit(void **state)
{
    enum { N = 15, LIMIT = 3, DELAY = 60 };
    client c = open_at("/mcp", S.port, 0, LIMIT);
    got g;
    echo(&c, "warm", &g);
    pthread_mutex_lock(&S.mu);
    S.delay_ms = DELAY;
    S.accepted = 0;
    S.max_busy = 0;
    pthread_mutex_unlock(&S.mu);
    got many[N];
    memset(many, 0, sizeof many);
    double t0 = now_ms();
    for (int i = 0; i < N; i++) {
        char args[64];
        snprintf(args, sizeof args, "{\"text\":\"t%d\"}", i);
        assert_int_equal(mcp_call_tool_json(c.mcp, "echo", args, on_done, &many[i]), MANTA_OK);
    }
    drain(&c);
    double took = now_ms() - t0;
    for (int i = 0; i < N; i++) {
        char want[16];
        snprintf(want, sizeof want, "t%d", i);
        assert_int_equal(many[i].err, MANTA_OK);
        assert_string_equal(many[i].text, want);
    }
    mcp_stats st;
    mcp_get_stats(c.mcp, &st);
    fprintf(stderr, "# %d calls of %d ms through %d connections: %.0f ms, %d new connections\n", N,
            DELAY, LIMIT, took, srv_get(&S.accepted));
    assert_int_equal(st.max_on_wire, LIMIT);
    assert_int_equal(st.queued, N - LIMIT); /* all but the first LIMIT waited for a connection */
    assert_int_equal(srv_get(&S.max_busy), LIMIT);
    assert_true(srv_get(&S.accepted) <= LIMIT); /* kept alive and reused */
    assert_true(took >= (N / LIMIT) * DELAY * 0.9);
    close_client(&c);
}

static void test_session_closed(void **state)
{
    client c = open_at("/mcp", S.port, 0, 0);
    got g;
    echo(&c, "x", &g);
    char sid[64];
    snprintf(sid, sizeof sid, "%s", mcp_session_id(c.mcp));
    close_client(&c);
    assert_int_equal(srv_get(&S.deletes), 1);
    pthread_mutex_lock(&S.mu);
    assert_string_equal(S.deleted_sid, sid);
    pthread_mutex_unlock(&S.mu);
}

static void test_text_arg(void **state)
{
    cJSON *tools = cJSON_Parse(TOOLS);
    char arg[32], why[256];
    assert_int_equal(mcp_tool_text_arg(tools, "echo", arg, sizeof arg, why, sizeof why), 0);
    assert_string_equal(arg, "text");
    assert_int_equal(mcp_tool_text_arg(tools, "add", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_string_equal(why, "tool \"add\" has 2 required arguments (a, b): name the one that "
                             "takes the text with `arg:`");
    assert_int_equal(mcp_tool_text_arg(tools, "count", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_non_null(strstr(why, "\"n\" is of type integer, not string"));
    assert_int_equal(mcp_tool_text_arg(tools, "free", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_non_null(strstr(why, "has 0 required arguments"));
    assert_int_equal(mcp_tool_text_arg(tools, "calc", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_string_equal(why, "the server has no tool \"calc\" (it has: echo, add, count, free)");
    cJSON_Delete(tools);

    assert_int_equal(mcp_classify(MANTA_OK, 0), MCP_OUTCOME_OK);
    assert_int_equal(mcp_classify(MANTA_ETOOL, 0), MCP_OUTCOME_POLICY);
    assert_int_equal(mcp_classify(MANTA_ERPC, -32602), MCP_OUTCOME_POLICY);
    assert_int_equal(mcp_classify(MANTA_ERPC, -32603), MCP_OUTCOME_TRANSPORT);
    assert_int_equal(mcp_classify(MANTA_ETIMEDOUT, 0), MCP_OUTCOME_TRANSPORT);
    assert_int_equal(mcp_classify(MANTA_ECONNECT, 0), MCP_OUTCOME_TRANSPORT);
    assert_string_equal(mcp_outcome_name(MCP_OUTCOME_TRANSPORT), "transport");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_fix),
        cmocka_unit_test(test_text_arg),
        cmocka_unit_test_setup(test_protocol_versions, srv_reset),
        cmocka_unit_test_setup(test_redirects, srv_reset),
        cmocka_unit_test_setup(test_retry_5xx_and_reset, srv_reset),
        cmocka_unit_test_setup(test_refused, srv_reset),
        cmocka_unit_test_setup(test_non_utf8_arguments, srv_reset),
        cmocka_unit_test_setup(test_connection_limit, srv_reset),
        cmocka_unit_test_setup(test_session_closed, srv_reset),
    };
    return cmocka_run_group_tests_name("mcp_local", tests, srv_start, srv_stop);
}
