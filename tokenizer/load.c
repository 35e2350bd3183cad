/*
 * load.c - reads a tokenizer.json into an mtok, refusing what it cannot
 * reproduce exactly.
 *
 * Accepted: model BPE (no dropout, no byte fallback, no subword prefix or
 * suffix; a byte whose symbol the vocabulary lacks is skipped, as tokenizers
 * does without an unk token); normalizer null,
 * NFC or a Sequence of NFC; pre-tokenizer ByteLevel, or a Sequence of Split
 * (Regex, Isolated, not inverted) steps ending with ByteLevel, never with a
 * prefix space; decoder ByteLevel; post-processor ByteLevel,
 * TemplateProcessing or a Sequence of them; added tokens without lstrip,
 * rstrip or single_word.  That covers the files of GPT-2, Llama 3, Qwen2 and
 * Qwen3.  Every refusal names the JSON path and what was found there.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* GPT-2's pattern, which tokenizers' ByteLevel uses when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *type_of(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "(none)";
}

static bool is_true(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static bool null_or_empty(const cJSON *v)
{
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && v->valuestring[0] == 0);
}

/* A vocabulary string to the bytes it stands for: 1, or 0 when a character
 * is not one of the 256 byte-level symbols, or MTOK_ENOMEM. */
static int token_bytes(const char *s, mtok_buf *out)
{
    out->len = 0;
    int rc = mtok__buf_reserve(out, strlen(s)); /* never more bytes than that */
    if (rc) return rc;
    while (*s) {
        int n;
        int b = mtok__cp_to_byte(mtok__utf8_next(s, &n));
        if (b < 0) return 0;
        out->p[out->len++] = (char)b;
        s += n;
    }
    return 1;
}

static int load_normalizer(mtok *t, const cJSON *n, const char *path)
{
    if (!n || cJSON_IsNull(n)) return 0;
    const char *ty = type_of(n);
    if (strcmp(ty, "NFC") == 0) {
        t->nfc = true;
        return 0;
    }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
        {
            int rc = load_normalizer(t, e, path);
            if (rc) return rc;
        }
        return 0;
    }
    return mtok__fail(MTOK_EUNSUPPORTED,
                      "%s: normalizer: type '%s' is not supported (only NFC, as Qwen2 uses)",
                      t->name, ty);
}

static int load_byte_level(mtok *t, const cJSON *p, const char *path)
{
    if (is_true(p, "add_prefix_space"))
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: %s: ByteLevel with add_prefix_space is not supported", t->name,
                          path);
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    if (!ur || cJSON_IsTrue(ur)) return mtok__compile_split(t, GPT2_PATTERN, path);
    return 0;
}

static int load_split(mtok *t, const cJSON *p, const char *path)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(re))
        return mtok__fail(MTOK_EUNSUPPORTED, "%s: %s.pattern: only a Regex pattern is supported",
                          t->name, path);
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 || is_true(p, "invert"))
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: %s: only behavior Isolated without invert is supported (found %s)",
                          t->name, path, cJSON_IsString(beh) ? beh->valuestring : "none");
    return mtok__compile_split(t, re->valuestring, path);
}

static int load_pre_tokenizer(mtok *t, const cJSON *p)
{
    const char *ty = type_of(p);
    if (strcmp(ty, "ByteLevel") == 0) return load_byte_level(t, p, "pre_tokenizer");
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        int n = cJSON_GetArraySize(list), i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, list)
        {
            char path[64];
            snprintf(path, sizeof path, "pre_tokenizer.pretokenizers[%d]", i);
            const char *ety = type_of(e);
            int rc;
            if (strcmp(ety, "Split") == 0 && i < n - 1)
                rc = load_split(t, e, path);
            else if (strcmp(ety, "ByteLevel") == 0 && i == n - 1)
                rc = load_byte_level(t, e, path);
            else
                rc = mtok__fail(MTOK_EUNSUPPORTED,
                                "%s: %s: pre-tokenizer '%s' is not supported here (only Split "
                                "steps followed by one ByteLevel)",
                                t->name, path, ety);
            if (rc) return rc;
            i++;
        }
        if (n > 0) return 0;
    }
    return mtok__fail(MTOK_EUNSUPPORTED,
                      "%s: pre_tokenizer: type '%s' is not supported; only byte-level BPE "
                      "(ByteLevel, or Split steps then ByteLevel) is",
                      t->name, ty);
}

static int append_ids(int32_t **arr, size_t *n, const cJSON *ids)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, ids)
    {
        int32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
        if (!p) return mtok__fail(MTOK_ENOMEM, "out of memory");
        *arr = p;
        p[(*n)++] = (int32_t)e->valuedouble;
    }
    return 0;
}

static int check_ids(const mtok *t, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids)
            return mtok__fail(MTOK_EFORMAT, "%s: post_processor: special token id %d out of range",
                              t->name, ids[i]);
    return 0;
}

static int load_template(mtok *t, const cJSON *p)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    bool after = false;
    const cJSON *e;
    t->n_pre = t->n_post = 0;
    cJSON_ArrayForEach(e, single)
    {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (sq) {
            after = true;
            continue;
        }
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
        const cJSON *tok =
            cJSON_IsString(id) ? cJSON_GetObjectItemCaseSensitive(specials, id->valuestring) : NULL;
        if (!tok)
            return mtok__fail(MTOK_EFORMAT,
                              "%s: post_processor.single: a special token missing from "
                              "special_tokens",
                              t->name);
        int rc =
            after
                ? append_ids(&t->tpl_post, &t->n_post, cJSON_GetObjectItemCaseSensitive(tok, "ids"))
                : append_ids(&t->tpl_pre, &t->n_pre, cJSON_GetObjectItemCaseSensitive(tok, "ids"));
        if (rc) return rc;
    }
    int rc = check_ids(t, t->tpl_pre, t->n_pre);
    return rc ? rc : check_ids(t, t->tpl_post, t->n_post);
}

static int load_post(mtok *t, const cJSON *p)
{
    if (!p || cJSON_IsNull(p)) return 0;
    const char *ty = type_of(p);
    if (strcmp(ty, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(ty, "TemplateProcessing") == 0) return load_template(t, p);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors"))
        {
            int rc = load_post(t, e);
            if (rc) return rc;
        }
        return 0;
    }
    return mtok__fail(MTOK_EUNSUPPORTED,
                      "%s: post_processor: type '%s' is not supported (ByteLevel, "
                      "TemplateProcessing, Sequence are)",
                      t->name, ty);
}

static int load_decoder(mtok *t, const cJSON *d)
{
    const char *ty = type_of(d);
    if (strcmp(ty, "ByteLevel") == 0) return 0;
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (cJSON_GetArraySize(list) == 1) return load_decoder(t, cJSON_GetArrayItem(list, 0));
    }
    return mtok__fail(MTOK_EUNSUPPORTED, "%s: decoder: type '%s' is not supported (only ByteLevel)",
                      t->name, ty);
}

static int set_id_str(mtok *t, int32_t id, const char *s)
{
    if (id < 0 || (size_t)id >= t->n_ids)
        return mtok__fail(MTOK_EFORMAT, "%s: token '%s' has id %d out of range", t->name, s, id);
    if (t->id_str[id]) return 0;
    if (!(t->id_str[id] = strdup(s))) return mtok__fail(MTOK_ENOMEM, "out of memory");
    return 0;
}

static int load_vocab(mtok *t, const cJSON *vocab, const cJSON *added)
{
    int rc;
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX - 1)
            return mtok__fail(MTOK_EFORMAT, "%s: model.vocab[\"%s\"]: not an id", t->name,
                              e->string);
        if ((size_t)e->valuedouble + 1 > n) n = (size_t)e->valuedouble + 1;
    }
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1)
            return mtok__fail(MTOK_EFORMAT, "%s: added_tokens: an entry without a valid id",
                              t->name);
        if ((size_t)id->valuedouble + 1 > n) n = (size_t)id->valuedouble + 1;
    }
    t->n_ids = n;
    t->id_str = calloc(n ? n : 1, sizeof *t->id_str);
    t->is_special = calloc(n ? n : 1, sizeof *t->is_special);
    if (!t->id_str || !t->is_special) return mtok__fail(MTOK_ENOMEM, "out of memory");
    if ((rc = mtok__strmap_init(&t->vocab, n))) return rc;
    mtok_buf b = {0};
    cJSON_ArrayForEach(e, vocab)
    {
        int32_t id = (int32_t)e->valuedouble;
        if ((rc = set_id_str(t, id, e->string))) break;
        int k = token_bytes(e->string, &b);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k && b.len && (rc = mtok__strmap_put(&t->vocab, b.p, b.len, id))) break;
    }
    free(b.p);
    if (rc) return rc;
    /* A byte without its symbol (-1) is skipped by BPE, as tokenizers does without an unk
     * token (bpe.c). */
    for (int c = 0; c < 256; c++) {
        char one = (char)c;
        t->byte_id[c] = mtok__strmap_get(&t->vocab, &one, 1);
    }
    return 0;
}

static int merge_parts(const cJSON *m, const char **a, const char **b, char *tmp, size_t cap)
{
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y)) return -1;
        *a = x->valuestring, *b = y->valuestring;
        return 0;
    }
    if (!cJSON_IsString(m)) return -1;
    size_t len = strlen(m->valuestring);
    const char *sp = strchr(m->valuestring, ' ');
    if (!sp || strchr(sp + 1, ' ') || len + 1 > cap) return -1;
    memcpy(tmp, m->valuestring, len + 1);
    tmp[sp - m->valuestring] = 0;
    *a = tmp, *b = tmp + (sp - m->valuestring) + 1;
    return 0;
}

static int load_merges(mtok *t, const cJSON *merges)
{
    int n = cJSON_GetArraySize(merges), rank = 0, rc;
    if ((rc = mtok__pairmap_init(&t->merges, (size_t)n + 1))) return rc;
    mtok_buf ba = {0}, bb = {0};
    char tmp[1024];
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        const char *a, *b;
        int32_t ia = -1, ib = -1, inew = -1;
        int ka = 0, kb = 0;
        if (merge_parts(m, &a, &b, tmp, sizeof tmp) == 0) {
            ka = token_bytes(a, &ba);
            kb = ka > 0 ? token_bytes(b, &bb) : 0;
        }
        if (ka < 0 || kb < 0) {
            rc = ka < 0 ? ka : kb;
            break;
        }
        if (ka && kb) {
            ia = mtok__strmap_get(&t->vocab, ba.p, ba.len);
            ib = mtok__strmap_get(&t->vocab, bb.p, bb.len);
            if ((rc = mtok__buf_put(&ba, bb.p, bb.len))) break;
            inew = mtok__strmap_get(&t->vocab, ba.p, ba.len);
        }
        if (ia < 0 || ib < 0 || inew < 0) {
            rc = mtok__fail(MTOK_EFORMAT,
                            "%s: model.merges[%d]: not a pair of vocabulary tokens whose "
                            "concatenation is one",
                            t->name, rank);
            break;
        }
        if ((rc = mtok__pairmap_put(&t->merges, ia, ib, rank, inew))) break;
        rank++;
    }
    free(ba.p);
    free(bb.p);
    return rc;
}

static int cmp_added(const void *x, const void *y)
{
    const mtok_added *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id - b->id;
}

static int load_added(mtok *t, const cJSON *added)
{
    int n = cJSON_GetArraySize(added), i = 0, rc;
    t->added = calloc(n ? (size_t)n : 1, sizeof *t->added);
    if (!t->added) return mtok__fail(MTOK_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0] ||
            mtok__utf8_check(c->valuestring, strlen(c->valuestring)) != strlen(c->valuestring))
            return mtok__fail(MTOK_EFORMAT, "%s: added_tokens[%d]: no valid content", t->name, i);
        if (is_true(e, "single_word") || is_true(e, "lstrip") || is_true(e, "rstrip"))
            return mtok__fail(MTOK_EUNSUPPORTED,
                              "%s: added_tokens[%d] ('%s'): single_word, lstrip and rstrip are "
                              "not supported",
                              t->name, i, c->valuestring);
        mtok_added *a = &t->added[t->n_added++];
        if (!(a->content = strdup(c->valuestring)) || !(a->orig = strdup(c->valuestring)))
            return mtok__fail(MTOK_ENOMEM, "out of memory");
        a->len = strlen(a->content);
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->special = is_true(e, "special");
        a->normalized = is_true(e, "normalized");
        t->is_special[a->id] = a->special;
        i++;
    }
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    mtok_buf nb = {0};
    for (size_t k = 0; k < t->n_added; k++) {
        mtok_added *a = &t->added[k];
        if (a->normalized && t->nfc) {
            /* tokenizers normalises the content of a normalized token */
            nb.len = 0;
            if ((rc = mtok__nfc(&nb, a->content, a->len))) break;
            char *p = realloc(a->content, nb.len + 1);
            if (!p) {
                rc = mtok__fail(MTOK_ENOMEM, "out of memory");
                break;
            }
            memcpy(p, nb.p, nb.len + 1);
            a->content = p, a->len = nb.len;
        }
        /* tokenizers' id_to_token, and so decode, give an added token's
         * (normalised) content, before the model's string for that id. */
        free(t->id_str[a->id]);
        t->id_str[a->id] = NULL;
        if ((rc = set_id_str(t, a->id, a->content))) break;
        t->added_first[a->normalized][(unsigned char)a->content[0]] = true;
        t->has_normalized_added |= a->normalized;
    }
    free(nb.p);
    return rc;
}

static int load_model(mtok *t, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *ty = type_of(model);
    if (!model) return mtok__fail(MTOK_EFORMAT, "%s: no \"model\" object", t->name);
    if (strcmp(ty, "BPE") != 0)
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: model type '%s' is not supported; only byte-level BPE (GPT-2, "
                          "Llama 3, Qwen2, Qwen3) is",
                          t->name, ty);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
        return mtok__fail(MTOK_EUNSUPPORTED, "%s: model.dropout is set: BPE dropout is random",
                          t->name);
    if (is_true(model, "byte_fallback"))
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: model.byte_fallback (a SentencePiece-style BPE) "
                          "is not supported",
                          t->name);
    if (!null_or_empty(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        !null_or_empty(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return mtok__fail(MTOK_EUNSUPPORTED,
                          "%s: model.continuing_subword_prefix / end_of_word_suffix are not "
                          "supported",
                          t->name);
    t->ignore_merges = is_true(model, "ignore_merges");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return mtok__fail(MTOK_EFORMAT, "%s: model.vocab or model.merges missing", t->name);
    int rc;
    if ((rc = load_vocab(t, vocab, cJSON_IsArray(added) ? added : NULL))) return rc;
    /* bytes without a symbol are skipped (bpe.c); with an unk token tokenizers would emit it */
    for (int c = 0; c < 256; c++)
        if (t->byte_id[c] < 0 &&
            !null_or_empty(cJSON_GetObjectItemCaseSensitive(model, "unk_token")))
            return mtok__fail(MTOK_EUNSUPPORTED,
                              "%s: model.vocab lacks the byte-level symbol of byte 0x%02X and "
                              "model.unk_token is set: unknown tokens are not supported",
                              t->name, c);
    if ((rc = load_merges(t, merges))) return rc;
    return 0;
}

static int load_root(mtok *t, const cJSON *root)
{
    int rc;
    if (!cJSON_IsObject(root)) return mtok__fail(MTOK_EFORMAT, "%s: not a JSON object", t->name);
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "padding");
    if ((trunc && !cJSON_IsNull(trunc)) || (pad && !cJSON_IsNull(pad)))
        return mtok__fail(MTOK_EUNSUPPORTED, "%s: truncation or padding is set; not supported",
                          t->name);
    if ((rc = load_model(t, root))) return rc;
    if ((rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                              "normalizer")))
        return rc;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if ((rc = load_added(t, cJSON_IsArray(added) ? added : NULL))) return rc;
    if ((rc = load_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))))
        return rc;
    if ((rc = load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder")))) return rc;
    if ((rc = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor")))) return rc;
    t->md = pcre2_match_data_create(4, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    /* Long whitespace runs make \s+(?!\S) backtrack deeply: 8 MiB of JIT stack. */
    t->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!t->md || !t->mctx || !t->jit_stack) return mtok__fail(MTOK_ENOMEM, "out of memory");
    pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
    return mtok__strmap_init(&t->cache.map, 1024);
}

int mtok_load_json(const char *json, size_t len, const char *name, mtok **out)
{
    if (!out) return mtok__fail(MTOK_EINVAL, "mtok_load_json: out is NULL");
    *out = NULL;
    if (!json) return mtok__fail(MTOK_EINVAL, "mtok_load_json: json is NULL");
    mtok *t = calloc(1, sizeof *t);
    if (!t) return mtok__fail(MTOK_ENOMEM, "out of memory");
    snprintf(t->name, sizeof t->name, "%s", name ? name : "tokenizer.json");
    cJSON *root = cJSON_ParseWithLength(json, len);
    int rc;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        rc = mtok__fail(MTOK_EFORMAT, "%s: not valid JSON (near byte %td)", t->name,
                        at && at >= json && at <= json + len ? at - json : (ptrdiff_t)-1);
    } else {
        rc = load_root(t, root);
        cJSON_Delete(root);
    }
    if (rc) {
        mtok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int mtok_load(const char *path, mtok **out)
{
    if (!out || !path) return mtok__fail(MTOK_EINVAL, "mtok_load: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return mtok__fail(errno == ENOENT ? MTOK_ENOTFOUND : MTOK_ESYS, "%s: %s", path,
                          strerror(errno));
    mtok_buf b = {0};
    char chunk[65536];
    size_t n;
    int rc = 0;
    while (!rc && (n = fread(chunk, 1, sizeof chunk, f)) > 0) rc = mtok__buf_put(&b, chunk, n);
    if (!rc && ferror(f)) rc = mtok__fail(MTOK_ESYS, "%s: read failed", path);
    fclose(f);
    if (!rc) rc = mtok_load_json(b.p ? b.p : "", b.len, path, out);
    free(b.p);
    return rc;
}

void mtok_free(mtok *t)
{
    if (!t) return;
    mtok__strmap_destroy(&t->vocab);
    for (size_t i = 0; t->id_str && i < t->n_ids; i++) free(t->id_str[i]);
    free(t->id_str);
    free(t->is_special);
    mtok__pairmap_destroy(&t->merges);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].orig);
    free(t->added);
    for (size_t i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i]);
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jit_stack);
    free(t->tpl_pre);
    free(t->tpl_post);
    mtok__cache_destroy(&t->cache);
    free(t->sym);
    free(t->heap);
    free(t->scratch.p);
    free(t->norm.p);
    free(t);
}

size_t mtok_vocab_size(const mtok *t)
{
    return t ? t->n_ids : 0;
}

int32_t mtok_token_id(const mtok *t, const char *token)
{
    if (!t || !token) return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].orig, token) == 0) return t->added[i].id;
    mtok_buf b = {0};
    int32_t id = token_bytes(token, &b) > 0 && b.len ? mtok__strmap_get(&t->vocab, b.p, b.len) : -1;
    free(b.p);
    return id;
}

const char *mtok_token_str(const mtok *t, int32_t id)
{
    return t && id >= 0 && (size_t)id < t->n_ids ? t->id_str[id] : NULL;
}

int mtok_is_special(const mtok *t, int32_t id)
{
    return t && id >= 0 && (size_t)id < t->n_ids && t->is_special[id];
}
