/*
 * encode.c - text to ids and ids to text, in tokenizers' order of steps.
 *
 * Encoding: (1) check UTF-8 (or repair it on request); (2) cut out added
 * tokens whose `normalized` is false, matched on the raw text, leftmost then
 * longest (tokenizers' aho-corasick LeftmostLongest); (3) normalise each
 * stretch between them (NFC); (4) cut out added tokens whose `normalized` is
 * true, on the normalised text; (5) pre-tokenize each remaining stretch with
 * the Split regexes; (6) BPE each piece; (7) with MTOK_ADD_SPECIAL, the
 * post-processor's ids around the whole.
 *
 * Decoding: each id's vocabulary string is mapped back through the
 * byte-level alphabet (a string with a character outside it, an added
 * token's, say, is taken as its own UTF-8 bytes, as tokenizers' ByteLevel
 * decoder does); the bytes are then repaired to UTF-8 unless
 * MTOK_DECODE_BYTES asks for them raw.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct out_ids {
    int32_t *ids;
    size_t n, cap;
} out_ids;

static int push(out_ids *o, const int32_t *ids, size_t k)
{
    if (o->n + k > o->cap) {
        size_t c = o->cap ? o->cap * 2 : 256;
        while (c < o->n + k) c *= 2;
        int32_t *p = realloc(o->ids, c * sizeof *p);
        if (!p) return mtok__fail(MTOK_ENOMEM, "out of memory for %zu ids", c);
        o->ids = p, o->cap = c;
    }
    if (k) memcpy(o->ids + o->n, ids, k * sizeof *ids);
    o->n += k;
    return 0;
}

static int piece(mtok *t, const char *s, size_t len, void *arg)
{
    out_ids *o = arg;
    return mtok__bpe(t, s, len, &o->ids, &o->n, &o->cap);
}

/* The longest added token of class `normalized` at s[i], or NULL. */
static const mtok_added *added_at(const mtok *t, bool normalized, const char *s, size_t i,
                                  size_t len)
{
    if (!t->added_first[normalized][(unsigned char)s[i]]) return NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        const mtok_added *a = &t->added[k];
        if (a->normalized == normalized && a->len <= len - i && a->content[0] == s[i] &&
            memcmp(a->content, s + i, a->len) == 0)
            return a;
    }
    return NULL;
}

static int encode_normalized(mtok *t, const char *s, size_t len, out_ids *o)
{
    if (!t->has_normalized_added) return mtok__pretokenize(t, s, len, piece, o);
    size_t start = 0;
    int rc;
    for (size_t i = 0; i < len; i++) {
        const mtok_added *a = added_at(t, true, s, i, len);
        if (!a) continue;
        if ((rc = mtok__pretokenize(t, s + start, i - start, piece, o))) return rc;
        if ((rc = push(o, &a->id, 1))) return rc;
        i += a->len - 1;
        start = i + 1;
    }
    return mtok__pretokenize(t, s + start, len - start, piece, o);
}

static int encode_stretch(mtok *t, const char *s, size_t len, out_ids *o)
{
    if (!len) return 0;
    if (!t->nfc) return encode_normalized(t, s, len, o);
    t->norm.len = 0;
    int rc = mtok__nfc(&t->norm, s, len);
    return rc ? rc : encode_normalized(t, t->norm.p, t->norm.len, o);
}

static int encode_text(mtok *t, const char *s, size_t len, out_ids *o)
{
    size_t start = 0;
    int rc;
    for (size_t i = 0; i < len; i++) {
        const mtok_added *a = added_at(t, false, s, i, len);
        if (!a) continue;
        if ((rc = encode_stretch(t, s + start, i - start, o))) return rc;
        if ((rc = push(o, &a->id, 1))) return rc;
        i += a->len - 1;
        start = i + 1;
    }
    return encode_stretch(t, s + start, len - start, o);
}

int mtok_encode(mtok *t, const char *text, size_t len, unsigned flags, int32_t **ids, size_t *n)
{
    if (!ids || !n) return mtok__fail(MTOK_EINVAL, "mtok_encode: ids or n is NULL");
    *ids = NULL, *n = 0;
    if (!t || (!text && len)) return mtok__fail(MTOK_EINVAL, "mtok_encode: NULL argument");
    if (flags & ~(unsigned)(MTOK_ADD_SPECIAL | MTOK_UTF8_REPLACE))
        return mtok__fail(MTOK_EINVAL, "mtok_encode: unknown flags 0x%x", flags);
    mtok_buf fixed = {0};
    size_t bad = mtok__utf8_check(text, len);
    int rc = 0;
    if (bad != len) {
        if (!(flags & MTOK_UTF8_REPLACE))
            return mtok__fail(MTOK_EINVAL,
                              "mtok_encode: text is not UTF-8 at byte %zu (0x%02X); tokenizers "
                              "takes only valid text (MTOK_UTF8_REPLACE substitutes U+FFFD)",
                              bad, (unsigned char)text[bad]);
        if ((rc = mtok__utf8_replace(&fixed, text, len))) return rc;
        text = fixed.p, len = fixed.len;
    }
    out_ids o = {0};
    if (flags & MTOK_ADD_SPECIAL) rc = push(&o, t->tpl_pre, t->n_pre);
    if (!rc) rc = encode_text(t, text ? text : "", len, &o);
    if (!rc && (flags & MTOK_ADD_SPECIAL)) rc = push(&o, t->tpl_post, t->n_post);
    free(fixed.p);
    if (rc) {
        free(o.ids);
        return rc;
    }
    *ids = o.ids, *n = o.n;
    return 0;
}

/* Appends the bytes a vocabulary string stands for. */
static int token_to_bytes(mtok_buf *out, const char *s)
{
    size_t mark = out->len;
    for (const char *p = s; *p;) {
        int k;
        int b = mtok__cp_to_byte(mtok__utf8_next(p, &k));
        if (b < 0) { /* not byte-level: the string's own bytes */
            out->len = mark;
            return mtok__buf_puts(out, s);
        }
        int rc = mtok__buf_putc(out, (char)b);
        if (rc) return rc;
        p += k;
    }
    return 0;
}

int mtok_decode(const mtok *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                size_t *len)
{
    if (!text) return mtok__fail(MTOK_EINVAL, "mtok_decode: text is NULL");
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return mtok__fail(MTOK_EINVAL, "mtok_decode: NULL argument");
    if (flags & ~(unsigned)(MTOK_SKIP_SPECIAL | MTOK_DECODE_BYTES))
        return mtok__fail(MTOK_EINVAL, "mtok_decode: unknown flags 0x%x", flags);
    mtok_buf raw = {0};
    int rc = mtok__buf_reserve(&raw, n * 4);
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= t->n_ids || !t->id_str[id]) {
            rc = mtok__fail(MTOK_EINVAL,
                            "mtok_decode: id %d at position %zu is not in the vocabulary", id, i);
            break;
        }
        if ((flags & MTOK_SKIP_SPECIAL) && t->is_special[id]) continue;
        rc = token_to_bytes(&raw, t->id_str[id]);
    }
    if (!rc && !(flags & MTOK_DECODE_BYTES) && mtok__utf8_check(raw.p, raw.len) != raw.len) {
        mtok_buf fixed = {0};
        rc = mtok__utf8_replace(&fixed, raw.p, raw.len);
        free(raw.p);
        raw = fixed;
    }
    if (!rc) rc = mtok__buf_put(&raw, "", 0); /* NUL-terminated even when empty */
    if (rc) {
        free(raw.p);
        return rc;
    }
    *text = raw.p;
    if (len) *len = raw.len;
    return 0;
}
