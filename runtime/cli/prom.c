/*
 * prom.c -- a job's metrics in the Prometheus text exposition format
 * (version 0.0.4), as the head serves them on GET /metrics.
 *
 * It reads the registry as it is at the call: every actor's directory
 * record (state, restarts, group, class) and metrics record (metrics.c in
 * runtime/core), and writes one family per metric name, each family's
 * series together under one # HELP and one # TYPE line, as the format
 * requires. Every series has the labels job, actor, group and class; a
 * series with a kind has kind="..." too. Names get the prefix manta_. Two
 * actors that publish one name with two types: the first type (in actor
 * order) wins and the other series are left out, so the output always
 * parses.
 */
#include "cli_internal.h"
#include "manta_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct actor_row {
    char *name;
    manta_reg_actor rec;
    manta_metrics metrics;
} actor_row;

void cli_buf_printf(cli_buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->p ? b->cap - b->len : 0;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 8192) + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
}

static const struct {
    const char *name, *help;
} HELP[] = {
    {"calls_served_total", "Calls this actor answered or is serving."},
    {"casts_served_total", "One-way messages this actor served."},
    {"calls_made_total", "Calls this actor made to other actors."},
    {"casts_made_total", "One-way messages this actor sent."},
    {"call_failures_total", "Calls made that failed, by kind (timeout, died, error)."},
    {"method_errors_total", "Methods of this actor that returned an error."},
    {"rejected_messages_total", "Messages the mailbox refused, by kind."},
    {"mailbox_depth", "Calls in service or waiting in the deferred queue."},
    {"mailbox_backlog_max", "Most messages found waiting at one wake-up in the last second."},
    {"calls_pending", "Calls this actor made that are still in flight."},
    {"call_served_seconds", "Time from receiving a call to answering it."},
    {"call_made_seconds", "Time from making a call to its resolution."},
    {"tokens_generated_total", "Tokens sampled by the policy (rollout)."},
    {"tokens_trained_total", "Tokens trained on (learner)."},
    {"tool_calls_total", "Tool calls, by tool."},
    {"tool_errors_total", "Tool calls that failed, by error kind."},
    {"weight_sync_seconds", "Time to fetch and load, or to publish, one policy version."},
    {"weight_sync_bytes_total", "Bytes of policy weights fetched or published."},
};

static const char *help_of(const char *name)
{
    for (size_t i = 0; i < sizeof HELP / sizeof HELP[0]; i++)
        if (!strcmp(HELP[i].name, name)) return HELP[i].help;
    return "Published by the actor's class.";
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(cli_buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            cli_buf_printf(b, "\\\\");
        else if (*v == '"')
            cli_buf_printf(b, "\\\"");
        else if (*v == '\n')
            cli_buf_printf(b, "\\n");
        else
            cli_buf_printf(b, "%c", *v);
    }
}

static void labels(cli_buf *b, const char *job, const actor_row *a, const char *kind,
                   const char *le)
{
    cli_buf_printf(b, "{job=\"");
    label_value(b, job);
    cli_buf_printf(b, "\",actor=\"");
    label_value(b, a->name);
    cli_buf_printf(b, "\",group=\"");
    label_value(b, a->rec.group);
    cli_buf_printf(b, "\",class=\"");
    label_value(b, a->rec.cls);
    cli_buf_printf(b, "\"");
    if (kind && *kind) {
        cli_buf_printf(b, ",kind=\"");
        label_value(b, kind);
        cli_buf_printf(b, "\"");
    }
    if (le) cli_buf_printf(b, ",le=\"%s\"", le);
    cli_buf_printf(b, "}");
}

static void value(cli_buf *b, double v)
{
    if (isnan(v))
        cli_buf_printf(b, " NaN\n");
    else if (isinf(v))
        cli_buf_printf(b, " %sInf\n", v > 0 ? "+" : "-");
    else
        cli_buf_printf(b, " %.15g\n", v);
}

static const char *type_name(manta_metric_type t)
{
    return t == MANTA_METRIC_COUNTER ? "counter" : t == MANTA_METRIC_GAUGE ? "gauge" : "histogram";
}

static void series(cli_buf *b, const char *job, const actor_row *a, const manta_metric *s)
{
    if (s->type != MANTA_METRIC_HISTOGRAM) {
        cli_buf_printf(b, "manta_%s", s->name);
        labels(b, job, a, s->kind, NULL);
        value(b, s->value);
        return;
    }
    uint64_t cum = 0;
    for (int k = 0; k < MANTA_METRIC_BUCKETS; k++) {
        cum += s->buckets[k];
        char le[32];
        if (k < MANTA_METRIC_BUCKETS - 1)
            snprintf(le, sizeof le, "%g", manta_metric_bounds[k]);
        else
            snprintf(le, sizeof le, "+Inf");
        cli_buf_printf(b, "manta_%s_bucket", s->name);
        labels(b, job, a, s->kind, le);
        value(b, (double)cum);
    }
    cli_buf_printf(b, "manta_%s_sum", s->name);
    labels(b, job, a, s->kind, NULL);
    value(b, s->value);
    cli_buf_printf(b, "manta_%s_count", s->name);
    labels(b, job, a, s->kind, NULL);
    value(b, (double)s->count);
}

static int by_name(const void *x, const void *y)
{
    return strcmp(((const actor_row *)x)->name, ((const actor_row *)y)->name);
}

/* One family: every actor's series of `name` with type `t`. */
static void family(cli_buf *b, const char *job, const actor_row *rows, size_t n, const char *name,
                   manta_metric_type t)
{
    cli_buf_printf(b, "# HELP manta_%s %s\n# TYPE manta_%s %s\n", name, help_of(name), name,
                   type_name(t));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < rows[i].metrics.n; j++) {
            const manta_metric *s = &rows[i].metrics.v[j];
            if (s->type == t && !strcmp(s->name, name)) series(b, job, &rows[i], s);
        }
}

/* Has a family of this name been written already (a series before it)? */
static int seen_before(const actor_row *rows, size_t i, size_t j, const char *name)
{
    for (size_t a = 0; a <= i; a++)
        for (size_t k = 0; k < (a == i ? j : rows[a].metrics.n); k++)
            if (!strcmp(rows[a].metrics.v[k].name, name)) return 1;
    return 0;
}

int cli_prom_render(manta_ctx *m, cli_buf *b)
{
    manta_reg_names names;
    int rc = manta_reg_actor_names(m, &names);
    if (rc) return rc;
    actor_row *rows = calloc(names.n + 1, sizeof *rows);
    if (!rows) {
        manta_reg_names_free(&names);
        return MANTA_ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < names.n; i++) {
        actor_row *r = &rows[n];
        if (manta_reg_actor_read(m, names.v[i], &r->rec) != 0) continue;
        r->name = names.v[i];
        if (manta_reg_metrics_read(m, r->name, &r->metrics) != 0) r->metrics.n = 0;
        n++;
    }
    qsort(rows, n, sizeof *rows, by_name);
    const char *job = manta_job(m);
    cli_buf_printf(b, "# HELP manta_actor_up 1 when the actor is alive.\n"
                      "# TYPE manta_actor_up gauge\n");
    for (size_t i = 0; i < n; i++) {
        cli_buf_printf(b, "manta_actor_up");
        labels(b, job, &rows[i], NULL, NULL);
        value(b, rows[i].rec.info.state == MANTA_ACTOR_ALIVE);
    }
    cli_buf_printf(b, "# HELP manta_actor_restarts_total Times the node agent restarted it.\n"
                      "# TYPE manta_actor_restarts_total counter\n");
    for (size_t i = 0; i < n; i++) {
        cli_buf_printf(b, "manta_actor_restarts_total");
        labels(b, job, &rows[i], NULL, NULL);
        value(b, rows[i].rec.info.restarts);
    }
    /* Families in the order of first appearance: each name once, with the
     * type of its first series. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < rows[i].metrics.n; j++) {
            const manta_metric *s = &rows[i].metrics.v[j];
            if (!seen_before(rows, i, j, s->name)) family(b, job, rows, n, s->name, s->type);
        }
    for (size_t i = 0; i < n; i++) manta_metrics_free(&rows[i].metrics);
    free(rows);
    manta_reg_names_free(&names);
    return b->oom ? MANTA_ENOMEM : 0;
}
