/*
 * test_rl_paths.c - the learner's methods that name a file (save,
 * checkpoint, restore) stay inside the run folder (rl.run_dir), whoever
 * calls them.
 *
 * One real learner shard (a tiny fresh GPT-2) whose run folder is RUN:
 * paths relative to RUN and absolute ones inside it work (a save, a
 * checkpoint, a restore of it); an absolute path outside, a ".." path, a
 * link in RUN pointing out (to a folder, or dangling), and a link planted
 * inside an existing model folder are each refused or defused, the
 * refusal naming the path and RUN, and nothing is ever written outside
 * (the outside folder is compared before and after). After the refusals
 * the shard still restores and saves: a refused restore changes nothing.
 */
#include <manta_actors.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <msgpack.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static manta_ctx *ctx;
static char run[PATH_MAX], out[PATH_MAX];

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_kv_int(msgpack_packer *pk, const char *k, int64_t v)
{
    pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

/* A learner shard 0 of 1: a tiny fresh GPT-2, rl.run_dir = RUN. */
static manta_actor *make_learner(void)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 6);
    pack_str(&pk, "job"), pack_str(&pk, "paths");
    pack_str(&pk, "group"), pack_str(&pk, "learner");
    pack_kv_int(&pk, "replica", 0);
    pack_kv_int(&pk, "replicas", 1);
    pack_str(&pk, "settings");
    msgpack_pack_map(&pk, 0);
    pack_str(&pk, "sections");
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "model");
    msgpack_pack_map(&pk, 4);
    pack_kv_int(&pk, "n_layer", 1);
    pack_kv_int(&pk, "n_head", 2);
    pack_kv_int(&pk, "n_embd", 16);
    pack_kv_int(&pk, "block_size", 16);
    pack_str(&pk, "rl");
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "run_dir"), pack_str(&pk, run);
    pack_kv_int(&pk, "batch_episodes", 8);
    manta_actor *a = NULL;
    int rc = manta_actor_create(
        ctx,
        &(manta_actor_options){
            .cls = "learner", .name = "learner-0", .args = sb.data, .args_len = sb.size},
        &a);
    msgpack_sbuffer_destroy(&sb);
    if (rc) fail_msg("learner: %s", manta_last_error());
    return a;
}

/* Call method with path; 0 or the code, *err the reply's error text. */
static int call(manta_actor *a, const char *method, const char *path, char *err, size_t cap)
{
    manta_future *f = manta_call_timeout(ctx, a, method, path, strlen(path), 60000);
    int rc = manta_get(f, -1, NULL, NULL);
    snprintf(err, cap, "%s", rc ? manta_future_error(f) : "");
    manta_future_free(f);
    return rc;
}

static void expect_ok(manta_actor *a, const char *method, const char *path)
{
    char err[1024];
    if (call(a, method, path, err, sizeof err)) fail_msg("%s %s: %s", method, path, err);
}

/* Refused, the reply naming the method, the path and the run folder, and
 * `why` when given. */
static void expect_refused(manta_actor *a, const char *method, const char *path, const char *why)
{
    char err[1024], want[PATH_MAX + 64];
    int rc = call(a, method, path, err, sizeof err);
    printf("%s %s -> %s\n", method, path, rc ? err : "ok");
    if (rc == 0) fail_msg("%s %s was accepted", method, path);
    snprintf(want, sizeof want, "%s: %s", method, path);
    if (!strstr(err, want)) fail_msg("the refusal does not name '%s': %s", want, err);
    snprintf(want, sizeof want, "run folder %s", run);
    if (!strstr(err, want)) fail_msg("the refusal does not name the %s: %s", want, err);
    if (why && !strstr(err, why)) fail_msg("the refusal does not say '%s': %s", why, err);
}

static int exists(const char *dir, const char *name)
{
    char p[PATH_MAX + 128];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &st) == 0;
}

/* The names in dir, sorted into one string. */
static void listing(const char *dir, char *buf, size_t cap)
{
    buf[0] = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            strncat(buf, e->d_name, cap - strlen(buf) - 2);
            strncat(buf, " ", cap - strlen(buf) - 1);
        }
    closedir(d);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

static void test_paths(void **st)
{
    (void)st;
    char p[PATH_MAX + 64], q[PATH_MAX + 64], before[4096], after[4096], text[64];
    manta_actor *a = make_learner();
    /* the outside folder holds one file a link will point at */
    snprintf(p, sizeof p, "%s/victim", out);
    write_file(p, "untouched");
    listing(out, before, sizeof before);

    /* in the folder: relative and absolute */
    expect_ok(a, "save", "model");
    assert_true(exists(run, "model/config.json") && exists(run, "model/model.safetensors"));
    snprintf(p, sizeof p, "%s/exports/final", run); /* a new folder and its parent */
    expect_ok(a, "save", p);
    assert_true(exists(run, "exports/final/model.safetensors"));
    expect_ok(a, "checkpoint", "ck");
    assert_true(exists(run, "ck/learner-0.state") && exists(run, "ck/model/config.json"));
    snprintf(p, sizeof p, "%s/ck", run);
    expect_ok(a, "restore", p);

    /* outside: absolute, "..", links out of the folder */
    snprintf(p, sizeof p, "%s/x", out);
    expect_refused(a, "save", p, "is outside the run folder");
    expect_refused(a, "checkpoint", p, "is outside the run folder");
    expect_refused(a, "save", "/etc/manta-should-not-exist", "is outside the run folder");
    expect_refused(a, "save", "../x", "\"..\" is not allowed");
    expect_refused(a, "save", "ck/../../x", "\"..\" is not allowed");
    expect_refused(a, "checkpoint", "../x", "\"..\" is not allowed");
    expect_refused(a, "restore", "../ck", "\"..\" is not allowed");
    snprintf(p, sizeof p, "%s/out", run); /* RUN/out -> OUT */
    assert_int_equal(symlink(out, p), 0);
    expect_refused(a, "save", "out", "is outside the run folder");
    expect_refused(a, "save", "out/m", "is outside the run folder");
    expect_refused(a, "checkpoint", "out", "is outside the run folder");
    expect_refused(a, "checkpoint", "out/ck", "is outside the run folder");
    snprintf(p, sizeof p, "%s/ck", out); /* a real checkpoint, copied outside */
    snprintf(q, sizeof q, "cp -r %s/ck %s/ck", run, out);
    assert_int_equal(system(q), 0);
    expect_refused(a, "restore", p, "is outside the run folder");
    expect_refused(a, "restore", "out/ck", "is outside the run folder");
    snprintf(q, sizeof q, "rm -rf %s/ck", out);
    assert_int_equal(system(q), 0);
    snprintf(p, sizeof p, "%s/dangling", run); /* RUN/dangling -> OUT/new (missing) */
    snprintf(q, sizeof q, "%s/new", out);
    assert_int_equal(symlink(q, p), 0);
    expect_refused(a, "save", "dangling", "is a link to nothing");
    expect_refused(a, "checkpoint", "dangling", "is a link to nothing");
    expect_refused(a, "save", run, "is not a path inside");

    /* a link planted in an existing model folder is not written through:
     * the save makes a new folder and puts it in place */
    snprintf(p, sizeof p, "%s/model/config.json", run);
    snprintf(q, sizeof q, "%s/victim", out);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(symlink(q, p), 0);
    expect_ok(a, "save", "model");
    struct stat sb;
    assert_int_equal(lstat(p, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    /* and a checkpoint's state file is never opened through one */
    snprintf(p, sizeof p, "%s/ck2", run);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/ck2/learner-0.state", run);
    snprintf(q, sizeof q, "%s/victim", out);
    assert_int_equal(symlink(q, p), 0);
    char err[1024];
    assert_int_not_equal(call(a, "checkpoint", "ck2", err, sizeof err), 0);
    printf("checkpoint ck2 (a planted link) -> %s\n", err);

    /* nothing was written outside */
    listing(out, after, sizeof after);
    assert_string_equal(before, after);
    snprintf(p, sizeof p, "%s/victim", out);
    read_file(p, text, sizeof text);
    assert_string_equal(text, "untouched");

    /* the refusals changed nothing: the shard restores and saves */
    expect_ok(a, "restore", "ck");
    expect_ok(a, "save", "model");
    assert_int_equal(manta_actor_stop(ctx, a, 30000), 0);
}

int main(void)
{
    /* This program is also its node agent and actors (started again with MANTA_ROLE set, where
     * manta_init never returns): only the test itself makes its folder, with a name of its own
     * (a pid-named folder left by an agent once collided with a later run's pid). */
    char top[PATH_MAX + 16] = "/tmp/manta-rl-paths-XXXXXX", cmd[PATH_MAX + 32];
    if (!getenv("MANTA_ROLE")) {
        if (!mkdtemp(top)) {
            fprintf(stderr, "cannot make %s: %s\n", top, strerror(errno));
            return 1;
        }
        snprintf(run, sizeof run, "%s/run", top);
        snprintf(out, sizeof out, "%s/outside", top);
        if (mkdir(run, 0755) || mkdir(out, 0755)) {
            fprintf(stderr, "cannot make %s: %s\n", run, strerror(errno));
            return 1;
        }
    }
    if (manta_init(&ctx, &(manta_options){.classes = manta_builtin_classes,
                                          .call_timeout_ms = 60000,
                                          .log_dir = getenv("RL_LOG_DIR")}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_paths)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    manta_shutdown(ctx);
    snprintf(cmd, sizeof cmd, "rm -rf %s", top);
    if (!failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", top);
    return failed;
}
