/*
 * env.c - the env actor: turns tool calls into MCP tools/call requests to
 * external tool servers, many in flight at once on one event loop.
 *
 * Method "call" takes msgpack {tool: str, input: str} and answers later
 * (tool "" means: the tool the input names as "name:rest", else the first)
 * through manta_req_defer with {ok: bool, text: str, kind: str}: the tool's text,
 * or for any failure (timeout, refused connection, non-2xx, JSON-RPC error,
 * invalid JSON, the tool's own error) ok=false, kind the MCP error name and
 * text a short error observation for the policy. Failures are counted by
 * kind; nothing here stops the actor.
 *
 * Settings: sections.tools is a sequence of {name, url, tool, arg,
 * timeout_ms}: `name` is what the policy calls, `tool` the MCP tool name on
 * the server (default: name), `arg` the argument that receives the input
 * text (default "expression").
 *
 * "drain" stops taking calls (they are answered EBUSY "draining", and the
 * rollout sends them to another env), waits for the calls in flight, then
 * answers. "stats" answers the counters as msgpack.
 */
#include "manta_actors.h"
#include "mcp.h"
#include "rl_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOOLS 8

typedef struct env_tool {
    char name[32], tool[64], arg[32];
    mcp_client *mcp;
} env_tool;

typedef struct env_state {
    manta_ctx *m;
    rl_http_glue glue;
    env_tool tools[MAX_TOOLS];
    int n_tools;
    int draining;
    int in_flight;
    manta_req *drain_req; /* a deferred drain */
    uint64_t drain_timer;
    uint64_t calls, ok, errors, unknown_tool, by_kind[MANTA_ERR_COUNT];
} env_state;

typedef struct pending_call {
    env_state *s;
    manta_req *req;
} pending_call;

/* One entry of sections.tools: {name, url, tool, arg, timeout_ms}. */
static int read_tool(env_state *s, rl_args *a, uint32_t i, const msgpack_object *t)
{
    static const char *const keys[] = {"name", "url", "tool", "arg", "timeout_ms", NULL};
    char where[32], d[64];
    snprintf(where, sizeof where, "tools[%u]", i);
    if (t->type != MSGPACK_OBJECT_MAP)
        return rl_args_fail(a, "%s: expected a map, got %s", where, rl_mp_describe(t, d, sizeof d));
    for (uint32_t k = 0; k < t->via.map.size; k++) {
        const msgpack_object *key = &t->via.map.ptr[k].key;
        int known = 0;
        for (int j = 0; keys[j] && key->type == MSGPACK_OBJECT_STR; j++)
            known |= strlen(keys[j]) == key->via.str.size &&
                     !memcmp(keys[j], key->via.str.ptr, key->via.str.size);
        if (!known)
            return rl_args_fail(a, "%s.%.*s: unknown key (name, url, tool, arg, timeout_ms)", where,
                                key->type == MSGPACK_OBJECT_STR ? (int)key->via.str.size : 1,
                                key->type == MSGPACK_OBJECT_STR ? key->via.str.ptr : "?");
    }
    env_tool *et = &s->tools[s->n_tools];
    char url[512];
    const struct {
        const char *key;
        char *out;
        size_t cap;
        const char *def;
    } strs[] = {{"name", et->name, sizeof et->name, "calc"},
                {"tool", et->tool, sizeof et->tool, NULL},
                {"arg", et->arg, sizeof et->arg, "expression"},
                {"url", url, sizeof url, ""}};
    for (size_t j = 0; j < sizeof strs / sizeof strs[0]; j++) {
        const msgpack_object *v = rl_mp_get(t, strs[j].key);
        if (v && (v->type != MSGPACK_OBJECT_STR || v->via.str.size >= strs[j].cap))
            return rl_args_fail(a,
                                "%s.%s: expected a string of at most %zu bytes, "
                                "got %s",
                                where, strs[j].key, strs[j].cap - 1,
                                rl_mp_describe(v, d, sizeof d));
        rl_mp_str(v, strs[j].out, strs[j].cap, strs[j].def ? strs[j].def : et->name);
    }
    const msgpack_object *to = rl_mp_get(t, "timeout_ms");
    if (to && (to->type != MSGPACK_OBJECT_POSITIVE_INTEGER || to->via.u64 > 3600000))
        return rl_args_fail(a,
                            "%s.timeout_ms: expected milliseconds (0 to 3600000), "
                            "got %s",
                            where, rl_mp_describe(to, d, sizeof d));
    if (!url[0]) return rl_args_fail(a, "%s: no url", where);
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.url = url;
    cfg.timeout_ms = to ? (long)to->via.u64 : 10000;
    cfg.connect_timeout_ms = 2000;
    et->mcp = mcp_new(s->glue.http, &cfg);
    if (!et->mcp) return rl_args_fail(a, "%s: MCP client for %s failed", where, url);
    s->n_tools++;
    return 0;
}

static int env_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    env_state *s = state;
    s->m = m;
    rl_args a;
    rl_args_open(&a, args, len);
    manta_http_config hc;
    manta_http_config_init(&hc);
    if (!a.rc && rl_http_glue_start(&s->glue, m, &hc) != 0)
        rl_args_fail(&a, "env: %s", rl_last_error());
    const msgpack_object *tools = a.rc ? NULL : rl_mp_get(a.sections, "tools");
    if (tools && tools->type != MSGPACK_OBJECT_ARRAY && tools->type != MSGPACK_OBJECT_NIL)
        rl_args_fail(&a, "tools: expected a sequence of tools");
    else if (tools && tools->type == MSGPACK_OBJECT_ARRAY && tools->via.array.size > MAX_TOOLS)
        rl_args_fail(&a, "tools: %u tools, at most %d", tools->via.array.size, MAX_TOOLS);
    for (uint32_t i = 0;
         !a.rc && tools && tools->type == MSGPACK_OBJECT_ARRAY && i < tools->via.array.size; i++)
        read_tool(s, &a, i, &tools->via.array.ptr[i]);
    int rc = rl_args_close(&a, m);
    if (rc) return rc;
    if (s->n_tools == 0) rl_log(m, "env: no tools configured (sections.tools)");
    return 0;
}

static void env_fini(manta_ctx *m, void *state)
{
    env_state *s = state;
    if (s->drain_timer) manta_timer_cancel(m, s->drain_timer);
    for (int i = 0; i < s->n_tools; i++) mcp_free(s->tools[i].mcp);
    rl_http_glue_stop(&s->glue);
}

static void reply_obs(manta_req *req, int ok, const char *text, const char *kind)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    rl_pack_str(&pk, "ok");
    ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
    rl_pack_kv_str(&pk, "text", text);
    rl_pack_kv_str(&pk, "kind", kind);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static void drain_done(env_state *s);

static void on_tool(const mcp_result *r, void *arg)
{
    pending_call *p = arg;
    env_state *s = p->s;
    s->in_flight--;
    if (r->err == MANTA_OK) {
        s->ok++;
        reply_obs(p->req, 1, r->text ? r->text : "", "OK");
    } else {
        s->errors++;
        s->by_kind[manta_err_index(r->err)]++;
        manta_metric_add(manta_req_ctx(p->req), "tool_errors_total", manta_errname(r->err), 1);
        char obs[96];
        /* a short observation: the policy reads it as bytes */
        snprintf(obs, sizeof obs, "error: %s", manta_errname(r->err));
        reply_obs(p->req, 0, obs, manta_errname(r->err));
    }
    free(p);
    if (s->in_flight == 0) drain_done(s);
}

static int env_call(manta_req *req, void *state, const void *arg, size_t len)
{
    env_state *s = state;
    if (s->draining) return manta_reply_error(req, MANTA_EBUSY, "env draining");
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, arg, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL, "env call: not msgpack");
    }
    char tool[32], input[1024];
    const msgpack_object *to = rl_mp_get(&u.data, "tool"), *in = rl_mp_get(&u.data, "input");
    if (!to || !in || to->type != MSGPACK_OBJECT_STR || in->type != MSGPACK_OBJECT_STR ||
        to->via.str.size >= sizeof tool || in->via.str.size >= sizeof input) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL,
                                 "env call: tool (< %zu bytes) and input (< %zu bytes) must be "
                                 "strings",
                                 sizeof tool, sizeof input);
    }
    rl_mp_str(to, tool, sizeof tool, "");
    rl_mp_str(in, input, sizeof input, "");
    msgpack_unpacked_destroy(&u);
    s->calls++;
    env_tool *et = NULL;
    const char *text = input;
    if (!tool[0]) { /* the policy may name the tool: "<call>name:input</call>" */
        for (int i = 0; i < s->n_tools && !et; i++) {
            size_t nl = strlen(s->tools[i].name);
            if (!strncmp(input, s->tools[i].name, nl) && input[nl] == ':')
                et = &s->tools[i], text = input + nl + 1;
        }
        if (!et && s->n_tools) et = &s->tools[0]; /* else the first tool */
    } else {
        for (int i = 0; i < s->n_tools && !et; i++)
            if (!strcmp(s->tools[i].name, tool)) et = &s->tools[i];
    }
    if (!et) {
        s->unknown_tool++;
        s->errors++;
        manta_metric_add(manta_req_ctx(req), "tool_errors_total", "EUNKNOWN", 1);
        reply_obs(req, 0, "error: unknown tool", "EUNKNOWN");
        return 0;
    }
    manta_metric_add(manta_req_ctx(req), "tool_calls_total", et->name, 1);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, et->arg, text);
    pending_call *p = calloc(1, sizeof *p);
    if (!p || !a) {
        cJSON_Delete(a), free(p);
        return manta_reply_error(req, MANTA_ENOMEM, "env call: out of memory");
    }
    p->s = s;
    p->req = manta_req_defer(req);
    int rc = mcp_call_tool(et->mcp, et->tool, a, on_tool, p);
    cJSON_Delete(a);
    if (rc) {
        s->errors++;
        s->by_kind[manta_err_index(rc) > 0 ? manta_err_index(rc) : manta_err_index(MANTA_EINVAL)]++;
        manta_metric_add(manta_req_ctx(req), "tool_errors_total", manta_errname(rc), 1);
        reply_obs(p->req, 0, "error: EINVAL", manta_errname(rc));
        free(p);
        return 0;
    }
    s->in_flight++;
    return 0;
}

/* Answer a deferred drain: the calls in flight are done, or time is up. */
static void drain_done(env_state *s)
{
    if (!s->drain_req) return;
    if (s->drain_timer) manta_timer_cancel(s->m, s->drain_timer);
    s->drain_timer = 0;
    rl_log(s->m, "env drained (%d calls still in flight)", s->in_flight);
    manta_reply(s->drain_req, "ok", 2);
    s->drain_req = NULL;
}

static void drain_expired(void *arg)
{
    env_state *s = arg;
    s->drain_timer = 0;
    drain_done(s);
}

/* Stop taking calls; answer once those in flight are done (at most 30 s). */
static int env_drain(manta_req *req, void *state, const void *arg, size_t len)
{
    env_state *s = state;
    if (s->drain_req) return manta_reply_error(req, MANTA_EBUSY, "drain: already draining");
    s->draining = 1;
    if (s->in_flight == 0) return manta_reply(req, "ok", 2);
    s->drain_req = manta_req_defer(req);
    s->drain_timer = manta_timer_add(s->m, 30000, drain_expired, s);
    return 0;
}

static int env_stats(manta_req *req, void *state, const void *arg, size_t len)
{
    env_state *s = state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5 + MANTA_ERR_COUNT - 1);
    rl_pack_kv_int(&pk, "calls", (int64_t)s->calls);
    rl_pack_kv_int(&pk, "ok", (int64_t)s->ok);
    rl_pack_kv_int(&pk, "errors", (int64_t)s->errors);
    rl_pack_kv_int(&pk, "unknown_tool", (int64_t)s->unknown_tool);
    rl_pack_kv_int(&pk, "in_flight", s->in_flight);
    for (int k = 1; k < MANTA_ERR_COUNT; k++)
        rl_pack_kv_int(&pk, manta_errname(-k), (int64_t)s->by_kind[k]);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static const manta_method env_methods[] = {
    {"call", env_call}, {"drain", env_drain}, {"stats", env_stats}, {NULL, NULL}};

const manta_class rl_env_class = {"env", sizeof(env_state), env_init, env_fini, env_methods};
