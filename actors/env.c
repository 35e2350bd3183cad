/*
 * env.c - the env actor: turns tool calls into MCP tools/call requests to
 * external tool servers, many in flight at once on one event loop.
 *
 * Method "call" takes msgpack {tool: str, input: str, format: str} and
 * answers later. format "text" (the default; the byte-level policy's
 * <call>input</call>): tool "" means the tool the input names as
 * "name:rest", else the first, and the tool's `arg` receives the text.
 * format "json" (a chat format's tool call, <tool_call>{...}</tool_call>):
 * the input is {"name": str, "arguments": {...}} (or "parameters"), parsed
 * with cJSON, and the arguments go to the named tool as they are; input that
 * is not such JSON, or names no tool, is answered at once as an error
 * observation for the policy ("error: the tool call is not JSON ...").
 * The answer comes through manta_req_defer with {ok: bool, text: str,
 * kind: str, outcome: str, message: str}: the tool's text, or for any failure
 * (timeout, refused connection, non-2xx, JSON-RPC error, invalid JSON, the
 * tool's own error) ok=false, kind the MCP error name and text a short error
 * observation for the policy. outcome says whose failure it was (mcp.h):
 * "ok", "policy" (an unknown tool, bad arguments, isError: an observation to
 * learn from) or "transport" (the server or network failed after the MCP
 * client's retries: the episode is dropped with `message` as its reason);
 * message is the tool's own text or the transport error. Failures are
 * counted by kind, the first few messages of each kind are logged and kept
 * for "stats"; nothing here stops the actor.
 *
 * Settings: sections.tools is a sequence of {name, url, tool, arg,
 * timeout_ms, max_connections, retries, backoff_ms, backoff_max_ms}: `name`
 * is what the policy calls, `tool` the MCP tool name on the server
 * (default: name), `arg` the argument that receives the input text
 * (default: the tool's one required string argument, from its inputSchema;
 * an error at start when it has none or several). Tools with the same url
 * share one MCP client, session and connection limit (the first entry's
 * settings); the session is ended when the actor stops.
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
    char url0[512]; /* the url as configured (the client's may move: redirects) */
    mcp_client *mcp;
    bool owns_mcp;        /* the first tool on its url: frees the shared client */
    int max_conn;         /* its max_connections */
    uint64_t queued_seen; /* the client's queued count when last looked at */
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
    mcp_errors tally; /* errors by kind with their first messages */
} env_state;

typedef struct pending_call {
    env_state *s;
    manta_req *req;
} pending_call;

/* A tool without `arg:`: its one required string argument, from the
 * server's tools/list, so that a wrong guess is an error at start. A server
 * not up yet (a transport failure) is not: the MCP client then finds the
 * argument before the first call, and a call fails, dropping its episode
 * with the reason, if the schema does not fit. */
static int find_text_arg(env_state *s, rl_args *a, env_tool *et, const char *where)
{
    char why[768];
    int rc = mcp_list_tools_wait(et->mcp, 5000, why, sizeof why);
    if (rc != MANTA_OK) {
        rl_log(s->m, "env: %s (%s): %s; its argument is found at the first call", where, et->name,
               why);
        return 0;
    }
    rc = mcp_tool_text_arg(mcp_tools(et->mcp), et->tool, et->arg, sizeof et->arg, why, sizeof why);
    if (rc != MANTA_OK)
        return rl_args_fail(a, "%s (%s): %s on %s; or set %s.arg", where, et->name, why,
                            mcp_url(et->mcp), where);
    rl_log(s->m, "env: %s (%s): the text goes to argument \"%s\" of tool %s (its inputSchema)",
           where, et->name, et->arg, et->tool);
    return 0;
}

/* One entry of sections.tools: {name, url, tool, arg, timeout_ms}. */
static int read_tool(env_state *s, rl_args *a, uint32_t i, const msgpack_object *t)
{
    char where[32], d[64];
    snprintf(where, sizeof where, "tools[%u]", i);
    if (t->type != MSGPACK_OBJECT_MAP)
        return rl_args_fail(a, "%s: expected a map, got %s", where, rl_mp_describe(t, d, sizeof d));
    for (uint32_t k = 0; k < t->via.map.size; k++) {
        const msgpack_object *key = &t->via.map.ptr[k].key;
        const manta_spec_key *tools = manta_spec_key_find(rl_spec_sections, "tools", 5);
        if (key->type != MSGPACK_OBJECT_STR ||
            !manta_spec_key_find(tools ? tools->keys : NULL, key->via.str.ptr, key->via.str.size))
            return rl_args_fail(a, "%s.%.*s: unknown key (see docs/spec-keys.md)", where,
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
                {"arg", et->arg, sizeof et->arg, ""},
                {"url", url, sizeof url, ""}};
    for (size_t j = 0; j < sizeof strs / sizeof strs[0]; j++) {
        if (rl_arg_declared(a, "tools", strs[j].key, MANTA_SPEC_K_STR, 0, strs[j].def, 0, 0))
            return a->rc;
        const msgpack_object *v = rl_mp_get(t, strs[j].key);
        if (v && (v->type != MSGPACK_OBJECT_STR || v->via.str.size >= strs[j].cap))
            return rl_args_fail(a,
                                "%s.%s: expected a string of at most %zu bytes, "
                                "got %s",
                                where, strs[j].key, strs[j].cap - 1,
                                rl_mp_describe(v, d, sizeof d));
        rl_mp_str(v, strs[j].out, strs[j].cap, strs[j].def ? strs[j].def : et->name);
    }
    mcp_config cfg;
    mcp_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 2000;
    const struct {
        const char *key;
        uint64_t lo, hi, def;
    } nums[] = {{"timeout_ms", 0, 3600000, (uint64_t)cfg.timeout_ms},
                {"max_connections", 1, 1024, (uint64_t)cfg.max_connections},
                {"retries", 0, 100, (uint64_t)cfg.max_retries},
                {"backoff_ms", 1, 600000, (uint64_t)cfg.backoff_ms},
                {"backoff_max_ms", 1, 3600000, (uint64_t)cfg.backoff_max_ms}};
    uint64_t val[5];
    for (size_t j = 0; j < 5; j++) {
        if (rl_arg_declared(a, "tools", nums[j].key, MANTA_SPEC_K_INT, (double)nums[j].def, NULL,
                            (double)nums[j].lo, (double)nums[j].hi))
            return a->rc;
        const msgpack_object *v = rl_mp_get(t, nums[j].key);
        if (v && (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 < nums[j].lo ||
                  v->via.u64 > nums[j].hi))
            return rl_args_fail(a, "%s.%s: expected an integer from %llu to %llu, got %s", where,
                                nums[j].key, (unsigned long long)nums[j].lo,
                                (unsigned long long)nums[j].hi, rl_mp_describe(v, d, sizeof d));
        val[j] = v ? v->via.u64 : nums[j].def;
    }
    if (!url[0]) return rl_args_fail(a, "%s: no url", where);
    for (int j = 0; j < s->n_tools && !et->mcp; j++) /* one client per server */
        if (!strcmp(mcp_url(s->tools[j].mcp), url) || !strcmp(s->tools[j].url0, url))
            et->mcp = s->tools[j].mcp;
    snprintf(et->url0, sizeof et->url0, "%s", url);
    et->max_conn = (int)val[1];
    if (!et->mcp) {
        cfg.url = url;
        cfg.timeout_ms = (long)val[0];
        cfg.max_connections = (int)val[1];
        cfg.max_retries = (int)val[2];
        cfg.backoff_ms = (long)val[3];
        cfg.backoff_max_ms = (long)val[4];
        et->mcp = mcp_new(s->glue.http, &cfg);
        et->owns_mcp = true;
        if (!et->mcp) return rl_args_fail(a, "%s: MCP client for %s failed", where, url);
    }
    s->n_tools++;
    if (!et->arg[0]) return find_text_arg(s, a, et, where);
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
    /* End the sessions on the servers (DELETE) before the HTTP client goes. */
    mcp_client *own[MAX_TOOLS];
    size_t n = 0;
    for (int i = 0; i < s->n_tools; i++)
        if (s->tools[i].owns_mcp) own[n++] = s->tools[i].mcp;
    if (s->glue.http) mcp_close_all(own, n, s->glue.http, 2000);
    rl_http_glue_stop(&s->glue);
}

static void reply_obs(manta_req *req, int ok, const char *text, const char *kind,
                      mcp_outcome outcome, const char *message)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    rl_pack_str(&pk, "ok");
    ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
    rl_pack_kv_str(&pk, "text", text);
    rl_pack_kv_str(&pk, "kind", kind);
    rl_pack_kv_str(&pk, "outcome", mcp_outcome_name(outcome));
    rl_pack_kv_str(&pk, "message", message);
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
        reply_obs(p->req, 1, r->text ? r->text : "", "OK", MCP_OUTCOME_OK, "");
    } else {
        s->errors++;
        s->by_kind[manta_err_index(r->err)]++;
        const char *kind = manta_errname(r->err);
        manta_metric_add(manta_req_ctx(p->req), "tool_errors_total", kind, 1);
        if (mcp_errors_add(&s->tally, kind, r->outcome, r->message))
            rl_log(s->m, "env: tool error %s (%s, %d attempts): %s", kind,
                   mcp_outcome_name(r->outcome), r->attempts, r->message);
        char obs[96];
        /* a short observation: the policy reads it as bytes */
        snprintf(obs, sizeof obs, "error: %s", kind);
        reply_obs(p->req, 0, obs, kind, r->outcome, r->message);
    }
    free(p);
    if (s->in_flight == 0) drain_done(s);
}

/* The tool a text call names: "name:input" picks tool `name`, anything else
 * goes to the first tool with the whole input; the tool's `arg` receives it. */
static env_tool *text_request(env_state *s, const char *input, const char **text)
{
    env_tool *et = NULL;
    *text = input;
    for (int i = 0; i < s->n_tools && !et; i++) {
        size_t nl = strlen(s->tools[i].name);
        if (!strncmp(input, s->tools[i].name, nl) && input[nl] == ':')
            et = &s->tools[i], *text = input + nl + 1;
    }
    if (!et && s->n_tools) et = &s->tools[0];
    return et;
}

/* A JSON call {"name": str, "arguments": {...}} (Llama 3 writes
 * "parameters"), as a chat format's tool call carries it. NULL with the
 * observation for the policy in obs when it is not one, or names no tool. */
static env_tool *json_request(env_state *s, const char *input, cJSON **args, char *obs, size_t cap)
{
    const char *at = NULL; /* where parsing stopped (not cJSON_GetErrorPtr: a global) */
    cJSON *j = cJSON_ParseWithOpts(input, &at, 0);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    env_tool *et = NULL;
    if (!j) {
        snprintf(obs, cap, "error: the tool call is not JSON (at byte %d)",
                 at ? (int)(at - input) : 0);
    } else if (!cJSON_IsObject(j) || !cJSON_IsString(name) || (a && !cJSON_IsObject(a))) {
        snprintf(obs, cap,
                 "error: the tool call must be {\"name\": string, \"arguments\": object}");
    } else {
        for (int i = 0; i < s->n_tools && !et; i++)
            if (!strcmp(s->tools[i].name, name->valuestring)) et = &s->tools[i];
        if (!et) snprintf(obs, cap, "error: unknown tool '%.40s'", name->valuestring);
        if (et && !(*args = a ? cJSON_Duplicate(a, 1) : cJSON_CreateObject())) et = NULL;
    }
    cJSON_Delete(j);
    return et;
}

/* Calls that waited for a connection of their MCP client (max_connections all on the wire):
 * counted (metric tool_calls_queued_total{kind=TOOL}) and said once per tool, since they hold
 * up every episode behind them. */
static void note_queued(env_state *s, env_tool *et)
{
    mcp_stats st;
    mcp_get_stats(et->mcp, &st);
    if (st.queued <= et->queued_seen) return;
    manta_metric_add(s->m, "tool_calls_queued_total", et->name,
                     (double)(st.queued - et->queued_seen));
    if (et->queued_seen == 0)
        rl_log(s->m,
               "env: tool %s: calls wait for a connection to %s: all %d of its max_connections "
               "are on the wire (raise the tool's max_connections, or add env replicas, to "
               "cover the episodes in flight: rollout replicas x slots)",
               et->name, et->url0, et->max_conn);
    et->queued_seen = st.queued;
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
    char tool[32], input[4096], format[8];
    const msgpack_object *to = rl_mp_get(&u.data, "tool"), *in = rl_mp_get(&u.data, "input"),
                         *fo = rl_mp_get(&u.data, "format");
    if (!to || !in || to->type != MSGPACK_OBJECT_STR || in->type != MSGPACK_OBJECT_STR ||
        to->via.str.size >= sizeof tool || in->via.str.size >= sizeof input ||
        (fo && (fo->type != MSGPACK_OBJECT_STR || fo->via.str.size >= sizeof format))) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL,
                                 "env call: tool (< %zu bytes), input (< %zu bytes) and format "
                                 "(\"text\" or \"json\", optional) must be strings",
                                 sizeof tool, sizeof input);
    }
    rl_mp_str(to, tool, sizeof tool, "");
    rl_mp_str(in, input, sizeof input, "");
    rl_mp_str(fo, format, sizeof format, "text");
    msgpack_unpacked_destroy(&u);
    if (strcmp(format, "text") && strcmp(format, "json"))
        return manta_reply_error(
            req, MANTA_EINVAL, "env call: format \"%s\" is neither \"text\" nor \"json\"", format);
    s->calls++;
    env_tool *et = NULL;
    cJSON *a = NULL;          /* format json: the arguments */
    const char *text = input; /* format text: what the tool's text argument receives */
    char obs[128] = "error: unknown tool";
    if (!strcmp(format, "json")) {
        et = json_request(s, input, &a, obs, sizeof obs);
    } else if (!tool[0]) { /* the policy may name the tool: "<call>name:input</call>" */
        et = text_request(s, input, &text);
    } else {
        for (int i = 0; i < s->n_tools && !et; i++)
            if (!strcmp(s->tools[i].name, tool)) et = &s->tools[i];
    }
    if (!et) { /* an observation for the policy, not a failure of the call */
        s->unknown_tool++;
        s->errors++;
        char msg[160];
        snprintf(msg, sizeof msg, "%s", obs + (strncmp(obs, "error: ", 7) ? 0 : 7));
        manta_metric_add(manta_req_ctx(req), "tool_errors_total", "EUNKNOWN", 1);
        if (mcp_errors_add(&s->tally, "EUNKNOWN", MCP_OUTCOME_POLICY, msg))
            rl_log(s->m, "env: tool error EUNKNOWN (policy): %s", msg);
        reply_obs(req, 0, obs, "EUNKNOWN", MCP_OUTCOME_POLICY, msg);
        return 0;
    }
    manta_metric_add(manta_req_ctx(req), "tool_calls_total", et->name, 1);
    pending_call *p = calloc(1, sizeof *p);
    if (!p) {
        cJSON_Delete(a);
        return manta_reply_error(req, MANTA_ENOMEM, "env call: out of memory");
    }
    p->s = s;
    p->req = manta_req_defer(req);
    int rc = a ? mcp_call_tool(et->mcp, et->tool, a, on_tool, p)
               : mcp_call_tool_text(et->mcp, et->tool, et->arg[0] ? et->arg : NULL, text,
                                    strlen(text), on_tool, p);
    cJSON_Delete(a);
    if (rc) {
        s->errors++;
        s->by_kind[manta_err_index(rc) > 0 ? manta_err_index(rc) : manta_err_index(MANTA_EINVAL)]++;
        manta_metric_add(manta_req_ctx(req), "tool_errors_total", manta_errname(rc), 1);
        reply_obs(p->req, 0, "error: EINVAL", manta_errname(rc), MCP_OUTCOME_TRANSPORT,
                  "the MCP client refused the call");
        free(p);
        return 0;
    }
    s->in_flight++;
    note_queued(s, et);
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
    msgpack_pack_map(&pk, 6 + MANTA_ERR_COUNT - 1);
    rl_pack_kv_int(&pk, "calls", (int64_t)s->calls);
    rl_pack_kv_int(&pk, "ok", (int64_t)s->ok);
    rl_pack_kv_int(&pk, "errors", (int64_t)s->errors);
    rl_pack_kv_int(&pk, "unknown_tool", (int64_t)s->unknown_tool);
    rl_pack_kv_int(&pk, "in_flight", s->in_flight);
    for (int k = 1; k < MANTA_ERR_COUNT; k++)
        rl_pack_kv_int(&pk, manta_errname(-k), (int64_t)s->by_kind[k]);
    /* errors_by_kind: {KIND: {outcome, count, first: [message...]}} */
    rl_pack_str(&pk, "errors_by_kind");
    msgpack_pack_map(&pk, (uint32_t)s->tally.n_kinds);
    for (int i = 0; i < s->tally.n_kinds; i++) {
        const mcp_error_kind *k = &s->tally.kinds[i];
        rl_pack_str(&pk, k->kind);
        msgpack_pack_map(&pk, 3);
        rl_pack_kv_str(&pk, "outcome", mcp_outcome_name(k->outcome));
        rl_pack_kv_int(&pk, "count", (int64_t)k->count);
        rl_pack_str(&pk, "first");
        msgpack_pack_array(&pk, (uint32_t)k->n_samples);
        for (int j = 0; j < k->n_samples; j++) rl_pack_str(&pk, k->samples[j]);
    }
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static const manta_method env_methods[] = {
    {"call", env_call}, {"drain", env_drain}, {"stats", env_stats}, {NULL, NULL}};

const manta_class rl_env_class = {"env", sizeof(env_state), env_init, env_fini, env_methods};

/* Adds one env's errors_by_kind (msgpack, as "stats" packs it) into e. */
static void merge_kinds(mcp_errors *e, const msgpack_object *kinds)
{
    if (!kinds || kinds->type != MSGPACK_OBJECT_MAP) return;
    for (uint32_t i = 0; i < kinds->via.map.size; i++) {
        const msgpack_object *key = &kinds->via.map.ptr[i].key, *v = &kinds->via.map.ptr[i].val;
        char kind[16], outcome[16];
        if (key->type != MSGPACK_OBJECT_STR) continue;
        rl_mp_str(key, kind, sizeof kind, "?");
        rl_mp_str(rl_mp_get(v, "outcome"), outcome, sizeof outcome, "transport");
        mcp_outcome o = !strcmp(outcome, "policy") ? MCP_OUTCOME_POLICY : MCP_OUTCOME_TRANSPORT;
        int64_t count = rl_mp_int(rl_mp_get(v, "count"), 0);
        const msgpack_object *first = rl_mp_get(v, "first");
        uint32_t nf = first && first->type == MSGPACK_OBJECT_ARRAY ? first->via.array.size : 0;
        /* The samples first (each counts one), then the rest of the count. */
        for (uint32_t j = 0; j < nf && (int64_t)j < count; j++) {
            char msg[MCP_ERRORS_TEXT];
            rl_mp_str(&first->via.array.ptr[j], msg, sizeof msg, "");
            mcp_errors_add(e, kind, o, msg);
        }
        for (int k = 0; k < e->n_kinds; k++)
            if (!strcmp(e->kinds[k].kind, kind) && count > (int64_t)nf) {
                e->kinds[k].count += (uint64_t)(count - (int64_t)nf);
                e->total += (uint64_t)(count - (int64_t)nf);
            }
    }
}

cJSON *rl_env_errors_json(manta_ctx *m, const char *group, int timeout_ms)
{
    mcp_errors e;
    memset(&e, 0, sizeof e);
    for (int i = 0; i < 1024; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s-%d", group, i);
        manta_actor *a;
        if (manta_actor_lookup(m, name, &a)) break;
        manta_future *f = manta_call_timeout(m, a, "stats", "", 0, timeout_ms);
        const void *d;
        size_t n;
        if (f && manta_get(f, timeout_ms, &d, &n) == 0) {
            msgpack_unpacked u;
            msgpack_unpacked_init(&u);
            if (rl_unpack(&u, d, n) == 0) merge_kinds(&e, rl_mp_get(&u.data, "errors_by_kind"));
            msgpack_unpacked_destroy(&u);
        }
        manta_future_free(f);
    }
    return mcp_errors_json(&e);
}
