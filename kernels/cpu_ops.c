/*
 * cpu_ops.c - the CPU back-end: the reference implementation of every op in
 * the back-end table, plus the library's thread setting.
 *
 * One pool of threads, OpenMP's, does all the work: matrix products are split
 * into row (or column) blocks, each handed to single-threaded OpenBLAS
 * (cblas_sgemm) on one thread of the team; everything else is a plain loop
 * split over rows (or heads, or column blocks).  Two pools - OpenMP's and
 * OpenBLAS's own - each spin-waiting for work, starve each other on a small
 * machine.  Loops too small to be worth waking the team run serially.  Reductions are written so
 * that no two threads add into the same element: backward ops that sum over rows split the work by
 * columns instead.  Elementwise loops use float arithmetic; per-row softmax sums use double where
 * rounding would show in the tests.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I (the imaginary unit) would replace the
 * parameter named I (the MLP's inner width) in mk_internal.h and below; nothing here uses it. */
#undef I

#include "mk_internal.h"

/* ---- threads and the BLAS kernel choice -------------------------------- */

/* Loops over fewer elements than this run on the calling thread: waking the
 * team costs more than it saves, and on a loaded machine every barrier can
 * wait a whole scheduler quantum for a descheduled thread. */
#define PAR_MIN 131072

/* The hot loops are compiled three times - AVX-512, AVX2+FMA and baseline
 * x86-64 - and the loader picks one for this CPU (GCC/clang target_clones,
 * an ifunc), so one binary runs anywhere and uses the full vector width. */
#if defined(__x86_64__) && defined(__GNUC__)
#define MK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MK_CLONES
#endif

static int n_threads = 1; /* set from OpenMP's default at first use */

/* OpenBLAS built with DYNAMIC_ARCH picks its kernels from the CPU's model
 * number.  Under some hypervisors the model is generic and OpenBLAS 0.3.21
 * falls back to "Prescott" (SSE3) kernels, 7x slower than the AVX-512 ones
 * the CPU can run.  When that happens, and the user has not chosen with
 * OPENBLAS_CORETYPE, choose from the CPU's feature flags instead and re-run
 * OpenBLAS's own start-up selection (gotoblas_dynamic_quit/init, the same
 * code that reads OPENBLAS_CORETYPE at load time).  The symbols are weak, so
 * a single-architecture OpenBLAS simply keeps its kernels. */
extern char *openblas_get_corename(void);
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void choose_blas_kernels(void)
{
    if (getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    const char *core = openblas_get_corename();
    const char *old[] = {"Prescott", "Core2",      "Penryn",    "Dunnington", "Nehalem",    "Atom",
                         "Katmai",   "Coppermine", "Northwood", "Banias",     "Sandybridge"};
    int is_old = 0;
    for (size_t i = 0; core && i < sizeof old / sizeof old[0]; i++)
        if (!strcmp(core, old[i])) is_old = 1;
    if (!is_old) return;
    const char *want = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
}

static void choose_vector_kernels(void);

static void blas_init_once(void)
{
    choose_blas_kernels();
    choose_vector_kernels();
    /* our OpenMP team is the only pool; OpenBLAS runs inside it */
    openblas_set_num_threads(1);
    n_threads = omp_get_max_threads();
}

void mk__blas_init(void)
{
    pthread_once(&blas_once, blas_init_once);
}

void mk_set_threads(int n)
{
    mk__blas_init();
    if (n <= 0) n = omp_get_num_procs();
    n_threads = n;
    omp_set_num_threads(n);
    /* one pool only: OpenBLAS runs on the calling thread, inside our OpenMP
     * team (see gemm below), so its own spinning workers never compete with
     * ours for the cores */
    openblas_set_num_threads(1);
}

int mk_get_threads(void)
{
    return n_threads;
}

/* ---- memory ------------------------------------------------------------- */

/* Large arrays (weights, optimiser state, activations, KV caches) are aligned
 * to 2 MiB and offered to the kernel as transparent huge pages: the skinny
 * matmuls of a decoding step read a weight row every few KiB, so with 4 KiB
 * pages nearly every row is a TLB miss. */
#define HUGE_MIN ((size_t)2 << 20)

/* Large arrays come straight from mmap: the kernel hands out zero pages on first touch, so
 * an array that is never written (an inference-only rollout's, or gradients before the
 * first step) costs nothing, and creating a model does not spend seconds clearing
 * gigabytes it is about to overwrite.  Each mapping is trimmed to a 2 MiB-aligned range of
 * exactly the rounded size; the table below remembers the sizes for munmap. */
enum { MAX_MAPS = 512 };
static struct {
    void *p;
    size_t n;
} maps[MAX_MAPS];
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

static void *map_aligned(size_t rounded)
{
    size_t span = rounded + HUGE_MIN;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE_MIN - 1) / HUGE_MIN * HUGE_MIN);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + span - (p + rounded));
    if (tail) munmap(p + rounded, tail);
    return p;
}

static int cpu_alloc(void **p, size_t bytes)
{
    size_t align = bytes >= HUGE_MIN ? HUGE_MIN : 64;
    size_t rounded = (bytes + align - 1) / align * align;
    if (rounded == 0) rounded = 64;
    *p = NULL;
    if (align == HUGE_MIN) {
        pthread_mutex_lock(&maps_lock);
        int slot = -1;
        for (int i = 0; i < MAX_MAPS && slot < 0; i++)
            if (!maps[i].p) slot = i;
        if (slot >= 0 && (*p = map_aligned(rounded))) {
            maps[slot].p = *p;
            maps[slot].n = rounded;
        }
        pthread_mutex_unlock(&maps_lock);
        if (*p) {
#ifdef MADV_HUGEPAGE
            (void)madvise(*p, rounded, MADV_HUGEPAGE);
#endif
            return MK_OK;
        }
    }
    *p = aligned_alloc(align, rounded);
    if (!*p) return mk__fail(MK_ERR_NOMEM, "cannot allocate %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    if (align == HUGE_MIN) (void)madvise(*p, rounded, MADV_HUGEPAGE);
#endif
    memset(*p, 0, rounded);
    return MK_OK;
}

static void cpu_release(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&maps_lock);
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].p == p) {
            munmap(p, maps[i].n);
            maps[i].p = NULL;
            pthread_mutex_unlock(&maps_lock);
            return;
        }
    pthread_mutex_unlock(&maps_lock);
    free(p);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_zero(void *p, size_t bytes)
{
    if (bytes) memset(p, 0, bytes);
}

/* ---- embeddings --------------------------------------------------------- */

static void embed_fwd(float *out, const int *tokens, const int *pos, const float *wte,
                      const float *wpe, int R, int C)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *te = wte + (size_t)tokens[r] * C;
        float *o = out + (size_t)r * C;
        if (wpe) {
            const float *pe = wpe + (size_t)pos[r] * C;
            for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
        } else {
            memcpy(o, te, sizeof(float) * C);
        }
    }
}

/* Rows may share a token (or a position), so the work is split by columns. */
static void embed_bwd(float *dwte, float *dwpe, const float *dout, const int *tokens,
                      const int *pos, int R, int C)
{
#pragma omp parallel num_threads(n_threads) if ((size_t)R * C > PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * C;
            float *te = dwte + (size_t)tokens[r] * C;
            for (int c = c0; c < c1; c++) te[c] += d[c];
            if (dwpe) {
                float *pe = dwpe + (size_t)pos[r] * C;
                for (int c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
    }
}

/* ---- LayerNorm ---------------------------------------------------------- */

/* One row of LayerNorm; the sums are vector reductions (their order is the compiler's). */
MK_CLONES static void ln_row(float *o, float *mean, float *rstd, const float *x, const float *w,
                             const float *b, int C, float eps)
{
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) {
        float d = x[c] - m;
        var += d * d;
    }
    var /= C;
    float s = 1.0f / sqrtf(var + eps);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    if (mean) *mean = m;
    if (rstd) *rstd = s;
}

/* The team from 16k elements on: a decoding step's 64 rows of 384 are worth it. */
static void ln_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int R, int C, float eps)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > 16384)
    for (int r = 0; r < R; r++)
        ln_row(out + (size_t)r * C, mean ? mean + r : NULL, rstd ? rstd + r : NULL,
               inp + (size_t)r * C, w, b, C, eps);
}

static void ln_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int R, int C)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
        float m = mean[r], s = rstd[r];
        float dn_mean = 0.0f, dn_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float dn = d[c] * w[c];
            dn_mean += dn;
            dn_norm_mean += dn * (x[c] - m) * s;
        }
        dn_mean /= C;
        dn_norm_mean /= C;
        float *di = dinp + (size_t)r * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            di[c] += (d[c] * w[c] - dn_mean - norm * dn_norm_mean) * s;
        }
    }
#pragma omp parallel num_threads(n_threads) if ((size_t)R * C > PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int r = 0; r < R; r++) {
            const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
            float m = mean[r], s = rstd[r];
            for (int c = c0; c < c1; c++) {
                dw[c] += d[c] * (x[c] - m) * s;
                db[c] += d[c];
            }
        }
    }
}

/* ---- RMSNorm ------------------------------------------------------------ */

/* One row of RMSNorm as transformers' LlamaRMSNorm computes it in float: the mean square, its
 * reciprocal square root s, then w * (x * s) (x scaled first, then the weight).  Returns s. */
MK_CLONES static float rms_row(float *o, const float *x, const float *w, int C, float eps)
{
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float s = 1.0f / sqrtf(ss / C + eps);
    for (int c = 0; c < C; c++) o[c] = w[c] * (x[c] * s);
    return s;
}

/* The input gradient of one RMSNorm row, y = w x s with s = (mean(x^2) + eps)^-1/2:
 *   dx_j = s w_j d_j - s^3 x_j / C sum_c d_c w_c x_c.
 * Adds into di, or overwrites it when overwrite is set (then di may be d itself). */
MK_CLONES static void rms_row_bwd(float *di, const float *d, const float *x, const float *w,
                                  float s, int C, int overwrite)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) dot += d[c] * w[c] * x[c];
    float k = s * s * s * dot / C;
    if (overwrite)
        for (int c = 0; c < C; c++) di[c] = s * w[c] * d[c] - k * x[c];
    else
        for (int c = 0; c < C; c++) di[c] += s * w[c] * d[c] - k * x[c];
}

static void rms_fwd(float *out, float *rstd, const float *inp, const float *w, int R, int C,
                    float eps)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > 16384)
    for (int r = 0; r < R; r++) {
        float s = rms_row(out + (size_t)r * C, inp + (size_t)r * C, w, C, eps);
        if (rstd) rstd[r] = s;
    }
}

/* add then norm, row by row (the sums and the norm exactly as add and ln_fwd / rms_fwd) */
static void add_norm_fwd(float *res, float *out, float *mean, float *rstd, const float *a,
                         const float *b, const float *w, const float *bias, int R, int C, float eps,
                         int rms)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > 16384)
    for (int r = 0; r < R; r++) {
        size_t o = (size_t)r * C;
        for (int c = 0; c < C; c++) res[o + c] = a[o + c] + b[o + c];
        if (rms) {
            float s = rms_row(out + o, res + o, w, C, eps);
            if (rstd) rstd[r] = s;
        } else {
            ln_row(out + o, mean ? mean + r : NULL, rstd ? rstd + r : NULL, res + o, w, bias, C,
                   eps);
        }
    }
}

static void rms_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                    const float *rstd, int R, int C)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * C > PAR_MIN)
    for (int r = 0; r < R; r++)
        rms_row_bwd(dinp + (size_t)r * C, dout + (size_t)r * C, inp + (size_t)r * C, w, rstd[r], C,
                    0);
#pragma omp parallel num_threads(n_threads) if ((size_t)R * C > PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int r = 0; r < R; r++) {
            const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
            float s = rstd[r];
            for (int c = c0; c < c1; c++) dw[c] += d[c] * (x[c] * s);
        }
    }
}

/* ---- rotary positions and the q/k norms --------------------------------- */

/* Rotates one head of hd floats in place by the angles of one position (cs, sn: hd/2 each), in
 * transformers' rotate_half form: x * cos + rotate_half(x) * sin. */
static inline void rotate_head(float *x, const float *cs, const float *sn, int hd)
{
    int h2 = hd / 2;
    for (int i = 0; i < h2; i++) {
        float a = x[i], b = x[i + h2];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h2] = b * cs[i] + a * sn[i];
    }
}

/* The transpose of rotate_head (the rotation by minus the angles), from d into o. */
static inline void unrotate_head(float *o, const float *d, const float *cs, const float *sn, int hd)
{
    int h2 = hd / 2;
    for (int i = 0; i < h2; i++) {
        float a = d[i], b = d[i + h2];
        o[i] = a * cs[i] + b * sn[i];
        o[i + h2] = b * cs[i] - a * sn[i];
    }
}

/* Row by row: each query head (0..NH) and key head (NH..NH+NKV) normalised when its weight is
 * given, then rotated; value heads copied. */
static void qk_fwd(float *out, float *rstd, const float *inp, const float *wq, const float *wk,
                   const float *cosb, const float *sinb, const int *pos, int R, int NH, int NKV,
                   int hd, float eps)
{
    int W = (NH + 2 * NKV) * hd, h2 = hd / 2;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * W > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * W;
        float *o = out + (size_t)r * W;
        const float *cs = cosb + (size_t)pos[r] * h2, *sn = sinb + (size_t)pos[r] * h2;
        for (int h = 0; h < NH + NKV; h++) {
            const float *w = h < NH ? wq : wk;
            float *oh = o + (size_t)h * hd;
            if (w) {
                float s = rms_row(oh, x + (size_t)h * hd, w, hd, eps);
                if (rstd) rstd[(size_t)r * (NH + NKV) + h] = s;
            } else {
                memcpy(oh, x + (size_t)h * hd, sizeof(float) * hd);
            }
            rotate_head(oh, cs, sn, hd);
        }
        memcpy(o + (size_t)(NH + NKV) * hd, x + (size_t)(NH + NKV) * hd, sizeof(float) * NKV * hd);
    }
}

/* Row by row, the gradient through the rotation (its transpose), then through each head's norm;
 * value gradients copied.  The norm weights' gradients sum over rows and heads, so they are a
 * second pass split by columns: no two threads add into the same element. */
static void qk_bwd(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp,
                   const float *wq, const float *wk, const float *rstd, const float *cosb,
                   const float *sinb, const int *pos, int R, int NH, int NKV, int hd)
{
    int W = (NH + 2 * NKV) * hd, h2 = hd / 2, NQK = NH + NKV;
    if ((wq || wk) && !rstd)
        mk__die(__FILE__, __LINE__, "qk_bwd: q/k norm weights given without their rstd",
                "pass the rstd array that qk_fwd filled");
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * W > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *d = dout + (size_t)r * W, *x = inp + (size_t)r * W;
        float *di = dinp + (size_t)r * W;
        const float *cs = cosb + (size_t)pos[r] * h2, *sn = sinb + (size_t)pos[r] * h2;
        for (int h = 0; h < NQK; h++) {
            const float *w = h < NH ? wq : wk;
            float *dh = di + (size_t)h * hd;
            unrotate_head(dh, d + (size_t)h * hd, cs, sn, hd);
            if (w) rms_row_bwd(dh, dh, x + (size_t)h * hd, w, rstd[(size_t)r * NQK + h], hd, 1);
        }
        memcpy(di + (size_t)NQK * hd, d + (size_t)NQK * hd, sizeof(float) * NKV * hd);
    }
    if (!dwq && !dwk) return;
#pragma omp parallel num_threads(n_threads) if ((size_t)R * W > PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)hd * id / nt), c1 = (int)((long)hd * (id + 1) / nt);
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * W, *x = inp + (size_t)r * W;
            const float *cs = cosb + (size_t)pos[r] * h2, *sn = sinb + (size_t)pos[r] * h2;
            for (int h = 0; h < NQK; h++) {
                float *dw = h < NH ? (wq ? dwq : NULL) : (wk ? dwk : NULL);
                if (!dw) continue;
                const float *dh = d + (size_t)h * hd, *xh = x + (size_t)h * hd;
                float s = rstd[(size_t)r * NQK + h];
                for (int c = c0; c < c1; c++) {
                    /* element c of the unrotated gradient: the normalised input's gradient */
                    float dn = c < h2 ? dh[c] * cs[c] + dh[c + h2] * sn[c]
                                      : dh[c] * cs[c - h2] - dh[c - h2] * sn[c - h2];
                    dw[c] += dn * (xh[c] * s);
                }
            }
        }
    }
}

/* ---- matrix products ---------------------------------------------------- */

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, split over the OpenMP team:
 * each thread calls single-threaded OpenBLAS on a block of rows of C (or of
 * columns, when C is wider than tall, as for a decoding step's one row).
 * lda, ldb, ldc are the row lengths of the stored matrices. */
static void gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc)
{
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    int nt = n_threads;
    if (nt <= 1 || 2.0 * M * N * K < 2e7) { /* below ~50 us of work: not worth a barrier */
        cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* two blocks per thread, handed out dynamically: on a shared machine a
     * thread that loses its core delays one block, not half the product.  Not
     * more: every block packs the whole of the operand it shares with the
     * others (B when split by rows), and at four blocks per thread that
     * packing cost a tenth of a 10M training step. */
    int by_rows = M >= N;
    int len = by_rows ? M : N, units = len / 16;
    int nb = 2 * nt < units ? 2 * nt : (units > 0 ? units : 1);
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (int blk = 0; blk < nb; blk++) {
        /* blocks of whole 16-float vectors for the micro-kernels; the last takes the rest */
        int b0 = (int)((long)units * blk / nb) * 16;
        int b1 = blk == nb - 1 ? len : (int)((long)units * (blk + 1) / nb) * 16;
        if (b1 <= b0) continue;
        if (by_rows)
            cblas_sgemm(CblasRowMajor, TA, TB, b1 - b0, N, K, alpha,
                        ta ? A + b0 : A + (size_t)b0 * lda, lda, B, ldb, beta, C + (size_t)b0 * ldc,
                        ldc);
        else
            cblas_sgemm(CblasRowMajor, TA, TB, M, b1 - b0, K, alpha, A, lda,
                        tb ? B + (size_t)b0 * ldb : B + b0, ldb, beta, C + b0, ldc);
    }
}

/* Rows at most this many go to skinny_mm instead of BLAS. */
#define SKINNY_ROWS 96

/* Rows of w per k-block: a block of the strip (SKINNY_KB x 64 floats, 32 KiB) is copied to a
 * contiguous buffer that stays in L1 while every row tile passes over it.  (In place, its rows lie
 * OC floats apart, a multiple of 1.5 KiB, and map onto a quarter or less of L1's sets.) */
#define SKINNY_KB 128
/* Rows of a packed bfloat16 strip that skinny_tile asks the cache for ahead of their use (4 KiB:
 * the hardware prefetchers stop at page boundaries, and a strip's rows stream from memory; one
 * request per 128-byte row, the adjacent-line prefetcher bringing its pair, measured best on
 * this machine: +35% at one row). */
#define SKINNY_PF_ROWS 32

/* 16 floats as one GCC vector; the unaligned, aliasing variant reads and writes plain arrays */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
#define load16(p)     (*(const v16u *)(p))
#define store16(p, v) (*(v16u *)(p) = (v))

/* The vector kernels below (the skinny product, decode attention) are written once as
 * always-inline functions and compiled into three callers - AVX-512+FMA, AVX2+FMA and baseline
 * x86-64, with contraction into FMA allowed - one of which is picked at start-up from the CPU's
 * flags (target_clones would pick by CPU model, which some hypervisors hide).  Their tile sizes
 * are arguments that the callers pass as constants, so each inlined copy keeps its accumulators
 * in vector registers. */
#define MK_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define MK_VEC_X86 1
#define MK_AVX512  __attribute__((target("avx512f,fma"), optimize("fp-contract=fast")))
#define MK_AVX2    __attribute__((target("avx2,fma"), optimize("fp-contract=fast")))
#endif

/* A row of a 64-column strip, as 4 vectors of 16 floats (columns 0-15, 16-31, 32-47, 48-63).
 * Float weights as they are.  The packed bfloat16 strip (to_bf16) holds its rows in pairs
 * (k, k + 1), each pair as 64 32-bit words, word j being column j of row k in its low half and
 * of row k + 1 in its high half; a bfloat16 is the top half of a float, so one 64-byte load gives
 * row k's 16 floats by a shift and row k + 1's by a mask, exactly.  The same pairs are what the
 * AMX tile product reads (see amx_strip).  A macro, as a function returning vectors would depend
 * on the caller's target for its ABI; hi selects row k + 1 of the pair at p. */
typedef uint32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16iu __attribute__((vector_size(64), aligned(2), may_alias));
#define wload_pair(p, hi, w0, w1, w2, w3)                                                          \
    do {                                                                                           \
        const v16iu *q_ = (const v16iu *)(p);                                                      \
        if (hi) {                                                                                  \
            const v16i m_ = (v16i){0} + 0xffff0000u;                                               \
            w0 = (v16)(q_[0] & m_), w1 = (v16)(q_[1] & m_);                                        \
            w2 = (v16)(q_[2] & m_), w3 = (v16)(q_[3] & m_);                                        \
        } else {                                                                                   \
            w0 = (v16)(q_[0] << 16), w1 = (v16)(q_[1] << 16);                                      \
            w2 = (v16)(q_[2] << 16), w3 = (v16)(q_[3] << 16);                                      \
        }                                                                                          \
    } while (0)

/* Rows of a packed bfloat16 weight's strips: IC rounded up to whole AMX tiles (32 rows), the
 * pad zero. */
static inline int b16_rows(int IC)
{
    return (IC + 31) / 32 * 32;
}

/* out[r0:r0+nr, c0:c0+64] (+)= inp[r0:r0+nr, k0:k1] w[k0:k1, c0:c0+64] with wb the rows k0..k1
 * of the strip: float rows ldw elements apart, or (b16) bfloat16 row pairs from the pair of
 * row k0 (k0 even); nr <= 6: nr x 4 accumulators of 16 floats.  The first k-block starts from
 * the bias, later ones from what the previous block stored (float in, float out: the sum is the
 * same as one pass).  Rows are summed in order of k whatever the layout. */
MK_INLINE void skinny_tile(float *out, const float *inp, const void *wb, int ldw, int b16,
                           const float *bias, int IC, int OC, int c0, int r0, int nr, int k0,
                           int k1)
{
    v16 acc[6][4];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) {
            float *o = out + (size_t)(r0 + r) * OC + c0 + 16 * j;
            acc[r][j] = k0 ? (v16)load16(o) : (bias ? (v16)load16(bias + c0 + 16 * j) : (v16){0});
        }
    for (int k = k0; k < k1; k++) {
        v16 w0, w1, w2, w3;
        if (b16) {
            /* the pair's 256 bytes: row k, then (reloaded from L1) row k + 1 */
            const uint16_t *p = (const uint16_t *)wb + (size_t)(k - k0) * 64;
            __builtin_prefetch(p + SKINNY_PF_ROWS * 64);
            __builtin_prefetch(p + SKINNY_PF_ROWS * 64 + 64);
            wload_pair(p, 0, w0, w1, w2, w3);
            for (int r = 0; r < nr; r++) {
                float a = inp[(size_t)(r0 + r) * IC + k];
                acc[r][0] += a * w0;
                acc[r][1] += a * w1;
                acc[r][2] += a * w2;
                acc[r][3] += a * w3;
            }
            if (++k == k1) break;
            wload_pair(p, 1, w0, w1, w2, w3);
        } else {
            const float *p = (const float *)wb + (size_t)(k - k0) * ldw;
            w0 = load16(p), w1 = load16(p + 16), w2 = load16(p + 32), w3 = load16(p + 48);
        }
        for (int r = 0; r < nr; r++) {
            float a = inp[(size_t)(r0 + r) * IC + k];
            acc[r][0] += a * w0;
            acc[r][1] += a * w1;
            acc[r][2] += a * w2;
            acc[r][3] += a * w3;
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) store16(out + (size_t)(r0 + r) * OC + c0 + 16 * j, acc[r][j]);
}

/* One 64-column strip of out (columns c0..c0+64) for every row, k-block by k-block: 6-row tiles
 * (24 accumulators) while they last, then a 4-, 2- and 1-row tile.  With more than one row tile
 * the k-block is first copied to a contiguous float buffer (widened from bfloat16 once, for all
 * the tiles); a single tile reads w in place, bfloat16 widened in registers.  Float weights are
 * w [IC, OC] as they are; bfloat16 ones are packed strip by strip (to_bf16): the strip's row
 * pairs lie one after the other, so that it streams through memory in order. */
MK_INLINE void skinny_strip_any(float *out, const float *inp, const void *w, int b16,
                                const float *bias, int R, int IC, int OC, int c0)
{
    float wp[SKINNY_KB * 64] __attribute__((aligned(64)));
    /* a block of rows k0.. starts k0 * 64 values into a bfloat16 strip (k0 even) */
    const void *base = b16 ? (const void *)((const uint16_t *)w + (size_t)c0 * b16_rows(IC))
                           : (const void *)((const float *)w + c0);
    for (int k0 = 0; k0 < IC; k0 += SKINNY_KB) {
        int k1 = k0 + SKINNY_KB < IC ? k0 + SKINNY_KB : IC;
        const void *wb = b16 ? (const void *)((const uint16_t *)base + (size_t)k0 * 64)
                             : (const void *)((const float *)base + (size_t)k0 * OC);
        int ldw = OC;
        if (R > 6) {
            for (int k = k0; k < k1; k++) {
                float *dst = wp + (size_t)(k - k0) * 64;
                v16 w0, w1, w2, w3;
                if (b16) {
                    wload_pair((const uint16_t *)wb + (size_t)((k - k0) & ~1) * 64, (k - k0) & 1,
                               w0, w1, w2, w3);
                } else {
                    const float *p = (const float *)wb + (size_t)(k - k0) * OC;
                    w0 = load16(p), w1 = load16(p + 16), w2 = load16(p + 32), w3 = load16(p + 48);
                }
                store16(dst, w0), store16(dst + 16, w1), store16(dst + 32, w2),
                    store16(dst + 48, w3);
            }
            wb = wp;
            ldw = 64;
        }
        int r0 = 0;
        if (R > 6) {
            for (; r0 + 6 <= R; r0 += 6)
                skinny_tile(out, inp, wb, ldw, 0, bias, IC, OC, c0, r0, 6, k0, k1);
            if (r0 + 4 <= R) {
                skinny_tile(out, inp, wb, ldw, 0, bias, IC, OC, c0, r0, 4, k0, k1);
                r0 += 4;
            }
            if (r0 + 2 <= R) {
                skinny_tile(out, inp, wb, ldw, 0, bias, IC, OC, c0, r0, 2, k0, k1);
                r0 += 2;
            }
            if (r0 < R) skinny_tile(out, inp, wb, ldw, 0, bias, IC, OC, c0, r0, 1, k0, k1);
        } else if (R == 6) {
            skinny_tile(out, inp, wb, ldw, b16, bias, IC, OC, c0, 0, 6, k0, k1);
        } else {
            if (r0 + 4 <= R) {
                skinny_tile(out, inp, wb, ldw, b16, bias, IC, OC, c0, r0, 4, k0, k1);
                r0 += 4;
            }
            if (r0 + 2 <= R) {
                skinny_tile(out, inp, wb, ldw, b16, bias, IC, OC, c0, r0, 2, k0, k1);
                r0 += 2;
            }
            if (r0 < R) skinny_tile(out, inp, wb, ldw, b16, bias, IC, OC, c0, r0, 1, k0, k1);
        }
    }
}

typedef void skinny_strip_fn(float *out, const float *inp, const void *w, const float *bias, int R,
                             int IC, int OC, int c0);
/* Each copy of the strip exists for float weights and for bfloat16 ones. */
#define SKINNY_COPY(name, attr, b16)                                                               \
    attr static void name(float *out, const float *inp, const void *w, const float *bias, int R,   \
                          int IC, int OC, int c0)                                                  \
    {                                                                                              \
        skinny_strip_any(out, inp, w, b16, bias, R, IC, OC, c0);                                   \
    }
#ifdef MK_VEC_X86
SKINNY_COPY(skinny_strip_avx512, MK_AVX512, 0)
SKINNY_COPY(skinny_strip_avx2, MK_AVX2, 0)
SKINNY_COPY(skinny_b16_avx512, MK_AVX512, 1)
SKINNY_COPY(skinny_b16_avx2, MK_AVX2, 1)
#endif
SKINNY_COPY(skinny_strip_base, , 0)
SKINNY_COPY(skinny_b16_base, , 1)
static skinny_strip_fn *skinny_strip = skinny_strip_base, *skinny_b16 = skinny_b16_base;

/* out[R,OC] = inp[R,IC] w[IC,OC] + bias for few rows (a decoding step, a
 * short prefill) with float weights, or for any number of rows with bfloat16
 * ones (b16).  BLAS packs all of w into a scratch layout on every call,
 * which for a handful of rows costs as much as the product; this reads w
 * once, in place.  Columns beyond the last multiple of 64 go to BLAS (float)
 * or a plain loop (bfloat16). */
static void skinny_mm(float *out, const float *inp, const void *w, int b16, const float *bias,
                      int R, int IC, int OC)
{
    int strips = OC / 64;
    /* work items: strips, and when there are few of them (C = 384 gives 6) also groups of at
     * least 12 rows, so that each thread gets about four items and a stalled thread delays one
     * (each group packs the strip's blocks again: cheap next to 12 rows of products) */
    int nt = n_threads, groups = (4 * nt + strips - 1) / (strips > 0 ? strips : 1);
    if (groups > R / 12) groups = R / 12;
    if (groups < 1) groups = 1;
    int items = strips * groups, units = R / 6;
    skinny_strip_fn *strip = b16 ? skinny_b16 : skinny_strip;
#pragma omp parallel for num_threads(n_threads)                                                    \
    schedule(dynamic, 1) if ((size_t)R * IC * OC > 8 * PAR_MIN)
    for (int it = 0; it < items; it++) {
        int s = it / groups, g = it % groups;
        int r0 = units * g / groups * 6, r1 = g == groups - 1 ? R : units * (g + 1) / groups * 6;
        strip(out + (size_t)r0 * OC, inp + (size_t)r0 * IC, w, bias, r1 - r0, IC, OC, 64 * s);
    }
    int done = strips * 64;
    if (done < OC) {
        for (int r = 0; r < R; r++)
            for (int c = done; c < OC; c++) out[(size_t)r * OC + c] = bias ? bias[c] : 0.0f;
        if (!b16) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, OC - done, IC, 1.0f, inp, IC,
                        (const float *)w + done, OC, 1.0f, out + done, OC);
            return;
        }
        /* packed after the strips: [IC, OC - done] */
        const uint16_t *wh = (const uint16_t *)w + (size_t)done * b16_rows(IC);
        int tail = OC - done;
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * OC + done;
            for (int k = 0; k < IC; k++) {
                float a = inp[(size_t)r * IC + k];
                for (int c = 0; c < tail; c++)
                    o[c] += a * mk__bf16_to_f32(wh[(size_t)k * tail + c]);
            }
        }
    }
}

/* With bfloat16 weights every product takes the skinny path, whatever the rows (a long
 * prefill too), so that a row's result does not depend on how many rows came with it. */
static void mm_fwd_bf16(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                        int IC, int OC)
{
    skinny_mm(out, inp, w, 1, bias, R, IC, OC);
}

/* The packed bfloat16 layout of a weight [IC, OC] (what skinny_strip_any and amx_strip read):
 * for each 64-column strip, b16_rows(IC) rows (the pad zero) in pairs of 64 32-bit words (see
 * wload_pair), one pair after the other; then the columns beyond the last strip as
 * [IC, OC % 64] as they are.  src is [IC, OC] or, transposed, [OC, IC] (the head's [V, C]).
 * Rounded to nearest even; strips in parallel over the team. */
static void to_bf16(uint16_t *dst, const float *src, int IC, int OC, int transposed)
{
    int strips = OC / 64, tail = OC - strips * 64, KP = b16_rows(IC);
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)IC * OC > PAR_MIN)
    for (int s = 0; s <= strips; s++) {
        int c0 = s * 64;
        if (s < strips) {
            uint16_t *d = dst + (size_t)c0 * KP;
            /* the pad: row IC's half of the last pair when IC is odd, then whole pairs */
            int full = (IC + 1) / 2;
            if (IC & 1)
                for (int j = 0; j < 64; j++) d[(size_t)(IC >> 1) * 128 + 2 * j + 1] = 0;
            memset(d + (size_t)full * 128, 0, sizeof(uint16_t) * (size_t)(KP / 2 - full) * 128);
            if (transposed) { /* a source row is one output column: 64 rows read in step */
                const float *col = src + (size_t)c0 * IC;
                for (int k = 0; k + 1 < IC; k += 2) {
                    uint16_t *dk = d + (size_t)(k >> 1) * 128;
                    for (int j = 0; j < 64; j++) {
                        dk[2 * j] = mk__f32_to_bf16(col[(size_t)j * IC + k]);
                        dk[2 * j + 1] = mk__f32_to_bf16(col[(size_t)j * IC + k + 1]);
                    }
                }
                if (IC & 1)
                    for (int j = 0; j < 64; j++)
                        d[(size_t)(IC >> 1) * 128 + 2 * j] =
                            mk__f32_to_bf16(col[(size_t)j * IC + IC - 1]);
            } else
                for (int k = 0; k < IC; k++) {
                    const float *row = src + (size_t)k * OC + c0;
                    uint16_t *dk = d + (size_t)(k >> 1) * 128 + (k & 1);
                    for (int j = 0; j < 64; j++) dk[2 * j] = mk__f32_to_bf16(row[j]);
                }
        } else if (tail) {
            uint16_t *d = dst + (size_t)c0 * KP;
            for (int k = 0; k < IC; k++)
                for (int j = 0; j < tail; j++)
                    d[(size_t)k * tail + j] = mk__f32_to_bf16(
                        transposed ? src[(size_t)(c0 + j) * IC + k] : src[(size_t)k * OC + c0 + j]);
        }
    }
}

/* ---- bfloat16 products (MK_MODEL_BF16_PRODUCTS) ------------------------- */

/* The activations rounded to bfloat16 are xb [R16, KP] (R16: R rounded up to 16 rows, KP =
 * b16_rows(IC); the pad zero), made once per product in the caller's scratch.  With AMX (Intel's
 * tile unit: Sapphire Rapids on) a strip is 16-row tiles: four accumulators of 16 x 16 floats,
 * one tile of 16 rows x 32 activations, and the weights' 16 row pairs x 16 columns as they lie in
 * the strip (a tile row 64 bytes, 256 apart); each tile product adds 32 products in float per
 * element, 16 K multiply-adds an instruction.  Without AMX, the product is the float one of the
 * rounded activations (skinny_mm on their float values): the same products, summed in another
 * order inside each 32 rows. */
static int have_amx, amx_ok;

#ifdef MK_VEC_X86
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MK_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* AMX when the CPU has it, the kernel enables its state (XCR0 bits 17 and 18) and grants this
 * process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16 on); MANTA_NO_AMX=1 says
 * no. */
static int amx_usable(void)
{
    const char *no = getenv("MANTA_NO_AMX");
    if (no && *no && strcmp(no, "0")) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return 0;               /* AMX-BF16, AMX-TILE */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* out[R, c0:c0+64] = xb ws + bias for the strip ws (rows r0.. of 16-row groups) */
MK_AMX static void amx_strip(float *out, const uint16_t *xb, const uint16_t *ws, const float *bias,
                             int R, int KP, int OC, int c0)
{
    struct amx_config cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    float acc[16 * 64] __attribute__((aligned(64)));
    for (int r0 = 0; r0 < R; r0 += 16) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const uint16_t *x = xb + (size_t)r0 * KP;
        for (int k = 0; k < KP; k += 32) {
            const uint16_t *b = ws + (size_t)k * 64; /* row pair k / 2 */
            for (int q = 0; q < 64; q++)             /* the step after next: 4 KiB, a line each */
                _mm_prefetch((const char *)(b + 2 * 2048 + 32 * q), _MM_HINT_T0);
            _tile_loadd(4, x + k, KP * (int)sizeof(uint16_t));
            _tile_loadd(5, b, 256);
            _tile_loadd(6, b + 32, 256);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(7, b + 64, 256);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, b + 96, 256);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, acc, 256);
        _tile_stored(1, acc + 16, 256);
        _tile_stored(2, acc + 32, 256);
        _tile_stored(3, acc + 48, 256);
        int nr = R - r0 < 16 ? R - r0 : 16;
        for (int r = 0; r < nr; r++) {
            float *o = out + (size_t)(r0 + r) * OC + c0;
            for (int j = 0; j < 64; j++) o[j] = acc[r * 64 + j] + (bias ? bias[c0 + j] : 0.0f);
        }
    }
    _tile_release();
}
#endif

/* xb [R16, KP] from inp [R, IC]: each activation rounded to bfloat16 as mk_f32_to_bf16, the pad
 * zero */
static void round_rows(uint16_t *xb, const float *inp, int R, int IC)
{
    int KP = b16_rows(IC), R16 = (R + 15) / 16 * 16;
    for (int r = 0; r < R16; r++) {
        uint16_t *d = xb + (size_t)r * KP;
        int n = r < R ? IC : 0;
        const uint32_t *u = (const uint32_t *)(const void *)(inp + (size_t)r * IC);
        for (int k = 0; k < n; k++) {
            uint32_t v = u[k];
            d[k] = (v & 0x7fffffffu) > 0x7f800000u
                       ? (uint16_t)(v >> 16 | 0x40)
                       : (uint16_t)((v + 0x7fffu + (v >> 16 & 1)) >> 16);
        }
        memset(d + n, 0, sizeof(uint16_t) * (size_t)(KP - n));
    }
}

static void mm_fwd_bf16a(float *out, const float *inp, const uint16_t *w, const float *bias, int R,
                         int IC, int OC, void *scratch)
{
    int KP = b16_rows(IC), R16 = (R + 15) / 16 * 16;
    uint16_t *xb = scratch;
    round_rows(xb, inp, R, IC);
    if (!have_amx) {
        /* the float product of the rounded activations, after the bfloat16 ones in scratch */
        float *xf = (float *)(void *)(xb + (size_t)R16 * KP);
        for (int r = 0; r < R; r++)
            for (int k = 0; k < IC; k++)
                xf[(size_t)r * IC + k] = mk__bf16_to_f32(xb[(size_t)r * KP + k]);
        skinny_mm(out, xf, w, 1, bias, R, IC, OC);
        return;
    }
#ifdef MK_VEC_X86
    int strips = OC / 64;
#pragma omp parallel for num_threads(n_threads)                                                    \
    schedule(dynamic, 1) if ((size_t)R16 * IC * OC > 32 * PAR_MIN)
    for (int s = 0; s < strips; s++)
        amx_strip(out, xb, w + (size_t)s * 64 * KP, bias, R, KP, OC, 64 * s);
    int done = strips * 64, tail = OC - done;
    if (tail) { /* [IC, tail] after the strips, the rounded activations by a plain loop */
        const uint16_t *wh = w + (size_t)done * KP;
        for (int r = 0; r < R; r++) {
            float *o = out + (size_t)r * OC + done;
            for (int c = 0; c < tail; c++) o[c] = bias ? bias[c + done] : 0.0f;
            for (int k = 0; k < IC; k++) {
                float a = mk__bf16_to_f32(xb[(size_t)r * KP + k]);
                for (int c = 0; c < tail; c++)
                    o[c] += a * mk__bf16_to_f32(wh[(size_t)k * tail + c]);
            }
        }
    }
#endif
}

int mk__cpu_amx(int enable)
{
    mk__blas_init();
    int was = have_amx;
    have_amx = enable && amx_ok;
    return was;
}

static void mm_fwd(float *out, const float *inp, const float *w, const float *bias, int R, int IC,
                   int OC)
{
    if (R <= SKINNY_ROWS) {
        skinny_mm(out, inp, w, 0, bias, R, IC, OC);
        return;
    }
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * OC > PAR_MIN)
        for (int r = 0; r < R; r++) memcpy(out + (size_t)r * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    gemm(0, 0, R, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

static void mm_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                   const float *w, int R, int IC, int OC)
{
    gemm(0, 1, R, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC);
    gemm(1, 0, IC, OC, R, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (dbias) {
#pragma omp parallel num_threads(n_threads) if ((size_t)R * OC > PAR_MIN)
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            int c0 = (int)((long)OC * id / nt), c1 = (int)((long)OC * (id + 1) / nt);
            for (int r = 0; r < R; r++) {
                const float *d = dout + (size_t)r * OC;
                for (int c = c0; c < c1; c++) dbias[c] += d[c];
            }
        }
    }
}

/* ---- bfloat16 training products (MK_MODEL_BF16_TRAIN) --------------------- */

static void round_bf16(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = mk__f32_to_bf16(src[i]);
}

/* Inner terms the products widen at a time (bb_scratch_k): blocks long enough for sgemm to run
 * at its rate, short enough that the scratch stays a small part of a layer. */
#define BB_K 64

/* dst [rows, n] (row length n) = columns k0 .. k0+n of src [rows, ld] widened (exactly) */
static void widen(float *dst, const uint16_t *src, int rows, int ld, int k0, int n)
{
#pragma omp parallel for num_threads(n_threads) schedule(static) if ((size_t)rows * n > PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = src + (size_t)r * ld + k0;
        float *d = dst + (size_t)r * n;
        for (int k = 0; k < n; k++) d[k] = mk__bf16_to_f32(s[k]);
    }
}

/* The reference: the operands widened to float, BB_K inner terms at a time, into the scratch,
 * and multiplied by sgemm, each block's sums added into the output.  A product of two bfloat16
 * values is exact in float, so this differs from tensor cores only in the order of the float
 * sums. */
static void mm_fwd_bb(float *out, const uint16_t *inp, const uint16_t *w, const float *bias, int R,
                      int IC, int OC, int wt, void *scratch)
{
    if (R == 0 || OC == 0) return;
    for (int r = 0; r < R; r++) /* the bias, or zero, that the blocks add into */
        if (bias)
            memcpy(out + (size_t)r * OC, bias, sizeof(float) * OC);
        else
            memset(out + (size_t)r * OC, 0, sizeof(float) * OC);
    float *xs = scratch, *ws = xs + (size_t)R * BB_K; /* [R, kb], and [kb, OC] or [OC, kb] */
    for (int k0 = 0; k0 < IC; k0 += BB_K) {
        int kb = IC - k0 < BB_K ? IC - k0 : BB_K;
        widen(xs, inp, R, IC, k0, kb);
        if (wt) { /* w [OC, IC]: columns k0.. of every row */
            widen(ws, w, OC, IC, k0, kb);
            gemm(0, 1, R, OC, kb, 1.0f, xs, kb, ws, kb, 1.0f, out, OC);
        } else { /* w [IC, OC]: rows k0.. */
            widen(ws, w + (size_t)k0 * OC, kb, OC, 0, OC);
            gemm(0, 0, R, OC, kb, 1.0f, xs, kb, ws, OC, 1.0f, out, OC);
        }
    }
}

static void mm_bwd_bb(float *dinp, float *dw, float *dbias, uint16_t *dout16, const float *dout,
                      const uint16_t *inp, const uint16_t *w, int R, int IC, int OC, int wt,
                      void *scratch)
{
    if (R == 0) return;
    round_bf16(dout16, dout, (size_t)R * OC);
    /* dinp = d w^T over blocks of the OC inner terms: d [R, ob], w's [IC, ob] or [ob, IC] */
    memset(dinp, 0, sizeof(float) * (size_t)R * IC);
    float *ds = scratch, *ws = ds + (size_t)R * BB_K;
    for (int o0 = 0; o0 < OC; o0 += BB_K) {
        int ob = OC - o0 < BB_K ? OC - o0 : BB_K;
        widen(ds, dout16, R, OC, o0, ob);
        if (wt) {
            widen(ws, w + (size_t)o0 * IC, ob, IC, 0, IC);
            gemm(0, 0, R, IC, ob, 1.0f, ds, ob, ws, IC, 1.0f, dinp, IC);
        } else {
            widen(ws, w, IC, OC, o0, ob);
            gemm(0, 1, R, IC, ob, 1.0f, ds, ob, ws, ob, 1.0f, dinp, IC);
        }
    }
    /* dw += x^T d (or d^T x in [OC, IC]) over blocks of the R inner terms */
    float *xs = scratch, *dr = xs + (size_t)BB_K * IC; /* [rb, IC], [rb, OC] */
    for (int r0 = 0; r0 < R; r0 += BB_K) {
        int rb = R - r0 < BB_K ? R - r0 : BB_K;
        widen(xs, inp + (size_t)r0 * IC, rb, IC, 0, IC);
        widen(dr, dout16 + (size_t)r0 * OC, rb, OC, 0, OC);
        if (wt)
            gemm(1, 0, OC, IC, rb, 1.0f, dr, OC, xs, IC, 1.0f, dw, IC);
        else
            gemm(1, 0, IC, OC, rb, 1.0f, xs, IC, dr, OC, 1.0f, dw, OC);
    }
    if (dbias) /* the float dout, unrounded */
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * OC;
            for (int c = 0; c < OC; c++) dbias[c] += d[c];
        }
}

/* Logits of vocabulary rows [v0, v1) for R rows of inp: each embedding row is read once and
 * dotted with every input row (which stay in cache). */
MK_CLONES static void head_rows(float *logits, const float *inp, const float *wte, int R, int C,
                                int V, int v0, int v1)
{
    for (int v = v0; v < v1; v++) {
        const float *w = wte + (size_t)v * C;
        for (int r = 0; r < R; r++) {
            const float *x = inp + (size_t)r * C;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < C; i++) s += x[i] * w[i];
            logits[(size_t)r * V + v] = s;
        }
    }
}

/* A decoding step's few rows against a large vocabulary: BLAS would re-pack all of wte
 * ([V, C], 0.5 GB for a 150k vocabulary at C = 896) on every call; reading it once, row by
 * row, is what the step costs at least.  Many rows (training): one sgemm. */
static void head_fwd(float *logits, const float *inp, const float *wte, int R, int C, int V)
{
    if (R > SKINNY_ROWS) {
        gemm(0, 1, R, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
        return;
    }
    enum { VB = 512 };
    int blocks = (V + VB - 1) / VB;
#pragma omp parallel for num_threads(n_threads)                                                    \
    schedule(dynamic, 1) if ((size_t)R * V * C > PAR_MIN)
    for (int b = 0; b < blocks; b++) {
        int v0 = b * VB, v1 = v0 + VB < V ? v0 + VB : V;
        head_rows(logits, inp, wte, R, C, V, v0, v1);
    }
}

static void head_bwd(float *dinp, float *dwte, const float *dlogits, const float *inp,
                     const float *wte, int R, int C, int V)
{
    gemm(0, 0, R, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp, C);
    gemm(1, 0, V, C, R, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
}

/* ---- vectorised helpers ------------------------------------------------- */

/* e^x for x in float range, without a libm call so that loops vectorise:
 * x = n ln2 + r with |r| <= ln2/2, e^r by Cephes' degree-5 polynomial
 * (about 1 ulp), 2^n built in the exponent bits. */
static inline float fast_expf(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* round to nearest by the 1.5 * 2^23 trick: no libm call, so it vectorises */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* tanh(u) = (e^2u - 1) / (e^2u + 1); |u| > 9 is +-1 to float precision */
static inline float fast_tanhf(float u)
{
    u = u < -9.0f ? -9.0f : (u > 9.0f ? 9.0f : u);
    float e = fast_expf(2.0f * u);
    return (e - 1.0f) / (e + 1.0f);
}

/* Softmax of x[0..n) in place. */
MK_CLONES static void softmax_inplace(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = fast_expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* ---- attention ---------------------------------------------------------- */

/* Per (b, h): scores = scale Q K^T and Y = P V as two matrix products on the
 * head's strided slices of qkv (row length W), query head h reading key and
 * value head h / G, the causal mask and the softmax in between.  The products
 * compute the upper triangle too and throw it away: at T <= 256 that is
 * cheaper than any loop over the triangle.  (b, h) pairs run in parallel,
 * each calling single-threaded BLAS. */
static void attn_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                     int hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    int G = NH / NKV, W = (NH + 2 * NKV) * hd, A = NH * hd;
#pragma omp parallel for num_threads(n_threads) collapse(2)                                        \
    schedule(dynamic, 1) if ((size_t)B * T * T * A > PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *row0 = qkv + (size_t)b * T * W;
            const float *q = row0 + h * hd, *k = row0 + (NH + h / G) * hd,
                        *v = row0 + (NH + NKV + h / G) * hd;
            float *a = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, q, W, k, W, 0.0f,
                        a, T);
            for (int t = 0; t < T; t++) {
                float *row = a + (size_t)t * T;
                softmax_inplace(row, t + 1);
                for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, a, T, v, W, 0.0f,
                        out + (size_t)b * T * A + h * hd, A);
        }
}

/* dS = P * (dP - rowsum(P dP)) * scale over the causal triangle, in place */
MK_CLONES static void softmax_bwd_rows(float *dp, const float *p, int T, float scale)
{
    for (int t = 0; t < T; t++) {
        float *d = dp + (size_t)t * T;
        const float *a = p + (size_t)t * T;
        float s = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) s += a[t2] * d[t2];
        for (int t2 = 0; t2 <= t; t2++) d[t2] = a[t2] * (d[t2] - s) * scale;
        for (int t2 = t + 1; t2 < T; t2++) d[t2] = 0.0f;
    }
}

/* Two passes over the heads' slices of dqkv (overwritten).  Per (b, h): dP =
 * dY V^T, dS from the softmax (datt [B,NH,T,T] holds dP, then dS), dQ = dS K.
 * Per (b, kv head g): dK = sum of dS^T Q and dV = sum of P^T dY over the
 * query heads of g's group, the first product overwriting and the others
 * adding, so that no two threads write one kv head.  When (b, g) pairs are
 * too few for the team (a few sequences of a model with few kv heads), each
 * is split further into blocks of key positions: the rows a..b of dK and dV
 * come from the columns a..b of dS and P, which are zero above the diagonal,
 * so a block's products start at query position a. */
static void attn_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                     const float *att, int B, int T, int NH, int NKV, int hd)
{
    float scale = 1.0f / sqrtf((float)hd);
    int G = NH / NKV, W = (NH + 2 * NKV) * hd, A = NH * hd;
    int par = (size_t)B * T * T * A > PAR_MIN;
#pragma omp parallel for num_threads(n_threads) collapse(2) schedule(dynamic, 1) if (par)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t o = (size_t)b * T * W;
            const float *k = qkv + o + (NH + h / G) * hd, *v = qkv + o + (NH + NKV + h / G) * hd;
            const float *p = att + ((size_t)b * NH + h) * T * T;
            float *dp = datt + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * A + h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dy, A, v, W, 0.0f,
                        dp, T);
            softmax_bwd_rows(dp, p, T, scale);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, dp, T, k, W,
                        0.0f, dqkv + o + h * hd, W);
        }
    /* blocks of key positions per (b, g): enough items for two per thread, blocks of at least
     * 16 positions */
    int pairs = B * NKV, nblk = par ? (2 * n_threads + pairs - 1) / pairs : 1;
    if (nblk > T / 16) nblk = T / 16;
    if (nblk < 1) nblk = 1;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (par)
    for (int it = 0; it < pairs * nblk; it++) {
        int b = it / (NKV * nblk), g = it / nblk % NKV, blk = it % nblk;
        /* blocks of equal work: block i ends where (T - a)^2 has shrunk by i / nblk */
        int a0 = blk ? T - (int)(T * sqrt(1.0 - (double)blk / nblk)) : 0;
        int a1 = blk + 1 < nblk ? T - (int)(T * sqrt(1.0 - (double)(blk + 1) / nblk)) : T;
        if (a1 <= a0) continue;
        size_t o = (size_t)b * T * W + (size_t)a0 * W;
        float *dk = dqkv + o + (NH + g) * hd, *dv = dqkv + o + (NH + NKV + g) * hd;
        for (int j = 0; j < G; j++) {
            int h = g * G + j;
            const float *q = qkv + o + h * hd;
            const float *dy = dout + ((size_t)b * T + a0) * A + h * hd;
            const float *p = att + ((size_t)b * NH + h) * T * T + (size_t)a0 * T + a0;
            const float *ds = datt + ((size_t)b * NH + h) * T * T + (size_t)a0 * T + a0;
            float beta = j ? 1.0f : 0.0f;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, a1 - a0, hd, T - a0, 1.0f, ds, T,
                        q, W, beta, dk, W);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, a1 - a0, hd, T - a0, 1.0f, p, T,
                        dy, A, beta, dv, W);
        }
    }
}

static void kv_store(float *kc, float *vc, const float *qkv, const int *slot, const int *pos, int R,
                     int NH, int NKV, int hd, int Tmax)
{
    int W = (NH + 2 * NKV) * hd, KV = NKV * hd;
    for (int r = 0; r < R; r++) {
        size_t o = ((size_t)slot[r] * Tmax + pos[r]) * KV;
        memcpy(kc + o, qkv + (size_t)r * W + (size_t)NH * hd, sizeof(float) * KV);
        memcpy(vc + o, qkv + (size_t)r * W + (size_t)(NH + NKV) * hd, sizeof(float) * KV);
    }
}

/* kv_store into bfloat16 caches: each value rounded to nearest even (nan kept quiet) */
static void kv_store_bf16(uint16_t *kc, uint16_t *vc, const float *qkv, const int *slot,
                          const int *pos, int R, int NH, int NKV, int hd, int Tmax)
{
    int W = (NH + 2 * NKV) * hd, KV = NKV * hd;
    for (int r = 0; r < R; r++) {
        size_t o = ((size_t)slot[r] * Tmax + pos[r]) * KV;
        const float *k = qkv + (size_t)r * W + (size_t)NH * hd, *v = k + KV;
        for (int i = 0; i < KV; i++) {
            kc[o + i] = mk__f32_to_bf16(k[i]);
            vc[o + i] = mk__f32_to_bf16(v[i]);
        }
    }
}

/* Element i of a cache of floats or (b16) bfloat16s, widened exactly as it is read */
static inline float kv_at(const void *p, int b16, size_t i)
{
    return b16 ? mk__bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* a . b[off .. off + n) with b a cache of floats or (b16) bfloat16s */
static inline float dot_kv(const float *a, const void *b, int b16, size_t off, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * kv_at(b, b16, off + i);
    return s;
}

/* One row's attention for one head of any size over its slot's cache (positions KV values apart;
 * floats, or with b16 bfloat16s widened as they are read - a constant in each inlined copy), in
 * plain loops that the compiler vectorises.  a: scratch [n]. */
MK_INLINE void attend_one_head_kv(float *y, const float *q, const void *k, const void *v, int b16,
                                  int n, int KV, int hs, float scale, float *a)
{
    for (int t = 0; t < n; t++) a[t] = dot_kv(q, k, b16, (size_t)t * KV, hs) * scale;
    softmax_inplace(a, n);
    for (int i = 0; i < hs; i++) y[i] = 0.0f;
    for (int t = 0; t < n; t++) {
        size_t vt = (size_t)t * KV;
        float p = a[t];
#pragma omp simd
        for (int i = 0; i < hs; i++) y[i] += p * kv_at(v, b16, vt + i);
    }
}

/* attend_one_head_kv for the head sizes that are not 16, 32, ..., 128 (the fallback of the
 * vector path), one copy for each kind of cache. */
MK_CLONES static void attend_one_head(float *y, const float *q, const void *k, const void *v,
                                      int b16, int n, int KV, int hs, float scale, float *a)
{
    if (b16)
        attend_one_head_kv(y, q, k, v, 1, n, KV, hs, scale, a);
    else
        attend_one_head_kv(y, q, k, v, 0, n, KV, hs, scale, a);
}

/* 16 bfloat16s widened (exactly: a bfloat16 is the top half of a float) to 16 floats, and the
 * 16 values at element off of a cache of floats or (b16) bfloat16s.  Macros, as load16. */
typedef uint16_t v16hu __attribute__((vector_size(32), aligned(2), may_alias));
#define load16b(p) ((v16)(__builtin_convertvector(*(const v16hu *)(p), v16i) << 16))
#define load16kv(p, b16, off)                                                                      \
    ((b16) ? load16b((const uint16_t *)(p) + (off)) : (v16)load16((const float *)(p) + (off)))
/* Vector i of nv (a head of 16 nv values) at element off, in the order the value pass
 * accumulates: floats in order; bfloat16s by pairs of vectors, as the packed weights (wload_pair):
 * one 64-byte load of values 32c .. 32c + 31 gives vector 2c, the even ones, by a shift and
 * vector 2c + 1, the odd ones, by a mask (no shuffle port, which the widening above uses); the
 * last vector of an odd nv in order.  The pass puts pairs back in order as it stores them; each
 * value's sum is the same as in order. */
#define load16v(p, b16, off, i, nv)                                                                \
    (!(b16)                      ? (v16)load16((const float *)(p) + (off) + 16 * (i))              \
     : (i) == (nv)-1 && (nv) % 2 ? load16b((const uint16_t *)(p) + (off) + 16 * (i))               \
     : (i) % 2 ? (v16)(*(const v16iu *)((const uint16_t *)(p) + (off) + 16 * ((i)-1)) &            \
                       ((v16i){0} + 0xffff0000u))                                                  \
               : (v16)(*(const v16iu *)((const uint16_t *)(p) + (off) + 16 * (i)) << 16))

/* Sum of the 16 lanes, pairwise. */
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
MK_INLINE float hsum16(const v16 *s)
{
    v8f h8 = __builtin_shufflevector(*s, *s, 0, 1, 2, 3, 4, 5, 6, 7) +
             __builtin_shufflevector(*s, *s, 8, 9, 10, 11, 12, 13, 14, 15);
    v4f h4 =
        __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* Attention of one row over its slot's cache for ng consecutive kv heads and the G query heads
 * that read each (query head j of the call reads kv head j / G; GPT-2 is G = 1), hs = 16 nv
 * floats a head (nv <= 8): q and y point at the first query head's slice of the row and of the
 * output (heads hs apart), k and v at the first kv head's slice of position 0's key and value
 * (positions KV values apart; floats, or with b16 bfloat16s widened as they are read - b16 is a
 * constant in every copy, so each has one kind of load); a: scratch [ng G, Tmax].  Three
 * passes:
 *  - scores position by position, every head of the call per position, so the keys stream
 *    through memory in order and each key row is read once for its whole group of query heads;
 *    each head's dot product is nv vector products summed in a register;
 *  - the softmax of each head's n scores;
 *  - per query head, the probability-weighted sum of its kv head's values, its nv vectors in
 *    registers, in two sets (even and odd positions) so that consecutive positions do not wait
 *    on each other's FMA.  The heads of a group follow each other, so the values the first
 *    reads from memory the others find in cache.
 */
MK_INLINE void attend_heads(float *y, const float *q, const void *k, const void *v, int b16, int n,
                            int KV, int ng, int G, int nv, float scale, float *a, int Tmax)
{
    int hs = 16 * nv, nh = ng * G;
    for (int t = 0; t < n; t++) {
        size_t kt = (size_t)t * KV;
        for (int g = 0; g < ng; g++) {
            size_t kh = kt + (size_t)g * hs;
            v16 kr[8]; /* the key, read (and widened) once for the group */
            for (int i = 0; i < nv; i++) kr[i] = load16kv(k, b16, kh + 16 * i);
            for (int j = 0; j < G; j++) {
                int h = g * G + j;
                const float *qh = q + h * hs;
                v16 s = (v16)load16(qh) * kr[0];
                for (int i = 1; i < nv; i++) s += (v16)load16(qh + 16 * i) * kr[i];
                a[(size_t)h * Tmax + t] = hsum16(&s) * scale;
            }
        }
    }
    for (int h = 0; h < nh; h++) softmax_inplace(a + (size_t)h * Tmax, n);
    for (int h = 0; h < nh; h++) {
        const float *p = a + (size_t)h * Tmax;
        size_t vh = (size_t)(h / G) * hs;
        v16 even[8], odd[8];
        for (int i = 0; i < nv; i++) even[i] = odd[i] = (v16){0};
        int t = 0;
        for (; t + 2 <= n; t += 2) {
            size_t v0 = vh + (size_t)t * KV, v1 = v0 + KV;
            for (int i = 0; i < nv; i++) {
                even[i] += p[t] * load16v(v, b16, v0, i, nv);
                odd[i] += p[t + 1] * load16v(v, b16, v1, i, nv);
            }
        }
        if (t < n)
            for (int i = 0; i < nv; i++)
                even[i] += p[t] * load16v(v, b16, vh + (size_t)t * KV, i, nv);
        for (int i = 0; i < nv; i++) {
            v16 yi = even[i] + odd[i];
            if (b16 && !(i == nv - 1 && nv % 2)) { /* a pair: back in order */
                v16 hi = even[i + 1] + odd[i + 1];
                store16(y + h * hs + 16 * i,
                        __builtin_shufflevector(yi, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6,
                                                22, 7, 23));
                store16(y + h * hs + 16 * i + 16,
                        __builtin_shufflevector(yi, hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13,
                                                29, 14, 30, 15, 31));
                i++;
            } else {
                store16(y + h * hs + 16 * i, yi);
            }
        }
    }
}

/* attend_heads with a constant nv, and G = 1 (GPT-2, or one query head a call) as a constant too
 * so that its copy has no group loop. */
MK_INLINE void attend_heads_nv(float *y, const float *q, const void *k, const void *v, int b16,
                               int n, int KV, int ng, int G, int nv, float scale, float *a,
                               int Tmax)
{
    if (G == 1)
        attend_heads(y, q, k, v, b16, n, KV, ng, 1, nv, scale, a, Tmax);
    else
        attend_heads(y, q, k, v, b16, n, KV, ng, G, nv, scale, a, Tmax);
}

/* attend_heads for hs = 16, 32, ..., 128: one call per head size, each with a constant nv. */
MK_INLINE void attend_heads_any(float *y, const float *q, const void *k, const void *v, int b16,
                                int n, int KV, int ng, int G, int hs, float scale, float *a,
                                int Tmax)
{
    switch (hs / 16) {
    case 1:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 1, scale, a, Tmax);
        break;
    case 2:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 2, scale, a, Tmax);
        break;
    case 3:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 3, scale, a, Tmax);
        break;
    case 4:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 4, scale, a, Tmax);
        break;
    case 5:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 5, scale, a, Tmax);
        break;
    case 6:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 6, scale, a, Tmax);
        break;
    case 7:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 7, scale, a, Tmax);
        break;
    case 8:
        attend_heads_nv(y, q, k, v, b16, n, KV, ng, G, 8, scale, a, Tmax);
        break;
    default:
        mk__die(__FILE__, __LINE__, "attend_heads: head size not 16..128", NULL);
    }
}

/* Head sizes the vector path takes: multiples of 16 up to 128. */
static int attend_vector_ok(int hs)
{
    return hs % 16 == 0 && hs >= 16 && hs <= 128;
}

/* attend_heads_any over float caches (b16 0) or bfloat16 ones (1), each a copy of its own */
typedef void attend_fn(float *y, const float *q, const void *k, const void *v, int b16, int n,
                       int KV, int ng, int G, int hs, float scale, float *a, int Tmax);
#define ATTEND_BOTH(y, q, k, v, b16, n, KV, ng, G, hs, scale, a, Tmax)                             \
    do {                                                                                           \
        if (b16)                                                                                   \
            attend_heads_any(y, q, k, v, 1, n, KV, ng, G, hs, scale, a, Tmax);                     \
        else                                                                                       \
            attend_heads_any(y, q, k, v, 0, n, KV, ng, G, hs, scale, a, Tmax);                     \
    } while (0)
#ifdef MK_VEC_X86
MK_AVX512 static void attend_heads_avx512(float *y, const float *q, const void *k, const void *v,
                                          int b16, int n, int KV, int ng, int G, int hs,
                                          float scale, float *a, int Tmax)
{
    ATTEND_BOTH(y, q, k, v, b16, n, KV, ng, G, hs, scale, a, Tmax);
}
MK_AVX2 static void attend_heads_avx2(float *y, const float *q, const void *k, const void *v,
                                      int b16, int n, int KV, int ng, int G, int hs, float scale,
                                      float *a, int Tmax)
{
    ATTEND_BOTH(y, q, k, v, b16, n, KV, ng, G, hs, scale, a, Tmax);
}
#endif
static void attend_heads_base(float *y, const float *q, const void *k, const void *v, int b16,
                              int n, int KV, int ng, int G, int hs, float scale, float *a, int Tmax)
{
    ATTEND_BOTH(y, q, k, v, b16, n, KV, ng, G, hs, scale, a, Tmax);
}
static attend_fn *attend_vector = attend_heads_base;

/* att: scratch [R, NH, Tmax] for the scores, row r's heads at att + r NH Tmax.  Work items:
 *  - enough rows (the vector path): one a row, all its heads, so that its keys and values
 *    stream in order once;
 *  - fewer (batch 1, a prompt): one a (row, kv head) with its group of query heads, so that
 *    every thread has work and each key row is still read once for the group; when even those
 *    are too few for the team, one a (row, query head);
 *  - the fallback for other head sizes: one a (row, query head).
 * The caches are floats, or (b16) bfloat16s: attn_decode and attn_decode_bf16. */
static void attn_decode_any(float *out, float *att, const float *qkv, const void *kc,
                            const void *vc, int b16, const int *slot, const int *pos, int R, int NH,
                            int NKV, int hd, int Tmax)
{
    int G = NH / NKV, W = (NH + 2 * NKV) * hd, A = NH * hd, KV = NKV * hd;
    float scale = 1.0f / sqrtf((float)hd);
    size_t work = 0; /* multiply-adds: each row attends to pos + 1 cached positions */
    for (int r = 0; r < R; r++) work += (size_t)(pos[r] + 1) * 2 * A;
    int vec = attend_vector_ok(hd);
    /* per: query heads an item; ng: kv heads an item (0: one query head reading its kv head) */
    int per = 1, ng = 0;
    if (vec && R >= 4 * n_threads)
        per = NH, ng = NKV;
    else if (vec && (G == 1 || R * NKV >= 2 * n_threads))
        per = G, ng = 1;
    int items = R * (NH / per);
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (work > 4 * PAR_MIN)
    for (int it = 0; it < items; it++) {
        int r = it / (NH / per), h = it % (NH / per) * per, g = h / G;
        size_t base = (size_t)slot[r] * Tmax * KV + (size_t)g * hd;
        float *y = out + (size_t)r * A + (size_t)h * hd;
        const float *q = qkv + (size_t)r * W + (size_t)h * hd;
        float *a = att + ((size_t)r * NH + h) * Tmax;
        const void *k = b16 ? (const void *)((const uint16_t *)kc + base)
                            : (const void *)((const float *)kc + base);
        const void *v = b16 ? (const void *)((const uint16_t *)vc + base)
                            : (const void *)((const float *)vc + base);
        if (!vec)
            attend_one_head(y, q, k, v, b16, pos[r] + 1, KV, hd, scale, a);
        else if (ng)
            attend_vector(y, q, k, v, b16, pos[r] + 1, KV, ng, G, hd, scale, a, Tmax);
        else
            attend_vector(y, q, k, v, b16, pos[r] + 1, KV, 1, 1, hd, scale, a, Tmax);
    }
}

static void attn_decode(float *out, float *att, const float *qkv, const float *kc, const float *vc,
                        const int *slot, const int *pos, int R, int NH, int NKV, int hd, int Tmax)
{
    attn_decode_any(out, att, qkv, kc, vc, 0, slot, pos, R, NH, NKV, hd, Tmax);
}

static void attn_decode_bf16(float *out, float *att, const float *qkv, const uint16_t *kc,
                             const uint16_t *vc, const int *slot, const int *pos, int R, int NH,
                             int NKV, int hd, int Tmax)
{
    attn_decode_any(out, att, qkv, kc, vc, 1, slot, pos, R, NH, NKV, hd, Tmax);
}

/* Picks the vector kernels' copies for this CPU (once, from blas_init_once). */
static void choose_vector_kernels(void)
{
#ifdef MK_VEC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
        skinny_strip = skinny_strip_avx512;
        skinny_b16 = skinny_b16_avx512;
        attend_vector = attend_heads_avx512;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        skinny_strip = skinny_strip_avx2;
        skinny_b16 = skinny_b16_avx2;
        attend_vector = attend_heads_avx2;
    }
    have_amx = amx_ok = amx_usable();
#endif
}

/* ---- GELU, SwiGLU and residuals ------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define CHUNK  8192                /* elements per parallel work item */

MK_CLONES static void gelu_fwd_chunk(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

MK_CLONES static void gelu_bwd_chunk(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = fast_tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

/* GELU costs a tanh per element, so it is worth the team from a few chunks (a decoding step's
 * 64 rows of 4C) on. */
static void gelu_fwd(float *out, const float *inp, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (n > 4 * CHUNK)
    for (size_t c = 0; c < nc; c++) {
        size_t o = c * CHUNK, len = n - o < CHUNK ? n - o : CHUNK;
        gelu_fwd_chunk(out + o, inp + o, len);
    }
}

static void gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (n > PAR_MIN)
    for (size_t c = 0; c < nc; c++) {
        size_t o = c * CHUNK, len = n - o < CHUNK ? n - o : CHUNK;
        gelu_bwd_chunk(dinp + o, inp + o, dout + o, len);
    }
}

/* SwiGLU, row by row (a row's gate and up halves lie I floats apart): out = silu(g) u with
 * silu(g) = g sigmoid(g); backward dg = d u sig (1 + g (1 - sig)), du = d silu(g). */
MK_CLONES static void swiglu_fwd_row(float *o, const float *g, const float *u, int I)
{
    for (int i = 0; i < I; i++) {
        float x = g[i];
        o[i] = x / (1.0f + fast_expf(-x)) * u[i];
    }
}

MK_CLONES static void swiglu_bwd_row(float *dg, float *du, const float *g, const float *u,
                                     const float *d, int I)
{
    for (int i = 0; i < I; i++) {
        float x = g[i], sig = 1.0f / (1.0f + fast_expf(-x));
        dg[i] = d[i] * u[i] * sig * (1.0f + x * (1.0f - sig));
        du[i] = d[i] * x * sig;
    }
}

/* An exp per element: worth the team from a few chunks on, as GELU. */
static void swiglu_fwd(float *out, const float *inp, int R, int I)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * I > 4 * CHUNK)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * 2 * I;
        swiglu_fwd_row(out + (size_t)r * I, x, x + I, I);
    }
}

static void swiglu_bwd(float *dinp, const float *inp, const float *dout, int R, int I)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * I > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * 2 * I;
        float *dx = dinp + (size_t)r * 2 * I;
        swiglu_bwd_row(dx, dx + I, x, x + I, dout + (size_t)r * I, I);
    }
}

static void add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4096) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ---- softmax rows: log-probs, entropy, their gradients ------------------ */

/* log-sum-exp of z[0..V) and sum p*z, in double */
static void row_lse(const float *z, int V, double *lse, double *pz)
{
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
    double s = 0.0, sz = 0.0;
    for (int j = 0; j < V; j++) {
        double e = exp((double)z[j] - mx);
        s += e;
        sz += e * z[j];
    }
    *lse = mx + log(s);
    *pz = sz / s;
}

static void row_stats(float *logp, float *ent, const float *logits, const int *targets, int R,
                      int V)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * V > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *z = logits + (size_t)r * V;
        double lse, pz;
        row_lse(z, V, &lse, &pz);
        int t = targets ? targets[r] : -1;
        if (logp) logp[r] = t >= 0 ? (float)(z[t] - lse) : 0.0f;
        if (ent) ent[r] = (float)(lse - pz);
    }
}

static void row_grad(float *dlogits, const float *logits, const int *targets, const float *ct,
                     const float *ch, int R, int V)
{
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4) if ((size_t)R * V > PAR_MIN)
    for (int r = 0; r < R; r++) {
        const float *z = logits + (size_t)r * V;
        float *d = dlogits + (size_t)r * V;
        /* no target: log p(target) is the constant 0, so only entropy counts */
        float a = ct && targets[r] >= 0 ? ct[r] : 0.0f, e = ch ? ch[r] : 0.0f;
        if (a == 0.0f && e == 0.0f) {
            memset(d, 0, sizeof(float) * V);
            continue;
        }
        double lse, pz;
        row_lse(z, V, &lse, &pz);
        double H = lse - pz;
        for (int j = 0; j < V; j++) {
            double lp = z[j] - lse, p = exp(lp);
            d[j] = (float)(-a * p - e * p * (lp + H));
        }
        if (a != 0.0f) d[targets[r]] += a;
    }
}

/* ---- optimiser ---------------------------------------------------------- */

MK_CLONES static void adamw_chunk(float *p, const float *g, float *m, float *v, size_t n, float lr,
                                  float beta1, float beta2, float eps, float wd, float bc1,
                                  float bc2)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] * (1.0f - lr * wd);
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

void mk_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
              float beta2, float eps, float weight_decay, int t)
{
    mk__blas_init(); /* thread count and BLAS set up even without a model */
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    size_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (n > PAR_MIN)
    for (size_t c = 0; c < nc; c++) {
        size_t o = c * CHUNK, len = n - o < CHUNK ? n - o : CHUNK;
        adamw_chunk(p + o, g + o, m + o, v + o, len, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
    }
}

double mk_sumsq(const float *x, size_t n)
{
    mk__blas_init(); /* thread count and BLAS set up even without a model */
    double s = 0.0;
/* static: the same split every time, so the double sum is reproducible */
#pragma omp parallel for num_threads(n_threads) reduction(+ : s) schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void mk_scale(float *x, float s, size_t n)
{
    mk__blas_init(); /* thread count and BLAS set up even without a model */
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 4096) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

float mk_clip_factor(double sumsq, float max_norm)
{
    if (max_norm <= 0.0f) return 1.0f;
    double norm = sqrt(sumsq);
    double f = max_norm / (norm + 1e-6);
    return f < 1.0 ? (float)f : 1.0f;
}

/* ---- the table ---------------------------------------------------------- */

const mk_backend mk__cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .embed_fwd = embed_fwd,
    .embed_bwd = embed_bwd,
    .ln_fwd = ln_fwd,
    .ln_bwd = ln_bwd,
    .rms_fwd = rms_fwd,
    .rms_bwd = rms_bwd,
    .mm_fwd = mm_fwd,
    .mm_bwd = mm_bwd,
    .mm_fwd_bf16 = mm_fwd_bf16,
    .to_bf16 = to_bf16,
    .mm_fwd_bf16a = mm_fwd_bf16a,
    .head_fwd = head_fwd,
    .head_bwd = head_bwd,
    .qk_fwd = qk_fwd,
    .qk_bwd = qk_bwd,
    .attn_fwd = attn_fwd,
    .attn_bwd = attn_bwd,
    .gelu_fwd = gelu_fwd,
    .gelu_bwd = gelu_bwd,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .add = add,
    .kv_store = kv_store,
    .attn_decode = attn_decode,
    .row_stats = row_stats,
    .row_grad = row_grad,
    .adamw = mk_adamw,
    .sumsq = mk_sumsq,
    .scale = mk_scale,
    .sample_rows = NULL, /* the decoder samples on the host with mk_sample */
    .add_norm_fwd = add_norm_fwd,
    .kv_store_bf16 = kv_store_bf16,
    .attn_decode_bf16 = attn_decode_bf16,
    .round_bf16 = round_bf16,
    .mm_fwd_bb = mm_fwd_bb,
    .mm_bwd_bb = mm_bwd_bb,
    .bb_scratch_k = BB_K,
};

const mk_backend *mk_backend_cpu(void)
{
    return &mk__cpu_backend;
}

int mk_backend_set_math(const mk_backend *be, mk_math math)
{
    if (!be) return mk__fail(MK_ERR_ARG, "mk_backend_set_math: no back-end");
    if (math != MK_MATH_FP32 && math != MK_MATH_TF32 && math != MK_MATH_BF16)
        return mk__fail(MK_ERR_ARG, "mk_backend_set_math: unknown math %d", (int)math);
    if (!be->set_math) {
        if (math == MK_MATH_FP32) return MK_OK;
        return mk__fail(MK_ERR_UNSUPPORTED, "back-end %s multiplies in FP32 only", be->name);
    }
    be->set_math((int)math);
    return MK_OK;
}

const char *mk_backend_name(const mk_backend *be)
{
    return be ? be->name : "none";
}
