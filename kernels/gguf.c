/*
 * gguf.c - GGUF files (llama.cpp's single-file format) as Llama models: the
 * file's header, metadata and tensor table, read from a read-only mapping
 * and checked against the file's size, then each tensor converted to float
 * once, straight into the model's checkpoint layout.
 *
 * Layout (GGUF versions 2 and 3, little-endian): "GGUF", u32 version, u64
 * tensor count, u64 key/value count; the key/values (a string key, a u32
 * value type, the value; arrays are a u32 element type, a u64 count and the
 * elements; strings a u64 length and bytes); the tensor infos (name, u32
 * n_dims, u64 ne[n_dims] innermost first, u32 ggml type, u64 offset); then,
 * at the next multiple of general.alignment (default 32), the data, each
 * tensor at its offset from there.  The file is untrusted: every count and
 * length is bounded by the bytes left before anything is allocated or read,
 * and a refusal names the file and the key or tensor at fault.
 *
 * The quantised kinds are dequantised as ggml defines them (ggml-common.h,
 * and gguf-py's quants.py, which transformers uses): blocks of 32 values;
 * Q8_0 is an f16 scale d and 32 int8 q, value q d; Q4_0 is d and 16 bytes,
 * the low nibbles elements 0..15 and the high ones 16..31, value (q - 8) d;
 * Q4_1 is d, an f16 minimum m and 16 bytes as Q4_0, value q d + m.  The
 * products are exact in float (an integer of at most 8 bits times an f16's
 * 11-bit significand), so each value is one rounding whether or not the
 * compiler fuses the multiply-add: bit for bit numpy's float32 result.
 *
 * llama.cpp's converter stores q_proj and k_proj with the rows of each head
 * interleaved for its rotary kernel (row 2i + j of a head holds transformers'
 * row j hd/2 + i); loading puts them back, as transformers' GGUF loader does
 * (LlamaTensorProcessor._reverse_permute_weights).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mk_internal.h"

/* The longest context_length read (Llama 3.1 has 131072; 1M-token models exist). */
#define MAX_CONTEXT (1 << 20)

/* ---- the file's structure ------------------------------------------------ */

enum { /* GGUF metadata value types */
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

/* Bytes of one value of a fixed-size type (0: string or array). */
static const unsigned char gv_size[GV_N] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const gv_name[GV_N] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};

/* ggml tensor types this file reads, and the names of all others for refusals. */
enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q8_0 = 8, GT_BF16 = 30 };
static const char *ggml_type_name(uint32_t t)
{
    static const char *const names[] = {
        "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
        "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
        "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
        "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
        "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
        "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
    return t < sizeof names / sizeof *names ? names[t] : "unknown";
}

/* Block length and bytes per block of a readable type; 0 when unreadable. */
static int type_block(uint32_t t, size_t *blk, size_t *bytes)
{
    switch (t) {
    case GT_F32:
        *blk = 1, *bytes = 4;
        return 1;
    case GT_F16:
    case GT_BF16:
        *blk = 1, *bytes = 2;
        return 1;
    case GT_Q8_0:
        *blk = 32, *bytes = 34;
        return 1;
    case GT_Q4_0:
        *blk = 32, *bytes = 18;
        return 1;
    case GT_Q4_1:
        *blk = 32, *bytes = 20;
        return 1;
    }
    return 0;
}

typedef struct gstr {
    const char *p;
    size_t n;
} gstr;

typedef struct gkv {
    gstr key;
    uint32_t type;            /* GV_* */
    uint32_t atype;           /* element type when type is GV_ARRAY */
    uint64_t count;           /* elements when an array */
    const unsigned char *val; /* the value (an array's first element) */
} gkv;

typedef struct gtensor {
    gstr name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} gtensor;

typedef struct gfile {
    const char *path;
    void *map;
    size_t size;
    uint32_t version;
    gkv *kv;
    size_t n_kv;
    gtensor *t;
    size_t n_t;
    uint64_t alignment;
    const unsigned char *data; /* the data section, data_size bytes */
    size_t data_size;
} gfile;

/* A cursor over the mapping; f gives the path and size for messages. */
typedef struct cur {
    const unsigned char *p, *end;
    const gfile *f;
} cur;

static uint16_t le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static size_t left(const cur *c)
{
    return (size_t)(c->end - c->p);
}

static int truncated(const cur *c, const char *what)
{
    return mk__fail(MK_ERR_TRUNCATED, "%s: the file ends inside %s (at byte %zu of %zu)",
                    c->f->path, what, (size_t)(c->p - (const unsigned char *)c->f->map),
                    c->f->size);
}

static int rd_u32(cur *c, uint32_t *v, const char *what)
{
    if (left(c) < 4) return truncated(c, what);
    *v = le32(c->p);
    c->p += 4;
    return MK_OK;
}

static int rd_u64(cur *c, uint64_t *v, const char *what)
{
    if (left(c) < 8) return truncated(c, what);
    *v = le64(c->p);
    c->p += 8;
    return MK_OK;
}

static int rd_str(cur *c, gstr *s, const char *what)
{
    uint64_t n = 0;
    int rc = rd_u64(c, &n, what);
    if (rc) return rc;
    if (n > left(c))
        return mk__fail(MK_ERR_TRUNCATED,
                        "%s: the file ends inside %s (a string of %llu bytes, %zu left)",
                        c->f->path, what, (unsigned long long)n, left(c));
    s->p = (const char *)c->p;
    s->n = (size_t)n;
    c->p += n;
    return MK_OK;
}

static int streq(gstr s, const char *z)
{
    size_t n = strlen(z);
    return s.n == n && !memcmp(s.p, z, n);
}

/* A key for messages: at most 80 bytes of it (keys are untrusted). */
#define KEYF    "'%.*s'"
#define KEYA(s) (int)((s).n < 80 ? (s).n : 80), (s).p

/* Reads one key/value, checking that the value lies inside the file. */
static int rd_kv(cur *c, gkv *kv)
{
    int rc = rd_str(c, &kv->key, "a metadata key");
    if (!rc) rc = rd_u32(c, &kv->type, "a metadata value type");
    if (rc) return rc;
    const char *path = c->f->path;
    if (kv->type >= GV_N)
        return mk__fail(MK_ERR_FORMAT, "%s: key " KEYF ": unknown value type %u", path,
                        KEYA(kv->key), kv->type);
    kv->count = 1;
    kv->atype = kv->type;
    if (kv->type == GV_ARRAY) {
        if ((rc = rd_u32(c, &kv->atype, "an array's element type")) ||
            (rc = rd_u64(c, &kv->count, "an array's length")))
            return rc;
        if (kv->atype >= GV_N)
            return mk__fail(MK_ERR_FORMAT, "%s: key " KEYF ": unknown array element type %u", path,
                            KEYA(kv->key), kv->atype);
        if (kv->atype == GV_ARRAY)
            return mk__fail(MK_ERR_UNSUPPORTED, "%s: key " KEYF ": arrays of arrays are not read",
                            path, KEYA(kv->key));
    }
    kv->val = c->p;
    if (kv->atype == GV_STRING) {
        /* each string takes at least its 8-byte length */
        if (kv->count > left(c) / 8)
            return mk__fail(MK_ERR_FORMAT,
                            "%s: key " KEYF ": %llu strings cannot fit in the %zu bytes left", path,
                            KEYA(kv->key), (unsigned long long)kv->count, left(c));
        for (uint64_t i = 0; i < kv->count; i++) {
            gstr s;
            if ((rc = rd_str(c, &s, "a metadata string"))) return rc;
        }
        return MK_OK;
    }
    size_t sz = gv_size[kv->atype];
    if (kv->count > left(c) / sz)
        return mk__fail(MK_ERR_FORMAT,
                        "%s: key " KEYF ": %llu values of type %s cannot fit in the %zu bytes left",
                        path, KEYA(kv->key), (unsigned long long)kv->count, gv_name[kv->atype],
                        left(c));
    c->p += kv->count * sz;
    return MK_OK;
}

static int rd_tensor(cur *c, gtensor *t)
{
    int rc = rd_str(c, &t->name, "a tensor name");
    if (!rc) rc = rd_u32(c, &t->n_dims, "a tensor's n_dims");
    if (rc) return rc;
    if (t->n_dims < 1 || t->n_dims > 4)
        return mk__fail(MK_ERR_FORMAT, "%s: tensor " KEYF ": %u dimensions (1 to 4 expected)",
                        c->f->path, KEYA(t->name), t->n_dims);
    for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((rc = rd_u64(c, &t->ne[d], "a tensor's dimensions"))) return rc;
    if ((rc = rd_u32(c, &t->type, "a tensor's type")) ||
        (rc = rd_u64(c, &t->offset, "a tensor's offset")))
        return rc;
    return MK_OK;
}

static const gkv *find_kv(const gfile *f, const char *key)
{
    for (size_t i = 0; i < f->n_kv; i++)
        if (streq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

static const gtensor *find_tensor(const gfile *f, const char *name)
{
    for (size_t i = 0; i < f->n_t; i++)
        if (streq(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

static void gclose(gfile *f)
{
    if (f->map) munmap(f->map, f->size);
    free(f->kv);
    free(f->t);
    memset(f, 0, sizeof *f);
}

/* The fixed header: magic, version, the two counts (bounded by the file's size). */
static int rd_header(gfile *f, cur *c, uint64_t *n_t, uint64_t *n_kv)
{
    if (f->size < 4 || memcmp(f->map, "GGUF", 4))
        return mk__fail(MK_ERR_FORMAT, "%s: not a GGUF file (the first bytes are not \"GGUF\")",
                        f->path);
    c->p += 4;
    int rc = rd_u32(c, &f->version, "the header");
    if (rc) return rc;
    if (f->version == 0x02000000u || f->version == 0x03000000u)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: a big-endian GGUF file; only little-endian is read", f->path);
    if (f->version != 2 && f->version != 3)
        return mk__fail(MK_ERR_UNSUPPORTED, "%s: GGUF version %u; versions 2 and 3 are read",
                        f->path, f->version);
    if ((rc = rd_u64(c, n_t, "the header")) || (rc = rd_u64(c, n_kv, "the header"))) return rc;
    /* a key/value takes at least 13 bytes (empty key, type, one byte), a tensor info 32 */
    if (*n_kv > left(c) / 13)
        return mk__fail(MK_ERR_FORMAT,
                        "%s: header: kv_count %llu is more than a file of %zu bytes can hold",
                        f->path, (unsigned long long)*n_kv, f->size);
    if (*n_t > left(c) / 32)
        return mk__fail(MK_ERR_FORMAT,
                        "%s: header: tensor_count %llu is more than a file of %zu bytes can hold",
                        f->path, (unsigned long long)*n_t, f->size);
    return MK_OK;
}

/* general.alignment: absent (32) or a u32 power of two. */
static int rd_alignment(gfile *f)
{
    f->alignment = 32;
    const gkv *a = find_kv(f, "general.alignment");
    if (!a) return MK_OK;
    uint32_t v = a->type == GV_U32 ? le32(a->val) : 0;
    if (!v || (v & (v - 1)))
        return mk__fail(MK_ERR_FORMAT, "%s: key 'general.alignment' must be a u32 power of two",
                        f->path);
    f->alignment = v;
    return MK_OK;
}

/* Maps path and reads its structure; on failure nothing needs closing. */
static int gopen(gfile *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        int e = errno;
        close(fd);
        return mk__fail(MK_ERR_IO, "%s: %s", path,
                        e && !S_ISREG(st.st_mode) ? strerror(e) : "empty or not a regular file");
    }
    f->size = (size_t)st.st_size;
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return mk__fail(MK_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    }
    cur c = {f->map, (const unsigned char *)f->map + f->size, f};
    uint64_t n_t, n_kv;
    int rc = rd_header(f, &c, &n_t, &n_kv);
    if (!rc) {
        f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
        f->t = calloc(n_t ? n_t : 1, sizeof *f->t);
        if (!f->kv || !f->t)
            rc = mk__fail(MK_ERR_NOMEM,
                          "%s: cannot allocate the tables of %llu keys and %llu "
                          "tensors",
                          path, (unsigned long long)n_kv, (unsigned long long)n_t);
    }
    for (; !rc && f->n_kv < n_kv; f->n_kv++) rc = rd_kv(&c, &f->kv[f->n_kv]);
    for (; !rc && f->n_t < n_t; f->n_t++) rc = rd_tensor(&c, &f->t[f->n_t]);
    if (!rc) rc = rd_alignment(f);
    if (!rc) {
        size_t pos = (size_t)(c.p - (const unsigned char *)f->map);
        size_t start = (pos + f->alignment - 1) / f->alignment * f->alignment;
        if (start > f->size) start = f->size; /* no data: only an empty tensor table is valid */
        f->data = (const unsigned char *)f->map + start;
        f->data_size = f->size - start;
    }
    if (rc) gclose(f);
    return rc;
}

/* ---- metadata values ------------------------------------------------------ */

/* An integer key (any integer type, not negative, at most INT32_MAX).  MK_ERR_MISSING (no
 * message) when absent, MK_ERR_FORMAT naming the key otherwise. */
static int kv_int(const gfile *f, const char *key, int *out)
{
    const gkv *kv = find_kv(f, key);
    if (!kv) return MK_ERR_MISSING;
    long long v = -1;
    const unsigned char *p = kv->val;
    switch (kv->type) {
    case GV_U8:
        v = p[0];
        break;
    case GV_I8:
        v = (int8_t)p[0];
        break;
    case GV_U16:
        v = le16(p);
        break;
    case GV_I16:
        v = (int16_t)le16(p);
        break;
    case GV_U32:
        v = le32(p);
        break;
    case GV_I32:
        v = (int32_t)le32(p);
        break;
    case GV_U64:
        v = le64(p) > INT32_MAX ? -1 : (long long)le64(p);
        break;
    case GV_I64:
        v = (long long)le64(p);
        break;
    default:
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is a %s, not an integer", f->path, key,
                        gv_name[kv->type]);
    }
    if (v < 0 || v > INT32_MAX)
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' = %lld is out of range", f->path, key, v);
    *out = (int)v;
    return MK_OK;
}

static int kv_float(const gfile *f, const char *key, double *out)
{
    const gkv *kv = find_kv(f, key);
    if (!kv) return MK_ERR_MISSING;
    if (kv->type == GV_F32) {
        uint32_t u = le32(kv->val);
        float x;
        memcpy(&x, &u, 4);
        *out = x;
    } else if (kv->type == GV_F64) {
        uint64_t u = le64(kv->val);
        memcpy(out, &u, 8);
    } else {
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is a %s, not a float", f->path, key,
                        gv_name[kv->type]);
    }
    return MK_OK;
}

static int kv_string(const gfile *f, const char *key, gstr *out)
{
    const gkv *kv = find_kv(f, key);
    if (!kv) return MK_ERR_MISSING;
    if (kv->type != GV_STRING)
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is a %s, not a string", f->path, key,
                        gv_name[kv->type]);
    out->n = (size_t)le64(kv->val);
    out->p = (const char *)kv->val + 8;
    return MK_OK;
}

static int need(int rc, const gfile *f, const char *key)
{
    if (rc == MK_ERR_MISSING)
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is missing (a llama GGUF has it)", f->path,
                        key);
    return rc;
}

/* ---- the llama configuration ---------------------------------------------- */

/* Puts "path: " before the message a library call just recorded. */
static int prefix_error(int rc, const char *path)
{
    char msg[400];
    snprintf(msg, sizeof msg, "%s", mk_last_error());
    return mk__fail(rc, "%s: %s", path, msg);
}

/* Fills cfg from the llama.* keys and the tensor table (vocabulary from token_embd's rows, the
 * head untied when output.weight is present).  Refuses other architectures and llama settings
 * this library does not run. */
static int gconfig(const gfile *f, mk_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    gstr arch;
    int rc = need(kv_string(f, "general.architecture", &arch), f, "general.architecture");
    if (rc) return rc;
    if (!streq(arch, "llama"))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: general.architecture is '%.*s'; only 'llama' GGUF files are read",
                        f->path, KEYA(arch));
    cfg->arch = MK_ARCH_LLAMA;
    struct {
        const char *key;
        int *dst;
    } ints[] = {{"llama.block_count", &cfg->n_layer},
                {"llama.embedding_length", &cfg->n_embd},
                {"llama.attention.head_count", &cfg->n_head},
                {"llama.feed_forward_length", &cfg->n_inner},
                {"llama.context_length", &cfg->block_size}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if ((rc = need(kv_int(f, ints[i].key, ints[i].dst), f, ints[i].key))) return rc;
        if (*ints[i].dst <= 0)
            return mk__fail(MK_ERR_FORMAT, "%s: key '%s' must be positive", f->path, ints[i].key);
    }
    /* the rotary tables hold block_size rows: a bound keeps an untrusted file from sizing them */
    if (cfg->block_size > MAX_CONTEXT)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'llama.context_length' = %d is beyond this loader's %d", f->path,
                        cfg->block_size, MAX_CONTEXT);
    rc = kv_int(f, "llama.attention.head_count_kv", &cfg->n_kv_head);
    if (rc == MK_ERR_MISSING)
        cfg->n_kv_head = cfg->n_head;
    else if (rc)
        return rc;
    double x;
    if ((rc = need(kv_float(f, "llama.attention.layer_norm_rms_epsilon", &x), f,
                   "llama.attention.layer_norm_rms_epsilon")))
        return rc;
    if (!(x > 0 && x < 1))
        return mk__fail(MK_ERR_FORMAT, "%s: key 'llama.attention.layer_norm_rms_epsilon' = %g",
                        f->path, x);
    cfg->norm_eps = (float)x;
    rc = kv_float(f, "llama.rope.freq_base", &x);
    if (rc == MK_ERR_MISSING)
        x = 10000.0;
    else if (rc)
        return rc;
    if (!(x > 0 && x < 1e12))
        return mk__fail(MK_ERR_FORMAT, "%s: key 'llama.rope.freq_base' = %g", f->path, x);
    cfg->rope_theta = (float)x;

    /* head_dim: attention.key_length when given, else n_embd / n_head; the rotation must cover
     * all of it */
    int hd = 0, v;
    rc = kv_int(f, "llama.attention.key_length", &hd);
    if (rc == MK_ERR_MISSING) {
        if (cfg->n_embd % cfg->n_head)
            return mk__fail(MK_ERR_FORMAT, "%s: head_count %d does not divide embedding_length %d",
                            f->path, cfg->n_head, cfg->n_embd);
        hd = cfg->n_embd / cfg->n_head;
    } else if (rc) {
        return rc;
    }
    if (!(rc = kv_int(f, "llama.attention.value_length", &v)) && v != hd)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'llama.attention.value_length' %d differs from the key length %d",
                        f->path, v, hd);
    if (rc && rc != MK_ERR_MISSING) return rc;
    if (!(rc = kv_int(f, "llama.rope.dimension_count", &v)) && v != hd)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'llama.rope.dimension_count' %d differs from head_dim %d "
                        "(partial rotary embeddings are not supported)",
                        f->path, v, hd);
    if (rc && rc != MK_ERR_MISSING) return rc;
    cfg->head_dim = hd;
    if (!(rc = kv_int(f, "llama.expert_count", &v)) && v > 0)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'llama.expert_count' = %d: mixture-of-experts is not supported",
                        f->path, v);
    if (rc && rc != MK_ERR_MISSING) return rc;
    gstr s;
    if (!(rc = kv_string(f, "llama.rope.scaling.type", &s)) && !streq(s, "none"))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'llama.rope.scaling.type' is '%.*s': rope scaling is not "
                        "supported for GGUF files",
                        f->path, KEYA(s));
    if (rc && rc != MK_ERR_MISSING) return rc;

    const gtensor *emb = find_tensor(f, "token_embd.weight");
    if (!emb) return mk__fail(MK_ERR_MISSING, "%s: tensor 'token_embd.weight' is missing", f->path);
    if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > INT32_MAX)
        return mk__fail(MK_ERR_SHAPE, "%s: tensor 'token_embd.weight' is not a matrix [vocab, %d]",
                        f->path, cfg->n_embd);
    cfg->vocab_size = (int)emb->ne[1];
    if (!(rc = kv_int(f, "llama.vocab_size", &v)) && v != cfg->vocab_size)
        return mk__fail(MK_ERR_SHAPE,
                        "%s: key 'llama.vocab_size' %d differs from token_embd.weight's %d rows",
                        f->path, v, cfg->vocab_size);
    if (rc && rc != MK_ERR_MISSING) return rc;
    cfg->untied_head = find_tensor(f, "output.weight") != NULL;
    mk_config r;
    if ((rc = mk_config_resolve(cfg, &r))) return prefix_error(rc, f->path);
    return MK_OK;
}

int mk_read_gguf_config(mk_config *out, const char *path)
{
    if (!out || !path) return mk__fail(MK_ERR_ARG, "mk_read_gguf_config: NULL argument");
    gfile f;
    int rc = gopen(&f, path);
    if (rc) return rc;
    rc = gconfig(&f, out);
    gclose(&f);
    return rc;
}

/* ---- tensors -------------------------------------------------------------- */

/* GGUF's llama tensor names and transformers' (under model.layers.N. for blk.N.). */
static const char *const blk_names[][2] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

enum { ROT_NONE, ROT_Q, ROT_K };

/* The checkpoint tensor (mk__hf_find index) a GGUF tensor name stands for, or -1; *rot says
 * whether its rows need llama.cpp's rotary permutation undone. */
static int map_name(const mk_model *m, gstr name, int *rot)
{
    char z[128], hf[160];
    *rot = ROT_NONE;
    if (name.n >= sizeof z) return -1;
    memcpy(z, name.p, name.n);
    z[name.n] = 0;
    if (!strcmp(z, "token_embd.weight")) return mk__hf_find(m, "model.embed_tokens.weight");
    if (!strcmp(z, "output_norm.weight")) return mk__hf_find(m, "model.norm.weight");
    if (!strcmp(z, "output.weight")) return mk__hf_find(m, "lm_head.weight");
    if (strncmp(z, "blk.", 4) || z[4] < '0' || z[4] > '9') return -1;
    char *end;
    long l = strtol(z + 4, &end, 10);
    if (*end != '.' || l >= m->cfg.n_layer || end - (z + 4) > 6) return -1;
    for (size_t k = 0; k < sizeof blk_names / sizeof *blk_names; k++)
        if (!strcmp(end + 1, blk_names[k][0])) {
            snprintf(hf, sizeof hf, "model.layers.%ld.%s", l, blk_names[k][1]);
            *rot = k == 1 ? ROT_Q : k == 2 ? ROT_K : ROT_NONE;
            return mk__hf_find(m, hf);
        }
    return -1;
}

/* Bytes of tensor t's data (a readable type); 0 with a message when its row length is not a
 * whole number of blocks or the size overflows. */
static int tensor_bytes(const gfile *f, const gtensor *t, size_t *out)
{
    size_t blk = 1, bb = 0;
    type_block(t->type, &blk, &bb);
    if (t->ne[0] % blk)
        return mk__fail(MK_ERR_FORMAT,
                        "%s: tensor " KEYF ": rows of %llu values are not whole %s blocks of %zu",
                        f->path, KEYA(t->name), (unsigned long long)t->ne[0],
                        ggml_type_name(t->type), blk);
    if (t->ne[0] / blk > UINT64_MAX / bb)
        return mk__fail(MK_ERR_FORMAT, "%s: tensor " KEYF ": its size overflows", f->path,
                        KEYA(t->name));
    uint64_t n = t->ne[0] / blk * bb;
    for (int d = 1; d < 4; d++) {
        if (t->ne[d] && n > UINT64_MAX / t->ne[d])
            return mk__fail(MK_ERR_FORMAT, "%s: tensor " KEYF ": its size overflows", f->path,
                            KEYA(t->name));
        n *= t->ne[d];
    }
    *out = (size_t)n;
    return MK_OK;
}

/* Checks that tensor t can be read: a readable type, whole blocks, an aligned offset, its data
 * inside the file.  *numel receives its element count. */
static int check_data(const gfile *f, const gtensor *t, size_t *numel)
{
    size_t blk = 1, bb = 0, nbytes = 0;
    if (!type_block(t->type, &blk, &bb))
        return mk__fail(MK_ERR_DTYPE,
                        "%s: tensor " KEYF " is %s (ggml type %u); only F32, F16, BF16, Q8_0, "
                        "Q4_0 and Q4_1 are read",
                        f->path, KEYA(t->name), ggml_type_name(t->type), t->type);
    int rc = tensor_bytes(f, t, &nbytes);
    if (rc) return rc;
    if (t->offset % f->alignment)
        return mk__fail(MK_ERR_FORMAT,
                        "%s: tensor " KEYF ": offset %llu is not a multiple of the "
                        "alignment %llu",
                        f->path, KEYA(t->name), (unsigned long long)t->offset,
                        (unsigned long long)f->alignment);
    if (t->offset > f->data_size || nbytes > f->data_size - t->offset)
        return mk__fail(MK_ERR_TRUNCATED,
                        "%s: tensor " KEYF ": its %zu bytes at data offset %llu run past the end "
                        "of the file (%zu bytes of data)",
                        f->path, KEYA(t->name), nbytes, (unsigned long long)t->offset,
                        f->data_size);
    /* nbytes fits in the file, so the count cannot overflow: at most 32 values per 18 bytes */
    *numel = (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    return MK_OK;
}

/* Every tensor readable, and the model the config describes no larger than the values the
 * file holds: a small file cannot make the loader allocate a large model. */
static int check_all_data(const gfile *f, const mk_config *cfg)
{
    size_t total = 0, numel = 0;
    for (size_t i = 0; i < f->n_t; i++) {
        int rc = check_data(f, &f->t[i], &numel);
        if (rc) return rc;
        total = numel > SIZE_MAX - total ? SIZE_MAX : total + numel; /* tensors may overlap */
    }
    size_t need = mk_config_num_params(cfg);
    if (need > total)
        return mk__fail(MK_ERR_SHAPE,
                        "%s: the llama keys describe %zu parameters but the file's tensors hold "
                        "%zu values",
                        f->path, need, total);
    return MK_OK;
}

/* Checks GGUF tensor t (data already checked) against checkpoint tensor h: the same shape
 * (GGUF lists dimensions innermost first). */
static int check_shape(const gfile *f, const gtensor *t, const mk_tensor_info *h)
{
    int ok = (int)t->n_dims == h->ndim;
    for (int d = 0; ok && d < h->ndim; d++) ok = t->ne[d] == (uint64_t)h->shape[h->ndim - 1 - d];
    if (!ok)
        return mk__fail(MK_ERR_SHAPE,
                        "%s: tensor " KEYF " has ne [%llu, %llu, %llu, %llu] (%u dims); the "
                        "config gives %s [%d, %d]",
                        f->path, KEYA(t->name), (unsigned long long)t->ne[0],
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3], t->n_dims, h->name, h->shape[0],
                        h->ndim == 2 ? h->shape[1] : 1);
    return MK_OK;
}

/* Blocks of 32 values. */
static void deq_q8_0(float *y, const unsigned char *b, size_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 4096)
    for (size_t i = 0; i < nb; i++) {
        const unsigned char *blk = b + i * 34;
        float d = mk_f16_to_f32(le16(blk));
        for (int j = 0; j < 32; j++) y[i * 32 + j] = (float)(int8_t)blk[2 + j] * d;
    }
}

static void deq_q4_0(float *y, const unsigned char *b, size_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 4096)
    for (size_t i = 0; i < nb; i++) {
        const unsigned char *blk = b + i * 18;
        float d = mk_f16_to_f32(le16(blk));
        for (int j = 0; j < 16; j++) {
            y[i * 32 + j] = (float)((blk[2 + j] & 0x0F) - 8) * d;
            y[i * 32 + j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(float *y, const unsigned char *b, size_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 4096)
    for (size_t i = 0; i < nb; i++) {
        const unsigned char *blk = b + i * 20;
        float d = mk_f16_to_f32(le16(blk)), m = mk_f16_to_f32(le16(blk + 2));
        for (int j = 0; j < 16; j++) {
            float lo = (float)(blk[4 + j] & 0x0F) * d, hi = (float)(blk[4 + j] >> 4) * d;
            y[i * 32 + j] = lo + m;
            y[i * 32 + j + 16] = hi + m;
        }
    }
}

/* The n values of a checked tensor as float. */
static void to_float(float *y, const gfile *f, const gtensor *t, size_t n)
{
    const unsigned char *b = f->data + t->offset;
    switch (t->type) {
    case GT_F32:
        memcpy(y, b, n * sizeof(float));
        break;
    case GT_F16:
        for (size_t i = 0; i < n; i++) y[i] = mk_f16_to_f32(le16(b + 2 * i));
        break;
    case GT_BF16:
        for (size_t i = 0; i < n; i++) y[i] = mk_bf16_to_f32(le16(b + 2 * i));
        break;
    case GT_Q8_0:
        deq_q8_0(y, b, n / 32);
        break;
    case GT_Q4_0:
        deq_q4_0(y, b, n / 32);
        break;
    case GT_Q4_1:
        deq_q4_1(y, b, n / 32);
        break;
    }
}

/* Undoes llama.cpp's permute(w, n_head, n_head_kv) of a [heads hd, in] matrix: GGUF row
 * h hd + 2 i + j holds transformers' row h hd + j hd/2 + i. */
static void unpermute(float *dst, const float *src, int heads, int hd, int in)
{
    int half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(dst + ((size_t)h * hd + (size_t)j * half + i) * in,
                       src + ((size_t)h * hd + 2 * (size_t)i + j) * in, (size_t)in * sizeof(float));
}

/* For every GGUF tensor, the checkpoint tensor it fills (idx) and its permutation (rot); every
 * tensor checked, every checkpoint tensor filled exactly once. */
static int plan(const gfile *f, const mk_model *m, int *idx, int *rot)
{
    int *seen = calloc((size_t)m->n_hf, sizeof *seen);
    if (!seen) return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate", f->path);
    int rc = MK_OK;
    for (size_t i = 0; i < f->n_t && !rc; i++) {
        const gtensor *t = &f->t[i];
        idx[i] = map_name(m, t->name, &rot[i]);
        if (idx[i] < 0)
            rc = mk__fail(MK_ERR_UNSUPPORTED,
                          "%s: tensor " KEYF " has no place in a %d-layer llama (this loader "
                          "reads token_embd, blk.N.attn_norm/attn_q/attn_k/attn_v/attn_output/"
                          "ffn_norm/ffn_gate/ffn_up/ffn_down, output_norm, output)",
                          f->path, KEYA(t->name), m->cfg.n_layer);
        else if (seen[idx[i]]++)
            rc = mk__fail(MK_ERR_FORMAT, "%s: tensor " KEYF " appears twice", f->path,
                          KEYA(t->name));
        else
            rc = check_shape(f, t, &m->hf[idx[i]].info);
    }
    for (int i = 0; i < m->n_hf && !rc; i++)
        if (!seen[i])
            rc = mk__fail(MK_ERR_MISSING, "%s: no tensor for %s (the config needs it)", f->path,
                          m->hf[i].info.name);
    free(seen);
    return rc;
}

/* Converts every planned tensor into params (host, n_params floats). */
static int fill(const gfile *f, const mk_model *m, const int *idx, const int *rot, float *params)
{
    size_t most = 0;
    for (size_t i = 0; i < f->n_t; i++)
        if (m->hf[idx[i]].info.numel > most) most = m->hf[idx[i]].info.numel;
    float *a = malloc(most * sizeof(float)), *b = malloc(most * sizeof(float));
    int rc = MK_OK;
    if (!a || !b) rc = mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu floats", f->path, 2 * most);
    for (size_t i = 0; i < f->n_t && !rc; i++) {
        const mk_tensor_info *h = &m->hf[idx[i]].info;
        to_float(a, f, &f->t[i], h->numel);
        const float *src = a;
        if (rot[i] != ROT_NONE) {
            int heads = rot[i] == ROT_Q ? m->cfg.n_head : m->cfg.n_kv_head;
            unpermute(b, a, heads, m->cfg.head_dim, h->shape[1]);
            src = b;
        }
        mk__hf_scatter(m, idx[i], params, src);
    }
    free(a);
    free(b);
    return rc;
}

int mk_load_gguf(mk_model **out, const char *path, int max_batch, int max_seq, const mk_backend *be)
{
    return mk_load_gguf_ex(out, path, max_batch, max_seq, be, 0);
}

int mk_load_gguf_ex(mk_model **out, const char *path, int max_batch, int max_seq,
                    const mk_backend *be, unsigned flags)
{
    if (!out || !path) return mk__fail(MK_ERR_ARG, "mk_load_gguf: NULL argument");
    *out = NULL;
    gfile f;
    int rc = gopen(&f, path);
    if (rc) return rc;
    mk_config cfg;
    mk_model *m = NULL;
    int *idx = NULL, *rot = NULL;
    if (!(rc = gconfig(&f, &cfg)) && !(rc = check_all_data(&f, &cfg)) &&
        (rc = mk_model_new_ex(&m, &cfg, max_batch, max_seq, be ? be : mk_backend_cpu(), flags)))
        rc = prefix_error(rc, path);
    if (!rc) {
        idx = malloc(f.n_t * sizeof *idx + 1);
        rot = malloc(f.n_t * sizeof *rot + 1);
        if (!idx || !rot) rc = mk__fail(MK_ERR_NOMEM, "%s: cannot allocate", path);
    }
    if (!rc) rc = plan(&f, m, idx, rot);
    /* On the CPU straight into the parameters (the model is new and freed on failure);
     * elsewhere through one host buffer uploaded once. */
    int host = !rc && m->be == &mk__cpu_backend;
    float *buf = rc || host ? NULL : malloc(sizeof(float) * m->n_params);
    if (!rc && !host && !buf)
        rc = mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu parameters", path, m->n_params);
    if (!rc) rc = fill(&f, m, idx, rot, host ? m->params : buf);
    if (!rc && !host) m->be->upload(m->params, buf, sizeof(float) * m->n_params);
    free(buf);
    free(idx);
    free(rot);
    gclose(&f);
    if (rc) {
        mk_model_free(m);
        return rc;
    }
    mk__params_changed(m);
    mk__bf16_sync(m);
    *out = m;
    return MK_OK;
}
