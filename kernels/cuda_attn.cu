/*
 * cuda_attn.cu - fused causal attention for the CUDA back-end (the table's attn_fwd and
 * attn_bwd, see mk_internal.h), in the manner of FlashAttention-2, float32 throughout.
 *
 * Nothing of size T x T is stored.  The forward pass walks the keys in tiles with an online
 * softmax and keeps, per (b, query head, t), the log-sum-exp of the scaled scores; the
 * backward pass recomputes the probabilities from it.  The table's `att` argument (at least
 * B NH T T floats, what the CPU back-end keeps its probabilities in) holds here only that
 * log-sum-exp, [B, NH, T], in its first B NH T floats; `datt` (the backward's scratch) holds
 * in its first B NH T floats D = rowsum(P * dP) = dO . O per query row.  The rest of both
 * buffers is not touched.  (model.c sizes them T x T for the CPU back-end.)
 *
 * Grouped-query layout as mk_internal.h states: a qkv row is NH query heads, NKV key heads,
 * NKV value heads of hd floats, W = (NH + 2 NKV) hd; query head h reads kv head h / (NH/NKV).
 *
 * Kernels (256 threads, a 16 x 16 grid of threads over a tile of the score matrix; thread
 * (ty, tx) owns rows ty + 16 i and columns tx + 16 j of the score tile, and output columns
 * tx + 16 j of its rows; the 16 threads of a row are half a warp, so row reductions are four
 * shuffles):
 *   attn_fwd_k      one block per (query tile, query head, b): O and the log-sum-exp.
 *   attn_bwd_dq_k   one block per (query tile, query head, b): dQ, and D per row, which it
 *                   gets without O: dQ = scale (sum_j P dP K_j - D sum_j P K_j) with
 *                   D = sum_j P dP, accumulated in the same pass over the keys.
 *   attn_bwd_dkv_k  one block per (key tile, kv head, b): dK and dV, looping over the query
 *                   tiles at or after the key tile and over the NH/NKV query heads of the
 *                   group, so each dK, dV element is written by exactly one thread, once.
 * No atomics: every element of dqkv is overwritten exactly once, so results do not depend on
 * scheduling.  Tiles live in dynamic shared memory (up to ~77 KB a block); rows are padded to
 * LD = round4(hd) + 4 floats so that the float4 reads along the head dimension by 8
 * consecutive threads of different rows hit distinct banks.  Tile shapes by head size: see
 * attn_fwd / attn_bwd below (hd <= 256; 64 and 128 are the shapes tuned for).
 */
#include <math.h>

#include "cuda_common.h"

#define ATT_THREADS 256

/* rows [r0, r0 + n) of a strided [T, *] slice (row stride `stride`, hd floats used) into a
 * tile of n rows of LD floats; rows past T and columns hd..HP-1 are zeros */
__device__ static void att_load(float *dst, const float *src, size_t stride, int r0, int n, int T,
                                int hd, int HP, int LD)
{
    for (int idx = threadIdx.x; idx < n * HP; idx += ATT_THREADS) {
        int r = idx / HP, c = idx - r * HP;
        float x = 0.0f;
        if (r0 + r < T && c < hd) x = src[(size_t)(r0 + r) * stride + c];
        dst[r * LD + c] = x;
    }
}

/* max and sum over the 16 threads of a tile row (half a warp) */
__device__ static inline float row_max16(float x)
{
    for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ static inline float row_sum16(float x)
{
    for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ static inline float dot4(float4 a, float4 b)
{
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

/* Forward: BQ = 16 RM query rows, BK = 16 CN keys a step, NJ >= hd / 16 output columns per
 * thread.  Shared: Q [BQ][LD], K [BK][LD], V [BK][LD], P [BQ][BK + 1]. */
template <int RM, int CN, int NJ>
__global__ static void __launch_bounds__(ATT_THREADS)
    attn_fwd_k(float *out, float *lse, const float *qkv, int T, int NH, int NKV, int hd)
{
    MK_DYNAMIC_SMEM(float4, att_smem4);
    float *sm = (float *)att_smem4;
    const int BQ = 16 * RM, BK = 16 * CN, LP = BK + 1;
    const int HP = (hd + 3) & ~3, LD = HP + 4;
    float *sq = sm, *sk = sq + BQ * LD, *sv = sk + BK * LD, *sp = sv + BK * LD;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const size_t W = (size_t)(NH + 2 * NKV) * hd, A = (size_t)NH * hd;
    const float *rows = qkv + (size_t)b * T * W;
    const float *kg = rows + (size_t)(NH + h / G) * hd,
                *vg = rows + (size_t)(NH + NKV + h / G) * hd;
    const float scale = 1.0f / sqrtf((float)hd);

    att_load(sq, rows + (size_t)h * hd, W, q0, BQ, T, hd, HP, LD);
    float m[RM], l[RM], o[RM][NJ];
    for (int i = 0; i < RM; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
        for (int j = 0; j < NJ; j++) o[i][j] = 0.0f;
    }
    const int kend = min(T, q0 + BQ); /* keys 0..kend-1 reach some row of the tile */
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* the previous step's readers of K, V, P are done */
        att_load(sk, kg, W, k0, BK, T, hd, HP, LD);
        att_load(sv, vg, W, k0, BK, T, hd, HP, LD);
        __syncthreads();
        float s[RM][CN];
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < CN; j++) s[i][j] = 0.0f;
        for (int d = 0; d < HP; d += 4) {
            float4 qv[RM], kv[CN];
            for (int i = 0; i < RM; i++) qv[i] = *(const float4 *)&sq[(ty + 16 * i) * LD + d];
            for (int j = 0; j < CN; j++) kv[j] = *(const float4 *)&sk[(tx + 16 * j) * LD + d];
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < CN; j++) s[i][j] += dot4(qv[i], kv[j]);
        }
        for (int i = 0; i < RM; i++) {
            int r = q0 + ty + 16 * i;
            float mx = -INFINITY;
            for (int j = 0; j < CN; j++) {
                int c = k0 + tx + 16 * j;
                s[i][j] = c <= r && c < T ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = row_max16(mx);
            /* finite: the first step holds key 0, which every row sees */
            float mn = fmaxf(m[i], mx), corr = expf(m[i] - mn), sum = 0.0f;
            for (int j = 0; j < CN; j++) {
                float p = expf(s[i][j] - mn);
                sp[(ty + 16 * i) * LP + tx + 16 * j] = p;
                sum += p;
            }
            l[i] = l[i] * corr + row_sum16(sum);
            m[i] = mn;
            for (int j = 0; j < NJ; j++) o[i][j] *= corr;
        }
        __syncthreads();
        const int kn = min(BK, kend - k0);
        for (int kk = 0; kk < kn; kk++) {
            float pv[RM];
            for (int i = 0; i < RM; i++) pv[i] = sp[(ty + 16 * i) * LP + kk];
            for (int j = 0; j < NJ; j++) {
                int c = tx + 16 * j;
                if (c < hd) {
                    float vv = sv[kk * LD + c];
                    for (int i = 0; i < RM; i++) o[i][j] += pv[i] * vv;
                }
            }
        }
    }
    for (int i = 0; i < RM; i++) {
        int r = q0 + ty + 16 * i;
        if (r >= T) continue;
        float inv = 1.0f / l[i];
        float *y = out + ((size_t)b * T + r) * A + (size_t)h * hd;
        for (int j = 0; j < NJ; j++) {
            int c = tx + 16 * j;
            if (c < hd) y[c] = o[i][j] * inv;
        }
        if (tx == 0) lse[((size_t)b * NH + h) * T + r] = m[i] + logf(l[i]);
    }
}

/* Backward, dQ: BQ = 16 RM query rows, BK = 16 CN keys a step.  Per row, over the keys j it
 * sees: P = exp(scale q.k_j - lse), dP = dO . v_j, D += P dP, A1 += P dP k_j, A2 += P k_j;
 * then dQ = scale (A1 - D A2) (= scale sum_j P (dP - D) k_j) and D goes to dsum.
 * Shared: Q, dO [BQ][LD], K, V [BK][LD], P, P dP [BQ][BK + 1]. */
template <int RM, int CN, int NJ>
__global__ static void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_k(float *dqkv, float *dsum, const float *dout, const float *qkv, const float *lse,
                  int T, int NH, int NKV, int hd)
{
    MK_DYNAMIC_SMEM(float4, att_smem4);
    float *sm = (float *)att_smem4;
    const int BQ = 16 * RM, BK = 16 * CN, LP = BK + 1;
    const int HP = (hd + 3) & ~3, LD = HP + 4;
    float *sq = sm, *sdo = sq + BQ * LD, *sk = sdo + BQ * LD, *sv = sk + BK * LD;
    float *sp = sv + BK * LD, *spd = sp + BQ * LP;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const size_t W = (size_t)(NH + 2 * NKV) * hd, A = (size_t)NH * hd;
    const float *rows = qkv + (size_t)b * T * W;
    const float *kg = rows + (size_t)(NH + h / G) * hd,
                *vg = rows + (size_t)(NH + NKV + h / G) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t lo = ((size_t)b * NH + h) * T; /* this head's rows in lse and dsum */

    att_load(sq, rows + (size_t)h * hd, W, q0, BQ, T, hd, HP, LD);
    att_load(sdo, dout + (size_t)b * T * A + (size_t)h * hd, A, q0, BQ, T, hd, HP, LD);
    float ls[RM], dd[RM], a1[RM][NJ], a2[RM][NJ];
    for (int i = 0; i < RM; i++) {
        int r = q0 + ty + 16 * i;
        ls[i] = r < T ? lse[lo + r] : 0.0f;
        dd[i] = 0.0f;
        for (int j = 0; j < NJ; j++) a1[i][j] = a2[i][j] = 0.0f;
    }
    const int kend = min(T, q0 + BQ);
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        att_load(sk, kg, W, k0, BK, T, hd, HP, LD);
        att_load(sv, vg, W, k0, BK, T, hd, HP, LD);
        __syncthreads();
        float s[RM][CN], dp[RM][CN];
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < CN; j++) s[i][j] = dp[i][j] = 0.0f;
        for (int d = 0; d < HP; d += 4) {
            float4 qv[RM], gv[RM], kv[CN], vv[CN];
            for (int i = 0; i < RM; i++) {
                qv[i] = *(const float4 *)&sq[(ty + 16 * i) * LD + d];
                gv[i] = *(const float4 *)&sdo[(ty + 16 * i) * LD + d];
            }
            for (int j = 0; j < CN; j++) {
                kv[j] = *(const float4 *)&sk[(tx + 16 * j) * LD + d];
                vv[j] = *(const float4 *)&sv[(tx + 16 * j) * LD + d];
            }
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < CN; j++) {
                    s[i][j] += dot4(qv[i], kv[j]);
                    dp[i][j] += dot4(gv[i], vv[j]);
                }
        }
        for (int i = 0; i < RM; i++) {
            int r = q0 + ty + 16 * i;
            for (int j = 0; j < CN; j++) {
                int c = k0 + tx + 16 * j;
                float p = c <= r && c < T && r < T ? expf(s[i][j] * scale - ls[i]) : 0.0f;
                float pd = p * dp[i][j];
                dd[i] += pd;
                sp[(ty + 16 * i) * LP + tx + 16 * j] = p;
                spd[(ty + 16 * i) * LP + tx + 16 * j] = pd;
            }
        }
        __syncthreads();
        const int kn = min(BK, kend - k0);
        for (int kk = 0; kk < kn; kk++) {
            float pv[RM], pdv[RM];
            for (int i = 0; i < RM; i++) {
                pv[i] = sp[(ty + 16 * i) * LP + kk];
                pdv[i] = spd[(ty + 16 * i) * LP + kk];
            }
            for (int j = 0; j < NJ; j++) {
                int c = tx + 16 * j;
                if (c < hd) {
                    float kv = sk[kk * LD + c];
                    for (int i = 0; i < RM; i++) {
                        a1[i][j] += pdv[i] * kv;
                        a2[i][j] += pv[i] * kv;
                    }
                }
            }
        }
    }
    for (int i = 0; i < RM; i++) {
        int r = q0 + ty + 16 * i;
        float D = row_sum16(dd[i]); /* every thread of the row takes part */
        if (r >= T) continue;
        float *dq = dqkv + ((size_t)b * T + r) * W + (size_t)h * hd;
        for (int j = 0; j < NJ; j++) {
            int c = tx + 16 * j;
            if (c < hd) dq[c] = scale * (a1[i][j] - D * a2[i][j]);
        }
        if (tx == 0) dsum[lo + r] = D;
    }
}

/* Backward, dK and dV: BK = 16 RM keys of kv head g (the block's), BQ = 16 CN queries a step,
 * over every query head of the group and every query tile that reaches the key tile:
 *   P = exp(scale q.k - lse), dS = P (dO . v - D) scale, dV += P dO, dK += dS q.
 * Shared: K, V [BK][LD], Q, dO [BQ][LD], P^T, dS^T [BK][BQ + 1], lse, D [BQ]. */
template <int RM, int CN, int NJ>
__global__ static void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkv_k(float *dqkv, const float *dsum, const float *dout, const float *qkv,
                   const float *lse, int T, int NH, int NKV, int hd)
{
    MK_DYNAMIC_SMEM(float4, att_smem4);
    float *sm = (float *)att_smem4;
    const int BK = 16 * RM, BQ = 16 * CN, LP = BQ + 1;
    const int HP = (hd + 3) & ~3, LD = HP + 4;
    float *sk = sm, *sv = sk + BK * LD, *sq = sv + BK * LD, *sdo = sq + BQ * LD;
    float *sp = sdo + BQ * LD, *sds = sp + BK * LP, *sl = sds + BK * LP, *sd = sl + BQ;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int k0 = blockIdx.x * BK, g = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const size_t W = (size_t)(NH + 2 * NKV) * hd, A = (size_t)NH * hd;
    const float *rows = qkv + (size_t)b * T * W;
    const float scale = 1.0f / sqrtf((float)hd);

    att_load(sk, rows + (size_t)(NH + g) * hd, W, k0, BK, T, hd, HP, LD);
    att_load(sv, rows + (size_t)(NH + NKV + g) * hd, W, k0, BK, T, hd, HP, LD);
    float dk[RM][NJ], dv[RM][NJ];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < NJ; j++) dk[i][j] = dv[i][j] = 0.0f;
    for (int h = g * G; h < (g + 1) * G; h++) {
        const size_t lo = ((size_t)b * NH + h) * T;
        for (int q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) {
            __syncthreads(); /* the previous step's readers of Q, dO, P, dS, lse, D are done */
            att_load(sq, rows + (size_t)h * hd, W, q0, BQ, T, hd, HP, LD);
            att_load(sdo, dout + (size_t)b * T * A + (size_t)h * hd, A, q0, BQ, T, hd, HP, LD);
            for (int c = threadIdx.x; c < BQ; c += ATT_THREADS) {
                sl[c] = q0 + c < T ? lse[lo + q0 + c] : 0.0f;
                sd[c] = q0 + c < T ? dsum[lo + q0 + c] : 0.0f;
            }
            __syncthreads();
            float s[RM][CN], dp[RM][CN];
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < CN; j++) s[i][j] = dp[i][j] = 0.0f;
            for (int d = 0; d < HP; d += 4) {
                float4 kv[RM], vv[RM], qv[CN], gv[CN];
                for (int i = 0; i < RM; i++) {
                    kv[i] = *(const float4 *)&sk[(ty + 16 * i) * LD + d];
                    vv[i] = *(const float4 *)&sv[(ty + 16 * i) * LD + d];
                }
                for (int j = 0; j < CN; j++) {
                    qv[j] = *(const float4 *)&sq[(tx + 16 * j) * LD + d];
                    gv[j] = *(const float4 *)&sdo[(tx + 16 * j) * LD + d];
                }
                for (int i = 0; i < RM; i++)
                    for (int j = 0; j < CN; j++) {
                        s[i][j] += dot4(kv[i], qv[j]);
                        dp[i][j] += dot4(vv[i], gv[j]);
                    }
            }
            for (int i = 0; i < RM; i++) {
                int kr = k0 + ty + 16 * i;
                for (int j = 0; j < CN; j++) {
                    int qc = tx + 16 * j, q = q0 + qc;
                    float p = kr <= q && q < T && kr < T ? expf(s[i][j] * scale - sl[qc]) : 0.0f;
                    sp[(ty + 16 * i) * LP + qc] = p;
                    sds[(ty + 16 * i) * LP + qc] = p * (dp[i][j] - sd[qc]) * scale;
                }
            }
            __syncthreads();
            const int qn = min(BQ, T - q0);
            for (int qq = 0; qq < qn; qq++) {
                float pv[RM], dsv[RM];
                for (int i = 0; i < RM; i++) {
                    pv[i] = sp[(ty + 16 * i) * LP + qq];
                    dsv[i] = sds[(ty + 16 * i) * LP + qq];
                }
                for (int j = 0; j < NJ; j++) {
                    int c = tx + 16 * j;
                    if (c < hd) {
                        float gq = sdo[qq * LD + c], qx = sq[qq * LD + c];
                        for (int i = 0; i < RM; i++) {
                            dv[i][j] += pv[i] * gq;
                            dk[i][j] += dsv[i] * qx;
                        }
                    }
                }
            }
        }
    }
    for (int i = 0; i < RM; i++) {
        int kr = k0 + ty + 16 * i;
        if (kr >= T) continue;
        float *row = dqkv + ((size_t)b * T + kr) * W;
        for (int j = 0; j < NJ; j++) {
            int c = tx + 16 * j;
            if (c < hd) {
                row[(size_t)(NH + g) * hd + c] = dk[i][j];
                row[(size_t)(NH + NKV + g) * hd + c] = dv[i][j];
            }
        }
    }
}

/* ---- launches ----------------------------------------------------------- */

#define ATT_LAUNCHED() MK_LAUNCHED("an attention kernel")

static size_t att_ld(int hd)
{
    return (size_t)((hd + 3) & ~3) + 4;
}

/* lets kernel k use `bytes` of dynamic shared memory (above the default 48 KB); set at every
 * launch (a host call of about a microsecond), so that it holds on whichever device is current
 * and no static state is shared between threads */
template <typename K> static void att_smem(K *k, size_t bytes)
{
    cudaError_t e =
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        mk__die(__FILE__, __LINE__, cudaGetErrorString(e),
                "the attention kernels need up to ~77 KB of shared memory a block (sm_80 or "
                "later)");
}

template <int RM, int CN, int NJ>
static void fwd_launch(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
                       int hd)
{
    size_t bytes = sizeof(float) * ((16 * RM + 2 * 16 * CN) * att_ld(hd) + 16 * RM * (16 * CN + 1));
    att_smem(attn_fwd_k<RM, CN, NJ>, bytes);
    dim3 grid((unsigned)((T + 16 * RM - 1) / (16 * RM)), (unsigned)NH, (unsigned)B);
    MK_LAUNCH(grid, ATT_THREADS, bytes, attn_fwd_k<RM, CN, NJ>)(out, lse, qkv, T, NH, NKV, hd);
    ATT_LAUNCHED();
}

/* dQ (and D) with tiles <RQ, CQ>, then dK, dV with tiles <RK, CK> */
template <int RQ, int CQ, int RK, int CK, int NJ>
static void bwd_launch(float *dqkv, float *dsum, const float *dout, const float *qkv,
                       const float *lse, int B, int T, int NH, int NKV, int hd)
{
    size_t LD = att_ld(hd);
    size_t bq = sizeof(float) * ((2 * 16 * RQ + 2 * 16 * CQ) * LD + 2 * 16 * RQ * (16 * CQ + 1));
    size_t bk = sizeof(float) *
                ((2 * 16 * RK + 2 * 16 * CK) * LD + 2 * 16 * RK * (16 * CK + 1) + 2 * 16 * CK);
    att_smem(attn_bwd_dq_k<RQ, CQ, NJ>, bq);
    att_smem(attn_bwd_dkv_k<RK, CK, NJ>, bk);
    dim3 gq((unsigned)((T + 16 * RQ - 1) / (16 * RQ)), (unsigned)NH, (unsigned)B);
    MK_LAUNCH(gq, ATT_THREADS, bq, attn_bwd_dq_k<RQ, CQ, NJ>)
    (dqkv, dsum, dout, qkv, lse, T, NH, NKV, hd);
    ATT_LAUNCHED();
    dim3 gk((unsigned)((T + 16 * RK - 1) / (16 * RK)), (unsigned)NKV, (unsigned)B);
    MK_LAUNCH(gk, ATT_THREADS, bk, attn_bwd_dkv_k<RK, CK, NJ>)
    (dqkv, dsum, dout, qkv, lse, T, NH, NKV, hd);
    ATT_LAUNCHED();
}

static void att_check(int T, int NH, int NKV, int hd)
{
    if (hd < 1 || hd > 256 || NKV < 1 || NH % NKV != 0 || T < 1)
        mk__die(__FILE__, __LINE__, "CUDA attention: unsupported shape",
                "head size 1..256, NH a multiple of NKV, T >= 1");
}

/* the table's attn_fwd: out [B,T,NH hd]; att's first B NH T floats receive the log-sum-exp
 * of each row's scaled scores (the rest of att is untouched) */
void mk__cuda_attn_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                       int hd)
{
    if (B == 0 || T == 0) return;
    att_check(T, NH, NKV, hd);
    /* query tile x key tile: 64 x 64 up to hd 64, 64 x 32 up to 128, 32 x 16 up to 256 */
    if (hd <= 16)
        fwd_launch<4, 4, 1>(out, att, qkv, B, T, NH, NKV, hd);
    else if (hd <= 32)
        fwd_launch<4, 4, 2>(out, att, qkv, B, T, NH, NKV, hd);
    else if (hd <= 64)
        fwd_launch<4, 4, 4>(out, att, qkv, B, T, NH, NKV, hd);
    else if (hd <= 128)
        fwd_launch<4, 2, 8>(out, att, qkv, B, T, NH, NKV, hd);
    else
        fwd_launch<2, 1, 16>(out, att, qkv, B, T, NH, NKV, hd);
}

/* the table's attn_bwd: dqkv [B,T,W] overwritten; att as attn_fwd left it (log-sum-exp);
 * datt's first B NH T floats receive D per query row (scratch) */
void mk__cuda_attn_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                       const float *att, int B, int T, int NH, int NKV, int hd)
{
    if (B == 0 || T == 0) return;
    att_check(T, NH, NKV, hd);
    /* dQ: query tile x key tile 64 x 32 up to hd 64, 32 x 32 up to 128, 16 x 16 up to 256;
     * dK/dV: key tile x query tile 32 x 64, 32 x 32, 16 x 16 (smaller key tiles: more blocks,
     * there being only NKV kv heads) */
    if (hd <= 16)
        bwd_launch<4, 2, 2, 4, 1>(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
    else if (hd <= 32)
        bwd_launch<4, 2, 2, 4, 2>(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
    else if (hd <= 64)
        bwd_launch<4, 2, 2, 4, 4>(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
    else if (hd <= 128)
        bwd_launch<2, 2, 2, 2, 8>(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
    else
        bwd_launch<1, 1, 1, 1, 16>(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
}
