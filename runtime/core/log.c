/*
 * log.c -- log lines: structured (one JSON object a line) in actors and
 * node agents, plain text in the driver.
 *
 * An actor's and a node agent's stderr go to RUN_DIR/logs/NAME.log, where
 * `manta logs` reads them; there every line is JSON with the time (UTC,
 * milliseconds), the process's role, its actor (or node) name and
 * incarnation, its pid, the level and the message:
 *
 *   {"time":"2026-11-30T23:05:01.123Z","role":"actor","actor":"rollout-0",
 *    "incarnation":1,"pid":4242,"level":"info","msg":"..."}
 *
 * The identity comes from the environment the node agent gives the
 * process (MANTA_ROLE, MANTA_NAME, MANTA_INCARNATION), so a line can be
 * written before and without a ctx (the runtime's own warnings, mn_log). In
 * the driver, whose stderr is the user's terminal, a line is plain text.
 * Lines below MANTA_LOG_LEVEL (debug, info, warn, error; default info;
 * `manta run --log-level`) are not written. Each line is one fputs of a
 * whole line, so lines of two threads never interleave.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const LEVEL_NAMES[] = {"debug", "info", "warn", "error"};

int manta_log_level_parse(const char *s, manta_log_level *out)
{
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, LEVEL_NAMES[i])) {
            *out = (manta_log_level)i;
            return 0;
        }
    return mn_fail(MANTA_EINVAL, "log level '%s': expected debug, info, warn or error",
                   s ? s : "(null)");
}

/* The threshold, read once: a bad value (only a hand-set variable can be;
 * the CLI checks --log-level) is said once and taken as info. */
static manta_log_level threshold(void)
{
    static int lvl = -1;
    if (lvl < 0) {
        manta_log_level l = MANTA_LOG_INFO;
        const char *e = getenv("MANTA_LOG_LEVEL");
        if (e && *e && manta_log_level_parse(e, &l) != 0)
            fprintf(stderr,
                    "manta[%d]: MANTA_LOG_LEVEL=%s is not debug, info, warn or error: "
                    "using info\n",
                    (int)getpid(), e);
        lvl = (int)l;
    }
    return (manta_log_level)lvl;
}

static void json_str(char **p, char *end, const char *s)
{
    for (; *s && *p < end - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            *(*p)++ = '\\', *(*p)++ = (char)c;
        else if (c == '\n')
            *(*p)++ = '\\', *(*p)++ = 'n';
        else if (c == '\t')
            *(*p)++ = '\\', *(*p)++ = 't';
        else if (c < 0x20)
            *p += snprintf(*p, (size_t)(end - *p), "\\u%04x", c);
        else
            *(*p)++ = (char)c;
    }
}

void mn_log_line(manta_log_level level, const char *msg)
{
    if (level < threshold()) return;
    const char *role = getenv("MANTA_ROLE");
    if (!role || (strcmp(role, "actor") && strcmp(role, "node"))) {
        fprintf(stderr, "manta[%d]: %s%s\n", (int)getpid(),
                level >= MANTA_LOG_WARN ? (level == MANTA_LOG_ERROR ? "error: " : "") : "", msg);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *name = getenv("MANTA_NAME"), *inc = getenv("MANTA_INCARNATION");
    char line[2400], *p = line, *end = line + sizeof line;
    p += snprintf(p, (size_t)(end - p),
                  "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"role\":\"%s\",\"actor\":\"",
                  tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  ts.tv_nsec / 1000000, role);
    json_str(&p, end, name ? name : "");
    p += snprintf(p, (size_t)(end - p),
                  "\",\"incarnation\":%d,\"pid\":%d,\"level\":\"%s\",\"msg\":\"",
                  inc ? atoi(inc) : 0, (int)getpid(), LEVEL_NAMES[level]);
    json_str(&p, end - 4, msg);
    memcpy(p, "\"}\n", 4);
    fputs(line, stderr);
    fflush(stderr);
}

void manta_log(manta_log_level level, const char *fmt, ...)
{
    if ((unsigned)level > MANTA_LOG_ERROR) level = MANTA_LOG_ERROR;
    if (level < threshold()) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mn_log_line(level, buf);
}
