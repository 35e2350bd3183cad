/*
 * test_chat.c - the built-in chat formats against transformers'
 * apply_chat_template with the Qwen2.5 and Llama 3.1 templates (fixtures
 * made by gen_fixtures.py): system, user, assistant, tool-call and
 * tool-response turns, with and without tools and a generation prompt.
 */
#include "ttest.h"

#define MAX_MSGS  16
#define MAX_CALLS 4

static void check_format(const char *fixture, mtok_chat_format fmt)
{
    cJSON *root = read_json_fixture(fixture);
    const cJSON *c;
    int i = 0, failures = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
    {
        mtok_message msgs[MAX_MSGS];
        mtok_tool_call calls[MAX_MSGS][MAX_CALLS];
        size_t n = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages"))
        {
            assert_true(n < MAX_MSGS);
            mtok_message *x = &msgs[n];
            memset(x, 0, sizeof *x);
            x->role = cJSON_GetObjectItem(m, "role")->valuestring;
            x->content = cJSON_GetObjectItem(m, "content")->valuestring;
            const cJSON *tc;
            cJSON_ArrayForEach(tc, cJSON_GetObjectItem(m, "tool_calls"))
            {
                assert_true(x->n_tool_calls < MAX_CALLS);
                const cJSON *fn = cJSON_GetObjectItem(tc, "function");
                calls[n][x->n_tool_calls].name = cJSON_GetObjectItem(fn, "name")->valuestring;
                calls[n][x->n_tool_calls].arguments =
                    cJSON_GetObjectItem(tc, "arguments_json")->valuestring;
                x->n_tool_calls++;
            }
            x->tool_calls = x->n_tool_calls ? calls[n] : NULL;
            n++;
        }
        const cJSON *tools = cJSON_GetObjectItem(c, "tools_json");
        mtok_chat_opts o = {
            .format = fmt,
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
            .tools_json = cJSON_IsString(tools) ? tools->valuestring : NULL,
        };
        char *text;
        size_t len;
        int rc = mtok_chat_render(NULL, msgs, n, &o, &text, &len);
        const cJSON *want = cJSON_GetObjectItem(c, "text");
        if (!cJSON_IsString(want)) { /* the template raised */
            if (rc != MTOK_EINVAL) {
                fprintf(stderr, "%s case %d: transformers refused, got %d\n", fixture, i, rc);
                failures++;
            }
        } else if (rc != 0) {
            fprintf(stderr, "%s case %d: %s\n", fixture, i, mtok_last_error());
            failures++;
        } else if (len != strlen(want->valuestring) || memcmp(text, want->valuestring, len)) {
            size_t k = 0;
            while (k < len && text[k] == want->valuestring[k]) k++;
            fprintf(stderr, "%s case %d: differs at byte %zu:\n--- got\n%s\n--- want\n%s\n",
                    fixture, i, k, text + (k > 40 ? k - 40 : 0),
                    want->valuestring + (k > 40 ? k - 40 : 0));
            failures++;
        }
        free(text);
        i++;
    }
    cJSON_Delete(root);
    if (failures) fail_msg("%s: %d renderings differ from transformers", fixture, failures);
}

static void test_chatml(void **state)
{
    check_format("chat_chatml.json", MTOK_CHAT_CHATML);
}

static void test_llama3(void **state)
{
    check_format("chat_llama3.json", MTOK_CHAT_LLAMA3);
}

static void test_detect(void **state)
{
    static const struct {
        const char *file;
        int rc;
        mtok_chat_format f;
    } cases[] = {{"qwen2.json", 0, MTOK_CHAT_CHATML},
                 {"llama3.json", 0, MTOK_CHAT_LLAMA3},
                 {"gpt2.json", MTOK_ENOTFOUND, MTOK_CHAT_AUTO}};
    for (size_t k = 0; k < 3; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", MTOK_FIXTURES, cases[k].file);
        mtok *t;
        assert_int_equal(mtok_load(path, &t), 0);
        mtok_chat_format f = MTOK_CHAT_AUTO;
        assert_int_equal(mtok_chat_detect(t, &f), cases[k].rc);
        if (!cases[k].rc) assert_int_equal(f, cases[k].f);
        /* AUTO renders as the detected format, and the text encodes with
         * its special tokens as single ids. */
        mtok_message m = {.role = "user", .content = "hi"};
        mtok_chat_opts o = {.format = MTOK_CHAT_AUTO, .add_generation_prompt = 1};
        char *text;
        size_t len;
        int rc = mtok_chat_render(t, &m, 1, &o, &text, &len);
        assert_int_equal(rc, cases[k].rc);
        if (!rc) {
            int32_t *ids;
            size_t n;
            assert_int_equal(mtok_encode(t, text, len, 0, &ids, &n), 0);
            int32_t want =
                mtok_token_id(t, f == MTOK_CHAT_CHATML ? "<|im_start|>" : "<|begin_of_text|>");
            assert_int_equal(ids[0], want);
            free(ids);
            free(text);
        } else {
            assert_non_null(strstr(mtok_last_error(), "no chat format"));
        }
        mtok_free(t);
    }
}

static void test_refusals(void **state)
{
    mtok_chat_format pf;
    assert_int_equal(mtok_chat_format_parse("qwen", &pf), 0);
    assert_int_equal(pf, MTOK_CHAT_CHATML);
    assert_int_equal(mtok_chat_format_parse("llama3", &pf), 0);
    assert_int_equal(pf, MTOK_CHAT_LLAMA3);
    assert_int_equal(mtok_chat_format_parse("mistral", &pf), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "'mistral'"));

    mtok_tool_call two[2] = {{"f", "{}"}, {"g", "{\"a\": 1}"}};
    mtok_message m[2] = {{.role = "user", .content = "x"},
                         {.role = "assistant", .tool_calls = two, .n_tool_calls = 2}};
    mtok_chat_opts o = {.format = MTOK_CHAT_LLAMA3};
    char *text;
    assert_int_equal(mtok_chat_render(NULL, m, 2, &o, &text, NULL), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "one tool call"));
    o.format = MTOK_CHAT_CHATML; /* Qwen takes several */
    assert_int_equal(mtok_chat_render(NULL, m, 2, &o, &text, NULL), 0);
    assert_non_null(strstr(text, "{\"name\": \"g\", \"arguments\": {\"a\": 1}}"));
    free(text);
    mtok_message sys = {.role = "system", .content = "s"};
    o = (mtok_chat_opts){.format = MTOK_CHAT_LLAMA3, .tools_json = "[]"};
    assert_int_equal(mtok_chat_render(NULL, &sys, 1, &o, &text, NULL), MTOK_EINVAL);
    mtok_message odd = {.role = "narrator", .content = "x"};
    assert_int_equal(mtok_chat_render(NULL, &odd, 1, &o, &text, NULL), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "narrator"));
    mtok_tool_call badj = {"f", "{\"a\": }"};
    mtok_message b[2] = {{.role = "user", .content = "x"},
                         {.role = "assistant", .tool_calls = &badj, .n_tool_calls = 1}};
    o = (mtok_chat_opts){.format = MTOK_CHAT_CHATML};
    assert_int_equal(mtok_chat_render(NULL, b, 2, &o, &text, NULL), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "tool_call.arguments"));
    assert_int_equal(mtok_chat_render(NULL, b, 0, &o, &text, NULL), MTOK_EINVAL);
}

/* Numbers and strings as Python's json.dumps(json.loads(...)) writes them
 * (the expected text was printed by CPython 3). */
static void test_python_json(void **state)
{
    mtok_tool_call tc = {
        "f", "{\"a\": [1.50, 1E2, 0.00001, 0.0001, 12345678901234567.0, 1e16, 123456789012345.6, "
             "5e-324, 2.5e-3, -0, -0.0, 0.1, 1e22, 9007199254740993, "
             "\"\\u00e9\\ud83d\\ude00\\u0001\\/\\u007f\"]}"};
    mtok_message m[2] = {{.role = "user", .content = "x"},
                         {.role = "assistant", .tool_calls = &tc, .n_tool_calls = 1}};
    mtok_chat_opts o = {.format = MTOK_CHAT_CHATML};
    char *text;
    assert_int_equal(mtok_chat_render(NULL, m, 2, &o, &text, NULL), 0);
    const char *want = "{\"a\": [1.5, 100.0, 1e-05, 0.0001, 1.2345678901234568e+16, 1e+16, "
                       "123456789012345.6, 5e-324, 0.0025, 0, -0.0, 0.1, 1e+22, 9007199254740993, "
                       "\"\xC3\xA9\xF0\x9F\x98\x80\\u0001/\x7F\"]}";
    if (!strstr(text, want)) fail_msg("got %s\nwant %s", text, want);
    free(text);
    tc.arguments = "{\"a\": 1e400}";
    assert_int_equal(mtok_chat_render(NULL, m, 2, &o, &text, NULL), MTOK_EINVAL);
    tc.arguments = "{\"a\": \"\\ud800\"}";
    assert_int_equal(mtok_chat_render(NULL, m, 2, &o, &text, NULL), MTOK_EINVAL);
    assert_non_null(strstr(mtok_last_error(), "surrogate"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),      cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_detect),      cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_python_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
