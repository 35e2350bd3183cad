/*
 * test_rl_signal_e2e.c - the second example task learns with the example's
 * own settings: examples/warehouse_agent.yaml (two chained MCP tools of
 * examples/warehouse_server.py, a shelf code as the answer), the whole
 * actor graph, the server on a free port.
 *
 * Only the paths, the tool URLs, the run folder and the time limit are set
 * here; every rl: setting is the example's (the calculator's), the run stops
 * when an evaluation reaches stop_at (0.95) as `manta run` does, and the
 * final evaluation covers the whole held-out set (200 items). It asserts the
 * issue's bar: held-out success >= 0.9 at the end, reached within
 * rl.max_time_s (360 s here, room for the sanitizer build on a loaded
 * machine; the example allows 600), RL doing the work (success after the
 * warm-up is about 0.2: it must rise by 0.3 or more), the warm-up stopped by
 * its own rule (until_success), two tool calls an episode on average
 * (multi-turn), and a balanced ledger. It takes 35-95 s in a Release build
 * on two loaded cores, 175 s under ASan+UBSan (actors/README.md "The
 * warehouse task"); ctest allows it 480 s.
 */
#include <manta_actors.h>
#include <manta_job.h>
#include <rl_util.h>

#include "calc_server.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static manta_ctx *ctx;
static int port;

static double num(const cJSON *j, const char *a, const char *b)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) o = cJSON_GetObjectItemCaseSensitive(o, b);
    if (!cJSON_IsNumber(o)) fail_msg("%s%s%s: not a number", a, b ? "." : "", b ? b : "");
    return o->valuedouble;
}

static void test_warehouse_learns(void **st)
{
    (void)st;
    char url0[128], url1[128], dir[300];
    snprintf(url0, sizeof url0, "tools.0.url=http://127.0.0.1:%d/mcp", port);
    snprintf(url1, sizeof url1, "tools.1.url=http://127.0.0.1:%d/mcp", port);
    snprintf(dir, sizeof dir, "rl.run_dir=/tmp/manta-rl-warehouse-%d", (int)getpid());
    const char *run_dir = dir + strlen("rl.run_dir=");
    const char *sets[] = {"task.train=" SOURCE_DIR "/examples/warehouse/train.jsonl",
                          "task.heldout=" SOURCE_DIR "/examples/warehouse/heldout.jsonl",
                          "task.demos=" SOURCE_DIR "/examples/warehouse/demos.jsonl",
                          url0,
                          url1,
                          dir,
                          "rl.max_time_s=360",
                          "rl.eval_problems=200"};
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = sizeof sets / sizeof *sets};
    manta_spec *spec =
        manta_spec_load_file(SOURCE_DIR "/examples/warehouse_agent.yaml", &so, &errs);
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    assert_non_null(spec);
    manta_job_t *job;
    if (manta_job_start(ctx, spec, &(manta_job_options){.no_services = 1}, &job) != 0)
        fail_msg("start: %s", manta_last_error());
    const void *reply;
    size_t len;
    if (manta_job_wait(job, -1, &reply, &len) != 0) fail_msg("run: %s", manta_last_error());
    char *txt = strndup(reply, len);
    manta_job_free(job);
    manta_spec_free(spec);
    printf("%s\n", txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "warmup");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(w, "stopped")->valuestring, "met");
    assert_true(num(w, "demo_reproduced", NULL) >= num(w, "until_success", NULL));
    double before = num(j, "heldout_success_initial", NULL);
    double after = num(j, "heldout_success_final", NULL);
    printf("held-out success %.3f -> %.3f in %.0f versions, %.0f s (warm-up %.0f s)\n", before,
           after, num(j, "versions", NULL), num(j, "wall_s", NULL), num(j, "warmup_s", NULL));
    assert_int_equal((int)num(j, "heldout_problems", NULL), 200);
    assert_true(after >= 0.9);          /* the bar */
    assert_true(after >= before + 0.3); /* learned by RL, not by the warm-up alone */
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "balanced")));
    double episodes = num(l, "admitted", NULL) - num(l, "in_flight", NULL);
    assert_true(num(j, "rates", "tool_calls") >= 1.5 * episodes); /* two calls an episode */
    assert_true(num(l, "trained", NULL) > 0);
    cJSON_Delete(j);
    rl_remove_tree(run_dir); /* passed: nothing to read there */
}

int main(void)
{
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    int pid = rl_start_calc_server(SOURCE_DIR "/examples/warehouse_server.py", NULL, &port);
    if (pid < 0) {
        fprintf(stderr, "cannot start examples/warehouse_server.py\n");
        manta_shutdown(ctx);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_warehouse_learns)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(ctx);
    rl_stop_process(pid);
    return failed;
}
