/*
 * fuzz_safetensors.c -- libFuzzer harness for the safetensors reader
 * (kernels/safetensors.c), the path every checkpoint load takes (mk_load,
 * mk_load_dir): mk__st_open maps the file and parses its JSON header;
 * then each tensor the header names is looked up (mk__st_find), checked
 * against its own declared shape with F32/BF16/F16 allowed (mk__st_check)
 * and, when it passes, converted to float (mk__st_read), exactly the calls
 * mk_load makes for a model's tensors.
 *
 * The input is the whole file. It is handed over as a memfd
 * (/proc/self/fd/N), so nothing is written to disk.
 */
#include "mk_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) abort();
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    mk__st_file f;
    if (mk__st_open(&f, path) == MK_OK) {
        for (int i = 0; i < f.n_es; i++) {
            const mk__st_entry *e = &f.es[i];
            /* every entry is found by its name without the prefix */
            if (mk__st_find(&f, mk__st_strip(e->name)) == NULL) abort();
            if (e->ndim < 1 || e->ndim > 2) continue;
            int shape[2] = {0, 1};
            int ok = 1;
            for (int d = 0; d < e->ndim; d++) {
                if (e->shape[d] < 0 || e->shape[d] > (1 << 20))
                    ok = 0;
                else
                    shape[d] = (int)e->shape[d];
            }
            if (!ok) continue;
            size_t numel = (size_t)shape[0] * (size_t)shape[1];
            if (numel > (1u << 20)) continue;
            if (mk__st_check(&f, e, e->name, e->ndim, shape, 0) == MK_OK) {
                float *dst = malloc(numel ? numel * sizeof(float) : 1);
                if (!dst) abort();
                mk__st_read(dst, &f, e);
                free(dst);
            }
        }
        mk__st_close(&f);
    }
    close(fd);
    return 0;
}
