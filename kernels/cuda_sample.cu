/*
 * cuda_sample.cu - sampling on the device: the CUDA back-end's sample_rows,
 * which does what sample.c's mk__sample_u does (the reference) without
 * sorting and without copying the logits to the host.  One block of ST
 * threads per row; only the token and two log-probs per row leave the device.
 *
 * Per row, as sample.c:
 *   mx, arg   the largest logit and its first index (greedy's token);
 *   lse       mx + log sum exp(logit - mx), in double (logp_policy);
 *   e_j       (float) exp((logit_j - mx) / temperature), computed in double;
 *   p_j       (float) (e_j / sum e), the sum in double; kept in work [R,V].
 * Full distribution (top_p outside (0,1)): the token is the first j in id
 * order whose cumulative sum (double) exceeds u, found by a block prefix
 * scan (each thread a contiguous chunk, the chunks' sums scanned in order).
 * Nucleus: sample.c walks the tokens by probability descending, ties by id
 * ascending, and keeps the shortest prefix whose mass reaches top_p.  Here,
 * with F(b) = sum of p_j whose float bits are >= b (positive floats order as
 * their bits), the last kept token's probability tau is the largest b with
 * F(b) >= top_p, found by bisection over the 31 bits (each F a deterministic
 * block sum, monotone in b); every token above tau is kept, and of those
 * equal to tau the first n in id order, n the fewest that bring
 * F(tau+) + n tau to top_p.  The draw takes target = u * cum and finds, the
 * same way, the probability level whose cumulative mass first exceeds it,
 * then the member of that level's ties (in id order) where it falls.
 *
 * Agreement with the reference.  Every quantity is computed by sample.c's
 * formula in the same precision; what differs is the order of the double
 * sums (trees and chunks here, one sequential walk there), so sums differ by
 * a few units in the last place of a double (relative ~1e-15), and a p_j
 * may round to the neighbouring float (relative 6e-8) when e_j / sum lies
 * that close to a rounding boundary (cuda's double exp is within 1 ulp,
 * glibc's within 0.5).  Hence: greedy tokens are exact; tokens, and the
 * nucleus's boundary, agree unless u (or top_p) lies within ~1e-6 of a
 * cumulative boundary of the reference's walk; log-probs agree to 1e-5
 * absolute (float rounding of values up to ~20).  When the sums are exact
 * (ties of power-of-two probabilities) the results are exact.  The result
 * is deterministic: no atomics, fixed reduction orders.
 */
#include <math.h>
#include <stdint.h>

#include "cuda_common.h"

#ifndef MK_SAMPLE_THREADS
#define MK_SAMPLE_THREADS 256
#endif
enum { ST = MK_SAMPLE_THREADS, SW = ST / 32, BITS_INF = 0x7f800000 };

/* The same value in every thread of the block: a warp tree, then the warps' sums in order. */
__device__ static double block_sum(double x, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads(); /* sh free: every thread has read the last call's */
    if (lane == 0) sh[w] = x;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < SW; i++) t += sh[i];
    return t;
}

__device__ static int block_sum_int(int x, int *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if (lane == 0) sh[w] = x;
    __syncthreads();
    int t = 0;
    for (int i = 0; i < SW; i++) t += sh[i];
    return t;
}

/* min (op 0) or max (op 1) of x over the block */
__device__ static int block_minmax(int x, int op, int *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        int y = __shfl_xor_sync(0xffffffffu, x, o);
        x = op ? (y > x ? y : x) : (y < x ? y : x);
    }
    __syncthreads();
    if (lane == 0) sh[w] = x;
    __syncthreads();
    int t = sh[0];
    for (int i = 1; i < SW; i++) t = op ? (sh[i] > t ? sh[i] : t) : (sh[i] < t ? sh[i] : t);
    return t;
}

/* (v, i) better than (w, k): larger value, then smaller index (NaN never better) */
__device__ static inline bool better(float v, int i, float w, int k)
{
    return v > w || (v == w && i < k);
}

__device__ static inline uint32_t fbits(float x)
{
    return __float_as_uint(x);
}

/* F(b): the sum of p_j whose bits are >= b, in double */
__device__ static double mass_from(const float *p, int V, uint32_t b, double *sh)
{
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += ST)
        if (fbits(p[j]) >= b) s += p[j];
    return block_sum(s, sh);
}

__device__ static int count_eq(const float *p, int V, uint32_t b, int *sh)
{
    int c = 0;
    for (int j = threadIdx.x; j < V; j += ST) c += fbits(p[j]) == b;
    return block_sum_int(c, sh);
}

/* The largest b in [lo, hi) with F(b) >= x (strict 0) or F(b) > x (strict 1), given that
 * lo satisfies it and hi does not. */
__device__ static uint32_t bisect(const float *p, int V, uint32_t lo, uint32_t hi, double x,
                                  int strict, double *sh)
{
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        double f = mass_from(p, V, mid, sh);
        if (strict ? f > x : f >= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The smallest k in [1, n] with a + k v >= x (strict 0) or > x (strict 1); n if none (the
 * rounding of the caller's sums).  a + k v is one rounding of the exact value (k v is exact:
 * k < 2^29, v a float), monotone in k. */
__device__ static int first_reach(double a, float v, int n, double x, int strict)
{
    if (n <= 1 || !(v > 0.0f)) return n < 1 ? 1 : n;
    double q = ceil((x - a) / (double)v);
    int k = q < 1.0 ? 1 : q > (double)n ? n : (int)q;
#define REACH(k) (strict ? a + (double)(k)*v > x : a + (double)(k)*v >= x)
    while (k > 1 && REACH(k - 1)) k--;
    while (k < n && !REACH(k)) k++;
#undef REACH
    return k;
}

/* The index of the m-th (from 0) j in id order with bits(p_j) == b; each thread a contiguous
 * chunk, the chunks' counts scanned in order. */
__device__ static int nth_equal(const float *p, int V, uint32_t b, int m, int *shc, int *sh)
{
    int ch = (V + ST - 1) / ST, j0 = threadIdx.x * ch, j1 = min(V, j0 + ch);
    int c = 0;
    for (int j = j0; j < j1; j++) c += fbits(p[j]) == b;
    __syncthreads();
    shc[threadIdx.x] = c;
    __syncthreads();
    int base = 0;
    for (int t = 0; t < (int)threadIdx.x; t++) base += shc[t];
    int found = INT32_MAX;
    if (m >= base && m < base + c) {
        int k = base;
        for (int j = j0; j < j1; j++)
            if (fbits(p[j]) == b && k++ == m) {
                found = j;
                break;
            }
    }
    return block_minmax(found, 0, sh);
}

__global__ static void sample_k(int *tok, float *logp_sample, float *logp_policy, float *work,
                                const float *logits, const float *temperature, const float *top_p,
                                const float *uu, int V)
{
    __shared__ double shd[SW];
    __shared__ int shi[SW];
    __shared__ float shv[SW];
    __shared__ int shc[ST];
    __shared__ double shs[ST + 1];
    int r = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *lg = logits + (size_t)r * V;
    float *p = work + (size_t)r * V;
    float temp = temperature[r], tp = top_p[r];
    double u = uu[r];

    /* the largest logit and its first index */
    float mx = -INFINITY;
    int arg = INT32_MAX;
    for (int j = threadIdx.x; j < V; j += ST)
        if (lg[j] > mx) mx = lg[j], arg = j;
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, mx, o);
        int i = __shfl_xor_sync(0xffffffffu, arg, o);
        if (better(v, i, mx, arg)) mx = v, arg = i;
    }
    if (lane == 0) shv[w] = mx, shi[w] = arg;
    __syncthreads();
    mx = shv[0], arg = shi[0];
    for (int i = 1; i < SW; i++)
        if (better(shv[i], shi[i], mx, arg)) mx = shv[i], arg = shi[i];
    if (arg == INT32_MAX) arg = 0; /* no logit above -inf: sample.c keeps 0 */

    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += ST) s += exp((double)lg[j] - mx);
    double lse = mx + log(block_sum(s, shd));

    int t;
    double lps = 0.0;
    if (temp <= 0.0f) {
        t = arg;
    } else {
        double inv_t = 1.0 / temp, st = 0.0;
        for (int j = threadIdx.x; j < V; j += ST)
            st += (p[j] = (float)exp(((double)lg[j] - mx) * inv_t));
        st = block_sum(st, shd);
        for (int j = threadIdx.x; j < V; j += ST) p[j] = (float)(p[j] / st);
        __syncthreads(); /* p complete for every thread */
        if (tp > 0.0f && tp < 1.0f) {
            /* the nucleus: tau, the tokens above it, the first n of those equal to it */
            uint32_t tau = 0;
            if (mass_from(p, V, 0, shd) >= (double)tp)
                tau = bisect(p, V, 0, BITS_INF, (double)tp, 0, shd);
            float tauf = __uint_as_float(tau);
            double above = mass_from(p, V, tau + 1, shd);
            int cnt = count_eq(p, V, tau, shi);
            int n = first_reach(above, tauf, cnt, (double)tp, 0);
            if (!(tauf > 0.0f)) n = cnt; /* top_p beyond the total: every token is kept */
            double cum = above + (double)n * tauf;
            double target = u * cum;
            uint32_t lev = tau;
            double a = above;
            int nl = n;
            if (target < above) {
                lev = bisect(p, V, tau + 1, BITS_INF, target, 1, shd);
                a = mass_from(p, V, lev + 1, shd);
                nl = count_eq(p, V, lev, shi);
            }
            int m = first_reach(a, __uint_as_float(lev), nl, target, 1) - 1;
            t = nth_equal(p, V, lev, m, shc, shi);
            if (t == INT32_MAX) t = arg; /* not reached: the level has m + 1 members */
            lps = log((double)p[t] / cum);
        } else {
            /* the whole distribution, in id order: P_j = base of the chunk + its prefix */
            int ch = (V + ST - 1) / ST, j0 = threadIdx.x * ch, j1 = min(V, j0 + ch);
            double loc = 0.0;
            for (int j = j0; j < j1; j++) loc += p[j];
            shs[threadIdx.x] = loc;
            __syncthreads();
            if (threadIdx.x == 0) {
                double acc = 0.0;
                for (int i = 0; i < ST; i++) {
                    double c = shs[i];
                    shs[i] = acc;
                    acc = acc + c;
                }
                shs[ST] = acc;
            }
            __syncthreads();
            double base = shs[threadIdx.x];
            int found = INT32_MAX, last = -1;
            loc = 0.0;
            for (int j = j0; j < j1; j++) {
                loc += p[j];
                if (u < base + loc && p[j] > 0.0f) {
                    found = j;
                    break;
                }
            }
            t = block_minmax(found, 0, shi);
            if (t == INT32_MAX) { /* rounding left u above the total: the last nonzero */
                for (int j = threadIdx.x; j < V; j += ST)
                    if (p[j] > 0.0f) last = j;
                t = block_minmax(last, 1, shi);
            }
            lps = log((double)p[t]);
        }
    }
    if (threadIdx.x == 0) {
        tok[r] = t;
        logp_sample[r] = (float)lps;
        logp_policy[r] = (float)((double)lg[t] - lse);
    }
}

/* ---- host side ----------------------------------------------------------- */

extern "C" void mk__cuda_sample_rows(int *tok, float *logp_sample, float *logp_policy, float *work,
                                     const float *logits, const float *temperature,
                                     const float *top_p, const float *u, int R, int V)
{
    if (R < 1) return;
    MK_LAUNCH(R, ST, 0, sample_k)
    (tok, logp_sample, logp_policy, work, logits, temperature, top_p, u, V);
    MK_LAUNCHED("the sampling kernel");
}
