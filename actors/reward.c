/*
 * reward.c - the reward actor: scores a finished episode's final answer
 * against the reference.
 *
 * Method "score" takes msgpack {answer: str, reference: str} and answers
 * {reward: float, ok: bool}. The rule comes from sections.reward (or the
 * group's settings):
 *   rule: exact     1 when the trimmed answer equals the reference, else 0;
 *   rule: numeric   1 when both parse as numbers and |a - r| <= tol *
 *                   max(1, |r|) (tol from `tolerance`, default 1e-6);
 *   rule: http      POST {"response", "reference"} as JSON to `url`; the
 *                   service answers {"reward": x}. Timeouts, bad statuses
 *                   and bad JSON answer ok=false (the controller drops the
 *                   episode with that reason) and are counted.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RULE_EXACT, RULE_NUMERIC, RULE_HTTP };

typedef struct reward_state {
    manta_ctx *m;
    int rule;
    double tol;
    char url[512];
    rl_http_glue glue;
    uint64_t scored, http_errors;
} reward_state;

static int reward_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    reward_state *s = state;
    s->m = m;
    rl_args a;
    rl_args_open(&a, args, len);
    char rule[32];
    rl_arg_str(&a, "reward", "rule", rule, sizeof rule, "exact");
    s->tol = rl_arg_num(&a, "reward", "tolerance", 1e-6, 0, 1e300);
    rl_arg_str(&a, "reward", "url", s->url, sizeof s->url, "");
    if (!strcmp(rule, "exact"))
        s->rule = RULE_EXACT;
    else if (!strcmp(rule, "numeric"))
        s->rule = RULE_NUMERIC;
    else if (!strcmp(rule, "http") && s->url[0])
        s->rule = RULE_HTTP;
    else if (!strcmp(rule, "http"))
        rl_arg_error(&a, "reward", "rule", "http needs reward.url");
    else
        rl_arg_error(&a, "reward", "rule", "\"%s\" is not a rule (exact, numeric, http)", rule);
    int rc = rl_args_close(&a, m);
    if (rc) return rc;
    if (s->rule == RULE_HTTP) {
        manta_http_config hc;
        manta_http_config_init(&hc);
        hc.timeout_ms = 10000;
        if ((rc = rl_http_glue_start(&s->glue, m, &hc))) {
            rl_log(m, "reward: %s", rl_last_error());
            return rc;
        }
    }
    return 0;
}

static void reward_fini(manta_ctx *m, void *state)
{
    reward_state *s = state;
    rl_http_glue_stop(&s->glue);
}

static int parse_num(const char *s, double *out)
{
    char *end;
    while (*s == ' ') s++;
    if (!*s) return -1;
    *out = strtod(s, &end);
    while (*end == ' ') end++;
    return *end ? -1 : 0;
}

/* The pure rules, also used by tests through rl_reward_rule(). */
float rl_reward_rule(const char *rule, double tol, const char *answer, const char *ref)
{
    if (!strcmp(rule, "numeric")) {
        double a, r;
        if (parse_num(answer, &a) || parse_num(ref, &r)) return 0;
        return fabs(a - r) <= tol * fmax(1.0, fabs(r)) ? 1.0f : 0.0f;
    }
    return !strcmp(answer, ref) ? 1.0f : 0.0f;
}

static void reply_reward(manta_req *req, float r, int ok)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    rl_pack_str(&pk, "reward");
    msgpack_pack_float(&pk, r);
    rl_pack_str(&pk, "ok");
    ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

typedef struct http_pending {
    reward_state *s;
    manta_req *req;
} http_pending;

static void on_http(const manta_http_result *res, void *arg)
{
    http_pending *p = arg;
    float r = 0;
    int ok = 0;
    if (res->err == MANTA_OK && res->status / 100 == 2) {
        cJSON *j = cJSON_ParseWithLength(res->body, res->body_len);
        const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "reward") : NULL;
        if (cJSON_IsNumber(v)) r = (float)v->valuedouble, ok = 1;
        cJSON_Delete(j);
    }
    if (!ok) p->s->http_errors++;
    reply_reward(p->req, r, ok);
    free(p);
}

static int reward_score(manta_req *req, void *state, const void *arg, size_t len)
{
    reward_state *s = state;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, arg, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL, "score: not msgpack");
    }
    char answer[256], ref[256];
    const msgpack_object *ao = rl_mp_get(&u.data, "answer"), *ro = rl_mp_get(&u.data, "reference");
    if (!ao || !ro || ao->type != MSGPACK_OBJECT_STR || ro->type != MSGPACK_OBJECT_STR ||
        ao->via.str.size >= sizeof answer || ro->via.str.size >= sizeof ref) {
        msgpack_unpacked_destroy(&u);
        return manta_reply_error(req, MANTA_EINVAL,
                                 "score: answer and reference must be strings of at most %zu bytes",
                                 sizeof answer - 1);
    }
    rl_mp_str(ao, answer, sizeof answer, "");
    rl_mp_str(ro, ref, sizeof ref, "");
    msgpack_unpacked_destroy(&u);
    s->scored++;
    if (s->rule != RULE_HTTP) {
        reply_reward(
            req, rl_reward_rule(s->rule == RULE_NUMERIC ? "numeric" : "exact", s->tol, answer, ref),
            1);
        return 0;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "response", answer);
    cJSON_AddStringToObject(j, "reference", ref);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    http_pending *p = calloc(1, sizeof *p);
    if (!body || !p) {
        free(body), free(p);
        return manta_reply_error(req, MANTA_ENOMEM, "score: out of memory");
    }
    static const char *const hdr[] = {"Content-Type: application/json"};
    manta_http_request hr;
    manta_http_request_init(&hr);
    hr.url = s->url;
    hr.headers = hdr, hr.n_headers = 1;
    hr.body = body, hr.body_len = strlen(body);
    p->s = s;
    p->req = manta_req_defer(req);
    if (manta_http_submit(s->glue.http, &hr, on_http, p, NULL)) {
        s->http_errors++;
        reply_reward(p->req, 0, 0);
        free(p);
    }
    free(body);
    return 0;
}

static const manta_method reward_methods[] = {{"score", reward_score}, {NULL, NULL}};

const manta_class rl_reward_class = {"reward", sizeof(reward_state), reward_init, reward_fini,
                                     reward_methods};
