/*
 * httpd.c -- the head's HTTP endpoint: the web dashboard, its JSON API and
 * the Prometheus metrics, served by libmicrohttpd on the driver's event
 * loop.
 *
 * libmicrohttpd runs without a thread of its own (MHD_USE_EPOLL, no
 * internal polling thread): its epoll descriptor joins the ctx's loop
 * (manta_watch_fd) and a timer follows MHD_get_timeout, so every request is
 * answered on the ctx's thread, where the registry may be read.
 *
 *   GET /                 the dashboard page (web/index.html)
 *   GET /app.js, /style.css
 *                         its script and style sheet; all three are compiled
 *                         into the program (dash_assets.c, generated from
 *                         web/ at build time), so nothing is read from disk
 *                         and no path can reach outside that table
 *   GET /api/job, /api/actors, /api/metrics, /api/curves, /api/errors
 *                         the JSON the page polls (dash.c)
 *   GET /metrics          the Prometheus text exposition (prom.c)
 *
 * HEAD is answered like GET without a body, other methods get 405, other
 * paths 404. Bounds: a request's line and headers share CONN_MEMORY bytes
 * (more: 431, from libmicrohttpd), MAX_CONNS connections at once, an idle
 * connection is closed after IDLE_S seconds; requests carry no body.
 *
 * The address is the spec's metrics.bind, 127.0.0.1 by default: the pages
 * name actors, hosts and log lines. On any other address every path needs
 * the job's token, made here at start (128 random bits, hex): as
 * "Authorization: Bearer TOKEN" (a Prometheus scrape config's
 * `authorization: {credentials_file: RUN_DIR/dashboard.token}`) or as the
 * query argument ?token=TOKEN (the dashboard's URL, which its script passes
 * on to the API). The token is written to RUN_DIR/dashboard.token (0600).
 */
#include "cli_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONN_MEMORY (16 * 1024)
#define MAX_CONNS   16
#define IDLE_S      10

struct cli_httpd {
    manta_ctx *m;
    struct MHD_Daemon *d;
    int epfd, port;
    uint64_t timer;
    char token[33]; /* "" on loopback: no token asked */
    cli_dash *dash; /* NULL until cli_httpd_dashboard */
};

static const char CSP[] = "default-src 'self'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             const void *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free((void *)body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
    if (status == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status, const char *msg)
{
    return reply(c, status, "text/plain; charset=utf-8", msg, strlen(msg), MHD_RESPMEM_PERSISTENT);
}

/* A cli_buf handed over as the body (freed by libmicrohttpd). */
static enum MHD_Result buf_reply(struct MHD_Connection *c, const char *type, cli_buf *b)
{
    return reply(c, MHD_HTTP_OK, type, b->p ? b->p : "", b->len,
                 b->p ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
}

/* Equal strings, in time that depends on the length only. */
static int same(const char *a, const char *b)
{
    size_t n = strlen(a);
    if (n != strlen(b)) return 0;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static int authorized(cli_httpd *s, struct MHD_Connection *c)
{
    if (!s->token[0]) return 1;
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (q && same(q, s->token)) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return h && !strncmp(h, "Bearer ", 7) && same(h + 7, s->token);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **con_cls)
{
    cli_httpd *s = cls;
    (void)version, (void)upload, (void)upload_len, (void)con_cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    /* the page, script and style sheet hold no data of the job: no token */
    const char *name = !strcmp(url, "/") ? "/index.html" : url;
    for (size_t i = 0; s->dash && i < cli_n_assets; i++)
        if (!strcmp(name, cli_assets[i].path))
            return reply(c, MHD_HTTP_OK, cli_assets[i].type, cli_assets[i].data, cli_assets[i].len,
                         MHD_RESPMEM_PERSISTENT);
    if (!strcmp(url, "/"))
        return text(c, MHD_HTTP_OK, "manta: the job's metrics are at /metrics\n");
    if (!authorized(s, c))
        return text(c, MHD_HTTP_UNAUTHORIZED,
                    "this job is not on loopback: give its token (RUN_DIR/dashboard.token) as "
                    "?token=TOKEN or Authorization: Bearer TOKEN\n");
    if (!strcmp(url, "/metrics")) {
        cli_buf b = {0};
        if (cli_prom_render(s->m, &b) != 0) {
            free(b.p);
            char msg[300];
            snprintf(msg, sizeof msg, "registry: %s\n", manta_last_error());
            char *body = strdup(msg);
            return body ? reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", body,
                                strlen(body), MHD_RESPMEM_MUST_FREE)
                        : MHD_NO;
        }
        return buf_reply(c, "text/plain; version=0.0.4; charset=utf-8", &b);
    }
    if (!strncmp(url, "/api/", 5) && s->dash) {
        cli_buf b = {0};
        int rc = cli_dash_api(s->dash, url, &b);
        if (rc == 0) return buf_reply(c, "application/json", &b);
        free(b.p);
        return rc == MANTA_ENOTFOUND ? text(c, MHD_HTTP_NOT_FOUND, "no such document\n")
                                     : text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n");
    }
    return text(c, MHD_HTTP_NOT_FOUND, "not found\n");
}

/* ---- on the loop ---- */

static void on_timer(void *arg);

/* Let libmicrohttpd do what is ready, then wake it when it asks to be. */
static void pump(cli_httpd *s)
{
    MHD_run(s->d);
    MHD_UNSIGNED_LONG_LONG to = 1000;
    if (MHD_get_timeout(s->d, &to) != MHD_YES || to > 1000) to = 1000;
    if (s->timer) manta_timer_cancel(s->m, s->timer);
    s->timer = manta_timer_add(s->m, (int64_t)to, on_timer, s);
}

static void on_timer(void *arg)
{
    cli_httpd *s = arg;
    s->timer = 0;
    pump(s);
}

static void on_epoll(void *arg, int fd, int revents)
{
    (void)fd, (void)revents;
    pump(arg);
}

/* ---- start and stop ---- */

static int is_loopback(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static int make_token(char out[33])
{
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    return 0;
}

/* A listening socket on bind_addr:port; -1 with the reason in err. */
static int listen_on(const char *bind_addr, int port, struct sockaddr_storage *sa, char *err,
                     size_t errlen, int *rc)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int grc = getaddrinfo(bind_addr, service, &hints, &ai);
    if (grc) {
        snprintf(err, errlen, "metrics.bind '%s': %s", bind_addr, gai_strerror(grc));
        *rc = MANTA_EINVAL;
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        snprintf(err, errlen, "metrics endpoint %s:%d: %s", bind_addr, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        *rc = MANTA_ESYS;
        return -1;
    }
    freeaddrinfo(ai);
    socklen_t sl = sizeof *sa;
    getsockname(fd, (struct sockaddr *)sa, &sl);
    return fd;
}

int cli_httpd_start(manta_ctx *m, const char *bind_addr, int port, cli_httpd **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    struct sockaddr_storage sa = {0};
    int rc = 0, fd = listen_on(bind_addr, port, &sa, err, errlen, &rc);
    if (fd < 0) return rc;
    cli_httpd *s = calloc(1, sizeof *s);
    if (!s || (!is_loopback(&sa) && make_token(s->token) != 0)) {
        snprintf(err, errlen, "metrics endpoint: %s", s ? "no random bytes" : "out of memory");
        free(s);
        close(fd);
        return s ? MANTA_ESYS : MANTA_ENOMEM;
    }
    s->m = m, s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                       : ((struct sockaddr_in *)&sa)->sin_port);
    /* libmicrohttpd owns fd from here: MHD_stop_daemon closes it */
    s->d = MHD_start_daemon(
        MHD_USE_EPOLL, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNS, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)IDLE_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY, MHD_OPTION_END);
    const union MHD_DaemonInfo *ei =
        s->d ? MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!ei || manta_watch_fd(m, ei->epoll_fd, MANTA_POLLIN, on_epoll, s) != 0) {
        snprintf(err, errlen, "metrics endpoint: libmicrohttpd did not start");
        if (s->d)
            MHD_stop_daemon(s->d);
        else
            close(fd);
        free(s);
        return MANTA_ESYS;
    }
    s->epfd = ei->epoll_fd;
    pump(s);
    *out = s;
    return 0;
}

int cli_httpd_dashboard(cli_httpd *s, const struct manta_spec *spec, const char *run_dir,
                        const char *logs_dir, char *err, size_t errlen)
{
    if (!(s->dash = cli_dash_new(s->m, spec, run_dir, logs_dir))) {
        snprintf(err, errlen, "dashboard: out of memory");
        return MANTA_ENOMEM;
    }
    if (!run_dir) return 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/dashboard.token", run_dir);
    if (!s->token[0]) { /* on loopback: no token, and none of an earlier run left to mislead */
        unlink(path);
        return 0;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    ssize_t w = fd >= 0 ? write(fd, s->token, 32) : -1;
    if (fd < 0 || w != 32 || close(fd) != 0) {
        snprintf(err, errlen, "dashboard token %s: %s", path, strerror(errno));
        return MANTA_ESYS;
    }
    return 0;
}

const char *cli_httpd_token(const cli_httpd *s)
{
    return s && s->token[0] ? s->token : NULL;
}

int cli_httpd_port(const cli_httpd *s)
{
    return s ? s->port : 0;
}

void cli_httpd_free(cli_httpd *s)
{
    if (!s) return;
    manta_watch_fd(s->m, s->epfd, 0, NULL, NULL);
    if (s->timer) manta_timer_cancel(s->m, s->timer);
    MHD_stop_daemon(s->d);
    cli_dash_free(s->dash);
    free(s);
}
