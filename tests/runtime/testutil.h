/*
 * testutil.h -- helpers shared by the runtime tests: a private redis-server
 * on a free loopback port in a temporary folder, and raw Redis queries to
 * check what the runtime left behind.
 */
#ifndef MANTA_TESTUTIL_H
#define MANTA_TESTUTIL_H

#include <stddef.h>
#include <sys/types.h>

typedef struct test_redis {
    pid_t pid;
    int port;
    char dir[64];
    char url[128];
} test_redis;

/* Start redis-server; aborts the test program with a message on failure. */
void test_redis_start(test_redis *r);
/* The same with extra redis-server arguments (NULL-terminated), such as
 * "--user", "alice", "on", ">pw", "~*", "&*", "+@all" (one argument per word). */
void test_redis_start_args(test_redis *r, const char *const *extra);
void test_redis_stop(test_redis *r);
/* Number of keys matching a pattern. */
long test_redis_count(const test_redis *r, const char *pattern);
/* 1 if a process with this pid exists (and is not a zombie). */
int test_pid_alive(pid_t pid);
double test_now(void);

#endif
