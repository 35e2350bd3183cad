/*
 * progress.c - the controller's figures as the job value `progress`, the
 * record `manta run` draws its live line from (rl_util.h). Written once a
 * version; the CLI reads it a few times a second and computes the ETA.
 */
#include "rl_util.h"

#include <stdio.h>

/* Tokens per second as "812", "12.3k", "4.1M". */
static void rate(char *out, size_t n, double v)
{
    if (v >= 1e6)
        snprintf(out, n, "%.1fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(out, n, "%.1fk", v / 1e3);
    else
        snprintf(out, n, "%.0f", v);
}

void rl_progress_publish(manta_ctx *m, const rl_progress *p)
{
    /* held out: the last measurement, kept here between evaluations (a
     * periodic one is under way while later versions train). One
     * controller per process. */
    static double last_heldout = -1;
    if (p->heldout >= 0) last_heldout = p->heldout;
    double n = 0, sum = 0;
    for (int i = 0; i < p->stale_bins; i++)
        n += (double)p->stale_hist[i], sum += (double)i * (double)p->stale_hist[i];
    char tt[16], gt[16], held[24] = "";
    rate(tt, sizeof tt, p->trained_tps);
    rate(gt, sizeof gt, p->gen_tps);
    if (last_heldout >= 0)
        snprintf(held, sizeof held, "[\"held-out\",\"%.1f%%\"],", 100 * last_heldout);
    char early[64] = ""; /* the CLI shows the ETA as a bound then */
    if (p->stop_at <= 1)
        snprintf(early, sizeof early, "\"stop_early\":\"held-out >= %.1f%%\",", 100 * p->stop_at);
    char buf[1024];
    int len = snprintf(buf, sizeof buf,
                       "{%s\"unit\":\"version\",\"step\":%lld,\"steps\":%lld,\"time_s\":%.2f,"
                       "\"time_limit_s\":%.2f,\"fields\":[[\"reward\",\"%.3f\"],%s"
                       "[\"train\",\"%s tok/s\"],[\"gen\",\"%s tok/s\"],[\"stale\",\"%.2f\"],"
                       "[\"drops\",\"%lld\"],[\"tool errors\",\"%lld of %lld\"]]}",
                       early, (long long)p->version, (long long)p->max_versions, p->time_s,
                       p->max_time_s, p->reward, held, tt, gt, n > 0 ? sum / n : 0.0,
                       (long long)p->dropped, (long long)p->tool_errors, (long long)p->tool_calls);
    if (len < 0 || (size_t)len >= sizeof buf) return;
    if (manta_kv_set(m, "progress", buf, (size_t)len) != 0)
        rl_log(m, "controller: progress record: %s", manta_last_error());
}
