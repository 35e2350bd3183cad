/*
 * safetensors.c - checkpoints as safetensors files with Hugging Face GPT-2
 * tensor names, so that they move between Manta and PyTorch unchanged.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON mapping each tensor name to {"dtype", "shape", "data_offsets"}, then
 * the raw data (offsets relative to the end of the header).  The JSON parser
 * here reads exactly that shape of document and nothing more: objects,
 * strings, integer arrays, and skips any other value (the metadata).  Loading
 * validates every tensor the model needs before touching the model, so a
 * refused file leaves the parameters as they were.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mk_internal.h"

#define MAX_HEADER (64u << 20) /* far above any GPT-2 header; guards garbage lengths */

typedef struct entry {
    char name[128];
    char dtype[16];
    int ndim;
    long long shape[8];
    long long begin, end;
} entry;

typedef struct parser {
    const char *s, *end;
    const char *file;
    char err[320];
} parser;

static void ws(parser *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\n' || *p->s == '\r' || *p->s == '\t'))
        p->s++;
}

static int expect(parser *p, char c)
{
    ws(p);
    if (p->s >= p->end || *p->s != c) {
        snprintf(p->err, sizeof p->err, "expected '%c' at header byte %ld", c,
                 (long)(p->end - p->s));
        return -1;
    }
    p->s++;
    return 0;
}

/* Reads a JSON string into out (truncated to cap-1; escapes other than \" and
 * \\ are kept verbatim, which is enough for tensor names). */
static int str(parser *p, char *out, size_t cap)
{
    if (expect(p, '"')) return -1;
    size_t n = 0;
    while (p->s < p->end && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\' && p->s < p->end) c = *p->s++;
        if (n + 1 < cap) out[n++] = c;
    }
    if (p->s >= p->end) {
        snprintf(p->err, sizeof p->err, "unterminated string");
        return -1;
    }
    p->s++;
    out[n] = 0;
    return 0;
}

static int integer(parser *p, long long *v)
{
    ws(p);
    char *e;
    errno = 0;
    long long x = strtoll(p->s, &e, 10);
    if (e == p->s || errno || x < 0) {
        snprintf(p->err, sizeof p->err, "expected a non-negative integer");
        return -1;
    }
    p->s = e;
    *v = x;
    return 0;
}

static int int_array(parser *p, long long *v, int cap, int *n)
{
    if (expect(p, '[')) return -1;
    *n = 0;
    ws(p);
    if (p->s < p->end && *p->s == ']') {
        p->s++;
        return 0;
    }
    for (;;) {
        long long x;
        if (integer(p, &x)) return -1;
        if (*n < cap) v[*n] = x;
        (*n)++;
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        return expect(p, ']');
    }
}

/* Skips any JSON value. */
static int skip(parser *p)
{
    ws(p);
    if (p->s >= p->end) return expect(p, '?');
    char c = *p->s;
    if (c == '"') {
        char tmp[8];
        return str(p, tmp, sizeof tmp);
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->s++;
        ws(p);
        if (p->s < p->end && *p->s == close) {
            p->s++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                char k[8];
                if (str(p, k, sizeof k) || expect(p, ':')) return -1;
            }
            if (skip(p)) return -1;
            ws(p);
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                continue;
            }
            return expect(p, close);
        }
    }
    while (p->s < p->end && *p->s != ',' && *p->s != '}' && *p->s != ']') p->s++;
    return 0;
}

static int tensor_entry(parser *p, entry *e)
{
    if (expect(p, '{')) return -1;
    int have = 0;
    for (;;) {
        char key[32];
        if (str(p, key, sizeof key) || expect(p, ':')) return -1;
        if (!strcmp(key, "dtype")) {
            if (str(p, e->dtype, sizeof e->dtype)) return -1;
            have |= 1;
        } else if (!strcmp(key, "shape")) {
            if (int_array(p, e->shape, 8, &e->ndim)) return -1;
            if (e->ndim > 8) {
                snprintf(p->err, sizeof p->err, "tensor %.100s has %d dimensions", e->name,
                         e->ndim);
                return -1;
            }
            have |= 2;
        } else if (!strcmp(key, "data_offsets")) {
            long long off[2];
            int n;
            if (int_array(p, off, 2, &n)) return -1;
            if (n != 2 || off[1] < off[0]) {
                snprintf(p->err, sizeof p->err, "tensor %.100s has bad data_offsets", e->name);
                return -1;
            }
            e->begin = off[0];
            e->end = off[1];
            have |= 4;
        } else if (skip(p)) {
            return -1;
        }
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (expect(p, '}')) return -1;
        break;
    }
    if (have != 7) {
        snprintf(p->err, sizeof p->err, "tensor %.100s lacks dtype, shape or data_offsets",
                 e->name);
        return -1;
    }
    return 0;
}

/* Parses the header into a new array of entries. */
static int parse_header(parser *p, entry **out, int *n_out)
{
    int cap = 64, n = 0;
    entry *es = malloc(sizeof(entry) * cap);
    if (!es) return snprintf(p->err, sizeof p->err, "out of memory"), -1;
    if (expect(p, '{')) goto fail;
    ws(p);
    if (p->s < p->end && *p->s == '}') {
        p->s++;
        goto done;
    }
    for (;;) {
        if (n == cap) {
            entry *ne = realloc(es, sizeof(entry) * (cap *= 2));
            if (!ne) goto fail;
            es = ne;
        }
        memset(&es[n], 0, sizeof es[n]);
        if (str(p, es[n].name, sizeof es[n].name) || expect(p, ':')) goto fail;
        if (!strcmp(es[n].name, "__metadata__")) {
            if (skip(p)) goto fail;
        } else {
            if (tensor_entry(p, &es[n])) goto fail;
            n++;
        }
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (expect(p, '}')) goto fail;
        break;
    }
done:
    *out = es;
    *n_out = n;
    return 0;
fail:
    free(es);
    return -1;
}

static const entry *find(const entry *es, int n, const char *name)
{
    char pref[160];
    snprintf(pref, sizeof pref, "transformer.%s", name);
    for (int i = 0; i < n; i++)
        if (!strcmp(es[i].name, name) || !strcmp(es[i].name, pref)) return &es[i];
    return NULL;
}

int mk_load(mk_model *m, const char *path)
{
    if (!m || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    int rc = MK_OK;
    char *hdr = NULL;
    entry *es = NULL;
    float *buf = NULL;
    struct stat st;
    unsigned char lenb[8];
    if (fstat(fileno(f), &st) || fread(lenb, 1, 8, f) != 8) {
        rc = mk__fail(MK_ERR_TRUNCATED, "%s: shorter than the 8-byte header length", path);
        goto out;
    }
    unsigned long long N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | lenb[i];
    if (N > MAX_HEADER) {
        rc = mk__fail(MK_ERR_FORMAT, "%s: header length %llu is not plausible", path, N);
        goto out;
    }
    if (8 + N > (unsigned long long)st.st_size) {
        rc = mk__fail(MK_ERR_TRUNCATED, "%s: header of %llu bytes but the file has %lld", path, N,
                      (long long)st.st_size);
        goto out;
    }
    hdr = malloc(N + 1);
    if (!hdr || fread(hdr, 1, N, f) != N) {
        rc = mk__fail(hdr ? MK_ERR_IO : MK_ERR_NOMEM, "%s: cannot read header", path);
        goto out;
    }
    hdr[N] = 0;
    parser p = {.s = hdr, .end = hdr + N, .file = path};
    int n_es;
    if (parse_header(&p, &es, &n_es)) {
        rc = mk__fail(MK_ERR_FORMAT, "%s: bad header: %s", path, p.err);
        goto out;
    }
    long long data_size = (long long)st.st_size - 8 - (long long)N;
    /* validate everything first */
    for (int i = 0; i < m->n_tensors; i++) {
        const mk_tensor_info *t = &m->tensors[i];
        const entry *e = find(es, n_es, t->name);
        if (!e) {
            rc = mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is missing", path, t->name);
            goto out;
        }
        if (strcmp(e->dtype, "F32")) {
            rc = mk__fail(MK_ERR_DTYPE, "%s: tensor '%s' has dtype %s, need F32", path, e->name,
                          e->dtype);
            goto out;
        }
        int same = e->ndim == t->ndim && e->shape[0] == t->shape[0] &&
                   (t->ndim == 1 || e->shape[1] == t->shape[1]);
        if (!same) {
            char got[96] = "", *g = got;
            for (int d = 0; d < e->ndim && d < 8; d++)
                g += snprintf(g, sizeof got - (size_t)(g - got), "%s%lld", d ? "," : "",
                              e->shape[d]);
            if (t->ndim == 1)
                rc = mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d]", path,
                              e->name, got, t->shape[0]);
            else
                rc = mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d,%d]", path,
                              e->name, got, t->shape[0], t->shape[1]);
            goto out;
        }
        if (e->end - e->begin != (long long)(t->numel * sizeof(float))) {
            rc = mk__fail(MK_ERR_FORMAT, "%s: tensor '%s' data_offsets span %lld bytes, need %zu",
                          path, e->name, e->end - e->begin, t->numel * sizeof(float));
            goto out;
        }
        if (e->end > data_size) {
            rc = mk__fail(MK_ERR_TRUNCATED,
                          "%s: tensor '%s' ends at data byte %lld but the file holds %lld", path,
                          e->name, e->end, data_size);
            goto out;
        }
    }
    buf = malloc(sizeof(float) * m->n_params);
    if (!buf) {
        rc = mk__fail(MK_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
        goto out;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const mk_tensor_info *t = &m->tensors[i];
        const entry *e = find(es, n_es, t->name);
        if (fseeko(f, (off_t)(8 + N + e->begin), SEEK_SET) ||
            fread(buf + t->offset, sizeof(float), t->numel, f) != t->numel) {
            rc = mk__fail(MK_ERR_IO, "%s: cannot read tensor '%s'", path, e->name);
            goto out;
        }
    }
    m->be->upload(m->params, buf, sizeof(float) * m->n_params);
out:
    free(buf);
    free(es);
    free(hdr);
    fclose(f);
    return rc;
}

/* Appends to a growing string; returns -1 when out of memory. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static int sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return 0;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) return -1;
        b->s = ns;
        b->cap = nc;
    }
}

int mk_save(const mk_model *m, const char *path)
{
    if (!m || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    sbuf h = {0};
    int bad = sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < m->n_tensors && !bad; i++) {
        const mk_tensor_info *t = &m->tensors[i];
        size_t b = t->offset * sizeof(float), e = b + t->numel * sizeof(float);
        if (t->ndim == 1)
            bad = sb_printf(&h,
                            ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                            t->name, t->shape[0], b, e);
        else
            bad = sb_printf(
                &h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                t->name, t->shape[0], t->shape[1], b, e);
    }
    if (!bad) bad = sb_printf(&h, "}");
    while (!bad && h.n % 8) bad = sb_printf(&h, " "); /* data starts 8-byte aligned */
    float *buf = bad ? NULL : malloc(sizeof(float) * m->n_params);
    if (!buf) {
        free(h.s);
        return mk__fail(MK_ERR_NOMEM, "cannot build checkpoint in memory");
    }
    m->be->download(buf, m->params, sizeof(float) * m->n_params);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int rc = MK_OK;
    if (!f) {
        rc = mk__fail(MK_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else {
        unsigned char lenb[8];
        unsigned long long N = h.n;
        for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(N >> (8 * i));
        int ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(h.s, 1, h.n, f) == h.n &&
                 fwrite(buf, sizeof(float), m->n_params, f) == m->n_params;
        ok = (fclose(f) == 0) && ok;
        if (!ok || rename(tmp, path)) {
            rc = mk__fail(MK_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(buf);
    free(h.s);
    return rc;
}

int mk_write_hf_config(const mk_config *c, const char *path)
{
    int rc = mk_config_check(c);
    if (rc) return rc;
    FILE *f = fopen(path, "w");
    if (!f) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f,
            "{\n  \"model_type\": \"gpt2\",\n  \"architectures\": [\"GPT2LMHeadModel\"],\n"
            "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_embd\": %d,\n  \"n_positions\": %d,\n"
            "  \"n_ctx\": %d,\n  \"vocab_size\": %d,\n  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
            "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n"
            "  \"torch_dtype\": \"float32\"\n}\n",
            c->n_layer, c->n_head, c->n_embd, c->block_size, c->block_size, c->vocab_size);
    if (fclose(f)) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    return MK_OK;
}
