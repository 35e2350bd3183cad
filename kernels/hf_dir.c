/*
 * hf_dir.c - Hugging Face checkpoints of the four families (gpt2, llama,
 * qwen2, qwen3): config.json (parsed with cJSON) and the weights under
 * transformers' names, in one model.safetensors or in shards named by
 * model.safetensors.index.json, F32, BF16 or F16; and single F32 files
 * (mk_load, mk_save).
 *
 * Every tensor goes through the model's checkpoint map (m->hf, built by
 * model.c): each checkpoint tensor has its transformers name and shape and
 * lands in an internal tensor whole (COPY: converted straight from the
 * mapped file into the parameters) or as the transposed columns or the slice
 * of a fused one (TCOLS, SLICE: converted into one buffer of the largest such
 * tensor, then scattered).  No file is read twice.
 *
 * Loading reads the config first and refuses anything whose numerics the
 * library does not implement, then maps every shard once (safetensors.c),
 * checks every tensor the model needs, and only then converts; a refused
 * folder leaves no model behind.  Saving writes what save_pretrained writes
 * for the family's *ForCausalLM in that dtype: full names ("transformer."
 * for GPT-2, "model." and an untied "lm_head.weight" for the others), the
 * tied head left out, shards plus an index when asked.
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

/* ---- JSON ---------------------------------------------------------------- */

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

/* Writes text to path via path.tmp and rename. */
static int write_atomic(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return mk__fail(MK_ERR_IO, "%s: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF, e = ok ? 0 : errno;
    if (fclose(f) && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path)) ok = 0, e = errno;
    if (!ok) {
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

/* ---- reading config.json -------------------------------------------------- */

/* The key of object o; absent and null read the same, as transformers reads them. */
static const cJSON *key_of(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return x && !cJSON_IsNull(x) ? x : NULL;
}

#define REQUIRED INT_MIN

/* An integer key >= lo; absent gives dflt (REQUIRED: an error). pre prefixes the key's name in
 * messages (the object it is in). */
static int int_key(const cJSON *o, const char *path, const char *pre, const char *key, int dflt,
                   int lo, int *v)
{
    const cJSON *x = key_of(o, key);
    if (!x && dflt == REQUIRED)
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s%s' is missing", path, pre, key);
    if (!x) {
        *v = dflt;
        return MK_OK;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble < lo || x->valuedouble > INT_MAX ||
        x->valuedouble != floor(x->valuedouble))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s%s' is not an integer in [%d, %d]", path, pre,
                        key, lo, INT_MAX);
    *v = (int)x->valuedouble;
    return MK_OK;
}

/* A finite number key; absent gives dflt (NAN: an error). */
static int num_key(const cJSON *o, const char *path, const char *pre, const char *key, double dflt,
                   double *v)
{
    const cJSON *x = key_of(o, key);
    if (!x && isnan(dflt))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s%s' is missing", path, pre, key);
    if (x && !(cJSON_IsNumber(x) && isfinite(x->valuedouble)))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s%s' is not a number", path, pre, key);
    *v = x ? x->valuedouble : dflt;
    return MK_OK;
}

static int bool_key(const cJSON *o, const char *path, const char *key, int dflt, int *v)
{
    const cJSON *x = key_of(o, key);
    if (x && !cJSON_IsBool(x))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is not a boolean", path, key);
    *v = x ? cJSON_IsTrue(x) : dflt;
    return MK_OK;
}

/* A boolean key that must be absent or equal to want. */
static int bool_is(const cJSON *o, const char *path, const char *key, int want)
{
    int v = want, rc = bool_key(o, path, key, want, &v);
    if (!rc && v != want)
        rc = mk__fail(MK_ERR_UNSUPPORTED, "%s: key '%s' is %s; only %s is implemented", path, key,
                      want ? "false" : "true", want ? "true" : "false");
    return rc;
}

/* A string key that must be absent or one of the NULL-terminated list ok[]. */
static int str_in(const cJSON *o, const char *path, const char *key, const char *const *ok,
                  const char *what)
{
    const cJSON *x = key_of(o, key);
    if (!x) return MK_OK;
    for (int i = 0; cJSON_IsString(x) && ok[i]; i++)
        if (!strcmp(x->valuestring, ok[i])) return MK_OK;
    return mk__fail(MK_ERR_UNSUPPORTED, "%s: key '%s' is %.60s; only %s is implemented", path, key,
                    cJSON_IsString(x) ? x->valuestring : "not a string", what);
}

/* Settings any family may carry that this library cannot run: quantised weights and mixtures
 * of experts (their model types are refused anyway; the keys say why). */
static int check_common(const cJSON *r, const char *path)
{
    static const char *const moe[] = {"num_experts", "num_local_experts", "n_routed_experts",
                                      "num_experts_per_tok"};
    if (key_of(r, "quantization_config"))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'quantization_config' is set; quantised weights are not "
                        "implemented",
                        path);
    for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) {
        const cJSON *x = key_of(r, moe[i]);
        if (x && !(cJSON_IsNumber(x) && x->valuedouble == 0))
            return mk__fail(MK_ERR_UNSUPPORTED,
                            "%s: key '%s' is set (a mixture of experts); only dense MLPs are "
                            "implemented",
                            path, moe[i]);
    }
    return MK_OK;
}

static int read_gpt2(const cJSON *r, const char *path, mk_config *c, int *tied)
{
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
    c->arch = MK_ARCH_GPT2;
    int rc = int_key(r, path, "", "n_layer", REQUIRED, 1, &c->n_layer);
    if (!rc) rc = int_key(r, path, "", "n_head", REQUIRED, 1, &c->n_head);
    if (!rc) rc = int_key(r, path, "", "n_embd", REQUIRED, 1, &c->n_embd);
    if (!rc) rc = int_key(r, path, "", "n_positions", REQUIRED, 1, &c->block_size);
    if (!rc) rc = int_key(r, path, "", "vocab_size", REQUIRED, 1, &c->vocab_size);
    if (!rc && c->n_embd % c->n_head)
        rc = mk__fail(MK_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d", path, c->n_head,
                      c->n_embd);
    if (!rc) rc = int_key(r, path, "", "n_inner", 4 * c->n_embd, 1, &c->n_inner);
    double eps = 0;
    if (!rc) rc = num_key(r, path, "", "layer_norm_epsilon", 1e-5, &eps);
    if (!rc && !(eps > 0))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'layer_norm_epsilon' is not positive", path);
    c->norm_eps = (float)eps;
    if (!rc) rc = str_in(r, path, "activation_function", gelu, "gelu_new (tanh GELU)");
    if (!rc) rc = bool_is(r, path, "scale_attn_weights", 1);
    if (!rc) rc = bool_is(r, path, "scale_attn_by_inverse_layer_idx", 0);
    if (!rc) rc = bool_is(r, path, "reorder_and_upcast_attn", 0);
    if (!rc) rc = bool_is(r, path, "add_cross_attention", 0);
    if (!rc) rc = bool_key(r, path, "tie_word_embeddings", 1, tied);
    return rc;
}

/* Sizes of the rotary families, with transformers' defaults for the optional ones. */
static int read_sizes(const cJSON *r, const char *path, mk_config *c)
{
    int rc = int_key(r, path, "", "num_hidden_layers", REQUIRED, 1, &c->n_layer);
    if (!rc) rc = int_key(r, path, "", "num_attention_heads", REQUIRED, 1, &c->n_head);
    if (!rc) rc = int_key(r, path, "", "hidden_size", REQUIRED, 1, &c->n_embd);
    if (!rc) rc = int_key(r, path, "", "intermediate_size", REQUIRED, 1, &c->n_inner);
    if (!rc) rc = int_key(r, path, "", "max_position_embeddings", REQUIRED, 1, &c->block_size);
    if (!rc) rc = int_key(r, path, "", "vocab_size", REQUIRED, 1, &c->vocab_size);
    if (rc) return rc;
    /* LlamaConfig defaults num_key_value_heads to the heads; Qwen2Config and Qwen3Config to 32
     * when the key is absent (and to the heads when it is null) */
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(r, "num_key_value_heads");
    int kv_default = c->arch == MK_ARCH_LLAMA || (kv && cJSON_IsNull(kv)) ? c->n_head : 32;
    rc = int_key(r, path, "", "num_key_value_heads", kv_default, 1, &c->n_kv_head);
    /* head_dim: Qwen3Config's default is 128; the others divide the width by the heads */
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(r, "head_dim");
    if (!rc && c->arch == MK_ARCH_QWEN3 && hd && cJSON_IsNull(hd))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'head_dim' is null", path);
    if (!rc && c->arch != MK_ARCH_QWEN3 && !key_of(r, "head_dim") && c->n_embd % c->n_head)
        rc = mk__fail(MK_ERR_FORMAT,
                      "%s: num_attention_heads %d does not divide hidden_size %d and key "
                      "'head_dim' is missing",
                      path, c->n_head, c->n_embd);
    if (!rc)
        rc = int_key(r, path, "", "head_dim",
                     c->arch == MK_ARCH_QWEN3 ? 128 : c->n_embd / c->n_head, 1, &c->head_dim);
    double eps = 0;
    if (!rc) rc = num_key(r, path, "", "rms_norm_eps", 1e-6, &eps);
    if (!rc && !(eps > 0))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'rms_norm_eps' is not positive", path);
    c->norm_eps = (float)eps;
    return rc;
}

/* Rotary settings.  transformers 5 keeps them in "rope_parameters" ({"rope_theta",
 * "rope_type", ...}); 4.x wrote "rope_theta" at the top and "rope_scaling" (null, or
 * {"rope_type" or "type", ...}).  As transformers does: a non-empty rope_scaling wins, a
 * rope_theta inside the object wins over the top-level one, the default theta is 10000. */
static int read_rope(const cJSON *r, const char *path, mk_config *c)
{
    const char *where = "rope_scaling";
    const cJSON *rp = key_of(r, where);
    if (!rp || (cJSON_IsObject(rp) && !rp->child)) rp = key_of(r, where = "rope_parameters");
    if (rp && !cJSON_IsObject(rp))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s' is not an object", path, where);
    char pre[32];
    snprintf(pre, sizeof pre, "%s.", where);
    const cJSON *x;
    cJSON_ArrayForEach(x, rp)
    {
        if (cJSON_IsObject(x))
            return mk__fail(MK_ERR_UNSUPPORTED,
                            "%s: key '%s%s' holds rotary settings per layer type; one setting "
                            "for all layers is implemented",
                            path, pre, x->string);
    }
    double theta = 0, prf = 1;
    int rc = num_key(r, path, "", "rope_theta", 10000.0, &theta);
    if (!rc) rc = num_key(rp, path, pre, "rope_theta", theta, &theta);
    if (!rc) rc = num_key(r, path, "", "partial_rotary_factor", 1.0, &prf);
    if (!rc) rc = num_key(rp, path, pre, "partial_rotary_factor", prf, &prf);
    if (rc) return rc;
    if (!(theta > 0))
        return mk__fail(MK_ERR_FORMAT, "%s: rope_theta %g is not positive", path, theta);
    if (prf != 1.0)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key 'partial_rotary_factor' is %g; only rotating whole heads (1) is "
                        "implemented",
                        path, prf);
    c->rope_theta = (float)theta;
    const char *tkey = key_of(rp, "rope_type") ? "rope_type" : "type";
    const cJSON *type = key_of(rp, tkey);
    if (type && !cJSON_IsString(type))
        return mk__fail(MK_ERR_FORMAT, "%s: key '%s%s' is not a string", path, pre, tkey);
    if (!type || !strcmp(type->valuestring, "default")) return MK_OK;
    if (strcmp(type->valuestring, "llama3"))
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: key '%s%s' is '%.40s'; only the default and llama3 rotary "
                        "embeddings are implemented",
                        path, pre, tkey, type->valuestring);
    double f = 0, lo = 0, hi = 0;
    rc = num_key(rp, path, pre, "factor", NAN, &f);
    if (!rc) rc = num_key(rp, path, pre, "low_freq_factor", NAN, &lo);
    if (!rc) rc = num_key(rp, path, pre, "high_freq_factor", NAN, &hi);
    if (!rc && !(f > 0 && lo > 0 && hi > lo))
        rc = mk__fail(MK_ERR_FORMAT,
                      "%s: key '%s' has factor %g, low_freq_factor %g, high_freq_factor %g; "
                      "need factor > 0 and high > low > 0",
                      path, where, f, lo, hi);
    /* the top-level key wins over the one inside, as in transformers (Phi-3 writes it there) */
    int orig = 0;
    if (!rc)
        rc = int_key(rp, path, pre, "original_max_position_embeddings", c->block_size, 1, &orig);
    if (!rc) rc = int_key(r, path, "", "original_max_position_embeddings", orig, 1, &orig);
    c->rope_factor = (float)f;
    c->rope_low_freq_factor = (float)lo;
    c->rope_high_freq_factor = (float)hi;
    c->rope_orig_ctx = orig;
    return rc;
}

/* Every layer must use full causal attention.  A config that lists layer_types says so itself;
 * otherwise Qwen2/Qwen3 make layers max_window_layers and up sliding-window layers when
 * use_sliding_window is true and sliding_window is not null (default 4096). */
static int check_full_attention(const cJSON *r, const char *path, const mk_config *c)
{
    const cJSON *lt = key_of(r, "layer_types"), *x;
    if (lt && !cJSON_IsArray(lt))
        return mk__fail(MK_ERR_FORMAT, "%s: key 'layer_types' is not an array", path);
    int i = 0;
    cJSON_ArrayForEach(x, lt)
    {
        if (!cJSON_IsString(x) || strcmp(x->valuestring, "full_attention"))
            return mk__fail(MK_ERR_UNSUPPORTED,
                            "%s: key 'layer_types' names %.40s for layer %d; only full_attention "
                            "is implemented",
                            path, cJSON_IsString(x) ? x->valuestring : "a non-string", i);
        i++;
    }
    if (lt || c->arch == MK_ARCH_LLAMA) return MK_OK;
    int use = 0, mwl = 0;
    int rc = bool_key(r, path, "use_sliding_window", 0, &use);
    if (!rc) rc = int_key(r, path, "", "max_window_layers", 28, 0, &mwl);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r, "sliding_window");
    if (!rc && use && !(sw && cJSON_IsNull(sw)) && mwl < c->n_layer)
        rc = mk__fail(MK_ERR_UNSUPPORTED,
                      "%s: key 'use_sliding_window' is true (layers %d and up use sliding-window "
                      "attention); only full attention is implemented",
                      path, mwl);
    return rc;
}

static int read_rotary(const cJSON *r, const char *path, mk_config *c, int *tied)
{
    static const char *const silu[] = {"silu", "swish", NULL};
    int rc = read_sizes(r, path, c);
    if (!rc) rc = str_in(r, path, "hidden_act", silu, "silu");
    if (!rc) rc = read_rope(r, path, c);
    if (!rc) rc = check_full_attention(r, path, c);
    double drop = 0;
    if (!rc) rc = num_key(r, path, "", "attention_dropout", 0.0, &drop);
    if (!rc && drop != 0)
        rc = mk__fail(MK_ERR_UNSUPPORTED,
                      "%s: key 'attention_dropout' is %g; only 0 (no dropout) is implemented", path,
                      drop);
    /* biases as each family's modelling code places them */
    int ab = 0, mb = 0;
    if (!rc && c->arch != MK_ARCH_QWEN2) rc = bool_key(r, path, "attention_bias", 0, &ab);
    if (!rc && c->arch == MK_ARCH_LLAMA) rc = bool_key(r, path, "mlp_bias", 0, &mb);
    c->attn_bias = c->arch == MK_ARCH_QWEN2 ? 1 : ab;
    c->attn_out_bias = ab && c->arch != MK_ARCH_QWEN2;
    c->mlp_bias = mb;
    if (!rc) rc = bool_key(r, path, "tie_word_embeddings", 0, tied);
    c->untied_head = !*tied;
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
    int arch = -1, tie = 1;
    for (int a = MK_ARCH_GPT2; cJSON_IsString(mt) && a <= MK_ARCH_QWEN3; a++)
        if (!strcmp(mt->valuestring, mk_arch_name((mk_arch)a))) arch = a;
    if (!cJSON_IsString(mt))
        rc = mk__fail(MK_ERR_FORMAT, "%s: key 'model_type' is missing or not a string", path);
    else if (arch < 0)
        rc = mk__fail(MK_ERR_UNSUPPORTED,
                      "%s: model_type '%.60s' is not supported (this library implements gpt2, "
                      "llama, qwen2 and qwen3)",
                      path, mt->valuestring);
    if (!rc) rc = check_common(root, path);
    c.arch = (mk_arch)arch;
    if (!rc)
        rc = arch == MK_ARCH_GPT2 ? read_gpt2(root, path, &c, &tie)
                                  : read_rotary(root, path, &c, &tie);
    mk_config res;
    if (!rc && mk_config_resolve(&c, &res)) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", mk_last_error());
        rc = mk__fail(MK_ERR_FORMAT, "%s: %s", path, msg);
    }
    if (!rc) {
        *out = res;
        if (tied) *tied = tie;
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- writing config.json -------------------------------------------------- */

/* The float as the shortest decimal that reads back as the same float (1e-06, not
 * 9.9999999747524271e-07), so that config.json says what a person would write. */
static double short_float(float f)
{
    char s[32];
    for (int p = 6; p < 9; p++) {
        snprintf(s, sizeof s, "%.*g", p, (double)f);
        if (strtof(s, NULL) == f) return strtod(s, NULL);
    }
    return (double)f;
}

/* MK_OK if a transformers config can describe c (resolved), else MK_ERR_UNSUPPORTED naming what
 * it cannot. */
static int describable(const mk_config *c, const char *path)
{
    const char *why = NULL;
    if (c->arch == MK_ARCH_GPT2 && c->untied_head) why = "an untied head on GPT-2";
    if (c->arch == MK_ARCH_QWEN2 && (!c->attn_bias || c->attn_out_bias || c->mlp_bias))
        why = "Qwen2 biases other than on q, k and v";
    if ((c->arch == MK_ARCH_LLAMA || c->arch == MK_ARCH_QWEN3) && c->attn_bias != c->attn_out_bias)
        why = "attention biases on q, k, v but not o (attention_bias sets both)";
    if (c->arch == MK_ARCH_QWEN3 && c->mlp_bias) why = "MLP biases on Qwen3";
    if (!why) return MK_OK;
    return mk__fail(MK_ERR_UNSUPPORTED, "%s: no transformers %s config describes %s", path,
                    mk_arch_name(c->arch), why);
}

static void add_gpt2(cJSON *r, const mk_config *c)
{
    cJSON_AddNumberToObject(r, "n_layer", c->n_layer);
    cJSON_AddNumberToObject(r, "n_head", c->n_head);
    cJSON_AddNumberToObject(r, "n_embd", c->n_embd);
    cJSON_AddNumberToObject(r, "n_positions", c->block_size);
    cJSON_AddNumberToObject(r, "n_ctx", c->block_size);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    if (c->n_inner == 4 * c->n_embd)
        cJSON_AddNullToObject(r, "n_inner");
    else
        cJSON_AddNumberToObject(r, "n_inner", c->n_inner);
    cJSON_AddStringToObject(r, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(r, "layer_norm_epsilon", short_float(c->norm_eps));
    cJSON_AddNumberToObject(r, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(r, "attn_pdrop", 0.0);
    cJSON_AddTrueToObject(r, "scale_attn_weights");
    cJSON_AddFalseToObject(r, "scale_attn_by_inverse_layer_idx");
    cJSON_AddFalseToObject(r, "reorder_and_upcast_attn");
}

/* The rotary settings in transformers 5's rope_parameters and, for 4.x, rope_theta and
 * rope_scaling (5 takes a non-null rope_scaling as the rope_parameters, theta from the top). */
static void add_rope(cJSON *r, const mk_config *c)
{
    double theta = short_float(c->rope_theta);
    cJSON_AddNumberToObject(r, "rope_theta", theta);
    cJSON *rp = cJSON_AddObjectToObject(r, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", theta);
    if (!c->rope_factor) {
        cJSON_AddStringToObject(rp, "rope_type", "default");
        cJSON_AddNullToObject(r, "rope_scaling");
        return;
    }
    cJSON *sc = cJSON_AddObjectToObject(r, "rope_scaling");
    for (int k = 0; k < 2; k++) {
        cJSON *o = k ? sc : rp;
        cJSON_AddStringToObject(o, "rope_type", "llama3");
        cJSON_AddNumberToObject(o, "factor", short_float(c->rope_factor));
        cJSON_AddNumberToObject(o, "low_freq_factor", short_float(c->rope_low_freq_factor));
        cJSON_AddNumberToObject(o, "high_freq_factor", short_float(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", c->rope_orig_ctx);
    }
}

static void add_rotary(cJSON *r, const mk_config *c)
{
    cJSON_AddNumberToObject(r, "hidden_size", c->n_embd);
    cJSON_AddNumberToObject(r, "intermediate_size", c->n_inner);
    cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layer);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->n_head);
    cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_head);
    cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "max_position_embeddings", c->block_size);
    cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddNumberToObject(r, "rms_norm_eps", short_float(c->norm_eps));
    add_rope(r, c);
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(r, "initializer_range", 0.02);
    cJSON_AddTrueToObject(r, "use_cache");
    if (c->arch != MK_ARCH_QWEN2) cJSON_AddBoolToObject(r, "attention_bias", c->attn_bias);
    if (c->arch == MK_ARCH_LLAMA) {
        cJSON_AddBoolToObject(r, "mlp_bias", c->mlp_bias);
        cJSON_AddNumberToObject(r, "pretraining_tp", 1);
        return;
    }
    cJSON_AddFalseToObject(r, "use_sliding_window");
    cJSON_AddNullToObject(r, "sliding_window");
    cJSON_AddNumberToObject(r, "max_window_layers", c->n_layer);
    cJSON *lt = cJSON_AddArrayToObject(r, "layer_types");
    for (int l = 0; l < c->n_layer; l++)
        cJSON_AddItemToArray(lt, cJSON_CreateString("full_attention"));
}

/* What save_pretrained writes for the family's *ForCausalLM with weights of dtype dt. */
static cJSON *build_config(const mk_config *c, mk_dtype dt)
{
    static const char *const torch_names[] = {"float32", "bfloat16", "float16"};
    static const char *const archs[] = {"GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM",
                                        "Qwen3ForCausalLM"};
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(archs[c->arch]));
    cJSON_AddStringToObject(r, "model_type", mk_arch_name(c->arch));
    if (c->arch == MK_ARCH_GPT2)
        add_gpt2(r, c);
    else
        add_rotary(r, c);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", !c->untied_head);
    /* the configs' defaults (GPT-2's 50256, Llama's 1 and 2) may lie outside a small vocabulary;
     * Manta names no special tokens */
    cJSON_AddNullToObject(r, "bos_token_id");
    cJSON_AddNullToObject(r, "eos_token_id");
    cJSON_AddNullToObject(r, "pad_token_id");
    /* transformers 5 reads "dtype"; 4.x read "torch_dtype" */
    cJSON_AddStringToObject(r, "dtype", torch_names[dt]);
    cJSON_AddStringToObject(r, "torch_dtype", torch_names[dt]);
    return r;
}

int mk_write_hf_config(const mk_config *cfg, const char *path)
{
    if (!cfg || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    mk_config c;
    int rc = mk_config_resolve(cfg, &c);
    if (!rc) rc = describable(&c, path);
    return rc ? rc : write_json(path, build_config(&c, MK_F32));
}

/* ---- finding tensors ------------------------------------------------------ */

typedef struct shard {
    char *file; /* name in the folder, as the index gives it (the path for a single file) */
    char *path; /* DIR/file; the mapped file borrows it */
    mk__st_file st;
} shard;

typedef struct folder {
    const char *dir; /* NULL: one file, not a folder (mk_load) */
    char index_path[4096];
    cJSON *index;            /* NULL for a single model.safetensors */
    const cJSON *weight_map; /* inside index */
    shard *shards;
    int n_shards;
    int f32_only; /* mk_load reads F32 files only */
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

/* Maps DIR/file (or file, without a DIR) unless it is mapped already. */
static int add_shard(folder *fo, const char *file)
{
    for (int i = 0; i < fo->n_shards; i++)
        if (!strcmp(fo->shards[i].file, file)) return MK_OK;
    if (fo->dir && (!*file || strchr(file, '/') || !strcmp(file, "..")))
        return mk__fail(MK_ERR_FORMAT, "%s: shard name '%.200s' is not a file in the folder",
                        fo->index_path, file);
    shard *ns = realloc(fo->shards, sizeof(shard) * (size_t)(fo->n_shards + 1));
    if (!ns) return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate shards", file);
    fo->shards = ns;
    shard *s = &ns[fo->n_shards];
    memset(s, 0, sizeof *s);
    size_t n = (fo->dir ? strlen(fo->dir) + 1 : 0) + strlen(file) + 1;
    s->file = strdup(file);
    s->path = malloc(n);
    if (!s->file || !s->path) {
        free(s->file);
        free(s->path);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate shards", file);
    }
    snprintf(s->path, n, "%s%s%s", fo->dir ? fo->dir : "", fo->dir ? "/" : "", file);
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

/* Where one tensor lies: its shard and entry (NULL: an optional tensor that is absent). */
typedef struct located {
    const shard *sh;
    const mk__st_entry *e;
} located;

/* Finds tensor name (a full name; prefixes are ignored when matching) and checks its shape and
 * dtype. */
static int locate(const folder *fo, const char *name, int ndim, const int *shape, int optional,
                  located *w)
{
    const char *bare = mk__st_strip(name);
    w->sh = fo->n_shards ? &fo->shards[0] : NULL;
    w->e = NULL;
    if (fo->weight_map) {
        const cJSON *x, *hit = NULL;
        cJSON_ArrayForEach(x, fo->weight_map) if (!strcmp(mk__st_strip(x->string), bare)) hit = x;
        if (!hit)
            return optional ? MK_OK
                            : mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is not in the weight_map",
                                       fo->index_path, name);
        for (int i = 0; i < fo->n_shards; i++)
            if (!strcmp(fo->shards[i].file, hit->valuestring)) w->sh = &fo->shards[i];
    }
    if (!w->sh) return mk__fail(MK_ERR_MISSING, "%s: tensor '%s' is in no shard", fo->dir, name);
    w->e = mk__st_find(&w->sh->st, bare);
    if (!w->e && optional && !fo->weight_map) return MK_OK;
    return mk__st_check(&w->sh->st, w->e, name, ndim, shape, fo->f32_only);
}

/* ---- loading -------------------------------------------------------------- */

/* Finds and checks every checkpoint tensor of m in fo (at[0..n_hf)) and, when the map has no
 * lm_head (a tied head), an lm_head.weight the files may still hold (*head; required when the
 * config says untied, which only GPT-2 reaches here: config names config.json). */
static int check_tensors(const mk_model *m, const folder *fo, located *at, located *head, int tied,
                         const char *config)
{
    size_t total = 0;
    int rc = MK_OK;
    for (int i = 0; i < m->n_hf && !rc; i++) {
        const mk_tensor_info *t = &m->hf[i].info;
        rc = locate(fo, t->name, t->ndim, t->shape, 0, &at[i]);
        total += t->numel;
    }
    if (!rc && total != m->n_params)
        mk__die(__FILE__, __LINE__, "the checkpoint map does not cover the parameters once",
                "model.c builds m->hf: every parameter in exactly one checkpoint tensor");
    head->sh = NULL;
    head->e = NULL;
    if (rc || mk__hf_find(m, "lm_head.weight") >= 0) return rc;
    int shape[2] = {m->cfg.vocab_size, m->cfg.n_embd};
    rc = locate(fo, "lm_head.weight", 2, shape, 1, head);
    if (!rc && !head->e && !tied)
        rc = mk__fail(MK_ERR_MISSING,
                      "%s: tie_word_embeddings is false but tensor 'lm_head.weight' is missing",
                      config);
    return rc;
}

/* A tied model holds one output matrix, the embedding: a head in the files must equal it. */
static int check_head(const mk_model *m, const located *head, const float *params, float *tmp)
{
    const float *wte = params + m->tensors[m->gidx[MK_T_WTE]].offset;
    size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.n_embd;
    mk__st_read(tmp, &head->sh->st, head->e);
    for (size_t j = 0; j < n; j++)
        if (!(tmp[j] == wte[j]))
            return mk__fail(MK_ERR_UNSUPPORTED,
                            "%s: tensor '%s' differs from the token embedding (element %zu): an "
                            "untied output head, but %s",
                            head->sh->path, head->e->name, j,
                            m->cfg.arch == MK_ARCH_GPT2 ? "GPT-2 here is tied-only"
                                                        : "config.json says the head is tied");
    return MK_OK;
}

/* Converts every checked tensor into the host parameter vector params: COPY tensors straight
 * from the mapping, the others through one buffer of the largest, then scattered. */
static int convert_tensors(const mk_model *m, const located *at, const located *head, float *params)
{
    size_t most = head->e ? (size_t)m->cfg.vocab_size * (size_t)m->cfg.n_embd : 0;
    for (int i = 0; i < m->n_hf; i++)
        if (m->hf[i].kind != MK_HF_COPY && m->hf[i].info.numel > most) most = m->hf[i].info.numel;
    float *tmp = most ? malloc(sizeof(float) * most) : NULL;
    if (most && !tmp)
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate a buffer of %zu floats", at[0].sh->path,
                        most);
    for (int i = 0; i < m->n_hf; i++) {
        const mk__hf_map *h = &m->hf[i];
        if (h->kind == MK_HF_COPY) {
            if (m->tensors[h->tensor].numel != h->info.numel)
                mk__die(__FILE__, __LINE__, "a COPY checkpoint tensor differs in size",
                        "model.c: MK_HF_COPY maps a whole internal tensor");
            mk__st_read(params + m->tensors[h->tensor].offset, &at[i].sh->st, at[i].e);
        } else {
            mk__st_read(tmp, &at[i].sh->st, at[i].e);
            mk__hf_scatter(m, i, params, tmp);
        }
    }
    int rc = head->e ? check_head(m, head, params, tmp) : MK_OK;
    free(tmp);
    return rc;
}

/* Checks, then converts fo's tensors into params (host, n_params floats). */
static int load_tensors(const mk_model *m, const folder *fo, int tied, const char *config,
                        float *params)
{
    located *at = malloc(sizeof(located) * (size_t)(m->n_hf ? m->n_hf : 1)), head;
    if (!at) return mk__fail(MK_ERR_NOMEM, "cannot allocate %d tensor records", m->n_hf);
    int rc = check_tensors(m, fo, at, &head, tied, config);
    if (!rc) rc = convert_tensors(m, at, &head, params);
    free(at);
    return rc;
}

int mk_load_dir(mk_model **out, const char *dir, int max_batch, int max_seq, const mk_backend *be)
{
    return mk_load_dir_ex(out, dir, max_batch, max_seq, be, 0);
}

int mk_load_dir_ex(mk_model **out, const char *dir, int max_batch, int max_seq,
                   const mk_backend *be, unsigned flags)
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
    if ((rc = mk_model_new_ex(&m, &cfg, max_batch, max_seq, be ? be : mk_backend_cpu(), flags)))
        return rc;
    folder fo = {.dir = dir};
    rc = folder_open(&fo);
    /* On the CPU the tensors are converted from the mapping straight into the parameters (the
     * model is new and freed on failure, so nothing needs keeping); elsewhere through one host
     * buffer that is uploaded once. */
    int host = m->be == &mk__cpu_backend;
    float *buf = rc || host ? NULL : malloc(sizeof(float) * m->n_params);
    if (!rc && !host && !buf)
        rc = mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu parameters", dir, m->n_params);
    if (!rc) rc = load_tensors(m, &fo, tied, cpath, host ? m->params : buf);
    if (!rc && !host) m->be->upload(m->params, buf, sizeof(float) * m->n_params);
    free(buf);
    folder_close(&fo);
    if (rc) {
        mk_model_free(m);
        return rc;
    }
    mk__params_changed(m);
    mk__bf16_sync(m);
    *out = m;
    return MK_OK;
}

/* Reads every tensor into one host buffer, then uploads it: the parameters change only when
 * all of it was read. */
int mk_load(mk_model *m, const char *path)
{
    if (!m || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    folder fo = {.f32_only = 1};
    int rc = add_shard(&fo, path);
    float *buf = rc ? NULL : malloc(sizeof(float) * m->n_params);
    if (!rc && !buf) rc = mk__fail(MK_ERR_NOMEM, "cannot allocate %zu parameters", m->n_params);
    if (!rc) rc = load_tensors(m, &fo, 1, path, buf);
    if (!rc) {
        m->be->upload(m->params, buf, sizeof(float) * m->n_params);
        mk__params_changed(m);
        mk__bf16_sync(m);
    }
    free(buf);
    folder_close(&fo);
    return rc;
}

/* ---- saving --------------------------------------------------------------- */

typedef struct gather_ctx {
    const mk_model *m;
    const float *params; /* host copy of the parameters */
    int first;           /* checkpoint index of the file's first tensor */
} gather_ctx;

static void gather(const void *ctx, int i, float *dst)
{
    const gather_ctx *g = ctx;
    mk__hf_gather(g->m, g->first + i, g->params, dst);
}

/* Writes checkpoint tensors [first, first + n) to path; ts is scratch for n infos. */
static int write_tensors(const mk_model *m, const float *params, const char *path, int first, int n,
                         mk_dtype dt, mk_tensor_info *ts)
{
    for (int k = 0; k < n; k++) ts[k] = m->hf[first + k].info;
    gather_ctx g = {m, params, first};
    return mk__st_write(path, ts, n, gather, &g, dt);
}

/* The host copy of the parameters and room for the tensor infos of one file. */
static int save_buffers(const mk_model *m, const char *where, float **params, mk_tensor_info **ts)
{
    *params = malloc(sizeof(float) * m->n_params);
    *ts = malloc(sizeof(mk_tensor_info) * (size_t)(m->n_hf ? m->n_hf : 1));
    if (!*params || !*ts) {
        free(*params);
        free(*ts);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate %zu parameters", where, m->n_params);
    }
    m->be->download(*params, m->params, sizeof(float) * m->n_params);
    return MK_OK;
}

int mk_save(const mk_model *m, const char *path)
{
    if (!m || !path) return mk__fail(MK_ERR_ARG, "NULL argument");
    float *buf;
    mk_tensor_info *ts;
    int rc = save_buffers(m, path, &buf, &ts);
    if (rc) return rc;
    rc = write_tensors(m, buf, path, 0, m->n_hf, MK_F32, ts);
    free(buf);
    free(ts);
    return rc;
}

/* Cuts the checkpoint tensors, in order, into shards of at most max bytes (a larger tensor gets
 * a shard of its own; max 0: one shard).  first[s] is shard s's first tensor, first[n] = n_hf;
 * returns the number of shards. */
static int plan_shards(const mk_model *m, size_t es, size_t max, int *first)
{
    int n = 0;
    size_t in_shard = 0;
    for (int i = 0; i < m->n_hf; i++) {
        size_t b = m->hf[i].info.numel * es;
        if (i == 0 || (max && in_shard + b > max && in_shard)) {
            first[n++] = i;
            in_shard = 0;
        }
        in_shard += b;
    }
    first[n] = m->n_hf;
    return n;
}

/* Writes the shards and model.safetensors.index.json. */
static int save_sharded(const mk_model *m, const float *params, const char *dir, mk_dtype dt,
                        size_t max, mk_tensor_info *ts)
{
    size_t es = dt == MK_F32 ? 4 : 2;
    int *first = malloc(sizeof(int) * (size_t)(m->n_hf + 1));
    cJSON *idx = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(idx, "metadata");
    if (!first || !meta) {
        free(first);
        cJSON_Delete(idx);
        return mk__fail(MK_ERR_NOMEM, "%s: cannot allocate the shard index", dir);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)(m->n_params * es));
    cJSON_AddNumberToObject(meta, "total_parameters", (double)m->n_params);
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    int n_sh = plan_shards(m, es, max, first), rc = MK_OK;
    char path[4096];
    for (int s = 0; s < n_sh && !rc; s++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_sh);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        rc = write_tensors(m, params, path, first[s], first[s + 1] - first[s], dt, ts);
        for (int i = first[s]; i < first[s + 1]; i++)
            cJSON_AddStringToObject(wm, m->hf[i].info.name, file);
    }
    free(first);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!rc) return write_json(path, idx);
    cJSON_Delete(idx);
    return rc;
}

int mk_save_dir(const mk_model *m, const char *dir, mk_dtype dt, size_t max_shard_bytes)
{
    if (!m || !dir || (dt != MK_F32 && dt != MK_BF16 && dt != MK_F16))
        return mk__fail(MK_ERR_ARG, "mk_save_dir: NULL argument or unknown dtype %d", (int)dt);
    char path[4096], other[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = describable(&m->cfg, path);
    float *buf;
    mk_tensor_info *ts;
    if (rc || (rc = save_buffers(m, dir, &buf, &ts))) return rc;
    if (!max_shard_bytes) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_tensors(m, buf, path, 0, m->n_hf, dt, ts);
        snprintf(other, sizeof other, "%s/model.safetensors.index.json", dir);
    } else {
        rc = save_sharded(m, buf, dir, dt, max_shard_bytes, ts);
        snprintf(other, sizeof other, "%s/model.safetensors", dir);
    }
    free(buf);
    free(ts);
    /* the other layout, from an earlier save, would shadow or contradict this one */
    if (!rc && remove(other) && errno != ENOENT)
        rc = mk__fail(MK_ERR_IO, "%s: cannot remove: %s", other, strerror(errno));
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!rc) rc = write_json(path, build_config(&m->cfg, dt));
    return rc;
}
