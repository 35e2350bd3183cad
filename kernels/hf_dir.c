/*
 * hf_dir.c - Hugging Face model folders: config.json (parsed with cJSON) and
 * the weights in one model.safetensors or in shards named by
 * model.safetensors.index.json, in F32, BF16 or F16.
 *
 * Loading reads the config first and refuses anything that is not a GPT-2
 * with the numerics model.c implements, then maps every shard once
 * (safetensors.c), checks every tensor the model needs against the size
 * table, and only then converts the tensors into one buffer and uploads it;
 * a refused folder leaves no model behind.  Saving writes what save_pretrained writes for a
 * GPT2LMHeadModel of that dtype: names with the "transformer." prefix, the
 * tied lm_head left out, shards plus an index when asked.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "mk_internal.h"

/* Reads a whole (small, JSON) file into a NUL-terminated buffer. */
static int slurp(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mk__fail(MK_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    while (s) {
        n += fread(s + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *ns = realloc(s, cap *= 2);
        if (!ns) free(s);
        s = ns;
    }
    int err = ferror(f);
    fclose(f);
    if (!s) return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate", path);
    if (err) {
        free(s);
        return mk__fail(MK_ERR_IO, "%s: read error", path);
    }
    s[n] = 0;
    *out = s;
    return MK_OK;
}

static int parse_json(const char *path, cJSON **out)
{
    char *text = NULL;
    int rc = slurp(path, &text);
    if (rc) return rc;
    *out = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        return mk__fail(MK_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return MK_OK;
}

static int positive_int(const cJSON *root, const char *path, const char *key, int *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > INT_MAX ||
        x->valuedouble != floor(x->valuedouble))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is missing or not a positive integer", path,
                        key);
    *v = (int)x->valuedouble;
    return MK_OK;
}

/* A boolean key that must be absent or equal to want. */
static int bool_is(const cJSON *root, const char *path, const char *key, int want)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x)) return MK_OK;
    if (!cJSON_IsBool(x))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is not a boolean", path, key);
    if (!cJSON_IsTrue(x) != !want)
        return mk__fail(MK_ERR_UNSUPPORTED, "%s: key '%s' is %s; only %s is implemented", path, key,
                        want ? "false" : "true", want ? "true" : "false");
    return MK_OK;
}

static int check_numerics(const cJSON *root, const char *path, int n_embd)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    if (x && !(cJSON_IsString(x) && (!strcmp(x->valuestring, "gelu_new") ||
                                     !strcmp(x->valuestring, "gelu_pytorch_tanh"))))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'activation_function' is %.60s; only gelu_new (tanh GELU) is "
                        "implemented",
                        path, cJSON_IsString(x) ? x->valuestring : "not a string");
    x = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (x && !(cJSON_IsNumber(x) && fabs(x->valuedouble - 1e-5) <= 1e-12))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'layer_norm_epsilon' is %g; only 1e-05 is implemented", path,
                        cJSON_IsNumber(x) ? x->valuedouble : NAN);
    x = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (x && !cJSON_IsNull(x) && !(cJSON_IsNumber(x) && x->valuedouble == 4.0 * n_embd))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'n_inner' is not null or 4*n_embd (%d); only that MLP width is "
                        "implemented",
                        path, 4 * n_embd);
    int rc = bool_is(root, path, "scale_attn_weights", 1);
    if (!rc) rc = bool_is(root, path, "scale_attn_by_inverse_layer_idx", 0);
    if (!rc) rc = bool_is(root, path, "add_cross_attention", 0);
    return rc;
}

int mk_read_hf_config(mk_config *out, int *tied, const char *path)
{
    if (!out || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    cJSON *root;
    int rc = parse_json(path, &root);
    if (rc) return rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    mk_config c = {0};
    if (!cJSON_IsString(mt))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'model_type' is missing or not a string", path);
    else if (strcmp(mt->valuestring, "gpt2"))
        rc = mk__fail(MK_ERR_UNSUPPORTED,
                      "%s: model_type '%.60s' is not supported (this library implements gpt2)",
                      path, mt->valuestring);
    if (!rc) rc = positive_int(root, path, "n_layer", &c.n_layer);
    if (!rc) rc = positive_int(root, path, "n_head", &c.n_head);
    if (!rc) rc = positive_int(root, path, "n_embd", &c.n_embd);
    if (!rc) rc = positive_int(root, path, "n_positions", &c.block_size);
    if (!rc) rc = positive_int(root, path, "vocab_size", &c.vocab_size);
    if (!rc && c.n_embd % c.n_head)
        rc = mk__fail(MK_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d", path, c.n_head,
                      c.n_embd);
    if (!rc) rc = check_numerics(root, path, c.n_embd);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (!rc && tie && !cJSON_IsBool(tie))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'tie_word_embeddings' is not a boolean", path);
    if (!rc) {
        *out = c;
        if (tied) *tied = !tie || cJSON_IsTrue(tie);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- loading ------------------------------------------------------------ */

typedef struct shard {
    char *file; /* name in the folder, as the index gives it */
    char *path; /* DIR/file; the mapped file borrows it */
    mk__st_file st;
} shard;

typedef struct folder {
    const char *dir;
    char index_path[4096];
    cJSON *index;            /* NULL for a single model.safetensors */
    const cJSON *weight_map; /* inside index */
    shard *shards;
    int n_shards;
} folder;

static void folder_close(folder *fo)
{
    for (int i = 0; i < fo->n_shards; i++) {
        mk__st_close(&fo->shards[i].st);
        free(fo->shards[i].file);
        free(fo->shards[i].path);
    }
    free(fo->shards);
    cJSON_Delete(fo->index);
}

/* Maps DIR/file unless it is mapped already. */
static int add_shard(folder *fo, const char *file)
{
    for (int i = 0; i < fo->n_shards; i++)
        if (!strcmp(fo->shards[i].file, file)) return MK_OK;
    if (!*file || strchr(file, '/') || !strcmp(file, ".."))
        return mk__fail(MK_ERR_FORMAT, "%s: shard name '%.200s' is not a file in the folder",
                        fo->index_path, file);
    shard *ns = realloc(fo->shards, sizeof(shard) * (size_t)(fo->n_shards + 1));
    if (!ns) return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate shards", fo->dir);
    fo->shards = ns;
    shard *s = &ns[fo->n_shards];
    memset(s, 0, sizeof *s);
    size_t n = strlen(fo->dir) + strlen(file) + 2;
    s->file = strdup(file);
    s->path = malloc(n);
    if (!s->file || !s->path) {
        free(s->file);
        free(s->path);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate shards", fo->dir);
    }
    snprintf(s->path, n, "%s/%s", fo->dir, file);
    int rc = mk__st_open(&s->st, s->path);
    if (rc) {
        free(s->file);
        free(s->path);
        return rc;
    }
    fo->n_shards++;
    return MK_OK;
}

/* Opens model.safetensors, or else the index and every shard it names. */
static int folder_open(folder *fo)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", fo->dir);
    snprintf(fo->index_path, sizeof fo->index_path, "%s/model.safetensors.index.json", fo->dir);
    if (!access(path, F_OK)) return add_shard(fo, "model.safetensors");
    if (access(fo->index_path, F_OK))
        return mk__fail(MK_ERR_IO,
                        "%s: neither model.safetensors nor "
                        "model.safetensors.index.json is there",
                        fo->dir);
    int rc = parse_json(fo->index_path, &fo->index);
    if (rc) return rc;
    fo->weight_map = cJSON_GetObjectItemCaseSensitive(fo->index, "weight_map");
    if (!cJSON_IsObject(fo->weight_map))
        return mk__fail(MK_ERR_FORMAT, "%s: no 'weight_map' object", fo->index_path);
    const cJSON *x;
    cJSON_ArrayForEach(x, fo->weight_map)
    {
        if (!cJSON_IsString(x))
            return mk__fail(MK_ERR_FORMAT, "%s: weight_map entry '%.200s' is not a file name",
                            fo->index_path, x->string);
        if ((rc = add_shard(fo, x->valuestring))) {
            char msg[400]; /* say which tensor needed the shard that failed */
            snprintf(msg, sizeof msg, "%s", mk_last_error());
            return mk__fail(rc, "%s (the shard of tensor '%.100s' in %.200s)", msg, x->string,
                            fo->index_path);
        }
    }
    return MK_OK;
}

/* Finds tensor name (unprefixed) and checks it.  *sh and *e receive where it is; optional
 * tensors that are absent give MK_OK with *e NULL. */
static int locate(const folder *fo, const char *name, int ndim, const int *shape, int optional,
                  const shard **sh, const mk__st_entry **e)
{
    *sh = fo->n_shards ? &fo->shards[0] : NULL;
    *e = NULL;
    if (fo->weight_map) {
        const cJSON *x, *hit = NULL;
        cJSON_ArrayForEach(x, fo->weight_map) if (!strcmp(mk__st_strip(x->string), name)) hit = x;
        if (!hit)
            return optional ? MK_OK
                            : mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is not in the weight_map",
                                       fo->index_path, name);
        for (int i = 0; i < fo->n_shards; i++)
            if (!strcmp(fo->shards[i].file, hit->valuestring)) *sh = &fo->shards[i];
    }
    if (!*sh) return mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is in no shard", fo->dir, name);
    *e = mk__st_find(&(*sh)->st, name);
    if (!*e && optional && !fo->weight_map) return MK_OK;
    return mk__st_check(&(*sh)->st, *e, name, ndim, shape, 0);
}

int mk_load_dir(mk_model **out, const char *dir, int max_batch, int max_seq, const mk_backend *be)
{
    if (!out || !dir) return mk__fail(MK_ERR_ARG, "NULL argument");
    *out = NULL;
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    mk_config cfg;
    int tied;
    int rc = mk_read_hf_config(&cfg, &tied, cpath);
    if (rc) return rc;
    mk_model *m;
    if ((rc = mk_model_new(&m, &cfg, max_batch, max_seq, be ? be : mk_backend_cpu()))) return rc;
    folder fo = {.dir = dir};
    rc = folder_open(&fo);
    const shard *sh;
    const mk__st_entry *e;
    for (int i = 0; i < m->n_tensors && !rc; i++)
        rc = locate(&fo, m->tensors[i].name, m->tensors[i].ndim, m->tensors[i].shape, 0, &sh, &e);
    const shard *head_sh = NULL;
    const mk__st_entry *head = NULL;
    int head_shape[2] = {cfg.vocab_size, cfg.n_embd};
    if (!rc) rc = locate(&fo, "lm_head.weight", 2, head_shape, 1, &head_sh, &head);
    if (!rc && !head && !tied)
        rc = mk__fail(MK_ERR_MISSING,
                      "%s: tie_word_embeddings is false but tensor 'lm_head.weight' is missing",
                      cpath);
    size_t nh = head ? (size_t)cfg.vocab_size * (size_t)cfg.n_embd : 0;
    /* On the CPU the tensors are converted from the mapping straight into the parameters (the
     * model is new and freed on failure, so nothing needs keeping); elsewhere through one host
     * buffer that is uploaded once. */
    int host = m->be == &mk__cpu_backend;
    float *buf = rc || host ? NULL : malloc(sizeof(float) * m->n_params);
    float *dst = host ? m->params : buf, *h = rc || !head ? NULL : malloc(sizeof(float) * nh);
    if (!rc && (!dst || (head && !h)))
        rc = mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu parameters", dir, m->n_params);
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        locate(&fo, m->tensors[i].name, m->tensors[i].ndim, m->tensors[i].shape, 0, &sh, &e);
        mk__st_read(dst + m->tensors[i].offset, &sh->st, e);
    }
    if (!rc && head) {
        /* GPT-2 here has one output matrix, wte: a head that differs cannot be held */
        const float *wte = dst + m->tensors[0].offset;
        mk__st_read(h, &head_sh->st, head);
        for (size_t j = 0; j < nh && !rc; j++)
            if (!(h[j] == wte[j]))
                rc = mk__fail(MK_ERR_UNSUPPORTED,
                              "%s: tensor '%s' differs from wte.weight (element %zu): an untied "
                              "output head, but GPT-2 here is tied-only",
                              head_sh->path, head->name, j);
    }
    if (!rc && !host) m->be->upload(m->params, buf, sizeof(float) * m->n_params);
    free(buf);
    free(h);
    folder_close(&fo);
    if (rc) {
        mk_model_free(m);
        return rc;
    }
    *out = m;
    return MK_OK;
}

/* ---- saving ------------------------------------------------------------- */

/* Writes text to path via path.tmp and rename. */
static int write_atomic(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return mk__fail(MK_ERR_IO, "%s: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) {
        int e = errno;
        remove(tmp);
        return mk__fail(MK_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return MK_OK;
}

static int write_json(const char *path, cJSON *root)
{
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return mk__fail(MK_ERR_NOMEM, "%s: cannot build the JSON", path);
    int rc = write_atomic(path, text);
    cJSON_free(text);
    return rc;
}

static int save_config(const mk_config *c, const char *path, mk_dtype dt)
{
    static const char *const torch_names[] = {"float32", "bfloat16", "float16"};
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(r, "model_type", "gpt2");
    cJSON_AddNumberToObject(r, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(r, "n_head", c->n_head);
    cJSON_AddNumberToObject(r, "n_embd", c->n_embd);
    cJSON_AddNumberToObject(r, "n_positions", c->block_size);
    cJSON_AddNumberToObject(r, "n_ctx", c->block_size);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    cJSON_AddNullToObject(r, "n_inner");
    cJSON_AddStringToObject(r, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(r, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(r, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "attn_pdrop", 0.0);
    cJSON_AddTrueToObject(r, "scale_attn_weights");
    cJSON_AddFalseToObject(r, "scale_attn_by_inverse_layer_idx");
    cJSON_AddFalseToObject(r, "reorder_and_upcast_attn");
    cJSON_AddTrueToObject(r, "tie_word_embeddings");
    /* GPT2Config's defaults (50256) lie outside a small vocabulary; Manta names no specials */
    cJSON_AddNullToObject(r, "bos_token_id");
    cJSON_AddNullToObject(r, "eos_token_id");
    /* transformers 5 reads "dtype"; 4.x read "torch_dtype" */
    cJSON_AddStringToObject(r, "dtype", torch_names[dt]);
    cJSON_AddStringToObject(r, "torch_dtype", torch_names[dt]);
    return write_json(path, r);
}

int mk_save_dir(const mk_model *m, const char *dir, mk_dtype dt, size_t max_shard_bytes)
{
    if (!m || !dir || (dt != MK_F32 && dt != MK_BF16 && dt != MK_F16))
        return mk__fail(MK_ERR_ARG, "mk_save_dir: NULL argument or unknown dtype %d", (int)dt);
    size_t es = dt == MK_F32 ? 4 : 2;
    /* shard boundaries: tensors in order, a new shard when the next would overflow */
    int *first = malloc(sizeof(int) * (size_t)(m->n_tensors + 1)), n_sh = 0;
    float *buf = malloc(sizeof(float) * m->n_params);
    if (!first || !buf) {
        free(first);
        free(buf);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu parameters", dir, m->n_params);
    }
    size_t in_shard = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        size_t b = m->tensors[i].numel * es;
        if (i == 0 || (max_shard_bytes && in_shard + b > max_shard_bytes && in_shard)) {
            first[n_sh++] = i;
            in_shard = 0;
        }
        in_shard += b;
    }
    first[n_sh] = m->n_tensors;
    m->be->download(buf, m->params, sizeof(float) * m->n_params);
    char path[4096], other[4096];
    int rc = MK_OK;
    if (!max_shard_bytes) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = mk__st_write(path, m->tensors, m->n_tensors, buf, dt, "transformer.");
        snprintf(other, sizeof other, "%s/model.safetensors.index.json", dir);
    } else {
        cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)(m->n_params * es));
        cJSON_AddNumberToObject(meta, "total_parameters", (double)m->n_params);
        cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
        for (int s = 0; s < n_sh && !rc; s++) {
            char file[64], name[128];
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_sh);
            snprintf(path, sizeof path, "%s/%s", dir, file);
            rc = mk__st_write(path, m->tensors + first[s], first[s + 1] - first[s], buf, dt,
                              "transformer.");
            for (int i = first[s]; i < first[s + 1]; i++) {
                snprintf(name, sizeof name, "transformer.%s", m->tensors[i].name);
                cJSON_AddStringToObject(wm, name, file);
            }
        }
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!rc)
            rc = write_json(path, idx);
        else
            cJSON_Delete(idx);
        snprintf(other, sizeof other, "%s/model.safetensors", dir);
    }
    /* the other layout, from an earlier save, would shadow or contradict this one */
    if (!rc && remove(other) && errno != ENOENT)
        rc = mk__fail(MK_ERR_IO, "%s: cannot remove: %s", other, strerror(errno));
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!rc) rc = save_config(&m->cfg, path, dt);
    free(first);
    free(buf);
    return rc;
}
