/*
 * test_mcp_sdk.c - the MCP client (actors/mcp.h) against servers built with
 * the official `mcp` Python SDK from PyPI (tests/rl/mcp_sdk_server.py), in
 * its four shapes: stateful or stateless, SSE or JSON answers.
 *
 *   test_mcp_sdk 2   the current 2.x, run by $MANTA_PYTHON
 *   test_mcp_sdk 1   the last 1.x, run by $MANTA_PYTHON_MCP1
 *
 * Exits 77 (skipped) when that variable is not set or its Python lacks the
 * package of that major version: CI has no mcp package, and this test is
 * about the SDK, not about whether it is installed. What each shape must
 * show: the redirect the SDK answers for /mcp/ is followed; the protocol
 * version it answers is accepted (also 2024-11-05 when asked for); the text
 * argument of a tool is found from its inputSchema; bytes that are not
 * UTF-8 arrive as U+FFFD; bad arguments, a failing tool and an unknown
 * tool are policy errors with the SDK's own text; the connection limit
 * holds; a stateful session ends with the client (DELETE: the server then
 * answers 404 to it); and a server restart in the middle of a call is
 * retried through, not reported.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>

#include "manta_http.h"
#include "mcp.h"
#include "test_proc.h"

static const char *python;
static char script[512];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

typedef struct got {
    int fired, err, rpc_code, attempts;
    mcp_outcome outcome;
    char message[2048];
    char text[1024];
} got;

static void on_done(const mcp_result *r, void *arg)
{
    got *g = arg;
    g->fired++;
    g->err = r->err;
    g->rpc_code = r->rpc_code;
    g->attempts = r->attempts;
    g->outcome = r->outcome;
    snprintf(g->message, sizeof g->message, "%s", r->message);
    snprintf(g->text, sizeof g->text, "%s", r->text ? r->text : "");
}

static void drain(manta_http_client *h, mcp_client *m, double limit_ms)
{
    double end = now_ms() + limit_ms;
    while (mcp_in_flight(m) > 0) {
        assert_true(now_ms() < end);
        manta_http_step(h, 50);
    }
}

static mcp_client *open_client(manta_http_client *h, int port, const char *path,
                               const char *version, int max_conn)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.url = url;
    cfg.timeout_ms = 10000;
    cfg.backoff_ms = 200;
    cfg.backoff_max_ms = 1000;
    cfg.max_retries = 10; /* a restart of a Python server takes seconds */
    if (version) cfg.protocol_version = version;
    if (max_conn) cfg.max_connections = max_conn;
    mcp_client *m = mcp_new(h, &cfg);
    assert_non_null(m);
    return m;
}

static void call(manta_http_client *h, mcp_client *m, const char *tool, const cJSON *args, got *g)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(mcp_call_tool(m, tool, args, on_done, g), MANTA_OK);
    drain(h, m, 30000);
    assert_int_equal(g->fired, 1);
}

static void call_text(manta_http_client *h, mcp_client *m, const char *tool, const char *key,
                      const char *text, got *g)
{
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, key, text);
    call(h, m, tool, a, g);
    cJSON_Delete(a);
}

static void on_status(const manta_http_result *r, void *arg)
{
    *(long *)arg = r->err ? -1 : r->status;
}

/* POSTs tools/list with session sid straight over HTTP; the status. */
static long post_with_session(manta_http_client *h, const char *url, const char *sid)
{
    char hs[128];
    snprintf(hs, sizeof hs, "Mcp-Session-Id: %s", sid);
    const char *hdrs[] = {"Content-Type: application/json",
                          "Accept: application/json, text/event-stream", hs,
                          "MCP-Protocol-Version: " MCP_PROTOCOL_VERSION};
    const char *body = "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/list\"}";
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = url;
    req.headers = hdrs;
    req.n_headers = 4;
    req.body = body;
    req.body_len = strlen(body);
    long status = 0;
    assert_int_equal(manta_http_submit(h, &req, on_status, &status, NULL), 0);
    while (manta_http_in_flight(h) > 0) manta_http_step(h, 50);
    return status;
}

/* Everything one server shape must do. */
static void check_shape(bool stateless, bool json)
{
    const char *args[3] = {NULL, NULL, NULL};
    int na = 0;
    if (stateless) args[na++] = "--stateless";
    if (json) args[na++] = "--json";
    test_proc srv;
    assert_int_equal(test_proc_start_python(&srv, python, script, args), 0);
    fprintf(stderr, "# %s %s server on port %d\n", stateless ? "stateless" : "stateful",
            json ? "JSON" : "SSE", srv.port);
    manta_http_client *h = manta_http_new(NULL);
    assert_non_null(h);

    /* The SDK redirects /mcp/ to /mcp (1.8: /mcp to /mcp/): whichever is
     * the redirect, the client follows it and keeps the new URL. */
    char probe[128];
    snprintf(probe, sizeof probe, "http://127.0.0.1:%d/mcp", srv.port);
    bool slash = post_with_session(h, probe, "none") == 307;
    const char *from = slash ? "/mcp" : "/mcp/", *to = slash ? "/mcp/" : "/mcp";
    mcp_client *m = open_client(h, srv.port, from, NULL, 4);
    got g;
    memset(&g, 0, sizeof g);
    assert_int_equal(mcp_list_tools(m, on_done, &g), MANTA_OK);
    drain(h, m, 20000);
    if (g.err != MANTA_OK) fail_msg("tools/list: %s", g.message);
    const char *now = mcp_url(m);
    assert_string_equal(now + strlen(now) - strlen(to), to);
    mcp_stats st;
    mcp_get_stats(m, &st);
    assert_true(st.redirects >= 1);
    assert_true(mcp_protocol_supported(mcp_protocol_version(m)));
    if (stateless)
        assert_null(mcp_session_id(m));
    else
        assert_non_null(mcp_session_id(m));

    /* The text argument from the inputSchema. */
    char arg[64], why[512];
    assert_int_equal(mcp_tool_text_arg(mcp_tools(m), "echo", arg, sizeof arg, why, sizeof why), 0);
    assert_string_equal(arg, "text");
    assert_int_equal(mcp_tool_text_arg(mcp_tools(m), "add", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_non_null(strstr(why, "2 required arguments (a, b)"));
    assert_int_equal(mcp_tool_text_arg(mcp_tools(m), "nope", arg, sizeof arg, why, sizeof why),
                     MANTA_EINVAL);
    assert_non_null(strstr(why, "no tool \"nope\" (it has: echo, add, fail)"));

    /* Bytes that are not UTF-8 arrive as U+FFFD; valid text unchanged. */
    call_text(h, m, "echo", "text",
              "a\xff\xfe"
              "b\xc3",
              &g);
    if (g.err != MANTA_OK) fail_msg("echo: %s", g.message);
    assert_string_equal(g.text, "a\xEF\xBF\xBD\xEF\xBF\xBD"
                                "b\xEF\xBF\xBD");
    call_text(h, m, "echo", "text", "\xcf\x80 \xe2\x89\x88 3.14 \xf0\x9f\x99\x82", &g);
    assert_string_equal(g.text, "\xcf\x80 \xe2\x89\x88 3.14 \xf0\x9f\x99\x82");

    /* The policy's mistakes: observations with the SDK's own text. */
    cJSON *bad = cJSON_Parse("{\"a\": \"seven\", \"b\": 1}");
    call(h, m, "add", bad, &g);
    cJSON_Delete(bad);
    fprintf(stderr, "#   bad arguments: %s: %s\n", manta_errname(g.err), g.message);
    assert_int_equal(g.outcome, MCP_OUTCOME_POLICY);
    assert_non_null(strstr(g.message, "valid"));
    assert_int_equal(g.attempts, 1);
    call_text(h, m, "fail", "text", "purpose", &g);
    fprintf(stderr, "#   failing tool: %s: %s\n", manta_errname(g.err), g.message);
    assert_int_equal(g.outcome, MCP_OUTCOME_POLICY);
    assert_non_null(strstr(g.message, "cannot fail on purpose"));
    call_text(h, m, "nope", "text", "x", &g);
    fprintf(stderr, "#   unknown tool: %s: %s\n", manta_errname(g.err), g.message);
    assert_int_equal(g.outcome, MCP_OUTCOME_POLICY);
    assert_non_null(strstr(g.message, "nope"));

    /* 24 calls at once through at most 4 connections. */
    enum { N = 24 };
    got many[N];
    memset(many, 0, sizeof many);
    for (int i = 0; i < N; i++) {
        char t[16];
        snprintf(t, sizeof t, "n%d", i);
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "text", t);
        assert_int_equal(mcp_call_tool(m, "echo", a, on_done, &many[i]), MANTA_OK);
        cJSON_Delete(a);
    }
    drain(h, m, 30000);
    for (int i = 0; i < N; i++) {
        char t[16];
        snprintf(t, sizeof t, "n%d", i);
        assert_int_equal(many[i].err, MANTA_OK);
        assert_string_equal(many[i].text, t);
    }
    mcp_get_stats(m, &st);
    assert_true(st.max_on_wire <= 4);
    assert_int_equal(st.retries, 0);

    /* The session ends with the client: the server forgets it. */
    char sid[128] = "", url[128];
    if (mcp_session_id(m)) snprintf(sid, sizeof sid, "%s", mcp_session_id(m));
    snprintf(url, sizeof url, "%s", mcp_url(m));
    mcp_close_all(&m, 1, h, 3000);
    if (!stateless) assert_int_equal(post_with_session(h, url, sid), 404);

    /* A server that answers 2024-11-05 when asked for it. */
    m = open_client(h, srv.port, "/mcp", "2024-11-05", 0);
    call_text(h, m, "echo", "text", "old", &g);
    if (g.err != MANTA_OK) fail_msg("asking for 2024-11-05: %s", g.message);
    assert_string_equal(mcp_protocol_version(m), "2024-11-05");
    assert_string_equal(g.text, "old");

    /* A restart in the middle: refused while down, retried through. */
    if (!stateless && json) {
        int port = srv.port;
        assert_int_equal(test_proc_stop(&srv), 0);
        memset(&g, 0, sizeof g);
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "text", "again");
        assert_int_equal(mcp_call_tool(m, "echo", a, on_done, &g), MANTA_OK);
        cJSON_Delete(a);
        double end = now_ms() + 500;
        while (now_ms() < end) manta_http_step(h, 50); /* refused, backing off */
        assert_int_equal(g.fired, 0);
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        /* test_proc passes --port 0 first; a later --port wins in argparse. */
        const char *with_port[] = {"--json", "--port", ps, NULL};
        assert_int_equal(test_proc_start_python(&srv, python, script, with_port), 0);
        assert_int_equal(srv.port, port);
        drain(h, m, 30000);
        if (g.err != MANTA_OK) fail_msg("after the restart: %s", g.message);
        assert_string_equal(g.text, "again");
        assert_true(g.attempts > 1);
        fprintf(stderr, "#   restart: answered after %d attempts\n", g.attempts);
    }
    mcp_close_all(&m, 1, h, 3000);
    manta_http_free(h);
    assert_int_equal(test_proc_stop(&srv), 0);
}

static void test_stateful_sse(void **state)
{
    check_shape(false, false);
}
static void test_stateful_json(void **state)
{
    check_shape(false, true);
}
static void test_stateless_sse(void **state)
{
    check_shape(true, false);
}
static void test_stateless_json(void **state)
{
    check_shape(true, true);
}

/* The SDK's major version that python runs, or -1 without the package. */
static int sdk_major(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --version 2>/dev/null", python, script);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    int major = -1;
    if (fscanf(f, "%d", &major) != 1) major = -1;
    int st = pclose(f);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? major : -1;
}

int main(int argc, char **argv)
{
    int want = argc > 1 ? atoi(argv[1]) : 2;
    const char *var = want == 1 ? "MANTA_PYTHON_MCP1" : "MANTA_PYTHON";
    python = getenv(var);
    snprintf(script, sizeof script, "%s/tests/rl/mcp_sdk_server.py", SOURCE_DIR);
    if (!python || !python[0]) {
        fprintf(stderr, "skipped: $%s is not set (a Python with mcp %d.x)\n", var, want);
        return 77;
    }
    int major = sdk_major();
    if (major != want) {
        fprintf(stderr, "skipped: %s has %s (want mcp %d.x; pip install \"mcp%s\")\n", python,
                major < 0 ? "no mcp package" : "another mcp major version", want,
                want == 1 ? "<2" : ">=2");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stateful_sse),
        cmocka_unit_test(test_stateful_json),
        cmocka_unit_test(test_stateless_sse),
        cmocka_unit_test(test_stateless_json),
    };
    return cmocka_run_group_tests_name(want == 1 ? "mcp_sdk1" : "mcp_sdk2", tests, NULL, NULL);
}
