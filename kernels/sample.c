/*
 * sample.c - the seeded generator and the sampler: temperature, nucleus
 * (top-p) truncation, and the log-probability of the drawn token under both
 * the distribution it was drawn from and the raw policy.
 *
 * The generator is xoshiro256** seeded through splitmix64, so that any 64-bit
 * seed (0 included) gives a well-mixed state.  Sampling works in double on
 * the host: V is a few hundred for the byte vocabulary, so sorting for top-p
 * costs less than the matrix product that produced the logits.  Ties in the
 * sort are broken by token id, so the result is a function of the logits and
 * the generator alone.
 *
 * mk_sample is two steps: the draw (mk__sample_draw: one uniform from the slot's
 * generator, none when greedy) and the choice from the logits given that
 * uniform (mk__sample_u).  The choice is the reference for a back-end's
 * sample_rows (cuda_sample.cu), which the decoder hands the same host draws.
 */
#include <math.h>
#include <stdlib.h>

#include "mk_internal.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mk_rng_seed(mk_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t mk_rng_next(mk_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

float mk_rng_uniform(mk_rng *r)
{
    return (float)(mk_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Order: probability descending, then token id ascending. */
static int by_prob_desc(const void *a, const void *b, void *ctx)
{
    const float *p = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (p[i] > p[j]) return -1;
    if (p[i] < p[j]) return 1;
    return (i > j) - (i < j);
}

/* p[j] = softmax(logits / temperature)[j], with mx the largest logit. */
static void tempered_probs(float *p, const float *logits, int V, float mx, float temperature)
{
    double inv_t = 1.0 / temperature, st = 0.0;
    for (int j = 0; j < V; j++) st += (p[j] = (float)exp(((double)logits[j] - mx) * inv_t));
    for (int j = 0; j < V; j++) p[j] = (float)(p[j] / st);
}

/* Draws with uniform u from the nucleus of p: the most probable tokens whose probabilities first
 * reach top_p, renormalised.  idx: scratch [V].  *lps: the token's log-prob in the nucleus. */
static int sample_nucleus(const float *p, int V, float top_p, double u, int *idx, double *lps)
{
    for (int j = 0; j < V; j++) idx[j] = j;
    qsort_r(idx, (size_t)V, sizeof(int), by_prob_desc, (void *)p);
    double cum = 0.0;
    int k = 0;
    while (k < V) {
        cum += p[idx[k++]];
        if (cum >= top_p) break;
    }
    double target = u * cum, acc = 0.0;
    int tok = idx[k - 1];
    for (int i = 0; i < k; i++) {
        acc += p[idx[i]];
        if (target < acc) {
            tok = idx[i];
            break;
        }
    }
    *lps = log((double)p[tok] / cum);
    return tok;
}

/* Draws with uniform u from all of p.  *lps: the token's log-prob. */
static int sample_full(const float *p, int V, double u, double *lps)
{
    double acc = 0.0;
    int tok = -1;
    for (int j = 0; j < V; j++) {
        acc += p[j];
        if (u < acc && p[j] > 0.0f) {
            tok = j;
            break;
        }
    }
    if (tok < 0) /* rounding left u above the total: take the last nonzero */
        for (int j = V - 1; j >= 0 && tok < 0; j--)
            if (p[j] > 0.0f) tok = j;
    *lps = log((double)p[tok]);
    return tok;
}

int mk__sample_u(const float *logits, int V, float temperature, float top_p, float u, void *scratch,
                 float *logp_sample, float *logp_policy)
{
    float *p = scratch;
    int *idx = (int *)(p + 2 * (size_t)V);
    float mx = -INFINITY;
    int arg = 0;
    for (int j = 0; j < V; j++)
        if (logits[j] > mx) {
            mx = logits[j];
            arg = j;
        }
    double s = 0.0;
    for (int j = 0; j < V; j++) s += exp((double)logits[j] - mx);
    double lse = mx + log(s);
    int tok;
    double lps = 0.0;
    if (temperature <= 0.0f) {
        tok = arg; /* greedy */
    } else {
        tempered_probs(p, logits, V, mx, temperature);
        if (top_p > 0.0f && top_p < 1.0f)
            tok = sample_nucleus(p, V, top_p, u, idx, &lps);
        else
            tok = sample_full(p, V, u, &lps);
    }
    if (logp_sample) *logp_sample = (float)lps;
    if (logp_policy) *logp_policy = (float)((double)logits[tok] - lse);
    return tok;
}

int mk_sample(const float *logits, int V, float temperature, float top_p, mk_rng *rng,
              void *scratch, float *logp_sample, float *logp_policy)
{
    float u = mk__sample_draw(rng, temperature);
    return mk__sample_u(logits, V, temperature, top_p, u, scratch, logp_sample, logp_policy);
}
