/*
 * test_proc.h - start and stop the Python servers the HTTP and MCP tests talk
 * to: each runs as a child process on a free loopback port it picks itself
 * and announces as its first stdout line, "PORT <n>".
 */
#ifndef MANTA_TEST_PROC_H
#define MANTA_TEST_PROC_H

#include <sys/types.h>

typedef struct test_proc {
    pid_t pid;
    int port;
} test_proc;

/* Starts `python3 script --port 0 args...` (args NULL-terminated, may be
 * NULL) and waits up to 10 s for its port. Returns 0, or -1 with a message on
 * stderr (the child is reaped). */
int test_proc_start(test_proc *p, const char *script, const char *const *args);
/* The same with another Python interpreter (e.g. a venv's). */
int test_proc_start_python(test_proc *p, const char *python, const char *script,
                           const char *const *args);

/* Stops the child (SIGTERM, then SIGKILL after 2 s) and reaps it. Returns 0
 * when it was still running until asked to stop, -1 when it had died
 * earlier (a crash of the server is a test failure). */
int test_proc_stop(test_proc *p);

/* A loopback TCP port with nothing listening on it (bound, then closed). */
int test_closed_port(void);

#endif
