/*
 * cli_internal.h -- what the files of the `manta` command share (and its
 * tests use): a growing text buffer, the Prometheus exposition, the HTTP
 * endpoint and the dashboard's documents and compiled-in files, the live
 * progress line, and the run reports (plots).
 *
 * Threads: everything here belongs to the thread of the ctx it is given.
 */
#ifndef MANTA_CLI_INTERNAL_H
#define MANTA_CLI_INTERNAL_H

#include "manta.h"

#include <stddef.h>
#include <stdio.h>

/* ---- a growing text buffer: {0} is empty; free(b.p) at the end ---- */
typedef struct cli_buf {
    char *p;
    size_t len, cap;
    int oom; /* an append ran out of memory: the text is incomplete */
} cli_buf;
void cli_buf_printf(cli_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- prom.c: the job's metrics in the Prometheus text format (0.0.4) ---- */
/* Append the exposition of every actor of m's job to b. 0, or the
 * registry's error (EREDIS), ENOMEM. */
int cli_prom_render(manta_ctx *m, cli_buf *b);

/* ---- httpd.c: the head's HTTP endpoint (libmicrohttpd on the driver's loop) ---- */
typedef struct cli_httpd cli_httpd;
/* Listen on bind_addr:port (port 0: any free one) and serve GET /metrics on
 * m's loop. An address other than loopback gets a token (cli_httpd_token)
 * that every request must carry. 0, or EINVAL (a bad address) / ESYS (the
 * port is taken...) / ENOMEM with the reason in err. */
int cli_httpd_start(manta_ctx *m, const char *bind_addr, int port, cli_httpd **out, char *err,
                    size_t errlen);
/* Serve the dashboard too (/, /app.js, /style.css, /api/...): spec (may be
 * NULL; kept, not copied) gives the groups in order, logs_dir the actors'
 * log files; a token is written to RUN_DIR/dashboard.token (0600). 0, or
 * ENOMEM / ESYS with the reason in err. */
struct manta_spec;
int cli_httpd_dashboard(cli_httpd *s, const struct manta_spec *spec, const char *run_dir,
                        const char *logs_dir, char *err, size_t errlen);
const char *cli_httpd_token(const cli_httpd *s); /* NULL on loopback */
int cli_httpd_port(const cli_httpd *s);          /* the port it listens on */
void cli_httpd_free(cli_httpd *s);               /* NULL is a no-op */

/* ---- dash.c: the dashboard's JSON documents ---- */
typedef struct cli_dash cli_dash;
/* Sample the job value `progress` every 100 ms on m's loop (m NULL: no
 * sampling, for the tests). NULL when out of memory. */
cli_dash *cli_dash_new(manta_ctx *m, const struct manta_spec *spec, const char *run_dir,
                       const char *logs_dir);
void cli_dash_free(cli_dash *d); /* NULL is a no-op */
/* Add one progress record (JSON text[len]) to the curves. */
void cli_dash_record(cli_dash *d, const char *text, size_t len);
/* Append the document at path ("/api/job", "/api/actors", "/api/metrics",
 * "/api/curves", "/api/errors") to out. 0, ENOTFOUND (no such path),
 * ENOMEM. */
int cli_dash_api(cli_dash *d, const char *path, cli_buf *out);

/* ---- dash_assets.c (generated from web/ at build time) ---- */
typedef struct cli_asset {
    const char *path, *type; /* "/index.html", "text/html; charset=utf-8" */
    const unsigned char *data;
    size_t len;
} cli_asset;
extern const cli_asset cli_assets[];
extern const size_t cli_n_assets;

/* ---- progress.c: the live progress line of `manta run` ---- *
 * A job publishes its progress as the job value `progress` (manta_kv_set),
 * a JSON object: {"unit": "version", "step": N, "steps": M, "time_s": T,
 * "time_limit_s": L, "fields": [["reward", "0.41"], ...], "stop_early":
 * "held-out >= 95%"} (all optional; stop_early: the goal that may end the
 * job before its last step, which makes the ETA a bound).
 * On a terminal the line is redrawn in place (at most 4 times a second);
 * elsewhere a plain line is written when the step moved and at least
 * `interval_s` passed since the last one. */
typedef struct cli_progress cli_progress;
cli_progress *cli_progress_new(manta_ctx *m, FILE *out, int tty, double interval_s);
/* Called often (every 100 ms) with the seconds since the job started. */
void cli_progress_tick(cli_progress *p, double elapsed_s);
/* The last line (plain), and the terminal line cleared. Frees p. */
void cli_progress_end(cli_progress *p, double elapsed_s);
/* The line for a progress record (text[len]) at elapsed_s, with the ETA
 * from the rate since the first step seen (first_step at first_s); for the
 * tests. Writes at most n bytes into out. */
void cli_progress_format(const char *text, size_t len, double elapsed_s, double first_s,
                         double first_step, char *out, size_t n);

/* ---- report.c: the run folder's report ---- */
/* Write the plots of RUN_DIR (reward.svg, success.svg, throughput.svg,
 * staleness.svg) from its metrics.jsonl and summary.json, each written to a
 * temporary file and renamed. 0, or ENOTFOUND (no metrics.jsonl) /
 * EJSON (a line that is not JSON: its number in err) / ESYS (cannot write)
 * / ENOMEM, with the reason in err. *made (may be NULL) gets the number of
 * plots written. */
int cli_report_write(const char *run_dir, int *made, char *err, size_t errlen);
/* A short human summary of a run's answer (the JSON the run method
 * returned, or summary.json) to `out`: held-out success before -> after,
 * wall time, versions, the ledger. 0 when the answer was a run summary,
 * -1 (nothing written) when it was not. */
int cli_report_summary(const char *answer, size_t len, FILE *out);

/* ---- status.c: the metrics tables of `manta status` ---- */
void cli_status_metrics(manta_ctx *m, int verbose, FILE *out);

/* ---- logs.c: `manta logs` ---- */
/* Print one line of an actor's log: a JSON log line (runtime/core/log.c)
 * as "HH:MM:SS.mmm LEVEL ACTOR#INCARNATION message" (the level in colour
 * when color), anything else, or everything when raw, as it is. */
void cli_log_line(const char *line, int raw, int color, FILE *out);

/* ---- svg.c: charts as SVG, written by hand ---- */
typedef struct svg_series {
    const char *name, *color;
    const double *x, *y;
    size_t n;
    int points; /* 1: markers only (sparse measurements); 0: a line */
} svg_series;
/* A line chart of the series; 0, or ESYS with the reason in err. */
int svg_line_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                   const svg_series *s, size_t ns, char *err, size_t errlen);
/* A bar chart with one labelled bar per value. */
int svg_bar_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                  const char *const *labels, const double *v, size_t n, char *err, size_t errlen);

#endif
