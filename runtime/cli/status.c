/*
 * status.c -- the metrics tables of `manta status`: one row per actor with
 * the runtime's own figures (state, restarts, calls served and made,
 * failures, mailbox depth, latency percentiles), then one row per series
 * that the actors' classes publish (tokens, tool calls and errors by kind,
 * weight syncs ...); with -v every series.
 */
#include "cli_internal.h"
#include "manta_schema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Series the first table shows: left out of the second unless verbose. */
static const char *const RUNTIME_SERIES[] = {"calls_served_total",
                                             "casts_served_total",
                                             "calls_made_total",
                                             "casts_made_total",
                                             "call_failures_total",
                                             "method_errors_total",
                                             "rejected_messages_total",
                                             "mailbox_depth",
                                             "mailbox_backlog_max",
                                             "calls_pending",
                                             "call_served_seconds",
                                             "call_made_seconds",
                                             NULL};

static int runtime_series(const char *name)
{
    for (const char *const *r = RUNTIME_SERIES; *r; r++)
        if (!strcmp(*r, name)) return 1;
    return 0;
}

static double value_of(const manta_metrics *l, const char *name, const char *kind)
{
    const manta_metric *s = manta_metrics_find(l, name, kind);
    return s ? s->value : 0;
}

static double total_of(const manta_metrics *l, const char *name)
{
    double t = 0;
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name)) t += l->v[i].value;
    return t;
}

/* A duration for a table cell: "-" for none, "<0.1ms", "2.5ms", "1.2s". */
static void dur(char *out, size_t n, double s)
{
    if (isnan(s))
        snprintf(out, n, "-");
    else if (isinf(s))
        snprintf(out, n, ">60s");
    else if (s < 1)
        snprintf(out, n, "%.3gms", s * 1000);
    else
        snprintf(out, n, "%.3gs", s);
}

static void latency(char *out, size_t n, const manta_metrics *l, const char *name)
{
    const manta_metric *s = manta_metrics_find(l, name, NULL);
    char a[24], b[24];
    dur(a, sizeof a, manta_metric_quantile(s, 0.5));
    dur(b, sizeof b, manta_metric_quantile(s, 0.99));
    snprintf(out, n, "%s/%s", a, b);
}

static void series_row(FILE *out, const char *actor, const manta_metric *s)
{
    char name[2 * MANTA_METRIC_NAME_MAX + 4];
    if (s->kind[0])
        snprintf(name, sizeof name, "%s{%s}", s->name, s->kind);
    else
        snprintf(name, sizeof name, "%s", s->name);
    if (s->type != MANTA_METRIC_HISTOGRAM) {
        size_t nl = strlen(s->name);
        if (nl > 12 && !strcmp(s->name + nl - 12, "_bytes_total") && s->value >= 1024) {
            const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
            double v = s->value / 1024;
            int u = 0;
            while (v >= 1024 && u < 3) v /= 1024, u++;
            fprintf(out, "  %-16s %-36s %.1f %s\n", actor, name, v, unit[u]);
        } else if (s->value == floor(s->value) && fabs(s->value) < 1e15) {
            fprintf(out, "  %-16s %-36s %.0f\n", actor, name, s->value);
        } else {
            fprintf(out, "  %-16s %-36s %.4g\n", actor, name, s->value);
        }
        return;
    }
    char mean[24], p99[24];
    dur(mean, sizeof mean, s->count ? s->value / (double)s->count : NAN);
    dur(p99, sizeof p99, manta_metric_quantile(s, 0.99));
    fprintf(out, "  %-16s %-36s %llu, mean %s, p99 <=%s\n", actor, name,
            (unsigned long long)s->count, mean, p99);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void cli_status_metrics(manta_ctx *m, int verbose, FILE *out)
{
    manta_reg_names names;
    if (manta_reg_actor_names(m, &names) != 0) {
        fprintf(stderr, "manta status: actors: %s\n", manta_last_error());
        return;
    }
    qsort(names.v, names.n, sizeof *names.v, by_name);
    manta_metrics *all = calloc(names.n + 1, sizeof *all);
    if (!all) {
        manta_reg_names_free(&names);
        return;
    }
    /* latency: the upper bounds of the histogram buckets holding p50 and p99 */
    fprintf(out, "actors:\n  %-16s %-10s %8s %9s %9s %7s %7s %17s %17s\n", "NAME", "STATE",
            "RESTARTS", "SERVED", "MADE", "FAILED", "MAILBOX", "SERVED p50/p99", "MADE p50/p99");
    for (size_t i = 0; i < names.n; i++) {
        manta_reg_actor a;
        if (manta_reg_actor_read(m, names.v[i], &a) != 0) continue;
        manta_reg_metrics_read(m, names.v[i], &all[i]); /* none yet: an empty list */
        const manta_metrics *l = &all[i];
        char ls[40], lm[40];
        latency(ls, sizeof ls, l, "call_served_seconds");
        latency(lm, sizeof lm, l, "call_made_seconds");
        fprintf(out, "  %-16s %-10s %8d %9.0f %9.0f %7.0f %7.0f %17s %17s\n", names.v[i],
                manta_actor_state_name(a.info.state), a.info.restarts,
                value_of(l, "calls_served_total", NULL), value_of(l, "calls_made_total", NULL),
                total_of(l, "call_failures_total"), value_of(l, "mailbox_depth", NULL), ls, lm);
    }
    int header = 0;
    for (size_t i = 0; i < names.n; i++)
        for (size_t j = 0; j < all[i].n; j++) {
            if (!verbose && runtime_series(all[i].v[j].name)) continue;
            if (!header) fprintf(out, "metrics:\n  %-16s %-36s %s\n", "ACTOR", "SERIES", "VALUE");
            header = 1;
            series_row(out, names.v[i], &all[i].v[j]);
        }
    for (size_t i = 0; i < names.n; i++) manta_metrics_free(&all[i]);
    free(all);
    manta_reg_names_free(&names);
}
