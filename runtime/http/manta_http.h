/*
 * manta_http.h - the runtime's asynchronous HTTP client.
 *
 * One client holds one libcurl multi handle: many requests are in flight at
 * once from one thread, and connections (and DNS answers) are kept alive and
 * reused between requests to the same host. A request is submitted with a
 * callback; the callback fires exactly once per accepted request, with either
 * an HTTP response (any status) or a negative MANTA_E* code from manta.h and
 * a message naming the request and the cause (timeout, refused connection,
 * DNS, TLS, body too large, broken transfer, canceled, client closed).
 * Nothing waits forever: every request has a connect timeout and a total
 * timeout.
 *
 * Two ways to drive a client:
 *   - manta_http_step(): polls the client's own sockets for up to a timeout,
 *     like curl_multi_poll, and fires the callbacks of finished requests;
 *   - an external event loop: it asks for the sockets (manta_http_fds, or a
 *     watch callback for epoll-style loops) and the next deadline
 *     (manta_http_timeout_ms), polls them itself and reports readiness with
 *     manta_http_on_fd(). Both are built on curl_multi_socket_action, so
 *     they can be mixed freely on one client.
 *
 * Retries: a request may be retried with exponential back-off (with jitter)
 * on connection failures, on 5xx answers and on timeouts. By default only
 * idempotent methods (GET, HEAD, PUT, DELETE, OPTIONS) are retried; a POST is
 * retried only when the request asks for it (max_retries > 0), because the
 * server may already have acted on it.
 *
 * Thread-safety: a client is used by one thread at a time (one client per
 * event loop thread). Different clients may be used by different threads at
 * once. Callbacks run on the thread that calls manta_http_step/on_fd/cancel/
 * free.
 *
 * Nothing here knows about any particular protocol carried over HTTP.
 */
#ifndef MANTA_HTTP_H
#define MANTA_HTTP_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "manta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Errors are the runtime's (manta.h): 0 or a negative MANTA_E* code, named
 * by manta_strerror() and manta_errname(). A completed request reports one
 * of these (MANTA_OK means a response arrived; its status may be anything):
 *   MANTA_ETIMEDOUT  no connection within the connect timeout, or no
 *                    complete answer within the total timeout
 *   MANTA_ECONNECT   refused or unreachable
 *   MANTA_ERESOLVE   the host name did not resolve
 *   MANTA_ETLS       TLS handshake or certificate check failed
 *   MANTA_EMSGSIZE   the response body is over max_body
 *   MANTA_ETRANSFER  the connection broke mid-answer, or another libcurl
 *                    failure (its text is in the message)
 *   MANTA_ECANCELED  manta_http_cancel()
 *   MANTA_ECLOSED    manta_http_free() while in flight
 *   MANTA_EINVAL     a malformed URL or an unsupported scheme
 *   MANTA_ENOMEM     out of memory
 * This library only uses the table; it needs neither libmanta's event loop
 * nor Redis. */

/* Retry conditions (bit mask for manta_http_request.retry_on). */
#define MANTA_HTTP_RETRY_CONNECT 0x1u /* refused, DNS failure, connect timeout */
#define MANTA_HTTP_RETRY_5XX     0x2u /* 500, 502, 503, 504 */
#define MANTA_HTTP_RETRY_TIMEOUT 0x4u /* total timeout after connecting */

/* Client settings. Fill with manta_http_config_init, then change fields. */
typedef struct manta_http_config {
    long connect_timeout_ms;   /* default 5000 */
    long timeout_ms;           /* total per attempt; default 30000 */
    size_t max_body;           /* response body limit in bytes; default 64 MiB */
    int max_retries;           /* retries for idempotent methods; default 2 */
    long backoff_ms;           /* first back-off, doubled per retry; default 100 */
    long backoff_max_ms;       /* back-off cap; default 5000 */
    long max_connections;      /* open connections in total; 0 = no limit (default) */
    long max_host_connections; /* per host; 0 = no limit (default) */
    const char *user_agent;    /* copied by manta_http_new; default "manta/0.1" */
} manta_http_config;

/* Fills cfg with the defaults above. Never fails. */
void manta_http_config_init(manta_http_config *cfg);

/* Optional watcher of a response body as it arrives (see on_body below): the
 * Content-Type so far (or NULL) and every body byte received so far. Returns
 * nonzero to end the transfer now as a success; the callback then gets the
 * status, headers and the body received so far. Must not call back into the
 * client. */
typedef int (*manta_http_body_fn)(const char *content_type, const char *body, size_t len,
                                  void *arg);

/* One request. Fill with manta_http_request_init, then set url and the rest.
 * Everything it points to is copied by manta_http_submit, so the caller may
 * free or reuse it as soon as submit returns. */
typedef struct manta_http_request {
    const char *method;         /* NULL: "POST" when body is set, else "GET" */
    const char *url;            /* required, e.g. "http://127.0.0.1:8000/mcp" */
    const char *const *headers; /* n_headers lines "Name: value" */
    size_t n_headers;
    const void *body; /* may be NULL; body_len bytes sent as is */
    size_t body_len;
    long connect_timeout_ms; /* <= 0: the client's */
    long timeout_ms;         /* <= 0: the client's (per attempt) */
    size_t max_body;         /* 0: the client's */
    int max_retries;         /* < 0: the client's for idempotent methods, 0 otherwise */
    unsigned retry_on;       /* MANTA_HTTP_RETRY_* mask; 0: CONNECT | 5XX */
    /* For streamed answers (e.g. server-sent events) that may hold the
     * wanted message long before the server closes the stream: on_body
     * decides when enough has arrived. The connection is then closed, not
     * reused. NULL: read to the end. */
    manta_http_body_fn on_body;
    void *on_body_arg;
} manta_http_request;

/* Sets every field of req to "use the client's default" and url to NULL. */
void manta_http_request_init(manta_http_request *req);

/* One response header. */
typedef struct manta_http_header {
    const char *name; /* as the server spelt it */
    const char *value;
} manta_http_header;

/* What a callback gets. Every pointer in it is owned by the client and valid
 * only during the callback: copy what you keep. */
typedef struct manta_http_result {
    uint64_t id;         /* the id manta_http_submit returned */
    int err;             /* MANTA_OK (0) when a response arrived, else a MANTA_E* code */
    long status;         /* HTTP status, 0 when err != 0 */
    const char *message; /* never NULL: "" when OK, else what went wrong and where */
    const char *body;    /* never NULL; NUL-terminated after body_len bytes */
    size_t body_len;
    const char *content_type;         /* Content-Type header, or NULL */
    const manta_http_header *headers; /* all headers of the final response */
    size_t n_headers;
    int attempts;      /* 1 + retries made */
    double elapsed_ms; /* from submit to completion, back-offs included */
} manta_http_result;

/* Called exactly once per accepted request. It may submit new requests and
 * cancel others on the same client, but must not free the client or call
 * manta_http_step/on_fd on it. */
typedef void (*manta_http_done_fn)(const manta_http_result *res, void *arg);

/* Counters since the client was created. */
typedef struct manta_http_stats {
    uint64_t submitted; /* requests accepted by submit */
    uint64_t completed; /* callbacks fired */
    uint64_t ok;        /* completed with a response (any status) */
    uint64_t status_2xx, status_3xx, status_4xx, status_5xx;
    uint64_t errors[MANTA_ERR_COUNT]; /* completed with err != 0, by manta_err_index(err) */
    uint64_t attempts;                /* transfers started, retries included */
    uint64_t retries;
    uint64_t connects;       /* new connections opened (less than attempts when reused) */
    uint64_t bytes_received; /* response body bytes */
    uint64_t ended_early;    /* transfers ended by an on_body callback */
} manta_http_stats;

typedef struct manta_http_client manta_http_client;

/* Creates a client; cfg NULL means the defaults. Returns NULL when out of
 * memory, when libcurl cannot start, or when cfg is invalid (negative
 * timeouts, zero max_body). The caller owns it; free with manta_http_free. */
manta_http_client *manta_http_new(const manta_http_config *cfg);

/* Frees the client. Requests still in flight end first: their callbacks fire
 * (inside this call) with MANTA_ECLOSED. manta_http_free(NULL) is a
 * no-op. Must not be called from a callback of the same client. */
void manta_http_free(manta_http_client *c);

/* Submits req. On success returns 0, stores the request's id (never 0) in
 * *id when id is not NULL, and cb will fire exactly once, from a later call
 * of manta_http_step/on_fd/cancel/free, never from inside submit. On failure
 * returns MANTA_EINVAL (no url, no cb, a header without ':') or
 * MANTA_ENOMEM, and cb never fires. */
int manta_http_submit(manta_http_client *c, const manta_http_request *req, manta_http_done_fn cb,
                      void *arg, uint64_t *id);

/* A timer on the client's clock: cb fires once with MANTA_OK (status 0,
 * empty body) about delay_ms from now, from a later drive of the client, or
 * earlier with MANTA_ECANCELED / MANTA_ECLOSED from manta_http_cancel /
 * manta_http_free. It makes no transfer and is not counted in the stats,
 * but it is "in flight" (manta_http_in_flight) and its deadline is part of
 * manta_http_timeout_ms, so a protocol built on this client can back off
 * without a timer of its own. Returns 0 and *id (when not NULL), or
 * MANTA_EINVAL (no cb, negative delay) / MANTA_ENOMEM; cb never fires then. */
int manta_http_after(manta_http_client *c, long delay_ms, manta_http_done_fn cb, void *arg,
                     uint64_t *id);

/* Cancels request id: its callback fires inside this call with
 * MANTA_ECANCELED and 0 is returned. Returns MANTA_EINVAL when id
 * is not in flight (unknown, or already completed). */
int manta_http_cancel(manta_http_client *c, uint64_t id);

/* Drives transfers: waits up to timeout_ms (0: do not wait) for socket
 * activity or a deadline, performs it and fires the callbacks of finished
 * requests. Returns as soon as at least one callback fired, the timeout
 * expired, or nothing is in flight. Returns the number of requests still
 * in flight. */
int manta_http_step(manta_http_client *c, int timeout_ms);

/* Number of requests submitted whose callback has not fired yet. */
int manta_http_in_flight(const manta_http_client *c);

/* Event-loop integration, poll style: writes up to max entries (fd, events =
 * POLLIN/POLLOUT) of the sockets the client waits on into fds, and returns
 * how many there are in all (may be more than max: call again with a bigger
 * array). The set changes after every call that drives the client. */
int manta_http_fds(const manta_http_client *c, struct pollfd *fds, int max);

/* Milliseconds until the client must be driven even without socket
 * activity (0: now), or -1 when it has no deadline. */
int manta_http_timeout_ms(const manta_http_client *c);

/* Reports socket fd ready with poll revents (POLLIN, POLLOUT, POLLERR,
 * POLLHUP), or only expired deadlines when fd < 0. Performs the work, fires
 * callbacks, and returns the number of requests still in flight. */
int manta_http_on_fd(manta_http_client *c, int fd, short revents);

/* Event-loop integration, epoll style: fn(fd, events, arg) is called whenever
 * the client starts waiting on fd (events = POLLIN and/or POLLOUT), changes
 * what it waits for, or stops (events = 0). It is called at once for the
 * sockets already watched. fn NULL removes the watch. fn must not call back
 * into the client. */
typedef void (*manta_http_watch_fn)(int fd, short events, void *arg);
void manta_http_set_watch(manta_http_client *c, manta_http_watch_fn fn, void *arg);

/* Event-loop integration, timers: fn(timeout_ms, arg) is called whenever the
 * client's next deadline changes, with the milliseconds from now until it
 * (0: as soon as possible) or -1 when there is none. When it expires, call
 * manta_http_on_fd(c, -1, 0). It is called at once with the current
 * deadline. fn NULL removes it. fn must not call back into the client. With
 * a watch and a timer an event loop needs nothing else to drive the client. */
typedef void (*manta_http_timer_fn)(int timeout_ms, void *arg);
void manta_http_set_timer(manta_http_client *c, manta_http_timer_fn fn, void *arg);

/* Copies the counters into *out. */
void manta_http_get_stats(const manta_http_client *c, manta_http_stats *out);

/* Returns the value of response header name (case-insensitive; the last one
 * when repeated), or NULL. The string lives as long as res. */
const char *manta_http_header_get(const manta_http_result *res, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* MANTA_HTTP_H */
