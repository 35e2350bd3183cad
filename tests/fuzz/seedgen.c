/*
 * seedgen.c -- writes the seed corpora of the msgpack harnesses with the
 * repository's own encoders, so that the seeds are what the runtime really
 * sends: envelopes from mn_env_send (over an inproc ZeroMQ pair), spawn
 * requests as the launcher packs them, trajectories from rl_traj_encode and
 * the admit/step messages from their encoders.
 *
 *   fuzz_seedgen DIR    writes DIR/envelope, DIR/spawn, DIR/traj (which exist)
 *
 * The committed corpora under tests/fuzz/corpus were made with it; the
 * spec, SSE and safetensors seeds are files (see README.md).
 */
#include "internal.h"
#include "manta_actors.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static const char *dir;

static void put(const char *sub, const char *name, const void *prefix, size_t plen, const void *buf,
                size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (plen && fwrite(prefix, 1, plen, f) != plen) ||
        (len && fwrite(buf, 1, len, f) != len) || fclose(f)) {
        fprintf(stderr, "seedgen: cannot write %s\n", path);
        exit(1);
    }
}

static void *in_sock, *out_sock;

/* One envelope through the real encoder; the first frame is the seed. */
static void envelope(const char *sub, const char *name, int kind, uint64_t id, const char *method,
                     int status, const void *payload, size_t len)
{
    if (mn_env_send(out_sock, NULL, 0, kind, id, method, status, payload, len, NULL)) {
        fprintf(stderr, "seedgen: mn_env_send failed\n");
        exit(1);
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, in_sock, 0) < 0) exit(1);
    put(sub, name, NULL, 0, zmq_msg_data(&m), zmq_msg_size(&m));
    while (zmq_msg_more(&m)) { /* a payload frame: not part of the seed */
        zmq_msg_close(&m);
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, in_sock, 0) < 0) exit(1);
    }
    zmq_msg_close(&m);
}

static void pack_kv(msgpack_packer *pk, const char *k, const char *v)
{
    msgpack_pack_str(pk, strlen(k));
    msgpack_pack_str_body(pk, k, strlen(k));
    if (!v) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_str(pk, strlen(v));
    msgpack_pack_str_body(pk, v, strlen(v));
}

/* A spawn request as the launcher sends it, inside its call envelope. */
static void spawn(const char *name, const char *actor, const char *cls, const char *library,
                  int max_restarts, const void *args, size_t args_len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 6);
    pack_kv(&pk, "name", actor);
    pack_kv(&pk, "class", cls);
    pack_kv(&pk, "library", library);
    pack_kv(&pk, "exe", "/usr/local/bin/manta");
    msgpack_pack_str(&pk, 12);
    msgpack_pack_str_body(&pk, "max_restarts", 12);
    msgpack_pack_int(&pk, max_restarts);
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "args", 4);
    msgpack_pack_bin(&pk, args_len);
    msgpack_pack_bin_body(&pk, args, args_len);
    envelope("spawn", name, MN_CALL, 7, "spawn", 0, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static void traj_seeds(void)
{
    rl_traj t;
    rl_traj_init(&t);
    t.episode = 12, t.group = 3, t.prompt = 5;
    for (int i = 0; i < 6; i++) rl_traj_push(&t, 100 + i, 0, -1, 0, RL_SEG_PROMPT);
    for (int i = 0; i < 5; i++) rl_traj_push(&t, 200 + i, -0.5f * (float)i, 4, 1, RL_SEG_POLICY);
    for (int i = 0; i < 3; i++) rl_traj_push(&t, 300 + i, 0, -1, 0, RL_SEG_TOOL);
    for (int i = 0; i < 2; i++) rl_traj_push(&t, 400 + i, -1.25f, 5, 1, RL_SEG_POLICY);
    t.reward = 1, t.tool_calls = 1;
    snprintf(t.answer, sizeof t.answer, "42");
    snprintf(t.rollout, sizeof t.rollout, "rollout-0");
    char *buf;
    size_t len;
    unsigned char sel = 0;
    if (rl_traj_encode(&t, &buf, &len)) exit(1);
    put("traj", "traj_tool", &sel, 1, buf, len);
    free(buf);
    rl_traj_clear(&t);
    t.episode = 13, t.group = -1, t.eval = 1, t.status = RL_EP_ERROR, t.truncated = 1;
    rl_traj_push(&t, 1, 0, -1, 0, RL_SEG_PROMPT);
    snprintf(t.error, sizeof t.error, "tool server: timed out");
    if (rl_traj_encode(&t, &buf, &len)) exit(1);
    put("traj", "traj_error", &sel, 1, buf, len);
    free(buf);
    rl_traj_destroy(&t);

    rl_admit_req ar = {.groups = 2, .version = 9};
    snprintf(ar.rollout, sizeof ar.rollout, "rollout-1");
    sel = 1;
    if (rl_admit_req_encode(&ar, &buf, &len)) exit(1);
    put("traj", "admit_req", &sel, 1, buf, len);
    free(buf);

    rl_bucket bk[2] = {{.offset = 0, .count = 1000, .crc = 0xdeadbeef},
                       {.offset = 1000, .count = 24, .crc = 7}};
    memset(&bk[0].id, 0x11, sizeof bk[0].id);
    memset(&bk[1].id, 0x22, sizeof bk[1].id);
    bk[0].bf16 = 1;      /* rl.bucket_dtype bf16 */
    bk[1].has_share = 1; /* a copy in a learner's device memory (CUDA IPC) */
    memset(bk[1].share, 0x5a, sizeof bk[1].share);
    snprintf(bk[1].share_host, sizeof bk[1].share_host, "host/boot/1.2");
    bk[1].share_seq = 3, bk[1].share_off = 24;
    rl_admit_ep eps[2] = {
        {.episode = 1, .group = 0, .prompt = 4, .text = "2+2=", .reference = "4"},
        {.episode = 2, .group = -1, .prompt = 0, .eval = 1, .text = "3*7=", .reference = "21"}};
    rl_admit_reply rr = {
        .version = 10, .has_buckets = 1, .buckets = {bk, 2, 2}, .eps = eps, .n_eps = 2};
    sel = 2;
    if (rl_admit_reply_encode(&rr, &buf, &len)) exit(1);
    put("traj", "admit_reply", &sel, 1, buf, len);
    free(buf);

    int32_t tok[4] = {1, 2, 3, 4};
    float logp[4] = {0, -0.1f, -0.2f, -0.3f};
    uint8_t mask[4] = {0, 1, 1, 1};
    rl_step_item items[2] = {{.n = 4, .tok = tok, .logp = logp, .mask = mask, .adv = 0.5f},
                             {.n = 2, .tok = tok, .logp = logp, .mask = mask, .adv = -1}};
    rl_step_req sr = {.mode = RL_STEP_PPO, .version = 3, .lr = 1e-4, .items = items, .n_items = 2};
    sel = 3;
    if (rl_step_req_encode(&sr, &buf, &len)) exit(1);
    put("traj", "step_req", &sel, 1, buf, len);
    free(buf);
    items[0].logp = items[1].logp = NULL;
    sr.mode = RL_STEP_SFT;
    if (rl_step_req_encode(&sr, &buf, &len)) exit(1);
    put("traj", "step_req_sft", &sel, 1, buf, len);
    free(buf);

    rl_step_reply sp = {.version = 4, .buckets = {bk, 1, 1}, .loss = 0.7, .kl = 0.01, .tokens = 12};
    sel = 4;
    if (rl_step_reply_encode(&sp, &buf, &len)) exit(1);
    put("traj", "step_reply", &sel, 1, buf, len);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    void *ctx = zmq_ctx_new();
    in_sock = zmq_socket(ctx, ZMQ_PAIR);
    out_sock = zmq_socket(ctx, ZMQ_PAIR);
    if (zmq_bind(in_sock, "inproc://seed") || zmq_connect(out_sock, "inproc://seed")) return 1;

    envelope("envelope", "call", MN_CALL, 1, "ping", 0, "hello", 5);
    envelope("envelope", "call_nopayload", MN_CALL, 2, "stats", 0, NULL, 0);
    envelope("envelope", "cast", MN_CAST, 0, "log", 0, "x", 1);
    envelope("envelope", "reply", MN_REPLY, 1ull << 40, NULL, 0, "\x92\x01\xa2ok", 5);
    envelope("envelope", "error", MN_ERROR, 3, NULL, -22, "bad argument", 12);
    char big[MN_INLINE_MAX + 1];
    memset(big, 'b', sizeof big);
    envelope("envelope", "call_big", MN_CALL, 4, "put", 0, big, sizeof big);

    spawn("spawn_rollout", "rollout-0", "rollout", NULL, 3, "\x80", 1);
    spawn("spawn_library", "user-1", "counter", "./libcounter.so", -1, "", 0);
    envelope("spawn", "kill", MN_CALL, 8, "kill", 0, "1 rollout-0", 11);

    traj_seeds();
    zmq_close(in_sock);
    zmq_close(out_sock);
    mn_env_thread_done();
    zmq_ctx_term(ctx);
    return 0;
}
