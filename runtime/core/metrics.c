/*
 * metrics.c -- an actor's counters, gauges and histograms, and their record
 * in the registry.
 *
 * Every process keeps a small table of series (name, kind, value; for a
 * histogram the count, the sum and one count per bucket). The runtime fills
 * its own (the latency of calls served and made, the mailbox backlog) as
 * calls come and go; a class adds its own with manta_metric_add / _set /
 * _observe (manta.h). With each heartbeat (once a second) an actor writes
 * the whole table, together with the counters of manta_stats, as one text
 * record to manta:JOB:metrics:NAME on the loop's asynchronous Redis link:
 * a slow Redis never stalls the mailbox, and a lost record is replaced by
 * the next one. Readers (`manta status`, the head's Prometheus endpoint)
 * parse it back with manta_metrics_parse (manta_schema.h).
 *
 * The record is text, one series a line, so that `redis-cli GET` shows it:
 *
 *     c NAME KIND VALUE                          counter
 *     g NAME KIND VALUE                          gauge
 *     h NAME KIND COUNT SUM B0 B1 ... B17        histogram (per-bucket counts)
 *
 * KIND is "-" for none. Histograms take durations in seconds; their bucket
 * bounds are manta_metric_bounds (0.1 ms .. 60 s) and the last bucket holds
 * what is above the top bound.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double manta_metric_bounds[MANTA_METRIC_BUCKETS - 1] = {
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

/* A process holds at most this many series: a class that makes names
 * from data (one per prompt, say) is told so instead of growing without
 * bound. */
#define MAX_SERIES 256

struct mn_metrics {
    manta_metric *v;
    size_t n, cap;
    double backlog_max; /* most messages found waiting at one wake-up, this second */
};

double mn_metrics_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int valid_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > MANTA_METRIC_NAME_MAX || (s[0] >= '0' && s[0] <= '9')) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

static int valid_kind(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MANTA_METRIC_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':' || c == '/'))
            return 0;
    }
    return 1;
}

static mn_metrics *table(manta_ctx *m)
{
    if (!m->metrics) m->metrics = calloc(1, sizeof *m->metrics);
    return m->metrics;
}

/* The series (type, name, kind) of this process, made on first use. */
static manta_metric *series(manta_ctx *m, manta_metric_type type, const char *name,
                            const char *kind, int *rc)
{
    *rc = 0;
    if (!m) {
        *rc = mn_fail(MANTA_EINVAL, "metric: no ctx");
        return NULL;
    }
    if (!valid_name(name)) {
        *rc = mn_fail(MANTA_EINVAL,
                      "metric name '%s': expected 1..%d of [a-z0-9_], not a digit first",
                      name ? name : "(null)", MANTA_METRIC_NAME_MAX);
        return NULL;
    }
    if (!kind) kind = "";
    if (*kind && !valid_kind(kind)) {
        *rc = mn_fail(MANTA_EINVAL, "metric %s: kind '%s': expected 1..%d of [A-Za-z0-9_.:/-]",
                      name, kind, MANTA_METRIC_NAME_MAX);
        return NULL;
    }
    mn_metrics *t = table(m);
    if (!t) {
        *rc = mn_fail(MANTA_ENOMEM, "metric %s: out of memory", name);
        return NULL;
    }
    for (size_t i = 0; i < t->n; i++) {
        manta_metric *s = &t->v[i];
        if (strcmp(s->name, name) || strcmp(s->kind, kind)) continue;
        if (s->type != type) {
            *rc = mn_fail(MANTA_EINVAL, "metric %s: already a %s", name,
                          s->type == MANTA_METRIC_COUNTER ? "counter"
                          : s->type == MANTA_METRIC_GAUGE ? "gauge"
                                                          : "histogram");
            return NULL;
        }
        return s;
    }
    if (t->n == MAX_SERIES) {
        *rc = mn_fail(MANTA_EBUSY, "metric %s{%s}: this process has %d series already", name, kind,
                      MAX_SERIES);
        return NULL;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        manta_metric *v = realloc(t->v, cap * sizeof *v);
        if (!v) {
            *rc = mn_fail(MANTA_ENOMEM, "metric %s: out of memory", name);
            return NULL;
        }
        t->v = v, t->cap = cap;
    }
    manta_metric *s = &t->v[t->n++];
    memset(s, 0, sizeof *s);
    s->type = type;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->kind, sizeof s->kind, "%s", kind);
    return s;
}

int manta_metric_add(manta_ctx *m, const char *name, const char *kind, double v)
{
    int rc;
    if (!(v >= 0))
        return mn_fail(MANTA_EINVAL, "metric %s: a counter only grows (got %g)", name, v);
    manta_metric *s = series(m, MANTA_METRIC_COUNTER, name, kind, &rc);
    if (s) s->value += v;
    return rc;
}

int manta_metric_set(manta_ctx *m, const char *name, const char *kind, double v)
{
    int rc;
    manta_metric *s = series(m, MANTA_METRIC_GAUGE, name, kind, &rc);
    if (s) s->value = v;
    return rc;
}

int manta_metric_observe(manta_ctx *m, const char *name, const char *kind, double seconds)
{
    int rc;
    if (!isfinite(seconds))
        return mn_fail(MANTA_EINVAL, "metric %s: not a number of seconds", name);
    manta_metric *s = series(m, MANTA_METRIC_HISTOGRAM, name, kind, &rc);
    if (!s) return rc;
    int b = 0;
    while (b < MANTA_METRIC_BUCKETS - 1 && seconds > manta_metric_bounds[b]) b++;
    s->buckets[b]++;
    s->count++;
    s->value += seconds;
    return 0;
}

/* ---- the runtime's own ---- */

void mn_metrics_served(manta_ctx *m, double t0)
{
    manta_metric_observe(m, "call_served_seconds", NULL, mn_metrics_clock() - t0);
}

void mn_metrics_made(manta_ctx *m, double t0)
{
    manta_metric_observe(m, "call_made_seconds", NULL, mn_metrics_clock() - t0);
}

void mn_metrics_backlog(manta_ctx *m, int n)
{
    mn_metrics *t = table(m);
    if (t && n > t->backlog_max) t->backlog_max = n;
}

void mn_metrics_free(manta_ctx *m)
{
    if (!m || !m->metrics) return;
    free(m->metrics->v);
    free(m->metrics);
    m->metrics = NULL;
}

/* ---- the record ---- */

typedef struct text {
    char *p;
    size_t len, cap;
    int oom;
} text;

static void emit(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(text *t, const char *fmt, ...)
{
    if (t->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->p = p, t->cap = cap;
    }
}

static void emit_series(text *t, const manta_metric *s)
{
    const char *kind = s->kind[0] ? s->kind : "-";
    if (s->type != MANTA_METRIC_HISTOGRAM) {
        emit(t, "%c %s %s %.17g\n", s->type == MANTA_METRIC_COUNTER ? 'c' : 'g', s->name, kind,
             s->value);
        return;
    }
    emit(t, "h %s %s %llu %.17g", s->name, kind, (unsigned long long)s->count, s->value);
    for (int b = 0; b < MANTA_METRIC_BUCKETS; b++)
        emit(t, " %llu", (unsigned long long)s->buckets[b]);
    emit(t, "\n");
}

static void emit_count(text *t, const char *name, const char *kind, uint64_t v)
{
    emit(t, "c %s %s %llu\n", name, kind, (unsigned long long)v);
}

/* The counters of manta_stats, the mailbox gauges, then the table. */
static void build_record(manta_ctx *m, text *t)
{
    const manta_stats *st = &m->stats;
    emit_count(t, "calls_served_total", "-", st->calls_served);
    emit_count(t, "casts_served_total", "-", st->casts_served);
    emit_count(t, "calls_made_total", "-", st->calls_sent);
    emit_count(t, "casts_made_total", "-", st->casts_sent);
    emit_count(t, "call_failures_total", "timeout", st->timeouts);
    emit_count(t, "call_failures_total", "died", st->died);
    emit_count(t, "call_failures_total", "error", st->replies_error);
    emit_count(t, "method_errors_total", "-", st->method_errors);
    emit_count(t, "rejected_messages_total", "envelope", st->bad_envelopes);
    emit_count(t, "rejected_messages_total", "version", st->bad_versions);
    emit_count(t, "rejected_messages_total", "oversized", st->oversized);
    emit_count(t, "rejected_messages_total", "unknown_method", st->unknown_methods);
    emit(t, "g mailbox_depth - %zu\n", (size_t)m->depth + mn_deferred_count(m));
    emit(t, "g mailbox_backlog_max - %.17g\n", m->metrics ? m->metrics->backlog_max : 0.0);
    emit(t, "g calls_pending - %zu\n", m->pending);
    if (!m->metrics) return;
    m->metrics->backlog_max = 0;
    for (size_t i = 0; i < m->metrics->n; i++) emit_series(t, &m->metrics->v[i]);
}

void mn_metrics_publish(manta_ctx *m)
{
    text t = {0};
    build_record(m, &t);
    if (!t.oom && t.p) manta_reg_metrics_publish_async(m, m->self, t.p, t.len);
    free(t.p);
}

int manta_metrics_record(manta_ctx *m, char **out, size_t *len)
{
    if (!m || !out || !len) return mn_fail(MANTA_EINVAL, "manta_metrics_record: bad arguments");
    text t = {0};
    build_record(m, &t);
    if (t.oom || !t.p) {
        free(t.p);
        return mn_fail(MANTA_ENOMEM, "metrics record: out of memory");
    }
    *out = t.p, *len = t.len;
    return 0;
}

/* ---- reading a record back ---- */

void manta_metrics_free(manta_metrics *l)
{
    if (!l) return;
    free(l->v);
    l->v = NULL, l->n = 0;
}

static int parse_line(const char *line, manta_metric *s)
{
    memset(s, 0, sizeof *s);
    char type, name[80], kind[80];
    int used = 0;
    if (sscanf(line, "%c %79s %79s %n", &type, name, kind, &used) != 3 || used == 0) return -1;
    if (!valid_name(name) || (strcmp(kind, "-") && !valid_kind(kind))) return -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->kind, sizeof s->kind, "%s", strcmp(kind, "-") ? kind : "");
    const char *p = line + used;
    char *end;
    if (type == 'c' || type == 'g') {
        s->type = type == 'c' ? MANTA_METRIC_COUNTER : MANTA_METRIC_GAUGE;
        s->value = strtod(p, &end);
        return end == p ? -1 : 0;
    }
    if (type != 'h') return -1;
    s->type = MANTA_METRIC_HISTOGRAM;
    s->count = strtoull(p, &end, 10);
    if (end == p) return -1;
    p = end;
    s->value = strtod(p, &end);
    if (end == p) return -1;
    for (int b = 0; b < MANTA_METRIC_BUCKETS; b++) {
        p = end;
        s->buckets[b] = strtoull(p, &end, 10);
        if (end == p) return -1;
    }
    return 0;
}

int manta_metrics_parse(const char *txt, size_t len, manta_metrics *out)
{
    if (!txt || !out) return mn_fail(MANTA_EINVAL, "manta_metrics_parse: bad arguments");
    out->v = NULL, out->n = 0;
    size_t cap = 0;
    const char *p = txt, *end = txt + len;
    int lineno = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        lineno++;
        char line[1024];
        if (n >= sizeof line) {
            manta_metrics_free(out);
            return mn_fail(MANTA_EPROTO, "metrics record line %d: longer than %zu bytes", lineno,
                           sizeof line - 1);
        }
        memcpy(line, p, n), line[n] = 0;
        p += n + (nl != NULL);
        if (n == 0) continue;
        if (out->n == cap) {
            cap = cap ? cap * 2 : 32;
            manta_metric *v = realloc(out->v, cap * sizeof *v);
            if (!v) {
                manta_metrics_free(out);
                return mn_fail(MANTA_ENOMEM, "metrics record: out of memory");
            }
            out->v = v;
        }
        if (parse_line(line, &out->v[out->n]) != 0) {
            manta_metrics_free(out);
            return mn_fail(MANTA_EPROTO, "metrics record line %d: not a series: %.80s", lineno,
                           line);
        }
        out->n++;
    }
    return 0;
}

const manta_metric *manta_metrics_find(const manta_metrics *l, const char *name, const char *kind)
{
    for (size_t i = 0; l && i < l->n; i++)
        if (!strcmp(l->v[i].name, name) && !strcmp(l->v[i].kind, kind ? kind : "")) return &l->v[i];
    return NULL;
}

double manta_metric_quantile(const manta_metric *s, double q)
{
    if (!s || s->type != MANTA_METRIC_HISTOGRAM || s->count == 0) return NAN;
    double want = q * (double)s->count, seen = 0;
    for (int b = 0; b < MANTA_METRIC_BUCKETS; b++) {
        seen += (double)s->buckets[b];
        if (seen >= want && s->buckets[b])
            return b < MANTA_METRIC_BUCKETS - 1 ? manta_metric_bounds[b] : INFINITY;
    }
    return INFINITY;
}
