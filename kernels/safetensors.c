/*
 * safetensors.c - the safetensors file format: reading a file's header and
 * tensors (F32, BF16, F16, converted to float) and writing one, plus the
 * conversions between float and the two 16-bit formats.  Which tensors a
 * model needs, under which names, is hf_dir.c's business.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON mapping each tensor name to {"dtype", "shape", "data_offsets"}, then
 * the raw data (offsets relative to the end of the header).  The JSON parser
 * here reads exactly that shape of document and nothing more: objects,
 * strings, integer arrays, and skips any other value (the metadata).  Strings
 * are unescaped in place in the header buffer, so names of any length are
 * kept whole.  A file is memory-mapped: tensors are converted from the page
 * cache, never read into a second buffer.  Writing streams tensor by tensor
 * through one buffer of the largest, to a temporary that is then renamed.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "mk_internal.h"

#define MAX_HEADER (64u << 20) /* far above any GPT-2 header; guards garbage lengths */
#define MAX_DIMS   8           /* more dimensions than this is an error, not a truncation */
#define MAX_DEPTH  64          /* JSON nesting the header may use (skipped metadata) */

typedef mk__st_entry entry;

typedef struct parser {
    char *s, *end; /* the header; strings are unescaped in place */
    const char *start;
    int depth; /* of the value skip() is in */
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

static int skip(parser *p);

/* The members of an object or array whose opening bracket was just seen. */
static int skip_container(parser *p, char close)
{
    const char *ignored;
    p->s++;
    ws(p);
    if (p->s < p->end && *p->s == close) {
        p->s++;
        return 0;
    }
    for (;;) {
        if (close == '}' && (str(p, &ignored) || expect(p, ':'))) return -1;
        if (skip(p)) return -1;
        ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        return expect(p, close);
    }
}

/* Skips any JSON value, at most MAX_DEPTH levels deep (no stack overflow on
 * a hostile header). */
static int skip(parser *p)
{
    ws(p);
    if (p->s >= p->end) return expect(p, '?');
    char c = *p->s;
    const char *ignored;
    if (c == '"') return str(p, &ignored);
    if (c == '{' || c == '[') {
        if (p->depth >= MAX_DEPTH) {
            snprintf(p->err, sizeof p->err,
                     "values nested deeper than %d levels at header byte %ld", MAX_DEPTH,
                     (long)(p->s - p->start));
            return -1;
        }
        p->depth++;
        int rc = skip_container(p, c == '{' ? '}' : ']');
        p->depth--;
        return rc;
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

/* The entry named name, with or without the "transformer." (GPT2LMHeadModel) or "model."
 * prefix. */
const mk__st_entry *mk__st_find(const mk__st_file *f, const char *name)
{
    for (int i = 0; i < f->n_es; i++)
        if (!strcmp(mk__st_strip(f->es[i].name), name)) return &f->es[i];
    return NULL;
}

const char *mk__st_strip(const char *name)
{
    static const char *const prefixes[] = {"transformer.", "model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t n = strlen(prefixes[i]);
        if (!strncmp(name, prefixes[i], n)) return name + n;
    }
    return name;
}

/* ---- loading: map the file, parse its header, check tensors, convert ---- */

void mk__st_close(mk__st_file *f)
{
    if (f->map) munmap(f->map, f->map_size);
    free(f->es);
    free(f->header);
    memset(f, 0, sizeof *f);
}

/* Maps the file (read-only, private: tensors are converted straight from the page cache, never
 * read into a second buffer) and parses the header; the header alone is copied, because its
 * strings are unescaped in place. */
int mk__st_open(mk__st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (st.st_size < 8) {
        close(fd);
        return mk__fail(MK_ERR_TRUNCATED, "%s: shorter than the 8-byte header length", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mk__fail(MK_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    f->map = map;
    f->map_size = (size_t)st.st_size;
    const unsigned char *b = map;
    unsigned long long N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | b[i];
    if (N > MAX_HEADER) {
        mk__st_close(f);
        return mk__fail(MK_ERR_FORMAT, "%s: header length %llu is not plausible", path, N);
    }
    if (8 + N > (unsigned long long)st.st_size) {
        mk__st_close(f);
        return mk__fail(MK_ERR_TRUNCATED, "%s: header of %llu bytes but the file has %lld", path, N,
                        (long long)st.st_size);
    }
    f->data = b + 8 + N;
    f->data_size = (long long)st.st_size - 8 - (long long)N;
    f->header = malloc((size_t)N + 1);
    if (!f->header) {
        mk__st_close(f);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate the header", path);
    }
    memcpy(f->header, b + 8, (size_t)N);
    f->header[N] = 0;
    parser p = {.s = f->header, .end = f->header + N, .start = f->header};
    if (parse_header(&p, &f->es, &f->n_es)) {
        mk__st_close(f);
        return mk__fail(MK_ERR_FORMAT, "%s: bad header: %s", path, p.err);
    }
    return MK_OK;
}

static size_t dtype_size(const char *dtype)
{
    if (!strcmp(dtype, "F32")) return 4;
    if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16")) return 2;
    return 0;
}

int mk__st_check(const mk__st_file *f, const mk__st_entry *e, const char *name, int ndim,
                 const int *shape, int f32_only)
{
    if (!e) return mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is missing", f->path, name);
    size_t es = dtype_size(e->dtype);
    if (!es || (f32_only && es != 4))
        return mk__fail(MK_ERR_DTYPE, "%s: tensor '%s' has dtype %s, need %s", f->path, e->name,
                        e->dtype, f32_only ? "F32" : "F32, BF16 or F16");
    int same = e->ndim == ndim && e->shape[0] == shape[0] && (ndim == 1 || e->shape[1] == shape[1]);
    size_t numel = (size_t)shape[0] * (ndim == 1 ? 1 : (size_t)shape[1]);
    if (!same) {
        char got[MAX_DIMS * 22] = "", *g = got;
        for (int d = 0; d < e->ndim; d++)
            g += snprintf(g, sizeof got - (size_t)(g - got), "%s%lld", d ? "," : "", e->shape[d]);
        if (ndim == 1)
            return mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d]", f->path,
                            e->name, got, shape[0]);
        return mk__fail(MK_ERR_SHAPE, "%s: tensor '%s' has shape [%s], need [%d,%d]", f->path,
                        e->name, got, shape[0], shape[1]);
    }
    if (e->end - e->begin != (long long)(numel * es))
        return mk__fail(MK_ERR_FORMAT, "%s: tensor '%s' data_offsets span %lld bytes, need %zu",
                        f->path, e->name, e->end - e->begin, numel * es);
    if (e->end > f->data_size)
        return mk__fail(MK_ERR_TRUNCATED,
                        "%s: tensor '%s' ends at data byte %lld but the file holds %lld", f->path,
                        e->name, e->end, f->data_size);
    return MK_OK;
}

/* ---- dtype conversions (exact upward; round to nearest even downward) ---- */

float mk_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float mk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | man << 13; /* inf, nan (payload kept) */
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13; /* rebias 15 -> 127 */
    } else if (!man) {
        u = sign; /* zero */
    } else {      /* subnormal: man * 2^-24, normal in float */
        int e = -1;
        do man <<= 1, e++;
        while (!(man & 0x400));
        u = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t mk_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40); /* quiet nan */
    u += 0x7fffu + (u >> 16 & 1);
    return (uint16_t)(u >> 16);
}

void mk_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mk__f32_to_bf16(src[i]);
}

void mk_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mk__bf16_to_f32(src[i]);
}

uint16_t mk_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00 | (uint16_t)(a >> 13 & 0x3ff); /* quiet nan */
    if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65536: inf */
    if (a >= 0x38800000u) {                     /* normal in half: 2^-14 and up */
        uint32_t r = a + 0xfffu + (a >> 13 & 1);
        return sign | (uint16_t)((r >> 13) - (112u << 10));
    }
    if (a < 0x33000000u) return sign; /* below half the smallest subnormal (2^-25): zero */
    /* subnormal: the value in units of 2^-24, rounded to nearest even */
    uint32_t man = (a & 0x7fffff) | 0x800000, shift = 126 - (a >> 23); /* 14..24 */
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

/* Converts elements [i0, i1) of a tensor's data. */
static void convert(float *dst, const unsigned char *src, int kind, size_t i0, size_t i1)
{
    if (kind == 0) { /* F32: little-endian host, like every safetensors writer */
        memcpy(dst + i0, src + 4 * i0, 4 * (i1 - i0));
        return;
    }
    for (size_t i = i0; i < i1; i++) {
        uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
        dst[i] = kind == 1 ? mk__bf16_to_f32(h) : mk_f16_to_f32(h);
    }
}

#define READ_CHUNK ((size_t)1 << 18) /* elements per task: 1 MB of F32 */

/* A large tensor is converted in chunks over the OpenMP team, so that the page faults of a
 * mapped gigabyte and the conversion spread over the cores. */
void mk__st_read(float *dst, const mk__st_file *f, const mk__st_entry *e)
{
    const unsigned char *src = f->data + e->begin;
    int kind = !strcmp(e->dtype, "F32") ? 0 : !strcmp(e->dtype, "BF16") ? 1 : 2;
    size_t n = (size_t)(e->end - e->begin) / (kind ? 2 : 4);
    long n_chunks = (long)((n + READ_CHUNK - 1) / READ_CHUNK);
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (long c = 0; c < n_chunks; c++) {
        size_t i0 = (size_t)c * READ_CHUNK, i1 = i0 + READ_CHUNK < n ? i0 + READ_CHUNK : n;
        convert(dst, src, kind, i0, i1);
    }
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

/* The header: names and shapes of ts in dtype dt, data packed in order, padded with spaces
 * so that the data starts 8-byte aligned.  *data_bytes receives the data's size. */
static int build_header(sbuf *h, const mk_tensor_info *ts, int n, mk_dtype dt, size_t *data_bytes)
{
    static const char *const names[] = {"F32", "BF16", "F16"};
    size_t es = dt == MK_F32 ? 4 : 2, off = 0;
    int bad = sb_printf(h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n && !bad; i++) {
        const mk_tensor_info *t = &ts[i];
        size_t e = off + t->numel * es;
        if (t->ndim == 1)
            bad =
                sb_printf(h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                          t->name, names[dt], t->shape[0], off, e);
        else
            bad = sb_printf(
                h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                t->name, names[dt], t->shape[0], t->shape[1], off, e);
        off = e;
    }
    if (!bad) bad = sb_printf(h, "}");
    while (!bad && h->n % 8) bad = sb_printf(h, " ");
    *data_bytes = off;
    return bad;
}

/* Writes the header, then each tensor's values as get() gives them, converted to dt through
 * one scratch buffer of the largest tensor: a save never holds a second copy of the model. */
static int write_body(FILE *f, const sbuf *h, const mk_tensor_info *ts, int n, mk__st_source get,
                      const void *ctx, mk_dtype dt, float *x, uint16_t *half)
{
    unsigned char lenb[8];
    unsigned long long N = h->n;
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(N >> (8 * i));
    int ok = fwrite(lenb, 1, 8, f) == 8 && fwrite(h->s, 1, h->n, f) == h->n;
    for (int i = 0; i < n && ok; i++) {
        size_t k = ts[i].numel;
        get(ctx, i, x);
        if (dt == MK_F32) {
            ok = fwrite(x, 4, k, f) == k; /* little-endian host, like every safetensors writer */
            continue;
        }
        for (size_t j = 0; j < k; j++)
            half[j] = dt == MK_BF16 ? mk__f32_to_bf16(x[j]) : mk_f32_to_f16(x[j]);
        ok = fwrite(half, 2, k, f) == k;
    }
    return ok;
}

int mk__st_write(const char *path, const mk_tensor_info *ts, int n, mk__st_source get,
                 const void *ctx, mk_dtype dt)
{
    sbuf h = {0};
    size_t data_bytes, most = 1;
    for (int i = 0; i < n; i++)
        if (ts[i].numel > most) most = ts[i].numel;
    int bad = build_header(&h, ts, n, dt, &data_bytes);
    float *x = bad ? NULL : malloc(sizeof(float) * most);
    uint16_t *half = x && dt != MK_F32 ? malloc(sizeof(uint16_t) * most) : NULL;
    char *tmp = x && (dt == MK_F32 || half) ? malloc(strlen(path) + sizeof ".tmp") : NULL;
    if (!tmp) {
        free(x);
        free(half);
        free(h.s);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate the header and a tensor's buffer", path);
    }
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int rc = MK_OK;
    if (!f) {
        rc = mk__fail(MK_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else {
        int ok = write_body(f, &h, ts, n, get, ctx, dt, x, half), e = ok ? 0 : errno;
        if (fclose(f) && ok) ok = 0, e = errno;
        if (ok && rename(tmp, path)) ok = 0, e = errno;
        if (!ok) {
            rc = mk__fail(MK_ERR_IO, "%s: cannot write: %s", path, strerror(e));
            remove(tmp);
        }
    }
    free(tmp);
    free(x);
    free(half);
    free(h.s);
    return rc;
}
