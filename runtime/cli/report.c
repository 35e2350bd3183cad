/*
 * report.c -- the report of a run folder: plots from metrics.jsonl and
 * summary.json, and the short human summary `manta run` prints.
 *
 * A run folder (RUN_DIR) of an RL job holds what its controller writes
 * (actors/README.md): summary.json, and metrics.jsonl with one line per
 * policy version ({"version", "time_s", "reward", "success",
 * "trained_tokens_per_s", "gen_tokens_per_s", "staleness": [...], ...})
 * and one per held-out evaluation ({"eval": "initial" | "periodic" |
 * "final", "version", "heldout_success"}). From them, written by this
 * program (svg.c; nothing else needed to look at them):
 *
 *   reward.svg      mean reward of each version's batch
 *   success.svg     training success per version, held-out success points
 *   throughput.svg  trained and generated tokens per second
 *   staleness.svg   how many versions behind the trained episodes were
 *                   (summary.json's staleness_histogram, else the sum of
 *                   the per-version histograms)
 *
 * Unknown fields are ignored and missing ones leave gaps, so a folder of
 * an older or newer writer still gets the plots it can.
 */
#include "cli_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct vec {
    double *v;
    size_t n, cap;
} vec;

static int push(vec *a, double x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        double *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct run_data {
    vec version, reward, success, trained_tps, gen_tps; /* per version */
    vec eval_version, eval_success;                     /* per evaluation */
    double stale[64];
    size_t stale_bins;
} run_data;

static void run_data_free(run_data *d)
{
    vec *all[] = {&d->version, &d->reward,       &d->success,     &d->trained_tps,
                  &d->gen_tps, &d->eval_version, &d->eval_success};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->v);
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void add_hist(double *acc, size_t *bins, const cJSON *arr)
{
    if (!cJSON_IsArray(arr)) return;
    size_t i = 0;
    for (const cJSON *e = arr->child; e && i < 64; e = e->next, i++)
        if (cJSON_IsNumber(e)) acc[i] += e->valuedouble;
    if (i > *bins) *bins = i;
}

/* One line of metrics.jsonl. */
static int take_line(run_data *d, const cJSON *j, double *line_hist, size_t *line_bins)
{
    if (!cJSON_IsObject(j)) return -1;
    if (cJSON_GetObjectItemCaseSensitive(j, "eval")) {
        if (push(&d->eval_version, num(j, "version")) ||
            push(&d->eval_success, num(j, "heldout_success")))
            return -2;
        return 0;
    }
    if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "version"))) return 0;
    if (push(&d->version, num(j, "version")) || push(&d->reward, num(j, "reward")) ||
        push(&d->success, num(j, "success")) ||
        push(&d->trained_tps, num(j, "trained_tokens_per_s")) ||
        push(&d->gen_tps, num(j, "gen_tokens_per_s")))
        return -2;
    add_hist(line_hist, line_bins, cJSON_GetObjectItemCaseSensitive(j, "staleness"));
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf), fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int load(const char *run_dir, run_data *d, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return MANTA_ENOTFOUND;
    }
    double line_hist[64] = {0};
    size_t line_bins = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (n <= 1) continue;
        cJSON *j = cJSON_ParseWithLength(line, (size_t)n);
        int t = j ? take_line(d, j, line_hist, &line_bins) : -1;
        cJSON_Delete(j);
        if (t == -1) {
            snprintf(err, errlen, "%s:%d: not a JSON object", path, lineno);
            rc = MANTA_EJSON;
        } else if (t == -2) {
            snprintf(err, errlen, "%s: out of memory", path);
            rc = MANTA_ENOMEM;
        }
    }
    free(line);
    fclose(f);
    if (rc) return rc;
    /* The run's own histogram when summary.json has one, else the sum. */
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    char *txt = read_file(path, NULL);
    cJSON *s = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    const cJSON *h = s ? cJSON_GetObjectItemCaseSensitive(s, "staleness_histogram") : NULL;
    if (cJSON_IsArray(h)) {
        add_hist(d->stale, &d->stale_bins, h);
    } else {
        memcpy(d->stale, line_hist, sizeof line_hist);
        d->stale_bins = line_bins;
    }
    cJSON_Delete(s);
    /* trailing empty bins (the array has room for more than eta + 2) */
    while (d->stale_bins > 1 && d->stale[d->stale_bins - 1] == 0) d->stale_bins--;
    return 0;
}

static int plot(const char *run_dir, const char *file, int rc, int *made, char *err, size_t errlen,
                int (*draw)(const char *path, const run_data *d, char *err, size_t errlen),
                const run_data *d)
{
    if (rc) return rc;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", run_dir, file);
    rc = draw(path, d, err, errlen);
    if (rc == 0) ++*made;
    return rc;
}

static int draw_reward(const char *path, const run_data *d, char *err, size_t errlen)
{
    svg_series s = {
        "mean reward of the batch", "#d65f5f", d->version.v, d->reward.v, d->version.n, 0};
    return svg_line_chart(path, "Reward", "policy version", "reward", &s, 1, err, errlen);
}

static int draw_success(const char *path, const run_data *d, char *err, size_t errlen)
{
    svg_series s[2] = {
        {"training episodes", "#4878d0", d->version.v, d->success.v, d->version.n, 0},
        {"held-out", "#ee854a", d->eval_version.v, d->eval_success.v, d->eval_version.n, 1}};
    return svg_line_chart(path, "Success", "policy version", "success rate", s, 2, err, errlen);
}

static int draw_throughput(const char *path, const run_data *d, char *err, size_t errlen)
{
    svg_series s[2] = {
        {"trained tokens/s", "#6acc64", d->version.v, d->trained_tps.v, d->version.n, 0},
        {"generated tokens/s", "#956cb4", d->version.v, d->gen_tps.v, d->version.n, 0}};
    return svg_line_chart(path, "Throughput", "policy version", "tokens per second", s, 2, err,
                          errlen);
}

static int draw_staleness(const char *path, const run_data *d, char *err, size_t errlen)
{
    char names[64][16];
    const char *labels[64];
    for (size_t i = 0; i < d->stale_bins; i++) {
        snprintf(names[i], sizeof names[i], "%zu", i);
        labels[i] = names[i];
    }
    return svg_bar_chart(path, "Staleness of trained episodes",
                         "versions behind the trained policy", "episodes", labels, d->stale,
                         d->stale_bins, err, errlen);
}

int cli_report_write(const char *run_dir, int *made, char *err, size_t errlen)
{
    int n = 0;
    run_data d = {0};
    int rc = load(run_dir, &d, err, errlen);
    rc = plot(run_dir, "reward.svg", rc, &n, err, errlen, draw_reward, &d);
    rc = plot(run_dir, "success.svg", rc, &n, err, errlen, draw_success, &d);
    rc = plot(run_dir, "throughput.svg", rc, &n, err, errlen, draw_throughput, &d);
    rc = plot(run_dir, "staleness.svg", rc, &n, err, errlen, draw_staleness, &d);
    run_data_free(&d);
    if (made) *made = n;
    return rc;
}

/* ---- the human summary ---- */

static void pct(FILE *out, double v)
{
    if (isfinite(v) && v >= 0)
        fprintf(out, "%.1f%%", 100 * v);
    else
        fprintf(out, "n/a");
}

int cli_report_summary(const char *answer, size_t len, FILE *out)
{
    cJSON *j = cJSON_ParseWithLength(answer, len);
    if (!cJSON_IsObject(j) || !cJSON_GetObjectItemCaseSensitive(j, "heldout_success_final")) {
        cJSON_Delete(j);
        return -1;
    }
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(j, "status");
    const cJSON *led = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    const cJSON *bal = led ? cJSON_GetObjectItemCaseSensitive(led, "balanced") : NULL;
    fprintf(out, "%s: held-out success ", cJSON_IsString(status) ? status->valuestring : "done");
    pct(out, num(j, "heldout_success_initial"));
    fprintf(out, " -> ");
    pct(out, num(j, "heldout_success_final"));
    double problems = num(j, "heldout_problems"), versions = num(j, "versions");
    if (isfinite(problems)) fprintf(out, " (%.0f problems)", problems);
    fprintf(out, "; %.0f versions in %.1f s\n", isfinite(versions) ? versions : 0,
            isfinite(num(j, "wall_s")) ? num(j, "wall_s") : 0);
    if (led) {
        fprintf(out,
                "ledger %s: admitted %.0f = trained %.0f + dropped stale %.0f + dropped error "
                "%.0f + in flight %.0f\n",
                cJSON_IsTrue(bal) ? "balanced" : "NOT balanced", num(led, "admitted"),
                num(led, "trained"), num(led, "dropped_stale"), num(led, "dropped_error"),
                num(led, "in_flight"));
    }
    cJSON_Delete(j);
    return 0;
}
