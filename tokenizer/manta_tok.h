/*
 * manta_tok.h - byte-level BPE tokenizer and chat formats (libmanta_tok).
 *
 * This header is the whole contract of the tokenizer library.  It depends on
 * neither the runtime nor the kernels, and needs no Python at run time.  It
 * loads a Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2,
 * Llama 3, Qwen2, Qwen3), encodes text to token ids and decodes ids to text
 * exactly as the `tokenizers` library does, and renders conversations in the
 * ChatML (Qwen) and Llama 3 chat formats exactly as transformers'
 * apply_chat_template does with those models' templates.
 *
 * Conventions, true of every function below unless its comment says otherwise:
 *
 *  - Errors.  Functions that can fail return 0 or a negative MTOK_E* code.
 *    The codes mirror the names and values of the runtime's MANTA_E* table
 *    (runtime/core/manta.h) for the conditions both know, without linking
 *    the runtime.  A failing call records a one-line message (what failed and
 *    where: file, JSON path, byte offset) in thread-local storage, returned by
 *    mtok_last_error().  mtok_strerror() names a code.
 *  - Refusal.  Whatever this library cannot reproduce exactly is refused, at
 *    load or at the call, with MTOK_EUNSUPPORTED and a message naming it (a
 *    model type other than BPE, a pre-tokenizer other than Split + ByteLevel,
 *    dropout, byte fallback, a normalizer other than NFC, ...), rather than
 *    tokenising text differently from `tokenizers`.
 *  - Invalid UTF-8.  `tokenizers` only takes valid text.  mtok_encode refuses
 *    input that is not UTF-8 (MTOK_EINVAL, naming the byte offset) unless
 *    MTOK_UTF8_REPLACE is given; then each maximal invalid subpart becomes
 *    U+FFFD, exactly as Python's bytes.decode("utf-8", "replace") does, and
 *    the ids are those `tokenizers` gives for that decoded string.
 *  - Ownership.  `_new`/`_load` allocate and `_free` releases; `_free(NULL)` is
 *    a no-op.  Arrays and strings returned through `**out` parameters are
 *    malloc'd and belong to the caller (release them with free()).  Input
 *    pointers are borrowed for the duration of the call.
 *  - Threads.  An mtok may be used by one thread at a time (encoding fills a
 *    per-tokenizer cache of BPE results); distinct mtok objects may be used by
 *    distinct threads.  mtok_strerror and mtok_last_error are thread-safe.
 *
 * Example:
 *
 *     mtok *t;
 *     if (mtok_load("model/tokenizer.json", &t) != 0) die(mtok_last_error());
 *     int32_t *ids; size_t n;
 *     if (mtok_encode(t, text, strlen(text), 0, &ids, &n) == 0) { ...; free(ids); }
 *     mtok_free(t);
 */
#ifndef MANTA_TOK_H
#define MANTA_TOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------- */

#define MTOK_ERRORS(X)                                                                             \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ENOTFOUND, -12, "no such token or file")                                                     \
    X(ESYS, -16, "system call failed")                                                             \
    X(EFORMAT, -100, "malformed tokenizer.json")                                                   \
    X(EUNSUPPORTED, -101, "tokenizer or option not supported: it would not match tokenizers")

enum {
#define MTOK_X_ENUM(name, code, text) MTOK_##name = code,
    MTOK_ERRORS(MTOK_X_ENUM)
#undef MTOK_X_ENUM
};

/* Static text for an error code; never NULL. Thread-safe. */
const char *mtok_strerror(int code);
/* Message of the last failing call on this thread ("" if none); valid until
 * the next failing call on this thread. */
const char *mtok_last_error(void);

/* ---- loading ------------------------------------------------------------ */

typedef struct mtok mtok;

/* Loads a tokenizer.json file.  On success *out is a new tokenizer (free it
 * with mtok_free); on failure *out is NULL and the message names the file and
 * the JSON path at fault.  Unsupported kinds (model type "Unigram",
 * "WordPiece", a BPE without ByteLevel, ...) give MTOK_EUNSUPPORTED naming
 * the type. */
int mtok_load(const char *path, mtok **out);
/* The same from the JSON text itself (len bytes; need not be NUL-terminated).
 * `name` labels messages (a path, say; NULL gives "tokenizer.json"). */
int mtok_load_json(const char *json, size_t len, const char *name, mtok **out);
void mtok_free(mtok *t);

/* Number of ids (the largest id + 1, added tokens included). */
size_t mtok_vocab_size(const mtok *t);
/* The id of a token given as its vocabulary string (byte-level form, "Ġthe")
 * or added-token content as written in the file ("<|im_end|>"); -1 if there
 * is none. */
int32_t mtok_token_id(const mtok *t, const char *token);
/* The string of an id, as tokenizers' id_to_token gives it: an added token's
 * (normalised) content, else the vocabulary string (NUL-terminated, owned by
 * t), or NULL. */
const char *mtok_token_str(const mtok *t, int32_t id);
/* 1 if the id is an added token marked special, 0 otherwise. */
int mtok_is_special(const mtok *t, int32_t id);

/* ---- GGUF files ---------------------------------------------------------- */

/* Loads the tokenizer a GGUF file (llama.cpp's format, versions 2 and 3)
 * carries in its tokenizer.ggml.* metadata, as transformers'
 * from_pretrained(..., gguf_file=...) builds it: model "gpt2" (byte-level
 * BPE) only, vocabulary tokenizer.ggml.tokens, merges tokenizer.ggml.merges,
 * control tokens (token_type 3) and the bos/eos/unknown/padding ids as
 * special added tokens, user-defined ones (4) as added tokens, bos/eos
 * around a sequence with MTOK_ADD_SPECIAL when add_bos_token/add_eos_token
 * say so.  The pre-tokenizer is the one tokenizer.ggml.pre names, as
 * llama.cpp reads it: "gpt-2"/"gpt2", "llama-bpe"/"llama3"/"llama-v3",
 * "qwen2", "smollm" (digits alone, then GPT-2's regex: SmolLM2's own
 * tokenizer; transformers' GGUF loader falls back to GPT-2's regex alone for
 * it).  Only the metadata is read, every count bounded by the file's size.
 * Refused: another tokenizer.ggml.model or pre-tokenizer name
 * (MTOK_EUNSUPPORTED, naming it), a malformed or truncated file
 * (MTOK_EFORMAT, naming the key), a missing file (MTOK_ENOTFOUND).  On
 * failure *out is NULL. */
int mtok_load_gguf(const char *path, mtok **out);
/* The file's tokenizer.chat_template: *tmpl is a malloc'd NUL-terminated copy,
 * or NULL when the file has none (still success).  Errors as mtok_load_gguf. */
int mtok_gguf_chat_template(const char *path, char **tmpl);
/* The tokenizer.json text mtok_load_gguf builds from the file (what a
 * Hugging Face folder written from a GGUF model carries); *json malloc'd and
 * NUL-terminated, *len its length (len may be NULL).  Errors as
 * mtok_load_gguf. */
int mtok_gguf_tokenizer_json(const char *path, char **json, size_t *len);
/* The file's tokenizer.ggml.bos_token_id, eos_token_id and
 * padding_token_id, each -1 when absent.  Errors as mtok_load_gguf. */
int mtok_gguf_special_ids(const char *path, int64_t *bos, int64_t *eos, int64_t *pad);

/* ---- encoding and decoding ---------------------------------------------- */

enum {
    /* Apply the post-processor, as tokenizers' add_special_tokens=True does
     * (Llama 3's TemplateProcessing prepends <|begin_of_text|>). */
    MTOK_ADD_SPECIAL = 1u << 0,
    /* Replace invalid UTF-8 by U+FFFD (Python's errors="replace") instead of
     * refusing it. */
    MTOK_UTF8_REPLACE = 1u << 1,
};

/* Encodes len bytes of text.  Added and special tokens written in the text
 * are matched as tokenizers does.  On success *ids is a malloc'd array of *n
 * ids (NULL when *n is 0).  Errors: MTOK_EINVAL (NULL argument, or invalid
 * UTF-8 without MTOK_UTF8_REPLACE), MTOK_ENOMEM, MTOK_EUNSUPPORTED (a regex
 * failed to run to the end: PCRE2 limits). */
int mtok_encode(mtok *t, const char *text, size_t len, unsigned flags, int32_t **ids, size_t *n);

enum {
    /* Leave out added tokens marked special (skip_special_tokens=True). */
    MTOK_SKIP_SPECIAL = 1u << 0,
    /* Return the raw bytes the tokens stand for, even when they are not
     * UTF-8 (a prefix of a stream, say).  Without it, invalid sequences are
     * replaced by U+FFFD as tokenizers' decode does. */
    MTOK_DECODE_BYTES = 1u << 1,
};

/* Decodes n ids.  On success *text is a malloc'd, NUL-terminated string of
 * *len bytes.  Errors: MTOK_EINVAL (an id out of range), MTOK_ENOMEM. */
int mtok_decode(const mtok *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                size_t *len);

/* ---- chat formats ------------------------------------------------------- */

typedef enum mtok_chat_format {
    MTOK_CHAT_AUTO = 0, /* chosen from the tokenizer's special tokens */
    MTOK_CHAT_CHATML,   /* Qwen2.5: <|im_start|>role\n...<|im_end|>\n */
    MTOK_CHAT_LLAMA3,   /* Llama 3.1: <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
} mtok_chat_format;

typedef struct mtok_tool_call {
    const char *name;      /* function name */
    const char *arguments; /* its arguments as JSON text (an object, usually) */
} mtok_tool_call;

typedef struct mtok_message {
    const char *role;                 /* "system", "user", "assistant" or "tool" */
    const char *content;              /* UTF-8; NULL reads as "" */
    const mtok_tool_call *tool_calls; /* assistant turns only; NULL if none */
    size_t n_tool_calls;
} mtok_message;

typedef struct mtok_chat_opts {
    mtok_chat_format format;   /* MTOK_CHAT_AUTO needs a tokenizer */
    int add_generation_prompt; /* end with the assistant header */
    /* Tool definitions as a JSON array text (the `tools` argument of
     * apply_chat_template), or NULL for none. */
    const char *tools_json;
    /* Llama 3 only: the "Today Date" line; NULL gives the template's
     * default "26 Jul 2024". */
    const char *date_string;
} mtok_chat_opts;

/* The format a spec names: "auto", "chatml" (also "qwen") or "llama3".
 * MTOK_EINVAL, with a message listing the names, for anything else. */
int mtok_chat_format_parse(const char *name, mtok_chat_format *out);

/* Picks the chat format from the tokenizer's tokens: <|im_start|> and
 * <|im_end|> give ChatML, <|start_header_id|> and <|eot_id|> give Llama 3.
 * MTOK_ENOTFOUND (with a message) when neither set is present. */
int mtok_chat_detect(const mtok *t, mtok_chat_format *out);

/* Renders a conversation as text, the string transformers'
 * apply_chat_template(messages, tools=..., tokenize=False,
 * add_generation_prompt=...) returns with the Qwen2.5 (ChatML) or Llama 3.1
 * template.  `t` may be NULL when opts->format is named.  Tool-call
 * arguments and tools are re-serialised as Python's json.dumps does
 * (", " and ": ", key order kept, non-ASCII kept, indent 4 for Llama 3's
 * tool list).  Refused as the templates refuse: Llama 3 with several tool
 * calls in one turn, or with tools and no user message (MTOK_EINVAL).  On
 * success *text is malloc'd and NUL-terminated, *len its length (len may be
 * NULL). */
int mtok_chat_render(const mtok *t, const mtok_message *msgs, size_t n, const mtok_chat_opts *opts,
                     char **text, size_t *len);

/* A Jinja chat template (tokenizer_config.json "chat_template") with which
 * transformers' apply_chat_template renders what mtok_chat_render renders
 * for the format (MTOK_CHAT_CHATML only today), with default_system (NULL:
 * the format's own default) as the system message of a conversation that
 * has none.  *tmpl malloc'd; MTOK_EINVAL for other formats. */
int mtok_chat_template_jinja(mtok_chat_format f, const char *default_system, char **tmpl);

#ifdef __cplusplus
}
#endif
#endif
