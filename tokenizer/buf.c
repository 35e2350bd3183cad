/*
 * buf.c - the growable byte buffer every other file appends to.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int mtok__buf_reserve(mtok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return mtok__fail(MTOK_ENOMEM, "out of memory growing a buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

int mtok__buf_put(mtok_buf *b, const void *s, size_t n)
{
    int rc = mtok__buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int mtok__buf_puts(mtok_buf *b, const char *s)
{
    return mtok__buf_put(b, s, strlen(s));
}

int mtok__buf_putc(mtok_buf *b, char c)
{
    return mtok__buf_put(b, &c, 1);
}
