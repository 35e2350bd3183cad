/*
 * grpo.c - the pure rules of the RL system: GRPO advantages, bounded
 * staleness (admission and dropping), the ledger invariant, dynamic
 * sampling (which groups carry a signal) and when the warm-up stops.
 * No I/O, no state: the controller and the tests call the same code.
 */
#include "manta_actors.h"

#include <math.h>

/* The population standard deviation of n > 0 rewards, and their mean. */
static double reward_sd(const float *rewards, int n, double *mean_out)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += rewards[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (rewards[i] - mean) * (rewards[i] - mean);
    *mean_out = mean;
    return sqrt(var / n);
}

int rl_group_advantages(const float *rewards, int n, float eps, float *adv)
{
    if (n <= 0) return 0;
    double mean, sd = reward_sd(rewards, n, &mean);
    if (sd < 1e-6) {
        for (int i = 0; i < n; i++) adv[i] = 0;
        return 0;
    }
    for (int i = 0; i < n; i++) adv[i] = (float)((rewards[i] - mean) / (sd + eps));
    return 1;
}

int rl_group_has_signal(const float *rewards, int n)
{
    double mean;
    return n >= 2 && reward_sd(rewards, n, &mean) >= 1e-6; /* as rl_group_advantages */
}

int rl_warmup_check(const rl_warmup *w, int steps, double loss, double reproduced)
{
    if (w->fixed >= 0) return steps >= w->fixed ? RL_WARMUP_MET : RL_WARMUP_GO;
    if (w->until_loss < 0 && w->until_success < 0)
        return steps >= w->max_steps ? RL_WARMUP_MET : RL_WARMUP_GO;
    int met = (w->until_loss < 0 || loss <= w->until_loss) &&
              (w->until_success < 0 || reproduced >= w->until_success);
    if (met) return RL_WARMUP_MET;
    return steps >= w->max_steps ? RL_WARMUP_LIMIT : RL_WARMUP_GO;
}

int rl_admit_ok(int64_t admitted, int64_t n, int64_t v, int64_t eta, int64_t b)
{
    return admitted + n <= (v + eta + 1) * b;
}

int rl_is_stale(int32_t min_ver, int64_t v, int64_t eta)
{
    return min_ver >= 0 && v - min_ver > eta;
}

int rl_ledger_ok(const rl_ledger *l)
{
    return l->admitted == l->trained + l->dropped_stale + l->dropped_error + l->in_flight;
}
