/*
 * test_mcp.c - the MCP client (actors/mcp.h) against real MCP servers over
 * real HTTP: examples/calc_server.py (the handshake, tools/list, tools/call
 * answered as JSON and as SSE, tool errors, 100 calls in flight, timeouts,
 * injected 500s, a lost session) and tests/http/test_server.py (answers that
 * are broken on purpose: garbage, wrong content type, truncated SSE, wrong
 * id, oversize, hang-ups). Each program-wide server is started here on a
 * free loopback port and stopped at the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "manta_http.h"
#include "mcp.h"
#include "test_proc.h"

static test_proc calc, calc_slow, calc_fail, bad;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

typedef struct got {
    int fired;
    int err;
    char message[1024];
    char text[512];
    bool has_text;
    bool has_result;
    long http_status;
    int rpc_code;
    int tools;
    double elapsed_ms;
} got;

static void on_done(const mcp_result *r, void *arg)
{
    got *g = arg;
    g->fired++;
    g->err = r->err;
    snprintf(g->message, sizeof g->message, "%s", r->message);
    g->has_text = r->text != NULL;
    snprintf(g->text, sizeof g->text, "%s", r->text ? r->text : "");
    g->has_result = r->result != NULL;
    g->http_status = r->http_status;
    g->rpc_code = r->rpc_code;
    g->elapsed_ms = r->elapsed_ms;
    const cJSON *tools = r->result ? cJSON_GetObjectItemCaseSensitive(r->result, "tools") : NULL;
    g->tools = cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : -1;
}

static void drain(manta_http_client *h, mcp_client *m, double limit_ms)
{
    double end = now_ms() + limit_ms;
    while (mcp_in_flight(m) > 0) {
        assert_true(now_ms() < end);
        manta_http_step(h, 100);
    }
}

typedef struct fixture {
    manta_http_client *http;
    mcp_client *mcp;
    char url[128];
} fixture;

/* A client for port/path with extra headers (NULL-terminated, may be NULL). */
static void open_client(fixture *f, int port, const char *path, long timeout_ms,
                        const char *const *headers)
{
    f->http = manta_http_new(NULL);
    assert_non_null(f->http);
    snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d%s", port, path);
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.url = f->url;
    cfg.client_name = "test_mcp";
    /* Retries, back-off and the connection limit are tested in
     * tests/rl/test_mcp_local.c; here every answer counts as it comes. */
    cfg.max_retries = 0;
    cfg.max_connections = 128;
    if (timeout_ms > 0) cfg.timeout_ms = timeout_ms;
    size_t n = 0;
    while (headers && headers[n]) n++;
    cfg.headers = headers;
    cfg.n_headers = n;
    f->mcp = mcp_new(f->http, &cfg);
    assert_non_null(f->mcp);
}

static void close_client(fixture *f)
{
    mcp_free(f->mcp);
    /* Let the session DELETE finish, then close the HTTP client. */
    double end = now_ms() + 3000;
    while (manta_http_in_flight(f->http) > 0 && now_ms() < end) manta_http_step(f->http, 50);
    manta_http_free(f->http);
}

/* One tools/call with arguments as JSON text, driven to completion. */
static void call(fixture *f, const char *tool, const char *args, got *g)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(mcp_call_tool_json(f->mcp, tool, args, on_done, g), MANTA_OK);
    drain(f->http, f->mcp, 20000);
    assert_int_equal(g->fired, 1);
}

static int group_setup(void **state)
{
    const char *slow[] = {"--latency-ms", "200", NULL};
    const char *fail[] = {"--fail-rate", "1.0", NULL};
    if (test_proc_start(&calc, MANTA_CALC_SERVER_PY, NULL) != 0) return -1;
    if (test_proc_start(&calc_slow, MANTA_CALC_SERVER_PY, slow) != 0) return -1;
    if (test_proc_start(&calc_fail, MANTA_CALC_SERVER_PY, fail) != 0) return -1;
    if (test_proc_start(&bad, MANTA_TEST_SERVER_PY, NULL) != 0) return -1;
    return 0;
}

static int group_teardown(void **state)
{
    /* Every server must have survived everything we sent. */
    int rc = 0;
    rc |= test_proc_stop(&calc);
    rc |= test_proc_stop(&calc_slow);
    rc |= test_proc_stop(&calc_fail);
    rc |= test_proc_stop(&bad);
    return rc;
}

static void test_handshake_and_list(void **state)
{
    fixture f;
    open_client(&f, calc.port, "/mcp", 0, NULL);
    assert_false(mcp_ready(f.mcp));
    got init = {0}, list = {0};
    assert_int_equal(mcp_initialize(f.mcp, on_done, &init), MANTA_OK);
    /* Made before the handshake finished: waits for it, then goes out. */
    assert_int_equal(mcp_list_tools(f.mcp, on_done, &list), MANTA_OK);
    drain(f.http, f.mcp, 10000);
    assert_int_equal(init.fired, 1);
    assert_int_equal(init.err, MANTA_OK);
    assert_true(init.has_result);
    assert_true(mcp_ready(f.mcp));
    assert_non_null(mcp_session_id(f.mcp));
    assert_int_equal(strlen(mcp_session_id(f.mcp)), 32);
    assert_string_equal(mcp_protocol_version(f.mcp), MCP_PROTOCOL_VERSION);
    assert_int_equal(list.fired, 1);
    assert_int_equal(list.err, MANTA_OK);
    assert_int_equal(list.tools, 3);

    const cJSON *tools = mcp_tools(f.mcp);
    assert_int_equal(cJSON_GetArraySize(tools), 3);
    const cJSON *t0 = cJSON_GetArrayItem(tools, 0);
    assert_string_equal(cJSON_GetObjectItem(t0, "name")->valuestring, "calc");
    const cJSON *schema = cJSON_GetObjectItem(t0, "inputSchema");
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(schema, "properties"), "expression"));

    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.handshakes, 1);
    assert_int_equal(st.requests, 3); /* initialize, initialized, tools/list */
    assert_int_equal(st.ok, 2);
    close_client(&f);
}

static void test_call_json(void **state)
{
    fixture f;
    open_client(&f, calc.port, "/mcp", 0, NULL);
    got g;
    /* No explicit initialize: the first call runs the handshake. */
    call(&f, "calc", "{\"expression\": \"(2+3)*4\"}", &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_true(g.has_text);
    assert_string_equal(g.text, "20");
    assert_int_equal(g.http_status, 200);
    call(&f, "calc", "{\"expression\": \"2**100 - -1\"}", &g);
    assert_string_equal(g.text, "1267650600228229401496703205377");
    call(&f, "calc", "{\"expression\": \"7 // 2 + 7 % 3 + 1.5\"}", &g);
    assert_string_equal(g.text, "5.5");
    call(&f, "add", "{\"a\": 2, \"b\": 0.5}", &g);
    assert_string_equal(g.text, "2.5");
    call(&f, "mul", "{\"a\": -3, \"b\": 4}", &g);
    assert_string_equal(g.text, "-12");

    cJSON *args = cJSON_CreateObject();
    cJSON_AddStringToObject(args, "expression", "10/4");
    memset(&g, 0, sizeof g);
    assert_int_equal(mcp_call_tool(f.mcp, "calc", args, on_done, &g), MANTA_OK);
    cJSON_Delete(args); /* copied by the call */
    drain(f.http, f.mcp, 10000);
    assert_string_equal(g.text, "2.5");

    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.calls, 6);
    assert_int_equal(st.ok, 6);
    assert_int_equal(st.sse_answers, 0);
    assert_true(st.json_answers >= 6);
    close_client(&f);
}

static void test_call_sse(void **state)
{
    fixture f;
    const char *hdrs[] = {"X-Calc-SSE: 1", NULL};
    open_client(&f, calc.port, "/mcp", 0, hdrs);
    got g;
    call(&f, "calc", "{\"expression\": \"6*7\"}", &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "42");
    call(&f, "calc", "{\"expression\": \"1/0\"}", &g);
    assert_int_equal(g.err, MANTA_ETOOL);
    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.sse_answers, 2);
    assert_int_equal(st.sse_events_skipped, 2); /* one notification before each answer */
    close_client(&f);

    /* test_server's SSE: CRLF lines, a comment, an id field. */
    open_client(&f, bad.port, "/mcp/sse", 0, NULL);
    call(&f, "any", NULL, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "ok");
    close_client(&f);

    /* A stream left open after the response: the answer counts at once. */
    open_client(&f, bad.port, "/mcp/sseopen", 4000, NULL);
    call(&f, "any", NULL, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "ok");
    assert_true(g.elapsed_ms < 2000);
    close_client(&f);
}

static void test_tool_errors(void **state)
{
    fixture f;
    open_client(&f, calc.port, "/mcp", 0, NULL);
    got g;
    call(&f, "calc", "{\"expression\": \"1/0\"}", &g);
    assert_int_equal(g.err, MANTA_ETOOL);
    assert_string_equal(g.message, "division by zero");
    assert_string_equal(g.text, "division by zero");
    assert_true(g.has_result);
    call(&f, "calc", "{\"expression\": \"1+\"}", &g);
    assert_int_equal(g.err, MANTA_ETOOL);
    assert_non_null(strstr(g.message, "malformed"));
    call(&f, "calc", "{\"expression\": \"__import__('os').getcwd()\"}", &g);
    assert_int_equal(g.err, MANTA_ETOOL);
    assert_non_null(strstr(g.message, "not allowed"));
    call(&f, "calc", "{}", &g);
    assert_int_equal(g.err, MANTA_ETOOL);

    /* An unknown tool is a JSON-RPC error, not a tool error. */
    call(&f, "no_such_tool", "{}", &g);
    assert_int_equal(g.err, MANTA_ERPC);
    assert_int_equal(g.rpc_code, -32602);
    assert_non_null(strstr(g.message, "unknown tool"));
    assert_false(g.has_text);

    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ETOOL)], 4);
    assert_int_equal(st.errors[manta_err_index(MANTA_ERPC)], 1);
    assert_int_equal(st.ok, 0);
    close_client(&f);

    assert_int_equal(mcp_call_tool_json(NULL, "calc", "{}", on_done, &g), MANTA_EINVAL);
    assert_string_equal(manta_errname(MANTA_ETOOL), "ETOOL");
}

static void test_hundred_in_flight(void **state)
{
    enum { N = 100, LATENCY = 200 };
    fixture f;
    open_client(&f, calc_slow.port, "/mcp", 0, NULL);
    got init = {0};
    assert_int_equal(mcp_initialize(f.mcp, on_done, &init), MANTA_OK);
    drain(f.http, f.mcp, 10000);
    assert_int_equal(init.err, MANTA_OK);

    got *g = calloc(N, sizeof *g);
    double t0 = now_ms();
    for (int i = 0; i < N; i++) {
        char args[64];
        snprintf(args, sizeof args, "{\"expression\": \"%d*%d\"}", i, i);
        assert_int_equal(mcp_call_tool_json(f.mcp, "calc", args, on_done, &g[i]), MANTA_OK);
    }
    assert_int_equal(mcp_in_flight(f.mcp), N);
    drain(f.http, f.mcp, 20000);
    double took = now_ms() - t0;
    for (int i = 0; i < N; i++) {
        char want[32];
        snprintf(want, sizeof want, "%d", i * i);
        assert_int_equal(g[i].fired, 1);
        assert_int_equal(g[i].err, MANTA_OK);
        assert_string_equal(g[i].text, want); /* each answer went to its own call */
        assert_true(g[i].elapsed_ms >= LATENCY * 0.9);
    }
    /* Serially: N * LATENCY = 20 s. In flight together: about one LATENCY. */
    fprintf(stderr, "# 100 calls of %d ms each took %.0f ms\n", LATENCY, took);
    assert_true(took < 0.5 * N * LATENCY);
    free(g);
    close_client(&f);
}

static void test_timeout(void **state)
{
    fixture f;
    const char *hdrs[] = {"X-Calc-Latency-Ms: 3000", NULL};
    open_client(&f, calc.port, "/mcp", 300, hdrs);
    got g;
    call(&f, "calc", "{\"expression\": \"1+1\"}", &g);
    assert_int_equal(g.err, MANTA_ETIMEDOUT);
    assert_true(g.elapsed_ms < 2000);
    assert_non_null(strstr(g.message, "tools/call"));
    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ETIMEDOUT)], 1);
    close_client(&f);
}

static void test_refused(void **state)
{
    fixture f;
    int port = test_closed_port();
    assert_true(port > 0);
    open_client(&f, port, "/mcp", 0, NULL);
    got a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    assert_int_equal(mcp_call_tool_json(f.mcp, "calc", "{}", on_done, &a), MANTA_OK);
    assert_int_equal(mcp_list_tools(f.mcp, on_done, &b), MANTA_OK);
    drain(f.http, f.mcp, 10000);
    /* The handshake failed, so both queued requests fail with its cause. */
    assert_int_equal(a.err, MANTA_ECONNECT);
    assert_int_equal(b.err, MANTA_ECONNECT);
    assert_non_null(strstr(a.message, "initialize failed"));
    assert_false(mcp_ready(f.mcp));
    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ECONNECT)], 2);
    manta_http_stats hs;
    manta_http_get_stats(f.http, &hs);
    assert_int_equal(hs.retries, 0); /* retries are the MCP client's, off here */
    close_client(&f);
}

static void test_http_errors(void **state)
{
    fixture f;
    open_client(&f, calc_fail.port, "/mcp", 0, NULL);
    got g;
    call(&f, "calc", "{\"expression\": \"1+1\"}", &g);
    assert_int_equal(g.err, MANTA_EHTTP);
    assert_int_equal(g.http_status, 500);
    assert_non_null(strstr(g.message, "HTTP 500"));
    manta_http_stats hs;
    manta_http_get_stats(f.http, &hs);
    assert_int_equal(hs.retries, 0); /* a POST that reached the server is not sent twice */
    close_client(&f);

    /* A wrong path: the handshake itself gets 404. */
    open_client(&f, calc.port, "/nope", 0, NULL);
    call(&f, "calc", "{}", &g);
    assert_int_equal(g.err, MANTA_EHTTP);
    assert_non_null(strstr(g.message, "HTTP 404"));
    assert_non_null(strstr(g.message, "initialize"));
    close_client(&f);

    open_client(&f, bad.port, "/mcp/status500", 0, NULL);
    call(&f, "calc", "{}", &g);
    assert_int_equal(g.err, MANTA_EHTTP);
    assert_int_equal(g.http_status, 500);
    close_client(&f);
}

/* Each broken answer of test_server.py and the error kind it must give. */
static void test_broken_answers(void **state)
{
    static const struct {
        const char *mode;
        int want;
        const char *in_message;
    } cases[] = {
        {"garbage", MANTA_EJSON, "not valid JSON"},
        {"wrongtype", MANTA_EPROTO, "text/plain"},
        {"truncated", MANTA_EPROTO, "SSE stream ended"},
        {"noresponse", MANTA_EPROTO, "1 other events"},
        {"wrongid", MANTA_EPROTO, "does not match"},
        {"notrpc", MANTA_EPROTO, "JSON-RPC 2.0"},
        {"error", MANTA_ERPC, "tool exploded"},
        {"hangup", MANTA_ETRANSFER, "tools/call"},
        {"ok", MANTA_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fixture f;
        char path[64];
        snprintf(path, sizeof path, "/mcp/%s", cases[i].mode);
        open_client(&f, bad.port, path, 0, NULL);
        got g;
        call(&f, "x", "{}", &g);
        if (g.err != cases[i].want || !strstr(g.message, cases[i].in_message))
            fail_msg("mode %s: got %s \"%s\", want %s with \"%s\"", cases[i].mode,
                     manta_errname(g.err), g.message, manta_errname(cases[i].want),
                     cases[i].in_message);
        mcp_stats st;
        mcp_get_stats(f.mcp, &st);
        assert_int_equal(
            st.errors[manta_err_index(cases[i].want)] + (cases[i].want == MANTA_OK ? st.ok : 0), 1);
        close_client(&f);
    }
}

static void test_too_large(void **state)
{
    fixture f;
    f.http = manta_http_new(NULL);
    snprintf(f.url, sizeof f.url, "http://127.0.0.1:%d/mcp/big", bad.port);
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.url = f.url;
    cfg.max_body = 64 * 1024;
    f.mcp = mcp_new(f.http, &cfg);
    got g;
    call(&f, "x", "{}", &g);
    assert_int_equal(g.err, MANTA_EMSGSIZE);
    assert_non_null(strstr(g.message, "65536-byte limit"));
    close_client(&f);

    /* The same answer under the default 16 MiB limit arrives whole. */
    open_client(&f, bad.port, "/mcp/big", 0, NULL);
    call(&f, "x", "{}", &g);
    assert_int_equal(g.err, MANTA_OK);
    close_client(&f);
}

typedef struct del_out {
    int fired;
    long status;
} del_out;

static void on_del(const manta_http_result *r, void *arg)
{
    del_out *out = arg;
    out->fired++;
    out->status = r->status;
}

static void test_session_lost(void **state)
{
    fixture f;
    open_client(&f, calc.port, "/mcp", 0, NULL);
    got g;
    call(&f, "calc", "{\"expression\": \"1+2\"}", &g);
    assert_string_equal(g.text, "3");
    char old[64];
    snprintf(old, sizeof old, "%s", mcp_session_id(f.mcp));

    /* End the session behind the client's back. */
    char hdr[128];
    snprintf(hdr, sizeof hdr, "Mcp-Session-Id: %s", old);
    const char *hdrs[] = {hdr};
    manta_http_request req;
    manta_http_request_init(&req);
    req.method = "DELETE";
    req.url = f.url;
    req.headers = hdrs;
    req.n_headers = 1;
    del_out out = {0, 0};
    assert_int_equal(manta_http_submit(f.http, &req, on_del, &out, NULL), 0);
    while (manta_http_in_flight(f.http) > 0) manta_http_step(f.http, 100);
    assert_int_equal(out.fired, 1);
    assert_int_equal(out.status, 200);

    /* The next call gets 404, shakes hands again and is sent once more. */
    call(&f, "calc", "{\"expression\": \"2+2\"}", &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.text, "4");
    assert_string_not_equal(mcp_session_id(f.mcp), old);
    mcp_stats st;
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.handshakes, 2);
    assert_int_equal(st.session_resends, 1);
    close_client(&f);

    /* A server that loses every session: one resend, then ESESSION. */
    open_client(&f, bad.port, "/mcp/expire", 0, NULL);
    call(&f, "x", "{}", &g);
    assert_int_equal(g.err, MANTA_ESESSION);
    mcp_get_stats(f.mcp, &st);
    assert_int_equal(st.handshakes, 2);
    assert_int_equal(st.session_resends, 1);
    close_client(&f);
}

/* Frees its client from inside its callback. */
typedef struct freer {
    mcp_client *m;
    int fired;
} freer;

static void on_free_inside(const mcp_result *r, void *arg)
{
    freer *fr = arg;
    fr->fired++;
    mcp_free(fr->m);
}

static void test_free_with_calls_in_flight(void **state)
{
    fixture f;
    const char *hdrs[] = {"X-Calc-Latency-Ms: 2000", NULL};
    open_client(&f, calc.port, "/mcp", 0, hdrs);
    got init = {0};
    mcp_initialize(f.mcp, on_done, &init);
    drain(f.http, f.mcp, 10000);
    got g[5];
    memset(g, 0, sizeof g);
    for (int i = 0; i < 5; i++)
        mcp_call_tool_json(f.mcp, "calc", "{\"expression\":\"1\"}", on_done, &g[i]);
    manta_http_step(f.http, 50);
    double t0 = now_ms();
    close_client(&f); /* must not wait for the 2 s answers */
    assert_true(now_ms() - t0 < 1500);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(g[i].fired, 1);
        assert_int_equal(g[i].err, MANTA_ECLOSED);
    }

    /* Freed from its own callback, with another call still pending. */
    fixture f2;
    open_client(&f2, calc.port, "/mcp", 0, NULL);
    freer fr = {f2.mcp, 0};
    got other = {0};
    mcp_call_tool_json(f2.mcp, "calc", "{\"expression\":\"1\"}", on_free_inside, &fr);
    mcp_call_tool_json(f2.mcp, "calc", "{\"expression\":\"2\"}", on_done, &other);
    double end = now_ms() + 10000;
    while (fr.fired == 0 && now_ms() < end) manta_http_step(f2.http, 100);
    assert_int_equal(fr.fired, 1);
    assert_int_equal(other.fired, 1); /* ended by the free */
    end = now_ms() + 3000;
    while (manta_http_in_flight(f2.http) > 0 && now_ms() < end) manta_http_step(f2.http, 50);
    manta_http_free(f2.http);
    assert_int_equal(fr.fired, 1);
    assert_int_equal(other.fired, 1);
}

static void test_sse_parser(void **state)
{
    bool bad_json = false;
    uint64_t skipped = 0;
    const char *s1 = ": hello\r\n"
                     "event: message\r\n"
                     "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n"
                     "\r\n"
                     "data: {\"jsonrpc\":\"2.0\",\r\n"
                     "data:  \"id\": 5,\r\n"
                     "data:\"result\":{\"v\":1}}\r\n"
                     "\r\n";
    cJSON *r = mcp_sse_find_response(s1, strlen(s1), 5, &bad_json, &skipped);
    assert_non_null(r);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "result"), "v")->valueint, 1);
    assert_int_equal(skipped, 1);
    assert_false(bad_json);
    cJSON_Delete(r);

    /* CR-only line ends; the matching id is the second response. */
    const char *s2 = "data: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\r\r"
                     "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"error\":{\"code\":1}}\r\r";
    skipped = 0;
    r = mcp_sse_find_response(s2, strlen(s2), 5, &bad_json, &skipped);
    assert_non_null(r);
    assert_non_null(cJSON_GetObjectItem(r, "error"));
    assert_int_equal(skipped, 1);
    cJSON_Delete(r);

    /* The last event lacks its blank line: the stream was cut, no answer. */
    const char *s3 = "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\n";
    assert_null(mcp_sse_find_response(s3, strlen(s3), 5, &bad_json, &skipped));
    const char *s3b = "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\n\n";
    r = mcp_sse_find_response(s3b, strlen(s3b), 5, NULL, NULL);
    assert_non_null(r);
    cJSON_Delete(r);

    /* Invalid JSON in an event is reported. */
    bad_json = false;
    const char *s4 = "data: {not json\n\n";
    assert_null(mcp_sse_find_response(s4, strlen(s4), 5, &bad_json, &skipped));
    assert_true(bad_json);

    /* Empty and comment-only streams. */
    assert_null(mcp_sse_find_response("", 0, 1, NULL, NULL));
    assert_null(mcp_sse_find_response(":x\n\n\n", 5, 1, NULL, NULL));
}

/* Mutated and cut SSE streams: the parser must never read out of bounds
 * (ASan watches), and whatever it returns must really be our response. */
static void test_sse_parser_fuzz(void **state)
{
    static const char *const seeds[] = {
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\n"
        "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[]}}\n\n",
        ": c\r\nid: 1\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":3,\"error\":{}}\r\n\r\n",
        "data:{\"id\":3,\"result\":{}}\r\rdata\r\r",
    };
    static const char alphabet[] = "\r\n:{}\" ,data3id";
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    char buf[512];
    int found = 0;
    for (int iter = 0; iter < 20000; iter++) {
        const char *seed = seeds[iter % 3];
        size_t len = strlen(seed);
        memcpy(buf, seed, len);
        int edits = (int)(rng % 4);
        for (int e = 0; e < edits; e++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t at = (size_t)(rng % len);
            if (rng & 0x100)
                buf[at] = alphabet[(rng >> 20) % (sizeof alphabet - 1)];
            else
                buf[at] = (char)(rng >> 24);
        }
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        size_t cut = (rng & 1) ? len : (size_t)(rng % (len + 1));
        /* An exact-size heap copy, so ASan sees any read past the end. */
        char *heap = malloc(cut ? cut : 1);
        memcpy(heap, buf, cut);
        bool malformed = false;
        uint64_t skipped = 0;
        cJSON *r = mcp_sse_find_response(heap, cut, 3, &malformed, &skipped);
        if (r) {
            found++;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(r, "id");
            assert_true(cJSON_IsNumber(id) && id->valuedouble == 3.0);
            assert_true(cJSON_GetObjectItem(r, "result") || cJSON_GetObjectItem(r, "error"));
            cJSON_Delete(r);
        }
        free(heap);
    }
    assert_true(found > 1000); /* unmutated, whole seeds are found */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_parser),
        cmocka_unit_test(test_sse_parser_fuzz),
        cmocka_unit_test(test_handshake_and_list),
        cmocka_unit_test(test_call_json),
        cmocka_unit_test(test_call_sse),
        cmocka_unit_test(test_tool_errors),
        cmocka_unit_test(test_hundred_in_flight),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_http_errors),
        cmocka_unit_test(test_broken_answers),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_session_lost),
        cmocka_unit_test(test_free_with_calls_in_flight),
    };
    return cmocka_run_group_tests_name("mcp", tests, group_setup, group_teardown);
}
