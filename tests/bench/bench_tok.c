/*
 * bench_tok.c - encode speed of libmanta_tok against tokenizers (Rust).
 *
 *   build/tests/bench/bench_tok [--reps N] [--tokenizer PATH]... > figures.jsonl
 *
 * Figure: tok_encode_<name>, MB/s of UTF-8 text encoded on one thread, for
 * each of the fixture tokenizers (GPT-2, Llama 3, Qwen2 settings; or the
 * tokenizer.json files given).  The text is this repository's own sources
 * and documents (*.c, *.h, *.md, *.py, in path order) plus the valid cases of
 * the multilingual test corpus repeated 40 times, each file or case one
 * document.  Both sides encode document by document without special tokens,
 * after one warm-up pass (both cache BPE results per word); each figure is
 * the best of --reps passes (default 5).  The baseline, tokenizers'
 * Tokenizer.encode with TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1,
 * is measured by bench_tok.py in a subprocess right after each C figure, so
 * both see the same load; it also reports the number and sum of its ids,
 * which must equal ours.  The Python is $MANTA_PYTHON, else python3 from
 * PATH; without it or without tokenizers, baseline and ratio are null and a
 * note goes to stderr.  One JSON object per line: {"name", "value", "unit",
 * "baseline", "ratio"}.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "manta_tok.h"

typedef struct doc {
    char *p;
    size_t len;
} doc;

static doc *docs;
static size_t n_docs, cap_docs;
static char **paths;
static size_t n_paths, cap_paths;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void add_doc(const char *p, size_t len)
{
    if (n_docs == cap_docs) {
        cap_docs = cap_docs ? cap_docs * 2 : 256;
        docs = realloc(docs, cap_docs * sizeof *docs);
        if (!docs) exit(1);
    }
    docs[n_docs].p = malloc(len + 1);
    if (!docs[n_docs].p) exit(1);
    memcpy(docs[n_docs].p, p, len);
    docs[n_docs].len = len;
    n_docs++;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    *len = (size_t)n;
    return p;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    const char *base = path + ftw->base;
    if (type == FTW_D &&
        (base[0] == '.' || strncmp(base, "build", 5) == 0 || strcmp(base, "fixtures") == 0))
        return FTW_SKIP_SUBTREE;
    if (type != FTW_F) return FTW_CONTINUE;
    const char *dot = strrchr(base, '.');
    if (!dot ||
        (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".md") && strcmp(dot, ".py")))
        return FTW_CONTINUE;
    if (n_paths == cap_paths) {
        cap_paths = cap_paths ? cap_paths * 2 : 256;
        paths = realloc(paths, cap_paths * sizeof *paths);
        if (!paths) exit(1);
    }
    paths[n_paths++] = strdup(path);
    return FTW_CONTINUE;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sources of the repository, then the corpus's valid cases (strict encode
 * refuses the others) 40 times over. */
static void load_docs(mtok *check)
{
    nftw(SOURCE_DIR, visit, 16, FTW_PHYS | FTW_ACTIONRETVAL);
    qsort(paths, n_paths, sizeof *paths, cmp_str);
    for (size_t i = 0; i < n_paths; i++) {
        size_t len;
        char *p = slurp(paths[i], &len);
        int32_t *ids;
        size_t n;
        if (p && mtok_encode(check, p, len, 0, &ids, &n) == 0) {
            add_doc(p, len);
            free(ids);
        }
        free(p);
        free(paths[i]);
    }
    free(paths);
    size_t len;
    char *c = slurp(SOURCE_DIR "/tests/tokenizer/fixtures/corpus.bin", &len);
    if (!c) {
        fprintf(stderr, "bench_tok: cannot read the test corpus\n");
        exit(1);
    }
    for (int rep = 0; rep < 40; rep++) {
        for (size_t i = 0; i < len;) {
            char *end;
            size_t k = strtoul(c + i, &end, 10);
            int32_t *ids;
            size_t n;
            if (k && mtok_encode(check, end + 1, k, 0, &ids, &n) == 0) {
                add_doc(end + 1, k);
                free(ids);
            }
            i = (size_t)(end + 1 - c) + k + 1;
        }
    }
    free(c);
}

static const char *python(void)
{
    const char *p = getenv("MANTA_PYTHON");
    return p && *p ? p : "python3";
}

/* Runs bench_tok.py; returns MB/s, or -1 (with a note) when unavailable. */
static double baseline(const char *tok_path, const char *docs_path, int reps, size_t n_ids,
                       long long id_sum)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 '%s' '%s' '%s' '%s' %d 2>&1",
             python(), BENCH_TOK_SCRIPT, tok_path, docs_path, reps);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[4096] = "";
    double sec = 0, bytes = 0, pn = 0, psum = 0;
    int got = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "{\"seconds\": %lf, \"bytes\": %lf, \"n_ids\": %lf, \"id_sum\": %lf", &sec,
                   &bytes, &pn, &psum) == 4)
            got = 1;
    int st = pclose(f);
    if (!got || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr,
                "bench_tok: no tokenizers baseline (%s with the tokenizers module is needed; set "
                "MANTA_PYTHON): %s",
                python(), line);
        return -1;
    }
    if ((size_t)pn != n_ids || (long long)psum != id_sum) {
        fprintf(
            stderr,
            "bench_tok: ids differ from tokenizers (%zu ids, sum %lld; tokenizers %.0f, %.0f)\n",
            n_ids, id_sum, pn, psum);
        exit(1);
    }
    return bytes / sec / 1e6;
}

static void bench_one(const char *name, const char *tok_path, const char *docs_path, int reps)
{
    mtok *t;
    if (mtok_load(tok_path, &t) != 0) {
        fprintf(stderr, "bench_tok: %s\n", mtok_last_error());
        exit(1);
    }
    size_t bytes = 0, n_ids = 0;
    long long id_sum = 0;
    for (size_t d = 0; d < n_docs; d++) { /* warm-up pass, which also sums the ids */
        int32_t *ids;
        size_t n;
        if (mtok_encode(t, docs[d].p, docs[d].len, 0, &ids, &n) != 0) {
            fprintf(stderr, "bench_tok: %s\n", mtok_last_error());
            exit(1);
        }
        bytes += docs[d].len;
        n_ids += n;
        for (size_t k = 0; k < n; k++) id_sum += ids[k];
        free(ids);
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (size_t d = 0; d < n_docs; d++) {
            int32_t *ids;
            size_t n;
            mtok_encode(t, docs[d].p, docs[d].len, 0, &ids, &n);
            free(ids);
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    mtok_free(t);
    double mbps = bytes / best / 1e6;
    double base = baseline(tok_path, docs_path, reps, n_ids, id_sum);
    if (base > 0)
        printf("{\"name\": \"tok_encode_%s\", \"value\": %.2f, \"unit\": \"MB/s\", \"baseline\": "
               "%.2f, \"ratio\": %.3f}\n",
               name, mbps, base, mbps / base);
    else
        printf("{\"name\": \"tok_encode_%s\", \"value\": %.2f, \"unit\": \"MB/s\", \"baseline\": "
               "null, \"ratio\": null}\n",
               name, mbps);
    fprintf(stderr, "bench_tok: %s: %zu documents, %.2f MB, %zu ids\n", name, n_docs, bytes / 1e6,
            n_ids);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int reps = 5;
    const char *given[16];
    int n_given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc && n_given < 16)
            given[n_given++] = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--reps N] [--tokenizer PATH]...\n", argv[0]);
            return 2;
        }
    }
    static const char *const names[] = {"gpt2", "llama3", "qwen2"};
    char fixture[3][1024];
    for (int k = 0; k < 3; k++)
        snprintf(fixture[k], sizeof fixture[k], "%s/tests/tokenizer/fixtures/%s.json", SOURCE_DIR,
                 names[k]);
    mtok *check;
    if (mtok_load(n_given ? given[0] : fixture[0], &check) != 0) {
        fprintf(stderr, "bench_tok: %s\n", mtok_last_error());
        return 1;
    }
    load_docs(check);
    mtok_free(check);
    char docs_path[] = "/tmp/bench_tok_XXXXXX";
    int fd = mkstemp(docs_path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        perror("bench_tok: temporary file");
        return 1;
    }
    for (size_t d = 0; d < n_docs; d++) {
        fprintf(f, "%zu\n", docs[d].len);
        fwrite(docs[d].p, 1, docs[d].len, f);
        fputc('\n', f);
    }
    fclose(f);
    if (n_given)
        for (int k = 0; k < n_given; k++) {
            char name[32];
            snprintf(name, sizeof name, "given%d", k);
            bench_one(name, given[k], docs_path, reps);
        }
    else
        for (int k = 0; k < 3; k++) bench_one(names[k], fixture[k], docs_path, reps);
    unlink(docs_path);
    for (size_t d = 0; d < n_docs; d++) free(docs[d].p);
    free(docs);
    return 0;
}
