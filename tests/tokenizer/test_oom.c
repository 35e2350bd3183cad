/*
 * test_oom.c - libmanta_tok when memory runs out.
 *
 * The test links with -Wl,--wrap for the allocating functions the library
 * calls (malloc, calloc, realloc, strdup), so the N-th allocation can be made
 * to fail, as the spec loader's test_spec_oom does.  For N = 1, 2, ... until
 * a call makes fewer than N allocations, loading, encoding, decoding and
 * chat rendering must fail with MTOK_ENOMEM (out pointers NULL) or succeed,
 * and never crash or leak (run under ASan).  cJSON, PCRE2 and ICU allocate
 * inside their shared libraries and are not failed here.
 */
#include "ttest.h"

static long fail_at = -1; /* the allocation to fail (1-based), -1: none */
static long calls;

static int should_fail(void)
{
    return fail_at > 0 && ++calls == fail_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
/* The wrappers the linker's --wrap sends the library's allocations to. */
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    return should_fail() ? NULL : __real_strdup(s);
}

static void arm(long n)
{
    calls = 0;
    fail_at = n;
}

/* True when the armed failure was reached (the call could have failed). */
static int disarm(void)
{
    int hit = fail_at > 0 && calls >= fail_at;
    fail_at = -1;
    return hit;
}

static char *json;
static size_t json_len;

static void test_load(void **state)
{
    json = read_fixture("qwen2.json", &json_len);
    long n;
    for (n = 1;; n++) {
        mtok *t = (mtok *)1;
        arm(n);
        int rc = mtok_load_json(json, json_len, "qwen2.json", &t);
        int hit = disarm();
        if (rc == 0) {
            assert_non_null(t);
            mtok_free(t);
            if (!hit) break;
        } else {
            assert_int_equal(rc, MTOK_ENOMEM);
            assert_null(t);
        }
    }
    printf("load: failed each of %ld allocations in turn\n", n - 1);
}

/* The GGUF route: metadata tables, the synthesised tokenizer.json, then the same load. */
static void test_load_gguf(void **state)
{
    long n;
    for (n = 1;; n++) {
        mtok *t = (mtok *)1;
        arm(n);
        int rc = mtok_load_gguf(MTOK_GGUF_FIXTURE, &t);
        int hit = disarm();
        if (rc == 0) {
            assert_non_null(t);
            mtok_free(t);
            if (!hit) break;
        } else {
            assert_int_equal(rc, MTOK_ENOMEM);
            assert_null(t);
        }
    }
    printf("load_gguf: failed each of %ld allocations in turn\n", n - 1);
}

static void test_encode_decode(void **state)
{
    const char *text = "Hello <|im_start|>wörld  café\n\n\t 中文 12345 😀 \xFF";
    long n;
    for (n = 1;; n++) {
        mtok *t;
        assert_int_equal(mtok_load_json(json, json_len, "qwen2.json", &t), 0);
        int32_t *ids = (int32_t *)1;
        size_t k = 7;
        arm(n);
        int rc = mtok_encode(t, text, strlen(text), MTOK_UTF8_REPLACE | MTOK_ADD_SPECIAL, &ids, &k);
        char *back = (char *)1;
        size_t blen;
        int rc2 = rc ? MTOK_ENOMEM : mtok_decode(t, ids, k, 0, &back, &blen);
        int hit = disarm();
        if (rc) {
            assert_int_equal(rc, MTOK_ENOMEM);
            assert_null(ids);
            assert_int_equal(k, 0);
        } else {
            free(ids);
        }
        if (!rc && rc2) {
            assert_int_equal(rc2, MTOK_ENOMEM);
            assert_null(back);
        } else if (!rc) {
            free(back);
        }
        mtok_free(t);
        if (!rc && !rc2 && !hit) break;
    }
    printf("encode + decode: failed each of %ld allocations in turn\n", n - 1);
    free(json);
}

static void test_chat(void **state)
{
    mtok_tool_call tc = {"f", "{\"a\": [1.5, \"x\\u00e9\", {\"b\": null}]}"};
    mtok_message m[4] = {{.role = "system", .content = " sys "},
                         {.role = "user", .content = "hi"},
                         {.role = "assistant", .tool_calls = &tc, .n_tool_calls = 1},
                         {.role = "tool", .content = "ok"}};
    for (int f = MTOK_CHAT_CHATML; f <= MTOK_CHAT_LLAMA3; f++) {
        mtok_chat_opts o = {.format = (mtok_chat_format)f,
                            .add_generation_prompt = 1,
                            .tools_json = "[{\"type\": \"function\", \"function\": {\"name\": "
                                          "\"f\", \"parameters\": {}}}]"};
        long n;
        for (n = 1;; n++) {
            char *text = (char *)1;
            arm(n);
            int rc = mtok_chat_render(NULL, m, 4, &o, &text, NULL);
            int hit = disarm();
            if (rc) {
                assert_int_equal(rc, MTOK_ENOMEM);
                assert_null(text);
            } else {
                free(text);
                if (!hit) break;
            }
        }
        printf("chat format %d: failed each of %ld allocations in turn\n", f, n - 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_load_gguf),
        cmocka_unit_test(test_encode_decode),
        cmocka_unit_test(test_chat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
