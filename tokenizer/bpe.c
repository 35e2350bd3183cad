/*
 * bpe.c - byte-pair merges of one pre-token, with a cache of results.
 *
 * The merge order is tokenizers' (models/bpe/word.rs): a min-heap of
 * candidate merges keyed by (rank, position); a popped entry is dropped when
 * its left symbol was merged away or its pair no longer gives that token.
 * Symbols form a linked list over the piece, so a word of n bytes costs
 * O(n log n).  Results are cached per piece (the bytes as key) up to
 * MTOK_CACHE_MAX entries, as tokenizers caches words; the cache only saves
 * time, never changes ids.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

struct mtok_sym {
    int32_t id, prev, next, len;
};
struct mtok_heapent {
    int32_t rank, pos, id;
};

static bool heap_less(const struct mtok_heapent *a, const struct mtok_heapent *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct mtok_heapent *h, size_t *n, struct mtok_heapent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct mtok_heapent heap_pop(struct mtok_heapent *h, size_t *n)
{
    struct mtok_heapent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int push_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t k)
{
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *n + k) c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return mtok__fail(MTOK_ENOMEM, "out of memory for %zu ids", c);
        *ids = p, *cap = c;
    }
    memcpy(*ids + *n, src, k * sizeof *src);
    *n += k;
    return 0;
}

void mtok__cache_destroy(mtok_cache *c)
{
    mtok__strmap_destroy(&c->map);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

static int cache_put(mtok_cache *c, const char *s, size_t len, const int32_t *ids, size_t n)
{
    if (c->map.n >= MTOK_CACHE_MAX || len > 255) return 0;
    if (c->n_ids + n + 1 > c->cap_ids) {
        size_t cap = c->cap_ids ? c->cap_ids * 2 : 4096;
        while (cap < c->n_ids + n + 1) cap *= 2;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p) return 0; /* a cache that cannot grow just stops caching */
        c->ids = p, c->cap_ids = cap;
    }
    if (c->n_ids > INT32_MAX) return 0;
    if (mtok__strmap_put(&c->map, s, len, (int32_t)c->n_ids)) return 0;
    c->ids[c->n_ids] = (int32_t)n;
    memcpy(c->ids + c->n_ids + 1, ids, n * sizeof *ids);
    c->n_ids += n + 1;
    return 0;
}

static int grow_scratch(mtok *t, size_t len)
{
    if (len <= t->sym_cap) return 0;
    size_t cap = t->sym_cap ? t->sym_cap : 64;
    while (cap < len) cap *= 2;
    struct mtok_sym *s = realloc(t->sym, cap * sizeof *s);
    if (s) t->sym = s;
    struct mtok_heapent *h = realloc(t->heap, cap * 2 * sizeof *h);
    if (h) t->heap = h;
    if (!s || !h) return mtok__fail(MTOK_ENOMEM, "out of memory for a word of %zu bytes", len);
    t->sym_cap = cap;
    return 0;
}

static void try_push(const mtok *t, struct mtok_heapent *heap, size_t *nh, int32_t pos)
{
    const struct mtok_pairent *m =
        mtok__pairmap_get(&t->merges, t->sym[pos].id, t->sym[t->sym[pos].next].id);
    if (m) heap_push(heap, nh, (struct mtok_heapent){m->rank, pos, m->id});
}

int mtok__bpe(mtok *t, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap)
{
    const unsigned char *u = (const unsigned char *)s;
    if (len == 1) return t->byte_id[u[0]] < 0 ? 0 : push_ids(ids, n, cap, &t->byte_id[u[0]], 1);
    int32_t hit = mtok__strmap_get(&t->cache.map, s, len);
    if (hit >= 0) return push_ids(ids, n, cap, t->cache.ids + hit + 1, (size_t)t->cache.ids[hit]);
    if (t->ignore_merges) {
        int32_t id = mtok__strmap_get(&t->vocab, s, len);
        if (id >= 0) return push_ids(ids, n, cap, &id, 1);
    }
    int rc = grow_scratch(t, len);
    if (rc) return rc;
    struct mtok_sym *sym = t->sym;
    /* A byte whose symbol the vocabulary lacks gets no symbol: tokenizers' BPE without an unk
     * token skips such characters, and their neighbours become adjacent (SmolLM2 lacks 21). */
    size_t ns = 0;
    for (size_t i = 0; i < len; i++) {
        if (t->byte_id[u[i]] < 0) continue;
        sym[ns] = (struct mtok_sym){t->byte_id[u[i]], (int32_t)ns - 1, -1, 1};
        if (ns) sym[ns - 1].next = (int32_t)ns;
        ns++;
    }
    if (!ns) return 0;
    /* Each merge adds at most two entries: 2 * len bounds the heap. */
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) try_push(t, t->heap, &nh, (int32_t)i);
    while (nh) {
        struct mtok_heapent top = heap_pop(t->heap, &nh);
        struct mtok_sym *l = &sym[top.pos];
        if (l->len == 0 || l->next < 0) continue;
        struct mtok_sym *r = &sym[l->next];
        const struct mtok_pairent *m = mtok__pairmap_get(&t->merges, l->id, r->id);
        if (!m || m->id != top.id) continue;
        l->id = top.id;
        l->len += r->len;
        l->next = r->next;
        r->len = 0;
        if (l->next >= 0) sym[l->next].prev = top.pos;
        if (nh + 2 > 2 * t->sym_cap) continue; /* cannot happen; keeps the bound explicit */
        if (l->prev >= 0) try_push(t, t->heap, &nh, l->prev);
        if (l->next >= 0) try_push(t, t->heap, &nh, top.pos);
    }
    size_t start = *n;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if ((rc = push_ids(ids, n, cap, &sym[i].id, 1))) return rc;
    return cache_put(&t->cache, s, len, *ids + start, *n - start);
}
