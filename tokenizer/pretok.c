/*
 * pretok.c - the Split pre-tokenizers: Oniguruma patterns run by PCRE2.
 *
 * tokenizers compiles its patterns with Oniguruma; PCRE2 (UTF + UCP, JIT) has
 * the same syntax and leftmost-first backtracking semantics for what these
 * files use, with one difference: PCRE2's \s also matches U+180E (through
 * \h).  So \s and \S are rewritten to Oniguruma's set, Unicode White_Space.
 * Escapes whose meaning differs between the engines (\h, \w, \b, ...) are
 * refused.  Isolated behaviour: every match is a piece, and so is every
 * stretch between matches.
 */
#include <stdio.h>
#include <string.h>

#include "tok_internal.h"

#define WHITE_SPACE                                                                                \
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"    \
    "\\x{205f}\\x{3000}"

static int translate(mtok_buf *out, const char *p, const char *name, const char *where)
{
    bool in_class = false;
    int rc = 0;
    for (size_t i = 0; p[i] && !rc; i++) {
        char c = p[i];
        if (c == '\\') {
            char e = p[i + 1];
            if (!e) return mtok__fail(MTOK_EFORMAT, "%s: %s: pattern ends in '\\'", name, where);
            i++;
            if (e == 's') {
                rc = mtok__buf_puts(out, in_class ? WHITE_SPACE : "[" WHITE_SPACE "]");
            } else if (e == 'S' && !in_class) {
                rc = mtok__buf_puts(out, "[^" WHITE_SPACE "]");
            } else if (strchr("ShHwWbBRXKGz", e)) {
                return mtok__fail(MTOK_EUNSUPPORTED,
                                  "%s: %s: escape \\%c in a Split regex is not supported "
                                  "(Oniguruma and PCRE2 read it differently)",
                                  name, where, e);
            } else {
                char two[2] = {'\\', e};
                rc = mtok__buf_put(out, two, 2);
            }
            continue;
        }
        if (in_class) {
            if (c == '[')
                return mtok__fail(MTOK_EUNSUPPORTED,
                                  "%s: %s: nested character classes are not supported", name,
                                  where);
            if (c == ']') in_class = false;
            rc = mtok__buf_putc(out, c);
            continue;
        }
        if (c == '[') {
            in_class = true;
            rc = mtok__buf_putc(out, c);
            if (!rc && p[i + 1] == '^') rc = mtok__buf_putc(out, p[++i]);
            if (!rc && p[i + 1] == ']') rc = mtok__buf_puts(out, "\\]"), i++;
            continue;
        }
        rc = mtok__buf_putc(out, c);
    }
    return rc;
}

int mtok__compile_split(mtok *t, const char *pattern, const char *where)
{
    if (t->n_split == MTOK_MAX_SPLITS)
        return mtok__fail(MTOK_EUNSUPPORTED, "%s: %s: more than %d Split steps", t->name, where,
                          MTOK_MAX_SPLITS);
    mtok_buf pat = {0};
    int rc = translate(&pat, pattern, t->name, where);
    if (rc) {
        free(pat.p);
        return rc;
    }
    int err;
    PCRE2_SIZE off;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat.p, pat.len, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(pat.p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mtok__fail(MTOK_EUNSUPPORTED, "%s: %s: PCRE2 cannot compile the pattern: %s",
                          t->name, where, (char *)msg);
    }
    /* Without JIT (an architecture PCRE2 has none for) the interpreter runs. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    t->split[t->n_split++] = re;
    return 0;
}

static int split_level(mtok *t, size_t k, const char *s, size_t len, mtok_piece_fn emit, void *arg)
{
    if (!len) return 0;
    if (k >= t->n_split || k >= MTOK_MAX_SPLITS) return emit(t, s, len, arg);
    pcre2_code *re = t->split[k];
    size_t pos = 0, gap = 0;
    int rc;
    while (pos < len) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return mtok__fail(MTOK_EUNSUPPORTED, "%s: Split regex %zu failed at byte %zu: %s",
                              t->name, k, pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* an empty match splits nothing: step one character */
            int n;
            mtok__utf8_next(s + a, &n);
            pos = a + (size_t)n;
            continue;
        }
        if ((rc = split_level(t, k + 1, s + gap, a - gap, emit, arg))) return rc;
        if ((rc = split_level(t, k + 1, s + a, b - a, emit, arg))) return rc;
        pos = gap = b;
    }
    return split_level(t, k + 1, s + gap, len - gap, emit, arg);
}

int mtok__pretokenize(mtok *t, const char *s, size_t len, mtok_piece_fn emit, void *arg)
{
    return split_level(t, 0, s, len, emit, arg);
}
