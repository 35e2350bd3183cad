/*
 * grpo.c - the pure rules of the RL system: GRPO advantages, bounded
 * staleness (admission and dropping), the ledger invariant.
 * No I/O, no state: the controller and the tests call the same code.
 */
#include "manta_actors.h"

#include <math.h>

int rl_group_advantages(const float *rewards, int n, float eps, float *adv)
{
    if (n <= 0) return 0;
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += rewards[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (rewards[i] - mean) * (rewards[i] - mean);
    double sd = sqrt(var / n);
    if (sd < 1e-6) {
        for (int i = 0; i < n; i++) adv[i] = 0;
        return 0;
    }
    for (int i = 0; i < n; i++) adv[i] = (float)((rewards[i] - mean) / (sd + eps));
    return 1;
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
