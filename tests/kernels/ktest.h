/*
 * ktest.h - helpers shared by the kernels tests: seeded random fills, a
 * tensor comparison that reports the worst element and fails through
 * cmocka, and a reader for the PyTorch fixture file.
 */
#ifndef KTEST_H
#define KTEST_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "manta_kernels.h"

static inline void fill_uniform(float *x, size_t n, float lo, float hi, mk_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * mk_rng_uniform(r);
}

/* Passes when |a - b| <= atol + rtol |b| for every element (b is the
 * reference).  Prints the worst element either way, so logs show margins. */
static inline void check_close_(const float *a, const float *b, size_t n, double atol, double rtol,
                                const char *label, const char *file, int line)
{
    size_t worst = 0;
    double worst_excess = -1e30, max_abs = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), lim = atol + rtol * fabs((double)b[i]);
        if (!(d <= lim)) bad++;
        if (d - lim > worst_excess || isnan(d)) {
            worst_excess = isnan(d) ? 1e30 : d - lim;
            worst = i;
        }
        if (d > max_abs) max_abs = d;
    }
    if (bad || getenv("KTEST_VERBOSE"))
        fprintf(stderr,
                "%s:%d %s: %zu/%zu outside tol (atol %g rtol %g); max |diff| %.3g; "
                "worst [%zu] got %.8g want %.8g\n",
                file, line, label, bad, n, atol, rtol, max_abs, worst, n ? a[worst] : 0.0,
                n ? b[worst] : 0.0);
    if (bad) _fail(file, line);
}
#define check_close(a, b, n, atol, rtol, label)                                                    \
    check_close_((a), (b), (n), (atol), (rtol), (label), __FILE__, __LINE__)

#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol))) {                                                           \
            fprintf(stderr, "%s:%d: %s = %.9g, want %.9g (tol %g)\n", __FILE__, __LINE__, #a, a_,  \
                    b_, (double)(tol));                                                            \
            _fail(__FILE__, __LINE__);                                                             \
        }                                                                                          \
    } while (0)

#define assert_mk_ok(expr)                                                                         \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != MK_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, mk_strerror(rc_),  \
                    mk_last_error());                                                              \
            _fail(__FILE__, __LINE__);                                                             \
        }                                                                                          \
    } while (0)

/* The fixture written by gen_fixtures.py (see its docstring for the layout). */
typedef struct ref_fixture {
    mk_config cfg;
    int B, T, n_steps;
    size_t n_params;
    int *tokens, *targets;
    float *weights, *logits, ce_loss, *ce_grads, *behav, *adv, *mask, ppo[6], *ppo_grads, *losses;
    void *mem;
} ref_fixture;

static inline int ref_load(ref_fixture *r, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int32_t h[12];
    if (fread(h, 4, 12, f) != 12 || h[0] != 20251129 || h[1] != 1) {
        fprintf(stderr, "%s: not a fixture file\n---> HINT: run tests/kernels/gen_fixtures.py\n",
                path);
        fclose(f);
        return -1;
    }
    r->cfg = (mk_config){
        .n_layer = h[2], .n_head = h[3], .n_embd = h[4], .block_size = h[5], .vocab_size = h[6]};
    r->B = h[7];
    r->T = h[8];
    r->n_params = (size_t)h[9];
    r->n_steps = h[10];
    size_t R = (size_t)r->B * r->T, V = (size_t)r->cfg.vocab_size, P = r->n_params;
    size_t total = R * 2 + R + R * V + 1 + P + 3 * R + 6 + P + (size_t)r->n_steps;
    float *mem = malloc(total * 4);
    size_t got = fread(mem, 4, total, f);
    fclose(f);
    if (got != total) {
        free(mem);
        return -1;
    }
    float *p = mem;
    r->mem = mem;
    r->tokens = (int *)p, p += R;
    r->targets = (int *)p, p += R;
    r->weights = p, p += R;
    r->logits = p, p += R * V;
    r->ce_loss = *p++;
    r->ce_grads = p, p += P;
    r->behav = p, p += R;
    r->adv = p, p += R;
    r->mask = p, p += R;
    memcpy(r->ppo, p, sizeof r->ppo), p += 6;
    r->ppo_grads = p, p += P;
    r->losses = p;
    return 0;
}

#endif
