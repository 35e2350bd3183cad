/*
 * test_spec_keys.c -- the declared spec sections (manta_spec_key): the
 * runtime's (services, metrics, security, run) and the RL classes'
 * (actors/rl_keys.c: model, rl, task, reward, tools and a group's settings).
 *
 *   - every declaration is well formed: unique names, a meaning, a default
 *     of its own type within its range, a choice among its choices;
 *   - a spec with typos and wrong types fails with each error at its
 *     file:line:col and a "did you mean", for files and --set overrides;
 *   - every example spec in examples/ loads cleanly against the tables;
 *   - every key the actors read through rl_arg_* (the .c files of actors/) and every
 *     key the runtime reads with manta_spec_get_* (job.c, cli.c) is
 *     declared: a reader cannot use a key the checker does not know;
 *   - the arg readers refuse a key that is not declared, or one read with
 *     another default or range than declared.
 * The docs (docs/spec-keys.md = `manta help spec`) are compared by the
 * ctest spec_keys_doc.
 */
#include <dirent.h>
#include <math.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "manta_spec.h"
#include "rl_util.h"

#ifndef SOURCE_DIR
#error "SOURCE_DIR must name the repository root"
#endif

static const char *const BUILTIN[] = {"controller", "rollout", "env", "reward", "learner", NULL};

static bool builtin(const char *name, void *user)
{
    (void)user;
    for (size_t i = 0; BUILTIN[i]; i++)
        if (!strcmp(BUILTIN[i], name)) return true;
    return false;
}

static manta_spec_options options(const char *const *sets, size_t n)
{
    return (manta_spec_options){.sets = sets,
                                .n_sets = n,
                                .class_exists = builtin,
                                .sections = rl_spec_sections,
                                .settings = rl_settings_keys};
}

static void expect_errors(manta_spec_errors *e, const char *const *want, size_t n)
{
    for (size_t i = 0; i < e->count; i++)
        if (i >= n || strcmp(e->items[i].text, want[i]) != 0)
            print_message("error %zu: %s\n", i, e->items[i].text);
    assert_int_equal(e->count, n);
    for (size_t i = 0; i < n; i++) assert_string_equal(e->items[i].text, want[i]);
}

/* ---- the declarations themselves ---- */

static void check_table(const manta_spec_key *t, const char *where)
{
    for (size_t i = 0; t[i].name; i++) {
        const manta_spec_key *k = &t[i];
        if (!k->doc || !k->doc[0]) fail_msg("%s.%s: no meaning", where, k->name);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t[j].name, k->name)) fail_msg("%s.%s: declared twice", where, k->name);
        if ((k->type == MANTA_SPEC_K_MAP || k->type == MANTA_SPEC_K_LIST) && k->keys) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.%s", where, k->name);
            check_table(k->keys, sub);
        }
        if (!k->def || k->def[0] == '(') continue;
        if (k->type == MANTA_SPEC_K_INT || k->type == MANTA_SPEC_K_NUM) {
            char *end;
            double d = strtod(k->def, &end);
            if (*end || (k->type == MANTA_SPEC_K_INT && d != floor(d)))
                fail_msg("%s.%s: default \"%s\" is not %s", where, k->name, k->def,
                         k->type == MANTA_SPEC_K_INT ? "an integer" : "a number");
            if (k->lo < k->hi && (d < k->lo || d > k->hi))
                fail_msg("%s.%s: default %s is outside [%g, %g]", where, k->name, k->def, k->lo,
                         k->hi);
        } else if (k->type == MANTA_SPEC_K_BOOL) {
            if (strcmp(k->def, "true") && strcmp(k->def, "false"))
                fail_msg("%s.%s: default \"%s\" is not a boolean", where, k->name, k->def);
        } else if (k->type == MANTA_SPEC_K_STR && k->choices) {
            size_t n = strlen(k->def);
            const char *p = strstr(k->choices, k->def);
            if (!p || (p != k->choices && p[-1] != '|') || (p[n] && p[n] != '|'))
                fail_msg("%s.%s: default \"%s\" is not one of %s", where, k->name, k->def,
                         k->choices);
        }
    }
}

static void test_declarations(void **state)
{
    (void)state;
    check_table(manta_spec_runtime_sections, "");
    check_table(rl_spec_sections, "");
    check_table(rl_settings_keys, "settings");
    /* a section name of the RL classes must not shadow the runtime's */
    for (size_t i = 0; rl_spec_sections[i].name; i++)
        assert_null(manta_spec_key_find(manta_spec_runtime_sections, rl_spec_sections[i].name,
                                        strlen(rl_spec_sections[i].name)));
}

/* ---- errors at their place ---- */

static const char BAD[] = "job: t\n"                                               /* 1 */
                          "groups:\n"                                              /* 2 */
                          "  c:\n"                                                 /* 3 */
                          "    class: controller\n"                                /* 4 */
                          "    settings: {learnr_group: x, threads: two, lr: 1}\n" /* 5 */
                          "rl:\n"                                                  /* 6 */
                          "  warmup_step: 200\n"                                   /* 7 */
                          "  group_size: 0\n"                                      /* 8 */
                          "  warmup: {until_sucess: 0.1}\n"                        /* 9 */
                          "  dynamic_sampling: 1\n"                                /* 10 */
                          "model: {n_layer: \"2\", sed: 3}\n"                      /* 11 */
                          "tools:\n"                                               /* 12 */
                          "  - {name: calc, ur: \"http://x\"}\n"                   /* 13 */
                          "reward: {rule: fuzzy}\n"                                /* 14 */
                          "services:\n"                                            /* 15 */
                          "  - {name: a, command: b, port: 70000}\n"               /* 16 */
                          "metrics: {port: 9464, bnd: x}\n"                        /* 17 */
                          "modle: {n_layer: 2}\n";                                 /* 18 */

static void test_errors_located(void **state)
{
    (void)state;
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec_options o = options(NULL, 0);
    manta_spec *s = manta_spec_load_buffer(BAD, strlen(BAD), "bad.yaml", &o, &e);
    assert_null(s);
    const char *const want[] = {
        "bad.yaml:5:16: groups.c.settings.learnr_group: unknown key (did you mean "
        "\"learner_group\"?)",
        "bad.yaml:5:42: groups.c.settings.threads: expected an integer from 0 to 4096, got "
        "\"two\"",
        "bad.yaml:7:3: rl.warmup_step: unknown key (did you mean \"warmup_steps\"?)",
        "bad.yaml:8:15: rl.group_size: expected an integer from 1 to 65536, got \"0\"",
        "bad.yaml:9:12: rl.warmup.until_sucess: unknown key (did you mean \"until_success\"?)",
        "bad.yaml:10:21: rl.dynamic_sampling: expected true or false, got \"1\"",
        "bad.yaml:11:18: model.n_layer: expected an integer from 1 to 1024, got \"2\"",
        "bad.yaml:11:23: model.sed: unknown key (did you mean \"seed\"?)",
        "bad.yaml:13:18: tools.0.ur: unknown key (did you mean \"url\"?)",
        "bad.yaml:13:5: tools.0: missing required key \"url\" (the MCP server's streamable-HTTP "
        "endpoint)",
        "bad.yaml:14:16: reward.rule: expected one of exact, numeric, http, got \"fuzzy\"",
        "bad.yaml:16:33: services.0.port: expected an integer from 0 to 65535, got \"70000\"",
        "bad.yaml:17:23: metrics.bnd: unknown key (did you mean \"bind\"?)",
        "bad.yaml:18:1: modle: unknown top-level key (did you mean \"model\"?)",
    };
    expect_errors(&e, want, sizeof want / sizeof want[0]);
    manta_spec_errors_destroy(&e);
}

static const char GOOD[] = "job: t\n"
                           "groups:\n"
                           "  c: {class: controller, settings: {rl: {eta: 1}, lr: 0.01}}\n"
                           "  u: {class: mine, library: ./libx.so, settings: {anything: 1}}\n"
                           "rl: {warmup: {until_loss: 0.5, max_steps: 9}, dynamic_sampling: "
                           "false}\n"
                           "tools:\n"
                           "  - {url: \"http://127.0.0.1:1/mcp\"}\n"
                           "extra: {free: form}\n";

static void test_sets_and_clean(void **state)
{
    (void)state;
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec_options o = options(NULL, 0);
    manta_spec *s = manta_spec_load_buffer(GOOD, strlen(GOOD), "good.yaml", &o, &e);
    if (!s) manta_spec_errors_print(&e, stderr);
    assert_non_null(s);
    manta_spec_free(s);
    /* a typo in an override is found like one in the file */
    const char *const sets[] = {"rl.warmup_step=200", "model.n_layer=2", "task.demos=d.jsonl"};
    o = options(sets, 3);
    s = manta_spec_load_buffer(GOOD, strlen(GOOD), "good.yaml", &o, &e);
    assert_null(s);
    const char *const want[] = {
        "--set:1:1: rl.warmup_step: unknown key (did you mean \"warmup_steps\"?)"};
    expect_errors(&e, want, 1);
    manta_spec_errors_destroy(&e);
    /* a declared section the file lacks can be set (and is checked) */
    const char *const sets2[] = {"reward.rule=numeric", "reward.tolerance=-1"};
    o = options(sets2, 2);
    s = manta_spec_load_buffer(GOOD, strlen(GOOD), "good.yaml", &o, &e);
    assert_null(s);
    const char *const want2[] = {
        "--set:2:18: reward.tolerance: expected a number from 0 to 1e+300, got \"-1\""};
    expect_errors(&e, want2, 1);
    manta_spec_errors_destroy(&e);
}

/* A spec of library classes only may use the names for its own sections;
 * the runtime's sections are checked whatever the classes. */
static void test_library_only(void **state)
{
    (void)state;
    static const char text[] = "job: t\n"
                               "groups:\n"
                               "  u: {class: mine, library: ./libx.so}\n"
                               "rl: {my_own_key: 1}\n"
                               "run: {group: u, methd: go}\n";
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec_options o = options(NULL, 0);
    assert_null(manta_spec_load_buffer(text, strlen(text), "lib.yaml", &o, &e));
    const char *const want[] = {"lib.yaml:5:17: run.methd: unknown key (did you mean \"method\"?)"};
    expect_errors(&e, want, 1);
    manta_spec_errors_destroy(&e);
}

/* ---- the examples load against the declarations ---- */

static void test_examples(void **state)
{
    (void)state;
    DIR *d = opendir(SOURCE_DIR "/examples");
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".yaml")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/examples/%s", SOURCE_DIR, de->d_name);
        manta_spec_errors e;
        manta_spec_errors_init(&e);
        manta_spec_options o = options(NULL, 0);
        manta_spec *s = manta_spec_load_file(path, &o, &e);
        if (!s) manta_spec_errors_print(&e, stderr);
        assert_non_null(s);
        manta_spec_free(s);
        manta_spec_errors_destroy(&e);
        n++;
    }
    closedir(d);
    assert_true(n >= 3);
}

/* ---- every key a reader uses is declared ---- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

static char *group(const char *text, const regmatch_t *m)
{
    return strndup(text + m->rm_so, (size_t)(m->rm_eo - m->rm_so));
}

/* rl_arg_int/_num/_str/_get(&a or a, SECTION, "KEY" ...) in every .c file of actors/ */
static int scan_actors(void)
{
    regex_t re;
    assert_int_equal(regcomp(&re,
                             "rl_arg_(int|num|str|get)\\(&?a,[[:space:]]*(NULL|\"([a-z_]*)\"),"
                             "[[:space:]]*\"([a-z_0-9]+)\"",
                             REG_EXTENDED),
                     0);
    DIR *d = opendir(SOURCE_DIR "/actors");
    assert_non_null(d);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 3 || strcmp(de->d_name + len - 2, ".c")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/actors/%s", SOURCE_DIR, de->d_name);
        char *text = slurp(path);
        assert_non_null(text);
        regmatch_t m[5];
        for (const char *p = text; regexec(&re, p, 5, m, 0) == 0; p += m[0].rm_eo) {
            char *sec = m[3].rm_so >= 0 ? group(p, &m[3]) : NULL, *key = group(p, &m[4]);
            if (!sec || sec[0]) { /* "": a field of the init payload, not a spec key */
                if (!rl_key_find(sec, key))
                    fail_msg("%s: %s.%s is read but not declared in actors/rl_keys.c", de->d_name,
                             sec ? sec : "settings", key);
                found++;
            }
            free(sec), free(key);
        }
        free(text);
    }
    closedir(d);
    regfree(&re);
    return found;
}

/* Does some runtime section declare `path` (section.key, or a key of an
 * item/section read through a node: "port", "timeout_s")? */
static bool runtime_declares(const char *path)
{
    const manta_spec_key *t = manta_spec_runtime_sections;
    const char *dot = strchr(path, '.');
    if (dot) {
        const manta_spec_key *s = manta_spec_key_find(t, path, (size_t)(dot - path));
        return s && manta_spec_key_find(s->keys, dot + 1, strlen(dot + 1));
    }
    if (manta_spec_key_find(t, path, strlen(path))) return true;
    for (size_t i = 0; t[i].name; i++)
        if (manta_spec_key_find(t[i].keys, path, strlen(path))) return true;
    return false;
}

/* manta_spec_get_*(NODE, "PATH" ...) in job.c and cli.c */
static int scan_runtime(void)
{
    static const char *const files[] = {"runtime/job/job.c", "runtime/job/service.c",
                                        "runtime/cli/cli.c"};
    regex_t re;
    assert_int_equal(
        regcomp(&re, "manta_spec_get_[a-z]+\\([a-z_>.-]+,[[:space:]]*\"([a-z_.]+)\"", REG_EXTENDED),
        0);
    int found = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", SOURCE_DIR, files[i]);
        char *text = slurp(path);
        assert_non_null(text);
        regmatch_t m[2];
        for (const char *p = text; regexec(&re, p, 2, m, 0) == 0; p += m[0].rm_eo) {
            char *key = group(p, &m[1]);
            if (!runtime_declares(key))
                fail_msg("%s: \"%s\" is read but no runtime section declares it (spec.c)", files[i],
                         key);
            free(key);
            found++;
        }
        free(text);
    }
    regfree(&re);
    return found;
}

static void test_readers_use_declared_keys(void **state)
{
    (void)state;
    assert_true(scan_actors() >= 40); /* the scan sees the readers (not an empty match) */
    assert_true(scan_runtime() >= 8);
}

/* ---- the arg readers refuse what is not declared ---- */

static char *args_buf; /* the payload of the rl_args open now */

static void open_args(rl_args *a)
{
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec *s = manta_spec_load_buffer(GOOD, strlen(GOOD), "good.yaml", NULL, &e);
    assert_non_null(s);
    char *buf;
    size_t len;
    assert_int_equal(manta_spec_init_payload(s, 0, 0, &buf, &len), 0);
    assert_int_equal(rl_args_open(a, buf, len), 0);
    args_buf = buf; /* the unpacked strings point into it */
    manta_spec_free(s);
}

static void close_args(rl_args *a)
{
    msgpack_unpacked_destroy(&a->u);
    free(args_buf);
    args_buf = NULL;
}

static void test_readers_refuse(void **state)
{
    (void)state;
    rl_args a;
    open_args(&a);
    /* declared, read as declared: the group's nested value wins */
    assert_int_equal(rl_arg_int(&a, "rl", "eta", 2, 0, 1 << 20), 1);
    assert_true(fabs(rl_arg_num(&a, "rl", "lr", 1e-3, 0, 1e3) - 0.01) < 1e-12);
    assert_int_equal(a.rc, 0);
    close_args(&a);

    open_args(&a);
    rl_arg_int(&a, "rl", "warmup_step", 0, 0, 1 << 30);
    assert_int_not_equal(a.rc, 0);
    assert_string_equal(a.err, "internal error: rl.warmup_step is read but not declared in "
                               "actors/rl_keys.c");
    close_args(&a);

    open_args(&a);
    rl_arg_int(&a, "rl", "group_size", 4, 1, 1 << 16);
    assert_string_equal(a.err, "internal error: rl.group_size is read with default 4 but "
                               "declared with 8 (actors/rl_keys.c)");
    close_args(&a);

    open_args(&a);
    rl_arg_num(&a, "rl", "top_p", 1, 0, 2);
    assert_string_equal(a.err, "internal error: rl.top_p is read with range [0, 2] but declared "
                               "with [0, 1] (actors/rl_keys.c)");
    close_args(&a);

    open_args(&a);
    char out[32];
    rl_arg_str(&a, "rl", "eta", out, sizeof out, "");
    assert_string_equal(a.err, "internal error: rl.eta is read as a string but declared as an "
                               "integer (actors/rl_keys.c)");
    close_args(&a);

    open_args(&a);
    rl_arg_str(&a, NULL, "env_grp", out, sizeof out, "env");
    assert_string_equal(a.err, "internal error: settings.env_grp is read but not declared in "
                               "actors/rl_keys.c");
    close_args(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declarations),   cmocka_unit_test(test_errors_located),
        cmocka_unit_test(test_sets_and_clean), cmocka_unit_test(test_library_only),
        cmocka_unit_test(test_examples),       cmocka_unit_test(test_readers_use_declared_keys),
        cmocka_unit_test(test_readers_refuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
