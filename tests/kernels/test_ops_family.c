/*
 * test_ops_family.c - the CPU back-end's ops of the Llama/Qwen families and of
 * grouped-query attention: LayerNorm's eps, embeddings without positions,
 * RMSNorm, the q/k norm and rotary preparation, SwiGLU, and attention
 * (training, KV-cache store, decoding) with NKV < NH.
 *
 * Each forward is compared with a plain reference written here in double
 * (atol 1e-5, rtol 1e-4 unless stated: float kernels against double sums),
 * each backward with the reference's backward and with central finite
 * differences of the kernel's own forward under J = sum(dout * out) for a
 * random dout (step h in float32: about 1e-3 relative accuracy, hence atol
 * 2e-3, rtol 2e-2).  Shapes are small for the finite differences and larger
 * where the ops split their work over the OpenMP team, so that a race or a
 * wrong split shows against the reference.  Decoding is checked against the
 * training attention's rows for every head size path (the plain loop at
 * head size 8, the vector kernels at 16 and 128) and every way attn_decode
 * splits its rows (all heads a row, a kv group a row, one head a row).
 */
#include "ktest.h"

#include "mk_internal.h"

static const mk_backend *be;

/* ---- finite differences --------------------------------------------------- */

typedef struct fd_ctx {
    void (*fwd)(void);
    const float *out;
    const float *dout;
    size_t nout;
} fd_ctx;

static double objective(const fd_ctx *c)
{
    c->fwd();
    double s = 0.0;
    for (size_t i = 0; i < c->nout; i++) s += (double)c->dout[i] * c->out[i];
    return s;
}

static void fd_check_(const fd_ctx *c, float *x, size_t n, const float *analytic, float h,
                      const char *label, const char *file, int line)
{
    float *num = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float save = x[i];
        x[i] = save + h;
        double jp = objective(c);
        x[i] = save - h;
        double jm = objective(c);
        x[i] = save;
        num[i] = (float)((jp - jm) / (2.0 * h));
    }
    c->fwd();
    check_close_(analytic, num, n, 2e-3, 2e-2, label, file, line);
    free(num);
}
#define fd_check(c, x, n, an, h, label)                                                            \
    fd_check_((c), (x), (n), (an), (h), (label), __FILE__, __LINE__)

/* reference against kernel: float sums against double ones */
#define check_ref(got, want, n, label) check_close((got), (want), (n), 1e-5, 1e-4, (label))

static float *rnd(size_t n, float lo, float hi, mk_rng *r)
{
    float *x = malloc(n * sizeof(float));
    fill_uniform(x, n, lo, hi, r);
    return x;
}

static float *zeros(size_t n)
{
    return calloc(n, sizeof(float));
}

static float *copy_of(const float *x, size_t n)
{
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* ---- LayerNorm's eps, embeddings without positions ------------------------ */

static void ref_ln(float *out, const float *x, const float *w, const float *b, int R, int C,
                   double eps)
{
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        for (int c = 0; c < C; c++)
            out[(size_t)r * C + c] = (float)((xr[c] - m) / sqrt(v + eps) * w[c] + b[c]);
    }
}

static void test_layernorm_eps(void **state)
{
    enum { R = 4, C = 9 };
    mk_rng r;
    mk_rng_seed(&r, 11);
    /* a small spread, so that eps = 0.5 changes the output visibly */
    float *x = rnd(R * C, -0.3f, 0.3f, &r), *w = rnd(C, 0.5f, 1.5f, &r), *b = rnd(C, -1, 1, &r);
    float out[R * C], want[R * C], mean[R], rstd[R];
    const float eps[2] = {1e-5f, 0.5f};
    for (int k = 0; k < 2; k++) {
        be->ln_fwd(out, mean, rstd, x, w, b, R, C, eps[k]);
        ref_ln(want, x, w, b, R, C, eps[k]);
        check_ref(out, want, R * C, "layernorm with eps");
    }
    ref_ln(want, x, w, b, R, C, 1e-5);
    assert_true(fabsf(out[0] - want[0]) > 1e-2f); /* eps 0.5 really was used */
    free(x), free(w), free(b);
}

static void test_embedding_without_positions(void **state)
{
    enum { R = 6, C = 5, V = 4 };
    int tok[R] = {1, 3, 1, 0, 3, 3}, pos[R] = {0, 1, 2, 0, 1, 4};
    mk_rng r;
    mk_rng_seed(&r, 12);
    float *wte = rnd(V * C, -1, 1, &r), *dout = rnd(R * C, -1, 1, &r);
    float out[R * C], dwte[V * C] = {0}, want[V * C] = {0};
    be->embed_fwd(out, tok, pos, wte, NULL, R, C);
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) assert_true(out[i * C + c] == wte[tok[i] * C + c]);
    be->embed_bwd(dwte, NULL, dout, tok, pos, R, C);
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) want[tok[i] * C + c] += dout[i * C + c];
    check_ref(dwte, want, V * C, "embedding dwte without dwpe");
    free(wte), free(dout);
}

/* ---- RMSNorm ---------------------------------------------------------------- */

/* out = w x s, s = 1 / sqrt(mean(x^2) + eps), rstd = s */
static void ref_rms(float *out, float *rstd, const float *x, const float *w, int R, int C,
                    double eps)
{
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        double s = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = (float)(w[c] * (xr[c] * s));
        if (rstd) rstd[r] = (float)s;
    }
}

/* dx = s w d - s^3 x / C sum(d w x) (overwrites), dw += d x s */
static void ref_rms_bwd(float *dx, double *dw, const float *d, const float *x, const float *w,
                        int R, int C, double eps)
{
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * C, *dr = d + (size_t)r * C;
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        double s = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) dot += (double)dr[c] * w[c] * xr[c];
        for (int c = 0; c < C; c++) {
            dx[(size_t)r * C + c] = (float)(s * w[c] * dr[c] - s * s * s * xr[c] * dot / C);
            dw[c] += (double)dr[c] * xr[c] * s;
        }
    }
}

static struct {
    float *x, *w, *out, *rstd;
    int R, C;
    float eps;
} rm;
static void rms_run(void)
{
    be->rms_fwd(rm.out, rm.rstd, rm.x, rm.w, rm.R, rm.C, rm.eps);
}

static void rms_case(int R, int C, float eps, int fd, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    size_t n = (size_t)R * C;
    rm.R = R, rm.C = C, rm.eps = eps;
    rm.x = rnd(n, -2, 2, &r), rm.w = rnd(C, 0.5f, 1.5f, &r), rm.out = zeros(n), rm.rstd = zeros(R);
    float *dout = rnd(n, -1, 1, &r), *want = zeros(n), *wrstd = zeros(R);
    float *dx = rnd(n, -1, 1, &r), *dx0 = copy_of(dx, n), *dw = rnd(C, -1, 1, &r),
          *dw0 = copy_of(dw, C);
    rms_run();
    ref_rms(want, wrstd, rm.x, rm.w, R, C, eps);
    check_ref(rm.out, want, n, "rms_fwd");
    check_ref(rm.rstd, wrstd, R, "rms_fwd rstd");
    /* rstd may be NULL */
    float *out2 = zeros(n);
    be->rms_fwd(out2, NULL, rm.x, rm.w, R, C, eps);
    assert_memory_equal(out2, rm.out, n * sizeof(float));

    /* backward adds into dinp and dw: start both from random values */
    be->rms_bwd(dx, dw, dout, rm.x, rm.w, rm.rstd, R, C);
    double *rdw = calloc(C, sizeof(double));
    ref_rms_bwd(want, rdw, dout, rm.x, rm.w, R, C, eps);
    for (size_t i = 0; i < n; i++) dx[i] -= dx0[i];
    float *wdw = zeros(C);
    for (int c = 0; c < C; c++) dw[c] -= dw0[c], wdw[c] = (float)rdw[c];
    check_close(dx, want, n, 1e-5, 1e-3, "rms_bwd dinp");
    check_close(dw, wdw, C, 1e-4, 1e-4, "rms_bwd dw");
    if (fd) {
        fd_ctx c = {rms_run, rm.out, dout, n};
        fd_check(&c, rm.x, n, dx, 1e-3f, "rms_bwd dinp (finite differences)");
        fd_check(&c, rm.w, C, dw, 1e-3f, "rms_bwd dw (finite differences)");
    }
    free(rm.x), free(rm.w), free(rm.out), free(rm.rstd), free(dout), free(want), free(wrstd);
    free(dx), free(dx0), free(dw), free(dw0), free(out2), free(rdw), free(wdw);
}

static void test_rmsnorm(void **state)
{
    rms_case(5, 7, 1e-6f, 1, 21);
    rms_case(3, 16, 0.25f, 1, 22);    /* a large eps shows in the output */
    rms_case(600, 384, 1e-6f, 0, 23); /* split over the team */
}

/* ---- q/k norm and rotary ------------------------------------------------------ */

/* cos/sin tables [T, hd/2] of transformers' default rope: angle = t theta^(-2i/hd) */
static void rope_tables(float *cs, float *sn, int T, int hd, double theta)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd / 2; i++) {
            double a = t * pow(theta, -2.0 * i / hd);
            cs[t * (hd / 2) + i] = (float)cos(a);
            sn[t * (hd / 2) + i] = (float)sin(a);
        }
}

/* The rotary family's preparation written as transformers writes it: per head, optionally
 * n = w x / rms(x), then n cos + rotate_half(n) sin with cos, sin of hd entries (the half
 * tables twice) and rotate_half(n) = cat(-n[hd/2:], n[:hd/2]); value heads copied. */
static void ref_qk(float *out, const float *x, const float *wq, const float *wk, const float *cs,
                   const float *sn, const int *pos, int R, int NH, int NKV, int hd, double eps)
{
    int W = (NH + 2 * NKV) * hd, h2 = hd / 2;
    double *n = malloc(sizeof(double) * hd), *rh = malloc(sizeof(double) * hd);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH + 2 * NKV; h++) {
            const float *xh = x + (size_t)r * W + h * hd;
            float *oh = out + (size_t)r * W + h * hd;
            if (h >= NH + NKV) {
                for (int i = 0; i < hd; i++) oh[i] = xh[i];
                continue;
            }
            const float *w = h < NH ? wq : wk;
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)xh[i] * xh[i];
            double s = w ? 1.0 / sqrt(ss / hd + eps) : 1.0;
            for (int i = 0; i < hd; i++) n[i] = w ? w[i] * (xh[i] * s) : xh[i];
            for (int i = 0; i < hd; i++) rh[i] = i < h2 ? -n[i + h2] : n[i - h2];
            for (int i = 0; i < hd; i++) {
                double c = cs[pos[r] * h2 + i % h2], si = sn[pos[r] * h2 + i % h2];
                oh[i] = (float)(n[i] * c + rh[i] * si);
            }
        }
    free(n), free(rh);
}

/* Its gradient: the transposed rotation, then the norm's backward; dwq, dwk += */
static void ref_qk_bwd(float *dx, double *dwq, double *dwk, const float *d, const float *x,
                       const float *wq, const float *wk, const float *cs, const float *sn,
                       const int *pos, int R, int NH, int NKV, int hd, double eps)
{
    int W = (NH + 2 * NKV) * hd, h2 = hd / 2;
    double *dn = malloc(sizeof(double) * hd);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH + 2 * NKV; h++) {
            const float *xh = x + (size_t)r * W + h * hd, *dh = d + (size_t)r * W + h * hd;
            float *oh = dx + (size_t)r * W + h * hd;
            if (h >= NH + NKV) {
                for (int i = 0; i < hd; i++) oh[i] = dh[i];
                continue;
            }
            /* out_i = n_i c_i + (i < h2 ? -n_{i+h2} : n_{i-h2}) s_i */
            for (int i = 0; i < hd; i++) {
                double c = cs[pos[r] * h2 + i % h2], si = sn[pos[r] * h2 + i % h2];
                double partner = i < h2 ? (double)dh[i + h2] : -(double)dh[i - h2];
                dn[i] = dh[i] * c + partner * si;
            }
            const float *w = h < NH ? wq : wk;
            double *dw = h < NH ? dwq : dwk;
            if (!w) {
                for (int i = 0; i < hd; i++) oh[i] = (float)dn[i];
                continue;
            }
            double ss = 0, dot = 0;
            for (int i = 0; i < hd; i++) ss += (double)xh[i] * xh[i];
            double s = 1.0 / sqrt(ss / hd + eps);
            for (int i = 0; i < hd; i++) dot += dn[i] * w[i] * xh[i];
            for (int i = 0; i < hd; i++) {
                oh[i] = (float)(s * w[i] * dn[i] - s * s * s * xh[i] * dot / hd);
                dw[i] += dn[i] * xh[i] * s;
            }
        }
    free(dn);
}

static struct {
    float *x, *wq, *wk, *out, *rstd, *cs, *sn;
    int *pos;
    int R, NH, NKV, hd;
    float eps;
} qk;
static void qk_run(void)
{
    be->qk_fwd(qk.out, qk.rstd, qk.x, qk.wq, qk.wk, qk.cs, qk.sn, qk.pos, qk.R, qk.NH, qk.NKV,
               qk.hd, qk.eps);
}

static void qk_case(int R, int NH, int NKV, int hd, int norm, int fd, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    int W = (NH + 2 * NKV) * hd, Tb = 40;
    size_t n = (size_t)R * W;
    qk.R = R, qk.NH = NH, qk.NKV = NKV, qk.hd = hd, qk.eps = 1e-6f;
    qk.x = rnd(n, -2, 2, &r), qk.out = zeros(n),
    qk.rstd = norm ? zeros((size_t)R * (NH + NKV)) : NULL;
    qk.wq = norm ? rnd(hd, 0.5f, 1.5f, &r) : NULL, qk.wk = norm ? rnd(hd, 0.5f, 1.5f, &r) : NULL;
    qk.cs = zeros((size_t)Tb * hd / 2), qk.sn = zeros((size_t)Tb * hd / 2);
    rope_tables(qk.cs, qk.sn, Tb, hd, 10000.0);
    qk.pos = malloc(sizeof(int) * R);
    for (int i = 0; i < R; i++) qk.pos[i] = (int)(mk_rng_next(&r) % Tb); /* any order, repeats */
    float *want = zeros(n), *dout = rnd(n, -1, 1, &r), *dx = rnd(n, 5, 6, &r); /* overwritten */
    float *dwq = norm ? rnd(hd, -1, 1, &r) : NULL, *dwk = norm ? rnd(hd, -1, 1, &r) : NULL;
    float *dwq0 = norm ? copy_of(dwq, hd) : NULL, *dwk0 = norm ? copy_of(dwk, hd) : NULL;
    qk_run();
    ref_qk(want, qk.x, qk.wq, qk.wk, qk.cs, qk.sn, qk.pos, R, NH, NKV, hd, qk.eps);
    check_ref(qk.out, want, n, "qk_fwd");
    if (norm) /* rstd: each q and k head's 1/rms */
        for (int i = 0; i < R; i++)
            for (int h = 0; h < NH + NKV; h++) {
                const float *xh = qk.x + (size_t)i * W + h * hd;
                double ss = 0;
                for (int k = 0; k < hd; k++) ss += (double)xh[k] * xh[k];
                assert_near(qk.rstd[i * (NH + NKV) + h], 1.0 / sqrt(ss / hd + qk.eps), 1e-5);
            }

    be->qk_bwd(dx, dwq, dwk, dout, qk.x, qk.wq, qk.wk, qk.rstd, qk.cs, qk.sn, qk.pos, R, NH, NKV,
               hd);
    double *rdwq = calloc(hd, sizeof(double)), *rdwk = calloc(hd, sizeof(double));
    ref_qk_bwd(want, rdwq, rdwk, dout, qk.x, qk.wq, qk.wk, qk.cs, qk.sn, qk.pos, R, NH, NKV, hd,
               qk.eps);
    check_close(dx, want, n, 1e-5, 1e-3, "qk_bwd dinp");
    if (norm) {
        float *a = zeros(hd), *b = zeros(hd);
        for (int i = 0; i < hd; i++) dwq[i] -= dwq0[i], a[i] = (float)rdwq[i];
        for (int i = 0; i < hd; i++) dwk[i] -= dwk0[i], b[i] = (float)rdwk[i];
        check_close(dwq, a, hd, 1e-4, 1e-4, "qk_bwd dwq");
        check_close(dwk, b, hd, 1e-4, 1e-4, "qk_bwd dwk");
        free(a), free(b);
    }
    if (fd) {
        fd_ctx c = {qk_run, qk.out, dout, n};
        fd_check(&c, qk.x, n, dx, 1e-3f, "qk_bwd dinp (finite differences)");
        if (norm) {
            fd_check(&c, qk.wq, hd, dwq, 1e-3f, "qk_bwd dwq (finite differences)");
            fd_check(&c, qk.wk, hd, dwk, 1e-3f, "qk_bwd dwk (finite differences)");
        }
    }
    free(qk.x), free(qk.out), free(qk.rstd), free(qk.wq), free(qk.wk), free(qk.cs), free(qk.sn);
    free(qk.pos), free(want), free(dout), free(dx), free(dwq), free(dwk), free(dwq0), free(dwk0);
    free(rdwq), free(rdwk);
}

static void test_qk_norm_rotary(void **state)
{
    qk_case(5, 4, 2, 8, 1, 1, 31); /* Qwen3: q/k norms */
    qk_case(4, 6, 2, 16, 1, 1, 32);
    qk_case(5, 4, 2, 8, 0, 1, 33);    /* Llama/Qwen2: rotation only */
    qk_case(3, 2, 2, 128, 1, 1, 34);  /* Qwen3's head size */
    qk_case(512, 8, 4, 64, 1, 0, 35); /* split over the team */
    qk_case(512, 8, 4, 64, 0, 0, 36);
}

static void test_rotation_keeps_norm_and_position_zero(void **state)
{
    /* at position 0 the rotation is the identity; elsewhere it keeps each head's norm */
    enum { NH = 2, NKV = 1, hd = 8, W = (NH + 2 * NKV) * hd };
    float cs[4 * hd / 2], sn[4 * hd / 2], x[2 * W], out[2 * W];
    rope_tables(cs, sn, 4, hd, 10000.0);
    mk_rng r;
    mk_rng_seed(&r, 37);
    fill_uniform(x, 2 * W, -1, 1, &r);
    int pos[2] = {0, 3};
    be->qk_fwd(out, NULL, x, NULL, NULL, cs, sn, pos, 2, NH, NKV, hd, 1e-6f);
    for (int i = 0; i < W; i++) assert_true(out[i] == x[i]);
    for (int h = 0; h < NH + NKV; h++) {
        double a = 0, b = 0;
        for (int i = 0; i < hd; i++) {
            a += (double)x[W + h * hd + i] * x[W + h * hd + i];
            b += (double)out[W + h * hd + i] * out[W + h * hd + i];
        }
        assert_near(b, a, 1e-5 * a);
        assert_true(memcmp(out + W + h * hd, x + W + h * hd, sizeof(float) * hd) != 0);
    }
}

/* ---- SwiGLU ------------------------------------------------------------------- */

static struct {
    float *x, *out;
    int R, I;
} sg;
static void swiglu_run(void)
{
    be->swiglu_fwd(sg.out, sg.x, sg.R, sg.I);
}

static void swiglu_case(int R, int I, int fd, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    size_t n = (size_t)R * I;
    sg.R = R, sg.I = I, sg.x = rnd(2 * n, -6, 6, &r), sg.out = zeros(n);
    float *dout = rnd(n, -1, 1, &r), *dx = rnd(2 * n, 5, 6, &r), *want = zeros(n),
          *wdx = zeros(2 * n);
    swiglu_run();
    for (int i = 0; i < R; i++)
        for (int j = 0; j < I; j++) {
            double g = sg.x[(size_t)i * 2 * I + j], u = sg.x[(size_t)i * 2 * I + I + j];
            double sig = 1.0 / (1.0 + exp(-g)), d = dout[(size_t)i * I + j];
            want[(size_t)i * I + j] = (float)(g * sig * u);
            wdx[(size_t)i * 2 * I + j] = (float)(d * u * (sig + g * sig * (1 - sig)));
            wdx[(size_t)i * 2 * I + I + j] = (float)(d * g * sig);
        }
    check_ref(sg.out, want, n, "swiglu_fwd");
    be->swiglu_bwd(dx, sg.x, dout, R, I);
    check_ref(dx, wdx, 2 * n, "swiglu_bwd");
    if (fd) {
        fd_ctx c = {swiglu_run, sg.out, dout, n};
        fd_check(&c, sg.x, 2 * n, dx, 1e-3f, "swiglu_bwd (finite differences)");
    }
    free(sg.x), free(sg.out), free(dout), free(dx), free(want), free(wdx);
}

static void test_swiglu(void **state)
{
    swiglu_case(3, 7, 1, 41);
    swiglu_case(300, 1000, 0, 42); /* split over the team */
}

/* ---- grouped-query attention -------------------------------------------------- */

/* Causal attention in double: query head h reads kv head h / (NH / NKV). */
static void ref_attn(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV,
                     int hd)
{
    int G = NH / NKV, W = (NH + 2 * NKV) * hd, A = NH * hd;
    double scale = 1.0 / sqrt(hd), *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * W + h * hd;
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k = qkv + ((size_t)b * T + u) * W + (NH + h / G) * hd;
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += (double)q[i] * k[i];
                    p[u] = s * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = 0; u <= t; u++) sum += p[u] = exp(p[u] - mx);
                for (int u = 0; u < T; u++)
                    att[(((size_t)b * NH + h) * T + t) * T + u] = u <= t ? (float)(p[u] / sum) : 0;
                for (int i = 0; i < hd; i++) {
                    double y = 0;
                    for (int u = 0; u <= t; u++)
                        y +=
                            p[u] / sum * qkv[((size_t)b * T + u) * W + (NH + NKV + h / G) * hd + i];
                    out[((size_t)b * T + t) * A + h * hd + i] = (float)y;
                }
            }
    free(p);
}

/* Its gradient in double, from the probabilities recomputed: dP = dY V^T, dS = P (dP - sum P
 * dP) scale, dQ = dS K, dK += dS^T Q, dV += P^T dY over each kv head's group. */
static void ref_attn_bwd(float *dqkv, const float *dout, const float *qkv, int B, int T, int NH,
                         int NKV, int hd)
{
    int G = NH / NKV, W = (NH + 2 * NKV) * hd, A = NH * hd;
    size_t n = (size_t)B * T * W;
    double scale = 1.0 / sqrt(hd), *acc = calloc(n, sizeof(double));
    float *out = zeros((size_t)B * T * A), *att = zeros((size_t)B * NH * T * T);
    double *dp = malloc(sizeof(double) * T);
    ref_attn(out, att, qkv, B, T, NH, NKV, hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *p = att + (((size_t)b * NH + h) * T + t) * T;
                const float *dy = dout + ((size_t)b * T + t) * A + h * hd;
                size_t qo = ((size_t)b * T + t) * W + h * hd;
                double s = 0;
                for (int u = 0; u <= t; u++) {
                    size_t vo = ((size_t)b * T + u) * W + (NH + NKV + h / G) * hd;
                    dp[u] = 0;
                    for (int i = 0; i < hd; i++) dp[u] += (double)dy[i] * qkv[vo + i];
                    s += p[u] * dp[u];
                }
                for (int u = 0; u <= t; u++) {
                    size_t ko = ((size_t)b * T + u) * W + (NH + h / G) * hd;
                    size_t vo = ((size_t)b * T + u) * W + (NH + NKV + h / G) * hd;
                    double ds = p[u] * (dp[u] - s) * scale;
                    for (int i = 0; i < hd; i++) {
                        acc[qo + i] += ds * qkv[ko + i];
                        acc[ko + i] += ds * qkv[qo + i];
                        acc[vo + i] += (double)p[u] * dy[i];
                    }
                }
            }
    for (size_t i = 0; i < n; i++) dqkv[i] = (float)acc[i];
    free(acc), free(out), free(att), free(dp);
}

static struct {
    float *qkv, *out, *att;
    int B, T, NH, NKV, hd;
} at;
static void attn_run(void)
{
    be->attn_fwd(at.out, at.att, at.qkv, at.B, at.T, at.NH, at.NKV, at.hd);
}

/* kv_store and attn_decode over the rows given (rows[0..R) of the B x T batch, in that order)
 * equal attn_fwd's outputs for them. */
static void decode_rows(const int *rows, int R, int Tmax, const char *label)
{
    int W = (at.NH + 2 * at.NKV) * at.hd, A = at.NH * at.hd, KV = at.NKV * at.hd;
    float *kc = zeros((size_t)at.B * Tmax * KV), *vc = zeros((size_t)at.B * Tmax * KV);
    float *q = zeros((size_t)R * W), *y = zeros((size_t)R * A), *want = zeros((size_t)R * A);
    float *scores = zeros((size_t)R * at.NH * Tmax);
    int *slot = malloc(sizeof(int) * R), *pos = malloc(sizeof(int) * R);
    /* the cache first holds every position of every sequence (slot b for sequence b, stored in
     * reverse, to show order does not matter); then the rows asked for attend */
    int all = at.B * at.T, *as = malloc(sizeof(int) * all), *ap = malloc(sizeof(int) * all);
    float *aq = zeros((size_t)all * W);
    for (int i = 0; i < all; i++) {
        int j = all - 1 - i;
        as[i] = j / at.T, ap[i] = j % at.T;
        memcpy(aq + (size_t)i * W, at.qkv + (size_t)j * W, sizeof(float) * W);
    }
    be->kv_store(kc, vc, aq, as, ap, all, at.NH, at.NKV, at.hd, Tmax);
    for (int i = 0; i < R; i++) {
        slot[i] = rows[i] / at.T, pos[i] = rows[i] % at.T;
        memcpy(q + (size_t)i * W, at.qkv + (size_t)rows[i] * W, sizeof(float) * W);
        memcpy(want + (size_t)i * A, at.out + (size_t)rows[i] * A, sizeof(float) * A);
    }
    be->attn_decode(y, scores, q, kc, vc, slot, pos, R, at.NH, at.NKV, at.hd, Tmax);
    check_close(y, want, (size_t)R * A, 1e-5, 1e-4, label);
    free(kc), free(vc), free(q), free(y), free(want), free(scores), free(slot), free(pos);
    free(as), free(ap), free(aq);
}

static void attn_case(int B, int T, int NH, int NKV, int hd, int fd, uint64_t seed)
{
    mk_rng r;
    mk_rng_seed(&r, seed);
    int W = (NH + 2 * NKV) * hd, A = NH * hd;
    size_t nqkv = (size_t)B * T * W, nout = (size_t)B * T * A, natt = (size_t)B * NH * T * T;
    at.B = B, at.T = T, at.NH = NH, at.NKV = NKV, at.hd = hd;
    at.qkv = rnd(nqkv, -1.5f, 1.5f, &r), at.out = zeros(nout), at.att = zeros(natt);
    float *want = zeros(nout), *watt = zeros(natt), *dout = rnd(nout, -1, 1, &r);
    float *dqkv = rnd(nqkv, 5, 6, &r) /* overwritten */, *wdqkv = zeros(nqkv);
    float *datt = zeros(natt);
    attn_run();
    ref_attn(want, watt, at.qkv, B, T, NH, NKV, hd);
    check_ref(at.out, want, nout, "attn_fwd");
    check_ref(at.att, watt, natt, "attn_fwd probabilities");
    be->attn_bwd(dqkv, datt, dout, at.qkv, at.att, B, T, NH, NKV, hd);
    ref_attn_bwd(wdqkv, dout, at.qkv, B, T, NH, NKV, hd);
    check_close(dqkv, wdqkv, nqkv, 1e-5, 1e-3, "attn_bwd dqkv");
    if (fd) {
        fd_ctx c = {attn_run, at.out, dout, nout};
        fd_check(&c, at.qkv, nqkv, dqkv, 1e-3f, "attn_bwd dqkv (finite differences)");
    }

    /* decoding: all rows at once (every head of a row an item once R >= 4 threads), one row
     * at a time (a kv group or a query head an item), and pairs */
    int all = B * T, *rows = malloc(sizeof(int) * all);
    for (int i = 0; i < all; i++) rows[i] = (i * 7 + 3) % all; /* 7 is prime to all sizes here */
    decode_rows(rows, all, T + 3, "attn_decode, all rows");
    for (int i = 0; i < all; i += 3) decode_rows(rows + i, 1, T, "attn_decode, one row");
    for (int i = 0; i + 2 <= all; i += 5) decode_rows(rows + i, 2, T + 1, "attn_decode, two rows");
    free(rows);
    free(at.qkv), free(at.out), free(at.att), free(want), free(watt), free(dout), free(dqkv);
    free(wdqkv), free(datt);
}

static void test_attention_gqa(void **state)
{
    attn_case(2, 5, 4, 2, 8, 1, 51);   /* plain decode loop (head size 8) */
    attn_case(2, 5, 6, 2, 16, 1, 52);  /* vector decode, one vector a head */
    attn_case(1, 5, 4, 1, 128, 1, 53); /* vector decode at Qwen3's head size, one kv head */
    attn_case(2, 6, 2, 2, 16, 1, 54);  /* GPT-2's layout: NKV = NH */
    attn_case(2, 4, 8, 2, 64, 0, 55);  /* Llama's head size, groups of 4 */
}

static void test_attention_gqa_threaded(void **state)
{
    /* large enough for attn_fwd/bwd and attn_decode to split over the team */
    attn_case(2, 48, 8, 2, 64, 0, 61);
    attn_case(3, 40, 4, 4, 32, 0, 62);
    attn_case(1, 64, 6, 3, 24, 0, 63); /* a head size outside the vector path, threaded */
    attn_case(1, 80, 4, 1, 32, 0, 64); /* one (b, kv head) pair: attn_bwd splits its positions */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_eps),
        cmocka_unit_test(test_embedding_without_positions),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_qk_norm_rotary),
        cmocka_unit_test(test_rotation_keeps_norm_and_position_zero),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_gqa_threaded),
    };
    be = mk_backend_cpu();
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
