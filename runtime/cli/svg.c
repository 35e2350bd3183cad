/*
 * svg.c -- line and bar charts as standalone SVG files, written by hand:
 * no plotting library and no Python, so `manta report` works wherever the
 * binary runs, and any browser shows the result.
 *
 * A chart is 720x400: a title, a plot area with a light grid, "nice" axis
 * ticks (1, 2 or 5 times a power of ten), axis labels and a legend. Text is
 * XML-escaped. Non-finite values are left out of a series. Each file is
 * written to NAME.tmp and renamed, so a reader never sees half a chart.
 */
#include "cli_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define W  720.0
#define H  400.0
#define ML 70.0 /* margins: room for tick labels and axis titles */
#define MR 20.0
#define MT 40.0
#define MB 55.0

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double span, int want)
{
    double raw = span / want, p = pow(10, floor(log10(raw))), r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
}

typedef struct axis {
    double lo, hi, step;
} axis;

static axis make_axis(double lo, double hi, int from_zero)
{
    if (!isfinite(lo) || !isfinite(hi)) lo = 0, hi = 1;
    if (from_zero && lo > 0) lo = 0;
    if (hi - lo < 1e-12) hi = lo + (fabs(lo) > 1e-12 ? fabs(lo) * 0.1 : 1);
    axis a;
    a.step = nice_step(hi - lo, 5);
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    return a;
}

static double px(const axis *a, double v)
{
    return ML + (v - a->lo) / (a->hi - a->lo) * (W - ML - MR);
}

static double py(const axis *a, double v)
{
    return H - MB - (v - a->lo) / (a->hi - a->lo) * (H - MT - MB);
}

/* A tick label: integers plain, small or large values with a k/M suffix. */
static void tick_label(char *out, size_t n, double v, double step)
{
    double av = fabs(v);
    if (av >= 1e6 && step >= 1e5)
        snprintf(out, n, "%gM", v / 1e6);
    else if (av >= 1e4 && step >= 1e3)
        snprintf(out, n, "%gk", v / 1e3);
    else
        snprintf(out, n, "%g", fabs(v) < step * 1e-9 ? 0.0 : v);
}

static FILE *open_tmp(const char *path, char *tmp, size_t n, char *err, size_t errlen)
{
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
    return f;
}

static int close_tmp(FILE *f, const char *tmp, const char *path, char *err, size_t errlen)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno ? errno : EIO));
        unlink(tmp);
        return MANTA_ESYS;
    }
    return 0;
}

static void frame(FILE *f, const char *title, const char *xlabel, const char *ylabel)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "viewBox=\"0 0 %g %g\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%g\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">",
            W, H, W, H, W / 2);
    esc(f, title);
    fprintf(f, "</text>\n<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">", (ML + W - MR) / 2,
            H - 12);
    esc(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"16\" y=\"%g\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 16 %g)\">",
            (MT + H - MB) / 2, (MT + H - MB) / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n");
}

/* Grid lines and tick labels of both axes (x ticks only when xa is given). */
static void grid(FILE *f, const axis *xa, const axis *ya)
{
    char lab[32];
    for (double v = ya->lo; v <= ya->hi + ya->step * 1e-6; v += ya->step) {
        double y = py(ya, v);
        tick_label(lab, sizeof lab, v, ya->step);
        fprintf(f,
                "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                ML, y, W - MR, y, ML - 6, y + 4, lab);
    }
    if (xa)
        for (double v = xa->lo; v <= xa->hi + xa->step * 1e-6; v += xa->step) {
            double x = px(xa, v);
            tick_label(lab, sizeof lab, v, xa->step);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#eee\"/>"
                    "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n",
                    x, MT, x, H - MB, x, H - MB + 16, lab);
        }
    fprintf(f,
            "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
            "stroke=\"#444\"/>\n",
            ML, MT, W - ML - MR, H - MT - MB);
}

int svg_line_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                   const svg_series *s, size_t ns, char *err, size_t errlen)
{
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            xlo = fmin(xlo, s[k].x[i]), xhi = fmax(xhi, s[k].x[i]);
            ylo = fmin(ylo, s[k].y[i]), yhi = fmax(yhi, s[k].y[i]);
        }
    axis xa = make_axis(xlo, xhi, 1), ya = make_axis(ylo, yhi, 1);
    char tmp[4200];
    FILE *f = open_tmp(path, tmp, sizeof tmp, err, errlen);
    if (!f) return MANTA_ESYS;
    frame(f, title, xlabel, ylabel);
    grid(f, &xa, &ya);
    for (size_t k = 0; k < ns; k++) {
        if (!s[k].points) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                    s[k].color);
            for (size_t i = 0; i < s[k].n; i++)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                    fprintf(f, "%.1f,%.1f ", px(&xa, s[k].x[i]), py(&ya, s[k].y[i]));
            fprintf(f, "\"/>\n");
        }
        for (size_t i = 0; i < s[k].n && (s[k].points || s[k].n == 1); i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n",
                        px(&xa, s[k].x[i]), py(&ya, s[k].y[i]), s[k].color);
        /* legend: top left, one row per series */
        double ly = MT + 16 + 18 * (double)k;
        fprintf(f,
                "<rect x=\"%g\" y=\"%g\" width=\"14\" height=\"4\" fill=\"%s\"/>"
                "<text x=\"%g\" y=\"%g\">",
                ML + 10, ly - 4, s[k].color, ML + 30, ly);
        esc(f, s[k].name);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return close_tmp(f, tmp, path, err, errlen);
}

int svg_bar_chart(const char *path, const char *title, const char *xlabel, const char *ylabel,
                  const char *const *labels, const double *v, size_t n, char *err, size_t errlen)
{
    double hi = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i])) hi = fmax(hi, v[i]);
    axis ya = make_axis(0, hi, 1);
    char tmp[4200];
    FILE *f = open_tmp(path, tmp, sizeof tmp, err, errlen);
    if (!f) return MANTA_ESYS;
    frame(f, title, xlabel, ylabel);
    grid(f, NULL, &ya);
    double slot = (W - ML - MR) / (double)(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        double val = isfinite(v[i]) ? v[i] : 0, x = ML + slot * (double)i + slot * 0.15;
        double y = py(&ya, val), h = H - MB - y;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#4878d0\">"
                "<title>%g</title></rect>\n<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">",
                x, y, slot * 0.7, h, val, x + slot * 0.35, H - MB + 16);
        esc(f, labels[i]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return close_tmp(f, tmp, path, err, errlen);
}
