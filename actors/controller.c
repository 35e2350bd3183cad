/*
 * controller.c - the controller: the data, the staleness bound, the ledger,
 * the batches, the training loop and the metrics.
 *
 * Methods served to the other actors (the pull model: nothing needs to know
 * who the rollouts are):
 *   "admit"    {rollout, groups, version} -> {version, buckets (when the
 *              caller is behind), episodes: [{episode, group, prompt, text,
 *              reference, eval}], stop}. Whole GRPO groups (G episodes of one
 *              prompt) are admitted while admitted + G <= (V + eta + 1) * B
 *              (rl_admit_ok). Episodes handed back by a draining rollout and
 *              held-out evaluation episodes go out first; neither counts as a
 *              new admission.
 *   "submit"   a trajectory (README.md, "Trajectory schema"): evaluation
 *              results are tallied; training episodes end as dropped (error,
 *              or too stale: rl_is_stale) or wait in their group until the
 *              group is complete.
 *   "handback" {rollout, episodes: [ids]}: episodes re-queued.
 *   "status"   a JSON text: version, ledger, rates.
 * and "run", called once by the launcher: supervised warm-up on the
 * demonstrations (if any), publication of version 0, a held-out evaluation
 * (the baseline), then the RL loop: wait for B episodes in complete groups,
 * drop stale ones, GRPO advantages, one step on every learner shard at once,
 * version V+1 published (the shards' buckets), metrics line. Every
 * `eval_every` versions a held-out evaluation runs alongside; the loop ends at
 * `max_versions`, at `max_time_s`, or when an evaluation reaches `stop_at`.
 * A final evaluation on the held-out set follows; metrics.jsonl and
 * summary.json go into the run folder; the reply is the summary (JSON).
 *
 * The ledger lives here and is written in summary.json (and in every
 * metrics line): admitted = trained + dropped_stale + dropped_error +
 * in_flight, where in_flight counts episodes admitted but neither trained nor
 * dropped when the job stops. Dropped episodes give their admission back, so
 * a batch whose episodes failed is admitted again rather than stalling.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_LEARNERS 64
#define MAX_REASONS  8
#define STALE_BINS   10

enum { EP_INFLIGHT = 0, EP_QUEUED, EP_DONE, EP_TRAINED, EP_STALE, EP_ERROR, EP_EVAL, EP_EVAL_DONE };

#define MAX_WBUCKETS 1024

/* A weight bucket: an object holding params [offset, offset + count). */
typedef struct wbucket {
    char id[48];
    int64_t offset, count;
    uint32_t crc;
} wbucket;

typedef struct problem {
    char *text;
    char *answer;
} problem;

typedef struct demo {
    int n;
    int32_t *tok;
    uint8_t *mask;
} demo;

typedef struct group {
    int32_t prompt;
    int n, resolved; /* members, members resolved */
    int64_t first_ep;
    rl_traj *trajs; /* n of them; a trajectory with tok==NULL is not usable */
    uint8_t *usable;
    int ready;
} group;

typedef struct episode {
    uint8_t state;
    int16_t holder; /* index into holders: the rollout generating it, -1 none */
    int64_t group;  /* -1 for evaluation episodes */
    int32_t prompt;
} episode;

#define MAX_HOLDERS 256

/* A rollout that took work, and the incarnation that took it: when it dies
 * (or restarts as a new incarnation) its episodes are re-queued. */
typedef struct holder {
    char name[64];
    int incarnation;
    int live;
} holder;

typedef struct ctl_state {
    manta_ctx *m;
    char job[64], run_dir[512];
    /* settings */
    int G, B, eta, S;
    double lr, warmup_lr;
    int warmup_steps, warmup_max;
    int max_versions, eval_every, eval_n;
    double max_time_s, stop_at;
    char learner_group[32];
    char train_path[512], heldout_path[512], demos_path[512];
    /* data */
    problem *train, *heldout;
    int n_train, n_heldout;
    demo *demos;
    int n_demos;
    int next_train;
    /* episodes and groups */
    episode *eps;
    int64_t n_eps, cap_eps;
    group *groups;
    int64_t n_groups, cap_groups;
    int64_t *queue; /* handed-back episodes to re-issue */
    int64_t q_head, q_len, q_cap;
    int64_t *ready; /* group ids complete, in order */
    int64_t r_head, r_len, r_cap;
    int64_t ready_eps; /* usable episodes in ready groups */
    /* eval */
    int eval_logged;
    int eval_active, eval_next, eval_total, eval_done, eval_success;
    int32_t eval_vmin, eval_vmax;
    int64_t *eval_queue;
    int64_t eq_len, eq_head;
    /* policy */
    int64_t version;
    wbucket buckets[MAX_WBUCKETS]; /* the current version's weights */
    int n_buckets;
    int have_weights;
    int admit_train, stop;
    holder holders[MAX_HOLDERS];
    int n_holders;
    int64_t reclaimed;
    double last_reclaim;
    /* ledger and counters */
    rl_ledger led;
    int64_t credits; /* admissions given back by drops */
    char reason[MAX_REASONS][96];
    int64_t reason_n[MAX_REASONS];
    int64_t stale_hist[STALE_BINS];
    int64_t tool_calls, tool_errors, gen_tokens, trained_tokens, zero_var_groups, duplicates;
    int64_t v_tool_calls, v_tool_errors, v_gen_tokens;
    double t_start, t_rl_start, learner_busy_s, t_last_version;
    FILE *metrics;
    FILE *traj_dump; /* the first trajectories submitted, for inspection and tests */
    int n_dumped;
    double success_initial, success_final, best_eval;
} ctl_state;

/* ---- data ---- */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int load_problems(const char *path, problem **out, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int cap = 0;
    *out = NULL, *n = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
        if (cJSON_IsString(p) && cJSON_IsString(a)) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 256;
                problem *np = realloc(*out, (size_t)cap * sizeof *np);
                if (!np) break;
                *out = np;
            }
            (*out)[*n].text = xstrdup(p->valuestring);
            (*out)[*n].answer = xstrdup(a->valuestring);
            (*n)++;
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return 0;
}

static void demo_push(demo *d, int32_t tok, uint8_t mask)
{
    d->tok[d->n] = tok, d->mask[d->n] = mask, d->n++;
}

/* A demonstration: {"prompt": str, "segments": [["policy"|"tool", text]]}.
 * In policy text "<call>" and "</call>" are the tool-call tokens; EOS ends the
 * last policy segment; tool text is followed by '\n' as the rollout does. */
static int load_demos(ctl_state *s, const char *path, int max)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    s->demos = calloc((size_t)max, sizeof *s->demos);
    while (s->demos && s->n_demos < max && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *segs = cJSON_GetObjectItemCaseSensitive(j, "segments");
        if (!cJSON_IsString(p) || !cJSON_IsArray(segs)) {
            cJSON_Delete(j);
            continue;
        }
        demo *d = &s->demos[s->n_demos];
        d->tok = calloc(1024, sizeof *d->tok), d->mask = calloc(1024, 1);
        if (!d->tok || !d->mask) {
            cJSON_Delete(j);
            break;
        }
        demo_push(d, RL_TOK_BOS, 0);
        for (const char *c = p->valuestring; *c && d->n < 1000; c++)
            demo_push(d, (unsigned char)*c, 0);
        const cJSON *seg;
        cJSON_ArrayForEach(seg, segs)
        {
            const cJSON *kind = cJSON_GetArrayItem(seg, 0), *text = cJSON_GetArrayItem(seg, 1);
            if (!cJSON_IsString(kind) || !cJSON_IsString(text)) continue;
            int pol = !strcmp(kind->valuestring, "policy");
            for (const char *c = text->valuestring; *c && d->n < 1000;) {
                if (pol && !strncmp(c, "<call>", 6)) {
                    demo_push(d, RL_TOK_CALL, 1), c += 6;
                } else if (pol && !strncmp(c, "</call>", 7)) {
                    demo_push(d, RL_TOK_END, 1), c += 7;
                } else {
                    demo_push(d, (unsigned char)*c, (uint8_t)pol), c++;
                }
            }
            if (!pol) demo_push(d, '\n', 0);
        }
        demo_push(d, RL_TOK_EOS, 1);
        s->n_demos++;
        cJSON_Delete(j);
    }
    fclose(f);
    return 0;
}

/* ---- init ---- */

static int ctl_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    ctl_state *s = state;
    s->m = m;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, args, len) != 0) {
        msgpack_unpacked_destroy(&u);
        return MANTA_EINVAL;
    }
    const msgpack_object *a = &u.data;
    rl_mp_str(rl_mp_get(a, "job"), s->job, sizeof s->job, "job");
    s->G = (int)rl_mp_int(rl_setting(a, "group_size", "rl"), 8);
    s->B = (int)rl_mp_int(rl_setting(a, "batch_episodes", "rl"), 64);
    s->eta = (int)rl_mp_int(rl_setting(a, "eta", "rl"), 2);
    s->lr = rl_mp_num(rl_setting(a, "lr", "rl"), 1e-3);
    s->warmup_lr = rl_mp_num(rl_setting(a, "warmup_lr", "rl"), s->lr);
    s->warmup_steps = (int)rl_mp_int(rl_setting(a, "warmup_steps", "rl"), 0);
    s->warmup_max = (int)rl_mp_int(rl_setting(a, "warmup_batch", "rl"), 64);
    s->max_versions = (int)rl_mp_int(rl_setting(a, "max_versions", "rl"), 100);
    s->max_time_s = rl_mp_num(rl_setting(a, "max_time_s", "rl"), 600);
    s->eval_every = (int)rl_mp_int(rl_setting(a, "eval_every", "rl"), 10);
    s->eval_n = (int)rl_mp_int(rl_setting(a, "eval_problems", "rl"), 200);
    s->stop_at = rl_mp_num(rl_setting(a, "stop_at", "rl"), 2.0);
    rl_mp_str(rl_setting(a, "learner_group", NULL), s->learner_group, sizeof s->learner_group,
              "learner");
    s->S = (int)rl_mp_int(rl_setting(a, "learners", NULL), 0);
    char dflt[128];
    snprintf(dflt, sizeof dflt, "runs/%s", s->job);
    rl_mp_str(rl_setting(a, "run_dir", "rl"), s->run_dir, sizeof s->run_dir, dflt);
    rl_mp_str(rl_setting(a, "train", "task"), s->train_path, sizeof s->train_path, "");
    rl_mp_str(rl_setting(a, "heldout", "task"), s->heldout_path, sizeof s->heldout_path, "");
    rl_mp_str(rl_setting(a, "demos", "task"), s->demos_path, sizeof s->demos_path, "");
    msgpack_unpacked_destroy(&u);
    if (s->G < 1 || s->B < s->G || s->eta < 0) {
        rl_log(m, "controller: need group_size >= 1, batch_episodes >= group_size, eta >= 0");
        return MANTA_EINVAL;
    }
    if (load_problems(s->train_path, &s->train, &s->n_train) || s->n_train == 0) {
        rl_log(m, "controller: no problems in task.train '%s'", s->train_path);
        return MANTA_EINVAL;
    }
    if (s->heldout_path[0] && load_problems(s->heldout_path, &s->heldout, &s->n_heldout))
        rl_log(m, "controller: cannot read task.heldout '%s'", s->heldout_path);
    if (s->eval_n > s->n_heldout) s->eval_n = s->n_heldout;
    if (s->demos_path[0] && load_demos(s, s->demos_path, s->warmup_max))
        rl_log(m, "controller: cannot read task.demos '%s'", s->demos_path);
    s->version = -1;
    s->success_initial = s->success_final = -1;
    s->t_start = rl_now_s();
    rl_log(m, "controller: %d train, %d held-out, %d demos; G=%d B=%d eta=%d", s->n_train,
           s->n_heldout, s->n_demos, s->G, s->B, s->eta);
    return 0;
}

static void ctl_fini(manta_ctx *m, void *state)
{
    ctl_state *s = state;
    for (int i = 0; i < s->n_train; i++) free(s->train[i].text), free(s->train[i].answer);
    for (int i = 0; i < s->n_heldout; i++) free(s->heldout[i].text), free(s->heldout[i].answer);
    free(s->train), free(s->heldout);
    for (int i = 0; i < s->n_demos; i++) free(s->demos[i].tok), free(s->demos[i].mask);
    free(s->demos);
    for (int64_t g = 0; g < s->n_groups; g++) {
        for (int i = 0; s->groups[g].trajs && i < s->groups[g].n; i++)
            rl_traj_destroy(&s->groups[g].trajs[i]);
        free(s->groups[g].trajs), free(s->groups[g].usable);
    }
    free(s->groups), free(s->eps), free(s->queue), free(s->ready), free(s->eval_queue);
    if (s->metrics) fclose(s->metrics);
    if (s->traj_dump) fclose(s->traj_dump);
}

/* ---- bookkeeping ---- */

static int64_t new_episode(ctl_state *s, int64_t group, int32_t prompt, int eval)
{
    if (s->n_eps == s->cap_eps) {
        int64_t cap = s->cap_eps ? s->cap_eps * 2 : 4096;
        episode *e = realloc(s->eps, (size_t)cap * sizeof *e);
        if (!e) return -1;
        s->eps = e, s->cap_eps = cap;
    }
    s->eps[s->n_eps] = (episode){eval ? EP_EVAL : EP_INFLIGHT, -1, group, prompt};
    return s->n_eps++;
}

static int64_t new_group(ctl_state *s, int32_t prompt)
{
    if (s->n_groups == s->cap_groups) {
        int64_t cap = s->cap_groups ? s->cap_groups * 2 : 1024;
        group *g = realloc(s->groups, (size_t)cap * sizeof *g);
        if (!g) return -1;
        s->groups = g, s->cap_groups = cap;
    }
    group *g = &s->groups[s->n_groups];
    memset(g, 0, sizeof *g);
    g->prompt = prompt;
    g->n = s->G;
    g->trajs = calloc((size_t)s->G, sizeof *g->trajs);
    g->usable = calloc((size_t)s->G, 1);
    if (!g->trajs || !g->usable) return -1;
    return s->n_groups++;
}

static void push64(int64_t **arr, int64_t *len, int64_t *cap, int64_t v)
{
    if (*len == *cap) {
        int64_t c = *cap ? *cap * 2 : 256;
        int64_t *n = realloc(*arr, (size_t)c * sizeof *n);
        if (!n) return;
        *arr = n, *cap = c;
    }
    (*arr)[(*len)++] = v;
}

static void count_reason(ctl_state *s, const char *why)
{
    for (int i = 0; i < MAX_REASONS; i++) {
        if (!s->reason[i][0]) snprintf(s->reason[i], sizeof s->reason[i], "%s", why);
        if (!strcmp(s->reason[i], why)) {
            s->reason_n[i]++;
            return;
        }
    }
    s->reason_n[MAX_REASONS - 1]++;
}

static void member_resolved(ctl_state *s, int64_t gid)
{
    group *g = &s->groups[gid];
    g->resolved++;
    if (g->resolved == g->n && !g->ready) {
        g->ready = 1;
        int usable = 0;
        for (int i = 0; i < g->n; i++) usable += g->usable[i];
        if (usable == 0) return;
        int64_t cap = s->r_cap;
        push64(&s->ready, &s->r_len, &cap, gid);
        s->r_cap = cap;
        s->ready_eps += usable;
    }
}

static void drop(ctl_state *s, int64_t ep, int stale, const char *why)
{
    s->eps[ep].state = stale ? EP_STALE : EP_ERROR;
    if (stale)
        s->led.dropped_stale++;
    else {
        s->led.dropped_error++;
        count_reason(s, why);
    }
    s->credits++;
}

/* ---- methods ---- */

static void pack_buckets(ctl_state *s, msgpack_packer *pk)
{
    rl_pack_str(pk, "buckets");
    msgpack_pack_array(pk, (size_t)s->n_buckets);
    for (int i = 0; i < s->n_buckets; i++) {
        msgpack_pack_map(pk, 4);
        rl_pack_kv_str(pk, "id", s->buckets[i].id);
        rl_pack_kv_int(pk, "offset", s->buckets[i].offset);
        rl_pack_kv_int(pk, "count", s->buckets[i].count);
        rl_pack_kv_int(pk, "crc", s->buckets[i].crc);
    }
}

/* Append the "buckets" of a shard's reply to out[*n]. */
static void read_buckets(const msgpack_object *r, wbucket *out, int *n)
{
    const msgpack_object *bs = rl_mp_get(r, "buckets");
    for (uint32_t i = 0; bs && bs->type == MSGPACK_OBJECT_ARRAY && i < bs->via.array.size; i++) {
        if (*n == MAX_WBUCKETS) return;
        const msgpack_object *b = &bs->via.array.ptr[i];
        wbucket *w = &out[(*n)++];
        rl_mp_str(rl_mp_get(b, "id"), w->id, sizeof w->id, "");
        w->offset = rl_mp_int(rl_mp_get(b, "offset"), 0);
        w->count = rl_mp_int(rl_mp_get(b, "count"), 0);
        w->crc = (uint32_t)rl_mp_int(rl_mp_get(b, "crc"), 0);
    }
}

static void pack_episode(ctl_state *s, msgpack_packer *pk, int64_t id)
{
    episode *e = &s->eps[id];
    int eval = e->group < 0;
    problem *p = eval ? &s->heldout[e->prompt] : &s->train[e->prompt];
    msgpack_pack_map(pk, 6);
    rl_pack_kv_int(pk, "episode", id);
    rl_pack_kv_int(pk, "group", e->group);
    rl_pack_kv_int(pk, "prompt", e->prompt);
    rl_pack_kv_str(pk, "text", p->text);
    rl_pack_kv_str(pk, "reference", p->answer);
    rl_pack_kv_int(pk, "eval", eval);
}

/* The holder entry of rollout `name` (its incarnation read on first sight). */
static int holder_of(ctl_state *s, const char *name)
{
    if (!name[0]) return -1;
    for (int i = 0; i < s->n_holders; i++)
        if (!strcmp(s->holders[i].name, name)) {
            if (!s->holders[i].live) { /* back (a new incarnation): watch it again */
                manta_actor *a;
                manta_actor_info info;
                if (manta_actor_lookup(s->m, name, &a) == 0 &&
                    manta_actor_info_get(s->m, a, &info) == 0)
                    s->holders[i].incarnation = info.incarnation;
                s->holders[i].live = 1;
            }
            return i;
        }
    if (s->n_holders == MAX_HOLDERS) return -1;
    holder *h = &s->holders[s->n_holders];
    snprintf(h->name, sizeof h->name, "%s", name);
    h->incarnation = -1;
    manta_actor *a;
    manta_actor_info info;
    if (manta_actor_lookup(s->m, name, &a) == 0 && manta_actor_info_get(s->m, a, &info) == 0)
        h->incarnation = info.incarnation;
    h->live = 1;
    return s->n_holders++;
}

/* Re-queue the episodes of rollouts that died or restarted (their slots are
 * gone): checked about once a second from the run loop. */
static void reclaim(ctl_state *s)
{
    double now = rl_now_s();
    if (now - s->last_reclaim < 1.0) return;
    s->last_reclaim = now;
    for (int i = 0; i < s->n_holders; i++) {
        holder *h = &s->holders[i];
        if (!h->live) continue;
        manta_actor *a;
        manta_actor_info info;
        int gone = manta_actor_lookup(s->m, h->name, &a) != 0 ||
                   manta_actor_info_get(s->m, a, &info) != 0 || info.state != MANTA_ACTOR_ALIVE ||
                   (h->incarnation >= 0 && info.incarnation != h->incarnation);
        if (!gone) continue;
        h->live = 0;
        int64_t n = 0;
        for (int64_t id = 0; id < s->n_eps; id++) {
            episode *e = &s->eps[id];
            if (e->holder != i || (e->state != EP_INFLIGHT && e->state != EP_EVAL)) continue;
            e->state = EP_QUEUED;
            e->holder = -1;
            push64(&s->queue, &s->q_len, &s->q_cap, id);
            n++;
        }
        s->reclaimed += n;
        if (n) rl_log(s->m, "%s is gone: %lld episodes re-queued", h->name, (long long)n);
    }
}

static int ctl_admit(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int64_t want = 0, their = -1;
    char who[64] = "";
    if (rl_unpack(&u, arg, len) == 0) {
        want = rl_mp_int(rl_mp_get(&u.data, "groups"), 0) * s->G;
        their = rl_mp_int(rl_mp_get(&u.data, "version"), -1);
        rl_mp_str(rl_mp_get(&u.data, "rollout"), who, sizeof who, "");
    }
    msgpack_unpacked_destroy(&u);
    int h = want > 0 ? holder_of(s, who) : -1;
    int64_t out[4096];
    int n = 0;
    if (want > 4096) want = 4096;
    if (s->have_weights && !s->stop) {
        while (n < want && s->eq_head < s->eq_len) out[n++] = s->eval_queue[s->eq_head++];
        while (n < want && s->q_head < s->q_len) {
            int64_t id = s->queue[s->q_head++];
            s->eps[id].state = s->eps[id].group < 0 ? EP_EVAL : EP_INFLIGHT;
            out[n++] = id;
        }
        while (s->admit_train && n + s->G <= want &&
               rl_admit_ok(s->led.admitted - s->credits, s->G, s->version, s->eta, s->B)) {
            int32_t prompt = (int32_t)(s->next_train++ % s->n_train);
            int64_t gid = new_group(s, prompt);
            if (gid < 0) break;
            for (int i = 0; i < s->G; i++) {
                int64_t id = new_episode(s, gid, prompt, 0);
                if (id < 0) break;
                if (i == 0) s->groups[gid].first_ep = id;
                out[n++] = id;
                s->led.admitted++;
            }
        }
    }
    for (int i = 0; i < n; i++) s->eps[out[i]].holder = (int16_t)h;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int behind = s->have_weights && their < s->version;
    msgpack_pack_map(&pk, 3 + behind);
    rl_pack_kv_int(&pk, "version", s->version);
    rl_pack_kv_int(&pk, "stop", s->stop);
    if (behind) pack_buckets(s, &pk);
    rl_pack_str(&pk, "episodes");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) pack_episode(s, &pk, out[i]);
    manta_reply(req, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

static int ctl_submit(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    rl_traj t;
    rl_traj_init(&t);
    if (rl_traj_decode(&t, arg, len)) {
        rl_traj_destroy(&t);
        return manta_reply_error(req, MANTA_EINVAL, "submit: not a trajectory");
    }
    int64_t id = t.episode;
    if (id < 0 || id >= s->n_eps) {
        rl_traj_destroy(&t);
        return manta_reply_error(req, MANTA_EINVAL, "submit: unknown episode %lld", (long long)id);
    }
    episode *e = &s->eps[id];
    s->tool_calls += t.tool_calls, s->tool_errors += t.tool_errors;
    s->v_tool_calls += t.tool_calls, s->v_tool_errors += t.tool_errors;
    int gen = rl_traj_trained_tokens(&t);
    s->gen_tokens += gen, s->v_gen_tokens += gen;
    if (e->group < 0) { /* evaluation */
        if (e->state == EP_EVAL && t.reward < 0.5f && s->eval_logged++ < 4) {
            char txt[512];
            rl_traj_render(&t, txt, sizeof txt);
            rl_log(s->m, "eval sample (reward %.0f, ref %s): %s", t.reward,
                   s->heldout[e->prompt].answer, txt);
        }
        if (e->state == EP_EVAL) {
            e->state = EP_EVAL_DONE;
            s->eval_done++;
            if (t.status == RL_EP_OK && t.reward >= 0.5f) s->eval_success++;
            int32_t v0 = rl_traj_min_version(&t), v1 = rl_traj_max_version(&t);
            if (v0 >= 0 && (s->eval_vmin < 0 || v0 < s->eval_vmin)) s->eval_vmin = v0;
            if (v1 > s->eval_vmax) s->eval_vmax = v1;
        } else {
            s->duplicates++;
        }
        rl_traj_destroy(&t);
        return manta_reply(req, "ok", 2);
    }
    if (id % 400 == 0) { /* a sample of what the policy does, for the log */
        char txt[512];
        rl_traj_render(&t, txt, sizeof txt);
        rl_log(s->m, "train sample v%lld (reward %.0f, versions %d..%d): %s", (long long)s->version,
               t.reward, rl_traj_min_version(&t), rl_traj_max_version(&t), txt);
    }
    if (s->traj_dump && s->n_dumped < 64) {
        fwrite(arg, 1, len, s->traj_dump); /* msgpack maps, back to back */
        if (++s->n_dumped == 64) fclose(s->traj_dump), s->traj_dump = NULL;
    }
    if (e->state != EP_INFLIGHT) {
        s->duplicates++;
        rl_traj_destroy(&t);
        return manta_reply(req, "dup", 3);
    }
    group *g = &s->groups[e->group];
    int idx = (int)(id - g->first_ep);
    if (t.status != RL_EP_OK) {
        drop(s, id, 0, t.error[0] ? t.error : "error");
        rl_traj_destroy(&t);
    } else if (rl_is_stale(rl_traj_min_version(&t), s->version, s->eta)) {
        drop(s, id, 1, "stale");
        rl_traj_destroy(&t);
    } else {
        e->state = EP_DONE;
        g->trajs[idx] = t; /* moves ownership */
        g->usable[idx] = 1;
    }
    member_resolved(s, e->group);
    return manta_reply(req, "ok", 2);
}

static int ctl_handback(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (rl_unpack(&u, arg, len) == 0) {
        const msgpack_object *eps = rl_mp_get(&u.data, "episodes");
        for (uint32_t i = 0; eps && eps->type == MSGPACK_OBJECT_ARRAY && i < eps->via.array.size;
             i++) {
            int64_t id = rl_mp_int(&eps->via.array.ptr[i], -1);
            if (id < 0 || id >= s->n_eps) continue;
            if (s->eps[id].state != EP_INFLIGHT && s->eps[id].state != EP_EVAL) continue;
            s->eps[id].state = EP_QUEUED;
            s->eps[id].holder = -1;
            push64(&s->queue, &s->q_len, &s->q_cap, id);
            s->led.handed_back++;
        }
    }
    msgpack_unpacked_destroy(&u);
    return manta_reply(req, "ok", 2);
}

static void ledger_now(ctl_state *s, rl_ledger *l)
{
    *l = s->led;
    l->in_flight = l->admitted - l->trained - l->dropped_stale - l->dropped_error;
}

static cJSON *ledger_json(ctl_state *s)
{
    rl_ledger l;
    ledger_now(s, &l);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "admitted", (double)l.admitted);
    cJSON_AddNumberToObject(j, "trained", (double)l.trained);
    cJSON_AddNumberToObject(j, "dropped_stale", (double)l.dropped_stale);
    cJSON_AddNumberToObject(j, "dropped_error", (double)l.dropped_error);
    cJSON_AddNumberToObject(j, "in_flight", (double)l.in_flight);
    cJSON_AddNumberToObject(j, "handed_back", (double)l.handed_back);
    cJSON_AddNumberToObject(j, "reclaimed", (double)s->reclaimed);
    cJSON_AddBoolToObject(j, "balanced", rl_ledger_ok(&l));
    cJSON *r = cJSON_AddObjectToObject(j, "error_reasons");
    for (int i = 0; i < MAX_REASONS && s->reason[i][0]; i++)
        cJSON_AddNumberToObject(r, s->reason[i], (double)s->reason_n[i]);
    return j;
}

static int ctl_status(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", (double)s->version);
    cJSON_AddItemToObject(j, "ledger", ledger_json(s));
    cJSON_AddNumberToObject(j, "gen_tokens", (double)s->gen_tokens);
    cJSON_AddNumberToObject(j, "trained_tokens", (double)s->trained_tokens);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    int rc = manta_reply(req, txt, strlen(txt));
    free(txt);
    return rc;
}

/* ---- the training loop ---- */

typedef struct step_out {
    double loss, kl, clip_frac, entropy, grad_norm, busy_s, tokens;
    int ok;
} step_out;

/* Find the S learner shards (learners setting, else count learner-0..). */
static int find_learners(ctl_state *s, manta_actor **L)
{
    int n = 0;
    for (int i = 0; i < MAX_LEARNERS; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s-%d", s->learner_group, i);
        if (manta_actor_lookup(s->m, name, &L[n])) break;
        n++;
        if (s->S > 0 && n == s->S) break;
    }
    return n;
}

typedef struct seq {
    const int32_t *tok;
    const float *logp;
    const uint8_t *mask;
    int n;
    float adv;
} seq;

/* One step on every shard: shard i gets sequences i, i+S, ... */
static int learn_step(ctl_state *s, manta_actor **L, const char *mode, double lr, const seq *q,
                      int nq, int64_t new_version, step_out *o)
{
    manta_future *f[MAX_LEARNERS];
    memset(o, 0, sizeof *o);
    for (int i = 0; i < s->S; i++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 4);
        rl_pack_kv_str(&pk, "mode", mode);
        rl_pack_kv_int(&pk, "version", new_version);
        rl_pack_kv_num(&pk, "lr", lr);
        rl_pack_str(&pk, "items");
        int mine = 0;
        for (int k = i; k < nq; k += s->S) mine++;
        msgpack_pack_array(&pk, (size_t)mine);
        for (int k = i; k < nq; k += s->S) {
            msgpack_pack_map(&pk, 4);
            rl_pack_kv_bin(&pk, "tok", q[k].tok, (size_t)q[k].n * 4);
            if (q[k].logp)
                rl_pack_kv_bin(&pk, "logp", q[k].logp, (size_t)q[k].n * 4);
            else
                rl_pack_kv_bin(&pk, "logp", NULL, 0);
            rl_pack_kv_bin(&pk, "mask", q[k].mask, (size_t)q[k].n);
            rl_pack_kv_num(&pk, "adv", q[k].adv);
        }
        f[i] = manta_call_timeout(s->m, L[i], "step", sb.data, sb.size, 120000);
        msgpack_sbuffer_destroy(&sb);
    }
    manta_wait(f, (size_t)s->S, (size_t)s->S, 120000);
    int bad = 0, nb = 0;
    wbucket *nb_list = malloc(MAX_WBUCKETS * sizeof *nb_list);
    if (!nb_list) bad = 1;
    for (int i = 0; i < s->S; i++) {
        const void *d;
        size_t n;
        int rc = nb_list ? manta_get(f[i], 0, &d, &n) : MANTA_ENOMEM;
        if (rc) {
            rl_log(s->m, "controller: learner %d step: %s", i, manta_future_error(f[i]));
            bad = 1;
            continue;
        }
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        if (rl_unpack(&u, d, n) == 0) {
            const msgpack_object *r = &u.data;
            read_buckets(r, nb_list, &nb);
            o->loss = rl_mp_num(rl_mp_get(r, "loss"), 0);
            o->kl = rl_mp_num(rl_mp_get(r, "kl"), 0);
            o->clip_frac = rl_mp_num(rl_mp_get(r, "clip_frac"), 0);
            o->entropy = rl_mp_num(rl_mp_get(r, "entropy"), 0);
            o->grad_norm = rl_mp_num(rl_mp_get(r, "grad_norm"), 0);
            o->tokens = rl_mp_num(rl_mp_get(r, "tokens"), 0);
            double b = rl_mp_num(rl_mp_get(r, "busy_s"), 0);
            if (b > o->busy_s) o->busy_s = b;
        }
        msgpack_unpacked_destroy(&u);
    }
    for (int i = 0; i < s->S; i++) manta_future_free(f[i]);
    if (!bad) { /* the new version's weights, only once every shard has stepped */
        memcpy(s->buckets, nb_list, (size_t)nb * sizeof *nb_list);
        s->n_buckets = nb;
    }
    free(nb_list);
    o->ok = !bad;
    return bad ? -1 : 0;
}

static int publish_initial(ctl_state *s, manta_actor **L)
{
    manta_future *f[MAX_LEARNERS];
    for (int i = 0; i < s->S; i++) f[i] = manta_call(s->m, L[i], "publish", "", 0);
    manta_wait(f, (size_t)s->S, (size_t)s->S, 60000);
    int bad = 0;
    s->n_buckets = 0;
    for (int i = 0; i < s->S; i++) {
        const void *d;
        size_t n;
        if (manta_get(f[i], 0, &d, &n) == 0) {
            msgpack_unpacked u;
            msgpack_unpacked_init(&u);
            if (rl_unpack(&u, d, n) == 0) read_buckets(&u.data, s->buckets, &s->n_buckets);
            msgpack_unpacked_destroy(&u);
        } else {
            bad = 1;
        }
        manta_future_free(f[i]);
    }
    return bad ? -1 : 0;
}

static void warmup(ctl_state *s, manta_actor **L)
{
    if (s->n_demos == 0 || s->warmup_steps <= 0) return;
    seq *q = calloc((size_t)s->n_demos, sizeof *q);
    if (!q) return;
    for (int i = 0; i < s->n_demos; i++)
        q[i] = (seq){s->demos[i].tok, NULL, s->demos[i].mask, s->demos[i].n, 0};
    step_out o;
    for (int t = 0; t < s->warmup_steps; t++) {
        if (learn_step(s, L, "sft", s->warmup_lr, q, s->n_demos, -1, &o)) break;
        if (t % 10 == 0 || t == s->warmup_steps - 1)
            rl_log(s->m, "warm-up step %d/%d: loss %.4f", t + 1, s->warmup_steps, o.loss);
    }
    free(q);
}

/* Queue an evaluation over the first n held-out problems. */
static void start_eval(ctl_state *s, int n)
{
    free(s->eval_queue);
    s->eval_queue = calloc((size_t)(n ? n : 1), sizeof *s->eval_queue);
    s->eq_len = s->eq_head = 0;
    for (int i = 0; i < n; i++) {
        int64_t id = new_episode(s, -1, i, 1);
        if (id >= 0) s->eval_queue[s->eq_len++] = id;
    }
    s->eval_active = 1, s->eval_total = (int)s->eq_len, s->eval_done = s->eval_success = 0;
    s->eval_vmin = -1, s->eval_vmax = -1;
    s->eval_logged = 0;
}

static double wait_eval(ctl_state *s, double timeout_s)
{
    double until = rl_now_s() + timeout_s;
    while (s->eval_done < s->eval_total && rl_now_s() < until) {
        manta_poll(s->m, 20);
        reclaim(s);
    }
    s->eval_active = 0;
    return s->eval_total ? (double)s->eval_success / s->eval_total : 0;
}

static void write_eval_metric(ctl_state *s, const char *phase, double success)
{
    if (!s->metrics) return;
    fprintf(s->metrics,
            "{\"eval\":\"%s\",\"version\":%lld,\"time_s\":%.2f,\"heldout_success\":%.4f,"
            "\"problems\":%d,\"versions_used\":[%d,%d]}\n",
            phase, (long long)s->version, rl_now_s() - s->t_start, success, s->eval_total,
            s->eval_vmin, s->eval_vmax);
    fflush(s->metrics);
}

static int mkdir_p(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* Is a batch ready? Full, or nothing more can come (no admission possible
 * and nothing in flight). */
static int batch_ready(ctl_state *s)
{
    if (s->ready_eps >= s->B) return 1;
    if (s->ready_eps == 0) return 0;
    rl_ledger l;
    ledger_now(s, &l);
    int64_t pending = l.in_flight - s->ready_eps; /* generating or waiting for group mates */
    return pending == 0 &&
           !rl_admit_ok(s->led.admitted - s->credits, s->G, s->version, s->eta, s->B);
}

static int rl_step(ctl_state *s, manta_actor **L)
{
    /* take complete groups, B episodes at most */
    int cap = s->S * ((s->B + s->S - 1) / s->S);
    seq *q = calloc((size_t)cap, sizeof *q);
    int64_t *taken = calloc((size_t)s->r_len + 1, sizeof *taken);
    if (!q || !taken) {
        free(q), free(taken);
        return -1;
    }
    int nq = 0, ntaken = 0, zero_var = 0;
    double rsum = 0, succ = 0;
    int64_t hist[STALE_BINS] = {0};
    while (s->r_head < s->r_len) {
        group *g = &s->groups[s->ready[s->r_head]];
        int usable = 0;
        for (int i = 0; i < g->n; i++) {
            /* staleness again, now, against the version that trains */
            if (g->usable[i] &&
                rl_is_stale(rl_traj_min_version(&g->trajs[i]), s->version, s->eta)) {
                g->usable[i] = 0;
                s->ready_eps--;
                drop(s, g->first_ep + i, 1, "stale");
                rl_traj_destroy(&g->trajs[i]);
            }
            usable += g->usable[i];
        }
        if (usable > 0 && nq + usable > cap) break;
        s->r_head++;
        if (usable == 0) continue;
        float r[256], adv[256];
        int idx[256], k = 0;
        for (int i = 0; i < g->n && k < 256; i++)
            if (g->usable[i]) idx[k] = i, r[k] = g->trajs[i].reward, k++;
        if (!rl_group_advantages(r, k, 1e-6f, adv)) zero_var++;
        for (int j = 0; j < k; j++) {
            rl_traj *t = &g->trajs[idx[j]];
            q[nq++] = (seq){t->tok, t->logp, t->mask, t->n, adv[j]};
            rsum += t->reward, succ += t->reward >= 0.5f;
            int32_t st = (int32_t)(s->version - rl_traj_min_version(t));
            hist[st < 0 ? 0 : st >= STALE_BINS ? STALE_BINS - 1 : st]++;
        }
        taken[ntaken++] = s->ready[s->r_head - 1];
    }
    s->ready_eps -= nq;
    int rc = 0;
    if (nq > 0) {
        step_out o;
        rc = learn_step(s, L, "ppo", s->lr, q, nq, s->version + 1, &o);
        if (rc == 0) {
            s->version++;
            s->learner_busy_s += o.busy_s;
            s->led.trained += nq;
            s->trained_tokens += (int64_t)o.tokens;
            s->zero_var_groups += zero_var;
            for (int i = 0; i < STALE_BINS; i++) s->stale_hist[i] += hist[i];
            double now = rl_now_s(), dt = now - s->t_last_version;
            s->t_last_version = now;
            rl_ledger l;
            ledger_now(s, &l);
            /* The version registry: the learner's version and the ledger, in
             * Redis for `manta status` and any other reader. */
            char pub[256];
            int pn = snprintf(pub, sizeof pub,
                              "{\"version\": %lld, \"time_s\": %.2f, \"admitted\": %lld, "
                              "\"trained\": %lld, \"dropped_stale\": %lld, "
                              "\"dropped_error\": %lld, \"in_flight\": %lld}",
                              (long long)s->version, now - s->t_start, (long long)l.admitted,
                              (long long)l.trained, (long long)l.dropped_stale,
                              (long long)l.dropped_error, (long long)l.in_flight);
            manta_kv_set(s->m, "policy", pub, (size_t)pn);
            if (s->metrics) {
                fprintf(s->metrics,
                        "{\"version\":%lld,\"time_s\":%.2f,\"episodes\":%d,\"reward\":%.4f,"
                        "\"success\":%.4f,\"trained_tokens\":%.0f,\"trained_tokens_per_s\":%.1f,"
                        "\"gen_tokens_per_s\":%.1f,\"loss\":%.5f,\"kl\":%.5f,\"clip_frac\":%.4f,"
                        "\"entropy\":%.4f,\"grad_norm\":%.4f,\"learner_busy_s\":%.3f,"
                        "\"zero_var_groups\":%d,\"staleness\":[",
                        (long long)s->version, now - s->t_start, nq, rsum / nq, succ / nq, o.tokens,
                        o.tokens / (dt > 1e-9 ? dt : 1e-9),
                        s->v_gen_tokens / (dt > 1e-9 ? dt : 1e-9), o.loss, o.kl, o.clip_frac,
                        o.entropy, o.grad_norm, o.busy_s, zero_var);
                for (int i = 0; i <= s->eta + 1 && i < STALE_BINS; i++)
                    fprintf(s->metrics, "%s%lld", i ? "," : "", (long long)hist[i]);
                fprintf(s->metrics,
                        "],\"dropped_stale\":%lld,\"dropped_error\":%lld,\"tool_calls\":%lld,"
                        "\"tool_errors\":%lld,\"admitted\":%lld,\"in_flight\":%lld}\n",
                        (long long)l.dropped_stale, (long long)l.dropped_error,
                        (long long)s->v_tool_calls, (long long)s->v_tool_errors,
                        (long long)l.admitted, (long long)l.in_flight);
                fflush(s->metrics);
            }
            s->v_tool_calls = s->v_tool_errors = s->v_gen_tokens = 0;
            if (s->version % 5 == 0)
                rl_log(s->m, "version %lld: reward %.3f, %d episodes, kl %.4f, %.1f tok/s",
                       (long long)s->version, rsum / nq, nq, o.kl, o.tokens / dt);
        }
    }
    /* the trajectories are done with either way */
    for (int i = 0; i < ntaken; i++) {
        group *g = &s->groups[taken[i]];
        for (int j = 0; j < g->n; j++)
            if (g->usable[j]) {
                if (rc == 0) {
                    s->eps[g->first_ep + j].state = EP_TRAINED;
                } else {
                    drop(s, g->first_ep + j, 0, "learner step failed");
                    s->led.trained -= 0;
                }
                rl_traj_destroy(&g->trajs[j]);
                g->usable[j] = 0;
            }
        for (int j = 0; j < g->n; j++) rl_traj_destroy(&g->trajs[j]);
        free(g->trajs), free(g->usable); /* nothing refers to a consumed group's trajectories */
        g->trajs = NULL, g->usable = NULL;
    }
    free(q), free(taken);
    return rc;
}

static int ctl_run(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    manta_actor *L[MAX_LEARNERS];
    s->S = find_learners(s, L);
    if (s->S == 0) return manta_reply_error(req, MANTA_ENOTFOUND, "run: no learner actors");
    if (mkdir_p(s->run_dir))
        return manta_reply_error(req, MANTA_ESYS, "run: cannot create %s", s->run_dir);
    char path[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->run_dir);
    s->metrics = fopen(path, "w");
    snprintf(path, sizeof path, "%s/trajectories.msgpack", s->run_dir);
    s->traj_dump = fopen(path, "wb");
    s->t_start = rl_now_s();

    warmup(s, L);
    if (publish_initial(s, L))
        return manta_reply_error(req, MANTA_EREMOTE, "run: learners could not publish");
    s->version = 0;
    s->have_weights = 1;
    double t_warm = rl_now_s() - s->t_start;
    /* baseline evaluation with version 0 */
    if (s->eval_n > 0) {
        start_eval(s, s->eval_n);
        s->success_initial = wait_eval(s, 300);
        write_eval_metric(s, "initial", s->success_initial);
        rl_log(s->m, "held-out success after warm-up: %.3f", s->success_initial);
    }
    s->admit_train = 1;
    s->t_rl_start = s->t_last_version = rl_now_s();
    s->best_eval = s->success_initial;
    while (s->version < s->max_versions && rl_now_s() - s->t_start < s->max_time_s) {
        reclaim(s);
        if (!batch_ready(s)) {
            manta_poll(s->m, 1); /* manta_poll waits its whole timeout: keep it short */
        } else if (rl_step(s, L)) {
            rl_log(s->m, "controller: learner step failed; retrying");
            manta_poll(s->m, 100);
        }
        if (s->eval_active && s->eval_done >= s->eval_total) {
            double sc = (double)s->eval_success / (s->eval_total ? s->eval_total : 1);
            s->eval_active = 0;
            write_eval_metric(s, "periodic", sc);
            rl_log(s->m, "version %lld: held-out success %.3f", (long long)s->version, sc);
            if (sc > s->best_eval) s->best_eval = sc;
            if (sc >= s->stop_at) break;
        }
        if (!s->eval_active && s->eval_every > 0 && s->eval_n > 0 && s->version > 0 &&
            s->version % s->eval_every == 0 && s->eval_vmax < s->version) {
            start_eval(s, s->eval_n);
            s->eval_vmax = (int32_t)s->version; /* one evaluation per version */
        }
    }
    double t_rl = rl_now_s() - s->t_rl_start;
    /* final evaluation with the last version: no more training admissions */
    s->admit_train = 0;
    if (s->eval_n > 0) {
        start_eval(s, s->eval_n);
        s->success_final = wait_eval(s, 300);
        write_eval_metric(s, "final", s->success_final);
    }
    s->stop = 1;
    double wall = rl_now_s() - s->t_start;

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "run_dir", s->run_dir);
    cJSON_AddNumberToObject(j, "heldout_problems", s->eval_n);
    cJSON_AddNumberToObject(j, "heldout_success_initial", s->success_initial);
    cJSON_AddNumberToObject(j, "heldout_success_final", s->success_final);
    cJSON_AddNumberToObject(j, "versions", (double)s->version);
    cJSON_AddNumberToObject(j, "eta", s->eta);
    cJSON_AddNumberToObject(j, "batch_episodes", s->B);
    cJSON_AddNumberToObject(j, "group_size", s->G);
    cJSON_AddNumberToObject(j, "learners", s->S);
    cJSON_AddNumberToObject(j, "wall_s", wall);
    cJSON_AddNumberToObject(j, "warmup_s", t_warm);
    cJSON_AddNumberToObject(j, "rl_s", t_rl);
    cJSON_AddItemToObject(j, "ledger", ledger_json(s));
    cJSON *r = cJSON_AddObjectToObject(j, "rates");
    cJSON_AddNumberToObject(r, "trained_tokens", (double)s->trained_tokens);
    cJSON_AddNumberToObject(r, "trained_tokens_per_s", s->trained_tokens / (t_rl > 0 ? t_rl : 1));
    cJSON_AddNumberToObject(r, "gen_tokens", (double)s->gen_tokens);
    cJSON_AddNumberToObject(r, "gen_tokens_per_s", s->gen_tokens / (t_rl > 0 ? t_rl : 1));
    cJSON_AddNumberToObject(r, "learner_busy_fraction", s->learner_busy_s / (t_rl > 0 ? t_rl : 1));
    cJSON_AddNumberToObject(r, "tool_calls", (double)s->tool_calls);
    cJSON_AddNumberToObject(r, "tool_errors", (double)s->tool_errors);
    cJSON_AddNumberToObject(r, "zero_variance_groups", (double)s->zero_var_groups);
    cJSON_AddNumberToObject(r, "duplicate_submissions", (double)s->duplicates);
    cJSON *h = cJSON_AddArrayToObject(j, "staleness_histogram");
    for (int i = 0; i < STALE_BINS; i++)
        cJSON_AddItemToArray(h, cJSON_CreateNumber((double)s->stale_hist[i]));
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/summary.json", s->run_dir);
    FILE *f = fopen(path, "w");
    if (f) fputs(txt, f), fputc('\n', f), fclose(f);
    if (s->metrics) fclose(s->metrics), s->metrics = NULL;
    if (s->traj_dump) fclose(s->traj_dump), s->traj_dump = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", s->run_dir);
    manta_future *sf = manta_call(s->m, L[0], "save", path, strlen(path));
    manta_get(sf, 30000, NULL, NULL);
    manta_future_free(sf);
    int rc = manta_reply(req, txt, strlen(txt));
    free(txt);
    return rc;
}

static const manta_method ctl_methods[] = {{"admit", ctl_admit},       {"submit", ctl_submit},
                                           {"handback", ctl_handback}, {"status", ctl_status},
                                           {"run", ctl_run},           {NULL, NULL}};

const manta_class rl_controller_class = {"controller", sizeof(ctl_state), ctl_init, ctl_fini,
                                         ctl_methods};
