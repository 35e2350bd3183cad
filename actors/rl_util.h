/*
 * rl_util.h - small helpers shared by the RL actors (internal to actors/):
 * reading msgpack maps by key, packing key/value pairs, joining the HTTP
 * client to the actor's event loop, the clock, and the actor's settings.
 */
#ifndef RL_UTIL_H
#define RL_UTIL_H

#include <manta.h>
#include <manta_http.h>
#include <msgpack.h>

#include <stddef.h>
#include <stdint.h>

/* Unpack one msgpack object from untrusted bytes. First walks the bytes
 * without allocating and refuses (-1) a malformed or truncated object, or
 * one whose array/map headers announce more items than bytes remain, so a
 * few hostile bytes cannot make msgpack-c allocate gigabytes. 0 on success
 * (u then holds the object; the caller destroys u either way). */
int rl_unpack(msgpack_unpacked *u, const void *buf, size_t len);

/* Value of key in a msgpack map, or NULL (also when o is not a map). */
const msgpack_object *rl_mp_get(const msgpack_object *o, const char *key);
/* Dotted path through nested maps ("sections.model.n_layer"). */
const msgpack_object *rl_mp_path(const msgpack_object *o, const char *path);
int64_t rl_mp_int(const msgpack_object *o, int64_t def);
double rl_mp_num(const msgpack_object *o, double def);
/* A string value copied into out[cap] (def when absent or not a string). */
const char *rl_mp_str(const msgpack_object *o, char *out, size_t cap, const char *def);

void rl_pack_str(msgpack_packer *pk, const char *s);
void rl_pack_kv_int(msgpack_packer *pk, const char *k, int64_t v);
void rl_pack_kv_num(msgpack_packer *pk, const char *k, double v);
void rl_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void rl_pack_kv_bin(msgpack_packer *pk, const char *k, const void *p, size_t n);

/* Look a setting up first in the actor's group settings, then in a spec
 * section: rl_setting(args, "max_turns", "rl") reads settings.max_turns,
 * else sections.rl.max_turns. */
const msgpack_object *rl_setting(const msgpack_object *args, const char *key, const char *section);

/* Monotonic milliseconds / seconds. */
int64_t rl_now_ms(void);
double rl_now_s(void);

/* The HTTP client driven by the actor's event loop. */
typedef struct rl_http_glue {
    manta_ctx *ctx;
    manta_http_client *http;
    uint64_t timer;
} rl_http_glue;
/* Creates the client and joins it to the loop. 0 or -1. */
int rl_http_glue_start(rl_http_glue *g, manta_ctx *m, const manta_http_config *cfg);
void rl_http_glue_stop(rl_http_glue *g);

/* Print a line to stderr prefixed with the actor's name (goes to its log). */
void rl_log(manta_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
