/*
 * gguf_tok.c - the tokenizer of a GGUF file (llama.cpp's format): the
 * tokenizer.ggml.* metadata turned into the tokenizer.json that transformers'
 * GGUF loader builds from it, then loaded by mtok_load_json.
 *
 * Only the header and the key/values are read (from a read-only mapping; the
 * tensors are skipped), every count and length bounded by the bytes left in
 * the file.  The library does not link the kernels, so this reader is its
 * own; it knows GGUF versions 2 and 3, little-endian.
 *
 * What is built, as transformers' convert_gguf_tokenizer does for
 * tokenizer.ggml.model "gpt2" (byte-level BPE; other models are refused):
 * the vocabulary from tokenizer.ggml.tokens in order (a token with a
 * character outside the byte-level alphabet respelled as its UTF-8 bytes'
 * symbols), the merges from tokenizer.ggml.merges ("a b"), control tokens
 * (token_type 3, and the bos/eos/unknown/padding ids) as special added
 * tokens and user-defined ones (4) as plain added tokens, no normalizer,
 * a ByteLevel decoder, and bos/eos around a sequence when
 * tokenizer.ggml.add_bos_token / add_eos_token say so.  The pre-tokenizer
 * comes from tokenizer.ggml.pre, as llama.cpp reads it:
 *   gpt-2, gpt2                 GPT-2's regex (ByteLevel with use_regex);
 *   llama-bpe, llama3, llama-v3 Llama 3's split, then ByteLevel;
 *   qwen2                       Qwen2's split, then ByteLevel;
 *   smollm                      each digit alone, then GPT-2's regex: the
 *                               pre-tokenizer of SmolLM2's own tokenizer.json
 *                               (Digits, individual, then ByteLevel) and of
 *                               llama.cpp.  transformers' GGUF loader does not
 *                               know this name and falls back to GPT-2's
 *                               regex alone, which differs where whitespace
 *                               runs precede a digit ("a  1").
 * Any other name is refused, rather than tokenise differently.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok_internal.h"

enum {
    GV_U8,
    GV_I8,
    GV_U16,
    GV_I16,
    GV_U32,
    GV_I32,
    GV_F32,
    GV_BOOL,
    GV_STRING,
    GV_ARRAY,
    GV_U64,
    GV_I64,
    GV_F64,
    GV_N
};
static const unsigned char gv_size[GV_N] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct gkv {
    const char *key;
    size_t key_n;
    uint32_t type, atype; /* atype: element type of an array, else type */
    uint64_t count;       /* 1 unless an array */
    const unsigned char *val;
} gkv;

typedef struct gmeta {
    const char *path;
    void *map;
    size_t size;
    gkv *kv;
    size_t n_kv;
} gmeta;

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

typedef struct cur {
    const unsigned char *p, *end;
    const gmeta *g;
} cur;

static int short_file(const cur *c, const char *what)
{
    return mtok__fail(MTOK_EFORMAT, "%s: the file ends inside %s (byte %zu of %zu)", c->g->path,
                      what, (size_t)(c->p - (const unsigned char *)c->g->map), c->g->size);
}

static int rd_u32(cur *c, uint32_t *v, const char *what)
{
    if ((size_t)(c->end - c->p) < 4) return short_file(c, what);
    *v = le32(c->p);
    c->p += 4;
    return 0;
}

static int rd_u64(cur *c, uint64_t *v, const char *what)
{
    if ((size_t)(c->end - c->p) < 8) return short_file(c, what);
    *v = le64(c->p);
    c->p += 8;
    return 0;
}

/* A string: u64 length, bytes; *s points into the mapping. */
static int rd_str(cur *c, const char **s, size_t *n, const char *what)
{
    uint64_t len = 0;
    int rc = rd_u64(c, &len, what);
    if (rc) return rc;
    if (len > (size_t)(c->end - c->p))
        return mtok__fail(MTOK_EFORMAT,
                          "%s: the file ends inside %s (a string of %llu bytes, %zu left)",
                          c->g->path, what, (unsigned long long)len, (size_t)(c->end - c->p));
    *s = (const char *)c->p;
    *n = (size_t)len;
    c->p += len;
    return 0;
}

static int rd_kv(cur *c, gkv *kv)
{
    int rc = rd_str(c, &kv->key, &kv->key_n, "a metadata key");
    if (!rc) rc = rd_u32(c, &kv->type, "a metadata value type");
    if (rc) return rc;
    const char *path = c->g->path;
    int kn = (int)(kv->key_n < 80 ? kv->key_n : 80);
    kv->atype = kv->type;
    kv->count = 1;
    if (kv->type == GV_ARRAY && ((rc = rd_u32(c, &kv->atype, "an array's element type")) ||
                                 (rc = rd_u64(c, &kv->count, "an array's length"))))
        return rc;
    if (kv->type >= GV_N || kv->atype >= GV_N || kv->atype == GV_ARRAY)
        return mtok__fail(MTOK_EFORMAT, "%s: key '%.*s': value type %u/%u is not read", path, kn,
                          kv->key, kv->type, kv->atype);
    size_t left = (size_t)(c->end - c->p);
    kv->val = c->p;
    if (kv->atype == GV_STRING) {
        if (kv->count > left / 8)
            return mtok__fail(MTOK_EFORMAT,
                              "%s: key '%.*s': %llu strings cannot fit in the %zu "
                              "bytes left",
                              path, kn, kv->key, (unsigned long long)kv->count, left);
        for (uint64_t i = 0; i < kv->count; i++) {
            const char *s;
            size_t n;
            if ((rc = rd_str(c, &s, &n, "a metadata string"))) return rc;
        }
        return 0;
    }
    if (kv->count > left / gv_size[kv->atype])
        return mtok__fail(MTOK_EFORMAT,
                          "%s: key '%.*s': %llu values cannot fit in the %zu bytes "
                          "left",
                          path, kn, kv->key, (unsigned long long)kv->count, left);
    c->p += kv->count * gv_size[kv->atype];
    return 0;
}

static void gmeta_close(gmeta *g)
{
    if (g->map) munmap(g->map, g->size);
    free(g->kv);
}

/* Maps path and reads its key/values; on failure nothing needs closing. */
static int gmeta_open(gmeta *g, const char *path)
{
    memset(g, 0, sizeof *g);
    g->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mtok__fail(errno == ENOENT ? MTOK_ENOTFOUND : MTOK_ESYS, "%s: %s", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 24) {
        close(fd);
        return mtok__fail(MTOK_EFORMAT, "%s: not a GGUF file (too short or not a regular file)",
                          path);
    }
    g->size = (size_t)st.st_size;
    g->map = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        return mtok__fail(MTOK_ESYS, "%s: mmap: %s", path, strerror(errno));
    }
    const unsigned char *b = g->map;
    cur c = {b + 24, b + g->size, g};
    uint32_t version = le32(b + 4);
    uint64_t n_kv = le64(b + 16);
    int rc = 0;
    if (memcmp(b, "GGUF", 4))
        rc = mtok__fail(MTOK_EFORMAT, "%s: not a GGUF file (the first bytes are not \"GGUF\")",
                        path);
    else if (version == 0x02000000u || version == 0x03000000u)
        rc = mtok__fail(MTOK_EUNSUPPORTED, "%s: a big-endian GGUF file; only little-endian is read",
                        path);
    else if (version != 2 && version != 3)
        rc = mtok__fail(MTOK_EUNSUPPORTED, "%s: GGUF version %u; versions 2 and 3 are read", path,
                        version);
    else if (n_kv > (g->size - 24) / 13) /* a key/value takes at least 13 bytes */
        rc = mtok__fail(MTOK_EFORMAT, "%s: header: kv_count %llu is more than the file can hold",
                        path, (unsigned long long)n_kv);
    else if (!(g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv)))
        rc = mtok__fail(MTOK_ENOMEM, "out of memory");
    for (; !rc && g->n_kv < n_kv; g->n_kv++) rc = rd_kv(&c, &g->kv[g->n_kv]);
    if (rc) gmeta_close(g);
    return rc;
}

static const gkv *find(const gmeta *g, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_n == n && !memcmp(g->kv[i].key, key, n)) return &g->kv[i];
    return NULL;
}

/* A string key as (p, n); MTOK_ENOTFOUND without a message when absent. */
static int get_str(const gmeta *g, const char *key, const char **s, size_t *n)
{
    const gkv *kv = find(g, key);
    if (!kv) return MTOK_ENOTFOUND;
    if (kv->type != GV_STRING)
        return mtok__fail(MTOK_EFORMAT, "%s: key '%s' is not a string", g->path, key);
    *n = (size_t)le64(kv->val);
    *s = (const char *)kv->val + 8;
    return 0;
}

/* An unsigned 32-bit id key (u32 or i32 >= 0), or -1 when absent. */
static int get_id(const gmeta *g, const char *key, int64_t *id)
{
    const gkv *kv = find(g, key);
    *id = -1;
    if (!kv) return 0;
    if ((kv->type != GV_U32 && kv->type != GV_I32) ||
        (kv->type == GV_I32 && (int32_t)le32(kv->val) < 0))
        return mtok__fail(MTOK_EFORMAT, "%s: key '%s' is not a token id (u32)", g->path, key);
    *id = le32(kv->val);
    return 0;
}

static int get_bool(const gmeta *g, const char *key, bool *v)
{
    const gkv *kv = find(g, key);
    *v = false;
    if (!kv) return 0;
    if (kv->type != GV_BOOL)
        return mtok__fail(MTOK_EFORMAT, "%s: key '%s' is not a bool", g->path, key);
    *v = kv->val[0] != 0;
    return 0;
}

/* An array key of element type `type`; *kv NULL when absent and not required. */
static int get_array(const gmeta *g, const char *key, uint32_t type, bool required, const gkv **kv)
{
    *kv = find(g, key);
    if (!*kv)
        return required ? mtok__fail(MTOK_EFORMAT, "%s: key '%s' is missing", g->path, key) : 0;
    if ((*kv)->type != GV_ARRAY || (*kv)->atype != type)
        return mtok__fail(MTOK_EFORMAT, "%s: key '%s' is not an array of the expected type",
                          g->path, key);
    return 0;
}

/* ---- tokenizer.json ------------------------------------------------------ */

static const char LLAMA3_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The pre-tokenizers by llama.cpp name: a Split regex (NULL: none) and whether ByteLevel then
 * applies GPT-2's regex. */
static const struct {
    const char *name, *split;
    bool byte_regex;
} PRES[] = {
    {"gpt-2", NULL, true},
    {"gpt2", NULL, true},
    {"llama-bpe", LLAMA3_SPLIT, false},
    {"llama3", LLAMA3_SPLIT, false},
    {"llama-v3", LLAMA3_SPLIT, false},
    {"qwen2", QWEN2_SPLIT, false},
    {"smollm", "\\p{N}", true},
};

static int put_pre(mtok_buf *o, const gmeta *g)
{
    const char *pre;
    size_t n;
    int rc = get_str(g, "tokenizer.ggml.pre", &pre, &n);
    if (rc == MTOK_ENOTFOUND)
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: key 'tokenizer.ggml.pre' is missing: the pre-tokenizer is unknown",
                          g->path);
    if (rc) return rc;
    for (size_t i = 0; i < sizeof PRES / sizeof *PRES; i++) {
        if (strlen(PRES[i].name) != n || memcmp(PRES[i].name, pre, n)) continue;
        const char *bl = PRES[i].byte_regex ? "true" : "false";
        if (!PRES[i].split) {
            rc = mtok__buf_puts(o, "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
                                   "false,\"trim_offsets\":true,\"use_regex\":true},");
            return rc;
        }
        rc = mtok__buf_puts(o, "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{"
                               "\"type\":\"Split\",\"pattern\":{\"Regex\":");
        if (!rc) rc = mtok__pyjson_str(o, PRES[i].split, strlen(PRES[i].split));
        if (!rc)
            rc = mtok__buf_puts(o, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":"
                                   "\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
                                   "\"use_regex\":");
        if (!rc) rc = mtok__buf_puts(o, bl);
        return rc ? rc : mtok__buf_puts(o, "}]},");
    }
    return mtok__fail(MTOK_EUNSUPPORTED,
                      "%s: tokenizer.ggml.pre '%.*s' is not supported (gpt-2, llama-bpe, llama3, "
                      "llama-v3, qwen2, smollm are)",
                      g->path, (int)(n < 80 ? n : 80), pre);
}

/* 1 when every character of the valid UTF-8 s is one of the 256 byte-level symbols. */
static bool in_alphabet(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k;
        if (mtok__cp_to_byte(mtok__utf8_next(s + i, &k)) < 0) return false;
        i += (size_t)k;
    }
    return true;
}

/* The vocabulary string of token s: s itself, or its bytes' symbols (transformers'
 * byte_level_tokenizer respells tokens with characters outside the alphabet). */
static int put_token(mtok_buf *o, const char *s, size_t n)
{
    if (in_alphabet(s, n)) return mtok__pyjson_str(o, s, n);
    mtok_buf sp = {0};
    int rc = mtok__buf_reserve(&sp, 4 * n);
    for (size_t i = 0; i < n && !rc; i++)
        sp.len += (size_t)mtok__utf8_put(sp.p + sp.len, mtok__byte_to_cp((uint8_t)s[i]));
    if (!rc) rc = mtok__pyjson_str(o, sp.p, sp.len);
    free(sp.p);
    return rc;
}

typedef struct toks {
    const char **s;
    size_t *n;
    size_t count;
} toks;

/* The strings of an array key (pointers into the mapping), checked as valid UTF-8 without NUL. */
static int read_strings(const gmeta *g, const gkv *kv, const char *key, toks *t)
{
    t->count = (size_t)kv->count;
    t->s = malloc((t->count ? t->count : 1) * sizeof *t->s);
    t->n = malloc((t->count ? t->count : 1) * sizeof *t->n);
    if (!t->s || !t->n) return mtok__fail(MTOK_ENOMEM, "out of memory");
    cur c = {kv->val, (const unsigned char *)g->map + g->size, g};
    for (size_t i = 0; i < t->count; i++) {
        int rc = rd_str(&c, &t->s[i], &t->n[i], key);
        if (rc) return rc;
        if (mtok__utf8_check(t->s[i], t->n[i]) != t->n[i] || memchr(t->s[i], 0, t->n[i]))
            return mtok__fail(MTOK_EFORMAT, "%s: %s[%zu] is not valid UTF-8 text", g->path, key, i);
    }
    return 0;
}

static void free_strings(toks *t)
{
    free(t->s);
    free(t->n);
}

/* One added_tokens entry. */
static int put_added(mtok_buf *o, bool *first, size_t id, const char *s, size_t n, bool special)
{
    char head[64];
    snprintf(head, sizeof head, "%s{\"id\":%zu,\"content\":", *first ? "" : ",", id);
    *first = false;
    int rc = mtok__buf_puts(o, head);
    if (!rc) rc = mtok__pyjson_str(o, s, n);
    if (!rc)
        rc = mtok__buf_puts(o, special ? ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                                         "\"normalized\":false,\"special\":true}"
                                       : ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                                         "\"normalized\":false,\"special\":false}");
    return rc;
}

/* A TemplateProcessing step naming special token id (the token's string as its name). */
static int put_tpl_token(mtok_buf *o, const toks *tk, int64_t id)
{
    int rc = mtok__buf_puts(o, "{\"SpecialToken\":{\"id\":");
    if (!rc) rc = mtok__pyjson_str(o, tk->s[id], tk->n[id]);
    return rc ? rc : mtok__buf_puts(o, ",\"type_id\":0}}");
}

static int put_tpl_special(mtok_buf *o, const toks *tk, int64_t id, bool *first)
{
    char ids[48];
    int rc = mtok__buf_puts(o, *first ? "" : ",");
    *first = false;
    if (!rc) rc = mtok__pyjson_str(o, tk->s[id], tk->n[id]);
    if (!rc) rc = mtok__buf_puts(o, ":{\"id\":");
    if (!rc) rc = mtok__pyjson_str(o, tk->s[id], tk->n[id]);
    snprintf(ids, sizeof ids, ",\"ids\":[%lld],\"tokens\":[", (long long)id);
    if (!rc) rc = mtok__buf_puts(o, ids);
    if (!rc) rc = mtok__pyjson_str(o, tk->s[id], tk->n[id]);
    return rc ? rc : mtok__buf_puts(o, "]}");
}

/* post_processor: bos / eos around the sequence as add_bos_token / add_eos_token say. */
static int put_post(mtok_buf *o, const gmeta *g, const toks *tk, int64_t bos, int64_t eos)
{
    bool add_bos, add_eos;
    int rc = get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    if (!rc) rc = get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos);
    if (rc) return rc;
    if ((add_bos && bos < 0) || (add_eos && eos < 0))
        return mtok__fail(MTOK_EFORMAT, "%s: add_bos_token/add_eos_token set without the token id",
                          g->path);
    /* single: [bos] $A [eos]; pair: the same, then [bos] $B [eos] (type 1),
     * as transformers' converters write it (tokenizers needs both) */
    rc = mtok__buf_puts(o, "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[");
    for (int part = 0; part < 3 && !rc; part++) {
        if (part == 1) rc = mtok__buf_puts(o, "],\"pair\":[");
        if (part == 2) rc = mtok__buf_puts(o, ",");
        if (!rc && add_bos) rc = put_tpl_token(o, tk, bos);
        if (!rc) rc = mtok__buf_puts(o, add_bos ? "," : "");
        if (!rc)
            rc = mtok__buf_puts(o, part < 2 ? "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}"
                                            : "{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}");
        if (!rc && add_eos) rc = mtok__buf_puts(o, ",");
        if (!rc && add_eos) rc = put_tpl_token(o, tk, eos);
    }
    if (!rc) rc = mtok__buf_puts(o, "],\"special_tokens\":{");
    bool first = true;
    if (!rc && add_bos) rc = put_tpl_special(o, tk, bos, &first);
    if (!rc && add_eos && !(add_bos && eos == bos)) rc = put_tpl_special(o, tk, eos, &first);
    return rc ? rc : mtok__buf_puts(o, "}},");
}

/* The special ids named by keys (bos, eos, unknown, padding), -1 when absent. */
static const char *const SPECIAL_KEYS[] = {
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id"};

static int put_added_tokens(mtok_buf *o, const gmeta *g, const toks *tk, const int64_t *sp_ids)
{
    const gkv *types;
    int rc = get_array(g, "tokenizer.ggml.token_type", GV_I32, false, &types);
    if (rc) return rc;
    if (types && types->count != tk->count)
        return mtok__fail(MTOK_EFORMAT,
                          "%s: tokenizer.ggml.token_type has %llu entries for %zu "
                          "tokens",
                          g->path, (unsigned long long)types->count, tk->count);
    rc = mtok__buf_puts(o, "\"added_tokens\":[");
    bool first = true;
    for (size_t i = 0; i < tk->count && !rc; i++) {
        int32_t ty = types ? (int32_t)le32(types->val + 4 * i) : 1;
        bool named = false;
        for (int k = 0; k < 4; k++) named |= sp_ids[k] == (int64_t)i;
        bool alpha = in_alphabet(tk->s[i], tk->n[i]);
        if ((ty == 3 || named) && alpha && tk->n[i])
            rc = put_added(o, &first, i, tk->s[i], tk->n[i], true);
        else if (ty == 4 && alpha && tk->n[i])
            rc = put_added(o, &first, i, tk->s[i], tk->n[i], false);
    }
    return rc ? rc : mtok__buf_puts(o, "],");
}

static int put_model(mtok_buf *o, const gmeta *g, const toks *tk)
{
    const gkv *mk;
    toks mg = {0};
    int rc = get_array(g, "tokenizer.ggml.merges", GV_STRING, true, &mk);
    if (!rc) rc = read_strings(g, mk, "tokenizer.ggml.merges", &mg);
    if (!rc)
        rc = mtok__buf_puts(o, "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
                               "\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\","
                               "\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
                               "\"vocab\":{");
    for (size_t i = 0; i < tk->count && !rc; i++) {
        char id[32];
        if (i) rc = mtok__buf_putc(o, ',');
        if (!rc) rc = put_token(o, tk->s[i], tk->n[i]);
        snprintf(id, sizeof id, ":%zu", i);
        if (!rc) rc = mtok__buf_puts(o, id);
    }
    if (!rc) rc = mtok__buf_puts(o, "},\"merges\":[");
    for (size_t i = 0; i < mg.count && !rc; i++) {
        if (i) rc = mtok__buf_putc(o, ',');
        if (!rc) rc = mtok__pyjson_str(o, mg.s[i], mg.n[i]);
    }
    if (!rc) rc = mtok__buf_puts(o, "]}}");
    free_strings(&mg);
    return rc;
}

/* The tokenizer.json text for g's tokenizer. */
static int synthesise(mtok_buf *o, const gmeta *g)
{
    const char *model;
    size_t n;
    int rc = get_str(g, "tokenizer.ggml.model", &model, &n);
    if (rc == MTOK_ENOTFOUND)
        return mtok__fail(MTOK_EFORMAT, "%s: key 'tokenizer.ggml.model' is missing: no tokenizer",
                          g->path);
    if (rc) return rc;
    if (n != 4 || memcmp(model, "gpt2", 4))
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: tokenizer.ggml.model '%.*s' is not supported; only 'gpt2' "
                          "(byte-level BPE) is",
                          g->path, (int)(n < 80 ? n : 80), model);
    const gkv *tkv;
    toks tk = {0};
    int64_t sp[4];
    rc = get_array(g, "tokenizer.ggml.tokens", GV_STRING, true, &tkv);
    if (!rc) rc = read_strings(g, tkv, "tokenizer.ggml.tokens", &tk);
    for (int k = 0; k < 4 && !rc; k++) {
        rc = get_id(g, SPECIAL_KEYS[k], &sp[k]);
        if (!rc && sp[k] >= (int64_t)tk.count)
            rc = mtok__fail(MTOK_EFORMAT, "%s: %s %lld is not a token (%zu tokens)", g->path,
                            SPECIAL_KEYS[k], (long long)sp[k], tk.count);
    }
    if (!rc)
        rc = mtok__buf_puts(o, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
                               "\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\","
                               "\"add_prefix_space\":true,\"trim_offsets\":true,"
                               "\"use_regex\":true},");
    if (!rc) rc = put_pre(o, g);
    if (!rc) rc = put_added_tokens(o, g, &tk, sp);
    if (!rc) rc = put_post(o, g, &tk, sp[0], sp[1]);
    if (!rc) rc = put_model(o, g, &tk);
    free_strings(&tk);
    return rc;
}

int mtok_load_gguf(const char *path, mtok **out)
{
    if (!out || !path) return mtok__fail(MTOK_EINVAL, "mtok_load_gguf: NULL argument");
    *out = NULL;
    gmeta g;
    int rc = gmeta_open(&g, path);
    if (rc) return rc;
    mtok_buf json = {0};
    rc = synthesise(&json, &g);
    gmeta_close(&g);
    if (!rc) rc = mtok_load_json(json.p, json.len, path, out);
    free(json.p);
    return rc;
}

int mtok_gguf_special_ids(const char *path, int64_t *bos, int64_t *eos, int64_t *pad)
{
    if (!path || !bos || !eos || !pad)
        return mtok__fail(MTOK_EINVAL, "mtok_gguf_special_ids: NULL argument");
    *bos = *eos = *pad = -1;
    gmeta g;
    int rc = gmeta_open(&g, path);
    if (rc) return rc;
    const char *keys[3] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                           "tokenizer.ggml.padding_token_id"};
    int64_t *out[3] = {bos, eos, pad};
    for (int i = 0; i < 3 && !rc; i++) {
        rc = get_id(&g, keys[i], out[i]);
        if (rc == MTOK_ENOTFOUND) rc = 0, *out[i] = -1;
    }
    gmeta_close(&g);
    return rc;
}

int mtok_gguf_tokenizer_json(const char *path, char **json, size_t *len)
{
    if (!json || !path) return mtok__fail(MTOK_EINVAL, "mtok_gguf_tokenizer_json: NULL argument");
    *json = NULL;
    gmeta g;
    int rc = gmeta_open(&g, path);
    if (rc) return rc;
    mtok_buf b = {0};
    rc = synthesise(&b, &g);
    gmeta_close(&g);
    if (!rc) rc = mtok__buf_putc(&b, 0); /* NUL-terminated, not counted */
    if (rc) {
        free(b.p);
        return rc;
    }
    *json = b.p;
    if (len) *len = b.len - 1;
    return 0;
}

int mtok_gguf_chat_template(const char *path, char **tmpl)
{
    if (!tmpl || !path) return mtok__fail(MTOK_EINVAL, "mtok_gguf_chat_template: NULL argument");
    *tmpl = NULL;
    gmeta g;
    int rc = gmeta_open(&g, path);
    if (rc) return rc;
    const char *s;
    size_t n;
    rc = get_str(&g, "tokenizer.chat_template", &s, &n);
    if (rc == MTOK_ENOTFOUND)
        rc = 0;
    else if (!rc && !(*tmpl = malloc(n + 1)))
        rc = mtok__fail(MTOK_ENOMEM, "out of memory");
    else if (!rc) {
        memcpy(*tmpl, s, n);
        (*tmpl)[n] = 0;
    }
    gmeta_close(&g);
    return rc;
}
