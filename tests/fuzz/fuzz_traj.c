/*
 * fuzz_traj.c -- libFuzzer harness for the RL messages that cross actors
 * (actors/traj.c, actors/msgs.c): the trajectory decoder and the decoders of
 * admit (request and reply) and step (request and reply). All of them read
 * untrusted msgpack.
 *
 * The first input byte selects the decoder (0: trajectory, 1: admit request,
 * 2: admit reply, 3: step request, 4: step reply, taken modulo 5); the rest
 * is the message. A trajectory that decodes is encoded again and must decode
 * to the same tokens (the codec is its own inverse).
 */
#include "manta_actors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void traj(const uint8_t *buf, size_t len)
{
    rl_traj t;
    rl_traj_init(&t);
    if (rl_traj_decode(&t, buf, len) == 0) {
        char text[512];
        rl_traj_render(&t, text, sizeof text);
        rl_traj_final_text(&t, text, sizeof text);
        (void)rl_traj_min_version(&t);
        (void)rl_traj_max_version(&t);
        (void)rl_traj_trained_tokens(&t);
        char *out = NULL;
        size_t n = 0;
        if (rl_traj_encode(&t, &out, &n) == 0) {
            rl_traj u;
            rl_traj_init(&u);
            if (rl_traj_decode(&u, out, n) != 0) abort();
            if (u.n != t.n || u.n_seg != t.n_seg ||
                (t.n && memcmp(u.tok, t.tok, (size_t)t.n * sizeof *t.tok)) ||
                (t.n && memcmp(u.mask, t.mask, (size_t)t.n)))
                abort();
            rl_traj_destroy(&u);
            free(out);
        }
    }
    rl_traj_destroy(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = data[0] % 5;
    size_t len = size - 1;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return 0;
    if (len) memcpy(buf, data + 1, len);
    switch (which) {
    case 0:
        traj(buf, len);
        break;
    case 1: {
        rl_admit_req r;
        (void)rl_admit_req_decode(&r, buf, len);
        break;
    }
    case 2: {
        rl_admit_reply r;
        if (rl_admit_reply_decode(&r, buf, len) == 0) rl_admit_reply_destroy(&r);
        break;
    }
    case 3: {
        rl_step_req r;
        if (rl_step_req_decode(&r, buf, len) == 0) rl_step_req_destroy(&r);
        break;
    }
    case 4: {
        rl_step_reply r;
        if (rl_step_reply_decode(&r, buf, len) == 0) rl_step_reply_destroy(&r);
        break;
    }
    }
    free(buf);
    return 0;
}
