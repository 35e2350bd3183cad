/*
 * keys_doc.c -- the documentation of declared spec sections as Markdown.
 *
 * The tables that the loader checks a spec against (manta_spec_key, in
 * manta_spec.h) are also the reference a user reads: this file writes them
 * as one Markdown table per section (and per nested mapping), so the docs
 * are generated from the same declarations and a test can hold the
 * checked-in copy to them.
 */
#include "manta_spec.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

static const char *type_name(const manta_spec_key *k, char *buf, size_t len)
{
    static const char *const names[] = {"any",  "integer", "number",  "string",
                                        "bool", "size",    "mapping", "list of mappings"};
    const char *base = (unsigned)k->type < sizeof names / sizeof names[0] ? names[k->type] : "?";
    if ((k->type == MANTA_SPEC_K_INT || k->type == MANTA_SPEC_K_NUM) && k->lo < k->hi) {
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, k->lo == floor(k->lo) && fabs(k->lo) < 1e15 ? "%.0f" : "%g", k->lo);
        snprintf(hi, sizeof hi, k->hi == floor(k->hi) && fabs(k->hi) < 1e15 ? "%.0f" : "%g", k->hi);
        snprintf(buf, len, "%s %s..%s", base, lo, hi);
    } else if (k->type == MANTA_SPEC_K_STR && k->choices) {
        snprintf(buf, len, "%s", k->choices);
        for (char *p = buf; *p; p++)
            if (*p == '|') *p = '/';
    } else {
        snprintf(buf, len, "%s", base);
    }
    return buf;
}

/* One table for the keys of `path`; nested mappings follow it. */
static void table(const char *path, const manta_spec_key *keys, FILE *out)
{
    fprintf(out, "| key | type | default | meaning |\n|---|---|---|---|\n");
    for (size_t i = 0; keys[i].name; i++) {
        const manta_spec_key *k = &keys[i];
        char t[96];
        fprintf(out, "| `%s` | %s | %s%s%s | %s%s |\n", k->name, type_name(k, t, sizeof t),
                k->def && k->def[0] != '(' ? "`" : "",
                k->def                             ? k->def
                : (k->flags & MANTA_SPEC_REQUIRED) ? "required"
                                                   : "none",
                k->def && k->def[0] != '(' ? "`" : "", k->doc ? k->doc : "",
                k->keys ? " (keys below)" : "");
    }
    for (size_t i = 0; keys[i].name; i++)
        if (keys[i].keys) {
            fprintf(out, "\n`%s.%s%s`:\n\n", path, keys[i].name,
                    keys[i].type == MANTA_SPEC_K_LIST ? "[]" : "");
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, keys[i].name);
            table(sub, keys[i].keys, out);
        }
}

int manta_spec_keys_markdown(const manta_spec_key *sections, FILE *out)
{
    for (size_t i = 0; sections && sections[i].name; i++) {
        const manta_spec_key *s = &sections[i];
        const char *doc = s->doc ? s->doc : "";
        fprintf(out, "### `%s`%s\n\n%c%s", s->name, s->type == MANTA_SPEC_K_LIST ? " (a list)" : "",
                doc[0] ? toupper((unsigned char)doc[0]) : ' ', doc[0] ? doc + 1 : "");
        if (s->flags & MANTA_SPEC_IN_SETTINGS)
            fprintf(out,
                    ". A built-in group's `settings` may give these keys too, nested "
                    "(`settings.%s.KEY`) or flat (`settings.KEY`); the group's value wins",
                    s->name);
        fprintf(out, ".\n\n");
        if (s->keys) table(s->name, s->keys, out);
        fprintf(out, "\n");
    }
    fflush(out);
    return ferror(out) ? MANTA_ESYS : 0;
}
