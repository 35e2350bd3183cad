/*
 * policy.c - the policy model a spec names, for the rollouts and learners.
 *
 * Section "model" either points at a Hugging Face folder (`path: DIR`, any
 * family the kernels read: gpt2, llama, qwen2, qwen3) or gives the size of a
 * fresh GPT-2 (n_layer, n_head, n_embd, block_size, seed); never both. The
 * folder is checked when the spec is read, in every actor's init, so a bad
 * path fails the job at its start with a message naming model.path and the
 * file, not at the first weight load: it must be a folder, its config.json
 * must be one mk_read_hf_config accepts, and its vocabulary must hold the
 * task's tokens: RL_VOCAB (the byte-level vocabulary of manta_actors.h) or,
 * with a tokenizer, the tokenizer's ids.
 *
 * Text. model.tokenizer "auto" (default) uses the folder's tokenizer.json
 * when it has one, else the byte-level vocabulary ("bytes"); a path names a
 * tokenizer.json (libmanta_tok). With a tokenizer, model.chat_format (auto:
 * from its special tokens; chatml; llama3) says how conversations are
 * rendered, and the tools of sections.tools become the chat template's tool
 * definitions (textio.c renders and tokenises; this file only checks).
 *
 * Lengths. A pretrained model's block_size is its max_position_embeddings
 * (often 32768 or more); a rollout keeps model.context positions of KV cache
 * per slot (default min(block_size, 2048)) and a learner's activations are
 * sized for model.max_seq tokens per sequence (default context: a rollout
 * never makes a longer one).
 *
 * Checkpoints are folders of the same family, written by mk_save_dir in the
 * folder's dtype (config.json "dtype", or "torch_dtype" as transformers 4
 * writes it; F32 when absent or for a fresh model), so a model trained here
 * loads back with mk_load_dir or transformers' from_pretrained.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <manta_collective.h>
#include <manta_tok.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_CONTEXT 2048          /* KV positions per rollout slot unless model.context says */
#define SHARD_BYTES     5000000000ull /* save_pretrained's former max_shard_size, "5GB" */

/* The keys of a fresh model's size: none may come with model.path. */
static const char *const inline_keys[] = {"n_layer",    "n_head", "n_embd",
                                          "block_size", "seed",   NULL};

const char *rl_dtype_name(mk_dtype dt)
{
    return dt == MK_BF16 ? "bf16" : dt == MK_F16 ? "f16" : "f32";
}

/* The dtype a folder's config.json names ("dtype", else "torch_dtype");
 * F32 when it names none or one the writer does not have. The config was
 * accepted by mk_read_hf_config already, so it is readable JSON. */
static mk_dtype folder_dtype(const char *config)
{
    FILE *f = fopen(config, "rb");
    if (!f) return MK_F32;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (!buf) return MK_F32;
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    mk_dtype dt = MK_F32;
    if (cJSON_IsString(d) && !strcmp(d->valuestring, "bfloat16")) dt = MK_BF16;
    if (cJSON_IsString(d) && !strcmp(d->valuestring, "float16")) dt = MK_F16;
    cJSON_Delete(j);
    return dt;
}

/* Whether path is a regular file that starts with GGUF's magic. */
static int is_gguf_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

/* model.path naming a GGUF file: its llama.* metadata is the config. The
 * weights are dequantised to F32 on load, and checkpoints are F32 folders
 * (a quantised file's values are exact in F32; BF16 would round them). */
static void read_gguf(rl_args *a, rl_model_spec *ms)
{
    ms->gguf = 1;
    if (mk_read_gguf_config(&ms->cfg, ms->path) != MK_OK) {
        rl_arg_error(a, "model", "path", "%s", mk_last_error());
        return;
    }
    ms->dtype = MK_F32;
}

int rl_tok_load(const char *path, mtok **out)
{
    return is_gguf_file(path) ? mtok_load_gguf(path, out) : mtok_load(path, out);
}

/* model.path: a folder with an acceptable config.json whose vocabulary
 * holds the task's tokens, or a GGUF file. */
static void read_folder(rl_args *a, rl_model_spec *ms)
{
    for (int i = 0; inline_keys[i]; i++)
        if (rl_arg_get(a, "model", inline_keys[i])) {
            rl_arg_error(a, "model", inline_keys[i],
                         "cannot be given with model.path (the folder's config.json sizes the "
                         "model)");
            return;
        }
    struct stat st;
    if (stat(ms->path, &st) != 0) {
        rl_arg_error(a, "model", "path", "%s: %s", ms->path, strerror(errno));
        return;
    }
    if (is_gguf_file(ms->path)) {
        read_gguf(a, ms);
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        rl_arg_error(a, "model", "path",
                     "%s: neither a folder (a Hugging Face model folder holds config.json and "
                     "model.safetensors) nor a GGUF file",
                     ms->path);
        return;
    }
    char config[600];
    snprintf(config, sizeof config, "%s/config.json", ms->path);
    if (access(config, R_OK) != 0) {
        rl_arg_error(a, "model", "path", "%s: %s (not a Hugging Face model folder)", config,
                     strerror(errno));
        return;
    }
    int tied = 1;
    if (mk_read_hf_config(&ms->cfg, &tied, config) != MK_OK) {
        rl_arg_error(a, "model", "path", "%s", mk_last_error());
        return;
    }
    ms->dtype = folder_dtype(config);
}

/* The inline size of a fresh GPT-2 (today's defaults). */
static void read_inline(rl_args *a, rl_model_spec *ms)
{
    ms->cfg.arch = MK_ARCH_GPT2;
    ms->cfg.n_layer = (int)rl_arg_int(a, "model", "n_layer", 2, 1, 1024);
    ms->cfg.n_head = (int)rl_arg_int(a, "model", "n_head", 4, 1, 1024);
    ms->cfg.n_embd = (int)rl_arg_int(a, "model", "n_embd", 64, 1, 1 << 16);
    ms->cfg.block_size = (int)rl_arg_int(a, "model", "block_size", 64, 4, 1 << 20);
    ms->cfg.vocab_size = RL_VOCAB;
    ms->seed = (uint64_t)rl_arg_int(a, "model", "seed", 1, 0, INT64_MAX);
    ms->dtype = MK_F32;
    if (!a->rc && ms->cfg.n_embd % ms->cfg.n_head)
        rl_arg_error(a, "model", "n_embd", "%d is not a multiple of n_head (%d)", ms->cfg.n_embd,
                     ms->cfg.n_head);
}

/* The chat format of a tokenizer: model.chat_format, or (auto) the one its
 * special tokens name; the format's own tokens must be there. */
static void read_chat_format(rl_args *a, rl_model_spec *ms, const mtok *t)
{
    char name[16];
    rl_arg_str(a, "model", "chat_format", name, sizeof name, "auto");
    mtok_chat_format f = MTOK_CHAT_AUTO;
    if (a->rc) return;
    if (mtok_chat_format_parse(name, &f) != 0) {
        rl_arg_error(a, "model", "chat_format", "%s", mtok_last_error());
        return;
    }
    if (f == MTOK_CHAT_AUTO && mtok_chat_detect(t, &f) != 0) {
        rl_arg_error(a, "model", "chat_format",
                     "auto: %s: %s; name the format (chatml, llama3) or use model.tokenizer: "
                     "bytes",
                     ms->tokenizer, mtok_last_error());
        return;
    }
    static const char *const chatml[] = {"<|im_start|>", "<|im_end|>", NULL};
    static const char *const llama3[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                         NULL};
    for (const char *const *tk = f == MTOK_CHAT_CHATML ? chatml : llama3; *tk; tk++)
        if (mtok_token_id(t, *tk) < 0) {
            rl_arg_error(a, "model", "chat_format", "%s: %s has no token %s",
                         f == MTOK_CHAT_CHATML ? "chatml" : "llama3", ms->tokenizer, *tk);
            return;
        }
    ms->chat_format = (int)f;
}

/* model.tokenizer: "bytes", a tokenizer.json, or "auto" (the folder's
 * tokenizer.json when there is one). Sets ms->vocab and checks it against
 * the model's vocabulary; a fresh model takes the tokenizer's size. */
static void read_tokenizer(rl_args *a, rl_model_spec *ms)
{
    char name[600];
    rl_arg_str(a, "model", "tokenizer", name, sizeof name, "auto");
    if (a->rc) return;
    ms->tokenizer[0] = 0;
    if (!strcmp(name, "auto") && ms->gguf) {
        snprintf(ms->tokenizer, sizeof ms->tokenizer, "%s", ms->path); /* its own tokenizer */
    } else if (!strcmp(name, "auto")) {
        char guess[600];
        snprintf(guess, sizeof guess, "%s/tokenizer.json", ms->path);
        if (ms->path[0] && access(guess, R_OK) == 0)
            snprintf(ms->tokenizer, sizeof ms->tokenizer, "%s", guess);
    } else if (strcmp(name, "bytes")) {
        snprintf(ms->tokenizer, sizeof ms->tokenizer, "%s", name);
    }
    if (!ms->tokenizer[0]) { /* the byte-level task vocabulary */
        ms->vocab = RL_VOCAB;
        if (rl_arg_get(a, "model", "chat_format"))
            rl_arg_error(a, "model", "chat_format",
                         "needs a tokenizer (model.tokenizer is bytes, or auto without a "
                         "tokenizer.json in the folder)");
        else if (ms->cfg.vocab_size < RL_VOCAB)
            rl_arg_error(a, "model", "path",
                         "%s/config.json: vocab_size %d is smaller than the task's vocabulary "
                         "(%d: 256 bytes and 4 special tokens)",
                         ms->path, ms->cfg.vocab_size, RL_VOCAB);
        return;
    }
    mtok *t;
    if (rl_tok_load(ms->tokenizer, &t) != 0) {
        rl_arg_error(a, "model", "tokenizer", "%s", mtok_last_error());
        return;
    }
    size_t v = mtok_vocab_size(t);
    if (!ms->path[0]) ms->cfg.vocab_size = (int)v; /* a fresh model fits its tokenizer */
    if (v > (size_t)ms->cfg.vocab_size)
        rl_arg_error(a, "model", "tokenizer",
                     "%s: %zu token ids do not fit the model's vocab_size %d (%s%s)", ms->tokenizer,
                     v, ms->cfg.vocab_size, ms->path, ms->gguf ? "" : "/config.json");
    ms->vocab = (int32_t)v;
    if (!a->rc) read_chat_format(a, ms, t);
    mtok_free(t);
}

/* The tools of sections.tools as chat-template tool definitions (one string
 * argument each, the one the env passes the call to), and the first one's
 * name and argument. The env checks the entries; here a bad one is skipped. */
static void read_tools(rl_args *a, rl_model_spec *ms)
{
    snprintf(ms->tool_name, sizeof ms->tool_name, "calc");
    snprintf(ms->tool_arg, sizeof ms->tool_arg, "expression");
    const msgpack_object *tools = a->sections ? rl_mp_get(a->sections, "tools") : NULL;
    if (!tools || tools->type != MSGPACK_OBJECT_ARRAY || !tools->via.array.size) return;
    cJSON *arr = cJSON_CreateArray();
    int ok = arr != NULL;
    for (uint32_t i = 0; ok && i < tools->via.array.size; i++) {
        const msgpack_object *t = &tools->via.array.ptr[i];
        char name[32], arg[32];
        rl_mp_str(rl_mp_get(t, "name"), name, sizeof name, "calc");
        rl_mp_str(rl_mp_get(t, "arg"), arg, sizeof arg, "expression");
        if (i == 0) {
            snprintf(ms->tool_name, sizeof ms->tool_name, "%s", name);
            snprintf(ms->tool_arg, sizeof ms->tool_arg, "%s", arg);
        }
        /* {"type": "function", "function": {"name": N, "parameters": {"type":
         * "object", "properties": {A: {"type": "string"}}, "required": [A]}}};
         * each part hangs on arr as it is made (adding an item allocates
         * nothing), so one cJSON_Delete frees all */
        cJSON *w = cJSON_CreateObject(), *fn, *par, *props, *prop, *req;
        ok = w && cJSON_AddItemToArray(arr, w) && cJSON_AddStringToObject(w, "type", "function") &&
             (fn = cJSON_AddObjectToObject(w, "function")) &&
             cJSON_AddStringToObject(fn, "name", name) &&
             (par = cJSON_AddObjectToObject(fn, "parameters")) &&
             cJSON_AddStringToObject(par, "type", "object") &&
             (props = cJSON_AddObjectToObject(par, "properties")) &&
             (prop = cJSON_AddObjectToObject(props, arg)) &&
             cJSON_AddStringToObject(prop, "type", "string") &&
             (req = cJSON_AddArrayToObject(par, "required")) &&
             cJSON_AddItemToArray(req, cJSON_CreateString(arg));
    }
    char *js = ok ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    if (!js || strlen(js) >= sizeof ms->tools_json)
        rl_args_fail(a, "tools: %s as chat-template tool definitions",
                     js ? "too long (more than 2047 bytes)" : "out of memory");
    else
        snprintf(ms->tools_json, sizeof ms->tools_json, "%s", js);
    free(js);
}

/* A length setting in [lo, block_size]. */
static int read_length(rl_args *a, const char *key, int def, int lo, int block)
{
    int v = (int)rl_arg_int(a, "model", key, def, lo, 1 << 24);
    if (!a->rc && v > block)
        rl_arg_error(a, "model", key, "%d is more than the model's block_size (%d)", v, block);
    return v;
}

void rl_model_read(rl_args *a, rl_model_spec *ms)
{
    memset(ms, 0, sizeof *ms);
    rl_arg_str(a, "model", "path", ms->path, sizeof ms->path, "");
    if (rl_arg_get(a, "model", "path") && !ms->path[0] && !a->rc)
        rl_arg_error(a, "model", "path", "empty (a Hugging Face model folder or a GGUF file)");
    if (ms->path[0])
        read_folder(a, ms);
    else
        read_inline(a, ms);
    if (a->rc) return;
    read_tokenizer(a, ms);
    if (ms->tokenizer[0]) read_tools(a, ms);
    rl_arg_str(a, "task", "system", ms->system, sizeof ms->system, "");
    ms->tools_in_system = 1;
    const msgpack_object *tis = rl_arg_get(a, "task", "tools_in_system");
    if (tis && tis->type == MSGPACK_OBJECT_BOOLEAN)
        ms->tools_in_system = tis->via.boolean;
    else if (tis && !a->rc)
        rl_arg_error(a, "task", "tools_in_system", "expected true or false");
    if (!a->rc && ms->system[0] && !ms->tokenizer[0])
        rl_arg_error(a, "task", "system",
                     "needs a tokenizer and chat format (model.tokenizer is bytes, which has no "
                     "system message)");
    if (a->rc) return;
    char dev[16];
    rl_arg_str(a, "model", "device", dev, sizeof dev, "cpu");
    if (!strcmp(dev, "cuda"))
        ms->cuda = 1;
    else if (strcmp(dev, "cpu") && !a->rc)
        rl_arg_error(a, "model", "device", "'%s': expected cpu or cuda", dev);
    char mm[16];
    rl_arg_str(a, "model", "matmul", mm, sizeof mm, "fp32");
    ms->math = !strcmp(mm, "tf32") ? MK_MATH_TF32 : !strcmp(mm, "bf16") ? MK_MATH_BF16 : 0;
    if (strcmp(mm, "fp32") && !ms->math && !a->rc)
        rl_arg_error(a, "model", "matmul", "'%s': expected fp32, tf32 or bf16", mm);
    else if (ms->math && !ms->cuda && !a->rc)
        rl_arg_error(a, "model", "matmul",
                     "'%s' is for the CUDA back-end's tensor cores; the CPU multiplies in fp32 "
                     "(set model.device: cuda, or see bf16_products for rollouts)",
                     mm);
    const msgpack_object *bw = rl_arg_get(a, "model", "bf16_weights");
    if (bw && bw->type == MSGPACK_OBJECT_BOOLEAN)
        ms->bf16_weights = bw->via.boolean;
    else if (bw && !a->rc)
        rl_arg_error(a, "model", "bf16_weights", "expected true or false");
    const msgpack_object *bp = rl_arg_get(a, "model", "bf16_products");
    if (bp && bp->type == MSGPACK_OBJECT_BOOLEAN)
        ms->bf16_products = bp->via.boolean;
    else if (bp && !a->rc)
        rl_arg_error(a, "model", "bf16_products", "expected true or false");
    if (ms->bf16_products && bw && !ms->bf16_weights && !a->rc)
        rl_arg_error(a, "model", "bf16_products",
                     "multiplies the bfloat16 weight copies: it needs bf16_weights, which is "
                     "set false");
    if (ms->bf16_products) ms->bf16_weights = 1;
    const msgpack_object *bt = rl_arg_get(a, "model", "bf16_train");
    if (bt && bt->type == MSGPACK_OBJECT_BOOLEAN)
        ms->bf16_train = bt->via.boolean;
    else if (bt && !a->rc)
        rl_arg_error(a, "model", "bf16_train", "expected true or false");
    char kv[16];
    rl_arg_str(a, "model", "kv_cache", kv, sizeof kv, "f32");
    ms->bf16_kv = !strcmp(kv, "bf16");
    if (strcmp(kv, "f32") && !ms->bf16_kv && !a->rc)
        rl_arg_error(a, "model", "kv_cache", "'%s': expected f32 or bf16", kv);
    if (a->rc) return;
    int block = ms->cfg.block_size;
    ms->context =
        read_length(a, "context", block < DEFAULT_CONTEXT ? block : DEFAULT_CONTEXT, 4, block);
    ms->max_seq = read_length(a, "max_seq", ms->context, 2, block);
}

/* Where a module (libmanta_cuda.so, libmanta_nccl.so) may be: beside this program (the build
 * folder), then the installed lib/manta. Absolute paths only: the library search path is never
 * asked. */
static int module_path(int which, const char *file, const char *installed, char *out, size_t cap)
{
    if (which == 0) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return -1;
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (!slash) return -1;
        *slash = 0;
        return snprintf(out, cap, "%s/%s", self, file) < (int)cap ? 0 : -1;
    }
    if (which == 1 && installed) return snprintf(out, cap, "%s", installed) < (int)cap ? 0 : -1;
    return -1;
}

/* dlopen the first of module_path's places that exists and dlsym `sym` in it; NULL with the
 * reason in why[cap] ("what" starts it: "model.device is cuda"). */
static void *load_module(const char *what, const char *file, const char *installed, const char *sym,
                         char *why, size_t cap)
{
    char path[4200] = "", tried[2200] = "", err[600] = "";
    void *h = NULL;
    for (int w = 0; w < 2 && !h; w++) {
        if (module_path(w, file, installed, path, sizeof path) != 0 || access(path, R_OK) != 0) {
            size_t u = strlen(tried);
            if (path[0] && u < sizeof tried - 1)
                snprintf(tried + u, sizeof tried - u, "%s%s", u ? ", " : "", path);
            path[0] = 0;
            continue;
        }
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(err, sizeof err, "%s", dlerror());
    }
    if (!h && !err[0])
        snprintf(why, cap,
                 "%s, but this manta has no %s (looked for %s; it is built when nvcc is found at "
                 "build time)",
                 what, file, tried[0] ? tried : "none");
    else if (!h)
        snprintf(why, cap, "%s, but %s does not load: %s", what, path, err);
    void *f = h ? dlsym(h, sym) : NULL;
    if (h && !f) snprintf(why, cap, "%s, but %s has no %s", what, path, sym);
    return f;
}

#ifndef MANTA_CUDA_MODULE_INSTALLED
#define MANTA_CUDA_MODULE_INSTALLED NULL
#endif
#ifndef MANTA_NCCL_MODULE_INSTALLED
#define MANTA_NCCL_MODULE_INSTALLED NULL
#endif

const struct mk__backend *rl_cuda_backend(void)
{
    static const mk_backend *be;
    static char why[1024];
    if (be) return be;
    if (why[0]) {
        rl_fail(MANTA_EINVAL, "%s", why);
        return NULL;
    }
    const mk_backend *(*get)(void) = NULL;
    *(void **)&get = load_module("model.device is cuda", "libmanta_cuda.so",
                                 MANTA_CUDA_MODULE_INSTALLED, "mk_backend_cuda", why, sizeof why);
    if (get && !(be = get())) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(why, sizeof why,
                 "model.device is cuda, but this actor sees no CUDA device "
                 "(CUDA_VISIBLE_DEVICES='%s'%s): %s",
                 vis ? vis : "(unset)",
                 vis && !vis[0] ? ", none given: give its group resources: {gpu: ...}" : "",
                 mk_last_error());
    }
    if (be) return be;
    rl_fail(MANTA_EINVAL, "%s", why);
    return NULL;
}

const struct manta_coll_backend *rl_nccl_backend(void)
{
    static const manta_coll_backend *nb;
    static char why[1024];
    if (nb) return nb;
    if (why[0]) {
        rl_fail(MANTA_EINVAL, "%s", why);
        return NULL;
    }
    const manta_coll_backend *(*get)(void) = NULL;
    *(void **)&get = load_module("the learner shards would sum over NCCL", "libmanta_nccl.so",
                                 MANTA_NCCL_MODULE_INSTALLED, "manta_coll_nccl", why, sizeof why);
    if (get) nb = get();
    if (nb) return nb;
    rl_fail(MANTA_EINVAL, "%s", why);
    return NULL;
}

int rl_model_open(const rl_model_spec *ms, int max_batch, int max_seq, unsigned flags,
                  mk_model **out)
{
    *out = NULL;
    int rc;
    const mk_backend *be = NULL;
    if (ms->cuda && !(be = rl_cuda_backend())) return MANTA_EINVAL;
    if (be && (rc = mk_backend_set_math(be, (mk_math)ms->math)))
        return rl_fail(MANTA_EINVAL, "model.matmul: %s", mk_last_error());
    if (ms->gguf) {
        rc = mk_load_gguf_ex(out, ms->path, max_batch, max_seq, be, flags);
    } else if (ms->path[0]) {
        rc = mk_load_dir_ex(out, ms->path, max_batch, max_seq, be, flags);
    } else {
        rc = mk_model_new_ex(out, &ms->cfg, max_batch, max_seq, be, flags);
        if (rc == MK_OK) mk_model_init(*out, ms->seed);
    }
    if (rc == MK_OK) return 0;
    return rl_fail(rc == MK_ERR_NOMEM ? MANTA_ENOMEM : MANTA_EINVAL, "model%s%s: %s",
                   ms->path[0] ? ".path " : "", ms->path, mk_last_error());
}

/* Writes text to dir/name through a temporary file renamed into place. */
static int write_text(const char *dir, const char *name, const char *text)
{
    char path[1200], tmp[1216];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    size_t n = strlen(text);
    int ok = f && fwrite(text, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return rl_fail(MANTA_ESYS, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

/* A GGUF model's tokenizer beside its weights, as a Hugging Face folder
 * has it: tokenizer.json (what mtok_load_gguf builds from the file),
 * tokenizer_config.json with the special tokens and the chat template the
 * policy was trained with (the task's system message its default), and
 * generation_config.json, so that AutoTokenizer and apply_chat_template give
 * the ids the rollouts saw. */
static int save_gguf_tokenizer(const rl_model_spec *ms, const char *dir)
{
    char *json = NULL, *tmpl = NULL, *cfg = NULL, *gen = NULL;
    int64_t bos, eos, pad;
    mtok *t = NULL;
    int rc = mtok_gguf_tokenizer_json(ms->path, &json, NULL) ||
                     mtok_gguf_special_ids(ms->path, &bos, &eos, &pad) ||
                     mtok_load_gguf(ms->path, &t)
                 ? rl_fail(MANTA_EINVAL, "%s: %s", ms->path, mtok_last_error())
                 : 0;
    if (!rc && ms->chat_format == MTOK_CHAT_CHATML &&
        mtok_chat_template_jinja(MTOK_CHAT_CHATML, ms->system[0] ? ms->system : NULL, &tmpl))
        rc = rl_fail(MANTA_EINVAL, "chat template: %s", mtok_last_error());
    if (!rc) rc = write_text(dir, "tokenizer.json", json);
    cJSON *c = rc ? NULL : cJSON_CreateObject(), *g = rc ? NULL : cJSON_CreateObject();
    if (!rc) {
        const char *names[3] = {"bos_token", "eos_token", "pad_token"};
        const int64_t ids[3] = {bos, eos, pad};
        cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
        for (int i = 0; i < 3; i++) {
            const char *tok = ids[i] >= 0 ? mtok_token_str(t, (int32_t)ids[i]) : NULL;
            if (tok) cJSON_AddStringToObject(c, names[i], tok);
        }
        cJSON_AddNumberToObject(c, "model_max_length", ms->cfg.block_size);
        cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
        if (tmpl) cJSON_AddStringToObject(c, "chat_template", tmpl);
        if (bos >= 0) cJSON_AddNumberToObject(g, "bos_token_id", (double)bos);
        if (eos >= 0) cJSON_AddNumberToObject(g, "eos_token_id", (double)eos);
        if (pad >= 0) cJSON_AddNumberToObject(g, "pad_token_id", (double)pad);
        cfg = cJSON_Print(c), gen = cJSON_Print(g);
        if (!cfg || !gen) rc = rl_fail(MANTA_ENOMEM, "out of memory for tokenizer_config.json");
    }
    if (!rc) rc = write_text(dir, "tokenizer_config.json", cfg);
    if (!rc) rc = write_text(dir, "generation_config.json", gen);
    cJSON_Delete(c), cJSON_Delete(g);
    free(json), free(tmpl), free(cfg), free(gen);
    mtok_free(t);
    return rc;
}

int rl_model_save(const rl_model_spec *ms, const mk_model *m, const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return rl_fail(MANTA_ESYS, "cannot create %s: %s", dir, strerror(errno));
    size_t width = ms->dtype == MK_F32 ? 4 : 2;
    size_t bytes = mk_model_num_params(m) * width;
    if (mk_save_dir(m, dir, ms->dtype, bytes > SHARD_BYTES ? SHARD_BYTES : 0) != MK_OK)
        return rl_fail(MANTA_ESYS, "%s", mk_last_error());
    return ms->gguf && ms->tokenizer[0] && !strcmp(ms->tokenizer, ms->path)
               ? save_gguf_tokenizer(ms, dir)
               : 0;
}

const char *rl_model_describe(const rl_model_spec *ms, char *out, size_t cap)
{
    if (ms->path[0])
        snprintf(out, cap, "%s from %s", mk_arch_name(ms->cfg.arch), ms->path);
    else
        snprintf(out, cap, "%s (fresh, seed %llu)", mk_arch_name(ms->cfg.arch),
                 (unsigned long long)ms->seed);
    return out;
}
