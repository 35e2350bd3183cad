/*
 * pyjson.c - JSON re-serialised the way Python's json.dumps writes it.
 *
 * Chat templates print tool definitions and tool-call arguments with
 * transformers' tojson filter, json.dumps(x, ensure_ascii=False, indent=...)
 * of the value json.loads made.  So the JSON text a caller gives is read
 * here token by token and written back as Python would: key order kept,
 * separators ", " and ": " (or "," and ": " with an indent), strings with
 * only '"', '\\' and control characters escaped, integers as written, other
 * numbers as Python's float repr (shortest round-trip digits; exponent form
 * below 1e-4 and from 1e16).  Values Python would write differently from any
 * JSON (NaN, infinities, lone surrogates) are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct rd {
    const char *s;
    size_t len, i;
    const char *what;
} rd;

static int bad(const rd *r, const char *msg)
{
    return mtok__fail(MTOK_EINVAL, "%s: JSON: %s at byte %zu", r->what, msg, r->i);
}

static void ws(rd *r)
{
    while (r->i < r->len && strchr(" \t\r\n", r->s[r->i]) && r->s[r->i]) r->i++;
}

static int hex4(rd *r, uint32_t *v)
{
    if (r->i + 4 > r->len) return bad(r, "short \\u escape");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->s[r->i++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return bad(r, "bad \\u escape");
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Reads a JSON string (r->i at the quote) into out as UTF-8. */
static int read_string(rd *r, mtok_buf *out)
{
    r->i++;
    int rc;
    while (r->i < r->len) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            return 0;
        }
        if (c < 0x20) return bad(r, "control character in a string");
        if (c != '\\') {
            if ((rc = mtok__buf_putc(out, (char)c))) return rc;
            r->i++;
            continue;
        }
        if (++r->i >= r->len) break;
        char e = r->s[r->i++];
        const char *map = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
        if (e == 'u') {
            uint32_t cp, lo;
            if ((rc = hex4(r, &cp))) return rc;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (r->i + 2 > r->len || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u')
                    return bad(r, "lone surrogate (Python would keep it; UTF-8 cannot)");
                r->i += 2;
                if ((rc = hex4(r, &lo))) return rc;
                if (lo < 0xDC00 || lo > 0xDFFF) return bad(r, "lone surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return bad(r, "lone surrogate");
            }
            char u[4];
            if ((rc = mtok__buf_put(out, u, (size_t)mtok__utf8_put(u, cp)))) return rc;
        } else if (map && ((map - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2 == 0)) {
            if ((rc = mtok__buf_putc(out, map[1]))) return rc;
        } else {
            return bad(r, "bad escape");
        }
    }
    return bad(r, "unterminated string");
}

int mtok__pyjson_str(mtok_buf *out, const char *s, size_t len)
{
    int rc = mtok__buf_putc(out, '"');
    for (size_t i = 0; i < len && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"':
            rc = mtok__buf_puts(out, "\\\"");
            break;
        case '\\':
            rc = mtok__buf_puts(out, "\\\\");
            break;
        case '\n':
            rc = mtok__buf_puts(out, "\\n");
            break;
        case '\r':
            rc = mtok__buf_puts(out, "\\r");
            break;
        case '\t':
            rc = mtok__buf_puts(out, "\\t");
            break;
        case '\b':
            rc = mtok__buf_puts(out, "\\b");
            break;
        case '\f':
            rc = mtok__buf_puts(out, "\\f");
            break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                rc = mtok__buf_puts(out, esc);
            } else {
                rc = mtok__buf_putc(out, (char)c);
            }
        }
    }
    return rc ? rc : mtok__buf_putc(out, '"');
}

/* Python's repr of a finite double. */
static int float_repr(mtok_buf *out, double d)
{
    char tmp[40], digits[24];
    int p;
    for (p = 0; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    const char *q = tmp;
    int rc = 0;
    if (*q == '-') rc = mtok__buf_putc(out, '-'), q++;
    size_t nd = 0;
    for (; *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int x = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (rc) return rc;
    if (x < -4 || x >= 16) {
        char e[16];
        rc = mtok__buf_putc(out, digits[0]);
        if (!rc && nd > 1) rc = mtok__buf_putc(out, '.');
        if (!rc && nd > 1) rc = mtok__buf_put(out, digits + 1, nd - 1);
        snprintf(e, sizeof e, "e%c%02d", x < 0 ? '-' : '+', abs(x));
        return rc ? rc : mtok__buf_puts(out, e);
    }
    if (x < 0) {
        rc = mtok__buf_puts(out, "0.");
        for (int k = -1; k > x && !rc; k--) rc = mtok__buf_putc(out, '0');
        return rc ? rc : mtok__buf_put(out, digits, nd);
    }
    for (int k = 0; k <= x && !rc; k++) rc = mtok__buf_putc(out, (size_t)k < nd ? digits[k] : '0');
    if (rc) return rc;
    rc = mtok__buf_putc(out, '.');
    if (!rc)
        rc = (size_t)x + 1 < nd ? mtok__buf_put(out, digits + x + 1, nd - (size_t)x - 1)
                                : mtok__buf_putc(out, '0');
    return rc;
}

static int number(rd *r, mtok_buf *out)
{
    size_t a = r->i;
    bool is_float = false;
    if (r->i < r->len && r->s[r->i] == '-') r->i++;
    while (r->i < r->len && strchr("0123456789.eE+-", r->s[r->i]) && r->s[r->i]) {
        if (strchr(".eE", r->s[r->i])) is_float = true;
        r->i++;
    }
    size_t n = r->i - a;
    char tmp[512];
    if (n == 0 || n >= sizeof tmp) return bad(r, "bad number");
    memcpy(tmp, r->s + a, n);
    tmp[n] = 0;
    char *end;
    double d = strtod(tmp, &end);
    if (*end) return bad(r, "bad number");
    if (!is_float) {
        if (strcmp(tmp, "-0") == 0) return mtok__buf_putc(out, '0');
        return mtok__buf_put(out, tmp, n);
    }
    if (!isfinite(d)) return bad(r, "number out of double range (Python would write Infinity)");
    return float_repr(out, d);
}

static int newline(mtok_buf *out, int indent, int depth)
{
    int rc = mtok__buf_putc(out, '\n');
    for (int k = 0; k < indent * depth && !rc; k++) rc = mtok__buf_putc(out, ' ');
    return rc;
}

static int value(rd *r, mtok_buf *out, int indent, int depth)
{
    ws(r);
    if (r->i >= r->len) return bad(r, "unexpected end");
    if (depth > 256) return bad(r, "nested too deeply");
    char c = r->s[r->i];
    int rc;
    if (c == '"') {
        mtok_buf s = {0};
        rc = read_string(r, &s);
        if (!rc) rc = mtok__pyjson_str(out, s.p ? s.p : "", s.len);
        free(s.p);
        return rc;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->i++;
        ws(r);
        if ((rc = mtok__buf_putc(out, c))) return rc;
        if (r->i < r->len && r->s[r->i] == close) {
            r->i++;
            return mtok__buf_putc(out, close);
        }
        for (bool first = true;; first = false) {
            if (!first && (rc = mtok__buf_puts(out, indent >= 0 ? "," : ", "))) return rc;
            if (indent >= 0 && (rc = newline(out, indent, depth + 1))) return rc;
            ws(r);
            if (c == '{') {
                if (r->i >= r->len || r->s[r->i] != '"') return bad(r, "expected a key");
                if ((rc = value(r, out, indent, depth + 1))) return rc;
                ws(r);
                if (r->i >= r->len || r->s[r->i] != ':') return bad(r, "expected ':'");
                r->i++;
                if ((rc = mtok__buf_puts(out, ": "))) return rc;
            }
            if ((rc = value(r, out, indent, depth + 1))) return rc;
            ws(r);
            if (r->i < r->len && r->s[r->i] == ',') {
                r->i++;
                continue;
            }
            if (r->i < r->len && r->s[r->i] == close) {
                r->i++;
                if (indent >= 0 && (rc = newline(out, indent, depth))) return rc;
                return mtok__buf_putc(out, close);
            }
            return bad(r, "expected ',' or a closing bracket");
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if (r->len - r->i >= n && memcmp(r->s + r->i, words[k], n) == 0) {
            r->i += n;
            return mtok__buf_put(out, words[k], n);
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(r, out);
    return bad(r, "unexpected character");
}

int mtok__pyjson(mtok_buf *out, const char *json, size_t len, int indent, const char *what)
{
    rd r = {json, len, 0, what};
    int rc = value(&r, out, indent, 0);
    if (rc) return rc;
    ws(&r);
    return r.i == len ? 0 : bad(&r, "trailing characters");
}
