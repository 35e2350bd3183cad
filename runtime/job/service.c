/*
 * service.c -- a job's services: the processes a spec names that are not
 * actors (tool servers), started before the actors, supervised while the
 * job runs, stopped at its end.
 *
 *   services:
 *     - {name: calc, command: "python3 examples/calc_server.py --port 8000",
 *        port: 8000, ready_timeout_s: 20, restart: on-failure, max_restarts: 3}
 *
 * A command without shell syntax is split on blanks and executed directly,
 * so the service itself is our child and carries PR_SET_PDEATHSIG: it dies
 * with the driver even after a kill -9 of the driver. A command that needs
 * the shell (quotes, pipes, $, ;, ...) runs under a keeper: a forked copy of
 * the driver that only waits (async-signal-safe calls only) with the shell
 * as its child, all in one process group; the keeper carries the death
 * signal and passes it on to the whole group, so nothing the shell started
 * outlives the driver either.
 *
 * Each service has its own process group, output to LOG_DIR/NAME.log; the
 * job waits until it accepts TCP connections on 127.0.0.1:PORT (when a port
 * is given). A port already taken is an error: the job would talk to a
 * stranger. While the job runs, mj_services_watch reaps exits: `restart:
 * always` restarts after any exit, `on-failure` (the default) after a crash
 * or a non-zero exit, `never` not at all; at most max_restarts times
 * (default 3; -1: no limit). A service that exits and is not restarted is
 * fatal to the job (its name, how it ended and its log in the message); one
 * that exits 0 under on-failure is not.
 */
#include "job_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SERVICE_STOP_MS      3000 /* SIGTERM to SIGKILL */
#define DEFAULT_SERVICE_UP_S 20
#define DEFAULT_RESTARTS     3
#define MAX_ARGS             64

typedef enum { RESTART_NEVER, RESTART_ON_FAILURE, RESTART_ALWAYS } restart_policy;

typedef struct service {
    char *name, *command;
    char **argv; /* the command split on blanks, or NULL: it needs the shell */
    int port;
    double ready_s;
    restart_policy restart;
    int max_restarts, restarts;
    pid_t pid; /* 0: not running */
} service;

struct mj_services {
    service *v;
    size_t n;
    const char *log_dir;
    const volatile sig_atomic_t *interrupt;
    FILE *log;
};

void mj_say(FILE *f, const char *fmt, ...)
{
    if (!f) f = stderr;
    va_list ap;
    va_start(ap, fmt);
    fputs("manta: ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
    fflush(f);
}

int mj_port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* The spec's errors as one message (file:line:col: path: message; ...). */
int mj_spec_fail(manta_spec_errors *errs, const char *what)
{
    char msg[1024] = "";
    for (size_t i = 0; i < errs->count && strlen(msg) < sizeof msg - 4; i++)
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s", i ? "; " : "",
                 errs->items[i].text);
    return manta_fail(MANTA_EINVAL, "%s: %s", what, msg);
}

/* The command split on blanks, or NULL when it needs a shell (or is too
 * long to split): quotes, escapes, expansions, redirections, lists,
 * globs, comments, an assignment in front, a builtin first. */
static char **split_command(const char *cmd)
{
    if (strpbrk(cmd, "|&;<>()$`\\\"'*?[]#~{}\n")) return NULL;
    char **argv = calloc(MAX_ARGS + 1, sizeof *argv);
    if (!argv) return NULL;
    size_t n = 0;
    for (const char *p = cmd; *p;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        size_t len = strcspn(p, " \t");
        if (n == MAX_ARGS || !(argv[n] = strndup(p, len)) || (n == 0 && memchr(p, '=', len))) {
            for (size_t i = 0; i <= n && i < MAX_ARGS; i++) free(argv[i]);
            free(argv);
            return NULL;
        }
        n++;
        p += len;
    }
    /* a shell builtin or keyword first (exec, cd, ulimit, if ...): the shell */
    static const char *const builtins[] = {
        "exec", "cd",    ".",     "source", "export", "set",  "ulimit", "umask",   "eval", "if",
        "for",  "while", "until", "case",   "unset",  "trap", "wait",   "command", NULL};
    bool shell = n == 0;
    for (size_t i = 0; n && builtins[i] && !shell; i++) shell = !strcmp(argv[0], builtins[i]);
    if (shell) {
        for (size_t i = 0; i < n; i++) free(argv[i]);
        free(argv);
        return NULL;
    }
    return argv;
}

/* The keeper: runs /bin/sh -c CMD as its child and waits. When it gets
 * SIGTERM (the job's end, or the driver's death through PDEATHSIG) it
 * passes it to the whole group, and SIGKILL after SERVICE_STOP_MS; when
 * the shell ends it ends the same way. Only async-signal-safe calls: the
 * driver has threads. */
static void keeper(const char *cmd)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    pid_t sh = fork();
    if (sh < 0) _exit(126);
    if (sh == 0) {
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (;;) {
        siginfo_t si;
        if (sigwaitinfo(&set, &si) < 0) continue;
        int status;
        if (si.si_signo == SIGCHLD) {
            if (waitpid(sh, &status, WNOHANG) != sh) continue;
            kill(-getpgrp(), SIGTERM); /* what the shell left behind */
            if (WIFSIGNALED(status)) _exit(128 + WTERMSIG(status));
            _exit(WEXITSTATUS(status));
        }
        kill(-getpgrp(), SIGTERM);
        struct timespec ts = {SERVICE_STOP_MS / 1000, 0};
        sigset_t chld;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        while (sigtimedwait(&chld, &si, &ts) >= 0)
            if (waitpid(sh, &status, WNOHANG) == sh) _exit(128 + SIGTERM);
        kill(-getpgrp(), SIGKILL);
        _exit(128 + SIGKILL);
    }
}

static pid_t spawn(const mj_services *ss, const service *s)
{
    char logf[PATH_MAX + 80] = "";
    if (ss->log_dir) snprintf(logf, sizeof logf, "%s/%s.log", ss->log_dir, s->name);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        /* on the service itself (direct exec) or on its keeper */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        int fd = logf[0] ? open(logf, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0644) : -1;
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        if (s->argv) {
            execvp(s->argv[0], s->argv);
            _exit(127);
        }
        keeper(s->command);
    }
    if (pid < 0) manta_fail(MANTA_ESYS, "service %s: fork: %s", s->name, strerror(errno));
    return pid;
}

static void describe_exit(char *out, size_t cap, int status)
{
    if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) > 128 && WEXITSTATUS(status) < 128 + 65)
        snprintf(out, cap, "was killed by signal %d", WEXITSTATUS(status) - 128);
    else
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
}

static const char *log_hint(const mj_services *ss, const service *s, char *buf, size_t cap)
{
    buf[0] = 0;
    if (ss->log_dir) snprintf(buf, cap, "; see %s/%s.log", ss->log_dir, s->name);
    return buf;
}

/* Wait until the service accepts connections on its port (if it has one). */
static int wait_port(mj_services *ss, service *s)
{
    int64_t until = manta_now_ms() + (int64_t)(s->ready_s * 1000);
    char hint[PATH_MAX + 80];
    while (s->port > 0 && !mj_port_open(s->port)) {
        int status;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            char how[64];
            describe_exit(how, sizeof how, status);
            return manta_fail(MANTA_ESPAWN, "service %s %s before it listened on port %d%s",
                              s->name, how, s->port, log_hint(ss, s, hint, sizeof hint));
        }
        if (ss->interrupt && *ss->interrupt)
            return manta_fail(MANTA_ECLOSED, "service %s: interrupted", s->name);
        if (manta_now_ms() > until)
            return manta_fail(MANTA_ESPAWN, "service %s did not come up on port %d within %g s%s",
                              s->name, s->port, s->ready_s, log_hint(ss, s, hint, sizeof hint));
        usleep(20000); /* another process binding a port: poll it */
    }
    return 0;
}

static int read_one(const manta_spec *spec, const manta_spec_node *it, service *s)
{
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    const char *name = NULL, *command = NULL, *restart = "on-failure";
    int64_t port = 0, maxr = DEFAULT_RESTARTS;
    s->ready_s = DEFAULT_SERVICE_UP_S;
    if (manta_spec_get_str(it, "name", NULL, &name, &errs) != 0 ||
        manta_spec_get_str(it, "command", NULL, &command, &errs) != 0 ||
        manta_spec_get_int(it, "port", 0, &port, &errs) < 0 ||
        manta_spec_get_double(it, "ready_timeout_s", DEFAULT_SERVICE_UP_S, &s->ready_s, &errs) <
            0 ||
        manta_spec_get_str(it, "restart", "on-failure", &restart, &errs) < 0 ||
        manta_spec_get_int(it, "max_restarts", DEFAULT_RESTARTS, &maxr, &errs) < 0) {
        if (!errs.count)
            manta_spec_errors_add(&errs, spec->file, it->line, it->col, "services",
                                  "each service needs a name and a command");
        int rc = mj_spec_fail(&errs, "services");
        manta_spec_errors_destroy(&errs);
        return rc;
    }
    manta_spec_errors_destroy(&errs);
    if (port < 0 || port > 65535)
        return manta_fail(MANTA_EINVAL, "service %s: port %lld is not 0..65535", name,
                          (long long)port);
    if (!strcmp(restart, "never"))
        s->restart = RESTART_NEVER;
    else if (!strcmp(restart, "on-failure"))
        s->restart = RESTART_ON_FAILURE;
    else if (!strcmp(restart, "always"))
        s->restart = RESTART_ALWAYS;
    else
        return manta_fail(MANTA_EINVAL,
                          "%s:%d:%d: service %s: restart is '%s'; expected never, on-failure or "
                          "always",
                          spec->file, it->line, it->col, name, restart);
    if (maxr < -1 || maxr > INT_MAX)
        return manta_fail(MANTA_EINVAL, "service %s: max_restarts %lld is not >= -1", name,
                          (long long)maxr);
    s->port = (int)port;
    s->max_restarts = (int)maxr;
    if (!(s->name = strdup(name)) || !(s->command = strdup(command)))
        return manta_fail(MANTA_ENOMEM, "service %s", name);
    s->argv = split_command(command);
    return 0;
}

int mj_services_start(const manta_spec *spec, const char *log_dir,
                      const volatile sig_atomic_t *interrupt, FILE *log, mj_services **out)
{
    *out = NULL;
    const manta_spec_node *seq = NULL;
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    if (manta_spec_get_seq(spec->root, "services", &seq, &errs) < 0) {
        int rc = mj_spec_fail(&errs, "services");
        manta_spec_errors_destroy(&errs);
        return rc;
    }
    manta_spec_errors_destroy(&errs);
    mj_services *ss = calloc(1, sizeof *ss);
    size_t n = seq ? manta_spec_len(seq) : 0;
    if (!ss || (n && !(ss->v = calloc(n, sizeof *ss->v)))) {
        free(ss);
        return manta_fail(MANTA_ENOMEM, "%zu services", n);
    }
    ss->log_dir = log_dir;
    ss->interrupt = interrupt;
    ss->log = log;
    *out = ss;
    for (size_t i = 0; i < n; i++) {
        service *s = &ss->v[ss->n++];
        int rc = read_one(spec, manta_spec_at(seq, i), s);
        if (rc) return rc;
        if (s->port > 0 && mj_port_open(s->port))
            return manta_fail(MANTA_ESPAWN,
                              "service %s: port %d is already taken by another process; stop it "
                              "or change the spec",
                              s->name, s->port);
        if ((s->pid = spawn(ss, s)) < 0) {
            s->pid = 0;
            return MANTA_ESYS;
        }
        if ((rc = wait_port(ss, s)) != 0) return rc;
        mj_say(log, "service %s started (pid %d)", s->name, (int)s->pid);
    }
    return 0;
}

/* Restart s after an exit; 0, or the error that makes it fatal. */
static int restart_one(mj_services *ss, service *s, const char *how)
{
    char hint[PATH_MAX + 80];
    s->restarts++;
    mj_say(ss->log, "service %s %s; restarting it (restart %d of %s)", s->name, how, s->restarts,
           s->max_restarts < 0 ? "unlimited" : "max_restarts");
    if ((s->pid = spawn(ss, s)) < 0) {
        s->pid = 0;
        return manta_fail(MANTA_ESPAWN, "service %s %s and could not be restarted: %s", s->name,
                          how, manta_last_error());
    }
    int rc = wait_port(ss, s);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", manta_last_error());
        return manta_fail(MANTA_ESPAWN, "service %s %s; its restart failed: %s%s", s->name, how,
                          why, log_hint(ss, s, hint, sizeof hint));
    }
    mj_say(ss->log, "service %s restarted (pid %d)", s->name, (int)s->pid);
    return 0;
}

int mj_services_watch(mj_services *ss)
{
    for (size_t i = 0; ss && i < ss->n; i++) {
        service *s = &ss->v[i];
        int status;
        if (s->pid <= 0 || waitpid(s->pid, &status, WNOHANG) != s->pid) continue;
        s->pid = 0;
        char how[64], hint[PATH_MAX + 80];
        describe_exit(how, sizeof how, status);
        bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (clean && s->restart == RESTART_ON_FAILURE) {
            mj_say(ss->log, "service %s %s%s", s->name, how, log_hint(ss, s, hint, sizeof hint));
            continue;
        }
        if (s->restart == RESTART_NEVER)
            return manta_fail(MANTA_EDIED, "service %s %s (restart: never): the job cannot go on%s",
                              s->name, how, log_hint(ss, s, hint, sizeof hint));
        if (s->max_restarts >= 0 && s->restarts >= s->max_restarts)
            return manta_fail(MANTA_EDIED,
                              "service %s %s after %d restart(s) (max_restarts %d): the job "
                              "cannot go on%s",
                              s->name, how, s->restarts, s->max_restarts,
                              log_hint(ss, s, hint, sizeof hint));
        int rc = restart_one(ss, s, how);
        if (rc) return rc;
    }
    return 0;
}

void mj_services_stop(mj_services *ss)
{
    if (!ss) return;
    for (size_t i = 0; i < ss->n; i++)
        if (ss->v[i].pid > 0) kill(-ss->v[i].pid, SIGTERM);
    int64_t until = manta_now_ms() + SERVICE_STOP_MS + 500; /* a keeper takes SERVICE_STOP_MS */
    for (size_t i = 0; i < ss->n; i++) {
        service *s = &ss->v[i];
        int status;
        while (s->pid > 0 && waitpid(s->pid, &status, WNOHANG) == 0 && manta_now_ms() < until)
            usleep(10000); /* a child's exit: nothing to poll but time */
        if (s->pid > 0 && waitpid(s->pid, &status, WNOHANG) == 0) {
            kill(-s->pid, SIGKILL);
            waitpid(s->pid, &status, 0);
        }
        free(s->name), free(s->command);
        for (size_t k = 0; s->argv && s->argv[k]; k++) free(s->argv[k]);
        free(s->argv);
    }
    free(ss->v);
    free(ss);
}
