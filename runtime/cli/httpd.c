/*
 * httpd.c -- the head's metrics endpoint: a small HTTP/1.1 server on the
 * driver's event loop (manta_watch_fd), so it needs no thread and reads the
 * registry on the ctx's own thread.
 *
 * GET /metrics answers the Prometheus text exposition of the job (prom.c),
 * rendered at each request; GET / a line pointing there; HEAD the same
 * without a body. Anything else is 404 or 405. Each connection serves one
 * request and closes (Connection: close), which is what scrapers expect of
 * a plain exporter. Bounds: a request (line and headers) over
 * REQUEST_MAX bytes is answered 431 and closed; at most MAX_CONNS
 * connections at once (more wait in the listen queue); a connection idle
 * for IDLE_MS is closed. The address is the spec's metrics.bind, by
 * default 127.0.0.1: the metrics name actors and hosts, so exposing them
 * beyond this machine is the user's explicit choice.
 */
#include "cli_internal.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define REQUEST_MAX 8192
#define MAX_CONNS   16
#define IDLE_MS     10000

typedef struct conn {
    int fd;
    int64_t since;
    char req[REQUEST_MAX];
    size_t req_len;
    cli_buf out;
    size_t sent;
    int writing;
    struct cli_httpd *srv;
} conn;

struct cli_httpd {
    manta_ctx *m;
    int fd, port;
    conn *conns[MAX_CONNS];
    uint64_t timer;
    uint64_t requests;
};

static void on_conn(void *arg, int fd, int revents);
static void on_listen(void *arg, int fd, int revents);

static void conn_close(conn *c)
{
    cli_httpd *s = c->srv;
    manta_watch_fd(s->m, c->fd, 0, NULL, NULL);
    close(c->fd);
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i] == c) s->conns[i] = NULL;
    free(c->out.p);
    free(c);
    /* a slot is free again: take connections waiting in the listen queue */
    manta_watch_fd(s->m, s->fd, MANTA_POLLIN, on_listen, s);
}

static void respond(conn *c, int status, const char *reason, const char *type, const char *body,
                    size_t body_len, int head)
{
    cli_buf_printf(&c->out,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n",
                   status, reason, type, body_len);
    if (!head && body_len) {
        size_t at = c->out.len;
        cli_buf_printf(&c->out, "%*s", (int)body_len, "");
        if (!c->out.oom) memcpy(c->out.p + at, body, body_len);
    }
    c->writing = 1;
    manta_watch_fd(c->srv->m, c->fd, MANTA_POLLOUT, on_conn, c);
}

static void text(conn *c, int status, const char *reason, const char *msg, int head)
{
    respond(c, status, reason, "text/plain; charset=utf-8", msg, strlen(msg), head);
}

/* A complete request head is in c->req: answer it. */
static void handle(conn *c)
{
    char method[16], target[256], version[16];
    if (sscanf(c->req, "%15s %255s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7)) {
        text(c, 400, "Bad Request", "bad request line\n", 0);
        return;
    }
    int head = !strcmp(method, "HEAD");
    if (strcmp(method, "GET") && !head) {
        text(c, 405, "Method Not Allowed", "only GET and HEAD\n", 0);
        return;
    }
    char *q = strchr(target, '?');
    if (q) *q = 0;
    c->srv->requests++;
    if (!strcmp(target, "/metrics")) {
        cli_buf body = {0};
        int rc = cli_prom_render(c->srv->m, &body);
        if (rc) {
            char msg[300];
            snprintf(msg, sizeof msg, "registry: %s\n", manta_last_error());
            text(c, 503, "Service Unavailable", msg, head);
        } else {
            respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body.p, body.len,
                    head);
        }
        free(body.p);
        return;
    }
    if (!strcmp(target, "/")) {
        text(c, 200, "OK", "manta: the job's metrics are at /metrics (Prometheus text format)\n",
             head);
        return;
    }
    text(c, 404, "Not Found", "not found; the metrics are at /metrics\n", head);
}

static void on_conn(void *arg, int fd, int revents)
{
    conn *c = arg;
    if (c->writing) {
        if (!(revents & MANTA_POLLOUT)) return;
        ssize_t n = send(fd, c->out.p + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);
        if (n > 0) c->sent += (size_t)n;
        if ((n < 0 && errno != EAGAIN && errno != EINTR) || c->sent >= c->out.len || c->out.oom)
            conn_close(c);
        return;
    }
    if (!(revents & MANTA_POLLIN)) return;
    ssize_t n = recv(fd, c->req + c->req_len, sizeof c->req - 1 - c->req_len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(c);
        return;
    }
    if (n < 0) return;
    c->req_len += (size_t)n;
    c->req[c->req_len] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
        handle(c);
    else if (c->req_len >= sizeof c->req - 1)
        text(c, 431, "Request Header Fields Too Large", "request over 8 KiB\n", 0);
}

static void on_listen(void *arg, int fd, int revents)
{
    cli_httpd *s = arg;
    (void)revents;
    for (;;) {
        int slot = -1;
        for (int i = 0; i < MAX_CONNS && slot < 0; i++)
            if (!s->conns[i]) slot = i;
        if (slot < 0) { /* full: stop accepting until one closes */
            manta_watch_fd(s->m, fd, 0, NULL, NULL);
            return;
        }
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) return;
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(cfd);
            return;
        }
        c->fd = cfd, c->srv = s, c->since = manta_now_ms();
        if (manta_watch_fd(s->m, cfd, MANTA_POLLIN, on_conn, c) != 0) {
            close(cfd);
            free(c);
            return;
        }
        s->conns[slot] = c;
    }
}

static void on_timer(void *arg)
{
    cli_httpd *s = arg;
    int64_t now = manta_now_ms();
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i] && now - s->conns[i]->since > IDLE_MS) conn_close(s->conns[i]);
    s->timer = manta_timer_add(s->m, 1000, on_timer, s);
}

int cli_httpd_start(manta_ctx *m, const char *bind_addr, int port, cli_httpd **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int grc = getaddrinfo(bind_addr, service, &hints, &ai);
    if (grc) {
        snprintf(err, errlen, "metrics.bind '%s': %s", bind_addr, gai_strerror(grc));
        return MANTA_EINVAL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        snprintf(err, errlen, "metrics endpoint %s:%d: %s", bind_addr, port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return MANTA_ESYS;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    char host[64], serv[16];
    getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    cli_httpd *s = calloc(1, sizeof *s);
    if (!s || manta_watch_fd(m, fd, MANTA_POLLIN, on_listen, s) != 0) {
        snprintf(err, errlen, "metrics endpoint: out of memory");
        free(s);
        close(fd);
        return MANTA_ENOMEM;
    }
    s->m = m, s->fd = fd, s->port = atoi(serv);
    s->timer = manta_timer_add(m, 1000, on_timer, s);
    *out = s;
    return 0;
}

int cli_httpd_port(const cli_httpd *s)
{
    return s ? s->port : 0;
}

void cli_httpd_free(cli_httpd *s)
{
    if (!s) return;
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i]) conn_close(s->conns[i]);
    manta_watch_fd(s->m, s->fd, 0, NULL, NULL);
    close(s->fd);
    if (s->timer) manta_timer_cancel(s->m, s->timer);
    free(s);
}
