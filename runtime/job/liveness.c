/*
 * liveness.c -- is a node agent alive? Decided from its socket, not from a
 * heartbeat alone.
 *
 * A heartbeat older than the watchdog's limit says only that the agent did
 * not write to Redis lately: it may be dead, or stopped (SIGSTOP, a
 * debugger), or starved on a loaded machine. Its mailbox tells them apart:
 * the listening socket of a live process, even a stopped one, takes a
 * connection (the kernel completes it into the backlog); the socket of a
 * process that exited refuses it (ECONNREFUSED on tcp and ipc alike; an ipc
 * path whose listener is gone refuses too), and a machine that is gone
 * does not answer within the timeout. The probe connects and closes at
 * once; the agent's ZeroMQ sees a peer that left before its greeting.
 */
#include "job_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Connect fd to addr within timeout_ms: 1 connected, 0 refused or timed out. */
static int connect_within(int fd, const struct sockaddr *addr, socklen_t len, int timeout_ms)
{
    if (connect(fd, addr, len) == 0) return 1;
    if (errno != EINPROGRESS && errno != EAGAIN) return 0;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (poll(&p, 1, timeout_ms) != 1) return 0;
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) return 0;
    return err == 0;
}

static mj_node_liveness probe_ipc(const char *path, int timeout_ms)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return MJ_NODE_UNKNOWN;
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return MJ_NODE_UNKNOWN;
    int ok = connect_within(fd, (struct sockaddr *)&a, sizeof a, timeout_ms);
    close(fd);
    return ok ? MJ_NODE_PRESENT : MJ_NODE_GONE;
}

static mj_node_liveness probe_tcp(const char *hostport, int timeout_ms)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host) return MJ_NODE_UNKNOWN;
    const char *h = hostport;
    size_t hl = (size_t)(colon - hostport);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2; /* [IPv6] */
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) return MJ_NODE_UNKNOWN;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && connect_within(fd, res->ai_addr, res->ai_addrlen, timeout_ms);
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    if (fd < 0) return MJ_NODE_UNKNOWN;
    return ok ? MJ_NODE_PRESENT : MJ_NODE_GONE;
}

mj_node_liveness mj_probe_endpoint(const char *endpoint, int timeout_ms)
{
    if (!endpoint) return MJ_NODE_UNKNOWN;
    if (!strncmp(endpoint, "ipc://", 6)) return probe_ipc(endpoint + 6, timeout_ms);
    if (!strncmp(endpoint, "tcp://", 6)) return probe_tcp(endpoint + 6, timeout_ms);
    return MJ_NODE_UNKNOWN;
}
