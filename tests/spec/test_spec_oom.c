/*
 * test_spec_oom.c -- the spec loader when memory runs out.
 *
 * The test links with -Wl,--wrap for every allocating function spec.c calls
 * (malloc, calloc, realloc, strdup, strndup, asprintf, vasprintf), so the
 * N-th allocation can be made to fail, as SQLite's test_malloc.c does. For
 * N = 1, 2, ... until a load makes fewer than N allocations, loading must
 * return NULL with the failure reported (or counted as dropped when even the
 * error could not be stored), and never crash or leak (run under ASan).
 * libyaml's own allocations are in its shared library and are not failed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "manta_spec.h"

#ifndef SPEC_FIXTURE_DIR
#error "SPEC_FIXTURE_DIR must name tests/spec/fixtures"
#endif

static long fail_at = -1; /* the allocation to fail (1-based), -1: none */
static long calls;        /* allocations seen since the counter was reset */

static int should_fail(void)
{
    return ++calls == fail_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_vasprintf(char **out, const char *fmt, va_list ap);
/* The wrappers the linker's --wrap sends spec.c's allocations to. */
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_vasprintf(char **out, const char *fmt, va_list ap);
int __wrap_asprintf(char **out, const char *fmt, ...);

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

char *__wrap_strndup(const char *s, size_t n)
{
    return should_fail() ? NULL : __real_strndup(s, n);
}

int __wrap_vasprintf(char **out, const char *fmt, va_list ap)
{
    return should_fail() ? -1 : __real_vasprintf(out, fmt, ap);
}

int __wrap_asprintf(char **out, const char *fmt, ...)
{
    if (should_fail()) return -1;
    va_list ap;
    va_start(ap, fmt);
    int r = __real_vasprintf(out, fmt, ap);
    va_end(ap);
    return r;
}

/* The allocations before parsing starts (the file's bytes, the spec
 * record, its file and folder names): their failure has no position. */
#define WHOLE_FILE_ALLOCS 4

/* Load `file` failing each allocation in turn; returns how many loads ran.
 * `valid`: the file (with `sets`) loads when nothing fails. */
static long fail_each(const char *file, const char *const *sets, size_t n_sets, bool valid)
{
    manta_spec_options o = {.sets = sets, .n_sets = n_sets};
    for (long n = 1;; n++) {
        manta_spec_errors e;
        manta_spec_errors_init(&e);
        calls = 0;
        fail_at = n;
        manta_spec *s = manta_spec_load_file(file, &o, &e);
        long made = calls;
        fail_at = -1;
        if (n > made) {
            /* Nothing failed: the plain outcome. */
            assert_true(valid ? s != NULL : s == NULL);
            manta_spec_free(s);
            manta_spec_errors_destroy(&e);
            return n;
        }
        if (s) print_message("allocation %ld of %ld failed, yet %s loaded\n", n, made, file);
        assert_null(s);
        assert_true(e.count + e.dropped > 0);
        if (valid && e.count > 0) {
            bool oom = false;
            for (size_t i = 0; i < e.count; i++) {
                if (!strstr(e.items[i].text, "out of memory")) continue;
                oom = true;
                /* Past the whole-file steps, every failure has a place. */
                if (e.items[i].line == 0 && n > WHOLE_FILE_ALLOCS)
                    fail_msg("allocation %ld: no line and column: %s", n, e.items[i].text);
            }
            if (!oom) print_message("allocation %ld: %s\n", n, e.items[0].text);
            assert_true(oom);
        }
        manta_spec_errors_destroy(&e);
    }
}

static void test_oom_valid_spec(void **state)
{
    const char *sets[] = {"rollout.replicas=3", "learner.settings={shards: 4}", "rl.new.key=1"};
    long runs = fail_each("full.yaml", sets, 3, true);
    print_message("full.yaml: %ld allocations failed in turn\n", runs - 1);
    assert_true(runs > 100);
}

static void test_oom_bad_spec(void **state)
{
    long runs = fail_each("schema_errors.yaml", NULL, 0, false);
    assert_true(runs > 50);
    const char *sets[] = {"rolout.replicas=1", "rl.eta.x=[1"};
    assert_true(fail_each("packing.yaml", sets, 2, false) > 10);
}

static void test_oom_outputs(void **state)
{
    manta_spec_errors e;
    manta_spec_errors_init(&e);
    manta_spec *s = manta_spec_load_file("full.yaml", NULL, &e);
    assert_non_null(s);
    /* msgpack buffers: MANTA_ENOMEM and NULL, never a half-built buffer. */
    for (long n = 1;; n++) {
        char *buf = (char *)1;
        size_t len = 99;
        calls = 0;
        fail_at = n;
        int rc = manta_spec_init_payload(s, 1, 0, &buf, &len);
        long made = calls;
        fail_at = -1;
        if (n > made) {
            assert_int_equal(rc, 0);
            free(buf);
            break;
        }
        assert_int_equal(rc, MANTA_ENOMEM);
        assert_null(buf);
        assert_int_equal(len, 0);
    }
    /* Placement: "out of memory" in why. */
    manta_spec_demand d[4];
    manta_spec_demands(s, d);
    size_t node_of[8];
    char why[128];
    calls = 0;
    fail_at = 1;
    assert_int_equal(manta_spec_place(d, 4, s->nodes, s->n_nodes, MANTA_SPEC_BEST_FIT, true,
                                      node_of, why, sizeof why),
                     MANTA_ENOMEM);
    fail_at = -1;
    assert_string_equal(why, "out of memory");
    /* manta_spec_errors_add when the message cannot be stored: counted. */
    manta_spec_errors_destroy(&e);
    calls = 0;
    fail_at = 1;
    manta_spec_errors_add(&e, "x.yaml", 1, 1, "p", "lost");
    fail_at = -1;
    assert_int_equal(e.count, 0);
    assert_int_equal(e.dropped, 1);
    manta_spec_free(s);
    manta_spec_errors_destroy(&e);
}

int main(void)
{
    if (chdir(SPEC_FIXTURE_DIR) != 0) {
        perror(SPEC_FIXTURE_DIR);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_valid_spec),
        cmocka_unit_test(test_oom_bad_spec),
        cmocka_unit_test(test_oom_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
