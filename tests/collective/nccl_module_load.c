/*
 * nccl_module_load.c -- each libmanta_nccl.so named on the command line loads into a program
 * that exports the collectives' symbols (as `manta` does: ENABLE_EXPORTS), with RTLD_NOW so
 * that every symbol it needs from the program resolves at once, and gives the NCCL back-end's
 * table from manta_coll_nccl. No device needed: nothing is called but manta_coll_nccl.
 */
#include <manta_collective.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    /* the program itself uses the collectives, as `manta` does (its learner) */
    if (strcmp(manta_coll_zmq()->name, "zmq") != 0) return 1;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            failed = 1;
            continue;
        }
        const manta_coll_backend *(*get)(void);
        *(void **)&get = dlsym(h, "manta_coll_nccl");
        const manta_coll_backend *b = get ? get() : NULL;
        if (!b || strcmp(b->name, "nccl") != 0 || !b->open || !b->close || !b->broadcast ||
            !b->all_reduce || !b->reduce_scatter || !b->all_gather || !b->barrier) {
            fprintf(stderr, "%s: no NCCL back-end from manta_coll_nccl\n", argv[i]);
            failed = 1;
            continue;
        }
        printf("%s: manta_coll_nccl gives the '%s' back-end\n", argv[i], b->name);
    }
    return failed;
}
