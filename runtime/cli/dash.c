/*
 * dash.c -- the data of the web dashboard: the JSON documents its page
 * polls (GET /api/job, /api/actors, /api/curves, /api/errors), read from
 * the registry, the job's progress record and the actors' log files at
 * each request, on the ctx's thread (httpd.c serves them).
 *
 * The curves are the history of the job value `progress` (cli_internal.h)
 * as the head saw it: a timer reads the record every SAMPLE_MS and keeps
 * one point per step, with every field whose text starts with a number
 * ("0.412", "84.0%", "12.3k tok/s", "3 of 40") as a value. So the page
 * plots what the job chose to show on its progress line, and the CLI still
 * knows nothing of what a step is. A step shorter than SAMPLE_MS may be
 * missed (its neighbours are kept); at MAX_POINTS points every other one is
 * dropped, so a long run keeps its whole shape in bounded memory.
 *
 * Recent errors are the tool error counts by kind (the metric
 * tool_errors_total) and the last lines of the actors' logs (RUN_DIR/logs/
 * *.log, JSON lines of runtime/core/log.c) at level warn or error, or whose
 * message mentions an error, each file read from its last TAIL_BYTES only.
 */
#include "cli_internal.h"
#include "manta_schema.h"
#include "manta_spec.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SAMPLE_MS  100
#define MAX_POINTS 2048
#define MAX_SERIES 16
#define TAIL_BYTES (64 * 1024)
#define MAX_RECENT 30

typedef struct series {
    char label[48], unit[16];
    double *v; /* MAX_POINTS values, NAN where the field was absent */
} series;

struct cli_dash {
    manta_ctx *m;
    const manta_spec *spec;
    char run_dir[PATH_MAX], logs[PATH_MAX];
    int64_t t0;                 /* manta_now_ms when the job started */
    double first_s, first_step; /* the first step seen, and when: for the ETA */
    uint64_t timer;
    char unit[32];
    double *step, *time_s; /* MAX_POINTS each */
    size_t n;
    series s[MAX_SERIES];
    size_t ns;
};

/* ---- the progress history ---- */

/* The number a field's text starts with, and its unit: "12.3k tok/s" is
 * 12300 "tok/s", "84.0%" is 84 "%", "3 of 40" is 3 "". NAN for text that
 * starts with no number. */
static double field_value(const char *t, char *unit, size_t un)
{
    char *end;
    double v = strtod(t, &end);
    unit[0] = 0;
    if (end == t || !isfinite(v)) return NAN;
    if (*end == 'k' || *end == 'M' || *end == 'G')
        v *= *end == 'k' ? 1e3 : *end == 'M' ? 1e6 : 1e9, end++;
    if (*end == '%') {
        snprintf(unit, un, "%%");
    } else if (*end == ' ' && end[1] && !strpbrk(end + 1, "0123456789 ")) {
        snprintf(unit, un, "%s", end + 1);
    }
    return v;
}

static series *series_of(cli_dash *d, const char *label)
{
    for (size_t i = 0; i < d->ns; i++)
        if (!strcmp(d->s[i].label, label)) return &d->s[i];
    if (d->ns == MAX_SERIES) return NULL;
    series *s = &d->s[d->ns];
    if (!(s->v = malloc(MAX_POINTS * sizeof *s->v))) return NULL;
    for (size_t i = 0; i < MAX_POINTS; i++) s->v[i] = NAN;
    snprintf(s->label, sizeof s->label, "%s", label);
    d->ns++;
    return s;
}

/* Full: keep every other point (the first and the last stay). */
static void thin(cli_dash *d)
{
    size_t k = 0;
    for (size_t i = 0; i < d->n; i += 2, k++) {
        d->step[k] = d->step[i], d->time_s[k] = d->time_s[i];
        for (size_t j = 0; j < d->ns; j++) d->s[j].v[k] = d->s[j].v[i];
    }
    for (size_t i = k; i < MAX_POINTS; i++)
        for (size_t j = 0; j < d->ns; j++) d->s[j].v[i] = NAN;
    d->n = k;
}

/* One progress record: a new point when its step moved on, or the last
 * point updated (a field such as held-out success can change within one
 * step). */
void cli_dash_record(cli_dash *d, const char *text, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
    if (!cJSON_IsNumber(step)) {
        cJSON_Delete(j);
        return;
    }
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(j, "unit");
    snprintf(d->unit, sizeof d->unit, "%s", cJSON_IsString(unit) ? unit->valuestring : "step");
    if (!d->n || d->step[d->n - 1] != step->valuedouble) {
        if (d->n && step->valuedouble < d->step[d->n - 1]) d->n = 0; /* a new run */
        if (!d->n)
            d->first_s = (double)(manta_now_ms() - d->t0) / 1000, d->first_step = step->valuedouble;
        if (d->n == MAX_POINTS) thin(d);
        d->n++;
        for (size_t i = 0; i < d->ns; i++) d->s[i].v[d->n - 1] = NAN;
    }
    size_t at = d->n - 1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "time_s");
    d->step[at] = step->valuedouble;
    d->time_s[at] = cJSON_IsNumber(t) ? t->valuedouble : NAN;
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(j, "fields");
    for (const cJSON *f = cJSON_IsArray(fields) ? fields->child : NULL; f; f = f->next) {
        const cJSON *k = cJSON_GetArrayItem(f, 0), *v = cJSON_GetArrayItem(f, 1);
        if (!cJSON_IsString(k) || !cJSON_IsString(v)) continue;
        char u[16];
        double x = field_value(v->valuestring, u, sizeof u);
        series *s = isfinite(x) ? series_of(d, k->valuestring) : NULL;
        if (!s) continue;
        s->v[at] = x;
        snprintf(s->unit, sizeof s->unit, "%s", u);
    }
    cJSON_Delete(j);
}

static void sample(void *arg)
{
    cli_dash *d = arg;
    void *v;
    size_t n;
    if (manta_kv_get(d->m, "progress", &v, &n) == 0) {
        cli_dash_record(d, v, n);
        free(v);
    }
    d->timer = manta_timer_add(d->m, SAMPLE_MS, sample, d);
}

cli_dash *cli_dash_new(manta_ctx *m, const manta_spec *spec, const char *run_dir,
                       const char *logs_dir)
{
    cli_dash *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->step = malloc(MAX_POINTS * sizeof *d->step);
    d->time_s = malloc(MAX_POINTS * sizeof *d->time_s);
    if (!d->step || !d->time_s) {
        cli_dash_free(d);
        return NULL;
    }
    d->m = m, d->spec = spec, d->t0 = manta_now_ms();
    snprintf(d->run_dir, sizeof d->run_dir, "%s", run_dir ? run_dir : "");
    snprintf(d->logs, sizeof d->logs, "%s", logs_dir ? logs_dir : "");
    snprintf(d->unit, sizeof d->unit, "step");
    if (m) d->timer = manta_timer_add(m, SAMPLE_MS, sample, d);
    return d;
}

void cli_dash_free(cli_dash *d)
{
    if (!d) return;
    if (d->timer) manta_timer_cancel(d->m, d->timer);
    for (size_t i = 0; i < d->ns; i++) free(d->s[i].v);
    free(d->step);
    free(d->time_s);
    free(d);
}

/* ---- the documents ---- */

static cJSON *num_or_null(double v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static cJSON *curves(const cli_dash *d)
{
    cJSON *j = cJSON_CreateObject(), *steps = cJSON_AddArrayToObject(j, "steps"),
          *times = cJSON_AddArrayToObject(j, "time_s"), *ss = cJSON_AddArrayToObject(j, "series");
    cJSON_AddStringToObject(j, "unit", d->unit);
    for (size_t i = 0; i < d->n; i++) {
        cJSON_AddItemToArray(steps, cJSON_CreateNumber(d->step[i]));
        cJSON_AddItemToArray(times, num_or_null(d->time_s[i]));
    }
    for (size_t k = 0; k < d->ns; k++) {
        cJSON *s = cJSON_CreateObject(), *v = cJSON_AddArrayToObject(s, "values");
        cJSON_AddStringToObject(s, "label", d->s[k].label);
        cJSON_AddStringToObject(s, "unit", d->s[k].unit);
        for (size_t i = 0; i < d->n; i++) cJSON_AddItemToArray(v, num_or_null(d->s[k].v[i]));
        cJSON_AddItemToArray(ss, s);
    }
    return j;
}

static cJSON *job(const cli_dash *d)
{
    cJSON *j = cJSON_CreateObject();
    double elapsed = (double)(manta_now_ms() - d->t0) / 1000;
    cJSON_AddStringToObject(j, "job", manta_job(d->m));
    cJSON_AddStringToObject(j, "run_dir", d->run_dir);
    cJSON_AddNumberToObject(j, "elapsed_s", elapsed);
    void *v = NULL;
    size_t n = 0;
    int rc = manta_kv_get(d->m, "progress", &v, &n);
    cJSON *rec = rc == 0 ? cJSON_ParseWithLength(v, n) : NULL;
    char line[1024];
    cli_progress_format(rc == 0 ? v : NULL, n, elapsed, d->n ? d->first_s : -1, d->first_step, line,
                        sizeof line);
    cJSON_AddStringToObject(j, "line", line);
    cJSON_AddItemToObject(j, "progress", rec ? rec : cJSON_CreateNull());
    free(v);
    cJSON *nodes = cJSON_AddArrayToObject(j, "nodes");
    manta_reg_node_list nl = {0};
    if (manta_reg_node_list_read(d->m, &nl) == 0)
        for (size_t i = 0; i < nl.n; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", nl.v[i].id);
            cJSON_AddStringToObject(o, "host", nl.v[i].rec.host);
            cJSON_AddStringToObject(o, "state", manta_actor_state_name(nl.v[i].rec.state));
            cJSON_AddNumberToObject(o, "cpu", nl.v[i].rec.cpu);
            cJSON_AddNumberToObject(o, "gpu", nl.v[i].rec.gpu);
            cJSON_AddItemToObject(o, "heartbeat_age_s",
                                  num_or_null(nl.v[i].age_ms < 0 ? NAN : nl.v[i].age_ms / 1e3));
            cJSON_AddItemToArray(nodes, o);
        }
    manta_reg_node_list_free(&nl);
    return j;
}

static double total(const manta_metrics *l, const char *name)
{
    double t = 0;
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name)) t += l->v[i].value;
    return t;
}

static cJSON *metric_json(const manta_metric *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddStringToObject(o, "kind", s->kind);
    cJSON_AddStringToObject(o, "type",
                            s->type == MANTA_METRIC_COUNTER ? "counter"
                            : s->type == MANTA_METRIC_GAUGE ? "gauge"
                                                            : "histogram");
    cJSON_AddItemToObject(o, "value", num_or_null(s->value));
    if (s->type == MANTA_METRIC_HISTOGRAM) {
        cJSON_AddNumberToObject(o, "count", (double)s->count);
        cJSON_AddItemToObject(o, "p50", num_or_null(manta_metric_quantile(s, 0.5)));
        cJSON_AddItemToObject(o, "p99", num_or_null(manta_metric_quantile(s, 0.99)));
    }
    return o;
}

/* Every actor: its directory record, the runtime's headline figures, and
 * (with all) every series it publishes. */
static cJSON *actors(const cli_dash *d, int all)
{
    cJSON *j = cJSON_CreateObject(), *groups = cJSON_AddArrayToObject(j, "groups"),
          *list = cJSON_AddArrayToObject(j, "actors");
    for (size_t i = 0; d->spec && i < d->spec->n_groups; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "name", d->spec->groups[i].name);
        cJSON_AddStringToObject(g, "class", d->spec->groups[i].class_name);
        cJSON_AddNumberToObject(g, "replicas", d->spec->groups[i].replicas);
        cJSON_AddItemToArray(groups, g);
    }
    manta_reg_names names;
    if (manta_reg_actor_names(d->m, &names) != 0) {
        cJSON_AddStringToObject(j, "error", manta_last_error());
        return j;
    }
    for (size_t i = 0; i < names.n; i++) {
        manta_reg_actor r;
        if (manta_reg_actor_read(d->m, names.v[i], &r) != 0) continue;
        manta_metrics l = {0};
        if (manta_reg_metrics_read(d->m, names.v[i], &l) != 0) l.n = 0;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "name", names.v[i]);
        cJSON_AddStringToObject(a, "group", r.group);
        cJSON_AddStringToObject(a, "class", r.cls);
        cJSON_AddStringToObject(a, "node", r.info.node);
        cJSON_AddStringToObject(a, "host", r.info.host);
        cJSON_AddStringToObject(a, "state", manta_actor_state_name(r.info.state));
        cJSON_AddNumberToObject(a, "pid", r.info.pid);
        cJSON_AddNumberToObject(a, "incarnation", r.info.incarnation);
        cJSON_AddNumberToObject(a, "restarts", r.info.restarts);
        cJSON_AddStringToObject(a, "error", r.error);
        int64_t age = r.info.heartbeat_ms ? manta_reg_age_ms(r.info.heartbeat_ms) : -1;
        cJSON_AddItemToObject(a, "heartbeat_age_s", num_or_null(age < 0 ? NAN : age / 1e3));
        cJSON_AddNumberToObject(a, "calls_served", total(&l, "calls_served_total"));
        cJSON_AddNumberToObject(a, "calls_made", total(&l, "calls_made_total"));
        cJSON_AddNumberToObject(a, "mailbox_depth", total(&l, "mailbox_depth"));
        const manta_metric *h = manta_metrics_find(&l, "call_served_seconds", NULL);
        cJSON_AddItemToObject(a, "served_p50_s", num_or_null(manta_metric_quantile(h, 0.5)));
        cJSON_AddItemToObject(a, "served_p99_s", num_or_null(manta_metric_quantile(h, 0.99)));
        if (all) {
            cJSON *ms = cJSON_AddArrayToObject(a, "metrics");
            for (size_t k = 0; k < l.n; k++) cJSON_AddItemToArray(ms, metric_json(&l.v[k]));
        }
        manta_metrics_free(&l);
        cJSON_AddItemToArray(list, a);
    }
    manta_reg_names_free(&names);
    return j;
}

/* A log line worth showing: level warn or error, or a message that
 * mentions an error (a tool error an env logs at info). */
static int notable(const cJSON *j)
{
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(j, "level"),
                *msg = cJSON_GetObjectItemCaseSensitive(j, "msg");
    if (cJSON_IsString(lv) &&
        (!strcmp(lv->valuestring, "warn") || !strcmp(lv->valuestring, "error")))
        return 1;
    return cJSON_IsString(msg) && strcasestr(msg->valuestring, "error");
}

/* The notable lines among the last TAIL_BYTES of a log file, into recent
 * (at most 4 * MAX_RECENT: the newest). */
static void log_tail(const char *path, cJSON *recent)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && st.st_size > TAIL_BYTES) {
        fseek(f, st.st_size - TAIL_BYTES, SEEK_SET);
        int c;
        while ((c = fgetc(f)) != EOF && c != '\n') { /* a partial first line */
        }
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        /* most lines are neither: skip them before parsing */
        if (line[0] != '{' || (!strcasestr(line, "error") && !strstr(line, "\"warn\""))) continue;
        cJSON *j = cJSON_Parse(line);
        if (notable(j)) {
            cJSON_AddItemToArray(recent, j);
            if (cJSON_GetArraySize(recent) > 4 * MAX_RECENT) cJSON_DeleteItemFromArray(recent, 0);
        } else {
            cJSON_Delete(j);
        }
    }
    fclose(f);
}

static int by_time(const void *x, const void *y)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(*(cJSON *const *)x, "time"),
                *b = cJSON_GetObjectItemCaseSensitive(*(cJSON *const *)y, "time");
    return strcmp(cJSON_IsString(a) ? a->valuestring : "", cJSON_IsString(b) ? b->valuestring : "");
}

/* recent: the last MAX_RECENT warn/error lines of every log, oldest first. */
static void recent_lines(const cli_dash *d, cJSON *out)
{
    cJSON *all = cJSON_CreateArray();
    DIR *dir = d->logs[0] ? opendir(d->logs) : NULL;
    for (struct dirent *e; dir && (e = readdir(dir));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".log")) continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", d->logs, e->d_name);
        log_tail(path, all);
    }
    if (dir) closedir(dir);
    int n = cJSON_GetArraySize(all);
    cJSON **v = n ? calloc((size_t)n, sizeof *v) : NULL;
    int k = 0;
    while (v && all->child) v[k++] = cJSON_DetachItemViaPointer(all, all->child);
    if (v) qsort(v, (size_t)k, sizeof *v, by_time);
    for (int i = 0; i < k; i++) {
        if (i >= k - MAX_RECENT)
            cJSON_AddItemToArray(out, v[i]);
        else
            cJSON_Delete(v[i]);
    }
    free(v);
    cJSON_Delete(all);
}

static cJSON *errors(const cli_dash *d)
{
    cJSON *j = cJSON_CreateObject(), *te = cJSON_AddArrayToObject(j, "tool_errors");
    manta_reg_names names;
    if (manta_reg_actor_names(d->m, &names) == 0) {
        for (size_t i = 0; i < names.n; i++) {
            manta_metrics l = {0};
            if (manta_reg_metrics_read(d->m, names.v[i], &l) != 0) continue;
            for (size_t k = 0; k < l.n; k++)
                if (!strcmp(l.v[k].name, "tool_errors_total") && l.v[k].value > 0) {
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddStringToObject(o, "actor", names.v[i]);
                    cJSON_AddStringToObject(o, "kind", l.v[k].kind);
                    cJSON_AddNumberToObject(o, "count", l.v[k].value);
                    cJSON_AddItemToArray(te, o);
                }
            manta_metrics_free(&l);
        }
        manta_reg_names_free(&names);
    }
    recent_lines(d, cJSON_AddArrayToObject(j, "recent"));
    return j;
}

int cli_dash_api(cli_dash *d, const char *path, cli_buf *out)
{
    cJSON *j = !strcmp(path, "/api/job")       ? job(d)
               : !strcmp(path, "/api/actors")  ? actors(d, 0)
               : !strcmp(path, "/api/metrics") ? actors(d, 1)
               : !strcmp(path, "/api/curves")  ? curves(d)
               : !strcmp(path, "/api/errors")  ? errors(d)
                                               : NULL;
    if (!j) return MANTA_ENOTFOUND;
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return MANTA_ENOMEM;
    cli_buf_printf(out, "%s\n", s);
    free(s);
    return out->oom ? MANTA_ENOMEM : 0;
}
