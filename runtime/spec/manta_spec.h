/*
 * manta_spec.h -- spec files: the YAML that `manta run spec.yaml` launches.
 *
 * A spec names a job, where its Redis is, and an ordered set of actor
 * groups (class, replicas, resources, restart budget, free-form settings),
 * optionally a static list of nodes to check placement against, and any
 * number of free-form sections (model:, rl:, task:, tools: ...) that the
 * classes read. The full schema, with every default and every error, is in
 * runtime/README-spec.md.
 *
 * What this module gives:
 *   - manta_spec_load_file()/manta_spec_load_buffer(): parse with libyaml,
 *     apply `--set path=value` overrides, validate the fixed schema, check
 *     placement against `nodes`, and return a typed manta_spec whose free-form
 *     parts stay a generic node tree (map / sequence / scalar, each node with
 *     file, line and column).
 *   - typed getters over any node (manta_spec_get_int() ...), by dotted path.
 *   - manta_spec_node_pack(): a node tree as msgpack, and
 *     manta_spec_init_payload(): what the launcher hands to a class's init.
 *   - manta_spec_place(): first-fit / best-fit placement of replicas onto
 *     nodes with free resources; a pure function the launcher and the
 *     scaler share.
 *
 * Errors. Every problem is reported as one line
 *     FILE:LINE:COL: PATH: MESSAGE
 * e.g. `spec.yaml:12:5: groups.rollout.replicas: expected a non-negative
 * integer, got "two"`. LINE and COLUMN are 1-based and count characters.
 * Overrides report FILE as `--set`, LINE as the 1-based index of the
 * override among those given and COL as the column inside "path=value".
 * A problem with no position (a file that cannot be read) is `FILE: MESSAGE`;
 * one with no path is `FILE:LINE:COL: MESSAGE`. Loading collects every error
 * it finds, up to MANTA_SPEC_MAX_ERRORS, in a manta_spec_errors, and counts
 * the rest in `dropped`.
 *
 * Ownership. A manta_spec owns everything reachable from it (the node tree,
 * every string, every array); manta_spec_free() frees it all, and every
 * pointer taken from it dies with it. Getters return pointers into the tree.
 * A manta_spec_errors is caller storage: manta_spec_errors_init() before use,
 * manta_spec_errors_destroy() after.
 *
 * Threads. No function keeps global state: any function may run in any
 * thread at once on different objects, and a loaded manta_spec is never
 * changed after loading, so many threads may read one at the same time.
 * A manta_spec_errors must not be shared between threads without a lock.
 *
 * Return codes: the functions that can fail return 0 on success or a
 * negative code from the runtime's one table (manta.h: MANTA_ESPEC for a
 * spec that breaks the schema, MANTA_EINVAL, MANTA_ENOMEM, MANTA_ENOFIT;
 * manta_strerror() names it), with what failed and where in the
 * manta_spec_errors or the `why` buffer; functions that return a pointer
 * return NULL on failure.
 */
#ifndef MANTA_SPEC_H
#define MANTA_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <msgpack.h>

#include "manta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Limits ---------------------------------------------------------------- */

#define MANTA_SPEC_MAX_ERRORS 32       /* errors kept per manta_spec_errors */
#define MANTA_SPEC_MAX_DEPTH  64       /* nesting of mappings and sequences */
#define MANTA_SPEC_MAX_NODES  200000   /* nodes per tree, aliases expanded */
#define MANTA_SPEC_MAX_FILE   16777216 /* bytes of a spec file (16 MiB) */
#define MANTA_SPEC_MAX_NAME   40       /* job and group names */

/* ---- Errors ---------------------------------------------------------------- */

typedef struct manta_spec_error {
    char *text;    /* the whole line: "file:line:col: path: message" */
    char *file;    /* the spec file's name as given, or "--set" */
    int line, col; /* 1-based; 0 when the problem has no position */
    char *path;    /* dotted path of the offending node ("" for none) */
    char *message; /* what was expected and what was found */
} manta_spec_error;

typedef struct manta_spec_errors {
    size_t count;   /* entries in items[] */
    size_t dropped; /* further errors found but not kept */
    manta_spec_error items[MANTA_SPEC_MAX_ERRORS];
} manta_spec_errors;

/* Make *e empty. Never fails. */
void manta_spec_errors_init(manta_spec_errors *e);
/* Free the strings of every entry and make *e empty again. NULL is a no-op. */
void manta_spec_errors_destroy(manta_spec_errors *e);
/* Write every entry's text, one per line, then "... and N more errors" when
 * some were dropped. Returns the number of lines written. */
size_t manta_spec_errors_print(const manta_spec_errors *e, FILE *out);
/* Append an error at `file:line:col` (line 0: no position) with a printf-
 * style message; for callers (the launcher, classes reading settings) that
 * find problems of their own in a spec. Counts it as dropped when full or
 * out of memory. */
void manta_spec_errors_add(manta_spec_errors *e, const char *file, int line, int col,
                           const char *path, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* ---- The node tree --------------------------------------------------------- */

typedef enum manta_spec_kind {
    MANTA_SPEC_SCALAR = 0,
    MANTA_SPEC_SEQ = 1,
    MANTA_SPEC_MAP = 2,
} manta_spec_kind;

/* The type a scalar resolves to under the YAML 1.2 core schema. Only plain
 * (unquoted, untagged) scalars resolve to anything but STR:
 *   NULL  "", "~", "null", "Null", "NULL"
 *   BOOL  true, True, TRUE, false, False, FALSE   (not yes/no/on/off)
 *   INT   [-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+
 *   FLOAT [-+]?(.[0-9]+|[0-9]+(.[0-9]*)?)([eE][-+]?[0-9]+)?, [-+]?.inf, .nan
 * A quoted scalar ("4") or one tagged !!str is always STR. */
typedef enum manta_spec_type {
    MANTA_SPEC_T_NULL = 0,
    MANTA_SPEC_T_BOOL = 1,
    MANTA_SPEC_T_INT = 2,
    MANTA_SPEC_T_FLOAT = 3,
    MANTA_SPEC_T_STR = 4,
} manta_spec_type;

/* One node. Read-only for users: read the fields or use the functions below.
 * Mappings keep their keys in file order; duplicate keys are an error at
 * load time, so a loaded tree has none. Aliases (*name) are expanded into
 * copies, so the tree is a tree. */
typedef struct manta_spec_node {
    manta_spec_kind kind;
    const char *file; /* the spec's file name, or "--set" for an override */
    int line, col;    /* 1-based position of the node's first character */
    char *path;       /* dotted path from the root, e.g. "groups.rollout.replicas";
                         sequence items are numbered from 0: "tools.1.url" */
    /* SCALAR */
    char *text; /* NUL-terminated; `len` bytes (text may hold "\0" escapes) */
    size_t len;
    bool plain; /* unquoted and untagged: subject to type resolution */
    /* SEQ and MAP */
    size_t count;
    size_t cap;
    struct manta_spec_node **keys;  /* MAP: key scalars, count of them */
    struct manta_spec_node **items; /* SEQ: items; MAP: values, parallel to keys */
} manta_spec_node;

/* The type of a scalar (see manta_spec_type); MANTA_SPEC_T_NULL for NULL;
 * -1 for a mapping or a sequence. */
int manta_spec_scalar_type(const manta_spec_node *n);

/* Find the node at a dotted path below `node` ("" or NULL: node itself).
 * Components name mapping keys; a component of digits indexes a sequence.
 * Keys that contain '.' cannot be reached this way (iterate instead).
 * Returns NULL when any component is missing or `node` is NULL. */
const manta_spec_node *manta_spec_find(const manta_spec_node *node, const char *path);

/* Entries of a mapping or items of a sequence (0 for a scalar or NULL). */
size_t manta_spec_len(const manta_spec_node *n);
/* Item or value i (NULL when out of range or n is a scalar). */
const manta_spec_node *manta_spec_at(const manta_spec_node *n, size_t i);
/* Key i of a mapping as a string (NULL when out of range or not a mapping). */
const char *manta_spec_key_at(const manta_spec_node *n, size_t i);

/* ---- Typed getters --------------------------------------------------------- *
 *
 * Each looks up `path` below `node` (as manta_spec_find) and converts it.
 * Returns:
 *    0  found and converted; *out set.
 *    1  absent, or a plain null (`key:` / `key: ~`); *out = def.
 *   MANTA_ESPEC  present but of the wrong type (or a component on the way
 *       is not a mapping or sequence); *out = def, and when `err` is not NULL
 *       one error at the offending node is appended, e.g.
 *       `spec.yaml:7:12: rl.eta: expected an integer, got "two"`.
 * `node` may be NULL (then everything is absent). */
int manta_spec_get_int(const manta_spec_node *node, const char *path, int64_t def, int64_t *out,
                       manta_spec_errors *err);
/* Accepts INT and FLOAT scalars, including .inf and .nan. */
int manta_spec_get_double(const manta_spec_node *node, const char *path, double def, double *out,
                          manta_spec_errors *err);
/* Accepts any non-null scalar (a plain 4 reads as "4"). *out points into the
 * tree (or is `def`). */
int manta_spec_get_str(const manta_spec_node *node, const char *path, const char *def,
                       const char **out, manta_spec_errors *err);
/* Accepts only true/false (see manta_spec_type). */
int manta_spec_get_bool(const manta_spec_node *node, const char *path, bool def, bool *out,
                        manta_spec_errors *err);
/* A byte count: a plain non-negative integer (bytes), or a number with a
 * unit: "512MiB", "2 GiB", "1.5GB". Units: B; KB, MB, GB, TB (powers of
 * 1000); KiB, MiB, GiB, TiB (powers of 1024). Case matters; a fractional
 * number must come to a whole number of bytes; the result fits uint64_t. */
int manta_spec_get_size(const manta_spec_node *node, const char *path, uint64_t def, uint64_t *out,
                        manta_spec_errors *err);
/* A sequence node: *out = the node (iterate with manta_spec_len/_at), or NULL
 * when absent (return 1). A mapping or scalar is an error (MANTA_ESPEC). */
int manta_spec_get_seq(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                       manta_spec_errors *err);
/* A mapping node, as manta_spec_get_seq. */
int manta_spec_get_map(const manta_spec_node *node, const char *path, const manta_spec_node **out,
                       manta_spec_errors *err);

/* Parse a size string as manta_spec_get_size does. 0, or MANTA_EINVAL when
 * it is not a size. */
int manta_spec_parse_size(const char *text, uint64_t *out);
/* Write a byte count for humans: "2GiB", "1536MiB", "1000B". Returns buf. */
char *manta_spec_format_size(uint64_t bytes, char *buf, size_t len);

/* ---- The typed spec -------------------------------------------------------- */

typedef struct manta_spec_group {
    const char *name;                /* [a-z0-9_-]{1,40} */
    const char *class_name;          /* built-in class, or one from `library` */
    const char *library;             /* as written, or NULL */
    const char *library_path;        /* what to dlopen(): a relative path with a '/'
                                        joined to the spec file's folder; an
                                        absolute path or a bare name (left to
                                        dlopen's search) as written; or NULL */
    int replicas;                    /* >= 0; default 1 */
    double cpu;                      /* >= 0; default 1 */
    double gpu;                      /* >= 0, a fraction below 1 or whole; default 0 */
    uint64_t memory_bytes;           /* default 0 (not accounted) */
    int max_restarts;                /* >= -1 (-1: unlimited); default 0 */
    const manta_spec_node *settings; /* a mapping, or NULL when absent */
    const manta_spec_node *node;     /* the group's mapping (for locations) */
} manta_spec_group;

/* A node's resources: in a spec, its total; at run time, what is free. */
typedef struct manta_spec_capacity {
    const char *name;
    double cpu;
    double gpu;
    uint64_t memory_bytes;
} manta_spec_capacity;

/* A value the program put in where the spec gave none
 * (manta_spec_options.defaults), recorded so that the launcher can say it. */
typedef struct manta_spec_derived {
    const char *path;  /* the full dotted path: "groups.rollout.resources.gpu" */
    const char *value; /* as YAML text, as it was set: "0.25" */
    const char *why;   /* the program's reason, a phrase: "model.device is cuda: ..." */
} manta_spec_derived;

typedef struct manta_spec {
    const char *file;       /* as given to load (or the buffer's name) */
    const char *job;        /* [a-z0-9_-]{1,40} */
    const char *redis_url;  /* as written; "embedded" when absent */
    manta_redis_addr redis; /* parsed by manta_redis_url_parse (manta.h) */
    const char *log_dir;    /* NULL when absent */
    size_t n_groups;        /* >= 1, in file order */
    manta_spec_group *groups;
    size_t n_nodes; /* 0 when there is no `nodes` section */
    manta_spec_capacity *nodes;
    const manta_spec_node *root;       /* the whole document, overrides and defaults applied */
    size_t n_derived;                  /* the defaults of manta_spec_options.defaults that */
    const manta_spec_derived *derived; /* were applied, in order (NULL when none) */
} manta_spec;

/* ---- Declared sections ----------------------------------------------------- *
 *
 * A program that reads top-level sections of its own (the RL classes read
 * model:, rl:, task:, reward:, tools:) declares each key it reads, once, in
 * a table of manta_spec_key; the loader then checks those sections like the
 * fixed schema: an unknown key is an error at its file:line:col with a
 * "did you mean" (or the list of keys), a value of the wrong type or out of
 * range is an error at the value, a missing required key an error at the
 * section. The same table gives the readers their key names and defaults
 * and the documentation its tables (manta_spec_keys_markdown), so the
 * three cannot drift apart. Sections not declared stay free-form.
 *
 * The runtime declares its own sections (services, metrics, security, run;
 * manta_spec_runtime_sections) and the loader always checks them. */
typedef enum manta_spec_ktype {
    MANTA_SPEC_K_ANY = 0,  /* anything (not checked) */
    MANTA_SPEC_K_INT = 1,  /* an integer, within [lo, hi] */
    MANTA_SPEC_K_NUM = 2,  /* an integer or a float, finite, within [lo, hi] */
    MANTA_SPEC_K_STR = 3,  /* a string (not a number, boolean or null); one of
                              `choices` when given */
    MANTA_SPEC_K_BOOL = 4, /* true or false */
    MANTA_SPEC_K_SIZE = 5, /* a byte count, as manta_spec_get_size */
    MANTA_SPEC_K_MAP = 6,  /* a mapping of `keys` (any keys when NULL) */
    MANTA_SPEC_K_LIST = 7, /* a sequence of mappings of `keys` */
} manta_spec_ktype;

/* manta_spec_key.flags */
#define MANTA_SPEC_REQUIRED 1u /* must be given (in a mapping that is given) */
#define MANTA_SPEC_IN_SETTINGS                                                                     \
    2u /* a section whose keys a built-in group's settings                                         \
          may also give, nested (settings.rl.lr) or flat                                           \
          (settings.lr); see manta_spec_options.settings */

typedef struct manta_spec_key {
    const char *name; /* NULL ends a table */
    manta_spec_ktype type;
    double lo, hi;                     /* INT and NUM: the inclusive range; lo == hi: any value */
    const char *def;                   /* the default as the docs write it ("8", "0.001", "auto");
                                          in parentheses a default computed at run time
                                          ("(rl.lr)"); NULL: no default */
    const char *doc;                   /* what it means, one sentence */
    const char *choices;               /* STR: the allowed values, "|"-separated, or NULL */
    const struct manta_spec_key *keys; /* MAP, LIST: the mapping's keys */
    unsigned flags;
} manta_spec_key;

/* The sections the runtime itself reads: services (job.c), metrics,
 * security and run (the CLI). Ends with a {NULL} entry. */
extern const manta_spec_key manta_spec_runtime_sections[];

/* The entry of `table` named `name` (up to `len` bytes), or NULL. */
const manta_spec_key *manta_spec_key_find(const manta_spec_key *table, const char *name,
                                          size_t len);
/* Check one node against one declaration (as the loader does for declared
 * sections), appending an error per problem to `errs`. 0 when clean, else
 * MANTA_ESPEC. */
int manta_spec_check_key(const manta_spec_key *k, const manta_spec_node *value,
                         manta_spec_errors *errs);
/* The documentation of a table of sections as Markdown: per section a
 * heading and a table (key, type, default, meaning), nested mappings as
 * their own tables. Returns 0, or MANTA_ESYS when writing failed. */
int manta_spec_keys_markdown(const manta_spec_key *sections, FILE *out);

/* A load in progress, as a defaults callback sees it (manta_spec_default). */
typedef struct manta_spec_defaults manta_spec_defaults;

/* Options for loading; a NULL options pointer means all defaults. */
typedef struct manta_spec_options {
    /* Overrides, each "path=value", applied in order after parsing and
     * before validation. The value is YAML (so `4`, `"4"`, `[a, b]`,
     * `{cpu: 2}` all work; empty is null). The first component is a
     * top-level key if the file has one or it is job, redis, log_dir, groups
     * or nodes; otherwise a group name, so `rollout.replicas=4` means
     * `groups.rollout.replicas=4`; otherwise an error. Missing mappings on
     * the way are created; sequence items are reached by index. */
    const char *const *sets;
    size_t n_sets;
    /* When set, a group without `library` must name a class for which this
     * returns true; otherwise class names are only checked for syntax. */
    bool (*class_exists)(const char *name, void *user);
    void *user;
    /* Sections the program's classes read, each a MAP or LIST declaration,
     * ending with {NULL}: checked as described above when some group runs
     * a built-in class (class_exists accepts it and the group has no
     * library), or always when class_exists is NULL; a spec of library
     * classes only may use these names freely. NULL: none. */
    const manta_spec_key *sections;
    /* The keys of a built-in group's settings (a group whose class
     * class_exists accepts and that has no library); with the keys of the
     * MANTA_SPEC_IN_SETTINGS sections, which may come nested or flat. NULL:
     * settings are not checked. */
    const manta_spec_key *settings;
    /* Defaults the program derives from the document itself (a value that
     * depends on other values, such as a group's GPU share when its model
     * runs on a GPU). Called once per load, after the overrides and before
     * validation, with the document as the overrides left it (not yet
     * checked: read it with the getters, which tolerate anything) and
     * `user`. It proposes values with manta_spec_default(); each is put in
     * only where the document has no value at that path (absent or null:
     * the file and --set always win), is then checked like any value of the
     * file, and is listed in the spec's `derived`. Returns 0, or a negative
     * MANTA_E* code that fails the load. NULL: none. */
    int (*defaults)(manta_spec_defaults *d, const manta_spec_node *root, void *user);
} manta_spec_options;

/* From a defaults callback: put `value` (YAML text, as the value of a
 * --set: "0.25", "{cpu: 2}") at the full dotted `path` ("groups.rollout.
 * resources.gpu"; no group shorthand) when the document has no value there,
 * making the mappings on the way. `why` (a phrase; copied) is recorded
 * with it. A path that runs into a scalar or a sequence without that item
 * is left alone (validation reports what is wrong there). Errors in the
 * value are located as (default):N:COL, N counting the defaults proposed.
 * Returns 1 when the value was put in, 0 when the document already has
 * one (or something else) there, MANTA_EINVAL (a NULL argument, an empty
 * path component, a value that is not YAML: errors appended) or
 * MANTA_ENOMEM. */
int manta_spec_default(manta_spec_defaults *d, const char *path, const char *value,
                       const char *why);

/* Read and load a spec file (at most MANTA_SPEC_MAX_FILE bytes). Returns the
 * spec, or NULL when there is any error, with every error found appended to
 * `errs` (initialised by the caller). With errs NULL the first error (and
 * whether more followed) goes to manta_last_error() with MANTA_ESPEC. */
manta_spec *manta_spec_load_file(const char *path, const manta_spec_options *opts,
                                 manta_spec_errors *errs);
/* The same from memory; `name` is used as the file name in errors and for
 * resolving relative libraries (NULL: "<spec>", resolved against "."). */
manta_spec *manta_spec_load_buffer(const char *buf, size_t len, const char *name,
                                   const manta_spec_options *opts, manta_spec_errors *errs);
/* Free the spec and everything in it. NULL is a no-op. */
void manta_spec_free(manta_spec *s);

/* The group named `name`, or NULL. */
const manta_spec_group *manta_spec_group_find(const manta_spec *s, const char *name);

/* ---- Serialisation (msgpack) ----------------------------------------------- *
 *
 * Encoding of a node tree:
 *   MAP    -> msgpack map, keys as str, in file order
 *   SEQ    -> msgpack array
 *   scalar -> by manta_spec_type: NULL -> nil, BOOL -> bool, INT -> int
 *             (smallest msgpack int; an INT beyond int64 goes as str),
 *             FLOAT -> float64, STR -> str (the bytes, UTF-8 as in the file)
 *   a NULL node -> nil
 */

/* Append `node` to a packer. 0, or MANTA_ENOMEM when the packer's write
 * fails. */
int manta_spec_node_pack(msgpack_packer *pk, const manta_spec_node *node);
/* `node` as a malloc'd msgpack buffer; the caller free()s *out. 0 or
 * MANTA_ENOMEM. */
int manta_spec_node_to_msgpack(const manta_spec_node *node, char **out, size_t *len);

/* The argument the launcher hands to init of replica `replica` of group
 * `g` (an index into s->groups): a msgpack map
 *   { "job": str, "group": str, "class": str, "replica": int, "replicas": int,
 *     "settings": map (empty when absent),
 *     "sections": { name: node, ... } }
 * where "sections" holds every free-form top-level section (everything
 * except job, redis, log_dir, groups and nodes), in file order.
 * The caller free()s *out. 0, MANTA_EINVAL on a bad index, or MANTA_ENOMEM. */
int manta_spec_init_payload(const manta_spec *s, size_t g, int replica, char **out, size_t *len);

/* ---- Placement ------------------------------------------------------------- */

/* What one group asks for: `replicas` copies of (cpu, gpu, memory). */
typedef struct manta_spec_demand {
    const char *group;
    int replicas;
    double cpu;
    double gpu;
    uint64_t memory_bytes;
} manta_spec_demand;

typedef enum manta_spec_fit {
    /* Each replica goes to the first node (in the given order) with room. */
    MANTA_SPEC_FIRST_FIT = 0,
    /* Each replica goes to the node with the least left after placing it:
     * fewest GPUs left, then least memory, then least CPU; ties to the
     * earlier node. Packs tightly and keeps big nodes free for big asks. */
    MANTA_SPEC_BEST_FIT = 1,
} manta_spec_fit;

/* The demands of a spec's groups, in group order, into out[s->n_groups]. */
void manta_spec_demands(const manta_spec *s, manta_spec_demand *out);
/* Sum of replicas over demands (the length node_of must have). */
size_t manta_spec_total_replicas(const manta_spec_demand *d, size_t n);

/* Place every replica of every demand onto `nodes` (whose fields say what
 * is free). Replicas are taken in demand order, replica 0 first; with
 * `decreasing`, largest first instead (by gpu, then memory, then cpu),
 * which packs better. node_of[k] receives the index into `nodes` of
 * replica k, where k counts replicas in demand order (demand 0's replicas,
 * then demand 1's ...), whatever the placing order.
 * Pure: no I/O, no global state; `nodes` is not modified.
 * Returns 0 when everything fits. Returns MANTA_ENOFIT when a replica does not fit,
 * with `why` naming it and what is left, e.g.
 *   group "learner" replica 2 of 2 (cpu 8, gpu 2, memory 16GiB) does not fit:
 *   free: a cpu 4 gpu 0 memory 8GiB; b cpu 8 gpu 1 memory 32GiB
 * and node_of unspecified. Returns MANTA_ENOMEM with why "out of memory" when
 * scratch space cannot be had. */
int manta_spec_place(const manta_spec_demand *demands, size_t n_demands,
                     const manta_spec_capacity *nodes, size_t n_nodes, manta_spec_fit fit,
                     bool decreasing, size_t *node_of, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif /* MANTA_SPEC_H */
