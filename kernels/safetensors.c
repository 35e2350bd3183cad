/*
 * safetensors.c - checkpoints as safetensors files with Hugging Face GPT-2
 * tensor names, so that they move between Manta and PyTorch unchanged.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON mapping each tensor name to {"dtype", "shape", "data_offsets"}, then
 * the raw data (offsets relative to the end of the header).  The JSON parser
 * here reads exactly that shape of document and nothing more: objects,
 * strings, integer arrays, and skips any other value (the metadata).  Strings
 * are unescaped in place in the header buffer, so names of any length are
 * kept whole.  Loading validates every tensor the model needs before touching
 * the model, so a refused file leaves the parameters as they were.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mk_internal.h"

#define MAX_HEADER (64u << 20) /* far above any GPT-2 header; guards garbage lengths */
#define MAX_DIMS   8           /* more dimensions than this is an error, not a truncation */

typedef struct entry {
    const char *name, *dtype; /* into the header buffer */
    int ndim;
    long long shape[MAX_DIMS];
    long long begin, end;
} entry;

typedef struct parser {
    char *s, *end; /* the header; strings are unescaped in place */
    const char *start;
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
                 (long)(p->s - p->start));
        return -1;
    }
    p->s++;
    return 0;
}

/* Reads a JSON string, unescaping it in place (a backslash keeps the character after it, which
 * is enough for tensor names), and points *out at it, NUL-terminated. */
static int str(parser *p, const char **out)
{
    if (expect(p, '"')) return -1;
    char *dst = p->s, *begin = p->s;
    while (p->s < p->end && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\' && p->s < p->end) c = *p->s++;
        *dst++ = c;
    }
    if (p->s >= p->end) {
        snprintf(p->err, sizeof p->err, "unterminated string");
        return -1;
    }
    p->s++;
    *dst = 0; /* dst <= the closing quote, already consumed */
    *out = begin;
    return 0;
}

static int integer(parser *p, long long *v)
{
    ws(p);
    char *e;
    errno = 0;
    long long x = strtoll(p->s, &e, 10);
    if (e == p->s || errno || x < 0) {
        snprintf(p->err, sizeof p->err, "expected a non-negative integer at header byte %ld",
                 (long)(p->s - p->start));
        return -1;
    }
    p->s = e;
    *v = x;
    return 0;
}

/* Reads an array of at most cap integers; more is an error naming what. */
static int int_array(parser *p, long long *v, int cap, int *n, const char *what)
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
        if (*n == cap) {
            snprintf(p->err, sizeof p->err, "%.200s has more than %d entries", what, cap);
            return -1;
        }
        v[(*n)++] = x;
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
    const char *ignored;
    if (c == '"') return str(p, &ignored);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->s++;
        ws(p);
        if (p->s < p->end && *p->s == close) {
            p->s++;
            return 0;
        }
        for (;;) {
            if (c == '{' && (str(p, &ignored) || expect(p, ':'))) return -1;
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

/* One field of a tensor's object; have collects which of the three were seen. */
static int tensor_field(parser *p, entry *e, const char *key, int *have)
{
    if (!strcmp(key, "dtype")) {
        *have |= 1;
        return str(p, &e->dtype);
    }
    if (!strcmp(key, "shape")) {
        char what[160];
        snprintf(what, sizeof what, "the shape of tensor %.100s", e->name);
        *have |= 2;
        return int_array(p, e->shape, MAX_DIMS, &e->ndim, what);
    }
    if (!strcmp(key, "data_offsets")) {
        long long off[2];
        int n;
        if (int_array(p, off, 2, &n, "data_offsets")) return -1;
        if (n != 2 || off[1] < off[0]) {
            snprintf(p->err, sizeof p->err, "tensor %.100s has bad data_offsets", e->name);
            return -1;
        }
        e->begin = off[0];
        e->end = off[1];
        *have |= 4;
        return 0;
    }
    return skip(p);
}

static int tensor_entry(parser *p, entry *e)
{
    if (expect(p, '{')) return -1;
    int have = 0;
    for (;;) {
        const char *key;
        if (str(p, &key) || expect(p, ':') || tensor_field(p, e, key, &have)) return -1;
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

/* Parses the header into a new array of entries (grown as needed). */
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
            if (!ne) {
                snprintf(p->err, sizeof p->err, "out of memory for %d tensors", cap);
                goto fail;
            }
            es = ne;
        }
        memset(&es[n], 0, sizeof es[n]);
        if (str(p, &es[n].name) || expect(p, ':')) goto fail;
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

/* The entry named name, or "transformer." name (checkpoints of GPT2LMHeadModel). */
static const entry *find(const entry *es, int n, const char *name)
{
    static const char prefix[] = "transformer.";
    for (int i = 0; i < n; i++) {
        const char *e = es[i].name;
        if (!strncmp(e, prefix, sizeof prefix - 1)) e += sizeof prefix - 1;
        if (!strcmp(e, name)) return &es[i];
    }
    return NULL;
}

/* ---- loading: open, read the header, check every tensor, read them ----- */

typedef struct checkpoint {
    const char *path;
    FILE *f;
    long long file_size, data_size; /* bytes: the whole file, the data after the header */
    unsigned long long header_len;  /* N */
    char *header;
    entry *es;
    int n_es;
} checkpoint;

/* Opens the file and reads the header length, checking it against the file's size. */
static int open_checkpoint(checkpoint *ck)
{
    ck->f = fopen(ck->path, "rb");
    if (!ck->f) return mk__fail(MK_ERR_IO, "%s: %s", ck->path, strerror(errno));
    struct stat st;
    unsigned char lenb[8];
    if (fstat(fileno(ck->f), &st) || fread(lenb, 1, 8, ck->f) != 8)
        return mk__fail(MK_ERR_TRUNCATED, "%s: shorter than the 8-byte header length", ck->path);
    unsigned long long N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | lenb[i];
    if (N > MAX_HEADER)
        return mk__fail(MK_ERR_FORMAT, "%s: header length %llu is not plausible", ck->path, N);
    if (8 + N > (unsigned long long)st.st_size)
        return mk__fail(MK_ERR_TRUNCATED, "%s: header of %llu bytes but the file has %lld",
                        ck->path, N, (long long)st.st_size);
    ck->header_len = N;
    ck->file_size = (long long)st.st_size;
    ck->data_size = ck->file_size - 8 - (long long)N;
    return MK_OK;
}

/* Reads and parses the JSON header into ck->es. */
static int read_header(checkpoint *ck)
{
    size_t N = (size_t)ck->header_len;
    ck->header = malloc(N + 1);
    if (!ck->header) return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate the header", ck->path);
    if (fread(ck->header, 1, N, ck->f) != N)
        return mk__fail(MK_ERR_IO, "%s: cannot read the header", ck->path);
    ck->header[N] = 0;
    parser p = {.s = ck->header, .end = ck->header + N, .start = ck->header};
    if (parse_header(&p, &ck->es, &ck->n_es))
        return mk__fail(MK_ERR_FORMAT, "%s: bad header: %s", ck->path, p.err);
    return MK_OK;
}

/* Checks one of the model's tensors against its entry: dtype, shape, size, inside the file. */
static int check_tensor(const checkpoint *ck, const mk_tensor_info *t, const entry *e)
{
    if (!e) return mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is missing", ck->path, t->name);
    if (strcmp(e->dtype, "F32"))
        return mk__fail(MK_ERR_DTYPE, "%s: tensor '%s' has dtype %s, need F32", ck->path, e->name,
                        e->dtype);
    int same = e->ndim == t->ndim && e->shape[0] == t->shape[0] &&
               (t->ndim == 1 || e->shape[1] == t->shape[1]);
    if (!same) {
        char got[MAX_DIMS * 22] = "", *g = got;
        for (int d = 0; d < e->ndim; d++)
            g += snprintf(g, sizeof got - (size_t)(g - got), "%s%lld", d ? "," : "", e->shape[d]);
        if (t->ndim == 1)
            return mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d]", ck->path,
                            e->name, got, t->shape[0]);
        return mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d,%d]", ck->path,
                        e->name, got, t->shape[0], t->shape[1]);
    }
    if (e->end - e->begin != (long long)(t->numel * sizeof(float)))
        return mk__fail(MK_ERR_FORMAT, "%s: tensor '%s' data_offsets span %lld bytes, need %zu",
                        ck->path, e->name, e->end - e->begin, t->numel * sizeof(float));
    if (e->end > ck->data_size)
        return mk__fail(MK_ERR_TRUNCATED,
                        "%s: tensor '%s' ends at data byte %lld but the file holds %lld", ck->path,
                        e->name, e->end, ck->data_size);
    return MK_OK;
}

/* Reads every tensor into one host buffer, then uploads it: the parameters change only when
 * all of it was read. */
static int read_tensors(mk_model *m, const checkpoint *ck)
{
    float *buf = malloc(sizeof(float) * m->n_params);
    if (!buf) return mk__fail(MK_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
    int rc = MK_OK;
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const mk_tensor_info *t = &m->tensors[i];
        const entry *e = find(ck->es, ck->n_es, t->name);
        if (fseeko(ck->f, (off_t)(8 + ck->header_len + e->begin), SEEK_SET) ||
            fread(buf + t->offset, sizeof(float), t->numel, ck->f) != t->numel)
            rc = mk__fail(MK_ERR_IO, "%s: cannot read tensor '%s'", ck->path, e->name);
    }
    if (!rc) m->be->upload(m->params, buf, sizeof(float) * m->n_params);
    free(buf);
    return rc;
}

int mk_load(mk_model *m, const char *path)
{
    if (!m || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    checkpoint ck = {.path = path};
    int rc = open_checkpoint(&ck);
    if (!rc) rc = read_header(&ck);
    for (int i = 0; i < m->n_tensors && !rc; i++)
        rc = check_tensor(&ck, &m->tensors[i], find(ck.es, ck.n_es, m->tensors[i].name));
    if (!rc) rc = read_tensors(m, &ck);
    free(ck.es);
    free(ck.header);
    if (ck.f) fclose(ck.f);
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
    char *tmp = malloc(strlen(path) + sizeof ".tmp");
    if (!tmp) {
        free(buf);
        free(h.s);
        return mk__fail(MK_ERR_NOMEM, "cannot allocate a temporary name for %s", path);
    }
    sprintf(tmp, "%s.tmp", path);
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
    free(tmp);
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
