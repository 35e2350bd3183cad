/* Run: ./build/examples/01_ping_pong
 *
 * The smallest Manta program: one actor class with one method, one actor,
 * a few calls. The same executable is the driver and, started again by the
 * node agent, the actor: manta_init() returns only in the driver. */
#include <manta.h>

#include <stdio.h>
#include <string.h>

typedef struct counter {
    long pings;
} counter;

/* Answer "pong N" to every ping. */
static int ping(manta_req *call, void *state, const void *arg, size_t len)
{
    counter *c = state;
    char out[64];
    int n = snprintf(out, sizeof out, "pong %ld (%.*s)", ++c->pings, (int)len, (const char *)arg);
    return manta_reply(call, out, (size_t)n);
}

static const manta_method pinger_methods[] = {{"ping", ping}, {NULL, NULL}};
static const manta_class pinger = {"pinger", sizeof(counter), NULL, NULL, pinger_methods};
static const manta_class *const classes[] = {&pinger, NULL};

int main(void)
{
    manta_ctx *m;
    if (manta_init(&m, &(manta_options){.classes = classes}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    manta_actor *a;
    if (manta_actor_create(m, &(manta_actor_options){.cls = "pinger", .name = "pinger"}, &a)) {
        fprintf(stderr, "create: %s\n", manta_last_error());
        manta_shutdown(m);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        manta_future *f = manta_call(m, a, "ping", "hello", 5);
        const void *data;
        size_t len;
        rc = manta_get(f, 5000, &data, &len);
        if (rc == 0)
            printf("%.*s\n", (int)len, (const char *)data);
        else
            fprintf(stderr, "ping: %s: %s\n", manta_strerror(rc), manta_future_error(f));
        manta_future_free(f);
    }
    manta_shutdown(m);
    return rc ? 1 : 0;
}
