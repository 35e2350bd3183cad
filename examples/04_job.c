/* Run: ./build/examples/04_job build/examples/user_class/user_class.yaml [--set PATH=VALUE]...
 *
 * A spec's job from C, through the job library (manta_job.h): what
 * `manta run SPEC` does, in a driver of your own. manta_job_start places
 * and starts every replica (and the spec's services), manta_job_wait calls
 * the spec's `run:` method and returns its answer; meanwhile the node
 * watchdog re-creates the actors of a node that dies on another node. */
#include <manta.h>
#include <manta_job.h>
#include <manta_spec.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    manta_ctx *m;
    if (manta_init(&m, &(manta_options){0}) != 0) { /* classes come from the spec's library: */
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    const char *sets[16];
    size_t n_sets = 0;
    for (int i = 2; i + 1 < argc && n_sets < 16; i += 2)
        if (!strcmp(argv[i], "--set")) sets[n_sets++] = argv[i + 1];
    manta_spec_errors errs;
    manta_spec_errors_init(&errs);
    manta_spec_options so = {.sets = sets, .n_sets = n_sets};
    manta_spec *spec = argc > 1 ? manta_spec_load_file(argv[1], &so, &errs) : NULL;
    manta_spec_errors_print(&errs, stderr);
    manta_spec_errors_destroy(&errs);
    manta_job_t *job = NULL;
    const void *reply;
    size_t len;
    int rc = spec ? manta_job_start(m, spec, NULL, &job) : MANTA_EINVAL;
    if (rc == 0) rc = manta_job_wait(job, -1, &reply, &len);
    if (rc == 0)
        printf("%.*s\n", (int)len, (const char *)reply);
    else
        fprintf(stderr, "04_job: %s\n", spec ? manta_last_error() : "give a spec file");
    manta_job_free(job);
    manta_spec_free(spec);
    manta_shutdown(m);
    return rc ? 1 : 0;
}
