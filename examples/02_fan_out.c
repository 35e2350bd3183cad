/* Run: ./build/examples/02_fan_out [actors] [calls]
 *
 * Fan-out: spread many calls over several actors at once, then collect
 * them with manta_wait (k of n) and manta_get. Each actor squares numbers. */
#include <manta.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int square(manta_req *call, void *state, const void *arg, size_t len)
{
    if (len != sizeof(int64_t)) return manta_reply_error(call, MANTA_EINVAL, "want an int64");
    int64_t x;
    memcpy(&x, arg, sizeof x);
    x *= x;
    return manta_reply(call, &x, sizeof x);
}

static const manta_method methods[] = {{"square", square}, {NULL, NULL}};
static const manta_class squarer = {"squarer", 0, NULL, NULL, methods};
static const manta_class *const classes[] = {&squarer, NULL};

int main(int argc, char **argv)
{
    manta_ctx *m;
    if (manta_init(&m, &(manta_options){.classes = classes}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    int nact = argc > 1 ? atoi(argv[1]) : 4, ncalls = argc > 2 ? atoi(argv[2]) : 1000;
    if (nact < 1 || nact > 64 || ncalls < 1) {
        fprintf(stderr, "usage: %s [actors 1..64] [calls]\n", argv[0]);
        manta_shutdown(m);
        return 2;
    }
    manta_actor *actors[64];
    /* Start them all, then wait: the processes come up in parallel. */
    for (int i = 0; i < nact; i++) {
        manta_actor_options o = {.cls = "squarer", .no_wait = 1};
        if (manta_actor_create(m, &o, &actors[i])) {
            fprintf(stderr, "create: %s\n", manta_last_error());
            manta_shutdown(m);
            return 1;
        }
    }
    for (int i = 0; i < nact; i++) manta_actor_wait_ready(m, actors[i], 30000);
    manta_future **fs = calloc((size_t)ncalls, sizeof *fs);
    for (int64_t i = 0; i < ncalls; i++)
        fs[i] = manta_call(m, actors[i % nact], "square", &i, sizeof i);
    int first = manta_wait(fs, (size_t)ncalls, 1, 10000);
    int64_t sum = 0, want = 0;
    int bad = 0;
    for (int64_t i = 0; i < ncalls; i++) {
        const void *d;
        size_t n;
        int64_t v;
        if (manta_get(fs[i], 10000, &d, &n) == 0 && n == sizeof v) {
            memcpy(&v, d, sizeof v);
            sum += v;
        } else {
            bad++;
        }
        want += i * i;
        manta_future_free(fs[i]);
    }
    free(fs);
    printf("%d calls over %d actors (first wait saw %d done): sum of squares %lld (expected "
           "%lld), %d failed\n",
           ncalls, nact, first, (long long)sum, (long long)want, bad);
    manta_shutdown(m);
    return sum == want && !bad ? 0 : 1;
}
