/*
 * test_alloc.c - the header's promise that nothing is allocated during
 * forward, the losses, backward or a step, nor during a decoding step.
 *
 * The test is linked with -Wl,--wrap for malloc, calloc, realloc,
 * aligned_alloc and posix_memalign, so every allocation the kernels library
 * makes goes through the counters below (calls made inside OpenMP, OpenBLAS
 * or libc themselves are not seen: those are their own pools).  After one
 * warm-up round, a second round of each call must allocate nothing, on sizes
 * that take both the BLAS and the skinny matrix products, the parallel and
 * the serial attention, and both decode attention paths; training also with bfloat16 products
 * (MK_MODEL_BF16_TRAIN).
 */
#include <stdatomic.h>

#include "ktest.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);

static atomic_int counting;
static atomic_long n_allocs;

static void count(void)
{
    if (atomic_load(&counting)) atomic_fetch_add(&n_allocs, 1);
}

void *__wrap_malloc(size_t n)
{
    count();
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    count();
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    count();
    return __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    count();
    return __real_aligned_alloc(align, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    count();
    return __real_posix_memalign(p, align, n);
}

/* Counts the allocations made from here to alloc_count(). */
static void alloc_start(void)
{
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, 1);
}

static long alloc_count(void)
{
    atomic_store(&counting, 0);
    return atomic_load(&n_allocs);
}

enum { B = 4, T = 32, V = 64 };
static const mk_config cfg = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = T, .vocab_size = V};

/* The wrapper sees the library's allocations: creating a model makes some. */
static void test_wrapper_counts(void **state)
{
    mk_model *m;
    alloc_start();
    assert_mk_ok(mk_model_new(&m, &cfg, B, T, NULL));
    assert_true(alloc_count() >= 5);
    mk_model_free(m);
}

/* One training round: forward, both losses, log-probs, backward, AdamW. */
static void train_round(mk_model *m, const int *tok, const int *tgt, const float *adv,
                        const float *behav, int b, int t)
{
    mk_adamw_params opt = {.lr = 1e-3f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .grad_clip = 0.5f};
    mk_ppo_params pp = {
        .clip_low = 0.2f, .clip_high = 0.28f, .ratio_cap = 3.0f, .entropy_coef = 0.01f};
    mk_ppo_stats st;
    float loss, lp[B * T], norm;
    assert_mk_ok(mk_forward(m, tok, b, t));
    assert_mk_ok(mk_logprobs(m, tgt, lp, NULL));
    assert_mk_ok(mk_loss_ce(m, tgt, NULL, &loss));
    mk_zero_grad(m);
    assert_mk_ok(mk_backward(m));
    assert_mk_ok(mk_model_step(m, &opt, 1, &norm));
    assert_mk_ok(mk_forward(m, tok, b, t));
    assert_mk_ok(mk_loss_ppo(m, tgt, behav, adv, NULL, &pp, &st));
    mk_zero_grad(m);
    assert_mk_ok(mk_backward(m));
    assert_mk_ok(mk_model_step(m, &opt, 2, NULL));
}

/* flags: 0, or MK_MODEL_BF16_TRAIN (whose bfloat16 copies each step makes stale, remade by the
 * next forward) */
static void training_allocates_nothing(unsigned flags)
{
    mk_model *m;
    assert_mk_ok(mk_model_new_ex(&m, &cfg, B, T, NULL, flags));
    mk_model_init(m, 5);
    int tok[B * T], tgt[B * T];
    float adv[B * T], behav[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 7) % V, tgt[i] = (i * 11 + 3) % V, adv[i] = (i % 5) - 2.0f, behav[i] = -4.0f;
    /* full batch (BLAS products, parallel attention) and one short row (skinny products) */
    const int shapes[][2] = {{B, T}, {1, 8}};
    for (int k = 0; k < 2; k++) {
        train_round(m, tok, tgt, adv, behav, shapes[k][0], shapes[k][1]); /* warm-up */
        alloc_start();
        train_round(m, tok, tgt, adv, behav, shapes[k][0], shapes[k][1]);
        long n = alloc_count();
        if (n) fprintf(stderr, "batch %dx%d: %ld allocations\n", shapes[k][0], shapes[k][1], n);
        assert_int_equal(n, 0);
    }
    mk_model_free(m);
}

static void test_training_allocates_nothing(void **state)
{
    (void)state;
    training_allocates_nothing(0);
}

static void test_bf16_training_allocates_nothing(void **state)
{
    (void)state;
    training_allocates_nothing(MK_MODEL_BF16_TRAIN);
}

/* Appending and stepping allocate nothing either, for one slot (a work item per head) and
 * for many (a work item per row), greedy and with top-p; with float weights and with
 * bfloat16 ones (whose copies are remade, after a write of the parameters, by the next step). */
static void decoding_allocates_nothing(unsigned flags)
{
    mk_model *m;
    mk_decoder *d;
    assert_mk_ok(mk_model_new_ex(&m, &cfg, 1, T, NULL, flags));
    mk_model_init(m, 6);
    enum { S = 16 };
    assert_mk_ok(mk_decoder_new(&d, m, S));
    int slots[S], tok[S], prompt[4] = {1, 2, 3, 4};
    float temp[S], topp[S], lps[S], lpp[S];
    for (int s = 0; s < S; s++)
        slots[s] = s, temp[s] = s % 2 ? 1.0f : 0.0f, topp[s] = s % 4 == 1 ? 0.9f : 1.0f;
    for (int s = 0; s < S; s++) assert_mk_ok(mk_decoder_append(d, s, prompt, 4));
    assert_mk_ok(mk_decoder_step(d, slots, S, temp, topp, tok, lps, lpp)); /* warm-up */
    assert_mk_ok(mk_decoder_step(d, slots, 1, temp, topp, tok, lps, lpp));
    float w = 0.5f;
    alloc_start();
    assert_mk_ok(mk_model_write_params(m, &w, mk_model_num_params(m) / 2, 1));
    assert_mk_ok(mk_decoder_append(d, 2, prompt, 3));
    for (int k = 0; k < 4; k++) {
        assert_mk_ok(mk_decoder_step(d, slots, S, temp, topp, tok, lps, lpp));
        assert_mk_ok(mk_decoder_step(d, slots, 1, temp, topp, tok, lps, lpp));
    }
    assert_int_equal(alloc_count(), 0);
    mk_decoder_free(d);
    mk_model_free(m);
}

static void test_decoding_allocates_nothing(void **state)
{
    (void)state;
    decoding_allocates_nothing(0);
}

static void test_bf16_decoding_allocates_nothing(void **state)
{
    (void)state;
    decoding_allocates_nothing(MK_MODEL_INFER | MK_MODEL_BF16_WEIGHTS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrapper_counts),
        cmocka_unit_test(test_training_allocates_nothing),
        cmocka_unit_test(test_bf16_training_allocates_nothing),
        cmocka_unit_test(test_decoding_allocates_nothing),
        cmocka_unit_test(test_bf16_decoding_allocates_nothing),
    };
    mk_set_threads(2);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
