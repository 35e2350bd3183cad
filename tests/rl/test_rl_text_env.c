/*
 * test_rl_text_env.c - the env actor's JSON tool calls (format "json", what a
 * chat format's <tool_call>{...}</tool_call> carries), against the real calc
 * server (examples/calc_server.py on a free port).
 *
 * A call {"name": "calc", "arguments": {"expression": "347*29"}} reaches the
 * tool with those arguments (Llama 3's "parameters" too); text that is not
 * JSON, JSON of the wrong shape, arguments that are not an object and an
 * unknown tool name each come back at once as an error observation for the
 * policy (ok false, the text naming what is wrong); a format other than
 * "text" or "json" is refused as a bad call; "text" calls work as before.
 */
#include "calc_server.h"

#include <manta_actors.h>

#include <msgpack.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static manta_ctx *ctx;
static int calc_port;

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static manta_actor *make_env(void)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/mcp", calc_port);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    str(&pk, "sections"), msgpack_pack_map(&pk, 1);
    str(&pk, "tools"), msgpack_pack_array(&pk, 1), msgpack_pack_map(&pk, 3);
    str(&pk, "name"), str(&pk, "calc");
    str(&pk, "url"), str(&pk, url);
    str(&pk, "arg"), str(&pk, "expression");
    manta_actor *a = NULL;
    int rc = manta_actor_create(
        ctx,
        &(manta_actor_options){.cls = "env", .name = "env-0", .args = sb.data, .args_len = sb.size},
        &a);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(rc, 0);
    return a;
}

/* call {tool: "", input, format}; the answer's ok and text; the call's
 * status (0, or the error of a refused call). */
static int call(manta_actor *env, const char *input, const char *format, int *ok, char *text,
                size_t cap)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    str(&pk, "tool"), str(&pk, "");
    str(&pk, "input"), str(&pk, input);
    str(&pk, "format"), str(&pk, format);
    manta_future *f = manta_call_timeout(ctx, env, "call", sb.data, sb.size, 20000);
    msgpack_sbuffer_destroy(&sb);
    const void *d;
    size_t n;
    int rc = manta_get(f, -1, &d, &n);
    *ok = -1, text[0] = 0;
    if (rc == 0) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, d, n, NULL), MSGPACK_UNPACK_SUCCESS);
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            if (kv->key.via.str.size == 2 && !memcmp(kv->key.via.str.ptr, "ok", 2))
                *ok = kv->val.via.boolean;
            if (kv->key.via.str.size == 4 && !memcmp(kv->key.via.str.ptr, "text", 4))
                snprintf(text, cap, "%.*s", (int)kv->val.via.str.size, kv->val.via.str.ptr);
        }
        msgpack_unpacked_destroy(&u);
    }
    manta_future_free(f);
    printf("%-6s %-70s -> %s ok=%d \"%s\"\n", format, input, rc ? manta_strerror(rc) : "answer",
           *ok, text);
    return rc;
}

static void test_json_calls(void **st)
{
    (void)st;
    manta_actor *env = make_env();
    int ok;
    char text[256];
    assert_int_equal(call(env,
                          "\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"347*29\"}}\n",
                          "json", &ok, text, sizeof text),
                     0);
    assert_int_equal(ok, 1);
    assert_string_equal(text, "10063");
    assert_int_equal(call(env, "{\"name\": \"calc\", \"parameters\": {\"expression\": \"6*7\"}}",
                          "json", &ok, text, sizeof text),
                     0);
    assert_int_equal(ok, 1);
    assert_string_equal(text, "42");

    /* what the policy got wrong comes back as an observation */
    assert_int_equal(
        call(env, "{\"name\": \"calc\", \"arguments\": {\"expr", "json", &ok, text, sizeof text),
        0);
    assert_int_equal(ok, 0);
    assert_non_null(strstr(text, "error: the tool call is not JSON (at byte "));
    assert_int_equal(call(env, "[\"calc\", \"6*7\"]", "json", &ok, text, sizeof text), 0);
    assert_int_equal(ok, 0);
    assert_string_equal(text,
                        "error: the tool call must be {\"name\": string, \"arguments\": object}");
    assert_int_equal(
        call(env, "{\"name\": \"calc\", \"arguments\": \"6*7\"}", "json", &ok, text, sizeof text),
        0);
    assert_int_equal(ok, 0);
    assert_non_null(strstr(text, "error: the tool call must be"));
    assert_int_equal(
        call(env, "{\"name\": \"search\", \"arguments\": {}}", "json", &ok, text, sizeof text), 0);
    assert_int_equal(ok, 0);
    assert_string_equal(text, "error: unknown tool 'search'");
    /* arguments the tool refuses: the tool's own error */
    assert_int_equal(call(env, "{\"name\": \"calc\", \"arguments\": {\"expression\": \"6*/7\"}}",
                          "json", &ok, text, sizeof text),
                     0);
    assert_int_equal(ok, 0);

    /* a format nobody writes is a bad call; text calls as before */
    assert_int_equal(call(env, "6*7", "xml", &ok, text, sizeof text), MANTA_EINVAL);
    assert_int_equal(call(env, "calc:6*7", "text", &ok, text, sizeof text), 0);
    assert_int_equal(ok, 1);
    assert_string_equal(text, "42");
}

int main(void)
{
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 30000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int pid = rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", "", &calc_port);
    if (pid < 0) {
        fprintf(stderr, "cannot start the calc server\n");
        manta_shutdown(ctx);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_json_calls)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    return failed;
}
