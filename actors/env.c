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
    uint64_t calls, ok, errors, unknown_tool, by_kind[MANTA_ERR_COUNT];
} env_state;

typedef struct pending_call {
    env_state *s;
    manta_req *req;
} pending_call;

static int env_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    env_state *s = state;
    s->m = m;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, args, len) != 0) {
        msgpack_unpacked_destroy(&u);
        rl_log(m, "env: init arguments are not msgpack");
        return MANTA_EINVAL;
    }
    manta_http_config hc;
    manta_http_config_init(&hc);
    if (rl_http_glue_start(&s->glue, m, &hc)) {
        msgpack_unpacked_destroy(&u);
        return MANTA_ENOMEM;
    }
    const msgpack_object *tools = rl_mp_path(&u.data, "sections.tools");
    if (tools && tools->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < tools->via.array.size && s->n_tools < MAX_TOOLS; i++) {
            const msgpack_object *t = &tools->via.array.ptr[i];
            env_tool *et = &s->tools[s->n_tools];
            char url[512];
            rl_mp_str(rl_mp_get(t, "name"), et->name, sizeof et->name, "calc");
            rl_mp_str(rl_mp_get(t, "tool"), et->tool, sizeof et->tool, et->name);
            rl_mp_str(rl_mp_get(t, "arg"), et->arg, sizeof et->arg, "expression");
            rl_mp_str(rl_mp_get(t, "url"), url, sizeof url, "");
            if (!url[0]) {
                rl_log(m, "env: tools.%u has no url", i);
                continue;
            }
            mcp_config cfg;
            mcp_config_init(&cfg);
            cfg.url = url;
            cfg.timeout_ms = (long)rl_mp_int(rl_mp_get(t, "timeout_ms"), 10000);
            cfg.connect_timeout_ms = 2000;
            et->mcp = mcp_new(s->glue.http, &cfg);
            if (et->mcp) s->n_tools++;
        }
    }
    msgpack_unpacked_destroy(&u);
    if (s->n_tools == 0) rl_log(m, "env: no tools configured (sections.tools)");
    return 0;
}

static void env_fini(manta_ctx *m, void *state)
{
    env_state *s = state;
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
        char obs[96];
        /* a short observation: the policy reads it as bytes */
        snprintf(obs, sizeof obs, "error: %s", manta_errname(r->err));
        reply_obs(p->req, 0, obs, manta_errname(r->err));
    }
    free(p);
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
    rl_mp_str(rl_mp_get(&u.data, "tool"), tool, sizeof tool, "");
    rl_mp_str(rl_mp_get(&u.data, "input"), input, sizeof input, "");
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
        reply_obs(req, 0, "error: unknown tool", "EUNKNOWN");
        return 0;
    }
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
        reply_obs(p->req, 0, "error: EINVAL", manta_errname(rc));
        free(p);
        return 0;
    }
    s->in_flight++;
    return 0;
}

static int env_drain(manta_req *req, void *state, const void *arg, size_t len)
{
    env_state *s = state;
    s->draining = 1;
    int64_t until = rl_now_ms() + 30000;
    while (s->in_flight > 0 && rl_now_ms() < until) manta_poll(s->m, 10);
    rl_log(s->m, "env drained (%d calls still in flight)", s->in_flight);
    return manta_reply(req, "ok", 2);
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
