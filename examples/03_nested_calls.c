/* Run: ./build/examples/03_nested_calls
 *
 * An actor that calls another actor while serving a call, and two actors
 * that call each other (A -> B -> A). Because a method waiting on a future
 * keeps serving its mailbox, neither deadlocks. */
#include <manta.h>

#include <stdio.h>
#include <string.h>

typedef struct peer_state {
    char peer[64]; /* name of the actor to ask, set by init */
} peer_state;

static int init(manta_ctx *m, void *state, const void *args, size_t len)
{
    peer_state *s = state;
    snprintf(s->peer, sizeof s->peer, "%.*s", (int)len, (const char *)args);
    return 0;
}

/* depth N: if N > 0 ask the peer for depth N-1 and add one to its answer. */
static int depth(manta_req *call, void *state, const void *arg, size_t len)
{
    peer_state *s = state;
    int n = 0;
    if (len == sizeof n) memcpy(&n, arg, sizeof n);
    if (n <= 0) {
        int zero = 0;
        return manta_reply(call, &zero, sizeof zero);
    }
    manta_ctx *m = manta_req_ctx(call);
    manta_actor *peer;
    int rc = manta_actor_lookup(m, s->peer, &peer);
    if (rc) return rc;
    int next = n - 1;
    manta_future *f = manta_call(m, peer, "depth", &next, sizeof next);
    const void *d;
    size_t dl;
    rc = manta_get(f, 5000, &d, &dl);
    int got = 0;
    if (rc == 0 && dl == sizeof got) memcpy(&got, d, sizeof got);
    manta_future_free(f);
    if (rc) return manta_reply_error(call, rc, "peer %s: %s", s->peer, manta_strerror(rc));
    got += 1;
    return manta_reply(call, &got, sizeof got);
}

static const manta_method methods[] = {{"depth", depth}, {NULL, NULL}};
static const manta_class bouncer = {"bouncer", sizeof(peer_state), init, NULL, methods};
static const manta_class *const classes[] = {&bouncer, NULL};

int main(void)
{
    manta_ctx *m;
    if (manta_init(&m, &(manta_options){.classes = classes}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    manta_actor *a, *b;
    int rc = manta_actor_create(
        m, &(manta_actor_options){.cls = "bouncer", .name = "A", .args = "B", .args_len = 1}, &a);
    if (!rc)
        rc = manta_actor_create(
            m, &(manta_actor_options){.cls = "bouncer", .name = "B", .args = "A", .args_len = 1},
            &b);
    if (rc) {
        fprintf(stderr, "create: %s\n", manta_last_error());
        manta_shutdown(m);
        return 1;
    }
    int n = 10, got = -1;
    manta_future *f = manta_call(m, a, "depth", &n, sizeof n);
    const void *d;
    size_t len;
    rc = manta_get(f, 10000, &d, &len);
    if (rc == 0 && len == sizeof got) memcpy(&got, d, sizeof got);
    printf("A -> B -> A ... %d levels deep: answer %d (%s)\n", n, got,
           rc ? manta_future_error(f) : "ok");
    manta_future_free(f);
    manta_shutdown(m);
    return rc == 0 && got == n ? 0 : 1;
}
