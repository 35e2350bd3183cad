/*
 * test_families.c - every model family against transformers, from folders
 * that transformers wrote.
 *
 * The fixtures in fixtures/family/<name>/ are tiny random-initialised models
 * saved by save_pretrained (gen_family_fixtures.py: llama3 with grouped-query
 * attention, an untied head and Llama 3 rope scaling; llama with biases,
 * tied; qwen2; qwen3 with head_dim not hidden/heads; gpt2; qwen3 in BF16 and
 * llama3 in sharded BF16, both with the hub's legacy config.json), each with
 * expect.bin: transformers' logits, log-probs and mean cross-entropy on a
 * [2,16] batch, the gradient of that loss for every parameter (F32 models),
 * and a 12-token greedy generation.  Only C reads them here: the test needs
 * no Python.  Per fixture, on the CPU back-end:
 *
 *   - mk_load_dir, mk_forward: logits within 2e-5 abs + 2e-5 rel;
 *   - mk_logprobs: within 2e-5 abs + 2e-5 rel;
 *   - mk_loss_ce (all weights 1): within 1e-5 abs + 1e-5 rel;
 *   - mk_zero_grad, mk_backward: every checkpoint tensor the model lists
 *     (mk_model_hf_tensor) has a transformers gradient of the same name and
 *     shape and vice versa, and mk_model_read_hf's gradient is within
 *     1e-4 * max|transformers' gradient of that tensor| of it, element-wise;
 *   - a decoder at temperature 0 continues the prompt with transformers'
 *     greedy tokens, token for token (the generator picked prompts whose best
 *     logit leads by >= 1e-3 at every step);
 *   - decode equals forward: (a) two slots of different prompt lengths
 *     stepped together and then one alone, token by token, and (b) every
 *     prefix length appended then stepped once: each logit vector a step used
 *     (mk_decoder_last_logits) equals mk_forward's at that position within
 *     2e-5 abs + 2e-5 rel.
 *
 * The tolerances allow for float32 rounding of the same arithmetic in
 * another order (the weights are the same floats: 16-bit ones upcast
 * exactly on both sides); each fixture prints its measured maximum errors,
 * about 2e-6 everywhere when this was written.  They are tight enough to
 * see rms_norm_eps: the llama3 and qwen3 fixtures have token embeddings
 * whose mean square is of the order of eps, and reading 1e-6 for 1e-5 moves
 * their logits by about 1.
 *
 * Regenerate the fixtures (needs torch and transformers) with
 *     /work/venv/bin/python tests/kernels/gen_family_fixtures.py
 * or the build target kernels_family_fixtures.
 */
#include "ktest.h"

enum { CTX = 64 };

/* Tolerances (abs + rel of the reference; gradients: of each tensor's
 * largest |transformers' gradient|).  Measured errors are about 2e-6 for
 * all of them (see the log), so each has a margin of 10x or more. */
#define TOL_LOGIT 2e-5 /* logits, log-probs, decoder logits vs forward */
#define TOL_LOSS  1e-5
#define TOL_GRAD  1e-4

typedef struct fam_grad {
    char name[128];
    int ndim, shape[2];
    size_t numel;
    const float *data;
} fam_grad;

typedef struct fam_ref {
    int B, T, V, n_prompt, n_gen, n_grads;
    const int32_t *tokens, *targets, *prompt, *gen;
    const float *logits, *logp;
    float loss;
    fam_grad *grads;
    unsigned char *mem; /* the whole file */
} fam_ref;

/* ---- expect.bin (layout: gen_family_fixtures.py's docstring) ------------- */

typedef struct cursor {
    const unsigned char *p, *end;
    const char *path;
} cursor;

static const void *take(cursor *c, size_t n, const char *what)
{
    if ((size_t)(c->end - c->p) < n) {
        fprintf(stderr, "%s: ends inside %s\n---> HINT: regenerate with gen_family_fixtures.py\n",
                c->path, what);
        fail();
    }
    const void *r = c->p;
    c->p += n;
    return r;
}

static int take_int(cursor *c, const char *what)
{
    int32_t v;
    memcpy(&v, take(c, 4, what), 4);
    return v;
}

static void ref_read(fam_ref *r, const char *path)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        fail();
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(len > 0);
    r->mem = malloc((size_t)len);
    assert_non_null(r->mem);
    assert_int_equal(fread(r->mem, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    cursor c = {r->mem, r->mem + len, path};
    if (memcmp(take(&c, 8, "magic"), "MKFAMREF", 8) != 0 || take_int(&c, "version") != 1) {
        fprintf(stderr, "%s: not a family fixture (magic MKFAMREF, version 1)\n", path);
        fail();
    }
    r->B = take_int(&c, "B");
    r->T = take_int(&c, "T");
    r->V = take_int(&c, "V");
    r->n_prompt = take_int(&c, "n_prompt");
    r->n_gen = take_int(&c, "n_gen");
    r->n_grads = take_int(&c, "n_grads");
    assert_true(r->B > 0 && r->B <= 8 && r->T > 0 && r->T <= CTX && r->V > 0 && r->V < 1 << 20);
    assert_true(r->n_prompt > 0 && r->n_gen > 0 && r->n_prompt + r->n_gen <= CTX);
    assert_true(r->n_grads >= 0 && r->n_grads < 4096);
    size_t R = (size_t)r->B * r->T;
    /* Up to the first gradient name every array starts at a multiple of 4
     * bytes into the (malloc-aligned) buffer, so it is read in place. */
    r->tokens = take(&c, 4 * R, "tokens");
    r->targets = take(&c, 4 * R, "targets");
    r->logits = take(&c, 4 * R * r->V, "logits");
    r->logp = take(&c, 4 * R, "logp");
    memcpy(&r->loss, take(&c, 4, "loss"), 4);
    r->prompt = take(&c, 4 * (size_t)r->n_prompt, "prompt");
    r->gen = take(&c, 4 * (size_t)r->n_gen, "gen");
    r->grads = calloc((size_t)r->n_grads + 1, sizeof *r->grads);
    assert_non_null(r->grads);
    for (int i = 0; i < r->n_grads; i++) {
        fam_grad *g = &r->grads[i];
        int nl = take_int(&c, "grad name length");
        assert_true(nl > 0 && nl < (int)sizeof g->name);
        memcpy(g->name, take(&c, (size_t)nl, "grad name"), (size_t)nl);
        g->ndim = take_int(&c, "grad ndim");
        assert_true(g->ndim == 1 || g->ndim == 2);
        g->numel = 1;
        for (int k = 0; k < g->ndim; k++) {
            g->shape[k] = take_int(&c, "grad shape");
            assert_true(g->shape[k] > 0);
            g->numel *= (size_t)g->shape[k];
        }
        /* after a name of any length the floats may be unaligned: copy */
        float *d = malloc(g->numel * sizeof(float));
        assert_non_null(d);
        memcpy(d, take(&c, 4 * g->numel, g->name), 4 * g->numel);
        g->data = d;
    }
    if (c.p != c.end) {
        fprintf(stderr, "%s: %zu bytes after the last gradient\n", path, (size_t)(c.end - c.p));
        fail();
    }
}

static void ref_free(fam_ref *r)
{
    for (int i = 0; i < r->n_grads; i++) free((void *)r->grads[i].data);
    free(r->grads);
    free(r->mem);
}

/* The library takes int arrays: copy the file's int32 ones. */
static int *ints(const int32_t *src, size_t n)
{
    int *d = malloc(n * sizeof(int));
    assert_non_null(d);
    memcpy(d, src, n * sizeof(int32_t));
    return d;
}

/* ---- comparison that measures, then judges ------------------------------- */

typedef struct err {
    double max_abs; /* max |got - want| (inf if a NaN was met) */
    size_t bad, n;  /* elements outside the tolerance, elements compared */
} err;

static void measure(err *e, const float *got, const float *want, size_t n, double atol, double rtol,
                    const char *fam, const char *what)
{
    size_t bad = 0, worst = 0;
    double wr = -1.0; /* worst |got - want| / (atol + rtol |want|) */
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs((double)want[i]);
        double ratio = isnan(d) ? 1e30 : d / lim;
        if (!(d <= lim)) bad++;
        if (ratio > wr) wr = ratio, worst = i;
        if (!isnan(d) && d > e->max_abs) e->max_abs = d;
        if (isnan(d)) e->max_abs = INFINITY;
    }
    e->bad += bad;
    e->n += n;
    if (bad)
        fprintf(stderr, "%s: %s: %zu/%zu outside %g abs + %g rel; worst [%zu] got %.8g want %.8g\n",
                fam, what, bad, n, atol, rtol, worst, got[worst], want[worst]);
}

static const fam_grad *find_grad(const fam_ref *r, const char *name)
{
    for (int i = 0; i < r->n_grads; i++)
        if (strcmp(r->grads[i].name, name) == 0) return &r->grads[i];
    return NULL;
}

/* ---- the checks ---------------------------------------------------------- */

static const float temp0 = 0.0f, top_p1 = 1.0f;

/* Greedy continuation of the prompt, token for token. */
static int check_greedy(mk_model *m, const fam_ref *r, const char *fam)
{
    mk_decoder *d;
    assert_mk_ok(mk_decoder_new_ctx(&d, m, 1, CTX));
    assert_mk_ok(mk_decoder_reset(d, 0, 1));
    int *prompt = ints(r->prompt, (size_t)r->n_prompt);
    assert_mk_ok(mk_decoder_append(d, 0, prompt, r->n_prompt));
    int slot = 0, same = 0;
    for (int i = 0; i < r->n_gen; i++) {
        int tok;
        float lps;
        assert_mk_ok(mk_decoder_step(d, &slot, 1, &temp0, &top_p1, &tok, &lps, NULL));
        if (tok != r->gen[i]) {
            const float *lg = mk_decoder_last_logits(d, 0);
            fprintf(stderr,
                    "%s: greedy token %d is %d (logit %.6g), transformers %d (logit %.6g)\n", fam,
                    i, tok, lg[tok], r->gen[i], lg[r->gen[i]]);
            break;
        }
        same++;
    }
    mk_decoder_free(d);
    free(prompt);
    return same;
}

/* (a) Two slots with prompts of 1 and 4 tokens stepped together greedily,
 * then slot 0 alone, until each holds T tokens; then both sequences through
 * mk_forward: the logits of every step equal the forward's at that position. */
static void check_decode_steps(mk_model *m, const fam_ref *r, const char *fam, err *e)
{
    const int T = r->T, V = r->V, start[2] = {1, 4};
    assert_true(r->B >= 2);
    mk_decoder *d;
    assert_mk_ok(mk_decoder_new_ctx(&d, m, 2, CTX));
    int *seq = calloc((size_t)2 * T, sizeof(int));
    float *step_logits = calloc((size_t)2 * T * V, sizeof(float));
    float *fwd = malloc((size_t)2 * T * V * sizeof(float));
    assert_true(seq && step_logits && fwd);
    int len[2];
    for (int s = 0; s < 2; s++) {
        assert_mk_ok(mk_decoder_reset(d, s, 7 + (uint64_t)s));
        for (int t = 0; t < start[s]; t++) seq[s * T + t] = r->tokens[s * T + t];
        assert_mk_ok(mk_decoder_append(d, s, seq + s * T, start[s]));
        len[s] = start[s];
    }
    while (len[0] < T) {
        int slots[2], n = 0, toks[2];
        float lps[2], temps[2] = {0, 0}, tops[2] = {1, 1};
        for (int s = 0; s < 2; s++)
            if (len[s] < T) slots[n++] = s;
        assert_mk_ok(mk_decoder_step(d, slots, n, temps, tops, toks, lps, NULL));
        for (int i = 0; i < n; i++) {
            int s = slots[i];
            /* this step fed position len-1 and sampled the token at len */
            memcpy(step_logits + ((size_t)s * T + len[s] - 1) * V, mk_decoder_last_logits(d, s),
                   (size_t)V * sizeof(float));
            seq[s * T + len[s]] = toks[i];
            len[s]++;
            assert_int_equal(mk_decoder_len(d, s), len[s]);
        }
    }
    assert_mk_ok(mk_forward(m, seq, 2, T));
    assert_mk_ok(mk_model_read_logits(m, fwd));
    for (int s = 0; s < 2; s++) {
        size_t p0 = (size_t)start[s] - 1, np = (size_t)T - 1 - p0;
        char what[64];
        snprintf(what, sizeof what, "decode steps, slot %d", s);
        measure(e, step_logits + ((size_t)s * T + p0) * V, fwd + ((size_t)s * T + p0) * V, np * V,
                TOL_LOGIT, TOL_LOGIT, fam, what);
    }
    mk_decoder_free(d);
    free(seq);
    free(step_logits);
    free(fwd);
}

/* (b) For every p: append tokens[0][0..p] to an empty slot and step once:
 * the logits equal the forward's at p.  fwd: the forward logits of row 0. */
static void check_decode_prefill(mk_model *m, const fam_ref *r, const float *fwd, const char *fam,
                                 err *e)
{
    mk_decoder *d;
    assert_mk_ok(mk_decoder_new_ctx(&d, m, 1, CTX));
    int *row = ints(r->tokens, (size_t)r->T);
    for (int p = 0; p < r->T; p++) {
        int slot = 0, tok;
        float lps;
        assert_mk_ok(mk_decoder_reset(d, 0, 3));
        assert_mk_ok(mk_decoder_append(d, 0, row, p + 1));
        assert_mk_ok(mk_decoder_step(d, &slot, 1, &temp0, &top_p1, &tok, &lps, NULL));
        char what[64];
        snprintf(what, sizeof what, "prefill %d then a step", p + 1);
        measure(e, mk_decoder_last_logits(d, 0), fwd + (size_t)p * r->V, (size_t)r->V, TOL_LOGIT,
                TOL_LOGIT, fam, what);
    }
    mk_decoder_free(d);
    free(row);
}

/* Every checkpoint tensor's gradient against transformers'. */
static void check_grads(mk_model *m, const fam_ref *r, const char *fam, err *e, double *worst_rel,
                        char *worst_name, size_t worst_len)
{
    int n = mk_model_num_hf_tensors(m);
    for (int i = 0; i < n; i++) {
        mk_tensor_info info;
        assert_mk_ok(mk_model_hf_tensor(m, i, &info));
        const fam_grad *g = find_grad(r, info.name);
        if (!g) {
            fprintf(stderr, "%s: the model lists %s, which transformers' model does not have\n",
                    fam, info.name);
            e->bad++;
            continue;
        }
        if (info.ndim != g->ndim || info.shape[0] != g->shape[0] ||
            (g->ndim == 2 && info.shape[1] != g->shape[1]) || info.numel != g->numel) {
            fprintf(stderr, "%s: %s: shape [%d,%d] (%d-D), transformers [%d,%d] (%d-D)\n", fam,
                    info.name, info.shape[0], info.ndim == 2 ? info.shape[1] : 0, info.ndim,
                    g->shape[0], g->ndim == 2 ? g->shape[1] : 0, g->ndim);
            e->bad++;
            continue;
        }
        float *got = malloc(g->numel * sizeof(float));
        assert_non_null(got);
        assert_mk_ok(mk_model_read_hf(m, info.name, 1, got));
        double gmax = 0;
        for (size_t k = 0; k < g->numel; k++)
            if (fabs(g->data[k]) > gmax) gmax = fabs(g->data[k]);
        double atol = TOL_GRAD * (gmax > 0 ? gmax : 1e-30);
        err one = {0};
        measure(&one, got, g->data, g->numel, atol, 0.0, fam, info.name);
        double rel = gmax > 0 ? one.max_abs / gmax : one.max_abs;
        if (rel > *worst_rel) {
            *worst_rel = rel;
            snprintf(worst_name, worst_len, "%s", info.name);
        }
        e->bad += one.bad;
        e->n += one.n;
        free(got);
    }
    for (int i = 0; i < r->n_grads; i++) {
        mk_tensor_info info;
        int found = 0;
        for (int k = 0; k < n && !found; k++)
            found = mk_model_hf_tensor(m, k, &info) == MK_OK &&
                    strcmp(info.name, r->grads[i].name) == 0;
        if (!found) {
            fprintf(stderr,
                    "%s: transformers has the parameter %s, which the model does not list\n", fam,
                    r->grads[i].name);
            e->bad++;
        }
    }
}

/* Every check on a loaded model m against the fixture r; fails (cmocka)
 * after printing the measured maximum errors. */
static void check_family(mk_model *m, const fam_ref *r, const char *fam)
{
    const size_t R = (size_t)r->B * r->T, V = (size_t)r->V;
    assert_int_equal(mk_model_config(m)->vocab_size, r->V);
    int *tokens = ints(r->tokens, R), *targets = ints(r->targets, R);
    float *logits = malloc(R * V * sizeof(float)), *logp = malloc(R * sizeof(float));
    assert_true(logits && logp);

    /* logits, log-probs, loss */
    err e_logits = {0}, e_logp = {0}, e_grad = {0}, e_dec = {0};
    assert_mk_ok(mk_forward(m, tokens, r->B, r->T));
    assert_mk_ok(mk_model_read_logits(m, logits));
    measure(&e_logits, logits, r->logits, R * V, TOL_LOGIT, TOL_LOGIT, fam, "logits");
    assert_mk_ok(mk_logprobs(m, targets, logp, NULL));
    measure(&e_logp, logp, r->logp, R, TOL_LOGIT, TOL_LOGIT, fam, "log-probs");
    float loss;
    assert_mk_ok(mk_loss_ce(m, targets, NULL, &loss));
    double loss_err = fabs((double)loss - r->loss);
    int loss_ok = loss_err <= TOL_LOSS + TOL_LOSS * fabs((double)r->loss);
    if (!loss_ok) fprintf(stderr, "%s: loss %.8g, transformers %.8g\n", fam, loss, r->loss);

    /* gradients of the loss */
    double worst_rel = 0;
    char worst_name[128] = "-";
    if (r->n_grads > 0) {
        mk_zero_grad(m);
        assert_mk_ok(mk_backward(m));
        check_grads(m, r, fam, &e_grad, &worst_rel, worst_name, sizeof worst_name);
    }

    /* decoding */
    int same = check_greedy(m, r, fam);
    check_decode_prefill(m, r, logits, fam, &e_dec);
    check_decode_steps(m, r, fam, &e_dec);

    printf("%-15s logits %.2e  logp %.2e  loss %.2e  grads %s (max |diff|/max|g| %.2e, %s)  "
           "greedy %d/%d  decode-vs-forward %.2e\n",
           fam, e_logits.max_abs, e_logp.max_abs, loss_err, r->n_grads ? "checked" : "none stored",
           worst_rel, worst_name, same, r->n_gen, e_dec.max_abs);
    fflush(stdout);
    free(tokens);
    free(targets);
    free(logits);
    free(logp);
    assert_true(e_logits.bad == 0 && e_logp.bad == 0 && loss_ok && e_grad.bad == 0 &&
                same == r->n_gen && e_dec.bad == 0);
}

static void test_family(void **state)
{
    const char *fam = *state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/family/%s", MK_FIXTURES, fam);
    snprintf(path, sizeof path, "%s/expect.bin", dir);
    fam_ref r;
    ref_read(&r, path);
    mk_model *m;
    assert_mk_ok(mk_load_dir(&m, dir, r.B, r.T, NULL));
    check_family(m, &r, fam);
    mk_model_free(m);
    ref_free(&r);
}

/* one cmocka test per fixture, named after it */
#define FAMILY(n)                                                                                  \
    {                                                                                              \
        .name = (n), .test_func = test_family, .initial_state = (void *)(n)                        \
    }

int main(void)
{
    const struct CMUnitTest tests[] = {
        FAMILY("gpt2"),  FAMILY("llama3"),     FAMILY("llama_bias"),     FAMILY("qwen2"),
        FAMILY("qwen3"), FAMILY("qwen3_bf16"), FAMILY("llama3_sharded"),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
