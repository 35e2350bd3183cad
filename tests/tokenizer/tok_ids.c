/*
 * tok_ids.c - prints the ids libmanta_tok gives each document of a file, for
 * check_live.py (a helper, not a test on its own).
 *
 *   tok_ids TOKENIZER_JSON DOCS_BIN
 *
 * DOCS_BIN holds "<len>\n<bytes>\n" records.  For each document one line:
 * its ids without special tokens, " | ", its ids with them (MTOK_UTF8_REPLACE
 * throughout).  Exits 1 with the message on any error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manta_tok.h"

static void print_ids(const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON DOCS_BIN\n", argv[0]);
        return 2;
    }
    mtok *t;
    if (mtok_load(argv[1], &t)) {
        fprintf(stderr, "tok_ids: %s\n", mtok_last_error());
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    size_t len;
    while (fscanf(f, "%zu", &len) == 1 && fgetc(f) == '\n') {
        char *p = malloc(len + 1);
        if (!p || fread(p, 1, len, f) != len) return 1;
        fgetc(f);
        int32_t *ids;
        size_t n;
        for (int sp = 0; sp < 2; sp++) {
            unsigned flags = MTOK_UTF8_REPLACE | (sp ? MTOK_ADD_SPECIAL : 0);
            if (mtok_encode(t, p, len, flags, &ids, &n)) {
                fprintf(stderr, "tok_ids: %s\n", mtok_last_error());
                return 1;
            }
            if (sp) printf(" | ");
            print_ids(ids, n);
            free(ids);
        }
        printf("\n");
        free(p);
    }
    fclose(f);
    mtok_free(t);
    return 0;
}
