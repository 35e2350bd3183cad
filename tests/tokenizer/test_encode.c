/*
 * test_encode.c - libmanta_tok against the tokenizers library.
 *
 * Three byte-level BPE tokenizers trained by gen_fixtures.py with the GPT-2,
 * Llama 3 and Qwen2 settings encode the committed corpus; every case must
 * give tokenizers' ids (with and without special tokens), decode to
 * tokenizers' text, and, for valid UTF-8, decode back to the input byte for
 * byte (the NFC form of it for Qwen2, as with tokenizers).  Invalid UTF-8 is refused by default
 * and, with MTOK_UTF8_REPLACE, encoded as tokenizers encodes Python's errors="replace" decoding of
 * it. Unsupported tokenizer kinds are refused with a message naming them.
 */
#include "ttest.h"

#define MAX_CASES 256

static void check_tokenizer(const char *name)
{
    char file[64];
    snprintf(file, sizeof file, "%s.json", name);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", MTOK_FIXTURES, file);
    mtok *t;
    if (mtok_load(path, &t) != 0) fail_msg("load %s: %s", path, mtok_last_error());
    snprintf(file, sizeof file, "expect_%s.json", name);
    cJSON *exp = read_json_fixture(file);
    size_t clen;
    char *cbuf = read_fixture("corpus.bin", &clen);
    corpus_case cs[MAX_CASES];
    size_t nc = corpus_cases(cbuf, clen, cs, MAX_CASES);
    const cJSON *cases = cJSON_GetObjectItem(exp, "cases");
    assert_int_equal((size_t)cJSON_GetArraySize(cases), nc);
    int failures = 0, round_trips = 0;
    for (size_t i = 0; i < nc; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, (int)i);
        bool invalid = cJSON_IsTrue(cJSON_GetObjectItem(c, "invalid"));
        char label[96];
        snprintf(label, sizeof label, "%s case %zu", name, i);
        int32_t *ids;
        size_t n;
        int rc = mtok_encode(t, cs[i].p, cs[i].len, 0, &ids, &n);
        if (invalid) {
            assert_int_equal(rc, MTOK_EINVAL);
            assert_non_null(strstr(mtok_last_error(), "not UTF-8"));
            rc = mtok_encode(t, cs[i].p, cs[i].len, MTOK_UTF8_REPLACE, &ids, &n);
        }
        assert_int_equal(rc, 0);
        failures += !ids_equal(ids, n, cJSON_GetObjectItem(c, "ids"), label);
        /* the same again, now from the cache */
        int32_t *ids2;
        size_t n2;
        assert_int_equal(mtok_encode(t, cs[i].p, cs[i].len, MTOK_UTF8_REPLACE, &ids2, &n2), 0);
        assert_true(n2 == n && (n == 0 || memcmp(ids, ids2, n * sizeof *ids) == 0));
        free(ids2);

        char *text;
        size_t tlen;
        assert_int_equal(mtok_decode(t, ids, n, 0, &text, &tlen), 0);
        /* "decoded" is left out of the fixture when it equals the input */
        const cJSON *dec = cJSON_GetObjectItem(c, "decoded");
        assert_true(dec || !invalid);
        const char *want = dec ? dec->valuestring : cs[i].p;
        size_t wlen = dec ? strlen(want) : cs[i].len;
        if (tlen != wlen || memcmp(text, want, tlen) != 0) {
            fprintf(stderr, "%s: decode differs: got '%.*s' want '%.*s'\n", label, (int)tlen, text,
                    (int)wlen, want);
            failures++;
        }
        round_trips += !dec;
        free(text);
        free(ids);

        rc = mtok_encode(t, cs[i].p, cs[i].len, MTOK_ADD_SPECIAL | MTOK_UTF8_REPLACE, &ids, &n);
        assert_int_equal(rc, 0);
        snprintf(label, sizeof label, "%s case %zu (special)", name, i);
        const cJSON *sp = cJSON_GetObjectItem(c, "ids_special"); /* absent: same as ids */
        failures += !ids_equal(ids, n, sp ? sp : cJSON_GetObjectItem(c, "ids"), label);
        assert_int_equal(mtok_decode(t, ids, n, MTOK_SKIP_SPECIAL, &text, &tlen), 0);
        want = cJSON_GetObjectItem(c, "decoded_skip")->valuestring;
        if (tlen != strlen(want) || memcmp(text, want, tlen) != 0) {
            fprintf(stderr, "%s: decode(skip special) differs: got '%.*s' want '%s'\n", label,
                    (int)tlen, text, want);
            failures++;
        }
        free(text);
        free(ids);
    }
    free(cbuf);
    cJSON_Delete(exp);
    mtok_free(t);
    /* Those that do not: invalid UTF-8, text NFC changes, and the Qwen2
     * fixture's non-ASCII added token (tokenizers' ByteLevel decoder maps its
     * 'é' as the byte 0xE9); each still decodes as tokenizers decodes it. */
    printf("%s: %zu cases, %d decode to the input byte for byte\n", name, nc, round_trips);
    assert_true(round_trips >= (int)nc / 2);
    if (failures) fail_msg("%s: %d mismatches with tokenizers", name, failures);
}

static void test_gpt2(void **state)
{
    check_tokenizer("gpt2");
}

static void test_llama3(void **state)
{
    check_tokenizer("llama3");
}

static void test_qwen2(void **state)
{
    check_tokenizer("qwen2");
}

/* Raw bytes of a token prefix: a character cut in two decodes as its first
 * bytes with MTOK_DECODE_BYTES and as U+FFFD without. */
static void test_decode_bytes(void **state)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/qwen2.json", MTOK_FIXTURES);
    mtok *t;
    assert_int_equal(mtok_load(path, &t), 0);
    const char *s = "\xF0\x9F\x98\x80"; /* U+1F600, four byte tokens unless merged */
    int32_t *ids;
    size_t n;
    assert_int_equal(mtok_encode(t, s, 4, 0, &ids, &n), 0);
    assert_true(n >= 2);
    char *text;
    size_t len;
    assert_int_equal(mtok_decode(t, ids, n - 1, MTOK_DECODE_BYTES, &text, &len), 0);
    assert_true(len < 4 && memcmp(text, s, len) == 0);
    free(text);
    assert_int_equal(mtok_decode(t, ids, n - 1, 0, &text, &len), 0);
    assert_non_null(strstr(text, "\xEF\xBF\xBD"));
    free(text);
    int32_t bad = (int32_t)mtok_vocab_size(t);
    assert_int_equal(mtok_decode(t, &bad, 1, 0, &text, &len), MTOK_EINVAL);
    assert_null(text);
    assert_int_equal(mtok_token_id(t, "<|im_end|>"), 2);
    assert_true(mtok_is_special(t, 2));
    assert_string_equal(mtok_token_str(t, 2), "<|im_end|>");
    assert_true(mtok_token_id(t, "<tool_call>") > 0);
    assert_false(mtok_is_special(t, mtok_token_id(t, "<tool_call>")));
    free(ids);
    mtok_free(t);
}

/* GPT-2's own file writes merges as "a b" strings, newer files as pairs:
 * both load to the same tokenizer. */
static void test_string_merges(void **state)
{
    char *s = read_fixture("gpt2.json", NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
    cJSON *strs = cJSON_CreateArray();
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        char buf[512];
        snprintf(buf, sizeof buf, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring,
                 cJSON_GetArrayItem(m, 1)->valuestring);
        cJSON_AddItemToArray(strs, cJSON_CreateString(buf));
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "merges", strs);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    mtok *a, *b;
    char path[1024];
    snprintf(path, sizeof path, "%s/gpt2.json", MTOK_FIXTURES);
    assert_int_equal(mtok_load(path, &a), 0);
    if (mtok_load_json(txt, strlen(txt), "strings.json", &b)) fail_msg("%s", mtok_last_error());
    free(txt);
    const char *text = "The quick brown fox's \t  code(x) += 42; \xE4\xB8\xAD\xE6\x96\x87";
    int32_t *ia, *ib;
    size_t na, nb;
    assert_int_equal(mtok_encode(a, text, strlen(text), 0, &ia, &na), 0);
    assert_int_equal(mtok_encode(b, text, strlen(text), 0, &ib, &nb), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na * sizeof *ia);
    free(ia);
    free(ib);
    mtok_free(a);
    mtok_free(b);
}

/* Long runs (one pre-token of a MiB, whitespace the regex backtracks over)
 * encode and round-trip; no reference, but no regex or stack limit either. */
static void test_long_runs(void **state)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/llama3.json", MTOK_FIXTURES);
    mtok *t;
    assert_int_equal(mtok_load(path, &t), 0);
    size_t len = 1 << 20;
    char *s = malloc(len);
    static const char fills[][4] = {" ", "a", "\n", "7", "!", " \t"};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        size_t k = strlen(fills[f]);
        for (size_t i = 0; i < len; i++) s[i] = fills[f][i % k];
        s[len - 1] = 'x';
        int32_t *ids;
        size_t n;
        if (mtok_encode(t, s, len, 0, &ids, &n)) fail_msg("fill %zu: %s", f, mtok_last_error());
        char *back;
        size_t blen;
        assert_int_equal(mtok_decode(t, ids, n, 0, &back, &blen), 0);
        assert_int_equal(blen, len);
        assert_memory_equal(back, s, len);
        free(back);
        free(ids);
    }
    free(s);
    mtok_free(t);
}

static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80                 ? 0
                   : c >= 0xC2 && c <= 0xDF ? 1
                   : c >= 0xE0 && c <= 0xEF ? 2
                   : c >= 0xF0 && c <= 0xF4 ? 3
                                            : 9;
        if (k == 9 || i + k >= n + (k == 0)) return false;
        for (size_t j = 1; j <= k; j++)
            if ((u[i + j] & 0xC0) != 0x80) return false;
        i += k + 1;
    }
    return true;
}

/* Random bytes, mostly high ones: strict encoding either succeeds and
 * round-trips or refuses; with MTOK_UTF8_REPLACE it always succeeds and
 * decodes to valid UTF-8. (No reference: this is for the sanitizers.) */
static void test_random_bytes(void **state)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/llama3.json", MTOK_FIXTURES);
    mtok *t;
    assert_int_equal(mtok_load(path, &t), 0);
    uint64_t x = 88172645463325252ull;
    static const char pool[] = "a '\n \xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80<|eot_id|>";
    for (int round = 0; round < 3000; round++) {
        char buf[96];
        size_t n = 0, len = 1 + round % 90;
        while (n < len) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (x % 3 == 0)
                buf[n++] = (char)(x >> 24);
            else
                buf[n++] = pool[(x >> 24) % (sizeof pool - 1)];
        }
        int32_t *ids;
        size_t k;
        char *back;
        size_t blen;
        int rc = mtok_encode(t, buf, n, 0, &ids, &k);
        if (rc == 0) {
            assert_int_equal(mtok_decode(t, ids, k, 0, &back, &blen), 0);
            assert_int_equal(blen, n);
            assert_memory_equal(back, buf, n);
            free(back);
            free(ids);
        } else {
            assert_int_equal(rc, MTOK_EINVAL);
        }
        assert_int_equal(mtok_encode(t, buf, n, MTOK_UTF8_REPLACE, &ids, &k), 0);
        assert_int_equal(mtok_decode(t, ids, k, 0, &back, &blen), 0);
        assert_true(valid_utf8(back, blen));
        free(back);
        free(ids);
    }
    mtok_free(t);
}

/* tokenizer.json text with one part replaced: the refusal must name it. */
static void expect_refusal(const char *json, int code, const char *needle)
{
    mtok *t = (mtok *)1;
    int rc = mtok_load_json(json, strlen(json), "x.json", &t);
    if (rc != code || !strstr(mtok_last_error(), needle))
        fail_msg("want %d mentioning '%s', got %d: %s", code, needle, rc, mtok_last_error());
    assert_null(t);
}

#define BASE(model, pre)                                                                           \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"               \
    "\"normalizer\":null,\"pre_tokenizer\":" pre ",\"post_processor\":null,"                       \
    "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":" model "}"

static void test_refusals(void **state)
{
    expect_refusal(BASE("{\"type\":\"Unigram\",\"vocab\":[]}", "null"), MTOK_EUNSUPPORTED,
                   "model type 'Unigram'");
    expect_refusal(BASE("{\"type\":\"WordPiece\",\"vocab\":{}}", "null"), MTOK_EUNSUPPORTED,
                   "model type 'WordPiece'");
    expect_refusal(
        BASE("{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{},\"merges\":[]}", "null"),
        MTOK_EUNSUPPORTED, "byte_fallback");
    expect_refusal(BASE("{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}", "null"),
                   MTOK_EUNSUPPORTED, "dropout");
    /* bytes without a symbol are skipped as tokenizers does, unless an unk token is set */
    expect_refusal(
        BASE("{\"type\":\"BPE\",\"unk_token\":\"a\",\"vocab\":{\"a\":0},\"merges\":[]}", "null"),
        MTOK_EUNSUPPORTED, "byte 0x00");
    expect_refusal("{\"model\": [", MTOK_EFORMAT, "not valid JSON");
    mtok *t;
    assert_int_equal(mtok_load("/nonexistent/tokenizer.json", &t), MTOK_ENOTFOUND);
    assert_non_null(strstr(mtok_last_error(), "/nonexistent/tokenizer.json"));

    /* A real file with its pre-tokenizer swapped for Metaspace (Llama 2's). */
    size_t len;
    char *s = read_fixture("gpt2.json", &len);
    cJSON *j = cJSON_Parse(s);
    free(s);
    cJSON_ReplaceItemInObject(j, "pre_tokenizer",
                              cJSON_Parse("{\"type\":\"Metaspace\",\"replacement\":\"_\"}"));
    char *txt = cJSON_PrintUnformatted(j);
    expect_refusal(txt, MTOK_EUNSUPPORTED, "pre_tokenizer: type 'Metaspace'");
    free(txt);
    cJSON_ReplaceItemInObject(j, "pre_tokenizer",
                              cJSON_Parse("{\"type\":\"ByteLevel\",\"add_prefix_space\":true}"));
    txt = cJSON_PrintUnformatted(j);
    expect_refusal(txt, MTOK_EUNSUPPORTED, "add_prefix_space");
    free(txt);
    cJSON_ReplaceItemInObject(j, "pre_tokenizer",
                              cJSON_Parse("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                                          "\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},"
                                          "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":"
                                          "\"ByteLevel\",\"use_regex\":false}]}"));
    txt = cJSON_PrintUnformatted(j);
    expect_refusal(txt, MTOK_EUNSUPPORTED, "escape \\w");
    free(txt);
    cJSON_ReplaceItemInObject(j, "normalizer", cJSON_Parse("{\"type\":\"NFKC\"}"));
    txt = cJSON_PrintUnformatted(j);
    expect_refusal(txt, MTOK_EUNSUPPORTED, "normalizer: type 'NFKC'");
    free(txt);
    cJSON_Delete(j);

    int32_t *ids;
    size_t n;
    assert_int_equal(mtok_encode(NULL, "a", 1, 0, &ids, &n), MTOK_EINVAL);
    char path[1024];
    snprintf(path, sizeof path, "%s/gpt2.json", MTOK_FIXTURES);
    assert_int_equal(mtok_load(path, &t), 0);
    assert_int_equal(mtok_encode(t, "a", 1, 1u << 7, &ids, &n), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "unknown flags"));
    assert_int_equal(mtok_encode(t, NULL, 0, 0, &ids, &n), 0);
    assert_int_equal(n, 0);
    mtok_free(t);
    assert_string_equal(mtok_strerror(MTOK_EUNSUPPORTED),
                        "tokenizer or option not supported: it would not match tokenizers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),      cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen2),     cmocka_unit_test(test_decode_bytes),
        cmocka_unit_test(test_refusals),  cmocka_unit_test(test_string_merges),
        cmocka_unit_test(test_long_runs), cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
