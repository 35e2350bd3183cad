/*
 * http.c - the runtime's asynchronous HTTP client on libcurl's multi
 * interface (see manta_http.h for the contract).
 *
 * How it works. Each request ("transfer") owns one easy handle, its copied
 * headers and body, and a growing response buffer. All easy handles of a
 * client sit in one multi handle, which owns the connection cache, so
 * keep-alive connections are reused across requests. The client is driven
 * only through curl_multi_socket_action: curl tells us which sockets it
 * wants (socket callback -> a small fd table) and when it next needs a call
 * (timer callback -> an absolute deadline). manta_http_step polls that table
 * itself; an outside event loop can poll it instead and call on_fd.
 *
 * A finished attempt is classified (curl code + HTTP status -> MANTA_E* code);
 * if the request allows a retry for that kind, the easy handle waits in the
 * client's list with a due time (exponential back-off with jitter) and is
 * re-added to the multi handle when due. Otherwise the callback fires and
 * the transfer is freed. This file is the only place that translates curl
 * errors.
 */
#include "manta_http.h"

#include <curl/curl.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

enum xfer_state { XFER_ACTIVE, XFER_BACKOFF };

typedef struct xfer {
    manta_http_client *c;
    struct xfer *prev, *next; /* the client's list of requests in flight */
    CURL *easy;
    uint64_t id;
    enum xfer_state state;
    manta_http_done_fn cb;
    void *arg;

    struct curl_slist *req_headers;
    char *body; /* copy of the request body */
    size_t body_len;
    char *method;

    char *resp; /* response body, NUL-terminated */
    size_t resp_len, resp_cap;
    size_t max_body;
    bool too_large;
    bool ended_early; /* on_body said the answer is complete */
    manta_http_body_fn on_body;
    void *on_body_arg;

    manta_http_header *hdrs; /* response headers (name and value malloc'd) */
    size_t n_hdrs, cap_hdrs;

    int attempts, max_retries;
    unsigned retry_on;
    bool timer; /* manta_http_after: no transfer, only a due time */
    long connect_timeout_ms, timeout_ms;
    int64_t submit_ms, due_ms;
    char errbuf[CURL_ERROR_SIZE];
} xfer;

typedef struct sockent {
    curl_socket_t fd;
    short events;
} sockent;

struct manta_http_client {
    CURLM *multi;
    manta_http_config cfg;
    char *user_agent;
    xfer *head; /* requests in flight, active or backing off */
    int n_inflight;
    sockent *socks;
    size_t n_socks, cap_socks;
    int64_t timer_due_ms; /* -1: curl has no deadline */
    manta_http_stats stats;
    uint64_t next_id;
    uint64_t rng;
    manta_http_watch_fn watch;
    void *watch_arg;
    manta_http_timer_fn timer;
    void *timer_arg;
    int64_t timer_told_ms; /* the deadline last given to timer, -1: none */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double now_ms_f(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* curl_global_init is not thread-safe in every libcurl build, so it runs once
 * per process. */
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void manta_http_config_init(manta_http_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->connect_timeout_ms = 5000;
    cfg->timeout_ms = 30000;
    cfg->max_body = (size_t)64 << 20;
    cfg->max_retries = 2;
    cfg->backoff_ms = 100;
    cfg->backoff_max_ms = 5000;
    cfg->user_agent = "manta/0.1";
}

void manta_http_request_init(manta_http_request *req)
{
    memset(req, 0, sizeof *req);
    req->max_retries = -1;
}

/* ---- socket table ------------------------------------------------------ */

static sockent *sock_find(manta_http_client *c, curl_socket_t fd)
{
    for (size_t i = 0; i < c->n_socks; i++)
        if (c->socks[i].fd == fd) return &c->socks[i];
    return NULL;
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    manta_http_client *c = userp;
    sockent *s = sock_find(c, fd);
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            *s = c->socks[--c->n_socks];
            if (c->watch) c->watch((int)fd, 0, c->watch_arg);
        }
        return 0;
    }
    short ev = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) ev |= POLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ev |= POLLOUT;
    if (!s) {
        if (c->n_socks == c->cap_socks) {
            size_t cap = c->cap_socks ? c->cap_socks * 2 : 16;
            sockent *n = realloc(c->socks, cap * sizeof *n);
            if (!n) return -1; /* curl fails the transfer: reported as an error */
            c->socks = n;
            c->cap_socks = cap;
        }
        s = &c->socks[c->n_socks++];
        s->fd = fd;
        s->events = 0;
    }
    if (s->events != ev) {
        s->events = ev;
        if (c->watch) c->watch((int)fd, ev, c->watch_arg);
    }
    return 0;
}

static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    manta_http_client *c = userp;
    c->timer_due_ms = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    return 0;
}

/* The earliest deadline: curl's timer or a retry's back-off; -1 if none. */
static int64_t next_due_ms(const manta_http_client *c);

/* Tells the timer callback when the next deadline moved. Called on the way
 * out of every public function that can move it. */
static void tell_timer(manta_http_client *c)
{
    if (!c->timer) return;
    int64_t due = next_due_ms(c);
    if (due == c->timer_told_ms) return;
    c->timer_told_ms = due;
    int64_t d = due < 0 ? -1 : due - now_ms();
    if (due >= 0 && d < 0) d = 0;
    if (d > 1000000000) d = 1000000000;
    c->timer((int)d, c->timer_arg);
}

/* ---- client ------------------------------------------------------------ */

manta_http_client *manta_http_new(const manta_http_config *cfg)
{
    manta_http_config def;
    if (!cfg) {
        manta_http_config_init(&def);
        cfg = &def;
    }
    if (cfg->connect_timeout_ms < 0 || cfg->timeout_ms < 0 || cfg->max_body == 0 ||
        cfg->max_retries < 0 || cfg->backoff_ms < 0 || cfg->backoff_max_ms < 0)
        return NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) return NULL;

    manta_http_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cfg = *cfg;
    c->user_agent = strdup(cfg->user_agent ? cfg->user_agent : "manta/0.1");
    c->multi = curl_multi_init();
    if (!c->user_agent || !c->multi) {
        if (c->multi) curl_multi_cleanup(c->multi);
        free(c->user_agent);
        free(c);
        return NULL;
    }
    c->cfg.user_agent = c->user_agent;
    c->timer_due_ms = -1;
    c->timer_told_ms = -1;
    c->next_id = 1;
    c->rng = ((uint64_t)now_ms() << 20) ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)c;
    if (c->rng == 0) c->rng = 0x9e3779b97f4a7c15ull;
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    if (cfg->max_connections > 0)
        curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, cfg->max_connections);
    if (cfg->max_host_connections > 0)
        curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, cfg->max_host_connections);
    return c;
}

/* ---- transfers --------------------------------------------------------- */

static void xfer_reset_response(xfer *x)
{
    x->resp_len = 0;
    if (x->resp) x->resp[0] = '\0';
    x->too_large = false;
    x->ended_early = false;
    for (size_t i = 0; i < x->n_hdrs; i++) {
        free((char *)x->hdrs[i].name);
        free((char *)x->hdrs[i].value);
    }
    x->n_hdrs = 0;
    x->errbuf[0] = '\0';
}

static void xfer_free(xfer *x)
{
    if (!x) return;
    xfer_reset_response(x);
    if (x->easy) curl_easy_cleanup(x->easy);
    curl_slist_free_all(x->req_headers);
    free(x->hdrs);
    free(x->resp);
    free(x->body);
    free(x->method);
    free(x);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userp)
{
    xfer *x = userp;
    size_t n = size * nmemb;
    if (n > x->max_body - x->resp_len) {
        /* An error, not a truncation: returning short makes curl fail the
         * transfer with CURLE_WRITE_ERROR, which we report as EMSGSIZE. */
        x->too_large = true;
        return 0;
    }
    if (x->resp_len + n + 1 > x->resp_cap) {
        size_t cap = x->resp_cap ? x->resp_cap : 4096;
        while (cap < x->resp_len + n + 1) cap *= 2;
        char *r = realloc(x->resp, cap);
        if (!r) return 0;
        x->resp = r;
        x->resp_cap = cap;
    }
    memcpy(x->resp + x->resp_len, ptr, n);
    x->resp_len += n;
    x->resp[x->resp_len] = '\0';
    if (x->on_body) {
        const char *ct = NULL;
        for (size_t i = 0; i < x->n_hdrs; i++)
            if (strcasecmp(x->hdrs[i].name, "Content-Type") == 0) ct = x->hdrs[i].value;
        if (x->on_body(ct, x->resp, x->resp_len, x->on_body_arg)) {
            /* Returning short aborts the transfer; xfer_done sees the flag
             * and reports what arrived as a success. */
            x->ended_early = true;
            return 0;
        }
    }
    return n;
}

static char *dup_trim(const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '\t')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) n--;
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userp)
{
    xfer *x = userp;
    size_t n = size * nmemb;
    /* A status line starts a new response (after 100 Continue, or an
     * informational answer): keep only the headers of the final one. */
    if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) {
        for (size_t i = 0; i < x->n_hdrs; i++) {
            free((char *)x->hdrs[i].name);
            free((char *)x->hdrs[i].value);
        }
        x->n_hdrs = 0;
        return n;
    }
    const char *colon = memchr(ptr, ':', n);
    if (!colon) return n; /* the blank line that ends the headers */
    if (x->n_hdrs == x->cap_hdrs) {
        size_t cap = x->cap_hdrs ? x->cap_hdrs * 2 : 16;
        manta_http_header *h = realloc(x->hdrs, cap * sizeof *h);
        if (!h) return 0;
        x->hdrs = h;
        x->cap_hdrs = cap;
    }
    char *name = dup_trim(ptr, (size_t)(colon - ptr));
    char *value = dup_trim(colon + 1, n - (size_t)(colon - ptr) - 1);
    if (!name || !value) {
        free(name);
        free(value);
        return 0;
    }
    x->hdrs[x->n_hdrs].name = name;
    x->hdrs[x->n_hdrs].value = value;
    x->n_hdrs++;
    return n;
}

static bool method_idempotent(const char *m)
{
    static const char *const ok[] = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcasecmp(m, ok[i]) == 0) return true;
    return false;
}

static void list_link(manta_http_client *c, xfer *x)
{
    x->prev = NULL;
    x->next = c->head;
    if (c->head) c->head->prev = x;
    c->head = x;
    c->n_inflight++;
}

static void list_unlink(manta_http_client *c, xfer *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        c->head = x->next;
    if (x->next) x->next->prev = x->prev;
    x->prev = x->next = NULL;
    c->n_inflight--;
}

/* Sets every easy option of x; returns false when curl refuses one. */
static bool xfer_setup(xfer *x, const char *url)
{
    manta_http_client *c = x->c;
    CURL *e = x->easy;
    bool ok = true;
    ok &= curl_easy_setopt(e, CURLOPT_URL, url) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_PRIVATE, x) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_WRITEDATA, x) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_HEADERDATA, x) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_USERAGENT, c->user_agent) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, x->connect_timeout_ms) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, x->timeout_ms) == CURLE_OK;
    /* Reject a declared Content-Length over the limit before reading it; a
     * chunked body is caught in on_body. */
    ok &= curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->max_body) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "") == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->req_headers) == CURLE_OK;
    if (strcmp(x->method, "GET") == 0 && !x->body) {
        ok &= curl_easy_setopt(e, CURLOPT_HTTPGET, 1L) == CURLE_OK;
    } else if (strcmp(x->method, "HEAD") == 0) {
        ok &= curl_easy_setopt(e, CURLOPT_NOBODY, 1L) == CURLE_OK;
    } else {
        if (x->body || strcmp(x->method, "POST") == 0) {
            ok &= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body_len) ==
                  CURLE_OK;
            ok &= curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body ? x->body : "") == CURLE_OK;
        }
        if (strcmp(x->method, "POST") != 0)
            ok &= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, x->method) == CURLE_OK;
    }
    return ok;
}

static int xfer_start(xfer *x)
{
    x->state = XFER_ACTIVE;
    x->attempts++;
    x->c->stats.attempts++;
    return curl_multi_add_handle(x->c->multi, x->easy) == CURLM_OK ? 0 : -1;
}

int manta_http_submit(manta_http_client *c, const manta_http_request *req, manta_http_done_fn cb,
                      void *arg, uint64_t *id)
{
    if (!c || !req || !req->url || !cb) return MANTA_EINVAL;
    for (size_t i = 0; i < req->n_headers; i++)
        if (!req->headers || !req->headers[i] || !strchr(req->headers[i], ':')) return MANTA_EINVAL;

    xfer *x = calloc(1, sizeof *x);
    if (!x) return MANTA_ENOMEM;
    x->c = c;
    x->cb = cb;
    x->arg = arg;
    const char *m = req->method ? req->method : (req->body ? "POST" : "GET");
    x->method = strdup(m);
    x->easy = curl_easy_init();
    if (!x->method || !x->easy) goto nomem;
    for (char *p = x->method; *p; p++)
        if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
    if (req->body) {
        x->body = malloc(req->body_len ? req->body_len : 1);
        if (!x->body) goto nomem;
        memcpy(x->body, req->body, req->body_len);
        x->body_len = req->body_len;
    }
    for (size_t i = 0; i < req->n_headers; i++) {
        struct curl_slist *l = curl_slist_append(x->req_headers, req->headers[i]);
        if (!l) goto nomem;
        x->req_headers = l;
    }
    if (x->body) {
        /* curl waits up to a second for "100 Continue" on bodies over 1 KiB;
         * small JSON-RPC servers never send it, so do not ask. */
        struct curl_slist *l = curl_slist_append(x->req_headers, "Expect:");
        if (!l) goto nomem;
        x->req_headers = l;
    }
    x->connect_timeout_ms =
        req->connect_timeout_ms > 0 ? req->connect_timeout_ms : c->cfg.connect_timeout_ms;
    x->timeout_ms = req->timeout_ms > 0 ? req->timeout_ms : c->cfg.timeout_ms;
    x->max_body = req->max_body ? req->max_body : c->cfg.max_body;
    if (req->max_retries >= 0)
        x->max_retries = req->max_retries;
    else
        x->max_retries = method_idempotent(x->method) ? c->cfg.max_retries : 0;
    x->retry_on = req->retry_on ? req->retry_on : (MANTA_HTTP_RETRY_CONNECT | MANTA_HTTP_RETRY_5XX);
    x->on_body = req->on_body;
    x->on_body_arg = req->on_body_arg;
    if (!xfer_setup(x, req->url)) {
        xfer_free(x);
        return MANTA_EINVAL;
    }
    x->id = c->next_id++;
    x->submit_ms = now_ms();
    if (xfer_start(x) != 0) goto nomem;
    list_link(c, x);
    c->stats.submitted++;
    if (id) *id = x->id;
    tell_timer(c);
    return 0;
nomem:
    xfer_free(x);
    return MANTA_ENOMEM;
}

int manta_http_after(manta_http_client *c, long delay_ms, manta_http_done_fn cb, void *arg,
                     uint64_t *id)
{
    if (!c || !cb || delay_ms < 0) return MANTA_EINVAL;
    xfer *x = calloc(1, sizeof *x);
    if (!x) return MANTA_ENOMEM;
    x->c = c;
    x->cb = cb;
    x->arg = arg;
    x->timer = true;
    x->method = strdup("TIMER");
    if (!x->method) {
        free(x);
        return MANTA_ENOMEM;
    }
    x->id = c->next_id++;
    x->submit_ms = now_ms();
    x->state = XFER_BACKOFF;
    x->due_ms = x->submit_ms + delay_ms;
    list_link(c, x);
    if (id) *id = x->id;
    tell_timer(c);
    return 0;
}

/* Fires x's callback with the given outcome, then frees x. x must already be
 * out of the multi handle and out of the list. */
static void xfer_finish(xfer *x, int err, long status, const char *message)
{
    manta_http_client *c = x->c;
    manta_http_result r;
    memset(&r, 0, sizeof r);
    r.id = x->id;
    r.err = err;
    r.status = err == MANTA_OK ? status : 0;
    r.message = message ? message : "";
    r.body = x->resp && err == MANTA_OK ? x->resp : "";
    r.body_len = err == MANTA_OK ? x->resp_len : 0;
    r.headers = x->hdrs;
    r.n_headers = err == MANTA_OK ? x->n_hdrs : 0;
    r.content_type = err == MANTA_OK ? manta_http_header_get(&r, "Content-Type") : NULL;
    r.attempts = x->attempts;
    r.elapsed_ms = now_ms_f() - (double)x->submit_ms;
    if (r.elapsed_ms < 0) r.elapsed_ms = 0;

    if (x->timer) { /* not a request: no counters */
        x->cb(&r, x->arg);
        xfer_free(x);
        return;
    }
    c->stats.completed++;
    if (err == MANTA_OK) {
        c->stats.ok++;
        c->stats.bytes_received += x->resp_len;
        if (status >= 200 && status < 300)
            c->stats.status_2xx++;
        else if (status >= 300 && status < 400)
            c->stats.status_3xx++;
        else if (status >= 400 && status < 500)
            c->stats.status_4xx++;
        else if (status >= 500)
            c->stats.status_5xx++;
    } else {
        c->stats.errors[manta_err_index(err)]++;
    }
    x->cb(&r, x->arg);
    xfer_free(x);
}

static uint64_t rng_next(manta_http_client *c)
{
    /* xorshift64: jitter only, not for anything that must be unpredictable. */
    uint64_t v = c->rng;
    v ^= v << 13;
    v ^= v >> 7;
    v ^= v << 17;
    c->rng = v;
    return v;
}

static long backoff_for(manta_http_client *c, int retry)
{
    long d = c->cfg.backoff_ms;
    for (int i = 1; i < retry && d < c->cfg.backoff_max_ms; i++) d *= 2;
    if (d > c->cfg.backoff_max_ms) d = c->cfg.backoff_max_ms;
    /* Jitter in [d/2, d] so many clients that failed together spread out. */
    if (d > 1) d = d / 2 + (long)(rng_next(c) % (uint64_t)(d - d / 2 + 1));
    return d;
}

/* The error code of a finished attempt of x, and in *kind the retry
 * condition it falls under (0: none). A timeout before any connection is
 * a connect timeout. */
static int classify(const xfer *x, CURLcode code, long status, unsigned *kind)
{
    *kind = 0;
    switch (code) {
    case CURLE_OK:
        if (status >= 500 && status <= 504 && status != 501) *kind = MANTA_HTTP_RETRY_5XX;
        return MANTA_OK;
    case CURLE_OPERATION_TIMEDOUT: {
        curl_off_t connect_us = 0;
        curl_easy_getinfo(x->easy, CURLINFO_CONNECT_TIME_T, &connect_us);
        *kind = connect_us == 0 ? MANTA_HTTP_RETRY_CONNECT : MANTA_HTTP_RETRY_TIMEOUT;
        return MANTA_ETIMEDOUT;
    }
    case CURLE_COULDNT_CONNECT:
        *kind = MANTA_HTTP_RETRY_CONNECT;
        return MANTA_ECONNECT;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        *kind = MANTA_HTTP_RETRY_CONNECT;
        return MANTA_ERESOLVE;
    case CURLE_FILESIZE_EXCEEDED:
        return MANTA_EMSGSIZE;
    case CURLE_WRITE_ERROR:
        return x->too_large ? MANTA_EMSGSIZE : MANTA_ENOMEM;
    case CURLE_OUT_OF_MEMORY:
        return MANTA_ENOMEM;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_BAD_CONTENT_ENCODING:
        return MANTA_ETRANSFER;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_USE_SSL_FAILED:
        return MANTA_ETLS;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return MANTA_EINVAL;
    default: /* anything else libcurl reports: its own text names it */
        return MANTA_ETRANSFER;
    }
}

/* The message of a failed attempt ("" for none): method, URL and cause. */
static void outcome_message(const xfer *x, CURLcode code, int err, unsigned kind, char *msg,
                            size_t cap)
{
    const char *url = NULL;
    curl_easy_getinfo(x->easy, CURLINFO_EFFECTIVE_URL, &url);
    if (!url) url = "?";
    msg[0] = '\0';
    if (err == MANTA_OK) return;
    if (err == MANTA_ETIMEDOUT && kind == MANTA_HTTP_RETRY_CONNECT)
        snprintf(msg, cap, "%s %s: connect timed out after %ld ms", x->method, url,
                 x->connect_timeout_ms);
    else if (err == MANTA_ETIMEDOUT)
        snprintf(msg, cap, "%s %s: no complete answer within %ld ms", x->method, url,
                 x->timeout_ms);
    else if (err == MANTA_EMSGSIZE)
        snprintf(msg, cap, "%s %s: response body over the %zu-byte limit", x->method, url,
                 x->max_body);
    else
        snprintf(msg, cap, "%s %s: %s (%s)", x->method, url, manta_strerror(err),
                 x->errbuf[0] ? x->errbuf : curl_easy_strerror(code));
}

/* Classifies a finished attempt of x (already removed from the multi
 * handle), then retries it or finishes it. */
static void xfer_done(xfer *x, CURLcode code)
{
    manta_http_client *c = x->c;
    long status = 0;
    long conn_n = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    if (curl_easy_getinfo(x->easy, CURLINFO_NUM_CONNECTS, &conn_n) == CURLE_OK && conn_n > 0)
        c->stats.connects += (uint64_t)conn_n;
    if (code == CURLE_WRITE_ERROR && x->ended_early) {
        code = CURLE_OK;
        c->stats.ended_early++;
    }
    unsigned kind;
    int err = classify(x, code, status, &kind);
    char msg[CURL_ERROR_SIZE + 256];
    outcome_message(x, code, err, kind, msg, sizeof msg);

    if (kind && (x->retry_on & kind) && x->attempts <= x->max_retries) {
        c->stats.retries++;
        xfer_reset_response(x);
        x->state = XFER_BACKOFF;
        x->due_ms = now_ms() + backoff_for(c, x->attempts);
        return;
    }
    list_unlink(c, x);
    xfer_finish(x, err, status, msg);
}

/* Re-adds transfers whose back-off has ended and fires due timers. A
 * callback may submit or cancel requests, so the list is walked again from
 * the head after each one; each pass takes one entry out of BACKOFF, so
 * this ends. */
static void start_due_retries(manta_http_client *c)
{
    int64_t t = now_ms();
    for (xfer *x = c->head; x;) {
        if (x->state != XFER_BACKOFF || x->due_ms > t) {
            x = x->next;
            continue;
        }
        if (x->timer) {
            list_unlink(c, x);
            xfer_finish(x, MANTA_OK, 0, "");
            x = c->head;
        } else if (xfer_start(x) != 0) {
            /* Only possible when out of memory: end it rather than spin. */
            list_unlink(c, x);
            xfer_finish(x, MANTA_ENOMEM, 0, "could not restart the request: out of memory");
            x = c->head;
        } else {
            x = x->next;
        }
    }
}

/* Fires callbacks for finished attempts, one message at a time: a callback
 * may cancel another transfer, which also drops that transfer's message. */
static void harvest(manta_http_client *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *e = m->easy_handle;
        CURLcode code = m->data.result;
        xfer *x = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
        curl_multi_remove_handle(c->multi, e);
        if (x) xfer_done(x, code);
    }
}

static void run_timers(manta_http_client *c)
{
    int running;
    /* Bounded: each round either finds nothing due or makes progress. */
    for (int round = 0; round < 8; round++) {
        bool acted = false;
        if (c->timer_due_ms >= 0 && c->timer_due_ms <= now_ms()) {
            c->timer_due_ms = -1; /* the timer callback may set a new one */
            curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
            acted = true;
        }
        harvest(c);
        int64_t t = now_ms();
        for (xfer *x = c->head; x; x = x->next)
            if (x->state == XFER_BACKOFF && x->due_ms <= t) {
                start_due_retries(c);
                acted = true;
                break;
            }
        if (!acted) break;
    }
}

int manta_http_on_fd(manta_http_client *c, int fd, short revents)
{
    if (fd >= 0 && revents) {
        int flags = 0, running;
        if (revents & POLLIN) flags |= CURL_CSELECT_IN;
        if (revents & POLLOUT) flags |= CURL_CSELECT_OUT;
        if (revents & (POLLERR | POLLHUP | POLLNVAL)) flags |= CURL_CSELECT_ERR;
        curl_multi_socket_action(c->multi, (curl_socket_t)fd, flags, &running);
        harvest(c);
    }
    run_timers(c);
    tell_timer(c);
    return c->n_inflight;
}

static int64_t next_due_ms(const manta_http_client *c)
{
    int64_t due = c->timer_due_ms;
    for (const xfer *x = c->head; x; x = x->next)
        if (x->state == XFER_BACKOFF && (due < 0 || x->due_ms < due)) due = x->due_ms;
    return due;
}

int manta_http_timeout_ms(const manta_http_client *c)
{
    int64_t due = next_due_ms(c);
    if (due < 0) return -1;
    int64_t d = due - now_ms();
    if (d < 0) return 0;
    if (d > 1000000000) return 1000000000;
    return (int)d;
}

int manta_http_fds(const manta_http_client *c, struct pollfd *fds, int max)
{
    int n = 0;
    for (size_t i = 0; i < c->n_socks; i++, n++) {
        if (n < max) {
            fds[n].fd = (int)c->socks[i].fd;
            fds[n].events = c->socks[i].events;
            fds[n].revents = 0;
        }
    }
    return n;
}

int manta_http_step(manta_http_client *c, int timeout_ms)
{
    if (timeout_ms < 0) timeout_ms = 0;
    int64_t deadline = now_ms() + timeout_ms;
    struct pollfd stack[64];
    struct pollfd *pfd = stack;
    int cap = 64;
    for (;;) {
        /* Do what is already due first (a new request asks for an immediate
         * timeout call to start connecting). */
        uint64_t done_before = c->stats.completed;
        run_timers(c);
        if (c->stats.completed != done_before || c->n_inflight == 0) break;

        int n = manta_http_fds(c, pfd, cap);
        if (n > cap) {
            struct pollfd *bigger = malloc((size_t)n * sizeof *bigger);
            if (bigger) {
                if (pfd != stack) free(pfd);
                pfd = bigger;
                cap = n;
                n = manta_http_fds(c, pfd, cap);
            } else {
                n = cap; /* poll what fits; the rest waits for the next round */
            }
        }
        int64_t left = deadline - now_ms();
        if (left < 0) left = 0;
        int wait = manta_http_timeout_ms(c);
        if (wait < 0 || wait > left) wait = (int)left;
        int rc = poll(pfd, (nfds_t)n, wait);
        if (rc < 0 && errno != EINTR) break;
        for (int i = 0; rc > 0 && i < n; i++) {
            if (!pfd[i].revents) continue;
            int flags = 0, running;
            if (pfd[i].revents & POLLIN) flags |= CURL_CSELECT_IN;
            if (pfd[i].revents & POLLOUT) flags |= CURL_CSELECT_OUT;
            if (pfd[i].revents & (POLLERR | POLLHUP | POLLNVAL)) flags |= CURL_CSELECT_ERR;
            curl_multi_socket_action(c->multi, (curl_socket_t)pfd[i].fd, flags, &running);
        }
        harvest(c);
        run_timers(c);
        if (c->stats.completed != done_before || c->n_inflight == 0) break;
        if (now_ms() >= deadline) break;
    }
    if (pfd != stack) free(pfd);
    tell_timer(c);
    return c->n_inflight;
}

int manta_http_in_flight(const manta_http_client *c)
{
    return c ? c->n_inflight : 0;
}

static void xfer_abort(manta_http_client *c, xfer *x, int err, const char *why)
{
    if (x->state == XFER_ACTIVE) curl_multi_remove_handle(c->multi, x->easy);
    list_unlink(c, x);
    char msg[256];
    snprintf(msg, sizeof msg, "request %llu: %s", (unsigned long long)x->id, why);
    xfer_finish(x, err, 0, msg);
}

int manta_http_cancel(manta_http_client *c, uint64_t id)
{
    if (!c) return MANTA_EINVAL;
    for (xfer *x = c->head; x; x = x->next) {
        if (x->id != id) continue;
        xfer_abort(c, x, MANTA_ECANCELED, "canceled by the caller");
        tell_timer(c);
        return 0;
    }
    return MANTA_EINVAL;
}

void manta_http_free(manta_http_client *c)
{
    if (!c) return;
    /* A callback may submit more requests; end those too. */
    while (c->head) xfer_abort(c, c->head, MANTA_ECLOSED, "the HTTP client was closed");
    curl_multi_cleanup(c->multi);
    free(c->socks);
    free(c->user_agent);
    free(c);
}

void manta_http_set_watch(manta_http_client *c, manta_http_watch_fn fn, void *arg)
{
    c->watch = fn;
    c->watch_arg = arg;
    if (fn)
        for (size_t i = 0; i < c->n_socks; i++) fn((int)c->socks[i].fd, c->socks[i].events, arg);
}

void manta_http_set_timer(manta_http_client *c, manta_http_timer_fn fn, void *arg)
{
    c->timer = fn;
    c->timer_arg = arg;
    c->timer_told_ms = -2; /* differs from any deadline: tell it now */
    tell_timer(c);
}

void manta_http_get_stats(const manta_http_client *c, manta_http_stats *out)
{
    *out = c->stats;
}

const char *manta_http_header_get(const manta_http_result *res, const char *name)
{
    const char *v = NULL;
    for (size_t i = 0; i < res->n_headers; i++)
        if (strcasecmp(res->headers[i].name, name) == 0) v = res->headers[i].value;
    return v;
}
