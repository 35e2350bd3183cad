/*
 * test_spec.c -- spec files: values, defaults, overrides, every error class
 * with its exact "file:line:col: path: message", placement, msgpack, and
 * robustness against truncated and mutated input.
 *
 * Runs in the fixture folder (SPEC_FIXTURE_DIR) so that file names in
 * error messages are short and exact. Uses only manta_spec.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include <cmocka.h>

#include "manta_spec.h"

#ifndef SPEC_FIXTURE_DIR
#error "SPEC_FIXTURE_DIR must name tests/spec/fixtures"
#endif

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ------------------------------------------------------------------- */

static manta_spec *load_file(const char *file, const char *const *sets, size_t n_sets,
                             manta_spec_errors *e)
{
    manta_spec_options o = {.sets = sets, .n_sets = n_sets};
    manta_spec_errors_init(e);
    return manta_spec_load_file(file, &o, e);
}

static manta_spec *load_text(const char *text, const char *const *sets, size_t n_sets,
                             manta_spec_errors *e)
{
    manta_spec_options o = {.sets = sets, .n_sets = n_sets};
    manta_spec_errors_init(e);
    return manta_spec_load_buffer(text, strlen(text), "inline.yaml", &o, e);
}

/* The errors must be exactly `want`, in order. */
static void expect_errors(manta_spec_errors *e, const char *const *want, size_t n)
{
    for (size_t i = 0; i < e->count; i++)
        if (i >= n || strcmp(e->items[i].text, want[i]) != 0)
            print_message("error %zu: %s\n", i, e->items[i].text);
    assert_int_equal(e->count, n);
    for (size_t i = 0; i < n; i++) assert_string_equal(e->items[i].text, want[i]);
    assert_int_equal(e->dropped, 0);
}

/* Loading `text` fails with exactly one error, `want`. */
static void expect_one(const char *text, const char *want)
{
    manta_spec_errors e;
    manta_spec *s = load_text(text, NULL, 0, &e);
    if (s || e.count != 1) print_message("spec: %s\n", text);
    assert_null(s);
    expect_errors(&e, &want, 1);
    manta_spec_errors_destroy(&e);
}

/* ---- valid specs ------------------------------------------------------------------ */

static void test_full_values(void **state)
{
    manta_spec_errors e;
    manta_spec *s = load_file("full.yaml", NULL, 0, &e);
    if (!s) manta_spec_errors_print(&e, stderr);
    assert_non_null(s);
    assert_int_equal(e.count, 0);
    assert_string_equal(s->file, "full.yaml");
    assert_string_equal(s->job, "calc-agent");
    assert_string_equal(s->redis_url, "redis://:s3cret@redis.local:6380");
    assert_false(s->redis.embedded);
    assert_string_equal(s->redis.host, "redis.local");
    assert_int_equal(s->redis.port, 6380);
    assert_string_equal(s->redis.password, "s3cret");
    assert_string_equal(s->redis.user, "");
    assert_string_equal(s->log_dir, "runs/");

    assert_int_equal(s->n_groups, 4);
    const char *order[] = {"controller", "rollout", "env", "learner"};
    for (size_t i = 0; i < N(order); i++) assert_string_equal(s->groups[i].name, order[i]);

    const manta_spec_group *c = manta_spec_group_find(s, "controller");
    assert_ptr_equal(c, &s->groups[0]);
    assert_string_equal(c->class_name, "controller");
    assert_int_equal(c->replicas, 1); /* defaults */
    assert_true(c->cpu == 1.0);
    assert_int_equal(c->gpu, 0);
    assert_int_equal(c->memory_bytes, 0);
    assert_int_equal(c->max_restarts, 0);
    assert_null(c->library);
    assert_null(c->library_path);
    assert_null(c->settings);
    assert_int_equal(c->node->line, 10);
    assert_int_equal(c->node->col, 5);

    const manta_spec_group *r = manta_spec_group_find(s, "rollout");
    assert_int_equal(r->replicas, 2);
    assert_true(r->cpu == 1.0);
    assert_int_equal(r->memory_bytes, 2ull << 30);
    assert_int_equal(r->max_restarts, 3);
    assert_non_null(r->settings);
    assert_int_equal(manta_spec_len(r->settings), 6);

    const manta_spec_group *env = manta_spec_group_find(s, "env");
    assert_string_equal(env->class_name, "calc_env");
    assert_string_equal(env->library, "./libmyactors.so");
    assert_string_equal(env->library_path, "./libmyactors.so"); /* spec in "." */
    assert_int_equal(env->replicas, 0);
    assert_int_equal(env->max_restarts, -1);
    assert_true(env->cpu == 0.5); /* from the &res alias */
    assert_int_equal(env->memory_bytes, 512ull << 20);

    const manta_spec_group *l = manta_spec_group_find(s, "learner");
    assert_true(l->cpu == 4.0);
    assert_int_equal(l->gpu, 1);
    assert_int_equal(l->memory_bytes, 17179869184ull); /* plain bytes */
    assert_null(manta_spec_group_find(s, "nope"));

    assert_int_equal(s->n_nodes, 2);
    assert_string_equal(s->nodes[0].name, "gpu-a");
    assert_true(s->nodes[0].cpu == 16);
    assert_int_equal(s->nodes[0].gpu, 2);
    assert_int_equal(s->nodes[0].memory_bytes, 64ull << 30);
    assert_string_equal(s->nodes[1].name, "cpu-b");
    assert_int_equal(s->nodes[1].gpu, 0);

    /* Free-form sections through the getters. */
    int64_t i64;
    double d;
    bool b;
    const char *str;
    uint64_t sz;
    const manta_spec_node *seq;
    assert_int_equal(manta_spec_get_int(s->root, "model.n_layer", 0, &i64, &e), 0);
    assert_int_equal(i64, 4);
    assert_int_equal(manta_spec_get_int(s->root, "model.vocab", 0, &i64, &e), 0);
    assert_int_equal(i64, 256);
    assert_int_equal(manta_spec_get_int(s->root, "model.mode", 0, &i64, &e), 0);
    assert_int_equal(i64, 15);
    assert_int_equal(manta_spec_get_int(s->root, "rl.eta", 0, &i64, &e), 0);
    assert_int_equal(i64, 2);
    assert_int_equal(manta_spec_get_bool(s->root, "rl.on_policy", false, &b, &e), 0);
    assert_true(b);
    assert_int_equal(manta_spec_get_int(s->root, "rl.nothing", 7, &i64, &e), 1);
    assert_int_equal(i64, 7);
    assert_int_equal(manta_spec_get_int(s->root, "rl.absent", 9, &i64, &e), 1);
    assert_int_equal(i64, 9);
    assert_int_equal(manta_spec_get_double(r->settings, "temperature", 0, &d, &e), 0);
    assert_true(d == 0.7);
    assert_int_equal(manta_spec_get_size(r->settings, "kv_cache", 0, &sz, &e), 0);
    assert_int_equal(sz, 1500000000ull);
    assert_int_equal(manta_spec_get_str(r->settings, "name", NULL, &str, &e), 0);
    assert_string_equal(str, "007");
    assert_int_equal(manta_spec_get_bool(r->settings, "greedy", true, &b, &e), 0);
    assert_false(b);
    assert_int_equal(manta_spec_get_seq(r->settings, "stop", &seq, &e), 0);
    assert_int_equal(manta_spec_len(seq), 2);
    assert_string_equal(manta_spec_at(seq, 0)->text, "</answer>");
    assert_string_equal(manta_spec_at(seq, 1)->text, "\n\n");
    assert_null(manta_spec_at(seq, 2));
    assert_int_equal(manta_spec_get_double(l->settings, "lr", 0, &d, &e), 0);
    assert_true(d == 3.0e-4);
    assert_int_equal(manta_spec_get_double(l->settings, "clip", 0, &d, &e), 0);
    assert_true(isinf(d) && d > 0);
    assert_int_equal(manta_spec_get_seq(s->root, "tools", &seq, &e), 0);
    assert_int_equal(manta_spec_len(seq), 2);
    assert_int_equal(manta_spec_get_str(s->root, "tools.1.name", NULL, &str, &e), 0);
    assert_string_equal(str, "search");
    assert_int_equal(manta_spec_get_str(s->root, "tools.0.timeout", NULL, &str, &e), 0);
    assert_string_equal(str, "5s");
    assert_int_equal(e.count, 0);

    /* Nodes carry positions and paths. */
    const manta_spec_node *url = manta_spec_find(s->root, "tools.0.url");
    assert_non_null(url);
    assert_string_equal(url->path, "tools.0.url");
    assert_string_equal(url->file, "full.yaml");
    assert_int_equal(url->line, 51);
    assert_int_equal(url->col, 23);
    assert_false(url->plain);
    assert_int_equal(manta_spec_scalar_type(url), MANTA_SPEC_T_STR);
    const manta_spec_node *res = manta_spec_find(s->root, "groups.env.resources");
    assert_string_equal(manta_spec_key_at(res, 0), "cpu");
    assert_string_equal(manta_spec_at(res, 1)->path, "groups.env.resources.memory");
    assert_null(manta_spec_key_at(res, 2));
    assert_null(manta_spec_key_at(seq, 0));
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_minimal_defaults(void **state)
{
    manta_spec_errors e;
    manta_spec *s = load_file("minimal.yaml", NULL, 0, &e);
    assert_non_null(s);
    assert_string_equal(s->job, "tiny");
    assert_string_equal(s->redis_url, "embedded");
    assert_true(s->redis.embedded);
    assert_null(s->log_dir);
    assert_int_equal(s->n_nodes, 0);
    assert_null(s->nodes);
    assert_int_equal(s->n_groups, 1);
    assert_string_equal(s->groups[0].class_name, "echo");
    assert_int_equal(s->groups[0].replicas, 1);
    assert_true(s->groups[0].cpu == 1.0);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
    manta_spec_free(NULL);
    manta_spec_errors_destroy(NULL);
}

static void test_library_path(void **state)
{
    static const char text[] = "job: j\ngroups:\n"
                               "  a: {class: x, library: ./lib/liba.so}\n"
                               "  b: {class: y, library: /opt/libb.so}\n"
                               "  c: {class: z, library: libc_actors.so}\n";
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec *s = manta_spec_load_buffer(text, strlen(text), "conf/specs/x.yaml", NULL, &e);
    assert_non_null(s);
    assert_string_equal(s->groups[0].library_path, "conf/specs/lib/liba.so");
    assert_string_equal(s->groups[1].library_path, "/opt/libb.so");
    assert_string_equal(s->groups[2].library_path, "libc_actors.so"); /* dlopen searches */
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_aliases(void **state)
{
    static const char text[] = "job: j\n"
                               "base: &b {cpu: 2, memory: 1GiB}\n"
                               "groups:\n"
                               "  a: {class: x, resources: *b}\n"
                               "  b: {class: x, resources: *b, replicas: 3}\n";
    manta_spec_errors e;
    manta_spec *s = load_text(text, NULL, 0, &e);
    assert_non_null(s);
    assert_true(s->groups[0].cpu == 2 && s->groups[1].cpu == 2);
    assert_int_equal(s->groups[1].memory_bytes, 1ull << 30);
    /* Copies, with the path of where they are used. */
    const manta_spec_node *m = manta_spec_find(s->root, "groups.b.resources.memory");
    assert_string_equal(m->path, "groups.b.resources.memory");
    assert_ptr_not_equal(m, manta_spec_find(s->root, "groups.a.resources.memory"));
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_merge_keys(void **state)
{
    static const char text[] = "job: j\n"
                               "base: &b {cpu: 2, memory: 1GiB}\n"
                               "more: &m {gpu: 1, cpu: 8}\n"
                               "groups:\n"
                               "  a: {class: x, resources: {<<: *b, cpu: 3}}\n"
                               "  b: {class: x, resources: {<<: [*b, *m]}}\n"
                               "  c:\n"
                               "    <<: &inline {class: y, replicas: 2}\n"
                               "    replicas: 5\n"
                               "again: *inline\n";
    manta_spec_errors e;
    manta_spec *s = load_text(text, NULL, 0, &e);
    if (!s) manta_spec_errors_print(&e, stderr);
    assert_non_null(s);
    /* Explicit keys win, wherever they stand. */
    assert_true(s->groups[0].cpu == 3);
    assert_int_equal(s->groups[0].memory_bytes, 1ull << 30);
    /* Among merged mappings the earlier wins. */
    assert_true(s->groups[1].cpu == 2);
    assert_int_equal(s->groups[1].gpu, 1);
    assert_string_equal(s->groups[2].class_name, "y");
    assert_int_equal(s->groups[2].replicas, 5);
    const manta_spec_node *res = manta_spec_find(s->root, "groups.b.resources");
    assert_int_equal(manta_spec_len(res), 3);
    assert_null(manta_spec_find(res, "<<"));
    assert_string_equal(manta_spec_find(res, "gpu")->path, "groups.b.resources.gpu");
    /* An anchor on a merged-away value still resolves. */
    int64_t i;
    assert_int_equal(manta_spec_get_int(s->root, "again.replicas", 0, &i, &e), 0);
    assert_int_equal(i, 2);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);

    expect_one("job: j\ngroups: {a: {class: x, <<: 3}}\n",
               "inline.yaml:2:28: groups.a.<<: expected a mapping or a sequence of mappings to "
               "merge, got \"3\"");
}

/* ---- overrides -------------------------------------------------------------------- */

static void test_overrides(void **state)
{
    const char *sets[] = {
        "rollout.replicas=4",                     /* group shorthand */
        "groups.env.resources.cpu=0.25",          /* full path */
        "rl.eta=0",                               /* free-form section */
        "rl.new_key=hello",                       /* new key */
        "learner.settings={shards: 4, lr: 1e-3}", /* a flow mapping */
        "tools.1.url=http://other:1/mcp",         /* sequence index */
        "job=renamed",                            /* top-level key */
        "controller.settings.deep.x=\"5\"",       /* mappings made on the way */
        "rl.nothing.inner=1",                     /* a null becomes a mapping */
        "rollout.resources.memory=3 GiB",
        "rl.eta=1", /* later wins */
        "log_dir=", /* empty is null */
    };
    manta_spec_errors e;
    manta_spec *s = load_file("full.yaml", sets, N(sets), &e);
    if (!s) manta_spec_errors_print(&e, stderr);
    assert_non_null(s);
    int64_t i64;
    const char *str;
    assert_string_equal(s->job, "renamed");
    assert_null(s->log_dir);
    assert_int_equal(manta_spec_group_find(s, "rollout")->replicas, 4);
    assert_int_equal(manta_spec_group_find(s, "rollout")->memory_bytes, 3ull << 30);
    assert_true(manta_spec_group_find(s, "env")->cpu == 0.25);
    assert_int_equal(manta_spec_get_int(s->root, "rl.eta", -1, &i64, &e), 0);
    assert_int_equal(i64, 1);
    assert_int_equal(manta_spec_get_str(s->root, "rl.new_key", NULL, &str, &e), 0);
    assert_string_equal(str, "hello");
    const manta_spec_group *l = manta_spec_group_find(s, "learner");
    assert_int_equal(manta_spec_len(l->settings), 2);
    assert_int_equal(manta_spec_get_int(l->settings, "shards", 0, &i64, &e), 0);
    assert_int_equal(i64, 4);
    assert_int_equal(manta_spec_get_str(s->root, "tools.1.url", NULL, &str, &e), 0);
    assert_string_equal(str, "http://other:1/mcp");
    const manta_spec_node *x = manta_spec_find(s->root, "groups.controller.settings.deep.x");
    assert_non_null(x);
    assert_int_equal(manta_spec_scalar_type(x), MANTA_SPEC_T_STR); /* quoted stays a string */
    assert_string_equal(x->text, "5");
    assert_string_equal(x->file, "--set");
    assert_int_equal(x->line, 8);
    assert_int_equal(x->col, 28);
    assert_int_equal(manta_spec_get_int(s->root, "rl.nothing.inner", 0, &i64, &e), 0);
    assert_int_equal(i64, 1);
    /* Overridden value nodes carry the override's position and the path. */
    const manta_spec_node *rep = manta_spec_find(s->root, "groups.rollout.replicas");
    assert_string_equal(rep->file, "--set");
    assert_int_equal(rep->line, 1);
    assert_int_equal(rep->col, 18);
    assert_string_equal(rep->path, "groups.rollout.replicas");
    assert_int_equal(e.count, 0);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_override_errors(void **state)
{
    const char *sets[] = {
        "rollout.replicas=two",
        "rolout.replicas=1",
        "noequals",
        "rl.eta.x=3",
        "tools.5.url=x",
        "groups.env.resources.cpu=-0.5",
        "rl..eta=1",
        "rl.eta=[1, 2",
        "rollout.resources.disk=1",
    };
    static const char *const want[] = {
        "--set:2:1: rolout.replicas: no top-level key or group named \"rolout\"",
        "--set:3:1: expected path=value, got \"noequals\"",
        "--set:4:1: rl.eta.x: cannot set a key inside rl.eta: it is \"2\" (at full.yaml:46:8), "
        "not a mapping",
        "--set:5:1: tools.5: tools is a sequence of 2 items; expected an index from 0 to 1, got "
        "\"5\"",
        "--set:7:1: empty component in the path \"rl..eta\"",
        "--set:8:13: YAML syntax error: did not find expected ',' or ']'",
        "--set:1:18: groups.rollout.replicas: expected a non-negative integer, got \"two\"",
        "--set:9:1: groups.rollout.resources.disk: unknown key; expected one of cpu, gpu, memory",
        "--set:6:26: groups.env.resources.cpu: expected a non-negative number, got \"-0.5\"",
    };
    manta_spec_errors e;
    manta_spec *s = load_file("full.yaml", sets, N(sets), &e);
    assert_null(s);
    expect_errors(&e, want, N(want));
    manta_spec_errors_destroy(&e);
}

/* ---- getters ---------------------------------------------------------------------- */

static void test_getters(void **state)
{
    static const char text[] = "job: j\n"
                               "groups: {a: {class: x}}\n"
                               "t:\n"
                               "  i: 42\n"
                               "  neg: -7\n"
                               "  hex: 0xff\n"
                               "  big: 99999999999999999999\n"
                               "  f: 2.5e3\n"
                               "  word: two\n"
                               "  quoted: \"12\"\n"
                               "  yes: yes\n"
                               "  t: True\n"
                               "  nan: .nan\n"
                               "  m: {a: 1}\n"
                               "  s: [1, 2]\n"
                               "  mem: 1.5 KiB\n"
                               "  badmem: 1.3B\n"
                               "  tagged: !!str 12\n";
    manta_spec_errors e;
    manta_spec *s = load_text(text, NULL, 0, &e);
    assert_non_null(s);
    const manta_spec_node *t = manta_spec_find(s->root, "t");
    int64_t i;
    double d;
    bool b;
    const char *str;
    uint64_t sz;
    const manta_spec_node *n;

    assert_int_equal(manta_spec_get_int(t, "i", 0, &i, &e), 0);
    assert_int_equal(i, 42);
    assert_int_equal(manta_spec_get_int(t, "neg", 0, &i, &e), 0);
    assert_int_equal(i, -7);
    assert_int_equal(manta_spec_get_int(t, "hex", 0, &i, &e), 0);
    assert_int_equal(i, 255);
    assert_int_equal(manta_spec_get_double(t, "f", 0, &d, &e), 0);
    assert_true(d == 2500.0);
    assert_int_equal(manta_spec_get_double(t, "i", 0, &d, &e), 0); /* ints are numbers */
    assert_true(d == 42.0);
    assert_int_equal(manta_spec_get_double(t, "nan", 0, &d, &e), 0);
    assert_true(isnan(d));
    assert_int_equal(manta_spec_get_str(t, "i", NULL, &str, &e), 0); /* scalars are strings */
    assert_string_equal(str, "42");
    assert_int_equal(manta_spec_get_bool(t, "t", false, &b, &e), 0);
    assert_true(b);
    assert_int_equal(manta_spec_get_size(t, "mem", 0, &sz, &e), 0);
    assert_int_equal(sz, 1536);
    assert_int_equal(manta_spec_get_size(t, "i", 0, &sz, &e), 0);
    assert_int_equal(sz, 42);
    assert_int_equal(manta_spec_get_map(t, "m", &n, &e), 0);
    assert_int_equal(manta_spec_len(n), 1);
    assert_int_equal(manta_spec_get_seq(t, "s", &n, &e), 0);
    assert_int_equal(manta_spec_get_int(n, "1", 0, &i, &e), 0); /* index path */
    assert_int_equal(i, 2);
    assert_int_equal(manta_spec_get_seq(t, "absent", &n, &e), 1);
    assert_null(n);
    assert_int_equal(manta_spec_get_int(NULL, "x", 5, &i, &e), 1);
    assert_int_equal(i, 5);
    assert_int_equal(e.count, 0);

    /* Wrong types: -1, the default, and one located error each. */
    assert_int_equal(manta_spec_get_int(t, "word", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(i, 3);
    assert_int_equal(manta_spec_get_int(t, "quoted", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_int(t, "f", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_int(t, "big", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_int(t, "tagged", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_double(t, "m", 1, &d, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_bool(t, "yes", false, &b, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_str(t, "s", "d", &str, &e), MANTA_ESPEC);
    assert_string_equal(str, "d");
    assert_int_equal(manta_spec_get_size(t, "badmem", 7, &sz, &e), MANTA_ESPEC);
    assert_int_equal(sz, 7);
    assert_int_equal(manta_spec_get_seq(t, "m", &n, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_map(t, "s", &n, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_int(t, "word.x", 3, &i, &e), MANTA_ESPEC);
    assert_int_equal(manta_spec_get_int(NULL, "x", 5, &i, NULL), 1);
    assert_int_equal(manta_spec_get_int(t, "word", 3, &i, NULL), MANTA_ESPEC); /* err may be NULL */
    static const char *const want[] = {
        "inline.yaml:9:9: t.word: expected an integer, got \"two\"",
        "inline.yaml:10:11: t.quoted: expected an integer, got \"12\"",
        "inline.yaml:8:6: t.f: expected an integer, got \"2.5e3\"",
        "inline.yaml:7:8: t.big: expected an integer that fits 64 bits, got "
        "\"99999999999999999999\"",
        "inline.yaml:18:11: t.tagged: expected an integer, got \"12\"",
        "inline.yaml:14:6: t.m: expected a number, got a mapping",
        "inline.yaml:11:8: t.yes: expected true or false, got \"yes\"",
        "inline.yaml:15:6: t.s: expected a string, got a sequence",
        "inline.yaml:17:11: t.badmem: expected a size such as 512MiB or 2GiB (units B, KB, MB, "
        "GB, TB, KiB, MiB, GiB, TiB), got \"1.3B\"",
        "inline.yaml:14:6: t.m: expected a sequence, got a mapping",
        "inline.yaml:15:6: t.s: expected a mapping, got a sequence",
        "inline.yaml:9:9: t.word: expected a mapping or a sequence, got \"two\"",
    };
    expect_errors(&e, want, N(want));
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_scalar_types(void **state)
{
    static const struct {
        const char *yaml;
        int type;
    } cases[] = {
        {"~", MANTA_SPEC_T_NULL},         {"null", MANTA_SPEC_T_NULL},
        {"''", MANTA_SPEC_T_STR},         {"true", MANTA_SPEC_T_BOOL},
        {"FALSE", MANTA_SPEC_T_BOOL},     {"yes", MANTA_SPEC_T_STR},
        {"0o17", MANTA_SPEC_T_INT},       {"+12", MANTA_SPEC_T_INT},
        {"0x1G", MANTA_SPEC_T_STR},       {"1.", MANTA_SPEC_T_FLOAT},
        {".5", MANTA_SPEC_T_FLOAT},       {"-.inf", MANTA_SPEC_T_FLOAT},
        {"1e", MANTA_SPEC_T_STR},         {"'1'", MANTA_SPEC_T_STR},
        {"!!str true", MANTA_SPEC_T_STR}, {"!!int 3", MANTA_SPEC_T_INT},
        {"2GiB", MANTA_SPEC_T_STR},
    };
    for (size_t i = 0; i < N(cases); i++) {
        char text[128];
        snprintf(text, sizeof text, "job: j\ngroups: {a: {class: x}}\nv: [%s]\n", cases[i].yaml);
        manta_spec_errors e;
        manta_spec *s = load_text(text, NULL, 0, &e);
        assert_non_null(s);
        const manta_spec_node *v = manta_spec_find(s->root, "v.0");
        if (manta_spec_scalar_type(v) != cases[i].type) print_message("case %s\n", cases[i].yaml);
        assert_int_equal(manta_spec_scalar_type(v), cases[i].type);
        assert_int_equal(manta_spec_scalar_type(manta_spec_find(s->root, "v")), -1);
        manta_spec_free(s);
        manta_spec_errors_destroy(&e);
    }
}

static void test_sizes(void **state)
{
    static const struct {
        const char *text;
        int rc;
        uint64_t bytes;
    } cases[] = {
        {"0", 0, 0},
        {"512", 0, 512},
        {"512B", 0, 512},
        {"1KB", 0, 1000},
        {"1KiB", 0, 1024},
        {"2MB", 0, 2000000},
        {"2MiB", 0, 2u << 20},
        {"2GiB", 0, 2ull << 30},
        {"2 GiB", 0, 2ull << 30},
        {"1.5GB", 0, 1500000000ull},
        {"0.5KiB", 0, 512},
        {"0.001KB", 0, 1},
        {"1TiB", 0, 1ull << 40},
        {"16777215TiB", 0, 16777215ull << 40},
        {"16777216TiB", MANTA_EINVAL, 0}, /* 2^64: overflows */
        {"18446744073709551615", 0, UINT64_MAX},
        {"18446744073709551616", MANTA_EINVAL, 0},
        {"1.5", MANTA_EINVAL, 0},    /* fractional bytes */
        {"0.3KiB", MANTA_EINVAL, 0}, /* 307.2 bytes */
        {"2Gb", MANTA_EINVAL, 0},
        {"2gib", MANTA_EINVAL, 0},
        {"GiB", MANTA_EINVAL, 0},
        {"-1KiB", MANTA_EINVAL, 0},
        {"1.KiB", MANTA_EINVAL, 0},
        {"", MANTA_EINVAL, 0},
        {"2GiBs", MANTA_EINVAL, 0},
    };
    for (size_t i = 0; i < N(cases); i++) {
        uint64_t v = 12345;
        int rc = manta_spec_parse_size(cases[i].text, &v);
        if (rc != cases[i].rc) print_message("size case \"%s\"\n", cases[i].text);
        assert_int_equal(rc, cases[i].rc);
        if (rc == 0) assert_int_equal(v, cases[i].bytes);
    }
    char buf[32];
    assert_string_equal(manta_spec_format_size(2ull << 30, buf, sizeof buf), "2GiB");
    assert_string_equal(manta_spec_format_size(1536ull << 20, buf, sizeof buf), "1536MiB");
    assert_string_equal(manta_spec_format_size(1000, buf, sizeof buf), "1000B");
    assert_string_equal(manta_spec_format_size(0, buf, sizeof buf), "0B");
    assert_string_equal(manta_spec_format_size(3ull << 40, buf, sizeof buf), "3TiB");
}

static void test_redis_urls(void **state)
{
    manta_redis_addr r;
    char why[128];
    assert_int_equal(manta_redis_url_parse("embedded", &r, why, sizeof why), 0);
    assert_true(r.embedded);
    assert_int_equal(manta_redis_url_parse("redis://h", &r, why, sizeof why), 0);
    assert_false(r.embedded);
    assert_string_equal(r.host, "h");
    assert_int_equal(r.port, 6379);
    assert_string_equal(r.password, "");
    assert_int_equal(manta_redis_url_parse("redis://:p%40ss@10.0.0.1:7000/3", &r, why, sizeof why),
                     0);
    assert_string_equal(r.password, "p@ss");
    assert_string_equal(r.host, "10.0.0.1");
    assert_int_equal(r.port, 7000);
    assert_int_equal(r.db, 3);
    assert_int_equal(manta_redis_url_parse("redis://bob:pw@[::1]:6390", &r, why, sizeof why), 0);
    assert_string_equal(r.user, "bob");
    assert_string_equal(r.password, "pw");
    assert_string_equal(r.host, "::1");
    assert_int_equal(r.port, 6390);
    static const struct {
        const char *url, *why;
    } bad[] = {
        {"http://h:1", "not \"embedded\" and not a redis:// URL"},
        {"redis://", "no host"},
        {"redis://h:0", "port out of range"},
        {"redis://h:65536", "port out of range"},
        {"redis://h:", "no port after ':'"},
        {"redis://h:12x", "unexpected characters after host:port"},
        {"redis://[::1", "unclosed [ in the IPv6 address"},
        {"redis://:%zz@h", "bad user or password (too long, or a bad %XX escape)"},
        {"redis://h o:1", "bad host name"},
    };
    for (size_t i = 0; i < N(bad); i++) {
        assert_int_equal(manta_redis_url_parse(bad[i].url, &r, why, sizeof why), MANTA_EINVAL);
        assert_string_equal(why, bad[i].why);
    }
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_error_schema_file(void **state)
{
    static const char *const want[] = {
        "schema_errors.yaml:1:6: job: expected a name of 1 to 40 characters from a-z, 0-9, - and "
        "_, got \"Calc Agent\"",
        "schema_errors.yaml:2:8: redis: expected \"embedded\" or "
        "redis://[[user]:password@]host[:port][/db], "
        "got \"redis://:pw@host:99999\" (port out of range)",
        "schema_errors.yaml:6:15: groups.rollout.replicas: expected a non-negative integer, got "
        "\"two\"",
        "schema_errors.yaml:7:5: groups.rollout.replica: unknown key (did you mean "
        "\"replicas\"?)",
        "schema_errors.yaml:8:22: groups.rollout.resources.cpu: expected a non-negative number, "
        "got \"-1\"",
        "schema_errors.yaml:8:31: groups.rollout.resources.gpu: expected a fraction below 1 or a "
        "whole number of GPUs (0..1024), got \"1.5\"",
        "schema_errors.yaml:8:44: groups.rollout.resources.memory: expected a size such as "
        "512MiB or 2GiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got \"2Gb\"",
        "schema_errors.yaml:8:49: groups.rollout.resources.disk: unknown key; expected one of "
        "cpu, gpu, memory",
        "schema_errors.yaml:9:19: groups.rollout.max_restarts: expected an integer >= -1 (-1: "
        "unlimited), got \"-2\"",
        "schema_errors.yaml:10:15: groups.rollout.settings: expected a mapping, got \"fast\"",
        "schema_errors.yaml:11:3: groups.Bad.Name: bad group name; expected 1 to 40 characters "
        "from a-z, 0-9, - and _, got \"Bad.Name\"",
        "schema_errors.yaml:11:3: groups.Bad.Name: missing required key \"class\" (the actor "
        "class to run)",
        "schema_errors.yaml:13:8: groups.env: expected a mapping with class, replicas, resources "
        "and settings, got a sequence",
        "schema_errors.yaml:14:1: logdir: unknown top-level key (did you mean \"log_dir\"?)",
        "schema_errors.yaml:16:15: nodes.a.gpus: unknown key (did you mean \"gpu\"?)",
    };
    manta_spec_errors e;
    assert_null(load_file("schema_errors.yaml", NULL, 0, &e));
    expect_errors(&e, want, N(want));
    /* The parts of an entry agree with its text. */
    assert_string_equal(e.items[2].file, "schema_errors.yaml");
    assert_int_equal(e.items[2].line, 6);
    assert_int_equal(e.items[2].col, 15);
    assert_string_equal(e.items[2].path, "groups.rollout.replicas");
    assert_string_equal(e.items[2].message, "expected a non-negative integer, got \"two\"");
    manta_spec_errors_destroy(&e);
}

static void test_error_syntax_and_duplicates(void **state)
{
    manta_spec_errors e;
    static const char *const syn[] = {
        "syntax.yaml:6:4: YAML syntax error: did not find expected key (while parsing a block "
        "mapping at line 3, column 3)",
    };
    assert_null(load_file("syntax.yaml", NULL, 0, &e));
    expect_errors(&e, syn, N(syn));
    manta_spec_errors_destroy(&e);

    static const char *const dup[] = {
        "duplicate.yaml:6:5: groups.rollout.replicas: duplicate key (first at line 5, column 5)",
        "duplicate.yaml:7:3: groups.rollout: duplicate key (first at line 3, column 3)",
    };
    assert_null(load_file("duplicate.yaml", NULL, 0, &e));
    expect_errors(&e, dup, N(dup));
    manta_spec_errors_destroy(&e);

    assert_null(load_file("no-such-spec.yaml", NULL, 0, &e));
    static const char *const missing[] = {
        "no-such-spec.yaml: cannot open: No such file or directory",
    };
    expect_errors(&e, missing, N(missing));
    assert_int_equal(e.items[0].line, 0);
    manta_spec_errors_destroy(&e);
}

static void test_error_cases(void **state)
{
#define G "job: j\ngroups:\n"
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {"", "inline.yaml:1:1: the spec is empty; expected a mapping with job and groups"},
        {"# only a comment\n",
         "inline.yaml:1:1: the spec is empty; expected a mapping with job and groups"},
        {"- a\n- b\n",
         "inline.yaml:1:1: expected a mapping with job and groups at the top level, got a "
         "sequence"},
        {"job: j\n", "inline.yaml:1:1: groups: missing required key; expected a mapping of group "
                     "names to groups"},
        {"job: j\ngroups: [a]\n",
         "inline.yaml:2:9: groups: expected a mapping of group names to groups, got a sequence"},
        {"job: j\ngroups: {}\n",
         "inline.yaml:2:9: groups: expected at least one group, got an empty mapping"},
        {"job: [x]\ngroups: {a: {class: x}}\n",
         "inline.yaml:1:6: job: expected the job's name, got a sequence"},
        {"job:\ngroups: {a: {class: x}}\n", "inline.yaml:1:5: job: expected the job's name, got "
                                            "null"},
        {"job: abcdefghij-abcdefghij-abcdefghij-abcdefgh\ngroups: {a: {class: x}}\n",
         "inline.yaml:1:6: job: expected a name of 1 to 40 characters from a-z, 0-9, - and _, "
         "got \"abcdefghij-abcdefghij-abcdefghij-abcdefg...\""},
        {G "  a: {class: x, replicas: -1}\n",
         "inline.yaml:3:27: groups.a.replicas: expected a non-negative integer, got \"-1\""},
        {G "  a: {class: x, replicas: 3000000000}\n",
         "inline.yaml:3:27: groups.a.replicas: expected a non-negative integer, got "
         "\"3000000000\""},
        {G "  a: {class: x, replicas: \"2\"}\n",
         "inline.yaml:3:27: groups.a.replicas: expected a non-negative integer, got \"2\""},
        {G "  a: {replicas: 2}\n",
         "inline.yaml:3:3: groups.a: missing required key \"class\" (the actor class to run)"},
        {G "  a: {class: \"my class\"}\n",
         "inline.yaml:3:14: groups.a.class: expected a class name of 1 to 64 characters from "
         "A-Z, a-z, 0-9, ., - and _, got \"my class\""},
        {G "  a: {class: x, library: \"\"}\n",
         "inline.yaml:3:26: groups.a.library: expected a path to a shared library, got \"\""},
        {G "  a: {class: x, resources: 4}\n",
         "inline.yaml:3:28: groups.a.resources: expected a mapping of cpu, gpu and memory, got "
         "\"4\""},
        {G "  a: {class: x, resources: {cpu: .nan}}\n",
         "inline.yaml:3:34: groups.a.resources.cpu: expected a non-negative number, got \".nan\""},
        {G "  a: {class: x, resources: {memory: -2GiB}}\n",
         "inline.yaml:3:37: groups.a.resources.memory: expected a size such as 512MiB or 2GiB "
         "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got \"-2GiB\""},
        {G "  a: {class: x, settings: [1]}\n",
         "inline.yaml:3:27: groups.a.settings: expected a mapping, got a sequence"},
        {G "  a: {class: x, setings: {}}\n",
         "inline.yaml:3:17: groups.a.setings: unknown key (did you mean \"settings\"?)"},
        {G "  a: {class: x, zzz: 1}\n",
         "inline.yaml:3:17: groups.a.zzz: unknown key; expected one of class, library, replicas, "
         "resources, max_restarts, settings"},
        {G "  a: 3\n", "inline.yaml:3:6: groups.a: expected a mapping with class, replicas, "
                       "resources and settings, got \"3\""},
        {G "  a-very-long-group-name-that-is-too-long-x: {class: x}\n",
         "inline.yaml:3:3: groups.a-very-long-group-name-that-is-too-long-x: bad group name; "
         "expected 1 to 40 characters from a-z, 0-9, - and _, got "
         "\"a-very-long-group-name-that-is-too-long-...\""},
        {G "  a: {class: x}\nfoo: bar\n",
         "inline.yaml:4:1: foo: unknown top-level key; a free-form section must be a mapping or a "
         "sequence, got \"bar\""},
        {G "  a: {class: x}\nnode: {a: {cpu: 1}}\n",
         "inline.yaml:4:1: node: unknown top-level key (did you mean \"nodes\"?)"},
        {G "  a: {class: x}\nredis: [1]\n", "inline.yaml:4:8: redis: expected \"embedded\" or "
                                            "redis://[[user]:password@]host[:port][/db], got a "
                                            "sequence"},
        {G "  a: {class: x}\nlog_dir: {a: 1}\n",
         "inline.yaml:4:10: log_dir: expected a folder path, got a mapping"},
        {G "  a: {class: x}\nnodes: {}\n",
         "inline.yaml:4:8: nodes: expected at least one node, got an empty mapping"},
        {G "  a: {class: x}\nnodes: [a]\n",
         "inline.yaml:4:8: nodes: expected a mapping of node names to {cpu, gpu, memory}, got a "
         "sequence"},
        {G "  a: {class: x}\nnodes: {\"bad name\": {cpu: 1}}\n",
         "inline.yaml:4:9: nodes.bad name: bad node name; expected 1 to 64 characters from A-Z, "
         "a-z, 0-9, ., - and _, got \"bad name\""},
        {G "  a: {class: x}\nnodes: {n: 4}\n",
         "inline.yaml:4:12: nodes.n: expected a mapping of cpu, gpu and memory, got \"4\""},
        {G "  a: {class: x}\n---\njob: k\n",
         "inline.yaml:4:1: expected one YAML document, but a second one starts here"},
        {G "  a: {class: !custom x}\n",
         "inline.yaml:3:14: unsupported tag !custom; only the YAML core tags (!!str, !!int, "
         "!!float, !!bool, !!null, !!map, !!seq) are allowed"},
        {G "  a: {class: *nope}\n", "inline.yaml:3:14: unknown alias *nope"},
        {G "  a: &x {class: y, settings: {self: *x}}\n",
         "inline.yaml:3:37: alias *x refers to a node that contains it"},
        {G "  ? [a, b]\n  : {class: x}\n",
         "inline.yaml:3:5: groups: mapping keys must be scalars, got a sequence"},
        {"job: \"a\tb\xff\"\n", "inline.yaml:1:10: invalid input: invalid leading UTF-8 octet"},
        {"job: x\ngroups:\n\ta: {class: b}\n",
         "inline.yaml:3:1: YAML syntax error: found character that cannot start any token (while "
         "scanning for the next token at line 3, column 1); YAML does not allow tabs for "
         "indentation"},
        {"job: j\ngroups:\n  a: {class: x\n", "inline.yaml:4:1: YAML syntax error: did not find "
                                              "expected ',' or '}' (while parsing a flow mapping "
                                              "at line 3, column 6)"},
    };
#undef G
    /* Report every mismatch before failing, so one run shows them all. */
    int bad = 0;
    for (size_t i = 0; i < N(cases); i++) {
        manta_spec_errors e;
        manta_spec *s = load_text(cases[i].yaml, NULL, 0, &e);
        if (s || e.count != 1 || strcmp(e.items[0].text, cases[i].want) != 0) {
            print_message("case %zu: got %s\n", i, e.count ? e.items[0].text : "(no error)");
            bad++;
        }
        manta_spec_free(s);
        manta_spec_errors_destroy(&e);
    }
    assert_int_equal(bad, 0);
    for (size_t i = 0; i < N(cases); i++) expect_one(cases[i].yaml, cases[i].want);
}

static void test_error_deep_nesting(void **state)
{
    char text[512] = "job: j\ngroups: {a: {class: x}}\nx: ";
    for (int i = 0; i < MANTA_SPEC_MAX_DEPTH + 2; i++) strcat(text, "[");
    expect_one(text, "inline.yaml:3:67: nesting deeper than 64 levels");
}

static void test_error_alias_bomb(void **state)
{
    /* "Billion laughs": 10 levels of 10 aliases each would be 10^10 nodes. */
    char text[4096];
    int o = snprintf(text, sizeof text, "job: j\ngroups: {a: {class: x}}\nl0: &l0 [lol]\n");
    for (int i = 1; i < 10; i++) {
        o += snprintf(text + o, sizeof text - (size_t)o, "l%d: &l%d [", i, i);
        for (int j = 0; j < 10; j++)
            o += snprintf(text + o, sizeof text - (size_t)o, "%s*l%d", j ? ", " : "", i - 1);
        o += snprintf(text + o, sizeof text - (size_t)o, "]\n");
    }
    manta_spec_errors e;
    assert_null(load_text(text, NULL, 0, &e));
    assert_int_equal(e.count, 1);
    assert_non_null(strstr(e.items[0].text, "the document has more than 200000 nodes"));
    manta_spec_errors_destroy(&e);
}

static bool known_class(const char *name, void *user)
{
    (*(int *)user)++;
    return !strcmp(name, "rollout") || !strcmp(name, "learner");
}

static void test_error_unknown_class(void **state)
{
    static const char text[] = "job: j\ngroups:\n"
                               "  a: {class: rollout}\n"
                               "  b: {class: rolout}\n"
                               "  c: {class: mine, library: ./libmine.so}\n";
    int calls = 0;
    manta_spec_options o = {.class_exists = known_class, .user = &calls};
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    assert_null(manta_spec_load_buffer(text, strlen(text), "inline.yaml", &o, &e));
    static const char *const want[] = {
        "inline.yaml:4:14: groups.b.class: unknown class \"rolout\": not a built-in class, and "
        "the group has no library",
    };
    expect_errors(&e, want, N(want));
    assert_int_equal(calls, 2); /* not asked about the library's class */
    manta_spec_errors_destroy(&e);
}

static void test_error_limit(void **state)
{
    /* 40 bad groups: the first MANTA_SPEC_MAX_ERRORS are kept, the rest counted. */
    char text[8192];
    int o = snprintf(text, sizeof text, "job: j\ngroups:\n");
    for (int i = 0; i < 40; i++)
        o += snprintf(text + o, sizeof text - (size_t)o, "  g%d: {class: x, replicas: -%d}\n", i,
                      i + 1);
    manta_spec_errors e;
    assert_null(load_text(text, NULL, 0, &e));
    assert_int_equal(e.count, MANTA_SPEC_MAX_ERRORS);
    assert_int_equal(e.dropped, 40 - MANTA_SPEC_MAX_ERRORS);
    assert_string_equal(e.items[31].text, "inline.yaml:34:29: groups.g31.replicas: expected a "
                                          "non-negative integer, got \"-32\"");
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(manta_spec_errors_print(&e, f), MANTA_SPEC_MAX_ERRORS + 1);
    char line[256], last[256] = "";
    rewind(f);
    while (fgets(line, sizeof line, f)) strcpy(last, line);
    fclose(f);
    assert_string_equal(last, "... and 8 more errors\n");
    manta_spec_errors_destroy(&e);
    assert_int_equal(e.count, 0);

    manta_spec_errors_add(&e, "x.yaml", 3, 4, "a.b", "bad %s", "thing");
    manta_spec_errors_add(&e, "x.yaml", 0, 0, "", "whole file");
    manta_spec_errors_add(&e, "x.yaml", 0, 0, "p", "no position");
    assert_string_equal(e.items[0].text, "x.yaml:3:4: a.b: bad thing");
    assert_string_equal(e.items[1].text, "x.yaml: whole file");
    assert_string_equal(e.items[2].text, "x.yaml: p: no position");
    manta_spec_errors_destroy(&e);
}

/* ---- placement -------------------------------------------------------------------- */

static void test_placement_spec_errors(void **state)
{
    manta_spec_errors e;
    static const char *const want[] = {
        "placement.yaml:6:16: groups.learner.resources: one replica needs cpu 4, gpu 4, memory "
        "16GiB, more than any node in \"nodes\" has",
        "placement.yaml:11:1: nodes: the groups need cpu 24 in total, more than the 16 the nodes "
        "have",
        "placement.yaml:11:1: nodes: the groups need gpu 8 in total, more than the 4 the nodes "
        "have",
    };
    assert_null(load_file("placement.yaml", NULL, 0, &e));
    expect_errors(&e, want, N(want));
    manta_spec_errors_destroy(&e);

    /* Shrinking by override makes it fit: overrides are placed too. */
    const char *fix[] = {"learner.resources.gpu=2", "rollout.replicas=2", "learner.replicas=1"};
    manta_spec *s = load_file("placement.yaml", fix, N(fix), &e);
    assert_non_null(s);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
    /* ... and an override can break it, located at the --set. */
    const char *brk[] = {"rollout.resources={cpu: 9}"};
    static const char *const want_brk[] = {
        "--set:1:19: groups.rollout.resources: one replica needs cpu 9, gpu 0, memory 0B, more "
        "than any node in \"nodes\" has",
        "placement.yaml:11:1: nodes: the groups need cpu 80 in total, more than the 16 the nodes "
        "have",
        "placement.yaml:11:1: nodes: the groups need gpu 8 in total, more than the 4 the nodes "
        "have",
    };
    const char *brk2[] = {"rollout.resources={cpu: 9}", "learner.replicas=0", "rollout.replicas=1"};
    assert_null(load_file("placement.yaml", brk2, N(brk2), &e));
    expect_errors(&e, want_brk, 1);
    manta_spec_errors_destroy(&e);
    assert_null(load_file("placement.yaml", brk, N(brk), &e));
    assert_int_equal(e.count, 4);
    assert_string_equal(e.items[0].text,
                        "placement.yaml:6:16: groups.learner.resources: one replica needs cpu 4, "
                        "gpu 4, memory 16GiB, more than any node in \"nodes\" has");
    assert_string_equal(e.items[1].text, want_brk[0]);
    assert_string_equal(e.items[2].text, want_brk[1]);
    manta_spec_errors_destroy(&e);

    static const char *const pack[] = {
        "packing.yaml:12:1: nodes: cannot place every replica (first-fit, largest first): group "
        "\"small\" replica 1 of 1 (cpu 2, gpu 0, memory 0B) does not fit: free: a cpu 1 gpu 0 "
        "memory 0B; b cpu 1 gpu 0 memory 0B",
    };
    assert_null(load_file("packing.yaml", NULL, 0, &e));
    expect_errors(&e, pack, N(pack));
    manta_spec_errors_destroy(&e);
}

/* ---- derived defaults (manta_spec_options.defaults) -------------------------------- */

typedef struct dft_run {
    int mode;    /* 0: the usual; 1: and a bad value; 2: fail without a word; 3: a bad path */
    int rc[8];   /* what each manta_spec_default returned */
    int n, seen; /* calls made; callbacks run */
} dft_run;

static int dft_cb(manta_spec_defaults *d, const manta_spec_node *root, void *user)
{
    dft_run *r = user;
    r->seen++;
    /* the document as the overrides left it */
    const char *job;
    assert_int_equal(manta_spec_get_str(root, "job", NULL, &job, NULL), 0);
    assert_string_equal(job, "dft");
    if (r->mode == 2) return MANTA_EINVAL;
    r->rc[r->n++] = manta_spec_default(d, "groups.a.resources.gpu", "0.5", "two share one");
    r->rc[r->n++] = manta_spec_default(d, "groups.b.resources.gpu", "0.5", "two share one");
    r->rc[r->n++] = manta_spec_default(d, "groups.a.settings.x.y", "3", "made on the way");
    r->rc[r->n++] = manta_spec_default(d, "job.x", "1", "into a scalar: left alone");
    r->rc[r->n++] = manta_spec_default(NULL, "groups.a.x", "1", "no load");
    if (r->mode == 1)
        r->rc[r->n++] = manta_spec_default(d, "groups.b.max_restarts", "two", "not an integer");
    if (r->mode == 3) r->rc[r->n++] = manta_spec_default(d, "groups..x", "1", "empty component");
    return 0;
}

static manta_spec *dft_load(dft_run *r, const char *const *sets, size_t n_sets,
                            manta_spec_errors *e)
{
    const char *y = "job: dft\n"
                    "groups:\n"
                    "  a: {class: w, replicas: 2}\n"
                    "  b: {class: w, resources: {gpu: 0}}\n"
                    "nodes: {n: {cpu: 8, gpu: 1}}\n";
    manta_spec_options o = {.sets = sets, .n_sets = n_sets, .defaults = dft_cb, .user = r};
    manta_spec_errors_init(e);
    return manta_spec_load_buffer(y, strlen(y), "dft.yaml", &o, e);
}

/* A program's defaults go in only where the document has no value (absent
 * or null; an explicit 0 wins), are listed in `derived`, make mappings on
 * the way, stay out of scalars, and are checked and placed like the file's
 * values; a bad one is an error at (default):N:COL; a callback that fails
 * fails the load. */
static void test_defaults(void **state)
{
    manta_spec_errors e;
    dft_run r = {0};
    manta_spec *s = dft_load(&r, NULL, 0, &e);
    manta_spec_errors_print(&e, stderr);
    assert_non_null(s);
    assert_int_equal(r.seen, 1);
    assert_int_equal(r.n, 5);
    const int want_rc[] = {1, 0, 1, 0, MANTA_EINVAL};
    for (int i = 0; i < 5; i++) assert_int_equal(r.rc[i], want_rc[i]);
    assert_true(manta_spec_group_find(s, "a")->gpu == 0.5);
    assert_true(manta_spec_group_find(s, "b")->gpu == 0); /* its own 0 wins */
    assert_int_equal(s->n_derived, 2);
    assert_string_equal(s->derived[0].path, "groups.a.resources.gpu");
    assert_string_equal(s->derived[0].value, "0.5");
    assert_string_equal(s->derived[0].why, "two share one");
    assert_string_equal(s->derived[1].path, "groups.a.settings.x.y");
    const manta_spec_node *y = manta_spec_find(s->root, "groups.a.settings.x.y");
    assert_non_null(y);
    assert_string_equal(y->text, "3");
    assert_string_equal(y->file, "(default)");
    assert_string_equal(y->path, "groups.a.settings.x.y");
    assert_non_null(manta_spec_group_find(s, "a")->settings);
    assert_string_equal(manta_spec_find(s->root, "job")->text, "dft");
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);

    /* a null from --set is no value: b gets the default, and the 1.5 GPUs asked for do not
     * fit the one of `nodes` */
    dft_run r2 = {0};
    const char *sets[] = {"b.resources.gpu=", "a.resources.gpu=0.25"};
    assert_null(dft_load(&r2, sets, 1, &e));
    assert_int_equal(r2.rc[1], 1);
    static const char *const want2[] = {
        "dft.yaml:5:1: nodes: the groups need gpu 1.5 in total, more than the 1 the nodes have"};
    expect_errors(&e, want2, N(want2));
    manta_spec_errors_destroy(&e);
    /* ... and a --set value wins over the default */
    dft_run r3 = {0};
    s = dft_load(&r3, sets, 2, &e);
    assert_non_null(s);
    assert_int_equal(r3.rc[0], 0);
    assert_true(manta_spec_group_find(s, "a")->gpu == 0.25);
    assert_true(manta_spec_group_find(s, "b")->gpu == 0.5);
    assert_int_equal(s->n_derived, 2);
    assert_string_equal(s->derived[0].path, "groups.b.resources.gpu");
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);

    /* a default that breaks the schema is an error at (default):N:COL */
    dft_run r4 = {.mode = 1};
    assert_null(dft_load(&r4, NULL, 0, &e));
    assert_int_equal(r4.rc[5], 1);
    static const char *const want4[] = {"(default):5:23: groups.b.max_restarts: expected an "
                                        "integer >= -1 (-1: unlimited), got \"two\""};
    expect_errors(&e, want4, N(want4));
    manta_spec_errors_destroy(&e);

    /* a callback that fails without a word fails the load, saying so */
    dft_run r5 = {.mode = 2};
    assert_null(dft_load(&r5, NULL, 0, &e));
    static const char *const want5[] = {
        "dft.yaml: the program's defaults failed: invalid argument"};
    expect_errors(&e, want5, N(want5));
    manta_spec_errors_destroy(&e);

    /* a path with an empty component is refused, and fails the load */
    dft_run r6 = {.mode = 3};
    assert_null(dft_load(&r6, NULL, 0, &e));
    assert_int_equal(r6.rc[5], MANTA_EINVAL);
    static const char *const want6[] = {
        "(default):5:1: an empty component in the path \"groups..x\" of a default"};
    expect_errors(&e, want6, N(want6));
    manta_spec_errors_destroy(&e);

    /* no callback: nothing derived */
    s = load_text("job: x\ngroups: {a: {class: w}}\n", NULL, 0, &e);
    assert_non_null(s);
    assert_int_equal(s->n_derived, 0);
    assert_null(s->derived);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_place_first_fit(void **state)
{
    manta_spec_capacity nodes[] = {
        {"a", 4, 1, 16ull << 30},
        {"b", 8, 0, 32ull << 30},
        {"c", 16, 2, 64ull << 30},
    };
    manta_spec_demand d[] = {
        {"rollout", 3, 2, 0, 4ull << 30},
        {"learner", 2, 2, 1, 8ull << 30},
        {"idle", 0, 100, 100, 0}, /* zero replicas ask for nothing */
    };
    size_t node_of[5];
    char why[256];
    assert_int_equal(manta_spec_total_replicas(d, N(d)), 5);
    assert_int_equal(manta_spec_place(d, N(d), nodes, N(nodes), MANTA_SPEC_FIRST_FIT, false,
                                      node_of, why, sizeof why),
                     0);
    /* rollout: a, a (a out of cpu), b; learner: c, c. */
    size_t want[] = {0, 0, 1, 2, 2};
    for (size_t i = 0; i < N(want); i++) assert_int_equal(node_of[i], want[i]);
    assert_string_equal(why, "");
    /* The inputs are not modified. */
    assert_true(nodes[0].cpu == 4 && nodes[2].gpu == 2);

    /* In demand order the small ask takes the GPU node's CPUs and the GPU
     * ask is left with none; largest first places both. */
    manta_spec_capacity two[] = {{"a", 4, 1, 0}, {"b", 4, 0, 0}};
    manta_spec_demand order[] = {{"small", 1, 4, 0, 0}, {"big", 1, 4, 1, 0}};
    size_t k[2];
    assert_int_equal(
        manta_spec_place(order, 2, two, 2, MANTA_SPEC_FIRST_FIT, false, k, why, sizeof why),
        MANTA_ENOFIT);
    assert_string_equal(why, "group \"big\" replica 1 of 1 (cpu 4, gpu 1, memory 0B) does not "
                             "fit: free: a cpu 0 gpu 1 memory 0B; b cpu 4 gpu 0 memory 0B");
    assert_int_equal(
        manta_spec_place(order, 2, two, 2, MANTA_SPEC_FIRST_FIT, true, k, why, sizeof why), 0);
    assert_int_equal(k[0], 1); /* small -> b */
    assert_int_equal(k[1], 0); /* big (placed first) -> a */
}

static void test_place_best_fit(void **state)
{
    manta_spec_capacity nodes[] = {
        {"large", 32, 0, 128ull << 30},
        {"small", 4, 0, 8ull << 30},
        {"medium", 8, 0, 16ull << 30},
    };
    manta_spec_demand d[] = {{"w", 2, 4, 0, 8ull << 30}, {"x", 1, 16, 0, 64ull << 30}};
    size_t ff[3], bf[3];
    char why[256];
    assert_int_equal(
        manta_spec_place(d, 2, nodes, 3, MANTA_SPEC_FIRST_FIT, false, ff, why, sizeof why), 0);
    assert_int_equal(ff[0], 0);
    assert_int_equal(ff[1], 0);
    assert_int_equal(ff[2], 0);
    assert_int_equal(
        manta_spec_place(d, 2, nodes, 3, MANTA_SPEC_BEST_FIT, false, bf, why, sizeof why), 0);
    assert_int_equal(bf[0], 1); /* exactly fills "small" */
    assert_int_equal(bf[1], 2); /* then "medium" */
    assert_int_equal(bf[2], 0);

    /* Best fit prefers the node with fewest GPUs left. */
    manta_spec_capacity g[] = {{"g4", 64, 4, 0}, {"g1", 64, 1, 0}};
    manta_spec_demand one = {"gpu", 1, 1, 1, 0};
    size_t k;
    assert_int_equal(
        manta_spec_place(&one, 1, g, 2, MANTA_SPEC_BEST_FIT, false, &k, why, sizeof why), 0);
    assert_int_equal(k, 1);

    /* Fractions of a GPU share a node's devices: a rollout and a learner
     * of 0.5 each on the one-GPU node, a third half on the other. */
    manta_spec_capacity h[] = {{"one", 8, 1, 0}, {"two", 8, 2, 0}};
    manta_spec_demand halves[] = {{"rollout", 2, 1, 0.5, 0}, {"learner", 1, 1, 0.5, 0}};
    size_t hk[3];
    assert_int_equal(
        manta_spec_place(halves, 2, h, 2, MANTA_SPEC_BEST_FIT, false, hk, why, sizeof why), 0);
    assert_int_equal(hk[0], 0);
    assert_int_equal(hk[1], 0);
    assert_int_equal(hk[2], 1);
    manta_spec_demand more = {"x", 7, 1, 0.5, 0};
    size_t mk[7];
    assert_int_equal(
        manta_spec_place(&more, 1, h, 2, MANTA_SPEC_FIRST_FIT, false, mk, why, sizeof why),
        MANTA_ENOFIT);
    assert_string_equal(why, "group \"x\" replica 7 of 7 (cpu 1, gpu 0.5, memory 0B) does not "
                             "fit: free: one cpu 6 gpu 0 memory 0B; two cpu 4 gpu 0 memory 0B");
}

static void test_place_impossible(void **state)
{
    manta_spec_capacity nodes[] = {{"a", 8, 1, 16ull << 30}};
    manta_spec_demand d[] = {{"learner", 2, 4, 1, 8ull << 30}};
    size_t k[2];
    char why[256];
    assert_int_equal(
        manta_spec_place(d, 1, nodes, 1, MANTA_SPEC_BEST_FIT, false, k, why, sizeof why),
        MANTA_ENOFIT);
    assert_string_equal(why,
                        "group \"learner\" replica 2 of 2 (cpu 4, gpu 1, memory 8GiB) does not "
                        "fit: free: a cpu 4 gpu 0 memory 8GiB");
    assert_int_equal(
        manta_spec_place(d, 1, NULL, 0, MANTA_SPEC_FIRST_FIT, false, k, why, sizeof why),
        MANTA_ENOFIT);
    assert_string_equal(why,
                        "group \"learner\" replica 1 of 2 (cpu 4, gpu 1, memory 8GiB) does not "
                        "fit: there are no nodes");
    /* A short `why` is cut, never overrun. */
    char small[16];
    memset(small, 'x', sizeof small);
    assert_int_equal(manta_spec_place(d, 1, nodes, 1, MANTA_SPEC_FIRST_FIT, false, k, small, 10),
                     MANTA_ENOFIT);
    assert_int_equal(strlen(small), 9);
    assert_int_equal(small[10], 'x');
    /* Nothing to place always fits. */
    manta_spec_demand none = {"z", 0, 1, 1, 1};
    assert_int_equal(manta_spec_place(&none, 1, NULL, 0, MANTA_SPEC_FIRST_FIT, false, k, NULL, 0),
                     0);
    /* Demands from a spec. */
    manta_spec_errors e;
    manta_spec *s = load_file("full.yaml", NULL, 0, &e);
    assert_non_null(s);
    manta_spec_demand sd[4];
    manta_spec_demands(s, sd);
    assert_string_equal(sd[3].group, "learner");
    assert_int_equal(sd[3].replicas, 2);
    assert_int_equal(sd[3].gpu, 1);
    size_t where[5];
    assert_int_equal(manta_spec_total_replicas(sd, 4), 5);
    assert_int_equal(manta_spec_place(sd, 4, s->nodes, s->n_nodes, MANTA_SPEC_FIRST_FIT, false,
                                      where, why, sizeof why),
                     0);
    assert_int_equal(where[3], 0); /* learners need the GPU node */
    assert_int_equal(where[4], 0);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

/* ---- msgpack ---------------------------------------------------------------------- */

static const msgpack_object *map_lookup(const msgpack_object *m, const char *key)
{
    assert_int_equal(m->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        assert_int_equal(kv->key.type, MSGPACK_OBJECT_STR);
        if (kv->key.via.str.size == strlen(key) && !memcmp(kv->key.via.str.ptr, key, strlen(key)))
            return &kv->val;
    }
    return NULL;
}

static void assert_str_obj(const msgpack_object *o, const char *s)
{
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(s));
    assert_memory_equal(o->via.str.ptr, s, strlen(s));
}

static void test_msgpack(void **state)
{
    manta_spec_errors e;
    manta_spec *s = load_file("full.yaml", NULL, 0, &e);
    assert_non_null(s);
    const manta_spec_group *r = manta_spec_group_find(s, "rollout");
    char *buf;
    size_t len;
    assert_int_equal(manta_spec_node_to_msgpack(r->settings, &buf, &len), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);
    const msgpack_object *m = &u.data;
    assert_int_equal(m->via.map.size, 6);
    assert_str_obj(&m->via.map.ptr[0].key, "slots"); /* file order */
    const msgpack_object *o = map_lookup(m, "slots");
    assert_int_equal(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_int_equal(o->via.u64, 16);
    o = map_lookup(m, "temperature");
    assert_int_equal(o->type, MSGPACK_OBJECT_FLOAT64);
    assert_true(o->via.f64 == 0.7);
    o = map_lookup(m, "greedy");
    assert_int_equal(o->type, MSGPACK_OBJECT_BOOLEAN);
    assert_false(o->via.boolean);
    assert_str_obj(map_lookup(m, "name"), "007");
    assert_str_obj(map_lookup(m, "kv_cache"), "1.5GB");
    o = map_lookup(m, "stop");
    assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(o->via.array.size, 2);
    assert_str_obj(&o->via.array.ptr[1], "\n\n");
    msgpack_unpacked_destroy(&u);
    free(buf);

    /* Other scalar types, and a NULL node. */
    const manta_spec_node *rl = manta_spec_find(s->root, "rl");
    assert_int_equal(manta_spec_node_to_msgpack(rl, &buf, &len), 0);
    msgpack_unpacked_init(&u);
    off = 0;
    assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(map_lookup(&u.data, "nothing")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(map_lookup(&u.data, "on_policy")->type, MSGPACK_OBJECT_BOOLEAN);
    msgpack_unpacked_destroy(&u);
    free(buf);
    assert_int_equal(manta_spec_node_to_msgpack(NULL, &buf, &len), 0);
    assert_int_equal(len, 1);
    assert_int_equal((unsigned char)buf[0], 0xc0);
    free(buf);

    /* The init payload. */
    assert_int_equal(manta_spec_init_payload(s, 1, 1, &buf, &len), 0);
    msgpack_unpacked_init(&u);
    off = 0;
    assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    m = &u.data;
    assert_int_equal(m->via.map.size, 7);
    assert_str_obj(map_lookup(m, "job"), "calc-agent");
    assert_str_obj(map_lookup(m, "group"), "rollout");
    assert_str_obj(map_lookup(m, "class"), "rollout");
    assert_int_equal(map_lookup(m, "replica")->via.u64, 1);
    assert_int_equal(map_lookup(m, "replicas")->via.u64, 2);
    assert_int_equal(map_lookup(m, "settings")->via.map.size, 6);
    o = map_lookup(m, "sections");
    assert_int_equal(o->via.map.size, 5); /* defaults, model, rl, tools, extra */
    assert_str_obj(&o->via.map.ptr[0].key, "defaults");
    assert_str_obj(&o->via.map.ptr[3].key, "tools");
    const msgpack_object *extra = map_lookup(o, "extra");
    assert_int_equal(extra->via.map.size, 3); /* cpu, memory, gpu; no "<<" */
    assert_int_equal(map_lookup(extra, "cpu")->via.u64, 1);
    assert_str_obj(map_lookup(extra, "memory"), "512MiB");
    assert_int_equal(map_lookup(extra, "gpu")->via.u64, 1);
    const msgpack_object *model = map_lookup(o, "model");
    assert_int_equal(map_lookup(model, "vocab")->via.u64, 256);
    msgpack_unpacked_destroy(&u);
    free(buf);
    /* Absent settings are an empty map. */
    assert_int_equal(manta_spec_init_payload(s, 0, 0, &buf, &len), 0);
    msgpack_unpacked_init(&u);
    off = 0;
    assert_int_equal(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    o = map_lookup(&u.data, "settings");
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o->via.map.size, 0);
    msgpack_unpacked_destroy(&u);
    free(buf);
    assert_int_equal(manta_spec_init_payload(s, 4, 0, &buf, &len), MANTA_EINVAL);
    assert_null(buf);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

/* ---- robustness ------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 16);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

/* Load must either succeed with no errors, or fail with at least one error,
 * every one of which starts with a known location. */
static void check_outcome(const char *buf, size_t len, const char *const *sets, size_t n_sets)
{
    manta_spec_options o = {.sets = sets, .n_sets = n_sets};
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec *s = manta_spec_load_buffer(buf, len, "fuzz.yaml", &o, &e);
    if (s) {
        assert_int_equal(e.count + e.dropped, 0);
        assert_non_null(s->job);
        assert_true(s->n_groups >= 1);
        char *pb;
        size_t pl;
        assert_int_equal(manta_spec_init_payload(s, 0, 0, &pb, &pl), 0);
        free(pb);
    } else {
        assert_true(e.count > 0);
        for (size_t i = 0; i < e.count; i++)
            assert_true(!strncmp(e.items[i].text, "fuzz.yaml:", 10) ||
                        !strncmp(e.items[i].text, "--set:", 6));
    }
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

static void test_fuzz_truncations(void **state)
{
    size_t len;
    char *buf = read_all("full.yaml", &len);
    assert_true(len > 1000);
    size_t ok = 0;
    const char *sets[] = {"rollout.replicas=3", "rl.eta=1"};
    for (size_t cut = 0; cut <= len; cut++) {
        /* An unterminated copy, so ASan sees any read past the end. */
        char *part = malloc(cut ? cut : 1);
        memcpy(part, buf, cut);
        check_outcome(part, cut, NULL, 0);
        check_outcome(part, cut, sets, N(sets));
        manta_spec_errors e;
        manta_spec_errors_init(&e);
        manta_spec *s = manta_spec_load_buffer(part, cut, "fuzz.yaml", NULL, &e);
        ok += s != NULL;
        manta_spec_free(s);
        manta_spec_errors_destroy(&e);
        free(part);
    }
    assert_true(ok > 0); /* the later cuts parse */
    free(buf);
}

static void test_fuzz_mutations(void **state)
{
    size_t len;
    char *buf = read_all("full.yaml", &len);
    static const char alphabet[] = ":-[]{}&*!|><'\"#,? \n\t%@`\\0a9.~\xc3\xff";
    uint64_t x = 0x9e3779b97f4a7c15ull; /* fixed seed: reproducible */
    char *m = malloc(len);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, buf, len);
        int edits = 1 + (int)(x % 4);
        for (int j = 0; j < edits; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            m[x % len] = alphabet[(x >> 32) % (sizeof alphabet - 1)];
        }
        check_outcome(m, len, NULL, 0);
    }
    /* Mutated overrides too. */
    for (int iter = 0; iter < 500; iter++) {
        char set[] = "groups.rollout.settings.slots={a: [1, 2], b: 3}";
        for (int j = 0; j < 3; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            set[x % (sizeof set - 1)] = alphabet[(x >> 32) % (sizeof alphabet - 1)];
        }
        const char *sets[] = {set};
        check_outcome(buf, len, sets, 1);
    }
    free(m);
    free(buf);
}

/* Without an error list the first error goes to manta_last_error. */
static void test_no_error_list(void **state)
{
    (void)state;
    const char bad[] = "job: j\ngroups:\n  w: {class: c, replicas: two}\n";
    manta_spec *s = manta_spec_load_buffer(bad, sizeof bad - 1, "bad.yaml", NULL, NULL);
    assert_null(s);
    assert_non_null(strstr(manta_last_error(), "bad.yaml:3:"));
    assert_non_null(strstr(manta_last_error(), "replicas"));
    assert_null(manta_spec_load_file("/nonexistent/spec.yaml", NULL, NULL));
    assert_non_null(strstr(manta_last_error(), "cannot open"));
    /* a second top-level groups: or nodes: is a duplicate, and is not read
     * (reading it leaked the first one's tables; found by the spec fuzzer) */
    const char *dups[] = {"job: {name: a}\ngroups: {a: {class: x}}\ngroups: {b: {class: y}}\n",
                          "job: a\ngroups: {a: {class: x}}\nnodes: {n: {cpu: 1}}\n"
                          "nodes: {m: {cpu: 2}}\n"};
    for (size_t i = 0; i < 2; i++) {
        assert_null(manta_spec_load_buffer(dups[i], strlen(dups[i]), "dup.yaml", NULL, NULL));
        assert_non_null(strstr(manta_last_error(), "duplicate key"));
    }
}

int main(void)
{
    if (chdir(SPEC_FIXTURE_DIR) != 0) {
        perror(SPEC_FIXTURE_DIR);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_values),
        cmocka_unit_test(test_minimal_defaults),
        cmocka_unit_test(test_library_path),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_merge_keys),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_override_errors),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_scalar_types),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_redis_urls),
        cmocka_unit_test(test_error_schema_file),
        cmocka_unit_test(test_error_syntax_and_duplicates),
        cmocka_unit_test(test_error_cases),
        cmocka_unit_test(test_error_deep_nesting),
        cmocka_unit_test(test_error_alias_bomb),
        cmocka_unit_test(test_error_unknown_class),
        cmocka_unit_test(test_error_limit),
        cmocka_unit_test(test_placement_spec_errors),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_place_first_fit),
        cmocka_unit_test(test_place_best_fit),
        cmocka_unit_test(test_place_impossible),
        cmocka_unit_test(test_msgpack),
        cmocka_unit_test(test_fuzz_truncations),
        cmocka_unit_test(test_fuzz_mutations),
        cmocka_unit_test(test_no_error_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
