/*
 * utf8.c - UTF-8 checking and repair, the byte-level alphabet, NFC and the
 * whitespace of Python's str.isspace.
 *
 * Repair follows Unicode's "maximal subpart" practice, as Python's
 * bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do: a
 * lead byte and the continuation bytes that could still be part of a valid
 * sequence are replaced by one U+FFFD; the byte that breaks it starts over.
 */
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <stdlib.h>

#include "tok_internal.h"

/* Length of the valid sequence at s[i..len), or -(bytes of the maximal
 * invalid subpart) when it is not valid. */
static int seq_len(const unsigned char *s, size_t i, size_t len)
{
    unsigned c = s[i];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F;
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F;
    else
        return -1;
    for (int k = 1; k <= need; k++) {
        if (i + k >= len) return -k;
        unsigned d = s[i + k];
        if (d < lo || d > hi) return -k;
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

size_t mtok__utf8_check(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII runs eight at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        int n = seq_len(u, i, len);
        if (n < 0) return i;
        i += (size_t)n;
    }
    return len;
}

int mtok__utf8_replace(mtok_buf *out, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, start = 0;
    int rc;
    while (i < len) {
        int n = seq_len(u, i, len);
        if (n > 0) {
            i += (size_t)n;
            continue;
        }
        if ((rc = mtok__buf_put(out, s + start, i - start))) return rc;
        if ((rc = mtok__buf_put(out, "\xEF\xBF\xBD", 3))) return rc;
        i += (size_t)-n;
        start = i;
    }
    return mtok__buf_put(out, s + start, len - start);
}

uint32_t mtok__utf8_next(const char *p, int *n)
{
    const unsigned char *s = (const unsigned char *)p;
    if (s[0] < 0x80) return *n = 1, s[0];
    if (s[0] < 0xE0) return *n = 2, ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    if (s[0] < 0xF0) return *n = 3, ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return *n = 4,
           ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

int mtok__utf8_put(char *d, uint32_t cp)
{
    if (cp < 0x80) return d[0] = (char)cp, 1;
    if (cp < 0x800) return d[0] = (char)(0xC0 | (cp >> 6)), d[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2: printable Latin-1 bytes stand for themselves; the other 68 bytes
 * take the code points 256, 257, ... in byte order. */
static bool printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t mtok__byte_to_cp(uint8_t b)
{
    if (printable(b)) return b;
    uint32_t n = 0;
    for (unsigned k = 0; k < b; k++) n += !printable(k);
    return 256 + n;
}

int mtok__cp_to_byte(uint32_t cp)
{
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (unsigned k = 0; k < 256; k++)
        if (!printable(k) && n-- == 0) return (int)k;
    return -1;
}

int mtok__nfc(mtok_buf *out, const char *s, size_t len)
{
    /* Below U+0300 (lead bytes under 0xCC) nothing composes or decomposes. */
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0xCC) i++;
    if (i == len) return mtok__buf_put(out, s, len);
    if (len > INT32_MAX / 2) return mtok__fail(MTOK_EINVAL, "NFC: text of %zu bytes too long", len);
    UErrorCode st = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&st);
    if (U_FAILURE(st)) return mtok__fail(MTOK_ESYS, "ICU NFC: %s", u_errorName(st));
    int32_t n16 = 0;
    u_strFromUTF8(NULL, 0, &n16, s, (int32_t)len, &st);
    st = U_ZERO_ERROR;
    /* NFC grows text at most threefold (Unicode's stated bound). */
    UChar *a = malloc(sizeof(UChar) * ((size_t)n16 + 1) * 4);
    if (!a) return mtok__fail(MTOK_ENOMEM, "out of memory normalising %zu bytes", len);
    UChar *b = a + n16 + 1;
    int32_t cap_b = (int32_t)(((size_t)n16 + 1) * 3);
    u_strFromUTF8(a, n16 + 1, &n16, s, (int32_t)len, &st);
    int32_t nb = U_SUCCESS(st) ? unorm2_normalize(nfc, a, n16, b, cap_b, &st) : 0;
    int rc = 0;
    if (U_FAILURE(st)) {
        rc = mtok__fail(MTOK_ESYS, "ICU NFC: %s", u_errorName(st));
    } else {
        int32_t n8 = 0;
        u_strToUTF8(NULL, 0, &n8, b, nb, &st);
        st = U_ZERO_ERROR;
        if (!(rc = mtok__buf_reserve(out, (size_t)n8 + 1))) {
            u_strToUTF8(out->p + out->len, n8 + 1, &n8, b, nb, &st);
            if (U_FAILURE(st))
                rc = mtok__fail(MTOK_ESYS, "ICU to UTF-8: %s", u_errorName(st));
            else
                out->len += (size_t)n8, out->p[out->len] = 0;
        }
    }
    free(a);
    return rc;
}

bool mtok__py_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}
