/*
 * map.c - the two hash maps of the tokenizer: byte strings to ids (the
 * vocabulary, the BPE cache) and id pairs to merges.  Open addressing with
 * linear probing; tables stay at most half full.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

uint64_t mtok__hash(const void *p, size_t n)
{
    /* FNV-1a over 8-byte words, then a final mix: pieces are short. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *s++) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

int mtok__strmap_init(mtok_strmap *m, size_t hint)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < hint * 2) cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return mtok__fail(MTOK_ENOMEM, "out of memory for a map of %zu keys", hint);
    m->mask = cap - 1;
    return 0;
}

void mtok__strmap_destroy(mtok_strmap *m)
{
    free(m->slots);
    free(m->ent);
    free(m->keys.p);
    memset(m, 0, sizeof *m);
}

static int strmap_grow(mtok_strmap *m)
{
    size_t cap = (m->mask + 1) * 2;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return mtok__fail(MTOK_ENOMEM, "out of memory growing a map");
    for (size_t i = 0; i < m->n; i++) {
        size_t j = m->ent[i].hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return 0;
}

int32_t mtok__strmap_get(const mtok_strmap *m, const char *k, size_t len)
{
    uint64_t h = mtok__hash(k, len);
    for (size_t j = h & m->mask;; j = (j + 1) & m->mask) {
        uint32_t s = m->slots[j];
        if (!s) return -1;
        const struct mtok_strent *e = &m->ent[s - 1];
        if (e->hash == h && e->len == len && memcmp(m->keys.p + e->off, k, len) == 0) return e->val;
    }
}

int mtok__strmap_put(mtok_strmap *m, const char *k, size_t len, int32_t val)
{
    uint64_t h = mtok__hash(k, len);
    size_t j = h & m->mask;
    for (;; j = (j + 1) & m->mask) {
        uint32_t s = m->slots[j];
        if (!s) break;
        struct mtok_strent *e = &m->ent[s - 1];
        if (e->hash == h && e->len == len && memcmp(m->keys.p + e->off, k, len) == 0) {
            e->val = val;
            return 0;
        }
    }
    if (m->n + 1 > m->mask) /* full: only after growth failed, memory ran out */
        return mtok__fail(MTOK_ENOMEM, "out of memory growing a map");
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        struct mtok_strent *ent = realloc(m->ent, cap * sizeof *ent);
        if (!ent) return mtok__fail(MTOK_ENOMEM, "out of memory growing a map");
        m->ent = ent;
        m->cap = cap;
    }
    if (m->keys.len + len > UINT32_MAX) return mtok__fail(MTOK_ENOMEM, "map keys exceed 4 GiB");
    struct mtok_strent *e = &m->ent[m->n];
    e->hash = h;
    e->off = (uint32_t)m->keys.len;
    e->len = (uint32_t)len;
    e->val = val;
    int rc = mtok__buf_put(&m->keys, k, len);
    if (rc) return rc;
    m->slots[j] = (uint32_t)++m->n;
    if (m->n * 2 > m->mask + 1) return strmap_grow(m);
    return 0;
}

int mtok__pairmap_init(mtok_pairmap *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    m->slot = calloc(cap, sizeof *m->slot);
    if (!m->slot) return mtok__fail(MTOK_ENOMEM, "out of memory for %zu merges", n);
    m->mask = cap - 1;
    m->n = 0;
    return 0;
}

void mtok__pairmap_destroy(mtok_pairmap *m)
{
    free(m->slot);
    memset(m, 0, sizeof *m);
}

static size_t pair_slot(uint64_t key, size_t mask)
{
    key ^= key >> 31;
    key *= 0x9e3779b97f4a7c15ull;
    return (key >> 17) & mask;
}

int mtok__pairmap_put(mtok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if (m->n * 2 >= m->mask + 1) return mtok__fail(MTOK_EINVAL, "merge table full");
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t j = pair_slot(key, m->mask);
    while (m->slot[j].key && m->slot[j].key != key) j = (j + 1) & m->mask;
    /* A repeated merge takes its last rank, as tokenizers' HashMap collect does. */
    if (!m->slot[j].key) m->n++;
    m->slot[j].key = key;
    m->slot[j].rank = rank;
    m->slot[j].id = id;
    return 0;
}

const struct mtok_pairent *mtok__pairmap_get(const mtok_pairmap *m, int32_t a, int32_t b)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t j = pair_slot(key, m->mask);; j = (j + 1) & m->mask) {
        if (m->slot[j].key == key) return &m->slot[j];
        if (!m->slot[j].key) return NULL;
    }
}
