/*
 * ttest.h - helpers shared by the tokenizer tests: reading a fixture file,
 * the corpus records, and JSON id arrays.
 */
#ifndef TTEST_H
#define TTEST_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "manta_tok.h"

/* Whole file, NUL-terminated; fails the test when it cannot be read. */
static inline char *read_fixture(const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", MTOK_FIXTURES, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    p[n] = 0;
    if (len) *len = (size_t)n;
    return p;
}

static inline cJSON *read_json_fixture(const char *name)
{
    char *s = read_fixture(name, NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);
    if (!j) fail_msg("fixture %s is not JSON", name);
    return j;
}

typedef struct corpus_case {
    const char *p;
    size_t len;
} corpus_case;

/* Splits corpus.bin ("<len>\n<bytes>\n" records) in place; returns the count. */
static inline size_t corpus_cases(char *buf, size_t len, corpus_case *out, size_t max)
{
    size_t i = 0, n = 0;
    while (i < len && n < max) {
        char *end;
        unsigned long k = strtoul(buf + i, &end, 10);
        assert_true(*end == '\n');
        out[n].p = end + 1;
        out[n].len = k;
        n++;
        i = (size_t)(end + 1 - buf) + k + 1;
    }
    return n;
}

/* Compares ids with a JSON array of numbers, printing the first difference. */
static inline int ids_equal(const int32_t *ids, size_t n, const cJSON *want, const char *label)
{
    size_t m = (size_t)cJSON_GetArraySize(want), i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want)
    {
        if (i >= n || ids[i] != (int32_t)e->valuedouble) break;
        i++;
    }
    if (i == m && m == n) return 1;
    fprintf(stderr, "%s: ids differ at %zu (got %zu ids, want %zu):", label, i, n, m);
    for (size_t k = i > 3 ? i - 3 : 0; k < i + 5 && k < n; k++) fprintf(stderr, " %d", ids[k]);
    fprintf(stderr, " | want");
    for (size_t k = i > 3 ? i - 3 : 0; k < i + 5 && k < m; k++)
        fprintf(stderr, " %d", (int)cJSON_GetArrayItem(want, (int)k)->valuedouble);
    fprintf(stderr, "\n");
    return 0;
}

#endif
