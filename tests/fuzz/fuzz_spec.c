/*
 * fuzz_spec.c -- libFuzzer harness for the spec loader (runtime/spec/spec.c):
 * manta_spec_load_buffer parses YAML with libyaml, expands anchors and
 * aliases, applies `--set` overrides and validates. On success the tree is
 * also serialised the way the launcher does (manta_spec_init_payload for
 * every group).
 *
 * Inputs above 64 KiB are skipped: the spec's own size limit is 16 MiB, and
 * libFuzzer's -max_len keeps inputs far below it anyway.
 */
#include "manta_spec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options opts = {0};
    manta_spec *s = manta_spec_load_buffer(buf, size, "fuzz.yaml", &opts, &errs);
    if (s) {
        for (size_t i = 0; i < s->n_groups; i++) {
            char *p = NULL;
            size_t n = 0;
            if (manta_spec_init_payload(s, i, 0, &p, &n) == 0) free(p);
        }
        manta_spec_free(s);
    } else if (errs.count == 0) {
        abort(); /* a failed load names at least one error */
    }
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        manta_spec_errors_print(&errs, null);
        fclose(null);
    }
    manta_spec_errors_destroy(&errs);
    free(buf);
    return 0;
}
