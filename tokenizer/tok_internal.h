/*
 * tok_internal.h - what the files of libmanta_tok share; not installed.
 *
 * The tokenizer works on raw UTF-8 bytes throughout: the byte-to-unicode
 * mapping of byte-level BPE is a bijection, so a vocabulary string is stored
 * as the bytes it stands for, and BPE starts from one symbol per byte.
 */
#ifndef MANTA_TOK_INTERNAL_H
#define MANTA_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "manta_tok.h"

/* errors.c: records the message of this thread's last failure; returns code. */
int mtok__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- growable byte buffer (buf.c) --------------------------------------- */
typedef struct mtok_buf {
    char *p;
    size_t len, cap;
} mtok_buf;
int mtok__buf_reserve(mtok_buf *b, size_t extra);
int mtok__buf_put(mtok_buf *b, const void *s, size_t n);
int mtok__buf_puts(mtok_buf *b, const char *s);
int mtok__buf_putc(mtok_buf *b, char c);

/* ---- hash maps (map.c) -------------------------------------------------- */
/* Byte-string keys to int32 values; keys copied into an arena. */
typedef struct mtok_strmap {
    uint32_t *slots; /* index+1 into entries, 0 = empty */
    size_t mask;
    struct mtok_strent {
        uint64_t hash;
        uint32_t off, len; /* into keys */
        int32_t val;
    } * ent;
    size_t n, cap;
    mtok_buf keys;
} mtok_strmap;
int mtok__strmap_init(mtok_strmap *m, size_t hint);
void mtok__strmap_destroy(mtok_strmap *m);
/* Sets key -> val (replacing). */
int mtok__strmap_put(mtok_strmap *m, const char *k, size_t len, int32_t val);
/* Value of key, or -1. */
int32_t mtok__strmap_get(const mtok_strmap *m, const char *k, size_t len);
uint64_t mtok__hash(const void *p, size_t n);

/* (id, id) pairs to (rank, new id). */
typedef struct mtok_pairmap {
    struct mtok_pairent {
        uint64_t key; /* (a << 32 | b) + 1; 0 = empty */
        int32_t rank, id;
    } * slot;
    size_t mask, n;
} mtok_pairmap;
int mtok__pairmap_init(mtok_pairmap *m, size_t n);
void mtok__pairmap_destroy(mtok_pairmap *m);
int mtok__pairmap_put(mtok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* Entry of (a, b), or NULL. */
const struct mtok_pairent *mtok__pairmap_get(const mtok_pairmap *m, int32_t a, int32_t b);

/* ---- UTF-8 and Unicode (utf8.c) ----------------------------------------- */
/* Offset of the first invalid byte, or len when all is valid UTF-8. */
size_t mtok__utf8_check(const char *s, size_t len);
/* Appends s with each maximal invalid subpart replaced by U+FFFD. */
int mtok__utf8_replace(mtok_buf *out, const char *s, size_t len);
/* Decodes one code point of valid UTF-8 at s; *n gets its length. */
uint32_t mtok__utf8_next(const char *s, int *n);
int mtok__utf8_put(char *dst, uint32_t cp);
/* GPT-2's bytes_to_unicode: byte -> code point. */
uint32_t mtok__byte_to_cp(uint8_t b);
/* Inverse: code point -> byte, or -1 when cp is not one of the 256. */
int mtok__cp_to_byte(uint32_t cp);
/* Appends the NFC form of valid UTF-8 s (ICU). */
int mtok__nfc(mtok_buf *out, const char *s, size_t len);
/* Python's str.isspace for one code point (Jinja's trim). */
bool mtok__py_isspace(uint32_t cp);

/* ---- the tokenizer ------------------------------------------------------ */
typedef struct mtok_added {
    char *content; /* as matched: NFC'd when normalized and the normalizer is NFC */
    char *orig;    /* as written in the file (mtok_token_id looks this up) */
    size_t len;
    int32_t id;
    bool special, normalized;
} mtok_added;

typedef struct mtok_cache {
    mtok_strmap map; /* piece bytes -> offset into ids */
    int32_t *ids;    /* per entry: count, then the ids */
    size_t n_ids, cap_ids;
} mtok_cache;

#define MTOK_MAX_SPLITS 4
#define MTOK_CACHE_MAX  200000 /* entries; beyond it pieces are not cached */

struct mtok {
    char name[256];
    /* model */
    mtok_strmap vocab; /* token bytes -> id (byte-level tokens only) */
    char **id_str;     /* id -> vocabulary string (as written in the file) */
    size_t n_ids;
    mtok_pairmap merges;
    int32_t byte_id[256]; /* id of the one-byte token */
    bool ignore_merges;
    /* added tokens, longest first within each first byte */
    mtok_added *added;
    size_t n_added;
    bool *is_special;         /* per id */
    bool added_first[2][256]; /* [normalized] first bytes of added tokens */
    bool has_normalized_added;
    /* normalizer */
    bool nfc;
    /* pre-tokenizer: Split regexes (Isolated), then ByteLevel */
    pcre2_code *split[MTOK_MAX_SPLITS];
    size_t n_split;
    pcre2_match_data *md;
    pcre2_jit_stack *jit_stack;
    pcre2_match_context *mctx;
    /* post-processor: ids around the sequence with MTOK_ADD_SPECIAL */
    int32_t *tpl_pre, *tpl_post;
    size_t n_pre, n_post;
    /* per-word BPE cache and scratch */
    mtok_cache cache;
    struct mtok_sym *sym;
    size_t sym_cap;
    struct mtok_heapent *heap;
    size_t heap_cap;
    mtok_buf scratch, norm;
};

/* load.c helpers used by pretok.c */
int mtok__compile_split(mtok *t, const char *onig_pattern, const char *where);
/* pretok.c: runs the Split regexes and calls emit for each non-empty piece. */
typedef int (*mtok_piece_fn)(mtok *t, const char *s, size_t len, void *arg);
int mtok__pretokenize(mtok *t, const char *s, size_t len, mtok_piece_fn emit, void *arg);
/* bpe.c: appends the ids of one pre-token (raw bytes). */
int mtok__bpe(mtok *t, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap);
void mtok__cache_destroy(mtok_cache *c);

/* pyjson.c: re-serialises JSON text as Python's json.dumps(ensure_ascii=False)
 * does; indent < 0 means none (", " and ": "). */
int mtok__pyjson(mtok_buf *out, const char *json, size_t len, int indent, const char *what);
/* json.dumps of a string. */
int mtok__pyjson_str(mtok_buf *out, const char *s, size_t len);

#endif
