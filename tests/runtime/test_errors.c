/*
 * test_errors.c -- the one error table of manta.h.
 *
 * Every library of Manta reports failures with codes from MANTA_ERRORS, so
 * the table itself is checked here: each code has its own value and its own
 * non-empty text, names and values round-trip through manta_errname and
 * manta_err_index, and codes outside the table are named as unknown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "manta.h"

typedef struct entry {
    const char *name;
    int code;
    const char *text;
} entry;

static const entry table[] = {
#define X(name, code, text) {#name, code, text},
    MANTA_ERRORS(X)
#undef X
};
#define N (sizeof table / sizeof table[0])

static void test_values_distinct(void **state)
{
    (void)state;
    assert_int_equal(N, MANTA_ERR_COUNT);
    for (size_t i = 0; i < N; i++) {
        assert_true(table[i].code <= 0);
        for (size_t j = i + 1; j < N; j++) {
            if (table[i].code == table[j].code)
                fail_msg("MANTA_%s and MANTA_%s share the value %d", table[i].name, table[j].name,
                         table[i].code);
            if (!strcmp(table[i].name, table[j].name))
                fail_msg("MANTA_%s is in the table twice", table[i].name);
        }
    }
}

static void test_texts_distinct(void **state)
{
    (void)state;
    for (size_t i = 0; i < N; i++) {
        const char *t = manta_strerror(table[i].code);
        assert_non_null(t);
        if (!t[0]) fail_msg("MANTA_%s has an empty text", table[i].name);
        assert_string_equal(t, table[i].text);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(t, manta_strerror(table[j].code)))
                fail_msg("MANTA_%s and MANTA_%s have the same text \"%s\"", table[i].name,
                         table[j].name, t);
    }
}

static void test_names_and_indexes(void **state)
{
    (void)state;
    for (size_t i = 0; i < N; i++) {
        assert_string_equal(manta_errname(table[i].code), table[i].name);
        /* codes run 0, -1, -2 ... so that -code indexes counters */
        assert_int_equal(manta_err_index(table[i].code), (int)i);
    }
    assert_int_equal(manta_err_index(MANTA_OK), 0);
    assert_string_equal(manta_errname(MANTA_ETIMEDOUT), "ETIMEDOUT");
    assert_string_equal(manta_errname(MANTA_ECONNECT), "ECONNECT");
}

static void test_unknown_codes(void **state)
{
    (void)state;
    int unknown[] = {1, 42, -MANTA_ERR_COUNT, -1000, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(manta_strerror(unknown[i]), "unknown error code");
        assert_string_equal(manta_errname(unknown[i]), "?");
        /* still a valid index into MANTA_ERR_COUNT counters */
        assert_int_equal(manta_err_index(unknown[i]), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_distinct),
        cmocka_unit_test(test_texts_distinct),
        cmocka_unit_test(test_names_and_indexes),
        cmocka_unit_test(test_unknown_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
