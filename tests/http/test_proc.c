/*
 * test_proc.c - child server processes for the tests (see test_proc.h).
 */
#include "test_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MANTA_PYTHON
#define MANTA_PYTHON "python3"
#endif

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int test_proc_start(test_proc *p, const char *script, const char *const *args)
{
    return test_proc_start_python(p, MANTA_PYTHON, script, args);
}

int test_proc_start_python(test_proc *p, const char *python, const char *script,
                           const char *const *args)
{
    int fds[2];
    p->pid = -1;
    p->port = 0;
    if (pipe(fds) != 0) return -1;
    const char *argv[32];
    int n = 0;
    argv[n++] = python;
    argv[n++] = script;
    argv[n++] = "--port";
    argv[n++] = "0";
    for (int i = 0; args && args[i] && n < 31; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        /* If the test dies (a crash, a sanitizer abort), take the server
         * with it rather than leave it serving forever. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "test_proc: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    p->pid = pid;
    char line[64];
    size_t len = 0;
    long long deadline = now_ms() + 10000;
    while (len + 1 < sizeof line && !memchr(line, '\n', len)) {
        long long left = deadline - now_ms();
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) break;
        ssize_t k = read(fds[0], line + len, sizeof line - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
    }
    line[len] = '\0';
    close(fds[0]);
    if (sscanf(line, "PORT %d", &p->port) != 1 || p->port <= 0) {
        fprintf(stderr, "test_proc: %s did not announce a port (got \"%s\")\n", script, line);
        test_proc_stop(p);
        return -1;
    }
    return 0;
}

int test_proc_stop(test_proc *p)
{
    if (p->pid <= 0) return -1;
    int status = 0, alive = 0;
    pid_t r = waitpid(p->pid, &status, WNOHANG);
    if (r == 0) {
        alive = 1;
        kill(p->pid, SIGTERM);
        long long deadline = now_ms() + 2000;
        while ((r = waitpid(p->pid, &status, WNOHANG)) == 0 && now_ms() < deadline) usleep(10000);
        if (r == 0) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
        }
    }
    p->pid = -1;
    return alive ? 0 : -1;
}

int test_closed_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &alen) != 0) {
        if (s >= 0) close(s);
        return -1;
    }
    close(s);
    return ntohs(a.sin_port);
}
