/*
 * rl_util.h - small helpers shared by the RL actors (internal to actors/):
 * the error convention, reading msgpack maps by key, packing key/value
 * pairs, the one reader of init arguments and settings (rl_args), the policy
 * model a spec names (policy.c), joining the HTTP client to the actor's
 * event loop, and the clock.
 *
 * Errors: functions that can fail return 0 or a negative MANTA_E* code
 * (manta.h) and leave a message naming the cause in rl_last_error() (one
 * per thread, like manta_last_error()).
 */
#ifndef RL_UTIL_H
#define RL_UTIL_H

#include <manta.h>
#include <manta_http.h>
#include <manta_spec.h>
#include <manta_kernels.h>
#include <msgpack.h>

#include <stddef.h>
#include <stdint.h>

/* Record `fmt` as this thread's last RL error and return code (< 0). */
int rl_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last RL failure in this thread ("" if none). */
const char *rl_last_error(void);

/* A short description of a msgpack value for error messages: "two" (quoted,
 * shortened) for a string, the number, true/false, nil, a map, an array,
 * binary data. Returns out. */
const char *rl_mp_describe(const msgpack_object *o, char *out, size_t cap);

/* Unpack one msgpack object from untrusted bytes. First walks the bytes
 * without allocating and refuses (MANTA_EINVAL) a malformed or truncated object, or
 * one whose array/map headers announce more items than bytes remain, so a
 * few hostile bytes cannot make msgpack-c allocate gigabytes. 0 on success
 * (u then holds the object; the caller destroys u either way). */
int rl_unpack(msgpack_unpacked *u, const void *buf, size_t len);

/* Value of key in a msgpack map, or NULL (also when o is not a map). */
const msgpack_object *rl_mp_get(const msgpack_object *o, const char *key);
int64_t rl_mp_int(const msgpack_object *o, int64_t def);
double rl_mp_num(const msgpack_object *o, double def);
/* A string value copied into out[cap] (def when absent or not a string). */
const char *rl_mp_str(const msgpack_object *o, char *out, size_t cap, const char *def);

void rl_pack_str(msgpack_packer *pk, const char *s);
void rl_pack_kv_int(msgpack_packer *pk, const char *k, int64_t v);
void rl_pack_kv_num(msgpack_packer *pk, const char *k, double v);
void rl_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void rl_pack_kv_bin(msgpack_packer *pk, const char *k, const void *p, size_t n);

/* ---- the spec keys the RL classes read (rl_keys.c) -------------------------- *
 * Every key is declared once, with its type, range, default and meaning:
 * the spec loader checks specs against these tables (manta_spec_options
 * .sections and .settings), the rl_arg_* readers below refuse a key that is
 * not declared or is read with another type, range or default (an internal
 * error that fails the actor's init), and `manta help spec` prints them as
 * the docs (docs/spec-keys.md). */
/* model, rl, task, reward (MANTA_SPEC_IN_SETTINGS) and tools; {NULL}-ended. */
extern const manta_spec_key rl_spec_sections[];
/* A built-in group's own settings (controller, env_group, threads ...). */
extern const manta_spec_key rl_settings_keys[];
/* The declaration of section.key (section NULL: a group's own settings), or
 * NULL when there is none. */
const manta_spec_key *rl_key_find(const char *section, const char *key);

/* ---- defaults derived from a spec (rl_defaults.c) ---------------------------- *
 * manta_spec_options.defaults of every RL spec load (`manta run`, `manta
 * scale`, rl_run): with model.device cuda, each group of a class that opens
 * the policy (learner, rollout) whose device is cuda and that has no
 * resources.gpu gets groups.G.resources.gpu = rl_gpu_share(N), N the
 * replicas of all such groups: together they fit on one GPU. Explicit
 * values (0 included) win; on the CPU nothing is derived. */
int rl_spec_defaults(manta_spec_defaults *d, const manta_spec_node *root, void *user);
/* 1 for n <= 1, else 1/n rounded down to a thousandth (at least 0.001). */
double rl_gpu_share(int64_t n);

/* ---- init arguments: one reader for the five classes ---------------------- *
 * The init argument is manta_spec_init_payload()'s map {job, group, class,
 * replica, replicas, settings, sections}. A setting is looked up in the
 * group's settings (nested under its section, `settings.model.n_layer`, or
 * flat, `settings.n_layer`), then in the spec section (`model.n_layer`).
 * A value of the wrong type or out of range is an error that names the spec
 * key, e.g. `groups.learner.settings.model.n_layer: expected an integer,
 * got "two"`; so is an unknown key in the sections the RL classes own
 * (model, rl, task, reward: rl_spec_sections) or in a group's settings
 * (`manta run` has found these already, with their file:line:col; this
 * check covers jobs started from C). Readers after the first error return
 * their default; rl_args_close() reports the first. */
typedef struct rl_args {
    msgpack_unpacked u;
    const msgpack_object *root, *settings, *sections;
    char group[64];
    int rc;        /* the first error, or 0 */
    char err[512]; /* its message */
} rl_args;

/* Unpack and check the init argument. 0 or MANTA_EINVAL (the message in
 * a->err and rl_last_error()); rl_args_close() is needed either way. */
int rl_args_open(rl_args *a, const void *buf, size_t len);
/* Report the first error on the actor's log, free a; returns a->rc. */
int rl_args_close(rl_args *a, manta_ctx *m);

/* section NULL: a group setting only (controller, learners, threads ...);
 * "" : a top-level field of the payload (replica, replicas, job). Integers
 * must be integers within [lo, hi]; numbers may be integers or floats. */
int64_t rl_arg_int(rl_args *a, const char *section, const char *key, int64_t def, int64_t lo,
                   int64_t hi);
double rl_arg_num(rl_args *a, const char *section, const char *key, double def, double lo,
                  double hi);
/* A string into out[cap]; longer than cap - 1 bytes is an error. */
const char *rl_arg_str(rl_args *a, const char *section, const char *key, char *out, size_t cap,
                       const char *def);
/* Check that section.key is declared with this type, range and default
 * (def for INT and NUM, sdef for STR; a declared default in parentheses is
 * not compared); else record an internal error naming actors/rl_keys.c. For
 * readers that do not go through rl_arg_int/_num/_str (env.c's tools).
 * Returns a->rc. */
int rl_arg_declared(rl_args *a, const char *section, const char *key, manta_spec_ktype type,
                    double def, const char *sdef, double lo, double hi);
/* The raw value (after the same lookup), or NULL; the key must be declared. */
const msgpack_object *rl_arg_get(rl_args *a, const char *section, const char *key);
/* Record an error about the value at `key` (same path naming) unless one is
 * recorded already; returns a->rc. */
int rl_arg_error(rl_args *a, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record an error worded by the caller (who names the key) unless one is
 * recorded already; returns a->rc. */
int rl_args_fail(rl_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the policy model (policy.c) ------------------------------------------- *
 * Section "model" names the policy, one of two ways:
 *   path: DIR            a Hugging Face folder (config.json and model.safetensors
 *                        or a sharded index), any family mk_load_dir reads;
 *   n_layer, n_head,     a fresh GPT-2 of that size, initialised from seed
 *   n_embd, block_size,  (defaults 2, 4, 64, 64, 1), vocabulary RL_VOCAB.
 *   seed
 * The two are exclusive. Both take context (KV positions per rollout slot,
 * default min(block_size, 2048)) and max_seq (the learner's longest
 * sequence, default context), each at most block_size; and tokenizer (auto,
 * bytes or a tokenizer.json path) and chat_format (auto, chatml, llama3).
 * A tokenizer is loaded and checked when the spec is read: its vocabulary
 * must fit the model's (a fresh GPT-2 takes the tokenizer's size) and its
 * special tokens must name a chat format. */
typedef struct rl_model_spec {
    char path[512]; /* the folder or .gguf file, or "" for a fresh GPT-2 */
    int gguf;       /* path is a GGUF file (llama.cpp's format), not a folder */
    mk_config cfg;  /* the folder's config.json, or the inline size */
    mk_dtype dtype; /* the checkpoints' dtype: the folder's, F32 for a fresh model */
    uint64_t seed;  /* fresh model only */
    int context, max_seq;
    /* The text the policy reads and writes (textio.c): model.tokenizer
     * "bytes" (the byte-level vocabulary of manta_actors.h), a tokenizer.json
     * path, or "auto" (the folder's tokenizer.json when it has one, else
     * bytes); model.chat_format for a tokenizer (auto, chatml, llama3). */
    char tokenizer[600];   /* the tokenizer.json, or "" for bytes */
    int chat_format;       /* mtok_chat_format (never AUTO once read); 0 for bytes */
    int32_t vocab;         /* token ids the task uses: RL_VOCAB or the tokenizer's size */
    char tools_json[2048]; /* sections.tools as chat-template tool definitions, "" for none */
    char tool_name[32];    /* the first tool's name and argument: a byte-level */
    char tool_arg[32];     /* demonstration's <call>X</call> becomes {tool_arg: X} */
    char system[1024];     /* task.system: the system message of every prompt, "" for none */
    int tools_in_system;   /* task.tools_in_system: the template lists the tools (default 1) */
    int cuda;              /* model.device: 0 cpu, 1 cuda (the back-end rl_model_open uses) */
    int bf16_weights;      /* model.bf16_weights: rollouts decode with bfloat16 copies */
    int bf16_products;     /* model.bf16_products: ... and round activations too */
    int bf16_kv;           /* model.kv_cache bf16: rollouts' KV caches in bfloat16 */
    int bf16_train;        /* model.bf16_train: learners train with bfloat16 storage */
    int math;              /* model.matmul: an mk_math (CUDA's products) */
} rl_model_spec;

/* Read section "model" into *ms (errors go to a like any setting's). A path
 * is checked now: it must be a folder holding a config.json that
 * mk_read_hf_config accepts, with a vocabulary of at least ms->vocab (the
 * task's tokens: RL_VOCAB for bytes, else the tokenizer's); each refusal
 * names the key (model.path, model.tokenizer) and the file. */
void rl_model_read(rl_args *a, rl_model_spec *ms);
/* The tokenizer at path: a GGUF file's own (mtok_load_gguf) or a
 * tokenizer.json (mtok_load); libmanta_tok's codes. */
struct mtok;
int rl_tok_load(const char *path, struct mtok **out);
/* The model of *ms on the CPU back-end with room for max_batch x max_seq
 * training tokens and mk_model_new_ex flags (MK_MODEL_INFER for a rollout,
 * which only decodes: parameters only): loaded from the folder, or created and
 * initialised from the seed. 0, or MANTA_EINVAL / MANTA_ENOMEM with the
 * kernels' message in rl_last_error(); *out owns the model on success. */
/* The CUDA back-end, from libmanta_cuda.so beside this program (or in the
 * installed lib/manta), loaded on first use; NULL with the reason in
 * the last error (rl_fail): not built, not loadable, or no device visible. */
struct mk__backend;
const struct mk__backend *rl_cuda_backend(void);
/* The NCCL collective back-end (manta_coll_nccl), from libmanta_nccl.so found as
 * libmanta_cuda.so is, loaded on first use; NULL with the reason in the last
 * error: not built or not loadable. */
struct manta_coll_backend;
const struct manta_coll_backend *rl_nccl_backend(void);
int rl_model_open(const rl_model_spec *ms, int max_batch, int max_seq, unsigned flags,
                  mk_model **out);
/* Write m as a Hugging Face folder DIR (created if missing) of its family,
 * in ms->dtype (mk_save_dir; shards of 5 GB, save_pretrained's old default,
 * only when the parameters exceed that). 0 or MANTA_ESYS with the reason in
 * rl_last_error(). */
int rl_model_save(const rl_model_spec *ms, const mk_model *m, const char *dir);
/* "f32", "bf16", "f16". */
const char *rl_dtype_name(mk_dtype dt);
/* One line for logs and summaries: "qwen3 from DIR" or "gpt2 (fresh, seed 1)". */
const char *rl_model_describe(const rl_model_spec *ms, char *out, size_t cap);

/* ---- paths inside the run folder ------------------------------------------ *
 * Methods reachable over the network that name a file (the learner's save,
 * checkpoint, restore) write and read only inside the run folder. */

/* rl.run_dir as every actor reads it (default runs/JOB, relative to the
 * working folder); returns out. */
const char *rl_run_dir_read(rl_args *a, char *out, size_t cap);
/* Resolve `path` (len bytes from a caller, not NUL-terminated) inside the
 * folder `root` (resolved with realpath, a folder owned by this user):
 * relative to root, or absolute; no ".." component; the deepest part that
 * exists is resolved with realpath (links included) and must lie strictly
 * below root (or be root itself, when root_ok) and be owned by this user; the rest must not exist
 * at all (not even as a dangling link). *out (cap bytes) gets the canonical absolute path,
 * *existing (may be NULL) the length of its existing part. 0, or MANTA_EINVAL with "WHAT: PATH is
 * outside the run folder ROOT ..." (or the other reason) in rl_last_error(). What comes after the
 * existing part is created with rl_mkdirs_new / O_CREAT|O_EXCL, never following a link. */
int rl_path_inside(const char *what, const char *root, int root_ok, const char *path, size_t len,
                   char *out, size_t cap, size_t *existing);
/* mkdir (0755) every component of path after its first `existing` bytes,
 * the last one too when `last`; each must be new. 0 or MANTA_ESYS. */
int rl_mkdirs_new(const char *path, size_t existing, int last);
/* Remove a file or folder tree without following links (nftw FTW_PHYS);
 * 0, or -1 with errno. */
int rl_remove_tree(const char *path);

/* Monotonic milliseconds / seconds. */
int64_t rl_now_ms(void);
double rl_now_s(void);

/* The HTTP client driven by the actor's event loop. */
typedef struct rl_http_glue {
    manta_ctx *ctx;
    manta_http_client *http;
    uint64_t timer;
} rl_http_glue;
/* Creates the client and joins it to the loop. 0 or MANTA_ENOMEM. */
int rl_http_glue_start(rl_http_glue *g, manta_ctx *m, const manta_http_config *cfg);
void rl_http_glue_stop(rl_http_glue *g);

/* Print a line to stderr prefixed with the actor's name (goes to its log). */
void rl_log(manta_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- progress.c: the controller's progress for `manta run`'s live line ----
 * Published as the job value `progress`, the record whose shape
 * runtime/cli/cli_internal.h gives ({unit, step, steps, time_s,
 * time_limit_s, fields}); the CLI knows nothing of RL. */
/* What the controller knows after a version was trained. */
typedef struct rl_progress {
    int64_t version, max_versions;
    double time_s, max_time_s; /* since the run began; the limit */
    double reward;             /* the version's batch: mean reward */
    double heldout;            /* the last held-out success measured; < 0: none yet */
    double trained_tps, gen_tps;
    const int64_t *stale_hist; /* the batch's staleness histogram: bins 0.. */
    int stale_bins;
    int64_t dropped, tool_calls, tool_errors;
    double stop_at; /* held-out success that ends the run early; > 1: none */
} rl_progress;

/* Publish p as the job value `progress` (a failed write is logged, not
 * returned: the line is a view, the run goes on). */
void rl_progress_publish(manta_ctx *m, const rl_progress *p);

#endif
