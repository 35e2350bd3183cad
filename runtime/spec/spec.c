/*
 * spec.c -- spec files: YAML text to a checked, typed manta_spec.
 *
 * Loading goes in four passes, and every pass reports into one error list
 * so that a user sees all the problems of a file at once:
 *
 *   1. build: libyaml's event parser drives a small stack machine that makes
 *      a tree of manta_spec_node (mapping / sequence / scalar), each node
 *      with its file, line, column and dotted path. The event API is used
 *      (not the document API) because it gives the position of every key,
 *      which duplicate-key and unknown-key errors need. Aliases are expanded
 *      into copies (bounded by MANTA_SPEC_MAX_NODES, against "billion
 *      laughs"), nesting is bounded by MANTA_SPEC_MAX_DEPTH so every
 *      recursive walk below is bounded too. A syntax error stops this pass;
 *      a duplicate key does not.
 *   2. overrides: each `--set path=value` has its value parsed as YAML by
 *      the same builder (positions "--set:N:COL") and grafted into the tree.
 *   3. validate: the fixed schema (job, redis, log_dir, groups, nodes) is
 *      checked key by key, and the typed manta_spec is filled with pointers
 *      into the tree. Free-form sections are only checked for shape.
 *   4. placement: when the spec lists `nodes`, every group must fit some
 *      node, the totals must fit the cluster, and the first-fit-decreasing
 *      placement that the launcher would compute must succeed.
 *
 * Nothing here keeps global state, so it is reentrant; the placement and
 * the getters are pure functions of their arguments.
 */
#include "manta_spec.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

static const char SET_FILE[] = "--set";
/* The "file" of a default the program derived (manta_spec_options.defaults). */
static const char DEFAULT_FILE[] = "(default)";
#define SETF(c) ((c)->set_file ? (c)->set_file : SET_FILE)

/* Tolerance for comparing CPU amounts, which are sums of decimal fractions. */
#define CPU_EPS 1e-9
#define MAX_GPU 1024 /* per replica or node: more is a typo */

/* ---- Errors ------------------------------------------------------------------ */

void manta_spec_errors_init(manta_spec_errors *e)
{
    memset(e, 0, sizeof *e);
}

void manta_spec_errors_destroy(manta_spec_errors *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->count; i++) {
        free(e->items[i].text);
        free(e->items[i].file);
        free(e->items[i].path);
        free(e->items[i].message);
    }
    memset(e, 0, sizeof *e);
}

size_t manta_spec_errors_print(const manta_spec_errors *e, FILE *out)
{
    size_t n = 0;
    for (size_t i = 0; i < e->count; i++, n++) fprintf(out, "%s\n", e->items[i].text);
    if (e->dropped) {
        fprintf(out, "... and %zu more error%s\n", e->dropped, e->dropped == 1 ? "" : "s");
        n++;
    }
    return n;
}

static void verr(manta_spec_errors *e, const char *file, int line, int col, const char *path,
                 const char *fmt, va_list ap)
{
    if (!e) return;
    if (e->count >= MANTA_SPEC_MAX_ERRORS) {
        e->dropped++;
        return;
    }
    if (!file) file = "";
    if (!path) path = "";
    char *msg = NULL, *text = NULL;
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    int r = -1;
    if (msg) {
        if (line > 0 && path[0])
            r = asprintf(&text, "%s:%d:%d: %s: %s", file, line, col, path, msg);
        else if (line > 0)
            r = asprintf(&text, "%s:%d:%d: %s", file, line, col, msg);
        else if (path[0])
            r = asprintf(&text, "%s: %s: %s", file, path, msg);
        else
            r = asprintf(&text, "%s: %s", file, msg);
    }
    manta_spec_error *it = &e->items[e->count];
    it->file = strdup(file);
    it->path = strdup(path);
    if (r < 0 || !it->file || !it->path) {
        free(msg);
        free(it->file);
        free(it->path);
        if (r >= 0) free(text);
        memset(it, 0, sizeof *it);
        e->dropped++;
        return;
    }
    it->text = text;
    it->message = msg;
    it->line = line > 0 ? line : 0;
    it->col = line > 0 ? col : 0;
    e->count++;
}

void manta_spec_errors_add(manta_spec_errors *e, const char *file, int line, int col,
                           const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(e, file, line, col, path, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 3, 4))) static void
node_err(manta_spec_errors *e, const manta_spec_node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(e, n->file, n->line, n->col, n->path, fmt, ap);
    va_end(ap);
}

/* ---- Scalars ----------------------------------------------------------------- */

static bool is_null_text(const char *s)
{
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static int bool_text(const char *s)
{
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) return 1;
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) return 0;
    return -1;
}

static bool all_of(const char *s, int (*pred)(int))
{
    if (!*s) return false;
    for (; *s; s++)
        if (!pred((unsigned char)*s)) return false;
    return true;
}

static int is_odigit(int ch)
{
    return ch >= '0' && ch <= '7';
}

static bool is_int_text(const char *s)
{
    if (s[0] == '0' && s[1] == 'o') return all_of(s + 2, is_odigit);
    if (s[0] == '0' && s[1] == 'x') return all_of(s + 2, isxdigit);
    if (*s == '-' || *s == '+') s++;
    return all_of(s, isdigit);
}

static bool is_special_float(const char *s)
{
    const char *t = (*s == '-' || *s == '+') ? s + 1 : s;
    if (!strcmp(t, ".inf") || !strcmp(t, ".Inf") || !strcmp(t, ".INF")) return true;
    return !strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN");
}

static bool is_float_text(const char *s)
{
    if (is_special_float(s)) return true;
    if (*s == '-' || *s == '+') s++;
    size_t digits = 0;
    while (isdigit((unsigned char)*s)) s++, digits++;
    if (*s == '.') {
        s++;
        while (isdigit((unsigned char)*s)) s++, digits++;
    }
    if (!digits) return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '-' || *s == '+') s++;
        if (!isdigit((unsigned char)*s)) return false;
        while (isdigit((unsigned char)*s)) s++;
    }
    return *s == '\0';
}

static manta_spec_type resolve(const manta_spec_node *n)
{
    if (!n->plain || strlen(n->text) != n->len) return MANTA_SPEC_T_STR;
    if (is_null_text(n->text)) return MANTA_SPEC_T_NULL;
    if (bool_text(n->text) >= 0) return MANTA_SPEC_T_BOOL;
    if (is_int_text(n->text)) return MANTA_SPEC_T_INT;
    if (is_float_text(n->text)) return MANTA_SPEC_T_FLOAT;
    return MANTA_SPEC_T_STR;
}

int manta_spec_scalar_type(const manta_spec_node *n)
{
    if (!n) return MANTA_SPEC_T_NULL;
    if (n->kind != MANTA_SPEC_SCALAR) return -1;
    return (int)resolve(n);
}

/* The value of an INT-resolved text; -1 when it does not fit int64_t. */
static int int_value(const char *s, int64_t *out)
{
    errno = 0;
    if (s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
        unsigned long long v = strtoull(s + 2, NULL, s[1] == 'o' ? 8 : 16);
        if (errno || v > (unsigned long long)INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    long long v = strtoll(s, NULL, 10);
    if (errno) return -1;
    *out = v;
    return 0;
}

static double float_value(const char *s)
{
    if (is_special_float(s)) {
        if (strstr(s, "nan") || strstr(s, "NaN") || strstr(s, "NAN")) return NAN;
        return *s == '-' ? -INFINITY : INFINITY;
    }
    return strtod(s, NULL);
}

static bool is_null_node(const manta_spec_node *n)
{
    return n && n->kind == MANTA_SPEC_SCALAR && resolve(n) == MANTA_SPEC_T_NULL;
}

/* How a node looks in "got ..." messages: a mapping, a sequence, null, or
 * the scalar quoted with escapes and cut at 40 bytes. */
static const char *describe(const manta_spec_node *n, char *buf, size_t len)
{
    if (!n) return "nothing";
    if (n->kind == MANTA_SPEC_MAP) return "a mapping";
    if (n->kind == MANTA_SPEC_SEQ) return "a sequence";
    if (is_null_node(n)) return "null";
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n->len && o + 8 < len; i++) {
        unsigned char ch = (unsigned char)n->text[i];
        if (i == 40) {
            o += (size_t)snprintf(buf + o, len - o, "...");
            break;
        }
        if (ch == '"' || ch == '\\')
            o += (size_t)snprintf(buf + o, len - o, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

#define GOT(n) describe((n), gotbuf, sizeof gotbuf)

/* ---- Nodes ------------------------------------------------------------------- */

typedef struct ctx {
    manta_spec_errors *errs;
    const char *file; /* node->file of every node made */
    size_t nodes;     /* nodes made, against MANTA_SPEC_MAX_NODES */
    bool too_many;    /* that limit has been reported */
    int fixed_line;   /* > 0 while parsing a --set value: its index */
    int col_base;     /* ... the value's offset inside the argument */
    int value_len;    /* ... and its length */
    /* Merged-away `<<` values, which anchors may still name; freed when
     * the parse ends. */
    struct manta_spec_node **dead;
    size_t n_dead, cap_dead;
    const manta_spec_options *opts; /* declared sections (NULL: none) */
    const char *set_file;           /* the file of values put in by path: "--set", or
                                       DEFAULT_FILE for the program's defaults */
} ctx;

static void node_free(manta_spec_node *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->count; i++) {
        if (n->keys) node_free(n->keys[i]);
        node_free(n->items[i]);
    }
    free(n->keys);
    free(n->items);
    free(n->text);
    free(n->path);
    free(n);
}

static manta_spec_node *node_new(ctx *c, manta_spec_kind kind, const char *file, int line, int col)
{
    if (++c->nodes > MANTA_SPEC_MAX_NODES) {
        if (!c->too_many)
            manta_spec_errors_add(c->errs, file, line, col, "",
                                  "the document has more than %d nodes (aliases expanded)",
                                  MANTA_SPEC_MAX_NODES);
        c->too_many = true;
        return NULL;
    }
    manta_spec_node *n = calloc(1, sizeof *n);
    if (!n) {
        manta_spec_errors_add(c->errs, file, line, col, "", "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->file = file;
    n->line = line;
    n->col = col;
    return n;
}

static manta_spec_node *scalar_new(ctx *c, const char *file, int line, int col, const char *text,
                                   size_t len, bool plain)
{
    manta_spec_node *n = node_new(c, MANTA_SPEC_SCALAR, file, line, col);
    if (!n) return NULL;
    n->text = malloc(len + 1);
    if (!n->text) {
        manta_spec_errors_add(c->errs, file, line, col, "", "out of memory");
        free(n);
        return NULL;
    }
    memcpy(n->text, text, len);
    n->text[len] = '\0';
    n->len = len;
    n->plain = plain;
    return n;
}

/* Append (key, value) to a mapping or value to a sequence (key NULL). */
static bool node_push(manta_spec_node *p, manta_spec_node *key, manta_spec_node *val)
{
    if (p->count == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4;
        manta_spec_node **items = realloc(p->items, cap * sizeof *items);
        if (!items) return false;
        p->items = items;
        if (p->kind == MANTA_SPEC_MAP) {
            manta_spec_node **keys = realloc(p->keys, cap * sizeof *keys);
            if (!keys) return false;
            p->keys = keys;
        }
        p->cap = cap;
    }
    if (p->kind == MANTA_SPEC_MAP) p->keys[p->count] = key;
    p->items[p->count++] = val;
    return true;
}

static char *child_path(const char *parent, const char *comp)
{
    char *p = NULL;
    if (!parent || !parent[0]) return strdup(comp);
    return asprintf(&p, "%s.%s", parent, comp) < 0 ? NULL : p;
}

static char *index_path(const char *parent, size_t i)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", i);
    return child_path(parent, num);
}

/* Give n and everything below it its dotted path. False when out of memory. */
static bool set_paths(manta_spec_node *n, const char *path)
{
    char *p = strdup(path);
    if (!p) return false;
    free(n->path);
    n->path = p;
    for (size_t i = 0; i < n->count; i++) {
        char *cp = n->kind == MANTA_SPEC_MAP ? child_path(p, n->keys[i]->text) : index_path(p, i);
        if (!cp) return false;
        bool ok =
            (n->kind != MANTA_SPEC_MAP || set_paths(n->keys[i], cp)) && set_paths(n->items[i], cp);
        free(cp);
        if (!ok) return false;
    }
    return true;
}

static manta_spec_node *node_copy(ctx *c, const manta_spec_node *src)
{
    manta_spec_node *n =
        src->kind == MANTA_SPEC_SCALAR
            ? scalar_new(c, src->file, src->line, src->col, src->text, src->len, src->plain)
            : node_new(c, src->kind, src->file, src->line, src->col);
    if (!n) return NULL;
    for (size_t i = 0; i < src->count; i++) {
        manta_spec_node *k = src->kind == MANTA_SPEC_MAP ? node_copy(c, src->keys[i]) : NULL;
        manta_spec_node *v = node_copy(c, src->items[i]);
        bool made = (src->kind != MANTA_SPEC_MAP || k) && v;
        if (!made || !node_push(n, k, v)) {
            if (made)
                manta_spec_errors_add(c->errs, c->file, src->line, src->col, "", "out of memory");
            node_free(k);
            node_free(v);
            node_free(n);
            return NULL;
        }
    }
    return n;
}

static const manta_spec_node *map_get(const manta_spec_node *m, const char *key)
{
    if (!m || m->kind != MANTA_SPEC_MAP) return NULL;
    size_t len = strlen(key);
    for (size_t i = 0; i < m->count; i++)
        if (m->keys[i]->len == len && !memcmp(m->keys[i]->text, key, len)) return m->items[i];
    return NULL;
}

static long map_index(const manta_spec_node *m, const char *key)
{
    size_t len = strlen(key);
    for (size_t i = 0; i < m->count; i++)
        if (m->keys[i]->len == len && !memcmp(m->keys[i]->text, key, len)) return (long)i;
    return -1;
}

/* ---- YAML to a node tree ------------------------------------------------------ */

typedef struct frame {
    manta_spec_node *node;
    manta_spec_node *key; /* a mapping's key waiting for its value */
} frame;

typedef struct anchor {
    char *name;
    manta_spec_node *node;
} anchor;

static void mark_pos(const ctx *c, yaml_mark_t m, int *line, int *col)
{
    if (c->fixed_line > 0) {
        /* A --set value is one line; a mark past it (the scanner moves to
         * the next line at the end of input) is the end of the value. */
        *line = c->fixed_line;
        *col = c->col_base + (m.line > 0 ? c->value_len : (int)m.column) + 1;
    } else {
        *line = (int)m.line + 1;
        *col = (int)m.column + 1;
    }
}

static void syntax_error(ctx *c, const yaml_parser_t *p, const char *buf, size_t len)
{
    int line = 1, col = 1;
    if (p->error == YAML_MEMORY_ERROR) {
        /* Where the reader had got to: the best position there is. */
        mark_pos(c, p->mark, &line, &col);
        manta_spec_errors_add(c->errs, c->file, line, col, "", "out of memory while parsing YAML");
        return;
    }
    if (p->error == YAML_READER_ERROR) {
        /* The reader reports a byte offset, not a mark. */
        size_t off = p->problem_offset < len ? p->problem_offset : len;
        int l = 0, cl = 0;
        for (size_t i = 0; i < off; i++) {
            if (buf[i] == '\n')
                l++, cl = 0;
            else if (((unsigned char)buf[i] & 0xc0) != 0x80)
                cl++;
        }
        yaml_mark_t m = {off, (size_t)l, (size_t)cl};
        mark_pos(c, m, &line, &col);
        manta_spec_errors_add(c->errs, c->file, line, col, "", "invalid input: %s",
                              p->problem ? p->problem : "unreadable");
        return;
    }
    mark_pos(c, p->problem_mark, &line, &col);
    /* The commonest cause by far deserves a plain word. */
    const char *hint = p->problem_mark.index < len && buf[p->problem_mark.index] == '\t'
                           ? "; YAML does not allow tabs for indentation"
                           : "";
    if (p->context && c->fixed_line == 0)
        manta_spec_errors_add(c->errs, c->file, line, col, "",
                              "YAML syntax error: %s (%s at line %d, column %d)%s",
                              p->problem ? p->problem : "unknown", p->context,
                              (int)p->context_mark.line + 1, (int)p->context_mark.column + 1, hint);
    else
        manta_spec_errors_add(c->errs, c->file, line, col, "", "YAML syntax error: %s%s",
                              p->problem ? p->problem : "unknown", hint);
}

/* 0: no tag or a resolving tag, 1: !!str, -1: unsupported. */
static int tag_class(const yaml_char_t *tag)
{
    static const char *const ok[] = {"!",
                                     "tag:yaml.org,2002:int",
                                     "tag:yaml.org,2002:float",
                                     "tag:yaml.org,2002:bool",
                                     "tag:yaml.org,2002:null",
                                     "tag:yaml.org,2002:map",
                                     "tag:yaml.org,2002:seq"};
    if (!tag) return 0;
    if (!strcmp((const char *)tag, "tag:yaml.org,2002:str")) return 1;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp((const char *)tag, ok[i])) return 0;
    return -1;
}

/* Put n where the parser is: root, sequence item, mapping key or value. */
static bool attach(ctx *c, frame *stack, int depth, manta_spec_node **root, manta_spec_node *n)
{
    if (depth == 0) {
        if (!set_paths(n, "")) goto oom;
        *root = n;
        return true;
    }
    frame *f = &stack[depth - 1];
    manta_spec_node *p = f->node;
    char *path = NULL;
    if (p->kind == MANTA_SPEC_SEQ) {
        if (!(path = index_path(p->path, p->count)) || !set_paths(n, path) ||
            !node_push(p, NULL, n))
            goto oom_path;
        free(path);
        return true;
    }
    if (!f->key) {
        if (n->kind != MANTA_SPEC_SCALAR) {
            manta_spec_errors_add(c->errs, n->file, n->line, n->col, p->path,
                                  "mapping keys must be scalars, got %s",
                                  n->kind == MANTA_SPEC_MAP ? "a mapping" : "a sequence");
            return false;
        }
        if (!(path = child_path(p->path, n->text)) || !set_paths(n, path)) goto oom_path;
        for (size_t i = 0; i < p->count; i++) {
            const manta_spec_node *k = p->keys[i];
            if (k->len == n->len && !memcmp(k->text, n->text, n->len)) {
                node_err(c->errs, n, "duplicate key (first at line %d, column %d)", k->line,
                         k->col);
                break;
            }
        }
        free(path);
        f->key = n;
        return true;
    }
    if (!set_paths(n, f->key->path) || !node_push(p, f->key, n)) goto oom;
    f->key = NULL;
    return true;
oom_path:
    free(path);
oom:
    manta_spec_errors_add(c->errs, c->file, n->line, n->col, "", "out of memory");
    return false;
}

/* Resolve YAML merge keys in a finished mapping: `<<: *base` (or a
 * sequence of mappings) adds every entry of the merged mappings whose key
 * the mapping does not have itself; among merged mappings the earlier wins.
 * The `<<` entry itself goes away. A `<<` whose value is not a mapping or
 * sequence of mappings is reported and dropped. False only when out of
 * memory. */
static bool merge_keys(ctx *c, manta_spec_node *m)
{
    char gotbuf[128];
    for (size_t i = 0; i < m->count;) {
        manta_spec_node *k = m->keys[i];
        if (!k->plain || strcmp(k->text, "<<") != 0) {
            i++;
            continue;
        }
        manta_spec_node *src = m->items[i];
        memmove(&m->keys[i], &m->keys[i + 1], (m->count - i - 1) * sizeof *m->keys);
        memmove(&m->items[i], &m->items[i + 1], (m->count - i - 1) * sizeof *m->items);
        m->count--;
        bool ok = true;
        size_t n_src = src->kind == MANTA_SPEC_SEQ ? src->count : 1;
        for (size_t j = 0; j < n_src && ok; j++) {
            manta_spec_node *from = src->kind == MANTA_SPEC_SEQ ? src->items[j] : src;
            if (from->kind != MANTA_SPEC_MAP) {
                node_err(c->errs, from,
                         "expected a mapping or a sequence of mappings to merge, got %s",
                         GOT(from));
                continue;
            }
            for (size_t e = 0; e < from->count && ok; e++) {
                if (map_index(m, from->keys[e]->text) >= 0) continue;
                /* Copies, not moves: an anchor on `src` must still name
                 * the whole mapping. */
                char *path = child_path(m->path, from->keys[e]->text);
                manta_spec_node *kc = path ? node_copy(c, from->keys[e]) : NULL;
                manta_spec_node *vc = kc ? node_copy(c, from->items[e]) : NULL;
                ok = vc && set_paths(kc, path) && set_paths(vc, path) && node_push(m, kc, vc);
                if (!ok) node_free(kc), node_free(vc);
                free(path);
            }
        }
        /* Anchors may still point into `src`: keep it until the parse ends. */
        if (ok && c->n_dead == c->cap_dead) {
            size_t cap = c->cap_dead ? c->cap_dead * 2 : 8;
            manta_spec_node **d = realloc(c->dead, cap * sizeof *d);
            if (d)
                c->dead = d, c->cap_dead = cap;
            else
                ok = false;
        }
        node_free(k);
        if (ok)
            c->dead[c->n_dead++] = src;
        else
            node_free(src); /* the parse stops; no alias will be resolved */
        if (!ok) {
            if (!c->too_many)
                manta_spec_errors_add(c->errs, c->file, m->line, m->col, "", "out of memory");
            return false;
        }
    }
    return true;
}

/* The parser's state while it builds one tree. */
typedef struct builder {
    ctx *c;
    frame stack[MANTA_SPEC_MAX_DEPTH];
    int depth, docs;
    anchor *anchors;
    size_t n_anchors, cap_anchors;
    manta_spec_node *root;
    bool done;
} builder;

/* What one event made: a node, its anchor and tag, and whether it is a
 * collection that the following events fill (push); at line:col. */
typedef struct made {
    manta_spec_node *n;
    const yaml_char_t *anchor, *tag;
    bool push;
    int line, col;
} made;

/* *name: a copy of the anchored node, unless it contains the alias. */
static bool on_alias(builder *b, const yaml_event_t *ev, made *o)
{
    ctx *c = b->c;
    const char *name = (const char *)ev->data.alias.anchor;
    const anchor *a = NULL;
    for (size_t i = b->n_anchors; i-- > 0;)
        if (!strcmp(b->anchors[i].name, name)) {
            a = &b->anchors[i];
            break;
        }
    if (!a) {
        manta_spec_errors_add(c->errs, c->file, o->line, o->col, "", "unknown alias *%s", name);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < b->depth; i++)
        if (b->stack[i].node == a->node) {
            manta_spec_errors_add(c->errs, c->file, o->line, o->col, "",
                                  "alias *%s refers to a node that contains it", name);
            ok = false;
        }
    if (ok && !(o->n = node_copy(c, a->node))) ok = false;
    return ok;
}

static bool on_scalar(builder *b, const yaml_event_t *ev, made *o)
{
    ctx *c = b->c;
    int tc = tag_class(ev->data.scalar.tag);
    o->tag = ev->data.scalar.tag;
    o->anchor = ev->data.scalar.anchor;
    if (tc < 0) return true; /* the caller reports the tag */
    bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && tc == 0 &&
                 !(o->tag && !strcmp((const char *)o->tag, "!"));
    o->n = scalar_new(c, c->file, o->line, o->col, (const char *)ev->data.scalar.value,
                      ev->data.scalar.length, plain);
    return o->n != NULL;
}

static bool on_collection_start(builder *b, const yaml_event_t *ev, made *o)
{
    ctx *c = b->c;
    bool seq = ev->type == YAML_SEQUENCE_START_EVENT;
    o->tag = seq ? ev->data.sequence_start.tag : ev->data.mapping_start.tag;
    o->anchor = seq ? ev->data.sequence_start.anchor : ev->data.mapping_start.anchor;
    if (tag_class(o->tag) < 0) return true; /* the caller reports the tag */
    if (b->depth >= MANTA_SPEC_MAX_DEPTH) {
        manta_spec_errors_add(c->errs, c->file, o->line, o->col, "",
                              "nesting deeper than %d levels", MANTA_SPEC_MAX_DEPTH);
        return false;
    }
    o->n = node_new(c, seq ? MANTA_SPEC_SEQ : MANTA_SPEC_MAP, c->file, o->line, o->col);
    o->push = true;
    return o->n != NULL;
}

/* Interpret one parser event. False stops the parse; the cause is
 * reported. */
static bool on_event(builder *b, const yaml_event_t *ev, made *o)
{
    ctx *c = b->c;
    bool ok;
    switch (ev->type) {
    case YAML_STREAM_END_EVENT:
        b->done = true;
        return true;
    case YAML_DOCUMENT_START_EVENT:
        if (++b->docs <= 1) return true;
        manta_spec_errors_add(c->errs, c->file, o->line, o->col, "",
                              "expected one YAML document, but a second one starts here");
        return false;
    case YAML_ALIAS_EVENT:
        return on_alias(b, ev, o);
    case YAML_SCALAR_EVENT:
        return on_scalar(b, ev, o);
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        return on_collection_start(b, ev, o);
    case YAML_SEQUENCE_END_EVENT:
        b->depth--;
        return true;
    case YAML_MAPPING_END_EVENT:
        ok = merge_keys(c, b->stack[b->depth - 1].node);
        b->depth--;
        return ok;
    default:
        return true;
    }
}

static bool remember_anchor(builder *b, const made *o)
{
    if (b->n_anchors == b->cap_anchors) {
        size_t cap = b->cap_anchors ? b->cap_anchors * 2 : 8;
        anchor *a = realloc(b->anchors, cap * sizeof *a);
        if (a) b->anchors = a, b->cap_anchors = cap;
    }
    if (b->n_anchors < b->cap_anchors &&
        (b->anchors[b->n_anchors].name = strdup((const char *)o->anchor))) {
        b->anchors[b->n_anchors++].node = o->n;
        return true;
    }
    manta_spec_errors_add(b->c->errs, b->c->file, o->line, o->col, "", "out of memory");
    return false;
}

/* Put a made node in the tree, open it when it is a collection, and
 * remember its anchor. On failure the node is freed unless the tree holds
 * it. */
static bool place(builder *b, const made *o)
{
    if (!attach(b->c, b->stack, b->depth, &b->root, o->n)) {
        /* A rejected key is ours to free; an attached node is not. */
        if (b->root != o->n) node_free(o->n);
        return false;
    }
    if (o->push) {
        b->stack[b->depth].node = o->n;
        b->stack[b->depth].key = NULL;
        b->depth++;
    }
    return !o->anchor || remember_anchor(b, o);
}

/* Free what the parse kept aside: merged-away values, keys still waiting
 * for a value when it stopped (they belong to no node), and anchors. */
static void builder_end(builder *b)
{
    ctx *c = b->c;
    for (size_t i = 0; i < c->n_dead; i++) node_free(c->dead[i]);
    free(c->dead);
    c->dead = NULL;
    c->n_dead = c->cap_dead = 0;
    for (int i = 0; i < b->depth; i++) node_free(b->stack[i].key);
    for (size_t i = 0; i < b->n_anchors; i++) free(b->anchors[i].name);
    free(b->anchors);
}

/* Parse buf as one YAML document. Returns the root, or NULL with errors
 * appended; or NULL with *empty set (and no error) when there is no
 * document at all. */
static manta_spec_node *build_tree(ctx *c, const char *buf, size_t len, bool *empty)
{
    yaml_parser_t p;
    builder b = {.c = c};
    *empty = false;
    c->dead = NULL;
    c->n_dead = c->cap_dead = 0;
    if (!yaml_parser_initialize(&p)) {
        manta_spec_errors_add(c->errs, c->file, 0, 0, "", "out of memory");
        return NULL;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    bool ok = true;
    while (ok && !b.done) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            syntax_error(c, &p, buf, len);
            ok = false;
            break;
        }
        made o = {0};
        mark_pos(c, ev.start_mark, &o.line, &o.col);
        ok = on_event(&b, &ev, &o);
        if (ok && o.tag && tag_class(o.tag) < 0) {
            manta_spec_errors_add(c->errs, c->file, o.line, o.col, "",
                                  "unsupported tag %s; only the YAML core tags (!!str, !!int, "
                                  "!!float, !!bool, !!null, !!map, !!seq) are allowed",
                                  (const char *)o.tag);
            ok = false;
        }
        if (ok && o.n)
            ok = place(&b, &o);
        else if (o.n)
            node_free(o.n);
        yaml_event_delete(&ev);
    }
    builder_end(&b);
    yaml_parser_delete(&p);
    if (!ok) {
        node_free(b.root);
        return NULL;
    }
    if (!b.root) *empty = true;
    return b.root;
}

/* ---- Lookup and getters -------------------------------------------------------- */

static bool parse_index(const char *s, size_t *out)
{
    if (!all_of(s, isdigit) || strlen(s) > 9) return false;
    *out = (size_t)strtoul(s, NULL, 10);
    return true;
}

/* Walk a dotted path. NULL when absent; then *blocker is the scalar that a
 * component could not go through (a plain null counts as absent). */
static const manta_spec_node *lookup(const manta_spec_node *node, const char *path,
                                     const manta_spec_node **blocker)
{
    *blocker = NULL;
    if (!node) return NULL;
    if (!path || !*path) return node;
    const char *p = path;
    char comp[256];
    while (node) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (len >= sizeof comp) return NULL;
        memcpy(comp, p, len);
        comp[len] = '\0';
        if (node->kind == MANTA_SPEC_MAP) {
            node = map_get(node, comp);
        } else if (node->kind == MANTA_SPEC_SEQ) {
            size_t i;
            node = parse_index(comp, &i) && i < node->count ? node->items[i] : NULL;
        } else {
            if (!is_null_node(node)) *blocker = node;
            return NULL;
        }
        if (!dot) return node;
        p = dot + 1;
    }
    return NULL;
}

const manta_spec_node *manta_spec_find(const manta_spec_node *node, const char *path)
{
    const manta_spec_node *blocker;
    return lookup(node, path, &blocker);
}

size_t manta_spec_len(const manta_spec_node *n)
{
    return n && n->kind != MANTA_SPEC_SCALAR ? n->count : 0;
}

const manta_spec_node *manta_spec_at(const manta_spec_node *n, size_t i)
{
    return n && n->kind != MANTA_SPEC_SCALAR && i < n->count ? n->items[i] : NULL;
}

const char *manta_spec_key_at(const manta_spec_node *n, size_t i)
{
    return n && n->kind == MANTA_SPEC_MAP && i < n->count ? n->keys[i]->text : NULL;
}

/* Shared front of every getter: 0 with *out, 1 absent, -1 blocked. */
static int get_node(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                    manta_spec_errors *err)
{
    const manta_spec_node *blocker;
    *out = lookup(node, path, &blocker);
    if (blocker) {
        char gotbuf[128];
        node_err(err, blocker, "expected a mapping or a sequence, got %s", GOT(blocker));
        return MANTA_ESPEC;
    }
    if (!*out || is_null_node(*out)) return 1;
    return 0;
}

int manta_spec_get_int(const manta_spec_node *node, const char *path, int64_t def, int64_t *out,
                       manta_spec_errors *err)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = def;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (n->kind == MANTA_SPEC_SCALAR && resolve(n) == MANTA_SPEC_T_INT) {
        int64_t v;
        if (int_value(n->text, &v) == 0) {
            *out = v;
            return 0;
        }
        node_err(err, n, "expected an integer that fits 64 bits, got %s", GOT(n));
        return MANTA_ESPEC;
    }
    node_err(err, n, "expected an integer, got %s", GOT(n));
    return MANTA_ESPEC;
}

int manta_spec_get_double(const manta_spec_node *node, const char *path, double def, double *out,
                          manta_spec_errors *err)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = def;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (n->kind == MANTA_SPEC_SCALAR) {
        manta_spec_type t = resolve(n);
        if (t == MANTA_SPEC_T_INT || t == MANTA_SPEC_T_FLOAT) {
            int64_t v;
            *out = t == MANTA_SPEC_T_INT && int_value(n->text, &v) == 0 ? (double)v
                   : t == MANTA_SPEC_T_INT                              ? strtod(n->text, NULL)
                                                                        : float_value(n->text);
            return 0;
        }
    }
    node_err(err, n, "expected a number, got %s", GOT(n));
    return MANTA_ESPEC;
}

int manta_spec_get_str(const manta_spec_node *node, const char *path, const char *def,
                       const char **out, manta_spec_errors *err)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = def;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (n->kind == MANTA_SPEC_SCALAR) {
        *out = n->text;
        return 0;
    }
    node_err(err, n, "expected a string, got %s", GOT(n));
    return MANTA_ESPEC;
}

int manta_spec_get_bool(const manta_spec_node *node, const char *path, bool def, bool *out,
                        manta_spec_errors *err)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = def;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (n->kind == MANTA_SPEC_SCALAR && resolve(n) == MANTA_SPEC_T_BOOL) {
        *out = bool_text(n->text) == 1;
        return 0;
    }
    node_err(err, n, "expected true or false, got %s", GOT(n));
    return MANTA_ESPEC;
}

#define SIZE_EXPECT                                                                                \
    "expected a size such as 512MiB or 2GiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"

/* A size node's value; false when it is not one. */
static bool size_of(const manta_spec_node *n, uint64_t *out)
{
    if (n->kind != MANTA_SPEC_SCALAR || strlen(n->text) != n->len) return false;
    return manta_spec_parse_size(n->text, out) == 0;
}

int manta_spec_get_size(const manta_spec_node *node, const char *path, uint64_t def, uint64_t *out,
                        manta_spec_errors *err)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = def;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (size_of(n, out)) return 0;
    *out = def;
    node_err(err, n, SIZE_EXPECT ", got %s", GOT(n));
    return MANTA_ESPEC;
}

static int get_kind(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                    manta_spec_errors *err, manta_spec_kind kind, const char *what)
{
    const manta_spec_node *n;
    char gotbuf[128];
    *out = NULL;
    int r = get_node(node, path, &n, err);
    if (r) return r;
    if (n->kind == kind) {
        *out = n;
        return 0;
    }
    node_err(err, n, "expected %s, got %s", what, GOT(n));
    return MANTA_ESPEC;
}

int manta_spec_get_seq(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                       manta_spec_errors *err)
{
    return get_kind(node, path, out, err, MANTA_SPEC_SEQ, "a sequence");
}

int manta_spec_get_map(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                       manta_spec_errors *err)
{
    return get_kind(node, path, out, err, MANTA_SPEC_MAP, "a mapping");
}

/* ---- Sizes --------------------------------------------------------------------- */

static const struct {
    const char *name;
    uint64_t mult;
} UNITS[] = {
    {"B", 1ull},           {"KB", 1000ull},          {"MB", 1000000ull},
    {"GB", 1000000000ull}, {"TB", 1000000000000ull}, {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},   {"GiB", 1ull << 30},      {"TiB", 1ull << 40},
};

int manta_spec_parse_size(const char *text, uint64_t *out)
{
    const char *p = text;
    uint64_t whole = 0, frac = 0, scale = 1;
    if (!isdigit((unsigned char)*p)) return MANTA_EINVAL;
    for (; isdigit((unsigned char)*p); p++)
        if (__builtin_mul_overflow(whole, 10, &whole) ||
            __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            return MANTA_EINVAL;
    bool has_frac = false;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return MANTA_EINVAL;
        for (; isdigit((unsigned char)*p); p++) {
            if (scale >= 1000000000000000000ull) {
                if (*p != '0') return MANTA_EINVAL; /* more than 18 decimals: not a whole byte */
                continue;
            }
            frac = frac * 10 + (uint64_t)(*p - '0');
            scale *= 10;
        }
        has_frac = true;
    }
    while (*p == ' ') p++;
    uint64_t mult = 1;
    if (*p) {
        size_t i;
        for (i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++)
            if (!strcmp(p, UNITS[i].name)) break;
        if (i == sizeof UNITS / sizeof UNITS[0]) return MANTA_EINVAL;
        mult = UNITS[i].mult;
    } else if (has_frac) {
        return MANTA_EINVAL; /* "1.5" bytes */
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(whole, mult, &bytes)) return MANTA_EINVAL;
    if (has_frac && frac) {
        /* frac/scale * mult must be whole: reduce the fraction first so
         * the product does not overflow for long decimals. */
        while (frac % 10 == 0 && scale > 1) frac /= 10, scale /= 10;
        uint64_t g = mult, s = scale;
        while (s) {
            uint64_t t = g % s;
            g = s;
            s = t;
        }
        uint64_t m = mult / g, sc = scale / g, part;
        if (frac % sc != 0) return MANTA_EINVAL;
        /* m and sc are coprime, so a whole number of bytes needs sc | frac. */
        if (__builtin_mul_overflow(frac / sc, m, &part)) return MANTA_EINVAL;
        if (__builtin_add_overflow(bytes, part, &bytes)) return MANTA_EINVAL;
    }
    *out = bytes;
    return 0;
}

char *manta_spec_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const struct {
        const char *name;
        unsigned shift;
    } bin[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) {
        uint64_t m = 1ull << bin[i].shift;
        if (bytes >= m && bytes % m == 0) {
            snprintf(buf, len, "%llu%s", (unsigned long long)(bytes / m), bin[i].name);
            return buf;
        }
    }
    snprintf(buf, len, "%lluB", (unsigned long long)bytes);
    return buf;
}

/* ---- Names and suggestions ----------------------------------------------------------- */

static bool name_ok(const char *s, size_t len, size_t max, bool upper_dot)
{
    if (len == 0 || len > max || strlen(s) != len) return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch >= 'a' && ch <= 'z') || isdigit(ch) || ch == '-' || ch == '_') continue;
        if (upper_dot && ((ch >= 'A' && ch <= 'Z') || ch == '.')) continue;
        return false;
    }
    return true;
}

/* Optimal-string-alignment distance, case-insensitive: insertions,
 * deletions, substitutions and swaps of neighbours each cost one. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32) return 99;
    size_t d[33][33];
    for (size_t i = 0; i <= la; i++) d[i][0] = i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int ai = tolower((unsigned char)a[i - 1]), bj = tolower((unsigned char)b[j - 1]);
            size_t v = d[i - 1][j - 1] + (ai != bj);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ai == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == bj && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

/* The closest candidate within max edits, or NULL. */
static const char *suggest(const char *key, const char *const *cands, size_t max)
{
    const char *best = NULL;
    size_t bd = max + 1;
    for (size_t i = 0; cands[i]; i++) {
        /* One edit per three letters: "foo" is not a typo of "job". */
        size_t d = edit_distance(key, cands[i]), lim = strlen(cands[i]) / 3;
        if (d < bd && d <= lim) bd = d, best = cands[i];
    }
    return best;
}

static void unknown_key(manta_spec_errors *e, const manta_spec_node *key, const char *const *cands,
                        const char *list)
{
    const char *s = suggest(key->text, cands, 2);
    if (s)
        node_err(e, key, "unknown key (did you mean \"%s\"?)", s);
    else
        node_err(e, key, "unknown key; expected one of %s", list);
}

/* ---- Declared sections ------------------------------------------------------------------ */

#define MAX_CANDS 512 /* names offered to suggest() at once */

/* Append the names of a key table (or a NULL-ended list) to cands[]. */
static void add_cands(const char **cands, size_t *n, const manta_spec_key *t,
                      const char *const *list)
{
    for (size_t i = 0; t && t[i].name && *n < MAX_CANDS - 1; i++) cands[(*n)++] = t[i].name;
    for (size_t i = 0; list && list[i] && *n < MAX_CANDS - 1; i++) cands[(*n)++] = list[i];
    cands[*n] = NULL;
}

const manta_spec_key *manta_spec_key_find(const manta_spec_key *t, const char *name, size_t len)
{
    for (size_t i = 0; t && name && t[i].name; i++)
        if (strlen(t[i].name) == len && !memcmp(t[i].name, name, len)) return &t[i];
    return NULL;
}

/* A range bound for messages: integers as integers. */
static const char *bound(double x, char *buf, size_t len)
{
    if (x == floor(x) && fabs(x) < 1e15)
        snprintf(buf, len, "%.0f", x);
    else
        snprintf(buf, len, "%g", x);
    return buf;
}

/* What a declaration expects, for "expected ..., got ..." messages. */
static const char *expected(const manta_spec_key *k, char *buf, size_t len)
{
    char lo[32], hi[32];
    bool ranged = k->lo < k->hi;
    switch (k->type) {
    case MANTA_SPEC_K_INT:
    case MANTA_SPEC_K_NUM:
        snprintf(buf, len, "%s%s%s%s%s", k->type == MANTA_SPEC_K_INT ? "an integer" : "a number",
                 ranged ? " from " : "", ranged ? bound(k->lo, lo, sizeof lo) : "",
                 ranged ? " to " : "", ranged ? bound(k->hi, hi, sizeof hi) : "");
        break;
    case MANTA_SPEC_K_STR:
        if (!k->choices) {
            snprintf(buf, len, "a string");
            break;
        }
        size_t o = (size_t)snprintf(buf, len, "one of ");
        for (const char *p = k->choices; *p && o + 3 < len; p++)
            if (*p == '|')
                buf[o++] = ',', buf[o++] = ' ';
            else
                buf[o++] = *p;
        buf[o < len ? o : len - 1] = '\0';
        break;
    case MANTA_SPEC_K_BOOL:
        snprintf(buf, len, "true or false");
        break;
    case MANTA_SPEC_K_SIZE:
        snprintf(buf, len, "a size such as 512MiB or 2GiB");
        break;
    case MANTA_SPEC_K_MAP:
        snprintf(buf, len, "a mapping");
        break;
    case MANTA_SPEC_K_LIST:
        snprintf(buf, len, "a sequence of mappings");
        break;
    default:
        snprintf(buf, len, "anything");
        break;
    }
    return buf;
}

/* Whether text (len bytes) is one of the "|"-separated choices. */
static bool one_of(const char *choices, const char *text, size_t len)
{
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && !memcmp(p, text, n)) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

static bool scalar_fits(const manta_spec_key *k, const manta_spec_node *v)
{
    bool ranged = k->lo < k->hi;
    int64_t i;
    uint64_t sz;
    if (v->kind != MANTA_SPEC_SCALAR) return k->type == MANTA_SPEC_K_ANY;
    switch (k->type) {
    case MANTA_SPEC_K_INT:
        return resolve(v) == MANTA_SPEC_T_INT && int_value(v->text, &i) == 0 &&
               (!ranged || ((double)i >= k->lo && (double)i <= k->hi));
    case MANTA_SPEC_K_NUM: {
        manta_spec_type t = resolve(v);
        double d;
        if (t == MANTA_SPEC_T_INT && int_value(v->text, &i) == 0)
            d = (double)i;
        else if (t == MANTA_SPEC_T_FLOAT)
            d = float_value(v->text);
        else
            return false;
        return isfinite(d) && (!ranged || (d >= k->lo && d <= k->hi));
    }
    case MANTA_SPEC_K_STR:
        return resolve(v) == MANTA_SPEC_T_STR && strlen(v->text) == v->len &&
               (!k->choices || one_of(k->choices, v->text, v->len));
    case MANTA_SPEC_K_BOOL:
        return resolve(v) == MANTA_SPEC_T_BOOL;
    case MANTA_SPEC_K_SIZE:
        return size_of(v, &sz);
    case MANTA_SPEC_K_ANY:
        return true;
    default:
        return false;
    }
}

static void check_value(manta_spec_errors *e, const manta_spec_key *k, const manta_spec_node *v);

/* An unknown key of a declared mapping: the closest name, or the list. */
static void unknown_declared(manta_spec_errors *e, const manta_spec_node *key, const char **cands)
{
    const char *s = suggest(key->text, cands, 2);
    if (s) {
        node_err(e, key, "unknown key (did you mean \"%s\"?)", s);
        return;
    }
    char list[400] = "";
    size_t o = 0;
    for (size_t i = 0; cands[i]; i++) {
        if (o + strlen(cands[i]) + 8 >= sizeof list) { /* room for ", ..." */
            snprintf(list + o, sizeof list - o, ", ...");
            break;
        }
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", cands[i]);
    }
    node_err(e, key, "unknown key; expected one of %s", list);
}

/* The entries of mapping m against the declared keys; then the required. */
static void check_keyed(manta_spec_errors *e, const manta_spec_key *keys, const manta_spec_node *m)
{
    const char *cands[MAX_CANDS];
    size_t nc = 0;
    add_cands(cands, &nc, keys, NULL);
    for (size_t i = 0; i < m->count; i++) {
        const manta_spec_node *key = m->keys[i];
        const manta_spec_key *d = manta_spec_key_find(keys, key->text, key->len);
        if (d)
            check_value(e, d, m->items[i]);
        else
            unknown_declared(e, key, cands);
    }
    for (size_t i = 0; keys[i].name; i++) {
        const manta_spec_node *v = map_get(m, keys[i].name);
        if ((keys[i].flags & MANTA_SPEC_REQUIRED) && (!v || is_null_node(v)))
            manta_spec_errors_add(e, m->file, m->line, m->col, m->path,
                                  "missing required key \"%s\"%s%s%s", keys[i].name,
                                  keys[i].doc ? " (" : "", keys[i].doc ? keys[i].doc : "",
                                  keys[i].doc ? ")" : "");
    }
}

static void check_value(manta_spec_errors *e, const manta_spec_key *k, const manta_spec_node *v)
{
    char gotbuf[128], want[160];
    if (is_null_node(v) || k->type == MANTA_SPEC_K_ANY) return; /* null is absent */
    if (k->type == MANTA_SPEC_K_MAP) {
        if (v->kind != MANTA_SPEC_MAP)
            node_err(e, v, "expected a mapping, got %s", GOT(v));
        else if (k->keys)
            check_keyed(e, k->keys, v);
        return;
    }
    if (k->type == MANTA_SPEC_K_LIST) {
        if (v->kind != MANTA_SPEC_SEQ) {
            node_err(e, v, "expected a sequence of mappings, got %s", GOT(v));
            return;
        }
        for (size_t i = 0; i < v->count; i++) {
            const manta_spec_node *it = v->items[i];
            if (it->kind != MANTA_SPEC_MAP)
                node_err(e, it, "expected a mapping, got %s", GOT(it));
            else if (k->keys)
                check_keyed(e, k->keys, it);
        }
        return;
    }
    if (!scalar_fits(k, v))
        node_err(e, v, "expected %s, got %s", expected(k, want, sizeof want), GOT(v));
}

int manta_spec_check_key(const manta_spec_key *k, const manta_spec_node *value,
                         manta_spec_errors *errs)
{
    if (!k || !errs) return MANTA_EINVAL;
    size_t before = errs->count + errs->dropped;
    if (value) check_value(errs, k, value);
    return errs->count + errs->dropped == before ? 0 : MANTA_ESPEC;
}

/* A built-in group's settings: its own keys, a MANTA_SPEC_IN_SETTINGS
 * section nested by name, or one of such a section's keys flat. */
static void check_settings(manta_spec_errors *e, const manta_spec_node *set,
                           const manta_spec_options *o)
{
    const char *cands[MAX_CANDS];
    size_t nc = 0;
    add_cands(cands, &nc, o->settings, NULL);
    for (size_t s = 0; o->sections && o->sections[s].name; s++)
        if (o->sections[s].flags & MANTA_SPEC_IN_SETTINGS) {
            add_cands(cands, &nc, NULL, (const char *const[]){o->sections[s].name, NULL});
            add_cands(cands, &nc, o->sections[s].keys, NULL);
        }
    for (size_t i = 0; i < set->count; i++) {
        const manta_spec_node *key = set->keys[i], *v = set->items[i];
        const manta_spec_key *d = manta_spec_key_find(o->settings, key->text, key->len);
        for (size_t s = 0; !d && o->sections && o->sections[s].name; s++) {
            const manta_spec_key *sec = &o->sections[s];
            if (!(sec->flags & MANTA_SPEC_IN_SETTINGS)) continue;
            if (!strcmp(sec->name, key->text) && v->kind == MANTA_SPEC_MAP)
                d = sec;
            else
                d = manta_spec_key_find(sec->keys, key->text, key->len);
        }
        if (d)
            check_value(e, d, v);
        else
            unknown_declared(e, key, cands);
    }
}

/* ---- Overrides ------------------------------------------------------------------------- */

static const char *const TOP_KEYS[] = {"job", "redis", "log_dir", "groups", "nodes", NULL};
static const char *const GROUP_KEYS[] = {"class",        "library",  "replicas", "resources",
                                         "max_restarts", "settings", NULL};
static const char *const RES_KEYS[] = {"cpu", "gpu", "memory", NULL};

/* The sections the runtime reads itself (README "Spec keys"). */
static const manta_spec_key SERVICE_KEYS[] = {
    {"name", MANTA_SPEC_K_STR, 0, 0, NULL, "the service's name; its output goes to LOGS/NAME.log",
     NULL, NULL, MANTA_SPEC_REQUIRED},
    {"command", MANTA_SPEC_K_STR, 0, 0, NULL,
     "the command, run directly when it is a simple one (else under /bin/sh -c with a keeper), in "
     "the current folder, in its own process group; it dies with the job",
     NULL, NULL, MANTA_SPEC_REQUIRED},
    {"port", MANTA_SPEC_K_INT, 0, 65535, "0",
     "the TCP port on 127.0.0.1 the job waits for before starting actors (0: do not wait); "
     "taken by another process before the start: an error",
     NULL, NULL, 0},
    {"ready_timeout_s", MANTA_SPEC_K_NUM, 0, 1e9, "20",
     "seconds to wait for the port to accept connections", NULL, NULL, 0},
    {"restart", MANTA_SPEC_K_STR, 0, 0, "on-failure",
     "when the service exits: on-failure (restart unless it exited 0), always, or never (the job "
     "fails naming it)",
     "on-failure|always|never", NULL, 0},
    {"max_restarts", MANTA_SPEC_K_INT, -1, 1 << 30, "3",
     "restarts before the job fails naming the service (-1: no limit)", NULL, NULL, 0},
    {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};
static const manta_spec_key METRICS_KEYS[] = {
    {"port", MANTA_SPEC_K_INT, 0, 65535, "(none)",
     "serve the job's metrics at http://BIND:PORT/metrics (Prometheus text format); 0: any free "
     "port, printed",
     NULL, NULL, 0},
    {"bind", MANTA_SPEC_K_STR, 0, 0, "127.0.0.1", "the address to listen on", NULL, NULL, 0},
    {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};
static const manta_spec_key SECURITY_KEYS[] = {
    {"curve", MANTA_SPEC_K_STR, 0, 0, "auto",
     "CURVE encryption of the job's sockets: auto (on for tcp or with a key file), on, off; "
     "MANTA_CURVE wins",
     "auto|on|off", NULL, 0},
    {"keys", MANTA_SPEC_K_STR, 0, 0, "(a fresh pair in RUN_DIR/curve.key)",
     "the job's key file (manta keys new); MANTA_KEYS wins", NULL, NULL, 0},
    {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};
static const manta_spec_key RUN_KEYS[] = {
    {"group", MANTA_SPEC_K_STR, 0, 0, NULL, "the group whose replica 0 is called", NULL, NULL,
     MANTA_SPEC_REQUIRED},
    {"method", MANTA_SPEC_K_STR, 0, 0, "run", "the method called; its answer is printed", NULL,
     NULL, 0},
    {"timeout_s", MANTA_SPEC_K_NUM, 0, 1e9, "3600", "seconds the call may take", NULL, NULL, 0},
    {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};

const manta_spec_key manta_spec_runtime_sections[] = {
    {"services", MANTA_SPEC_K_LIST, 0, 0, NULL,
     "processes the job needs that are not actors (tool servers): started first, stopped at the "
     "end",
     NULL, SERVICE_KEYS, 0},
    {"metrics", MANTA_SPEC_K_MAP, 0, 0, NULL, "the Prometheus endpoint of `manta run`", NULL,
     METRICS_KEYS, 0},
    {"security", MANTA_SPEC_K_MAP, 0, 0, NULL, "who may talk to the job's sockets", NULL,
     SECURITY_KEYS, 0},
    {"run", MANTA_SPEC_K_MAP, 0, 0, NULL,
     "the method `manta run` calls once every actor is ready; without it the job serves until "
     "`manta stop`",
     NULL, RUN_KEYS, 0},
    {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0}};

static bool is_top_key(const char *k)
{
    for (size_t i = 0; TOP_KEYS[i]; i++)
        if (!strcmp(k, TOP_KEYS[i])) return true;
    return false;
}

/* The declaration of top-level section `k`: the runtime's, then the
 * program's (options.sections); NULL when it is free-form. */
static const manta_spec_key *declared_section(const manta_spec_options *o, const char *k,
                                              bool program)
{
    const manta_spec_key *d = manta_spec_key_find(manta_spec_runtime_sections, k, strlen(k));
    if (!d && program && o && o->sections) d = manta_spec_key_find(o->sections, k, strlen(k));
    return d;
}

/* Whether the program's sections apply: they are its built-in classes'
 * sections, so a spec that runs only classes from libraries may use those
 * names for its own. Without class_exists they always apply. */
static bool program_sections(const manta_spec_node *root, const manta_spec_options *o)
{
    if (!o || !o->sections) return false;
    if (!o->class_exists) return true;
    const manta_spec_node *groups = map_get(root, "groups");
    for (size_t i = 0; groups && groups->kind == MANTA_SPEC_MAP && i < groups->count; i++) {
        const manta_spec_node *g = groups->items[i], *cls = map_get(g, "class");
        const manta_spec_node *lib = map_get(g, "library");
        if (g->kind == MANTA_SPEC_MAP && cls && cls->kind == MANTA_SPEC_SCALAR &&
            (!lib || is_null_node(lib)) && o->class_exists(cls->text, o->user))
            return true;
    }
    return false;
}

/* Split the path of a --set (a copy, cut in place) into comps[]; "groups"
 * goes first when the head names a group. */
static bool split_set_path(ctx *c, const manta_spec_node *root, char *path, const char *arg,
                           const char *eq, int index, char **comps, size_t *nc)
{
    const manta_spec_node *groups = map_get(root, "groups");
    char *head = path, *dot = strchr(path, '.');
    size_t hl = dot ? (size_t)(dot - path) : strlen(path);
    char save = head[hl];
    head[hl] = '\0';
    bool top = is_top_key(head) || map_get(root, head) || declared_section(c->opts, head, true);
    bool group = !top && map_get(groups, head);
    if (group) comps[(*nc)++] = "groups";
    if (!top && !group) {
        char *name = strdup(head);
        head[hl] = save;
        manta_spec_errors_add(c->errs, SETF(c), index, 1, path,
                              "no top-level key or group named \"%s\"", name ? name : head);
        free(name);
        return false;
    }
    head[hl] = save;
    for (char *s = path;;) {
        char *d = strchr(s, '.');
        if (d) *d = '\0';
        if (!*s || *nc >= MANTA_SPEC_MAX_DEPTH) {
            manta_spec_errors_add(c->errs, SETF(c), index, 1, "",
                                  !*s ? "empty component in the path \"%.*s\""
                                      : "path \"%.*s\" is too deep",
                                  (int)(eq - arg), arg);
            return false;
        }
        comps[(*nc)++] = s;
        if (!d) return true;
        s = d + 1;
    }
}

/* Parse the value of a --set, with positions inside the argument. */
static manta_spec_node *parse_set_value(ctx *c, const char *arg, const char *eq, int index)
{
    ctx vc = *c;
    vc.file = SETF(c);
    vc.fixed_line = index;
    vc.col_base = (int)(eq - arg) + 1;
    vc.value_len = (int)strlen(eq + 1);
    bool empty;
    manta_spec_node *val = build_tree(&vc, eq + 1, strlen(eq + 1), &empty);
    c->nodes = vc.nodes;
    c->too_many = vc.too_many;
    if (!val && empty) val = scalar_new(c, SETF(c), index, vc.col_base + 1, "", 0, true);
    return val;
}

/* The slot of component `comp` inside cur (whose path is next_path). A
 * mapping that lacks it gets it: holding *val when it is the last
 * component (then *val is in the tree and becomes NULL), else an empty
 * mapping. NULL, reported, when cur has no such slot. */
static manta_spec_node **child_slot(ctx *c, manta_spec_node *cur, const char *comp,
                                    const char *next_path, bool last, manta_spec_node **val,
                                    int index)
{
    char gotbuf[128];
    if (cur->kind == MANTA_SPEC_MAP) {
        long k = map_index(cur, comp);
        if (k >= 0) return &cur->items[k];
        manta_spec_node *key = scalar_new(c, SETF(c), index, 1, comp, strlen(comp), true);
        manta_spec_node *v = last ? *val : node_new(c, MANTA_SPEC_MAP, SETF(c), index, 1);
        if (!key || !v || !set_paths(key, next_path) || !node_push(cur, key, v)) {
            node_free(key);
            if (v != *val) node_free(v);
            manta_spec_errors_add(c->errs, SETF(c), index, 1, "", "out of memory");
            return NULL;
        }
        if (last) *val = NULL; /* now in the tree */
        return &cur->items[cur->count - 1];
    }
    if (cur->kind == MANTA_SPEC_SEQ) {
        size_t k;
        if (!parse_index(comp, &k) || k >= cur->count) {
            manta_spec_errors_add(c->errs, SETF(c), index, 1, next_path,
                                  "%s is a sequence of %zu items; expected an index from 0 "
                                  "to %zu, got \"%s\"",
                                  cur->path[0] ? cur->path : "the document", cur->count,
                                  cur->count ? cur->count - 1 : 0, comp);
            return NULL;
        }
        return &cur->items[k];
    }
    manta_spec_errors_add(c->errs, SETF(c), index, 1, next_path,
                          "cannot set a key inside %s: it is %s (at %s:%d:%d), not a "
                          "mapping",
                          cur->path, GOT(cur), cur->file, cur->line, cur->col);
    return NULL;
}

/* Walk comps[0..nc) down from the root, making mappings on the way (a
 * null becomes one), and put *val at the end (then *val is NULL). */
static bool set_at(ctx *c, manta_spec_node *root, char **comps, size_t nc, manta_spec_node **val,
                   int index)
{
    manta_spec_node *cur = root;
    for (size_t i = 0; i < nc; i++) {
        char *next_path = child_path(cur->path, comps[i]);
        if (!next_path) {
            manta_spec_errors_add(c->errs, SETF(c), index, 1, "", "out of memory");
            return false;
        }
        bool last = i + 1 == nc;
        manta_spec_node **slot = child_slot(c, cur, comps[i], next_path, last, val, index);
        if (slot && last && *val) {
            node_free(*slot);
            *slot = *val;
            *val = NULL;
        }
        if (slot && !last && is_null_node(*slot)) {
            manta_spec_node *m = node_new(c, MANTA_SPEC_MAP, SETF(c), index, 1);
            if (m) {
                node_free(*slot);
                *slot = m;
            } else {
                slot = NULL; /* reported */
            }
        }
        bool ok = slot != NULL;
        if (ok && !set_paths(*slot, next_path)) {
            manta_spec_errors_add(c->errs, SETF(c), index, 1, "", "out of memory");
            ok = false;
        }
        free(next_path);
        if (!ok || last) return ok;
        cur = *slot;
    }
    return true;
}

/* Apply one "path=value" (the index-th, 1-based) to the root mapping. */
static bool apply_set(ctx *c, manta_spec_node *root, const char *arg, int index)
{
    char gotbuf[128];
    const char *eq = strchr(arg, '=');
    manta_spec_node tmp = {.kind = MANTA_SPEC_SCALAR, .text = (char *)arg, .len = strlen(arg)};
    if (!eq || eq == arg) {
        manta_spec_errors_add(c->errs, SETF(c), index, 1, "", "expected path=value, got %s",
                              GOT(&tmp));
        return false;
    }
    char *path = strndup(arg, (size_t)(eq - arg));
    if (!path) {
        manta_spec_errors_add(c->errs, SETF(c), index, 1, "", "out of memory");
        return false;
    }
    char *comps[MANTA_SPEC_MAX_DEPTH + 1];
    size_t nc = 0;
    manta_spec_node *val = NULL;
    bool ok = split_set_path(c, root, path, arg, eq, index, comps, &nc) &&
              (val = parse_set_value(c, arg, eq, index)) != NULL &&
              set_at(c, root, comps, nc, &val, index);
    node_free(val);
    free(path);
    return ok;
}

/* ---- Validation ------------------------------------------------------------------------- */

typedef struct spec_impl {
    manta_spec pub;
    char *file;
    char *dir;
    manta_spec_node *root;
    manta_spec_derived *derived; /* pub.derived: the defaults put in, strings owned */
    size_t cap_derived;
} spec_impl;

/* An integer in [lo, hi] or an error "expected <what>, got ..." at n. */
static bool want_int(manta_spec_errors *e, const manta_spec_node *n, int64_t lo, int64_t hi,
                     const char *what, int *out)
{
    char gotbuf[128];
    int64_t v;
    if (n->kind == MANTA_SPEC_SCALAR && resolve(n) == MANTA_SPEC_T_INT &&
        int_value(n->text, &v) == 0 && v >= lo && v <= hi) {
        *out = (int)v;
        return true;
    }
    node_err(e, n, "expected %s, got %s", what, GOT(n));
    return false;
}

/* A non-null scalar string, or an error "expected <what>, got ...". */
static const char *want_str(manta_spec_errors *e, const manta_spec_node *n, const char *what)
{
    char gotbuf[128];
    if (n->kind == MANTA_SPEC_SCALAR && !is_null_node(n) && strlen(n->text) == n->len)
        return n->text;
    node_err(e, n, "expected %s, got %s", what, GOT(n));
    return NULL;
}

static void check_resources(manta_spec_errors *e, const manta_spec_node *res, double *cpu,
                            double *gpu, uint64_t *mem, const char *what)
{
    char gotbuf[128];
    if (is_null_node(res)) return;
    if (res->kind != MANTA_SPEC_MAP) {
        node_err(e, res, "expected a mapping of cpu, gpu and memory, got %s", GOT(res));
        return;
    }
    for (size_t i = 0; i < res->count; i++) {
        const char *k = res->keys[i]->text;
        const manta_spec_node *v = res->items[i];
        if (!strcmp(k, "cpu")) {
            double d;
            if (is_null_node(v)) continue;
            if (manta_spec_get_double(v, "", 0, &d, NULL) != 0 || !isfinite(d) || d < 0)
                node_err(e, v, "expected a non-negative number, got %s", GOT(v));
            else
                *cpu = d;
        } else if (!strcmp(k, "gpu")) {
            /* as Ray's num_gpus: a fraction of one device (shared), or whole devices */
            double d;
            if (is_null_node(v)) continue;
            if (manta_spec_get_double(v, "", 0, &d, NULL) != 0 || !isfinite(d) || d < 0 ||
                d > MAX_GPU || (d > 1 && d != floor(d)))
                node_err(e, v,
                         "expected a fraction below 1 or a whole number of GPUs (0..%d), got %s",
                         MAX_GPU, GOT(v));
            else
                *gpu = d;
        } else if (!strcmp(k, "memory")) {
            if (!is_null_node(v) && !size_of(v, mem))
                node_err(e, v, SIZE_EXPECT ", got %s", GOT(v));
        } else {
            unknown_key(e, res->keys[i], RES_KEYS, what);
        }
    }
}

static void check_group(ctx *c, spec_impl *si, manta_spec_group *g, const manta_spec_node *key,
                        const manta_spec_node *v, const manta_spec_options *o)
{
    manta_spec_errors *e = c->errs;
    char gotbuf[128];
    g->name = key->text;
    g->node = v;
    g->replicas = 1;
    g->cpu = 1;
    if (!name_ok(key->text, key->len, MANTA_SPEC_MAX_NAME, false))
        node_err(e, key,
                 "bad group name; expected 1 to %d characters from a-z, 0-9, - and _, got %s",
                 MANTA_SPEC_MAX_NAME, GOT(key));
    if (v->kind != MANTA_SPEC_MAP) {
        node_err(e, v, "expected a mapping with class, replicas, resources and settings, got %s",
                 GOT(v));
        return;
    }
    const manta_spec_node *cls = NULL, *settings = NULL;
    for (size_t i = 0; i < v->count; i++) {
        const char *k = v->keys[i]->text;
        const manta_spec_node *x = v->items[i];
        if (!strcmp(k, "class")) {
            cls = x;
        } else if (!strcmp(k, "library")) {
            if (!is_null_node(x)) g->library = want_str(e, x, "a path to a shared library");
        } else if (!strcmp(k, "replicas")) {
            if (!is_null_node(x))
                want_int(e, x, 0, INT_MAX, "a non-negative integer", &g->replicas);
        } else if (!strcmp(k, "max_restarts")) {
            if (!is_null_node(x))
                want_int(e, x, -1, INT_MAX, "an integer >= -1 (-1: unlimited)", &g->max_restarts);
        } else if (!strcmp(k, "resources")) {
            check_resources(e, x, &g->cpu, &g->gpu, &g->memory_bytes, "cpu, gpu, memory");
        } else if (!strcmp(k, "settings")) {
            if (is_null_node(x)) continue;
            if (x->kind != MANTA_SPEC_MAP)
                node_err(e, x, "expected a mapping, got %s", GOT(x));
            else
                g->settings = x;
            settings = g->settings;
        } else {
            unknown_key(e, v->keys[i], GROUP_KEYS,
                        "class, library, replicas, resources, max_restarts, settings");
        }
    }
    if (!cls) {
        /* At the group's name: the mapping itself may start lines below. */
        manta_spec_errors_add(e, key->file, key->line, key->col, key->path,
                              "missing required key \"class\" (the actor class to run)");
    } else if ((g->class_name = want_str(e, cls, "a class name"))) {
        if (!name_ok(cls->text, cls->len, 64, true)) {
            node_err(e, cls,
                     "expected a class name of 1 to 64 characters from A-Z, a-z, 0-9, ., - and "
                     "_, got %s",
                     GOT(cls));
            g->class_name = NULL;
        } else if (!g->library && o && o->class_exists && !o->class_exists(cls->text, o->user)) {
            node_err(e, cls,
                     "unknown class \"%s\": not a built-in class, and the group has no "
                     "library",
                     cls->text);
        } else if (!g->library && o && o->class_exists && o->settings && settings) {
            check_settings(e, settings, o);
        }
    }
    if (g->library && !g->library[0]) {
        node_err(e, map_get(v, "library"), "expected a path to a shared library, got \"\"");
        g->library = NULL;
    }
    if (g->library && strchr(g->library, '/') && g->library[0] != '/') {
        const char *lib = g->library;
        while (lib[0] == '.' && lib[1] == '/') lib += 2;
        char *lp = NULL;
        if (asprintf(&lp, "%s/%s", si->dir, lib) < 0)
            node_err(e, map_get(v, "library"), "out of memory");
        else
            g->library_path = lp;
    } else if (g->library) {
        g->library_path = strdup(g->library);
        if (!g->library_path) node_err(e, map_get(v, "library"), "out of memory");
    }
}

static void check_nodes(ctx *c, spec_impl *si, const manta_spec_node *nodes)
{
    manta_spec_errors *e = c->errs;
    manta_spec *s = &si->pub;
    char gotbuf[128];
    if (nodes->kind != MANTA_SPEC_MAP) {
        node_err(e, nodes, "expected a mapping of node names to {cpu, gpu, memory}, got %s",
                 GOT(nodes));
        return;
    }
    if (nodes->count == 0) {
        node_err(e, nodes, "expected at least one node, got an empty mapping");
        return;
    }
    s->nodes = calloc(nodes->count, sizeof *s->nodes);
    if (!s->nodes) {
        node_err(e, nodes, "out of memory");
        return;
    }
    s->n_nodes = nodes->count;
    for (size_t i = 0; i < nodes->count; i++) {
        const manta_spec_node *k = nodes->keys[i], *v = nodes->items[i];
        manta_spec_capacity *cap = &s->nodes[i];
        cap->name = k->text;
        if (!name_ok(k->text, k->len, 64, true))
            node_err(e, k,
                     "bad node name; expected 1 to 64 characters from A-Z, a-z, 0-9, ., - and _, "
                     "got %s",
                     GOT(k));
        if (v->kind != MANTA_SPEC_MAP) {
            node_err(e, v, "expected a mapping of cpu, gpu and memory, got %s", GOT(v));
            continue;
        }
        check_resources(e, v, &cap->cpu, &cap->gpu, &cap->memory_bytes, "cpu, gpu, memory");
    }
}

/* `nodes` is the key of the nodes section: cluster-wide problems are
 * reported there. */
static void check_placement(ctx *c, manta_spec *s, const manta_spec_node *nodes)
{
    manta_spec_errors *e = c->errs;
    char a[32], b[32];
    bool bad = false;
    double cpu = 0, ncpu = 0, gpu = 0, ngpu = 0;
    uint64_t mem = 0, nmem = 0;
    for (size_t i = 0; i < s->n_nodes; i++) {
        ncpu += s->nodes[i].cpu;
        ngpu += s->nodes[i].gpu;
        nmem += s->nodes[i].memory_bytes;
    }
    for (size_t gi = 0; gi < s->n_groups; gi++) {
        const manta_spec_group *g = &s->groups[gi];
        if (g->replicas == 0) continue;
        bool fits = false;
        for (size_t i = 0; i < s->n_nodes && !fits; i++)
            fits = s->nodes[i].cpu + CPU_EPS >= g->cpu && s->nodes[i].gpu + CPU_EPS >= g->gpu &&
                   s->nodes[i].memory_bytes >= g->memory_bytes;
        if (!fits) {
            const manta_spec_node *at = map_get(g->node, "resources");
            node_err(e, at ? at : g->node,
                     "one replica needs cpu %g, gpu %g, memory %s, more than any node in "
                     "\"nodes\" has",
                     g->cpu, g->gpu, manta_spec_format_size(g->memory_bytes, a, sizeof a));
            bad = true;
        }
        cpu += g->cpu * g->replicas;
        gpu += g->gpu * g->replicas;
        mem += g->memory_bytes * (uint64_t)g->replicas;
    }
    if (cpu > ncpu + CPU_EPS) {
        node_err(e, nodes, "the groups need cpu %g in total, more than the %g the nodes have", cpu,
                 ncpu);
        bad = true;
    }
    if (gpu > ngpu + CPU_EPS) {
        node_err(e, nodes, "the groups need gpu %g in total, more than the %g the nodes have", gpu,
                 ngpu);
        bad = true;
    }
    if (mem > nmem) {
        node_err(e, nodes, "the groups need memory %s in total, more than the %s the nodes have",
                 manta_spec_format_size(mem, a, sizeof a),
                 manta_spec_format_size(nmem, b, sizeof b));
        bad = true;
    }
    if (bad) return;
    manta_spec_demand *d = calloc(s->n_groups, sizeof *d);
    size_t total = 0;
    if (d) {
        manta_spec_demands(s, d);
        total = manta_spec_total_replicas(d, s->n_groups);
    }
    size_t *node_of = d ? malloc((total ? total : 1) * sizeof *node_of) : NULL;
    char why[512];
    if (!node_of)
        node_err(e, nodes, "out of memory");
    else if (manta_spec_place(d, s->n_groups, s->nodes, s->n_nodes, MANTA_SPEC_FIRST_FIT, true,
                              node_of, why, sizeof why) != 0)
        node_err(e, nodes, "cannot place every replica (first-fit, largest first): %s", why);
    free(node_of);
    free(d);
}

static void check_job(manta_spec_errors *e, manta_spec *s, const manta_spec_node *job)
{
    char gotbuf[128];
    if (!(s->job = want_str(e, job, "the job's name"))) return;
    if (!name_ok(job->text, job->len, MANTA_SPEC_MAX_NAME, false)) {
        node_err(e, job, "expected a name of 1 to %d characters from a-z, 0-9, - and _, got %s",
                 MANTA_SPEC_MAX_NAME, GOT(job));
        s->job = NULL;
    }
}

static void check_redis(manta_spec_errors *e, manta_spec *s, const manta_spec_node *v)
{
    char gotbuf[128], why[128];
    const char *url;
    if (is_null_node(v)) return;
    if (!(url = want_str(e, v, "\"embedded\" or redis://[[user]:password@]host[:port][/db]")))
        return;
    if (manta_redis_url_parse(url, &s->redis, why, sizeof why) != 0) {
        node_err(e, v,
                 "expected \"embedded\" or redis://[[user]:password@]host[:port][/db], got %s (%s)",
                 GOT(v), why);
        manta_redis_url_parse("embedded", &s->redis, NULL, 0);
    } else {
        s->redis_url = url;
    }
}

static void check_groups(ctx *c, spec_impl *si, const manta_spec_node *groups,
                         const manta_spec_options *o)
{
    manta_spec_errors *e = c->errs;
    manta_spec *s = &si->pub;
    char gotbuf[128];
    if (groups->kind != MANTA_SPEC_MAP) {
        node_err(e, groups, "expected a mapping of group names to groups, got %s", GOT(groups));
    } else if (groups->count == 0) {
        node_err(e, groups, "expected at least one group, got an empty mapping");
    } else if (!(s->groups = calloc(groups->count, sizeof *s->groups))) {
        node_err(e, groups, "out of memory");
    } else {
        s->n_groups = groups->count;
        for (size_t i = 0; i < groups->count; i++)
            check_group(c, si, &s->groups[i], groups->keys[i], groups->items[i], o);
    }
}

/* Check the fixed schema in document order, so errors come out sorted by
 * position (missing keys last). */
static void validate(ctx *c, spec_impl *si, const manta_spec_options *o)
{
    manta_spec_errors *e = c->errs;
    manta_spec *s = &si->pub;
    const manta_spec_node *root = si->root;
    char gotbuf[128];
    if (!root) {
        manta_spec_errors_add(e, c->file, 1, 1, "",
                              "the spec is empty; expected a mapping with job and groups");
        return;
    }
    if (root->kind != MANTA_SPEC_MAP) {
        node_err(e, root, "expected a mapping with job and groups at the top level, got %s",
                 GOT(root));
        return;
    }
    size_t before = e->count + e->dropped;
    bool program = program_sections(root, o);
    const manta_spec_node *job = NULL, *groups = NULL, *nodes = NULL, *nodes_key = NULL;
    s->redis_url = "embedded";
    manta_redis_url_parse("embedded", &s->redis, NULL, 0);
    for (size_t i = 0; i < root->count; i++) {
        const manta_spec_node *k = root->keys[i], *v = root->items[i];
        if (!strcmp(k->text, "job")) {
            check_job(e, s, job = v);
        } else if (!strcmp(k->text, "redis")) {
            check_redis(e, s, v);
        } else if (!strcmp(k->text, "log_dir")) {
            if (!is_null_node(v)) s->log_dir = want_str(e, v, "a folder path");
        } else if (!strcmp(k->text, "groups")) {
            /* a second `groups:` is already a duplicate-key error: not read */
            if (!groups) check_groups(c, si, groups = v, o);
        } else if (!strcmp(k->text, "nodes")) {
            if (!nodes && !is_null_node(v)) check_nodes(c, si, nodes = v), nodes_key = k;
        } else if (declared_section(o, k->text, program)) {
            check_value(e, declared_section(o, k->text, program), v);
        } else {
            /* Free-form section. A scalar is almost surely a typo of a
             * fixed key or a declared section, as is a collection named one
             * edit away from one. */
            bool scalar = v->kind == MANTA_SPEC_SCALAR;
            const char *cands[MAX_CANDS];
            size_t nc = 0;
            add_cands(cands, &nc, NULL, TOP_KEYS);
            add_cands(cands, &nc, manta_spec_runtime_sections, NULL);
            if (program) add_cands(cands, &nc, o->sections, NULL);
            const char *sug = suggest(k->text, cands, scalar ? 2 : 1);
            if (sug)
                node_err(e, k, "unknown top-level key (did you mean \"%s\"?)", sug);
            else if (scalar)
                node_err(e, k,
                         "unknown top-level key; a free-form section must be a mapping or a "
                         "sequence, got %s",
                         GOT(v));
        }
    }
    if (!job)
        manta_spec_errors_add(e, root->file, root->line, root->col, "job",
                              "missing required key; expected the job's name");
    if (!groups)
        manta_spec_errors_add(e, root->file, root->line, root->col, "groups",
                              "missing required key; expected a mapping of group names to "
                              "groups");
    /* Placement only makes sense on a clean schema. */
    if (nodes && s->n_nodes && s->n_groups && e->count + e->dropped == before)
        check_placement(c, s, nodes_key);
}

/* ---- Derived defaults (manta_spec_options.defaults) -------------------------------------- */

struct manta_spec_defaults {
    ctx *c;
    spec_impl *si;
    int proposed; /* defaults proposed so far: the line of the next one's (default):N:COL */
};

/* Is there a value at comps[0..nc) below root? A null counts as none; so does
 * a missing key. A scalar on the way, or a sequence without that item, is
 * "something else there" (true): the default stays out of it. */
static bool has_value(const manta_spec_node *root, char **comps, size_t nc)
{
    const manta_spec_node *cur = root;
    for (size_t i = 0; i < nc; i++) {
        if (is_null_node(cur)) return false;
        if (cur->kind == MANTA_SPEC_MAP) {
            cur = map_get(cur, comps[i]);
            if (!cur) return false;
        } else if (cur->kind == MANTA_SPEC_SEQ) {
            size_t k;
            if (!parse_index(comps[i], &k) || k >= cur->count) return true;
            cur = cur->items[k];
        } else {
            return true;
        }
    }
    return !is_null_node(cur);
}

static int record_derived(spec_impl *si, const char *path, const char *value, const char *why)
{
    if (si->pub.n_derived == si->cap_derived) {
        size_t cap = si->cap_derived ? 2 * si->cap_derived : 8;
        manta_spec_derived *d = realloc(si->derived, cap * sizeof *d);
        if (!d) return MANTA_ENOMEM;
        si->derived = d;
        si->cap_derived = cap;
    }
    manta_spec_derived *e = &si->derived[si->pub.n_derived];
    e->path = strdup(path);
    e->value = strdup(value);
    e->why = strdup(why ? why : "");
    if (!e->path || !e->value || !e->why) {
        free((char *)e->path), free((char *)e->value), free((char *)e->why);
        return MANTA_ENOMEM;
    }
    si->pub.n_derived++;
    si->pub.derived = si->derived;
    return 0;
}

int manta_spec_default(manta_spec_defaults *d, const char *path, const char *value, const char *why)
{
    if (!d || !path || !value) return MANTA_EINVAL;
    ctx *c = d->c;
    int index = ++d->proposed;
    size_t plen = strlen(path);
    size_t alen = plen + strlen(value) + 2;
    char *arg = malloc(alen);
    char *copy = strdup(path);
    if (!arg || !copy) {
        free(arg), free(copy);
        manta_spec_errors_add(c->errs, DEFAULT_FILE, index, 1, "", "out of memory");
        return MANTA_ENOMEM;
    }
    snprintf(arg, alen, "%s=%s", path, value);
    char *comps[MANTA_SPEC_MAX_DEPTH + 1];
    size_t nc = 0;
    int rc = 0;
    for (char *p = copy;;) {
        char *dot = strchr(p, '.');
        if (dot) *dot = '\0';
        if (!*p || nc >= MANTA_SPEC_MAX_DEPTH) {
            manta_spec_errors_add(c->errs, DEFAULT_FILE, index, 1, "",
                                  "%s in the path \"%s\" of a default",
                                  *p ? "too deep" : "an empty component", path);
            rc = MANTA_EINVAL;
            break;
        }
        comps[nc++] = p;
        if (!dot) break;
        p = dot + 1;
    }
    if (rc == 0 && !has_value(d->si->root, comps, nc)) {
        const char *saved = c->set_file;
        c->set_file = DEFAULT_FILE;
        size_t before = c->errs->count + c->errs->dropped;
        manta_spec_node *val = parse_set_value(c, arg, arg + plen, index);
        bool ok = val && set_at(c, d->si->root, comps, nc, &val, index);
        node_free(val);
        c->set_file = saved;
        if (!ok) {
            rc = c->errs->count + c->errs->dropped == before ? MANTA_ENOMEM : MANTA_EINVAL;
        } else if (record_derived(d->si, path, value, why) != 0) {
            manta_spec_errors_add(c->errs, DEFAULT_FILE, index, 1, path, "out of memory");
            rc = MANTA_ENOMEM;
        } else {
            rc = 1;
        }
    }
    free(arg), free(copy);
    return rc;
}

/* Run the program's defaults callback on the document. */
static void apply_defaults(ctx *c, spec_impl *si, const manta_spec_options *o)
{
    manta_spec_defaults d = {.c = c, .si = si};
    size_t before = c->errs->count + c->errs->dropped;
    int rc = o->defaults(&d, si->root, o->user);
    if (rc < 0 && c->errs->count + c->errs->dropped == before)
        manta_spec_errors_add(c->errs, c->file, 0, 0, "", "the program's defaults failed: %s",
                              manta_strerror(rc));
}

/* ---- Loading ---------------------------------------------------------------------------- */

void manta_spec_free(manta_spec *s)
{
    if (!s) return;
    spec_impl *si = (spec_impl *)s;
    for (size_t i = 0; i < s->n_groups; i++) free((char *)s->groups[i].library_path);
    for (size_t i = 0; i < s->n_derived; i++) {
        free((char *)si->derived[i].path);
        free((char *)si->derived[i].value);
        free((char *)si->derived[i].why);
    }
    free(si->derived);
    free(s->groups);
    free(s->nodes);
    node_free(si->root);
    free(si->file);
    free(si->dir);
    free(si);
}

/* A load without an error list: the first error goes to manta_last_error. */
static manta_spec *load_quiet(const char *path, const char *buf, size_t len,
                              const manta_spec_options *opts)
{
    manta_spec_errors local;
    manta_spec_errors_init(&local);
    manta_spec *s = buf ? manta_spec_load_buffer(buf, len, path, opts, &local)
                        : manta_spec_load_file(path, opts, &local);
    if (!s)
        manta_fail(MANTA_ESPEC, "%s%s", local.count ? local.items[0].text : "spec not loaded",
                   local.count + local.dropped > 1 ? " (and more errors)" : "");
    manta_spec_errors_destroy(&local);
    return s;
}

manta_spec *manta_spec_load_buffer(const char *buf, size_t len, const char *name,
                                   const manta_spec_options *opts, manta_spec_errors *errs)
{
    if (!errs) return load_quiet(name, buf ? buf : "", len, opts);
    size_t before = errs->count + errs->dropped;
    if (!name) name = "<spec>";
    spec_impl *si = calloc(1, sizeof *si);
    if (!si || !(si->file = strdup(name))) {
        free(si);
        manta_spec_errors_add(errs, name, 0, 0, "", "out of memory");
        return NULL;
    }
    const char *slash = strrchr(name, '/');
    si->dir = slash ? strndup(name, slash == name ? 1 : (size_t)(slash - name)) : strdup(".");
    si->pub.file = si->file;
    ctx c = {.errs = errs, .file = si->file, .opts = opts};
    if (!si->dir) {
        manta_spec_errors_add(errs, name, 0, 0, "", "out of memory");
    } else {
        bool empty;
        si->root = build_tree(&c, buf ? buf : "", buf ? len : 0, &empty);
        if (si->root && si->root->kind == MANTA_SPEC_MAP && opts)
            for (size_t i = 0; i < opts->n_sets; i++)
                apply_set(&c, si->root, opts->sets[i] ? opts->sets[i] : "", (int)i + 1);
        if (si->root && si->root->kind == MANTA_SPEC_MAP && opts && opts->defaults)
            apply_defaults(&c, si, opts);
        if (si->root || empty) validate(&c, si, opts);
    }
    si->pub.root = si->root;
    /* Every failure above reports itself; this net keeps a silent one (a
     * bug) from handing out a half-made spec. */
    if (errs->count + errs->dropped == before && (!si->pub.job || !si->pub.n_groups))
        manta_spec_errors_add(errs, name, 0, 0, "", "internal error: the spec was not loaded");
    if (errs->count + errs->dropped != before) {
        manta_spec_free(&si->pub);
        return NULL;
    }
    return &si->pub;
}

manta_spec *manta_spec_load_file(const char *path, const manta_spec_options *opts,
                                 manta_spec_errors *errs)
{
    if (!errs) return load_quiet(path, NULL, 0, opts);
    FILE *f = fopen(path, "rb");
    if (!f) {
        manta_spec_errors_add(errs, path, 0, 0, "", "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    bool too_big = false;
    while (buf) {
        if (len == cap) {
            if (cap > MANTA_SPEC_MAX_FILE) {
                too_big = true;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int rerr = ferror(f) ? errno : 0;
    fclose(f);
    manta_spec *s = NULL;
    if (!buf)
        manta_spec_errors_add(errs, path, 0, 0, "", "out of memory");
    else if (too_big || len > MANTA_SPEC_MAX_FILE)
        manta_spec_errors_add(errs, path, 0, 0, "", "the file is larger than %d bytes",
                              MANTA_SPEC_MAX_FILE);
    else if (rerr)
        manta_spec_errors_add(errs, path, 0, 0, "", "cannot read: %s", strerror(rerr));
    else
        s = manta_spec_load_buffer(buf, len, path, opts, errs);
    free(buf);
    return s;
}

const manta_spec_group *manta_spec_group_find(const manta_spec *s, const char *name)
{
    for (size_t i = 0; s && name && i < s->n_groups; i++)
        if (!strcmp(s->groups[i].name, name)) return &s->groups[i];
    return NULL;
}

/* ---- msgpack ------------------------------------------------------------------------------ */

static int pack_str(msgpack_packer *pk, const char *s, size_t len)
{
    return msgpack_pack_str(pk, len) || msgpack_pack_str_body(pk, s, len) ? MANTA_ENOMEM : 0;
}

int manta_spec_node_pack(msgpack_packer *pk, const manta_spec_node *n)
{
    if (!n) return msgpack_pack_nil(pk) ? MANTA_ENOMEM : 0;
    if (n->kind == MANTA_SPEC_MAP) {
        if (msgpack_pack_map(pk, n->count)) return MANTA_ENOMEM;
        for (size_t i = 0; i < n->count; i++)
            if (pack_str(pk, n->keys[i]->text, n->keys[i]->len) ||
                manta_spec_node_pack(pk, n->items[i]))
                return MANTA_ENOMEM;
        return 0;
    }
    if (n->kind == MANTA_SPEC_SEQ) {
        if (msgpack_pack_array(pk, n->count)) return MANTA_ENOMEM;
        for (size_t i = 0; i < n->count; i++)
            if (manta_spec_node_pack(pk, n->items[i])) return MANTA_ENOMEM;
        return 0;
    }
    int64_t v;
    switch (resolve(n)) {
    case MANTA_SPEC_T_NULL:
        return msgpack_pack_nil(pk) ? MANTA_ENOMEM : 0;
    case MANTA_SPEC_T_BOOL:
        return (bool_text(n->text) ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) ? MANTA_ENOMEM
                                                                                     : 0;
    case MANTA_SPEC_T_INT:
        if (int_value(n->text, &v) == 0) return msgpack_pack_int64(pk, v) ? MANTA_ENOMEM : 0;
        return pack_str(pk, n->text, n->len);
    case MANTA_SPEC_T_FLOAT:
        return msgpack_pack_double(pk, float_value(n->text)) ? MANTA_ENOMEM : 0;
    default:
        return pack_str(pk, n->text, n->len);
    }
}

typedef int (*pack_body_fn)(msgpack_packer *pk, const void *arg);

static int pack_to_buffer(pack_body_fn fn, const void *arg, char **out, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (fn(&pk, arg) != 0 || !sb.data) {
        msgpack_sbuffer_destroy(&sb);
        *out = NULL;
        *len = 0;
        return MANTA_ENOMEM;
    }
    *len = sb.size;
    *out = msgpack_sbuffer_release(&sb);
    return 0;
}

static int pack_node_body(msgpack_packer *pk, const void *arg)
{
    return manta_spec_node_pack(pk, arg);
}

int manta_spec_node_to_msgpack(const manta_spec_node *node, char **out, size_t *len)
{
    return pack_to_buffer(pack_node_body, node, out, len);
}

struct payload_arg {
    const manta_spec *s;
    size_t g;
    int replica;
};

static int pack_payload_body(msgpack_packer *pk, const void *arg)
{
    const struct payload_arg *a = arg;
    const manta_spec *s = a->s;
    const manta_spec_group *g = &s->groups[a->g];
    const manta_spec_node *root = s->root;
    size_t n_sections = 0;
    for (size_t i = 0; i < root->count; i++)
        if (!is_top_key(root->keys[i]->text)) n_sections++;
    if (msgpack_pack_map(pk, 7) || pack_str(pk, "job", 3) || pack_str(pk, s->job, strlen(s->job)) ||
        pack_str(pk, "group", 5) || pack_str(pk, g->name, strlen(g->name)) ||
        pack_str(pk, "class", 5) || pack_str(pk, g->class_name, strlen(g->class_name)) ||
        pack_str(pk, "replica", 7) || msgpack_pack_int(pk, a->replica) ||
        pack_str(pk, "replicas", 8) || msgpack_pack_int(pk, g->replicas) ||
        pack_str(pk, "settings", 8))
        return MANTA_ENOMEM;
    if (g->settings ? manta_spec_node_pack(pk, g->settings) : msgpack_pack_map(pk, 0))
        return MANTA_ENOMEM;
    if (pack_str(pk, "sections", 8) || msgpack_pack_map(pk, n_sections)) return MANTA_ENOMEM;
    for (size_t i = 0; i < root->count; i++) {
        if (is_top_key(root->keys[i]->text)) continue;
        if (pack_str(pk, root->keys[i]->text, root->keys[i]->len) ||
            manta_spec_node_pack(pk, root->items[i]))
            return MANTA_ENOMEM;
    }
    return 0;
}

int manta_spec_init_payload(const manta_spec *s, size_t g, int replica, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!s || g >= s->n_groups) return MANTA_EINVAL;
    struct payload_arg a = {s, g, replica};
    return pack_to_buffer(pack_payload_body, &a, out, len);
}

/* ---- Placement ------------------------------------------------------------------------------ */

void manta_spec_demands(const manta_spec *s, manta_spec_demand *out)
{
    for (size_t i = 0; i < s->n_groups; i++) {
        const manta_spec_group *g = &s->groups[i];
        out[i] = (manta_spec_demand){g->name, g->replicas, g->cpu, g->gpu, g->memory_bytes};
    }
}

size_t manta_spec_total_replicas(const manta_spec_demand *d, size_t n)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        if (d[i].replicas > 0) t += (size_t)d[i].replicas;
    return t;
}

typedef struct slot {
    size_t demand;
    int replica;
    size_t k; /* index into node_of */
    const manta_spec_demand *d;
} slot;

static int slot_cmp(const void *pa, const void *pb)
{
    const slot *a = pa, *b = pb;
    if (a->d->gpu != b->d->gpu) return a->d->gpu > b->d->gpu ? -1 : 1;
    if (a->d->memory_bytes != b->d->memory_bytes)
        return a->d->memory_bytes > b->d->memory_bytes ? -1 : 1;
    if (a->d->cpu != b->d->cpu) return a->d->cpu > b->d->cpu ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k; /* stable */
}

typedef struct room {
    double cpu, gpu;
    uint64_t mem;
} room;

static void place_fail(char *why, size_t why_len, const slot *sl, const manta_spec_capacity *nodes,
                       const room *left, size_t n_nodes)
{
    char a[32];
    if (!why || !why_len) return;
    size_t o = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (o < why_len) {                                                                         \
            int r_ = snprintf(why + o, why_len - o, __VA_ARGS__);                                  \
            if (r_ > 0) o += (size_t)r_;                                                           \
        }                                                                                          \
    } while (0)
    PUT("group \"%s\" replica %d of %d (cpu %g, gpu %g, memory %s) does not fit", sl->d->group,
        sl->replica + 1, sl->d->replicas, sl->d->cpu, sl->d->gpu,
        manta_spec_format_size(sl->d->memory_bytes, a, sizeof a));
    if (n_nodes == 0) PUT(": there are no nodes");
    for (size_t i = 0; i < n_nodes && i < 8; i++)
        PUT("%s %s cpu %g gpu %g memory %s", i ? ";" : ": free:", nodes[i].name,
            left[i].cpu < 0 ? 0 : left[i].cpu, left[i].gpu < 0 ? 0 : left[i].gpu,
            manta_spec_format_size(left[i].mem, a, sizeof a));
    if (n_nodes > 8) PUT("; and %zu more nodes", n_nodes - 8);
#undef PUT
}

int manta_spec_place(const manta_spec_demand *demands, size_t n_demands,
                     const manta_spec_capacity *nodes, size_t n_nodes, manta_spec_fit fit,
                     bool decreasing, size_t *node_of, char *why, size_t why_len)
{
    if (why && why_len) why[0] = '\0';
    size_t total = manta_spec_total_replicas(demands, n_demands);
    if (total == 0) return 0;
    room *left = calloc(n_nodes ? n_nodes : 1, sizeof *left);
    slot *order = calloc(total, sizeof *order);
    if (!left || !order) {
        free(left);
        free(order);
        if (why && why_len) snprintf(why, why_len, "out of memory");
        return MANTA_ENOMEM;
    }
    for (size_t i = 0; i < n_nodes; i++)
        left[i] = (room){nodes[i].cpu, nodes[i].gpu, nodes[i].memory_bytes};
    size_t k = 0;
    for (size_t d = 0; d < n_demands; d++)
        for (int r = 0; r < demands[d].replicas; r++, k++) order[k] = (slot){d, r, k, &demands[d]};
    if (decreasing) qsort(order, total, sizeof *order, slot_cmp);
    int rc = 0;
    for (size_t j = 0; j < total; j++) {
        const manta_spec_demand *d = order[j].d;
        size_t best = n_nodes;
        for (size_t i = 0; i < n_nodes; i++) {
            if (left[i].cpu + CPU_EPS < d->cpu || left[i].gpu + CPU_EPS < d->gpu ||
                left[i].mem < d->memory_bytes)
                continue;
            if (fit == MANTA_SPEC_FIRST_FIT) {
                best = i;
                break;
            }
            if (best == n_nodes) {
                best = i;
                continue;
            }
            /* Best fit: least left over after placing, by gpu, memory, cpu. */
            double gi = left[i].gpu - d->gpu, gb = left[best].gpu - d->gpu;
            uint64_t mi = left[i].mem - d->memory_bytes, mb = left[best].mem - d->memory_bytes;
            double ci = left[i].cpu - d->cpu, cb = left[best].cpu - d->cpu;
            if (gi < gb - CPU_EPS ||
                (fabs(gi - gb) <= CPU_EPS && (mi < mb || (mi == mb && ci < cb - CPU_EPS))))
                best = i;
        }
        if (best == n_nodes) {
            place_fail(why, why_len, &order[j], nodes, left, n_nodes);
            rc = MANTA_ENOFIT;
            break;
        }
        left[best].cpu -= d->cpu;
        left[best].gpu -= d->gpu;
        left[best].mem -= d->memory_bytes;
        node_of[order[j].k] = best;
    }
    free(left);
    free(order);
    return rc;
}
