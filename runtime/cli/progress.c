/*
 * progress.c -- the live progress line of `manta run`.
 *
 * The job says how far it is through the job value `progress` (a JSON
 * object, cli_internal.h); the CLI knows nothing of what a step is. On a
 * terminal one line is redrawn in place ("\r", the text cut to the
 * terminal's width so it never wraps, then erase-to-end-of-line); when the
 * output is a file or a pipe a plain line is written each time the step
 * moved and at least interval_s passed, so logs stay readable.
 *
 * The ETA is the rate of steps since the first one this process saw,
 * applied to the steps left, and never past the job's time limit. A job
 * that may stop before its last step (a goal such as a held-out success to
 * reach) names the goal in "stop_early"; the ETA is then shown as a bound
 * ("ETA at most 1:10") and the goal ends the line ("stops at held-out >=
 * 95%"), since no rate of steps predicts when a goal is met.
 */
#include "cli_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

struct cli_progress {
    manta_ctx *m;
    FILE *out;
    int tty;
    double interval_s;
    double last_read, last_print;
    double first_s, first_step; /* the first step seen, and when: for the ETA */
    double printed_step;
    char *text; /* the last record read */
    size_t len;
    int drawn; /* a terminal line is on screen */
};

cli_progress *cli_progress_new(manta_ctx *m, FILE *out, int tty, double interval_s)
{
    cli_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->m = m, p->out = out, p->tty = tty, p->interval_s = interval_s;
    p->last_read = p->last_print = -1e9;
    p->first_s = p->first_step = p->printed_step = -1;
    return p;
}

static void clock_text(char *out, size_t n, double s)
{
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

static double field_num(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

void cli_progress_format(const char *text, size_t len, double elapsed_s, double first_s,
                         double first_step, char *out, size_t n)
{
    cli_buf b = {0};
    cJSON *j = text ? cJSON_ParseWithLength(text, len) : NULL;
    int rec = cJSON_IsObject(j);
    double step = rec ? field_num(j, "step") : NAN, steps = rec ? field_num(j, "steps") : NAN;
    double limit = rec ? field_num(j, "time_limit_s") : NAN, t = rec ? field_num(j, "time_s") : NAN;
    /* where the job is and the times first: a narrow terminal cuts the end */
    const cJSON *unit = rec ? cJSON_GetObjectItemCaseSensitive(j, "unit") : NULL;
    if (isfinite(step))
        cli_buf_printf(&b, "%s %.0f", cJSON_IsString(unit) ? unit->valuestring : "step", step);
    else
        cli_buf_printf(&b, "starting");
    if (isfinite(step) && isfinite(steps)) cli_buf_printf(&b, "/%.0f", steps);
    char el[32], eta[32];
    clock_text(el, sizeof el, elapsed_s);
    cli_buf_printf(&b, "  %s elapsed", el);
    double left = NAN;
    if (isfinite(step) && isfinite(steps) && first_s >= 0 && step > first_step)
        left = (steps - step) * (elapsed_s - first_s) / (step - first_step);
    if (isfinite(limit) && isfinite(t) && (!isfinite(left) || left > limit - t))
        left = limit - t > 0 ? limit - t : 0;
    /* a job that may end early (a goal reached) says so: its ETA is then
     * a bound, and the goal ends the line */
    const cJSON *early = rec ? cJSON_GetObjectItemCaseSensitive(j, "stop_early") : NULL;
    int bound = cJSON_IsString(early) && early->valuestring[0];
    if (isfinite(left)) {
        clock_text(eta, sizeof eta, left);
        cli_buf_printf(&b, "  ETA %s%s", bound ? "at most " : "", eta);
    }
    const cJSON *fields = rec ? cJSON_GetObjectItemCaseSensitive(j, "fields") : NULL;
    for (const cJSON *f = cJSON_IsArray(fields) ? fields->child : NULL; f; f = f->next) {
        const cJSON *k = cJSON_GetArrayItem(f, 0), *v = cJSON_GetArrayItem(f, 1);
        if (cJSON_IsString(k) && cJSON_IsString(v))
            cli_buf_printf(&b, "  %s %s", k->valuestring, v->valuestring);
    }
    if (bound) cli_buf_printf(&b, "  stops at %s", early->valuestring);
    cJSON_Delete(j);
    snprintf(out, n, "%s", b.p ? b.p : "");
    free(b.p);
}

static int term_width(FILE *f)
{
    struct winsize ws;
    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10) return ws.ws_col;
    return 80;
}

/* Read the record again (it changes at most once a version). */
static void refresh(cli_progress *p, double elapsed_s)
{
    void *v;
    size_t n;
    p->last_read = elapsed_s;
    if (manta_kv_get(p->m, "progress", &v, &n) != 0) return;
    free(p->text);
    p->text = v, p->len = n;
    cJSON *j = cJSON_ParseWithLength(p->text, p->len);
    double step = field_num(j, "step");
    if (isfinite(step) && p->first_s < 0) p->first_s = elapsed_s, p->first_step = step;
    cJSON_Delete(j);
}

static void draw(cli_progress *p, double elapsed_s)
{
    char line[1024];
    cli_progress_format(p->text, p->len, elapsed_s, p->first_s, p->first_step, line, sizeof line);
    if (p->tty) {
        int w = term_width(p->out) - 1;
        if ((int)strlen(line) > w) line[w > 0 ? w : 0] = 0;
        fprintf(p->out, "\r%s\033[K", line);
        p->drawn = 1;
    } else {
        fprintf(p->out, "progress: %s\n", line);
    }
    fflush(p->out);
}

static double current_step(const cli_progress *p)
{
    cJSON *j = p->text ? cJSON_ParseWithLength(p->text, p->len) : NULL;
    double s = field_num(j, "step");
    cJSON_Delete(j);
    return isfinite(s) ? s : -1;
}

void cli_progress_tick(cli_progress *p, double elapsed_s)
{
    if (!p) return;
    if (elapsed_s - p->last_read >= (p->tty ? 0.5 : 1.0)) refresh(p, elapsed_s);
    if (p->tty) {
        if (elapsed_s - p->last_print >= 0.25) draw(p, elapsed_s), p->last_print = elapsed_s;
        return;
    }
    double step = current_step(p);
    if (p->text && step != p->printed_step && elapsed_s - p->last_print >= p->interval_s) {
        draw(p, elapsed_s);
        p->last_print = elapsed_s, p->printed_step = step;
    }
}

void cli_progress_end(cli_progress *p, double elapsed_s)
{
    if (!p) return;
    refresh(p, elapsed_s);
    if (p->tty && p->drawn) { /* the last figures stay on screen */
        draw(p, elapsed_s);
        fputc('\n', p->out);
        fflush(p->out);
    } else if (!p->tty && p->text && current_step(p) != p->printed_step) {
        draw(p, elapsed_s);
    }
    free(p->text);
    free(p);
}
