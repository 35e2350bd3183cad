/*
 * testutil.c -- a real redis-server for the tests, and checks on it.
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &len);
    close(s);
    return ntohs(a.sin_port);
}

void test_redis_start(test_redis *r)
{
    test_redis_start_args(r, NULL);
}

/* Can an unauthenticated client talk to it (or is it at least up and
 * answering, with NOAUTH when the default user is off)? */
static int redis_answers(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    int up = 0;
    if (c && !c->err) {
        redisReply *rep = redisCommand(c, "PING");
        up = rep != NULL;
        freeReplyObject(rep);
    }
    redisFree(c);
    return up;
}

void test_redis_start_args(test_redis *r, const char *const *extra)
{
    snprintf(r->dir, sizeof r->dir, "/tmp/manta-test-redis-XXXXXX");
    if (!mkdtemp(r->dir)) {
        perror("mkdtemp");
        exit(1);
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = free_port();
        char port[16];
        snprintf(port, sizeof port, "%d", r->port);
        r->pid = fork();
        if (r->pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int devnull = open("/dev/null", 1);
            if (devnull >= 0) dup2(devnull, 1);
            const char *argv[64] = {"redis-server", "--port", port,  "--bind",
                                    "127.0.0.1",    "--save", "",    "--appendonly",
                                    "no",           "--dir",  r->dir};
            size_t n = 11;
            for (size_t i = 0; extra && extra[i] && n < 63; i++) argv[n++] = extra[i];
            argv[n] = NULL;
            execvp("redis-server", (char *const *)argv);
            _exit(127);
        }
        for (int i = 0; i < 500; i++) {
            int status;
            if (waitpid(r->pid, &status, WNOHANG) == r->pid) break;
            if (redis_answers(r->port)) {
                snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
                return;
            }
            usleep(10000);
        }
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    fprintf(stderr, "test: could not start redis-server (is it installed?)\n");
    exit(1);
}

void test_redis_stop(test_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        waitpid(r->pid, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", r->dir);
    if (system(cmd) != 0) fprintf(stderr, "test: could not remove %s\n", r->dir);
}

long test_redis_count(const test_redis *r, const char *pattern)
{
    redisContext *c = redisConnect("127.0.0.1", r->port);
    if (!c || c->err) return -1;
    redisReply *rep = redisCommand(c, "KEYS %s", pattern);
    long n = rep && rep->type == REDIS_REPLY_ARRAY ? (long)rep->elements : -1;
    freeReplyObject(rep);
    redisFree(c);
    return n;
}

int test_pid_alive(pid_t pid)
{
    if (pid <= 0 || kill(pid, 0) != 0) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && p[2] == 'Z');
}
