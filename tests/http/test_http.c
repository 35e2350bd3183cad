/*
 * test_http.c - the runtime's HTTP client (manta_http.h only) against a real
 * local HTTP server, tests/http/test_server.py, which this program starts on a
 * free loopback port and stops at the end: bodies and headers both ways,
 * statuses, retries with back-off, timeouts, refused connections, DNS
 * failures, the body limit, broken connections, many requests at once,
 * connection reuse, cancel and free with requests in flight, and driving the
 * client from an outside poll/epoll loop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "manta_http.h"
#include "test_proc.h"

static test_proc server;
static char base[64];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* What a callback saw, copied out. */
typedef struct got {
    int fired;
    int err;
    long status;
    char message[512];
    char *body;
    size_t body_len;
    char content_type[128];
    int attempts;
    double elapsed_ms;
    uint64_t id;
} got;

static void on_done(const manta_http_result *r, void *arg)
{
    got *g = arg;
    g->fired++;
    g->err = r->err;
    g->status = r->status;
    g->id = r->id;
    snprintf(g->message, sizeof g->message, "%s", r->message);
    free(g->body);
    g->body = malloc(r->body_len + 1);
    memcpy(g->body, r->body, r->body_len + 1);
    g->body_len = r->body_len;
    snprintf(g->content_type, sizeof g->content_type, "%s", r->content_type ? r->content_type : "");
    g->attempts = r->attempts;
    g->elapsed_ms = r->elapsed_ms;
}

static void got_clear(got *g)
{
    free(g->body);
    memset(g, 0, sizeof *g);
}

/* Drives c until nothing is in flight; fails the test after limit_ms. */
static void drain(manta_http_client *c, double limit_ms)
{
    double end = now_ms() + limit_ms;
    while (manta_http_in_flight(c) > 0) {
        assert_true(now_ms() < end);
        manta_http_step(c, 100);
    }
}

static void url(char *out, size_t cap, const char *path)
{
    snprintf(out, cap, "%s%s", base, path);
}

/* One request, driven to completion. */
static void fetch(manta_http_client *c, manta_http_request *req, got *g)
{
    assert_int_equal(manta_http_submit(c, req, on_done, g, NULL), 0);
    drain(c, 15000);
    assert_int_equal(g->fired, 1);
}

static int group_setup(void **state)
{
    if (test_proc_start(&server, MANTA_TEST_SERVER_PY, NULL) != 0) return -1;
    snprintf(base, sizeof base, "http://127.0.0.1:%d", server.port);
    return 0;
}

static int group_teardown(void **state)
{
    /* The server must still be alive: a crash under our requests is a bug. */
    return test_proc_stop(&server);
}

static void test_get_with_headers(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    assert_non_null(c);
    char u[128];
    url(u, sizeof u, "/echo?x=1");
    const char *hdrs[] = {"X-Manta-Test: hello there", "Accept: application/json"};
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.headers = hdrs;
    req.n_headers = 2;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.status, 200);
    assert_string_equal(g.message, "");
    assert_string_equal(g.content_type, "application/json");
    assert_non_null(strstr(g.body, "\"method\": \"GET\""));
    assert_non_null(strstr(g.body, "\"X-Manta-Test\": \"hello there\""));
    assert_non_null(strstr(g.body, "\"path\": \"/echo?x=1\""));
    assert_int_equal(g.attempts, 1);
    assert_int_equal(strlen(g.body), g.body_len);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.submitted, 1);
    assert_int_equal(st.completed, 1);
    assert_int_equal(st.ok, 1);
    assert_int_equal(st.status_2xx, 1);
    got_clear(&g);
    manta_http_free(c);
}

static void test_post_and_put_body(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/echo");
    /* Over 1 KiB, where curl would otherwise wait for "100 Continue". */
    char body[3000];
    for (size_t i = 0; i < sizeof body - 1; i++) body[i] = (char)('a' + i % 26);
    body[sizeof body - 1] = '\0';
    const char *hdrs[] = {"Content-Type: text/plain"};
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.headers = hdrs;
    req.n_headers = 1;
    req.body = body;
    req.body_len = strlen(body);
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_non_null(strstr(g.body, "\"method\": \"POST\""));
    assert_non_null(strstr(g.body, body));
    assert_true(g.elapsed_ms < 900); /* no 1 s Expect wait */
    got_clear(&g);

    req.method = "put";
    req.body = "{\"k\": 1}";
    req.body_len = 8;
    fetch(c, &req, &g);
    assert_int_equal(g.status, 200);
    assert_non_null(strstr(g.body, "\"method\": \"PUT\""));
    assert_non_null(strstr(g.body, "{\\\"k\\\": 1}"));
    got_clear(&g);
    manta_http_free(c);
}

static void test_status_codes(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.max_retries = 0;
    got g = {0};
    url(u, sizeof u, "/status/404");
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.status, 404);
    assert_string_equal(g.body, "status 404");
    got_clear(&g);
    url(u, sizeof u, "/status/500");
    fetch(c, &req, &g);
    assert_int_equal(g.status, 500);
    assert_int_equal(g.attempts, 1);
    got_clear(&g);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.status_4xx, 1);
    assert_int_equal(st.status_5xx, 1);
    assert_int_equal(st.ok, 2);
    manta_http_free(c);
}

static void test_retry_5xx(void **state)
{
    manta_http_config cfg;
    manta_http_config_init(&cfg);
    cfg.backoff_ms = 20;
    manta_http_client *c = manta_http_new(&cfg);
    char u[128];
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    got g = {0};

    /* GET is idempotent: the client's 2 retries apply by default. */
    url(u, sizeof u, "/flaky/get1/2");
    fetch(c, &req, &g);
    assert_int_equal(g.status, 200);
    assert_string_equal(g.body, "finally");
    assert_int_equal(g.attempts, 3);
    got_clear(&g);

    /* POST is not retried unless asked. */
    url(u, sizeof u, "/flaky/post1/1");
    req.body = "x";
    req.body_len = 1;
    fetch(c, &req, &g);
    assert_int_equal(g.status, 503);
    assert_int_equal(g.attempts, 1);
    got_clear(&g);

    url(u, sizeof u, "/flaky/post2/1");
    req.max_retries = 1;
    req.retry_on = MANTA_HTTP_RETRY_5XX;
    fetch(c, &req, &g);
    assert_int_equal(g.status, 200);
    assert_int_equal(g.attempts, 2);
    got_clear(&g);

    /* Retries run out: the last 5xx is the answer. */
    url(u, sizeof u, "/flaky/get2/10");
    req.body = NULL;
    req.max_retries = 2;
    fetch(c, &req, &g);
    assert_int_equal(g.status, 503);
    assert_int_equal(g.attempts, 3);
    got_clear(&g);
    /* ... and the server saw exactly 3 requests. */
    url(u, sizeof u, "/count/get2");
    req.max_retries = 0;
    fetch(c, &req, &g);
    assert_string_equal(g.body, "3");
    got_clear(&g);

    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.retries, 2 + 1 + 2);
    assert_int_equal(st.attempts, 3 + 1 + 2 + 3 + 1);
    manta_http_free(c);
}

static void test_timeout(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/slow/3000");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.timeout_ms = 200;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_ETIMEDOUT);
    assert_int_equal(g.status, 0);
    assert_true(g.elapsed_ms >= 150 && g.elapsed_ms < 1500);
    assert_non_null(strstr(g.message, "200 ms"));
    assert_int_equal(g.body_len, 0);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ETIMEDOUT)], 1);
    assert_int_equal(st.ok, 0);
    got_clear(&g);
    manta_http_free(c);
}

static void test_refused_with_backoff(void **state)
{
    manta_http_config cfg;
    manta_http_config_init(&cfg);
    cfg.backoff_ms = 50;
    manta_http_client *c = manta_http_new(&cfg);
    int port = test_closed_port();
    assert_true(port > 0);
    char u[128];
    snprintf(u, sizeof u, "http://127.0.0.1:%d/x", port);
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_ECONNECT);
    assert_int_equal(g.attempts, 3);
    /* Back-offs of [25,50] then [50,100] ms happened in between. */
    assert_true(g.elapsed_ms >= 75);
    assert_non_null(strstr(g.message, u));
    got_clear(&g);

    /* A POST without retries fails at once. */
    req.body = "{}";
    req.body_len = 2;
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_ECONNECT);
    assert_int_equal(g.attempts, 1);
    got_clear(&g);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ECONNECT)], 2);
    assert_int_equal(st.retries, 2);
    manta_http_free(c);
}

static void test_dns_failure(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    manta_http_request req;
    manta_http_request_init(&req);
    /* .invalid never resolves (RFC 6761). */
    req.url = "http://manta-no-such-host.invalid/";
    req.max_retries = 0;
    req.connect_timeout_ms = 3000;
    got g = {0};
    fetch(c, &req, &g);
    /* A machine whose DNS server does not answer at all runs out of the
     * connect timeout first; that must still be reported as a failure to
     * connect, never as anything else. */
    if (g.err != MANTA_ERESOLVE) {
        assert_int_equal(g.err, MANTA_ETIMEDOUT);
        assert_non_null(strstr(g.message, "connect timed out"));
    }
    assert_non_null(strstr(g.message, "manta-no-such-host.invalid"));
    got_clear(&g);
    manta_http_free(c);
}

static void test_body_limit(void **state)
{
    manta_http_config cfg;
    manta_http_config_init(&cfg);
    cfg.max_body = 1000;
    manta_http_client *c = manta_http_new(&cfg);
    char u[128];
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    got g = {0};

    url(u, sizeof u, "/big/1000"); /* exactly the limit: fine */
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.body_len, 1000);
    got_clear(&g);

    url(u, sizeof u, "/big/1001"); /* Content-Length over the limit */
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_EMSGSIZE);
    assert_int_equal(g.body_len, 0);
    assert_non_null(strstr(g.message, "1000-byte limit"));
    got_clear(&g);

    url(u, sizeof u, "/big-chunked/200000"); /* no length: caught while reading */
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_EMSGSIZE);
    got_clear(&g);

    /* A per-request limit overrides the client's. */
    url(u, sizeof u, "/big-chunked/200000");
    req.max_body = 300000;
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.body_len, 200000);
    assert_int_equal(g.body[199999], 'y');
    got_clear(&g);

    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_EMSGSIZE)], 2);
    manta_http_free(c);
}

static void test_hangup(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/hangup");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.max_retries = 0;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_ETRANSFER);
    assert_true(strlen(g.message) > 0);
    got_clear(&g);
    manta_http_free(c);
}

/* https:// to a plain-HTTP server: the TLS handshake fails, and the code
 * says so rather than a generic transfer failure. */
static void test_tls_failure(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    snprintf(u, sizeof u, "https://%s/hello", base + strlen("http://"));
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.max_retries = 0;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_ETLS);
    assert_int_equal(g.status, 0);
    assert_non_null(strstr(g.message, u));
    got_clear(&g);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.errors[manta_err_index(MANTA_ETLS)], 1);
    manta_http_free(c);
}

static void test_many_in_flight(void **state)
{
    enum { N = 50, DELAY = 200 };
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/slow/200");
    got *g = calloc(N, sizeof *g);
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    double t0 = now_ms();
    for (int i = 0; i < N; i++)
        assert_int_equal(manta_http_submit(c, &req, on_done, &g[i], NULL), 0);
    assert_int_equal(manta_http_in_flight(c), N);
    drain(c, 15000);
    double took = now_ms() - t0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(g[i].fired, 1);
        assert_int_equal(g[i].status, 200);
        got_clear(&g[i]);
    }
    /* Serially this is N * DELAY = 10 s; overlapped it is about one DELAY. */
    assert_true(took < 0.5 * N * DELAY);
    free(g);
    manta_http_free(c);
}

static void test_connection_reuse(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/echo");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    for (int i = 0; i < 20; i++) {
        got g = {0};
        fetch(c, &req, &g);
        assert_int_equal(g.status, 200);
        got_clear(&g);
    }
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.attempts, 20);
    assert_int_equal(st.connects, 1); /* one keep-alive connection for all */
    manta_http_free(c);
}

static void test_cancel_and_free(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/slow/2000");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    got a = {0}, b = {0}, d = {0};
    uint64_t ida = 0, idb = 0;
    assert_int_equal(manta_http_submit(c, &req, on_done, &a, &ida), 0);
    assert_int_equal(manta_http_submit(c, &req, on_done, &b, &idb), 0);
    assert_int_equal(manta_http_submit(c, &req, on_done, &d, NULL), 0);
    assert_true(ida != 0 && idb != 0 && ida != idb);
    manta_http_step(c, 50); /* get them connected */
    assert_int_equal(a.fired, 0);
    assert_int_equal(manta_http_cancel(c, ida), 0);
    assert_int_equal(a.fired, 1); /* inside cancel */
    assert_int_equal(a.err, MANTA_ECANCELED);
    assert_int_equal(a.id, ida);
    assert_int_equal(manta_http_cancel(c, ida), MANTA_EINVAL);
    assert_int_equal(manta_http_in_flight(c), 2);
    manta_http_free(c);
    assert_int_equal(b.fired, 1);
    assert_int_equal(b.err, MANTA_ECLOSED);
    assert_int_equal(d.fired, 1);
    assert_int_equal(d.err, MANTA_ECLOSED);
    got_clear(&a);
    got_clear(&b);
    got_clear(&d);
    manta_http_free(NULL);
}

/* manta_http_after: timers on the client's clock, in order, cancelable,
 * ended by free, and not counted as requests. */
static void test_after_timers(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    got early = {0}, late = {0}, gone = {0}, closed = {0};
    uint64_t id_gone = 0;
    double t0 = now_ms();
    assert_int_equal(manta_http_after(c, 120, on_done, &late, NULL), 0);
    assert_int_equal(manta_http_after(c, 30, on_done, &early, NULL), 0);
    assert_int_equal(manta_http_after(c, 60, on_done, &gone, &id_gone), 0);
    assert_int_equal(manta_http_after(c, -1, on_done, &gone, NULL), MANTA_EINVAL);
    assert_int_equal(manta_http_after(c, 5, NULL, NULL, NULL), MANTA_EINVAL);
    assert_int_equal(manta_http_in_flight(c), 3);
    int t = manta_http_timeout_ms(c);
    assert_true(t >= 0 && t <= 30);
    assert_int_equal(manta_http_cancel(c, id_gone), 0);
    assert_int_equal(gone.fired, 1);
    assert_int_equal(gone.err, MANTA_ECANCELED);
    while (!early.fired) manta_http_step(c, 10);
    assert_int_equal(late.fired, 0);
    assert_true(now_ms() - t0 >= 29);
    assert_int_equal(early.err, MANTA_OK);
    drain(c, 2000);
    assert_int_equal(late.fired, 1);
    assert_int_equal(late.err, MANTA_OK);
    assert_true(now_ms() - t0 >= 119);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.submitted + st.completed, 0);
    assert_int_equal(manta_http_after(c, 10000, on_done, &closed, NULL), 0);
    manta_http_free(c);
    assert_int_equal(closed.fired, 1);
    assert_int_equal(closed.err, MANTA_ECLOSED);
    got_clear(&early), got_clear(&late), got_clear(&gone), got_clear(&closed);
}

static void test_invalid_submit(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    got g = {0};
    manta_http_request req;
    manta_http_request_init(&req);
    assert_int_equal(manta_http_submit(c, &req, on_done, &g, NULL), MANTA_EINVAL);
    req.url = "http://127.0.0.1:1/";
    const char *bad[] = {"no colon here"};
    req.headers = bad;
    req.n_headers = 1;
    assert_int_equal(manta_http_submit(c, &req, on_done, &g, NULL), MANTA_EINVAL);
    assert_int_equal(manta_http_submit(c, &req, NULL, NULL, NULL), MANTA_EINVAL);
    assert_int_equal(manta_http_in_flight(c), 0);
    assert_int_equal(manta_http_step(c, 10), 0);
    assert_int_equal(g.fired, 0);
    manta_http_config cfg;
    manta_http_config_init(&cfg);
    cfg.max_body = 0;
    assert_null(manta_http_new(&cfg));
    assert_string_equal(manta_errname(MANTA_ETIMEDOUT), "ETIMEDOUT");
    assert_string_equal(manta_strerror(999), "unknown error code");
    manta_http_free(c);
}

static int stop_at_hello(const char *ct, const char *body, size_t len, void *arg)
{
    int *calls = arg;
    (*calls)++;
    assert_non_null(ct);
    assert_string_equal(ct, "text/plain");
    assert_int_equal(strlen(body), len);
    return strstr(body, "hello\n") != NULL;
}

static int never_stop(const char *ct, const char *body, size_t len, void *arg)
{
    (*(int *)arg)++;
    return 0;
}

/* on_body ends a streamed answer as soon as it holds what the caller wants. */
static void test_end_stream_early(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/stream/3000");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.timeout_ms = 5000;
    int calls = 0;
    req.on_body = stop_at_hello;
    req.on_body_arg = &calls;
    got g = {0};
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_int_equal(g.status, 200);
    assert_string_equal(g.body, "hello\n");
    assert_true(g.elapsed_ms < 2000); /* did not wait for "bye" */
    assert_int_equal(calls, 1);
    got_clear(&g);
    manta_http_stats st;
    manta_http_get_stats(c, &st);
    assert_int_equal(st.ended_early, 1);

    /* A watcher that never says stop sees every byte and changes nothing. */
    url(u, sizeof u, "/stream/100");
    calls = 0;
    req.on_body = never_stop;
    fetch(c, &req, &g);
    assert_int_equal(g.err, MANTA_OK);
    assert_string_equal(g.body, "hello\nbye\n");
    assert_true(calls >= 2);
    got_clear(&g);
    manta_http_get_stats(c, &st);
    assert_int_equal(st.ended_early, 1);
    manta_http_free(c);
}

/* A callback that submits the next request of a chain. */
typedef struct chain {
    manta_http_client *c;
    const char *url;
    int done;
    int ok;
} chain;

static void on_chain(const manta_http_result *r, void *arg)
{
    chain *ch = arg;
    ch->done++;
    if (r->status == 200) ch->ok++;
    if (ch->done < 3) {
        manta_http_request req;
        manta_http_request_init(&req);
        req.url = ch->url;
        assert_int_equal(manta_http_submit(ch->c, &req, on_chain, ch, NULL), 0);
    }
}

static void test_submit_from_callback(void **state)
{
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/echo");
    chain ch = {c, u, 0, 0};
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    assert_int_equal(manta_http_submit(c, &req, on_chain, &ch, NULL), 0);
    drain(c, 10000);
    assert_int_equal(ch.done, 3);
    assert_int_equal(ch.ok, 3);
    manta_http_free(c);
}

/* The client driven by an outside poll() loop. */
static void test_external_poll_loop(void **state)
{
    enum { N = 10 };
    manta_http_client *c = manta_http_new(NULL);
    char u[128];
    url(u, sizeof u, "/slow/100");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    got g[N];
    memset(g, 0, sizeof g);
    for (int i = 0; i < N; i++)
        assert_int_equal(manta_http_submit(c, &req, on_done, &g[i], NULL), 0);
    assert_true(manta_http_timeout_ms(c) >= 0); /* new transfers want an early call */
    double end = now_ms() + 10000;
    int polled_fds = 0;
    while (manta_http_in_flight(c) > 0) {
        assert_true(now_ms() < end);
        struct pollfd fds[64];
        int n = manta_http_fds(c, fds, 64);
        assert_true(n <= 64);
        if (n > polled_fds) polled_fds = n;
        int t = manta_http_timeout_ms(c);
        if (t < 0 || t > 100) t = 100;
        int rc = poll(fds, (nfds_t)n, t);
        assert_true(rc >= 0);
        for (int i = 0; i < n; i++)
            if (fds[i].revents) manta_http_on_fd(c, fds[i].fd, fds[i].revents);
        manta_http_on_fd(c, -1, 0); /* deadlines */
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(g[i].fired, 1);
        assert_int_equal(g[i].status, 200);
        got_clear(&g[i]);
    }
    assert_true(polled_fds >= 2); /* they really were in flight together */
    manta_http_free(c);
}

/* ... and by an epoll loop fed by the watch callback. */
typedef struct watcher {
    int ep;
    int added, removed, live;
    double due; /* from the timer callback; < 0: none */
    int timer_calls;
} watcher;

static void on_timer(int timeout_ms, void *arg)
{
    watcher *w = arg;
    w->timer_calls++;
    w->due = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

static void on_watch(int fd, short events, void *arg)
{
    watcher *w = arg;
    struct epoll_event ev = {0};
    ev.data.fd = fd;
    if (events & POLLIN) ev.events |= EPOLLIN;
    if (events & POLLOUT) ev.events |= EPOLLOUT;
    if (events == 0) {
        epoll_ctl(w->ep, EPOLL_CTL_DEL, fd, NULL);
        w->removed++;
        w->live--;
    } else if (epoll_ctl(w->ep, EPOLL_CTL_MOD, fd, &ev) != 0) {
        assert_int_equal(epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev), 0);
        w->added++;
        w->live++;
    }
}

static void test_external_epoll_loop(void **state)
{
    enum { N = 5 };
    manta_http_client *c = manta_http_new(NULL);
    watcher w = {epoll_create1(0), 0, 0, 0, -1, 0};
    assert_true(w.ep >= 0);
    manta_http_set_watch(c, on_watch, &w);
    manta_http_set_timer(c, on_timer, &w);
    assert_int_equal(w.timer_calls, 1); /* told at once: no deadline yet */
    assert_true(w.due < 0);
    char u[128];
    url(u, sizeof u, "/slow/50");
    manta_http_request req;
    manta_http_request_init(&req);
    req.url = u;
    req.max_retries = 0;
    got g[N];
    memset(g, 0, sizeof g);
    for (int i = 0; i < N; i++)
        assert_int_equal(manta_http_submit(c, &req, on_done, &g[i], NULL), 0);
    assert_true(w.due >= 0); /* submit asked for an early call */
    /* Only the watch and the timer callbacks say when to act: a missed
     * deadline would stall this loop for a second each time. */
    double t0 = now_ms(), end = t0 + 10000;
    while (manta_http_in_flight(c) > 0) {
        assert_true(now_ms() < end);
        struct epoll_event evs[16];
        int t = w.due < 0 ? 1000 : (int)(w.due - now_ms() + 1);
        if (t < 0) t = 0;
        int n = epoll_wait(w.ep, evs, 16, t);
        for (int i = 0; i < n; i++) {
            short re = 0;
            if (evs[i].events & EPOLLIN) re |= POLLIN;
            if (evs[i].events & EPOLLOUT) re |= POLLOUT;
            if (evs[i].events & EPOLLERR) re |= POLLERR;
            if (evs[i].events & EPOLLHUP) re |= POLLHUP;
            manta_http_on_fd(c, evs[i].data.fd, re);
        }
        if (w.due >= 0 && now_ms() >= w.due) manta_http_on_fd(c, -1, 0);
    }
    assert_true(now_ms() - t0 < 900); /* 5 overlapped requests of 50 ms */
    for (int i = 0; i < N; i++) {
        assert_int_equal(g[i].status, 200);
        got_clear(&g[i]);
    }
    assert_true(w.added >= 1);
    manta_http_free(c);
    assert_int_equal(w.live, 0); /* every watched socket was released */
    assert_int_equal(w.added, w.removed);
    close(w.ep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_with_headers),
        cmocka_unit_test(test_post_and_put_body),
        cmocka_unit_test(test_status_codes),
        cmocka_unit_test(test_retry_5xx),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_refused_with_backoff),
        cmocka_unit_test(test_dns_failure),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_hangup),
        cmocka_unit_test(test_tls_failure),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_connection_reuse),
        cmocka_unit_test(test_cancel_and_free),
        cmocka_unit_test(test_invalid_submit),
        cmocka_unit_test(test_after_timers),
        cmocka_unit_test(test_submit_from_callback),
        cmocka_unit_test(test_end_stream_early),
        cmocka_unit_test(test_external_poll_loop),
        cmocka_unit_test(test_external_epoll_loop),
    };
    return cmocka_run_group_tests_name("http", tests, group_setup, group_teardown);
}
