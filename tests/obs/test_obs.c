/*
 * test_obs.c -- observability without Python: an actor's metrics (the
 * table, its record in Redis, parsing it back), the Prometheus text
 * exposition checked line by line against the format's rules, the HTTP
 * endpoint (200, 404, 405, 431, many connections), the dashboard's pages,
 * JSON documents, token and paths, the progress line, and the report's SVG
 * files checked as XML-shaped text.
 *
 * This program is also its actors: the node agent starts it again with
 * MANTA_ROLE set, and main() hands over to manta_init() at once.
 */
#include "cli_internal.h"
#include "manta_schema.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static test_redis redis;

/* ---- the test actor: counts what it is asked to ---- */

static int w_work(manta_req *req, void *state, const void *arg, size_t len)
{
    (void)state;
    manta_ctx *m = manta_req_ctx(req);
    char kind[32];
    snprintf(kind, sizeof kind, "%.*s", (int)(len < 31 ? len : 31), (const char *)arg);
    manta_metric_add(m, "widgets_total", kind, 2);
    manta_metric_set(m, "queue_len", NULL, 7);
    manta_metric_observe(m, "work_seconds", NULL, 0.003);
    return manta_reply(req, "ok", 2);
}

static const manta_method w_methods[] = {{"work", w_work}, {NULL, NULL}};
static const manta_class worker = {"worker", 0, NULL, NULL, w_methods};
static const manta_class *const classes[] = {&worker, NULL};

static int job_no;

static manta_ctx *start(void)
{
    char job[48];
    snprintf(job, sizeof job, "obs%d-%d", (int)getpid(), ++job_no);
    manta_options o = {.redis_url = redis.url, .job = job, .classes = classes};
    manta_ctx *m = NULL;
    int rc = manta_init(&m, &o);
    if (rc) fprintf(stderr, "manta_init: %s\n", manta_last_error());
    assert_int_equal(rc, 0);
    return m;
}

/* ---- the table and its record ---- */

static void test_table_and_record(void **unused)
{
    (void)unused;
    manta_ctx *m = start();
    assert_int_equal(manta_metric_add(m, "tokens_total", NULL, 5), 0);
    assert_int_equal(manta_metric_add(m, "tokens_total", NULL, 2.5), 0);
    assert_int_equal(manta_metric_add(m, "errors_total", "ETIMEDOUT", 1), 0);
    assert_int_equal(manta_metric_set(m, "depth", NULL, -3), 0);
    for (int i = 0; i < 100; i++) manta_metric_observe(m, "lat_seconds", "x", i < 90 ? 0.002 : 3);
    /* refusals name the reason */
    assert_int_equal(manta_metric_add(m, "Bad-Name", NULL, 1), MANTA_EINVAL);
    assert_int_equal(manta_metric_add(m, "9lives", NULL, 1), MANTA_EINVAL);
    assert_int_equal(manta_metric_add(m, "ok", "has space", 1), MANTA_EINVAL);
    assert_int_equal(manta_metric_add(m, "tokens_total", NULL, -1), MANTA_EINVAL);
    assert_int_equal(manta_metric_set(m, "tokens_total", NULL, 1), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "already a counter"));
    assert_int_equal(manta_metric_observe(m, "lat_seconds", "x", NAN), MANTA_EINVAL);
    char name[32];
    int rc = 0;
    for (int i = 0; i < 300 && rc == 0; i++) {
        snprintf(name, sizeof name, "many_%d", i);
        rc = manta_metric_add(m, name, NULL, 1);
    }
    assert_int_equal(rc, MANTA_EBUSY);

    char *txt;
    size_t len;
    assert_int_equal(manta_metrics_record(m, &txt, &len), 0);
    manta_metrics l;
    assert_int_equal(manta_metrics_parse(txt, len, &l), 0);
    free(txt);
    const manta_metric *s = manta_metrics_find(&l, "tokens_total", NULL);
    assert_non_null(s);
    assert_int_equal(s->type, MANTA_METRIC_COUNTER);
    assert_true(s->value == 7.5);
    s = manta_metrics_find(&l, "errors_total", "ETIMEDOUT");
    assert_non_null(s);
    assert_true(s->value == 1);
    s = manta_metrics_find(&l, "depth", NULL);
    assert_int_equal(s->type, MANTA_METRIC_GAUGE);
    assert_true(s->value == -3);
    s = manta_metrics_find(&l, "lat_seconds", "x");
    assert_int_equal(s->type, MANTA_METRIC_HISTOGRAM);
    assert_int_equal(s->count, 100);
    assert_true(fabs(s->value - (90 * 0.002 + 10 * 3)) < 1e-9);
    assert_true(manta_metric_quantile(s, 0.5) == 0.0025); /* the bucket holding 2 ms */
    assert_true(manta_metric_quantile(s, 0.99) == 5);     /* 3 s: in (2.5, 5] */
    assert_non_null(manta_metrics_find(&l, "calls_served_total", NULL)); /* the runtime's own */
    assert_non_null(manta_metrics_find(&l, "mailbox_depth", NULL));
    manta_metrics_free(&l);
    /* a record that is not one */
    assert_int_equal(manta_metrics_parse("c ok - 1\nx y\n", 14, &l), MANTA_EPROTO);
    assert_non_null(strstr(manta_last_error(), "line 2"));
    assert_int_equal(manta_metrics_parse("h lat - 1 2 3\n", 14, &l), MANTA_EPROTO);
    manta_shutdown(m);
}

/* ---- the Prometheus text format, checked by its rules ---- */

static int metric_name_ok(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':')) return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':')) return 0;
    return 1;
}

typedef struct family {
    char name[128], type[16];
    int samples, closed;
} family;

/* The family a sample name belongs to: the name itself, or for a
 * histogram the name without _bucket/_sum/_count. */
static family *owner(family *f, int nf, const char *sample)
{
    for (int i = 0; i < nf; i++) {
        size_t n = strlen(f[i].name);
        if (!strcmp(sample, f[i].name)) return &f[i];
        if (!strcmp(f[i].type, "histogram") && !strncmp(sample, f[i].name, n) &&
            (!strcmp(sample + n, "_bucket") || !strcmp(sample + n, "_sum") ||
             !strcmp(sample + n, "_count")))
            return &f[i];
    }
    return NULL;
}

/* Check the exposition; returns the number of problems (each printed). On
 * success *n_samples holds the sample lines. Rules: # HELP and # TYPE name
 * a valid metric name, TYPE once per family and before its samples, a
 * family's samples together, labels name="escaped value" separated by
 * commas, a value that parses as a float (or +Inf, -Inf, NaN), histogram
 * buckets cumulative with le="+Inf" last and equal to _count. */
static int check_exposition(const char *txt, int *n_samples)
{
    int bad = 0, nf = 0, lineno = 0;
    family *fam = calloc(512, sizeof *fam);
    family *cur = NULL;
    double last_bucket = -1;
    *n_samples = 0;
    const char *p = txt;
    while (*p) {
        const char *nl = strchr(p, '\n');
        if (!nl) {
            printf("exposition: the last line has no newline\n");
            bad++;
            break;
        }
        char line[4096];
        size_t n = (size_t)(nl - p);
        assert_true(n < sizeof line);
        memcpy(line, p, n), line[n] = 0;
        p = nl + 1;
        lineno++;
        if (line[0] == '#') {
            char kw[8], name[128], rest[256] = "";
            if (sscanf(line, "# %7s %127s %255[^\n]", kw, name, rest) < 2 ||
                !metric_name_ok(name, strlen(name))) {
                printf("exposition line %d: bad comment: %s\n", lineno, line);
                bad++;
                continue;
            }
            if (!strcmp(kw, "TYPE")) {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram")) {
                    printf("exposition line %d: bad type %s\n", lineno, rest);
                    bad++;
                }
                for (int i = 0; i < nf; i++)
                    if (!strcmp(fam[i].name, name)) {
                        printf("exposition line %d: second TYPE for %s\n", lineno, name);
                        bad++;
                    }
                if (cur) cur->closed = 1;
                cur = &fam[nf++];
                snprintf(cur->name, sizeof cur->name, "%s", name);
                snprintf(cur->type, sizeof cur->type, "%s", rest);
            }
            continue;
        }
        /* a sample: name{labels} value */
        size_t nn = strcspn(line, "{ ");
        char sname[128];
        snprintf(sname, sizeof sname, "%.*s", (int)nn, line);
        if (!metric_name_ok(sname, nn)) {
            printf("exposition line %d: bad metric name: %s\n", lineno, line);
            bad++;
            continue;
        }
        family *f = owner(fam, nf, sname);
        if (!f || f->closed || f != cur) {
            printf("exposition line %d: sample %s outside its family's block\n", lineno, sname);
            bad++;
            continue;
        }
        const char *q = line + nn;
        char le[32] = "";
        if (*q == '{') {
            q++;
            while (*q != '}') {
                size_t ln = strcspn(q, "=");
                char lname[64];
                snprintf(lname, sizeof lname, "%.*s", (int)ln, q);
                if (!metric_name_ok(lname, ln) || q[ln] != '=' || q[ln + 1] != '"') {
                    printf("exposition line %d: bad label at %s\n", lineno, q);
                    bad++;
                    break;
                }
                q += ln + 2;
                char val[256];
                size_t vn = 0;
                while (*q && *q != '"') {
                    if (*q == '\\') {
                        if (q[1] != '\\' && q[1] != '"' && q[1] != 'n') {
                            printf("exposition line %d: bad escape\n", lineno);
                            bad++;
                        }
                        q++;
                    }
                    if (vn < sizeof val - 1) val[vn++] = *q;
                    q++;
                }
                val[vn] = 0;
                if (*q != '"') {
                    printf("exposition line %d: unterminated label value\n", lineno);
                    bad++;
                    break;
                }
                q++;
                if (!strcmp(lname, "le")) snprintf(le, sizeof le, "%s", val);
                if (*q == ',')
                    q++;
                else if (*q != '}') {
                    printf("exposition line %d: expected , or } at %s\n", lineno, q);
                    bad++;
                    break;
                }
            }
            if (*q != '}') continue;
            q++;
        }
        if (*q != ' ') {
            printf("exposition line %d: no space before the value\n", lineno);
            bad++;
            continue;
        }
        q++;
        char *end;
        double v = strtod(q, &end);
        if (!strcmp(q, "+Inf") || !strcmp(q, "-Inf") || !strcmp(q, "NaN"))
            end = (char *)q + strlen(q);
        if (end == q || *end) {
            printf("exposition line %d: bad value '%s'\n", lineno, q);
            bad++;
            continue;
        }
        (*n_samples)++;
        f->samples++;
        size_t fl = strlen(f->name);
        if (!strcmp(sname + fl, "_bucket")) {
            if (!le[0]) {
                printf("exposition line %d: a bucket without le\n", lineno);
                bad++;
            }
            if (v < last_bucket) {
                printf("exposition line %d: buckets not cumulative\n", lineno);
                bad++;
            }
            last_bucket = !strcmp(le, "+Inf") ? -1 : v;
            if (!strcmp(le, "+Inf")) last_bucket = -(v + 1); /* remember the total */
        } else if (!strcmp(sname + fl, "_count")) {
            if (last_bucket > -0.5 || -(last_bucket + 1) != v) {
                printf("exposition line %d: _count %g is not the +Inf bucket\n", lineno, v);
                bad++;
            }
            last_bucket = -1;
        }
    }
    for (int i = 0; i < nf; i++)
        if (!fam[i].samples) {
            printf("exposition: family %s has no sample\n", fam[i].name);
            bad++;
        }
    free(fam);
    return bad;
}

static void test_check_exposition_rejects(void **unused)
{
    (void)unused;
    int n;
    /* the checker itself: what it must refuse */
    assert_int_equal(check_exposition("# TYPE a counter\na 1\n", &n), 0);
    assert_int_equal(n, 1);
    assert_true(check_exposition("a 1\n", &n) > 0);                          /* no TYPE */
    assert_true(check_exposition("# TYPE a counter\na{x=\"1} 1\n", &n) > 0); /* unterminated */
    assert_true(check_exposition("# TYPE a counter\na one\n", &n) > 0);      /* value */
    assert_true(check_exposition("# TYPE a gauge\n# TYPE b gauge\nb 1\na 1\n", &n) > 0);
    assert_true(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 3\n"
                                 "h_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n",
                                 &n) > 0);
}

/* A worker actor called a few times: the exposition has its series. */
static manta_ctx *job_with_worker(void)
{
    manta_ctx *m = start();
    manta_actor *a;
    assert_int_equal(
        manta_actor_create(m, &(manta_actor_options){.cls = "worker", .name = "w-0"}, &a), 0);
    for (int i = 0; i < 5; i++) {
        manta_future *f = manta_call(m, a, "work", i % 2 ? "odd:x/1" : "even", i % 2 ? 7 : 4);
        assert_int_equal(manta_get(f, 10000, NULL, NULL), 0);
        manta_future_free(f);
    }
    /* the record comes with the next heartbeat (once a second) */
    manta_metrics l = {0};
    for (int t = 0; t < 60; t++) {
        manta_poll(m, 100);
        manta_metrics_free(&l);
        if (manta_reg_metrics_read(m, "w-0", &l) == 0 && manta_metrics_find(&l, "queue_len", NULL))
            break;
    }
    const manta_metric *s = manta_metrics_find(&l, "widgets_total", "even");
    assert_non_null(s);
    assert_true(s->value == 6);
    s = manta_metrics_find(&l, "calls_served_total", NULL);
    assert_non_null(s);
    assert_true(s->value >= 5);
    manta_metrics_free(&l);
    return m;
}

static void test_exposition(void **unused)
{
    (void)unused;
    manta_ctx *m = job_with_worker();
    cli_buf b = {0};
    assert_int_equal(cli_prom_render(m, &b), 0);
    int n;
    int bad = check_exposition(b.p, &n);
    if (bad) printf("%s", b.p);
    assert_int_equal(bad, 0);
    assert_true(n > 20);
    char want[256];
    snprintf(want, sizeof want,
             "manta_widgets_total{job=\"%s\",actor=\"w-0\",group=\"\",class=\"worker\","
             "kind=\"odd:x/1\"} 4\n",
             manta_job(m));
    assert_non_null(strstr(b.p, want));
    assert_non_null(strstr(b.p, "# TYPE manta_work_seconds histogram\n"));
    assert_non_null(strstr(b.p, "# TYPE manta_actor_restarts_total counter\n"));
    assert_non_null(strstr(b.p, "manta_call_served_seconds_bucket{"));
    free(b.p);
    manta_shutdown(m);
}

/* ---- the HTTP endpoint ---- */

typedef struct client {
    int port;
    const char *request;
    size_t request_len;
    char reply[1 << 18];
    size_t len;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        size_t off = 0;
        while (off < c->request_len) {
            ssize_t w = send(fd, c->request + off, c->request_len - off, MSG_NOSIGNAL);
            if (w <= 0) break;
            off += (size_t)w;
        }
        ssize_t r;
        while (c->len < sizeof c->reply - 1 &&
               (r = recv(fd, c->reply + c->len, sizeof c->reply - 1 - c->len, 0)) > 0)
            c->len += (size_t)r;
    }
    c->reply[c->len] = 0;
    close(fd);
    return NULL;
}

/* Send a request from another thread while this one turns the loop. */
static void fetch(manta_ctx *m, client *c)
{
    pthread_t t;
    c->len = 0;
    volatile int done = 0;
    assert_int_equal(pthread_create(&t, NULL, client_main, c), 0);
    for (int i = 0; i < 200 && !done; i++) {
        manta_poll(m, 20);
        done = pthread_tryjoin_np(t, NULL) == 0;
    }
    if (!done) pthread_join(t, NULL);
}

static void test_http(void **unused)
{
    (void)unused;
    manta_ctx *m = job_with_worker();
    cli_httpd *h;
    char err[300];
    assert_int_equal(cli_httpd_start(m, "127.0.0.1", 0, &h, err, sizeof err), 0);
    int port = cli_httpd_port(h);
    assert_true(port > 0);
    /* a second server on the same port is refused with the reason */
    cli_httpd *h2;
    assert_int_equal(cli_httpd_start(m, "127.0.0.1", port, &h2, err, sizeof err), MANTA_ESYS);
    assert_non_null(strstr(err, "in use"));
    assert_int_equal(cli_httpd_start(m, "not an address", 0, &h2, err, sizeof err), MANTA_EINVAL);

    static client c;
    c.port = port;
    c.request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    c.request_len = strlen(c.request);
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(c.reply, "Content-Type: text/plain; version=0.0.4"));
    const char *body = strstr(c.reply, "\r\n\r\n");
    assert_non_null(body);
    int n;
    assert_int_equal(check_exposition(body + 4, &n), 0);
    long clen = atol(strstr(c.reply, "Content-Length: ") + 16);
    assert_int_equal(clen, (long)strlen(body + 4));

    c.request = "GET /nope HTTP/1.1\r\n\r\n";
    c.request_len = strlen(c.request);
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 404"));
    c.request = "POST /metrics HTTP/1.1\r\n\r\n";
    c.request_len = strlen(c.request);
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 405"));
    c.request = "HEAD /metrics HTTP/1.0\r\n\r\n";
    c.request_len = strlen(c.request);
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 200"));
    assert_null(strstr(c.reply, "manta_actor_up")); /* no body */
    /* a request over the bound: 431, and the server goes on */
    static char big[20000];
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(big + 26, 'a', sizeof big - 27);
    c.request = big;
    c.request_len = sizeof big - 1;
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 431"));
    c.request = "GET /metrics HTTP/1.1\r\n\r\n";
    c.request_len = strlen(c.request);
    fetch(m, &c);
    assert_non_null(strstr(c.reply, "HTTP/1.1 200"));
    cli_httpd_free(h);
    manta_shutdown(m);
}

/* ---- the dashboard ---- */

/* The status code of a reply, and its body (after the blank line). */
static int status_of(const client *c)
{
    return !strncmp(c->reply, "HTTP/1.1 ", 9) ? atoi(c->reply + 9) : -1;
}

static const char *body_of(const client *c)
{
    const char *b = strstr(c->reply, "\r\n\r\n");
    return b ? b + 4 : "";
}

static int get(manta_ctx *m, client *c, const char *target, const char *extra)
{
    static char req[1024];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", target,
             extra ? extra : "");
    c->request = req;
    c->request_len = strlen(req);
    fetch(m, c);
    return status_of(c);
}

/* Off loopback, the job's data needs the token; the page does not; no path
 * reaches outside the compiled-in table. */
static void test_dash_http(void **unused)
{
    (void)unused;
    manta_ctx *m = job_with_worker();
    cli_httpd *h;
    char err[300], dir[] = "/tmp/manta-dash-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(cli_httpd_start(m, "0.0.0.0", 0, &h, err, sizeof err), 0);
    const char *tok = cli_httpd_token(h);
    assert_non_null(tok);
    assert_int_equal(strlen(tok), 32);
    assert_int_equal(strspn(tok, "0123456789abcdef"), 32);
    assert_int_equal(cli_httpd_dashboard(h, NULL, dir, dir, err, sizeof err), 0);
    char path[128], saved[64] = "";
    snprintf(path, sizeof path, "%s/dashboard.token", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(saved, sizeof saved, f));
    fclose(f);
    assert_string_equal(saved, tok);

    static client c;
    c.port = cli_httpd_port(h);
    assert_int_equal(get(m, &c, "/", NULL), 200);
    assert_non_null(strstr(c.reply, "Content-Type: text/html"));
    assert_non_null(strstr(c.reply, "Content-Security-Policy: default-src 'self'"));
    assert_non_null(strstr(body_of(&c), "<script src=\"app.js\"></script>"));
    assert_int_equal(get(m, &c, "/app.js", NULL), 200);
    assert_non_null(strstr(c.reply, "Content-Type: text/javascript"));
    assert_int_equal(get(m, &c, "/style.css", NULL), 200);
    /* the job's data: 401 without the token or with a wrong one */
    assert_int_equal(get(m, &c, "/api/actors", NULL), 401);
    assert_int_equal(get(m, &c, "/metrics", NULL), 401);
    assert_int_equal(get(m, &c, "/api/actors?token=00000000000000000000000000000000", NULL), 401);
    assert_int_equal(get(m, &c, "/metrics", "Authorization: Bearer nope\r\n"), 401);
    char q[128], auth[128];
    snprintf(q, sizeof q, "/api/actors?token=%s", tok);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", tok);
    assert_int_equal(get(m, &c, q, NULL), 200);
    assert_non_null(strstr(c.reply, "Content-Type: application/json"));
    cJSON *j = cJSON_Parse(body_of(&c));
    const cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "actors"), 0);
    assert_string_equal(cJSON_GetObjectItem(a, "name")->valuestring, "w-0");
    assert_string_equal(cJSON_GetObjectItem(a, "state")->valuestring, "alive");
    assert_true(cJSON_GetObjectItem(a, "calls_served")->valuedouble >= 5);
    cJSON_Delete(j);
    assert_int_equal(get(m, &c, "/metrics", auth), 200);
    assert_non_null(strstr(body_of(&c), "manta_actor_up{"));
    assert_int_equal(get(m, &c, "/api/metrics", auth), 200);
    assert_non_null(strstr(body_of(&c), "\"name\":\"widgets_total\""));
    assert_int_equal(get(m, &c, "/api/errors", auth), 200);
    assert_non_null(strstr(body_of(&c), "\"recent\":[]"));
    /* paths: nothing but the table */
    assert_int_equal(get(m, &c, "/../../../../etc/passwd", auth), 404);
    assert_int_equal(get(m, &c, "/%2e%2e/%2e%2e/etc/passwd", auth), 404);
    assert_int_equal(get(m, &c, "/app.js/../../etc/passwd", auth), 404);
    assert_int_equal(get(m, &c, "/api/../metrics", auth), 404);
    assert_int_equal(get(m, &c, "/api/nope", auth), 404);
    assert_null(strstr(c.reply, "root:"));

    /* the curves: the head samples the job value `progress` */
    const char *r1 = "{\"unit\":\"version\",\"step\":1,\"fields\":[[\"reward\",\"0.25\"]]}",
               *r2 = "{\"unit\":\"version\",\"step\":2,\"fields\":[[\"reward\",\"0.5\"]]}";
    assert_int_equal(manta_kv_set(m, "progress", r1, strlen(r1)), 0);
    manta_poll(m, 600);
    assert_int_equal(manta_kv_set(m, "progress", r2, strlen(r2)), 0);
    manta_poll(m, 600);
    snprintf(q, sizeof q, "/api/curves?token=%s", tok);
    assert_int_equal(get(m, &c, q, NULL), 200);
    assert_non_null(strstr(body_of(&c), "\"steps\":[1,2]"));
    assert_non_null(strstr(body_of(&c), "\"values\":[0.25,0.5],\"label\":\"reward\""));
    snprintf(q, sizeof q, "/api/job?token=%s", tok);
    assert_int_equal(get(m, &c, q, NULL), 200);
    assert_non_null(strstr(body_of(&c), "\"line\":\"version 2  "));
    cli_httpd_free(h);
    unlink(path);
    rmdir(dir);
    manta_shutdown(m);
}

/* The curves from progress records: numbers read from the fields' text,
 * one point per step, a step that goes back starts over, bounded points. */
static void test_dash_curves(void **unused)
{
    (void)unused;
    cli_dash *d = cli_dash_new(NULL, NULL, NULL, NULL);
    assert_non_null(d);
    const char *recs[] = {
        "{\"step\":1,\"time_s\":2,\"fields\":[[\"held-out\",\"84.0%\"],[\"gen\",\"12.3k tok/s\"],"
        "[\"tool errors\",\"3 of 40\"],[\"note\",\"warming up\"]]}",
        "{\"step\":1,\"time_s\":2.5,\"fields\":[[\"held-out\",\"85.5%\"]]}", /* same step */
        "not json",
        "{\"fields\":[]}", /* no step */
        "{\"step\":2,\"time_s\":3,\"fields\":[[\"gen\",\"1.5M tok/s\"]]}",
    };
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++)
        cli_dash_record(d, recs[i], strlen(recs[i]));
    cli_buf b = {0};
    assert_int_equal(cli_dash_api(d, "/api/curves", &b), 0);
    assert_string_equal(b.p, "{\"steps\":[1,2],\"time_s\":[2.5,3],\"series\":["
                             "{\"values\":[85.5,null],\"label\":\"held-out\",\"unit\":\"%\"},"
                             "{\"values\":[12300,1500000],\"label\":\"gen\",\"unit\":\"tok/s\"},"
                             "{\"values\":[3,null],\"label\":\"tool errors\",\"unit\":\"\"}],"
                             "\"unit\":\"step\"}\n");
    free(b.p);
    b = (cli_buf){0};
    assert_int_equal(cli_dash_api(d, "/api/../../etc/passwd", &b), MANTA_ENOTFOUND);
    free(b.p);
    /* many steps: bounded, the first and the last kept */
    char rec[128];
    for (int s = 1; s <= 5000; s++) {
        snprintf(rec, sizeof rec, "{\"unit\":\"version\",\"step\":%d,\"fields\":[[\"r\",\"%d\"]]}",
                 s, s);
        cli_dash_record(d, rec, strlen(rec));
    }
    b = (cli_buf){0};
    assert_int_equal(cli_dash_api(d, "/api/curves", &b), 0);
    cJSON *j = cJSON_Parse(b.p);
    const cJSON *steps = cJSON_GetObjectItem(j, "steps");
    int n = cJSON_GetArraySize(steps);
    assert_true(n > 1000 && n <= 2048);
    assert_int_equal(cJSON_GetArrayItem(steps, 0)->valueint, 1);
    assert_int_equal(cJSON_GetArrayItem(steps, n - 1)->valueint, 5000);
    for (int i = 1; i < n; i++)
        assert_true(cJSON_GetArrayItem(steps, i)->valueint >
                    cJSON_GetArrayItem(steps, i - 1)->valueint);
    cJSON_Delete(j);
    free(b.p);
    cli_dash_free(d);
}

/* ---- the progress line ---- */

static void test_progress_format(void **unused)
{
    (void)unused;
    char line[512];
    const char *rec = "{\"unit\":\"version\",\"step\":10,\"steps\":40,\"time_s\":30,"
                      "\"time_limit_s\":780,\"fields\":[[\"reward\",\"0.412\"],"
                      "[\"held-out\",\"84.0%\"]]}";
    /* 10 versions since version 0 seen at 5 s, now 25 s: 2 s a version, 30 left: 60 s */
    cli_progress_format(rec, strlen(rec), 25, 5, 0, line, sizeof line);
    assert_string_equal(line,
                        "version 10/40  0:25 elapsed  ETA 1:00  reward 0.412  held-out 84.0%");
    /* the time limit caps the ETA */
    const char *capped = "{\"step\":1,\"steps\":1000,\"time_s\":770,\"time_limit_s\":780}";
    cli_progress_format(capped, strlen(capped), 775, 0, 0, line, sizeof line);
    assert_string_equal(line, "step 1/1000  12:55 elapsed  ETA 0:10");
    /* a goal may end it sooner: the ETA is a bound, the goal ends the line */
    const char *goal = "{\"unit\":\"version\",\"step\":10,\"steps\":40,\"fields\":[[\"reward\","
                       "\"0.4\"]],\"stop_early\":\"held-out >= 95.0%\"}";
    cli_progress_format(goal, strlen(goal), 25, 5, 0, line, sizeof line);
    assert_string_equal(line, "version 10/40  0:25 elapsed  ETA at most 1:00  reward 0.4  stops at "
                              "held-out >= 95.0%");
    cli_progress_format(NULL, 0, 3661, -1, -1, line, sizeof line);
    assert_string_equal(line, "starting  1:01:01 elapsed");
}

/* ---- the report ---- */

/* An SVG file, checked without an XML library: the declaration, one <svg>
 * root closed at the end, and every element opened is closed in order. */
static void check_svg(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_true(!strncmp(buf, "<?xml version=\"1.0\"", 19));
    char stack[64][16];
    int depth = 0, roots = 0;
    for (const char *p = strchr(buf + 1, '<'); p; p = strchr(p + 1, '<')) {
        char name[16];
        if (p[1] == '/') {
            sscanf(p + 2, "%15[a-z]", name);
            assert_true(depth > 0);
            assert_string_equal(stack[depth - 1], name);
            depth--;
            continue;
        }
        sscanf(p + 1, "%15[a-z]", name);
        const char *close = strchr(p, '>');
        assert_non_null(close);
        assert_null(memchr(p + 1, '<', (size_t)(close - p - 1))); /* no markup inside a tag */
        if (depth == 0) roots++, assert_string_equal(name, "svg");
        if (close[-1] != '/') {
            assert_true(depth < 64);
            snprintf(stack[depth++], sizeof stack[0], "%s", name);
        }
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
}

static void test_report(void **unused)
{
    (void)unused;
    char dir[] = "/tmp/manta-obs-report-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"eval\":\"initial\",\"version\":0,\"heldout_success\":0.2}\n");
    for (int v = 1; v <= 12; v++)
        fprintf(
            f,
            "{\"version\":%d,\"time_s\":%d,\"reward\":%g,\"success\":%g,"
            "\"trained_tokens_per_s\":%d,\"gen_tokens_per_s\":%d,\"staleness\":[%d,%d,1,0,0,0]}\n",
            v, v, 0.1 * v, 0.05 * v, 1000 + 10 * v, 5000 - v, v, 12 - v);
    fprintf(f, "{\"eval\":\"final\",\"version\":12,\"heldout_success\":0.9}\n");
    fclose(f);
    int made = 0;
    char err[300];
    assert_int_equal(cli_report_write(dir, &made, err, sizeof err), 0);
    assert_int_equal(made, 4);
    const char *files[] = {"reward.svg", "success.svg", "throughput.svg", "staleness.svg"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        check_svg(path);
    }
    /* bars: the per-version histograms summed (no summary.json): 0..2 */
    snprintf(path, sizeof path, "%s/staleness.svg", dir);
    f = fopen(path, "r");
    static char svg[1 << 16];
    svg[fread(svg, 1, sizeof svg - 1, f)] = 0;
    fclose(f);
    assert_non_null(strstr(svg, "<title>78</title>")); /* 1 + 2 + ... + 12 */
    assert_non_null(strstr(svg, "<title>12</title>")); /* twelve ones */
    assert_null(strstr(svg, ">3</text>"));             /* empty trailing bins are cut */
    /* a line that is not JSON is named */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    f = fopen(path, "a");
    fprintf(f, "{not json\n");
    fclose(f);
    assert_int_equal(cli_report_write(dir, &made, err, sizeof err), MANTA_EJSON);
    assert_non_null(strstr(err, "metrics.jsonl:15"));
    /* the human summary */
    const char *ans =
        "{\"run_dir\":\"x\",\"heldout_problems\":200,\"heldout_success_initial\":0.215,"
        "\"heldout_success_final\":0.955,\"versions\":40,\"wall_s\":15.2,"
        "\"ledger\":{\"admitted\":10,\"trained\":8,\"dropped_stale\":1,"
        "\"dropped_error\":1,\"in_flight\":0,\"balanced\":true}}";
    char out[1024] = "";
    FILE *mf = fmemopen(out, sizeof out, "w");
    assert_int_equal(cli_report_summary(ans, strlen(ans), mf), 0);
    fclose(mf);
    assert_non_null(strstr(out, "held-out success 21.5% -> 95.5% (200 problems); 40 versions"));
    assert_non_null(strstr(out, "ledger balanced: admitted 10 = trained 8"));
    assert_int_equal(cli_report_summary("{\"sum\": 1}", 10, stdout), -1);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- log lines ---- */

static void test_logs(void **unused)
{
    (void)unused;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) { /* as an actor would: identity from the environment */
        setenv("MANTA_ROLE", "actor", 1);
        setenv("MANTA_NAME", "w-9", 1);
        setenv("MANTA_INCARNATION", "3", 1);
        setenv("MANTA_LOG_LEVEL", "warn", 1);
        dup2(fd[1], 2);
        manta_log(MANTA_LOG_INFO, "below the level");
        manta_log(MANTA_LOG_ERROR, "bad \"%s\"\n\tnext", "x");
        _exit(0);
    }
    close(fd[1]);
    char out[4096];
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(fd[0]);
    waitpid(pid, NULL, 0);
    assert_non_null(strchr(out, '\n'));
    assert_null(strchr(strchr(out, '\n') + 1, '\n')); /* one line: info was dropped */
    assert_non_null(strstr(out, "\"role\":\"actor\",\"actor\":\"w-9\",\"incarnation\":3,"));
    assert_non_null(strstr(out, "\"level\":\"error\",\"msg\":\"bad \\\"x\\\"\\n\\tnext\"}"));
    assert_true(!strncmp(out, "{\"time\":\"20", 11));
    /* pretty: time of day, level, actor#incarnation, message */
    *strchr(out, '\n') = 0;
    char pretty[512] = "";
    FILE *f = fmemopen(pretty, sizeof pretty, "w");
    cli_log_line(out, 0, 0, f);
    cli_log_line("plain output of a child", 0, 0, f);
    cli_log_line(out, 1, 0, f);
    fclose(f);
    assert_non_null(
        strstr(pretty, " ERROR w-9#3            bad \"x\"\n\tnext\nplain output of a child\n{"));
    assert_true(pretty[2] == ':' && pretty[5] == ':' && pretty[8] == '.');
    manta_log_level l;
    assert_int_equal(manta_log_level_parse("debug", &l), 0);
    assert_int_equal(l, MANTA_LOG_DEBUG);
    assert_int_equal(manta_log_level_parse("loud", &l), MANTA_EINVAL);
    assert_non_null(strstr(manta_last_error(), "'loud'"));
}

int main(void)
{
    if (getenv("MANTA_ROLE")) {
        manta_ctx *m;
        manta_init(&m, &(manta_options){.classes = classes});
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    test_redis_start(&redis);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_and_record),
        cmocka_unit_test(test_check_exposition_rejects),
        cmocka_unit_test(test_exposition),
        cmocka_unit_test(test_http),
        cmocka_unit_test(test_dash_http),
        cmocka_unit_test(test_dash_curves),
        cmocka_unit_test(test_progress_format),
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_logs),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_redis_stop(&redis);
    return failed;
}
