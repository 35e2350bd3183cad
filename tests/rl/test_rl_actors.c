/*
 * test_rl_actors.c - the env and reward actors on their own, against real
 * servers: examples/calc_server.py (MCP over HTTP) and a small reward service
 * (Python, stdlib) started on free ports.
 *
 * env: a good call answers the tool's text; a refused connection, an HTTP
 * 500, a tool error (bad expression) and an unknown tool each become an
 * error observation (ok = false, the kind named) and a counter; many calls
 * are in flight at once; drain answers after the calls in flight.
 * reward: exact, numeric tolerance, and the HTTP service (including a
 * service that is down: ok = false, no crash).
 * settings: a learner whose model.n_layer is "two", an env whose tool has
 * an unknown key and a reward with an unknown rule fail their init (the
 * message, naming the spec key, is on the actor's log) instead of running
 * with defaults.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static manta_ctx *ctx;
static int calc_port, fail_port, reward_port, reward_pid;

/* msgpack init payload {replica, replicas, settings, sections} */
static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static manta_actor *make_env(const char *name, const char *url)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "sections");
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "tools");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "name"), pack_str(&pk, "calc");
    pack_str(&pk, "url"), pack_str(&pk, url);
    pack_str(&pk, "timeout_ms"), msgpack_pack_int(&pk, 3000);
    manta_actor *a = NULL;
    int rc = manta_actor_create(
        ctx,
        &(manta_actor_options){.cls = "env", .name = name, .args = sb.data, .args_len = sb.size},
        &a);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(rc, 0);
    return a;
}

static manta_actor *make_reward(const char *name, const char *rule, const char *url, double tol)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "settings");
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "rule"), pack_str(&pk, rule);
    pack_str(&pk, "url"), pack_str(&pk, url);
    pack_str(&pk, "tolerance"), msgpack_pack_double(&pk, tol);
    manta_actor *a = NULL;
    int rc = manta_actor_create(
        ctx,
        &(manta_actor_options){.cls = "reward", .name = name, .args = sb.data, .args_len = sb.size},
        &a);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(rc, 0);
    return a;
}

static manta_future *call2(manta_actor *a, const char *method, const char *k1, const char *v1,
                           const char *k2, const char *v2)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, k1), pack_str(&pk, v1);
    pack_str(&pk, k2), pack_str(&pk, v2);
    manta_future *f = manta_call_timeout(ctx, a, method, sb.data, sb.size, 20000);
    msgpack_sbuffer_destroy(&sb);
    return f;
}

/* Wait for an answer map and copy out key (str) and ok/reward. */
static void answer(manta_future *f, const char *key, char *out, size_t cap, double *num)
{
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, -1, &d, &n), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, d, n, NULL), MSGPACK_UNPACK_SUCCESS);
    out[0] = 0;
    *num = -1;
    int have_reward = 0;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        msgpack_object_kv *kv = &u.data.via.map.ptr[i];
        if (kv->key.via.str.size == strlen(key) &&
            !memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) &&
            kv->val.type == MSGPACK_OBJECT_STR)
            snprintf(out, cap, "%.*s", (int)kv->val.via.str.size, kv->val.via.str.ptr);
        if (kv->key.via.str.size == 2 && !memcmp(kv->key.via.str.ptr, "ok", 2) && !have_reward)
            *num = kv->val.via.boolean;
        if (kv->key.via.str.size == 6 && !memcmp(kv->key.via.str.ptr, "reward", 6))
            *num = kv->val.via.f64, have_reward = 1; /* the reward, not ok, for score */
    }
    msgpack_unpacked_destroy(&u);
    manta_future_free(f);
}

static void test_env(void **st)
{
    char url[128], bad[128], five[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/mcp", calc_port);
    snprintf(bad, sizeof bad, "http://127.0.0.1:%d/mcp", 1); /* nothing listens: refused */
    snprintf(five, sizeof five, "http://127.0.0.1:%d/mcp", fail_port); /* --fail-rate 1 */
    manta_actor *good = make_env("env-good", url), *dead = make_env("env-dead", bad),
                *flaky = make_env("env-500", five);
    char text[256], kind[64];
    double ok;
    /* many in flight on one env */
    manta_future *fs[40];
    for (int i = 0; i < 40; i++) {
        char expr[32];
        snprintf(expr, sizeof expr, "%d*29", 300 + i);
        fs[i] = call2(good, "call", "tool", "calc", "input", expr);
    }
    for (int i = 0; i < 40; i++) {
        answer(fs[i], "text", text, sizeof text, &ok);
        char want[32];
        snprintf(want, sizeof want, "%d", (300 + i) * 29);
        assert_true(ok == 1);
        assert_string_equal(text, want);
    }
    /* the policy names the tool in the call text, or the first tool is used */
    answer(call2(good, "call", "tool", "", "input", "calc:2+3"), "text", text, sizeof text, &ok);
    assert_string_equal(text, "5");
    answer(call2(good, "call", "tool", "", "input", "6*7"), "text", text, sizeof text, &ok);
    assert_string_equal(text, "42");
    answer(call2(good, "call", "tool", "calc", "input", "12*/3"), "kind", kind, sizeof kind, &ok);
    assert_true(ok == 0);
    assert_string_equal(kind, "ETOOL");
    answer(call2(good, "call", "tool", "search", "input", "x"), "kind", kind, sizeof kind, &ok);
    assert_true(ok == 0);
    assert_string_equal(kind, "EUNKNOWN");
    answer(call2(dead, "call", "tool", "calc", "input", "1+1"), "kind", kind, sizeof kind, &ok);
    assert_true(ok == 0);
    assert_string_equal(kind, "ECONNECT");
    answer(call2(dead, "call", "tool", "calc", "input", "1+1"), "text", text, sizeof text, &ok);
    assert_string_equal(text, "error: ECONNECT"); /* what the policy reads */
    answer(call2(flaky, "call", "tool", "calc", "input", "1+1"), "kind", kind, sizeof kind, &ok);
    assert_true(ok == 0);
    assert_string_equal(kind, "EHTTP");
    /* garbage argument: an error, the actor lives on */
    manta_future *g = manta_call(ctx, good, "call", "\xc1\xc1", 2);
    assert_int_not_equal(manta_get(g, -1, NULL, NULL), 0);
    manta_future_free(g);
    /* drain: answers after the calls in flight, then refuses new ones */
    manta_future *slow = call2(good, "call", "tool", "calc", "input", "2+2");
    manta_future *dr = manta_call_timeout(ctx, good, "drain", "", 0, 20000);
    assert_int_equal(manta_get(dr, -1, NULL, NULL), 0);
    manta_future_free(dr);
    answer(slow, "text", text, sizeof text, &ok);
    assert_string_equal(text, "4");
    manta_future *late = call2(good, "call", "tool", "calc", "input", "2+2");
    assert_int_equal(manta_get(late, -1, NULL, NULL), MANTA_EBUSY);
    manta_future_free(late);
    for (manta_actor *a = good; a; a = a == good ? dead : a == dead ? flaky : NULL)
        assert_int_equal(manta_actor_stop(ctx, a, 10000), 0);
}

static void test_reward(void **st)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/score", reward_port);
    manta_actor *ex = make_reward("r-exact", "exact", "", 0),
                *nu = make_reward("r-num", "numeric", "", 0.01),
                *ht = make_reward("r-http", "http", url, 0),
                *down = make_reward("r-down", "http", "http://127.0.0.1:1/score", 0);
    char tmp[8];
    double r;
    answer(call2(ex, "score", "answer", "10063", "reference", "10063"), "-", tmp, sizeof tmp, &r);
    assert_true(r == 1);
    answer(call2(ex, "score", "answer", "10064", "reference", "10063"), "-", tmp, sizeof tmp, &r);
    assert_true(r == 0);
    answer(call2(nu, "score", "answer", "1000", "reference", "1005"), "-", tmp, sizeof tmp, &r);
    assert_true(r == 1);
    answer(call2(ht, "score", "answer", "42", "reference", "42"), "-", tmp, sizeof tmp, &r);
    assert_true(r == 1);
    answer(call2(ht, "score", "answer", "41", "reference", "42"), "-", tmp, sizeof tmp, &r);
    assert_true(r == 0);
    /* the service is down: ok false (the controller drops the episode) */
    manta_future *f = call2(down, "score", "answer", "1", "reference", "1");
    const void *d;
    size_t n;
    assert_int_equal(manta_get(f, -1, &d, &n), 0);
    assert_non_null(memmem(d, n, "\xa2ok\xc2", 4)); /* "ok": false */
    manta_future_free(f);
}

/* Create `cls` with a payload {group, settings: {SECTION: {KEY: "two"}}}
 * (or sections when in_sections) and expect its init to refuse it. */
static void expect_init_fails(const char *cls, const char *section, const char *k, int in_sections)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "group"), pack_str(&pk, cls);
    pack_str(&pk, in_sections ? "sections" : "settings");
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, section);
    if (!strcmp(section, "tools")) { /* [{name: calc, url: ..., retries: "two"}] */
        msgpack_pack_array(&pk, 1);
        msgpack_pack_map(&pk, 3);
        pack_str(&pk, "name"), pack_str(&pk, "calc");
        pack_str(&pk, "url"), pack_str(&pk, "http://127.0.0.1:1/mcp");
    } else {
        msgpack_pack_map(&pk, 1);
    }
    pack_str(&pk, k), pack_str(&pk, "two");
    char name[64];
    snprintf(name, sizeof name, "bad-%s", cls);
    manta_actor *a = NULL;
    int rc = manta_actor_create(
        ctx, &(manta_actor_options){.cls = cls, .name = name, .args = sb.data, .args_len = sb.size},
        &a);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(rc, MANTA_ESPAWN);
    char want[64];
    snprintf(want, sizeof want, "init of class %s failed (invalid argument)", cls);
    assert_non_null(strstr(manta_last_error(), want));
    /* the reason reaches the creator, not only the actor's log */
    snprintf(want, sizeof want, "%s", k);
    const char *reason = strstr(manta_last_error(), "): ");
    if (!reason || !strstr(reason, want))
        fail_msg("init failure of %s does not name '%s': %s", cls, k, manta_last_error());
}

static void test_bad_settings(void **st)
{
    expect_init_fails("learner", "model", "n_layer", 0);
    expect_init_fails("rollout", "rl", "slots", 1);
    expect_init_fails("env", "tools", "retries", 1);
    expect_init_fails("reward", "reward", "rule", 1); /* "two" is not a rule */
}

/* A reward service: POST {"response","reference"} -> {"reward": 0|1}. */
static const char *reward_server =
    "import json,sys\n"
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "class H(BaseHTTPRequestHandler):\n"
    "    def do_POST(self):\n"
    "        b=json.loads(self.rfile.read(int(self.headers['Content-Length'])))\n"
    "        out=json.dumps({'reward': 1.0 if b['response']==b['reference'] else 0.0}).encode()\n"
    "        self.send_response(200); self.send_header('Content-Type','application/json')\n"
    "        self.send_header('Content-Length',str(len(out))); self.end_headers(); "
    "self.wfile.write(out)\n"
    "    def log_message(self,*a): pass\n"
    "s=HTTPServer(('127.0.0.1',0),H); print('PORT',s.server_port,flush=True); "
    "s.serve_forever()\n";

int main(void)
{
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 30000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    int p1 = rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", "", &calc_port);
    int p2 =
        rl_start_calc_server(SOURCE_DIR "/examples/calc_server.py", "--fail-rate 1", &fail_port);
    char script[64];
    snprintf(script, sizeof script, "/tmp/manta-rl-reward-%d.py", (int)getpid());
    FILE *f = fopen(script, "w");
    if (f) fputs(reward_server, f), fclose(f);
    /* rl_start_calc_server runs "python3 SCRIPT --port 0": argv is ignored */
    reward_pid = rl_start_calc_server(script, "", &reward_port);
    int failed = 1;
    if (p1 > 0 && p2 > 0 && reward_pid > 0) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_env),
                                           cmocka_unit_test(test_reward),
                                           cmocka_unit_test(test_bad_settings)};
        failed = cmocka_run_group_tests(tests, NULL, NULL);
    } else {
        fprintf(stderr, "cannot start the test servers\n");
    }
    manta_shutdown(ctx);
    rl_stop_process(p1), rl_stop_process(p2), rl_stop_process(reward_pid);
    unlink(script);
    return failed;
}
