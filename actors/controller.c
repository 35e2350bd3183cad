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
 * and "run", called once by the launcher (its reply is deferred: the loop
 * below is driven by submissions and a 1 s timer, not by polling):
 * supervised warm-up on the
 * demonstrations (if any) until they are reproduced (rl.warmup, or a fixed
 * rl.warmup_steps), publication of version 0, a held-out evaluation (the
 * baseline), then the RL loop: wait for B episodes in complete groups that
 * carry a signal (dynamic sampling: a group whose rewards are all equal is
 * dropped as "no_signal" and its admission given back, so the version waits
 * for informative groups instead of stepping without a gradient), drop
 * stale ones, GRPO advantages, one step on every learner shard at once,
 * version V+1 published (the shards' buckets), metrics line. A run that
 * sees no reward for rl.no_reward_warn_versions batches' worth of episodes
 * warns (log, metrics.jsonl, summary.json "warnings"). Every
 * `eval_every` versions a held-out evaluation runs alongside; the loop ends at
 * `max_versions`, at `max_time_s`, or when an evaluation reaches `stop_at`.
 * A final evaluation on the held-out set follows; metrics.jsonl,
 * summary.json and the trained policy (RUN_DIR/model, a Hugging Face folder
 * saved by learner-0) go into the run folder; the reply is the summary
 * (JSON). The controller reads section model too (policy.c), so that a bad
 * model folder fails the job when it starts and the summary names the policy.
 * summary.json carries `status`: "done"; "failed: <why>" when a group the
 * rollouts need has been missing for rl.max_missing_s, when the learner step
 * failed rl.max_step_failures times in a row, or when max_time_s passed with
 * no version trained (the reply is then an error naming the cause), when
 * more than rl.max_error_drop_rate of a window of training episodes were
 * dropped for errors, or when a learner shard restarted and could not be
 * restored; or "interrupted" when the controller is stopped during the run
 * (fini). It is written to a temporary file and renamed.
 *
 * Checkpoints (every rl.checkpoint_every versions, and at version 0):
 * RUN_DIR/checkpoints/vNNNNNNNN with the learners' state and weights and
 * this controller's (controller.json), written atomically; rl.resume
 * starts a run from the newest, and a learner shard that restarts mid-run
 * sends every shard back to it (see "checkpoints and resume" below).
 *
 * The ledger lives here and is written in summary.json (and in every
 * metrics line): admitted = trained + dropped_stale + dropped_error +
 * in_flight, where in_flight counts episodes admitted but neither trained nor
 * dropped when the job stops; dropped_error counts every drop that is not
 * for staleness, by reason (no_signal among them). Dropped episodes give their admission back, so
 * a batch whose episodes failed is admitted again rather than stalling.
 */
#include "manta_actors.h"
#include "rl_util.h"
#include "textio.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LEARNERS    1024 /* learner-0 .. are looked up */
#define STALE_BINS      10
#define HEARTBEAT_MS    1000   /* reclaim, time limits: checked at least this often */
#define SAVE_TIMEOUT_MS 300000 /* the final checkpoint; a large model writes gigabytes */

enum { EP_INFLIGHT = 0, EP_QUEUED, EP_DONE, EP_TRAINED, EP_STALE, EP_ERROR, EP_EVAL, EP_EVAL_DONE };

/* The phases of "run" after warm-up; each is advanced by events. */
enum { PH_NONE, PH_EVAL_INITIAL, PH_TRAIN, PH_EVAL_FINAL, PH_DONE };

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
    int32_t holder; /* index into holders: the rollout generating it, -1 none */
    int64_t group;  /* -1 for evaluation episodes */
    int32_t prompt;
} episode;

/* A rollout that took work, and the incarnation that took it: when it dies
 * (or restarts as a new incarnation) its episodes are re-queued. */
typedef struct holder {
    char name[64];
    int incarnation;
    int live;
} holder;

/* The record of episode id / group gid (inside the window). */
#define EPI(s, id)  ((s)->eps[(id) - (s)->eps_base])
#define GRP(s, gid) ((s)->groups[(gid) - (s)->g_base])

typedef struct ctl_state {
    manta_ctx *m;
    char job[64], run_dir[512];
    /* settings */
    int G, B, eta, S;
    double lr, warmup_lr;
    rl_warmup wu;     /* when the warm-up stops (rl.warmup, rl.warmup_steps) */
    int wu_given;     /* either was in the spec (else wu is the default) */
    int warmup_batch; /* demonstrations per warm-up step (rl.warmup_batch) */
    int no_reward_warn_versions;
    int dynamic_sampling; /* drop groups without signal (rl.dynamic_sampling, default on) */
    int max_versions, eval_every, eval_n;
    double max_time_s, stop_at;
    double max_missing_s;       /* a group gone (episodes dropped for it) this long fails the run */
    int max_step_failures;      /* consecutive learner step failures that fail the run */
    int step_timeout_ms;        /* a learner call's deadline (rl.step_timeout_s) */
    char wu_error[300];         /* why the warm-up failed, "" when it did not */
    double max_error_drop_rate; /* of a window of training episodes, dropped for errors */
    int ckpt_every, ckpt_keep;  /* rl.checkpoint_every (0: never), rl.checkpoint_keep */
    char resume[512];           /* rl.resume: a run or checkpoint folder, or "" */
    char learner_group[32];
    char train_path[512], heldout_path[512], demos_path[512];
    rl_model_spec ms;         /* the policy (read here to fail the job early on a bad folder) */
    char checkpoint[700];     /* the folder the learner saved the final model in, or "" */
    rl_text *text;            /* the policy's text, for answers in logs (made on first use) */
    FILE *eval_out;           /* RUN_DIR/eval_final.jsonl while the final evaluation runs */
    char checkpoint_err[256]; /* why it did not, or "" */
    char last_ckpt[700];      /* the newest complete checkpoint folder, or "" */
    int64_t last_ckpt_version;
    int ckpt_failures;      /* checkpoints that could not be written */
    int learner_restores;   /* restarted shards recovered from a checkpoint */
    int *L_inc;             /* each shard's incarnation when it last had the group's state */
    char resumed_from[700]; /* the checkpoint this run continued, or "" */
    int64_t resumed_version, resumed_lost;
    double rl_before;          /* RL seconds of the runs before a resume */
    double last_learner_check; /* watch_learners: at most once a second */
    /* data */
    problem *train, *heldout;
    int n_train, n_heldout;
    demo *demos;
    int n_demos;
    int next_train;
    /* episodes and groups: ids are global and never reused; the arrays hold
     * the window [eps_base, n_eps) and [g_base, n_groups) only, so the
     * records of resolved episodes and released groups go (compact) */
    episode *eps;
    int64_t n_eps, cap_eps, eps_base;
    group *groups;
    int64_t n_groups, cap_groups, g_base;
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
    rl_buckets buckets; /* the current version's weights */
    int have_weights;
    int admit_train, stop;
    holder *holders;
    int n_holders, cap_holders;
    /* the run: learner shards, the deferred reply, the phase and its timer */
    manta_actor **L;
    manta_req *run_req;
    int phase, advancing;
    uint64_t timer;
    int64_t timer_due_ms;
    double eval_until, retry_at, t_warm, t_rl;
    float *g_r, *g_adv; /* G scratch entries for a group's advantages */
    int *g_idx;
    int64_t reclaimed;
    double last_reclaim;
    /* ledger and counters */
    rl_ledger led;
    int64_t credits;    /* admissions given back by drops */
    char (*reason)[96]; /* drop reasons, growing */
    int64_t *reason_n;
    int n_reasons, cap_reasons;
    int64_t stale_hist[STALE_BINS];
    int64_t tool_calls, tool_errors, gen_tokens, trained_tokens, duplicates;
    cJSON *tool_errors_by_kind; /* from the env actors at the end (rl_env_errors_json) */
    /* dynamic sampling: groups without signal dropped, in all and since the
     * last version; episodes scored in a row with no reward (> 0) */
    int64_t no_signal_groups, v_no_signal_groups, no_reward_run, dropped_no_signal;
    /* training episodes scored since the last version (all of them, also
     * those dropped without signal): what the policy earns */
    int64_t v_scored, v_successes;
    double v_reward;
    int no_reward_warned;
    /* the warm-up as it ran: steps, the last demo loss and reproduced
     * fraction, rl_warmup_check's verdict */
    int wu_steps, wu_outcome;
    double wu_loss, wu_reproduced;
    char (*warnings)[400]; /* for summary.json; the first MAX_WARNINGS */
    int n_warnings;
    int64_t v_tool_calls, v_tool_errors, v_gen_tokens;
    double t_start, t_rl_start, learner_busy_s, t_last_version;
    FILE *metrics;
    FILE *traj_dump; /* the first trajectories submitted, for inspection and tests */
    int n_dumped;
    double success_initial, success_final, best_eval;
    /* failing loudly */
    int step_failures;        /* consecutive */
    double missing_since[2];  /* first drop of the current streak: reward, env; 0 none */
    double missing_last[2];   /* its latest drop */
    char missing_why[2][128]; /* its reason (names the group) */
    int64_t eval_first;       /* the current evaluation's first episode id */
    int run_dir_open;
    /* the error-drop window: training episodes resolved, dropped for errors
     * (not staleness, not no_signal, not a missing group: those have their
     * own rules), and the latest such reason */
    int64_t win_resolved, win_errors;
    char win_why[96];
} ctl_state;

/* ---- data ---- */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int blank(const char *line)
{
    while (*line == ' ' || *line == '\t' || *line == '\r' || *line == '\n') line++;
    return *line == 0;
}

/* JSON lines {"prompt": str, "answer": str}; blank lines are skipped, any
 * other line that is not such an object is an error naming file and line. */
static int load_problems(const char *path, problem **out, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    int cap = 0, lineno = 0, rc = 0;
    *out = NULL, *n = 0;
    while (!rc && getline(&line, &lcap, f) >= 0) {
        lineno++;
        if (blank(line)) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "answer");
        if (!cJSON_IsString(p) || !cJSON_IsString(a))
            rc = rl_fail(MANTA_EINVAL, "%s:%d: not {\"prompt\": str, \"answer\": str}", path,
                         lineno);
        if (!rc && *n == cap) {
            cap = cap ? cap * 2 : 256;
            problem *np = realloc(*out, (size_t)cap * sizeof *np);
            if (np)
                *out = np;
            else
                rc = rl_fail(MANTA_ENOMEM, "%s: out of memory at line %d", path, lineno);
        }
        if (!rc) {
            (*out)[*n].text = xstrdup(p->valuestring);
            (*out)[*n].answer = xstrdup(a->valuestring);
            if ((*out)[*n].text && (*out)[*n].answer)
                (*n)++;
            else
                rc = rl_fail(MANTA_ENOMEM, "%s: out of memory at line %d", path, lineno);
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    return rc;
}

/* One demonstration into d, as the policy's text makes it (textio.c: the
 * byte-level tokens, or the chat format rendered and tokenised): the prompt
 * and tool turns as given tokens, the policy segments trained on. */
static int build_demo(demo *d, rl_text *x, const cJSON *p, const cJSON *segs)
{
    size_t n = 0;
    int rc = rl_text_demo(x, p->valuestring, segs, &d->tok, &d->mask, &n);
    if (rc) return rc == MANTA_ENOMEM ? rc : MANTA_EINVAL;
    d->n = (int)n;
    return 0;
}

/* A demonstration: {"prompt": str, "segments": [["policy"|"tool", text]]}.
 * In policy text "<call>" and "</call>" are the tool-call tokens; EOS ends the
 * last policy segment; tool text is followed by '\n' as the rollout does.
 * Every line is read (at most MAX_DEMOS; more is an error); each warm-up
 * step takes the next rl.warmup_batch of them in turn. */
#define MAX_DEMOS (1 << 20)
static int load_demos(ctl_state *s, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    int lineno = 0, rc = 0;
    rl_text *x = NULL;
    int cap = 0;
    rc = rl_text_new(&s->ms, &x);
    while (!rc && getline(&line, &lcap, f) >= 0) {
        lineno++;
        if (blank(line)) continue;
        if (s->n_demos == cap) {
            if (cap == MAX_DEMOS) {
                rc = rl_fail(MANTA_EINVAL, "%s:%d: more than %d demonstrations", path, lineno,
                             MAX_DEMOS);
                break;
            }
            int ncap = cap ? 2 * cap : 64;
            demo *nd = realloc(s->demos, (size_t)ncap * sizeof *nd);
            if (!nd) {
                rc = rl_fail(MANTA_ENOMEM, "%s: out of memory for %d demonstrations", path, ncap);
                break;
            }
            memset(nd + cap, 0, (size_t)(ncap - cap) * sizeof *nd);
            s->demos = nd, cap = ncap;
        }
        cJSON *j = cJSON_Parse(line);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *segs = cJSON_GetObjectItemCaseSensitive(j, "segments");
        demo *d = &s->demos[s->n_demos++]; /* counted: ctl_fini frees it either way */
        rc = cJSON_IsString(p) && cJSON_IsArray(segs) ? build_demo(d, x, p, segs) : MANTA_EINVAL;
        if (rc == MANTA_EINVAL)
            rl_fail(rc, "%s:%d: not {\"prompt\": str, \"segments\": [[\"policy\"|\"tool\", str]]}",
                    path, lineno);
        else if (rc)
            rl_fail(rc, "%s:%d: out of memory", path, lineno);
        cJSON_Delete(j);
    }
    rl_text_free(x);
    free(line);
    fclose(f);
    return rc;
}

/* ---- init ---- */

/* A number (integer or float) into *x; 0 when o is not one. */
static int mp_number(const msgpack_object *o, double *x)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        *x = (double)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *x = (double)o->via.i64;
    else if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
        *x = o->via.f64;
    else
        return 0;
    return isfinite(*x);
}

/* A boolean setting: true/false, or 1/0. */
static int read_bool(rl_args *a, const char *section, const char *key, int def)
{
    const msgpack_object *v = rl_arg_get(a, section, key);
    char d[64];
    if (!v || a->rc) return def;
    if (v->type == MSGPACK_OBJECT_BOOLEAN) return v->via.boolean;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= 1) return (int)v->via.u64;
    rl_arg_error(a, section, key, "expected true or false, got %s", rl_mp_describe(v, d, sizeof d));
    return def;
}

#define WARMUP_MAX_STEPS 1000 /* rl.warmup.max_steps when an `until` is given alone */
/* With demonstrations and neither rl.warmup nor rl.warmup_steps: warm up
 * until nine in ten are reproduced. The demonstrations are trained on, so
 * their reproduction overstates success on other prompts (at 0.16 the
 * warehouse task's sampled episodes succeeded 0.2 % of the time, and RL
 * spent minutes generating groups without signal); a warm-up step costs far
 * less than such a version (README "Choosing the settings for a new task"). */
#define WARMUP_DEFAULT_SUCCESS 0.9

/* rl.warmup: {until_loss: X, until_success: Y, max_steps: N} (a map; at
 * least one key) and rl.warmup_steps: N (exactly N steps, as before
 * rl.warmup existed; when both are given the fixed count is used and the
 * log says so); neither: until_success WARMUP_DEFAULT_SUCCESS. Errors name
 * the key, as rl_arg_* do. */
static void read_warmup(rl_args *a, rl_warmup *w)
{
    *w = (rl_warmup){.fixed = -1, .until_loss = -1, .until_success = -1};
    if (rl_arg_get(a, "rl", "warmup_steps"))
        w->fixed = (int)rl_arg_int(a, "rl", "warmup_steps", 0, 0, 1 << 30);
    const msgpack_object *m = rl_arg_get(a, "rl", "warmup");
    if (!m && w->fixed < 0) { /* the default; no warm-up without demonstrations */
        w->until_success = WARMUP_DEFAULT_SUCCESS, w->max_steps = WARMUP_MAX_STEPS;
        return;
    }
    if (!m || a->rc) return;
    char d[64];
    if (m->type != MSGPACK_OBJECT_MAP || m->via.map.size == 0) {
        rl_arg_error(a, "rl", "warmup",
                     "expected a map {until_loss: X, until_success: Y, max_steps: N}, got %s",
                     rl_mp_describe(m, d, sizeof d));
        return;
    }
    int max_steps = -1;
    for (uint32_t i = 0; i < m->via.map.size && !a->rc; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        char key[32] = "";
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size < sizeof key)
            memcpy(key, k->via.str.ptr, k->via.str.size);
        double x = 0;
        int num = mp_number(v, &x);
        if (!strcmp(key, "until_loss") && num && x >= 0)
            w->until_loss = x;
        else if (!strcmp(key, "until_success") && num && x >= 0 && x <= 1)
            w->until_success = x;
        else if (!strcmp(key, "max_steps") && num && x == floor(x) && x >= 1 && x <= (1 << 30))
            max_steps = (int)x;
        else if (!strcmp(key, "until_loss") || !strcmp(key, "until_success") ||
                 !strcmp(key, "max_steps"))
            rl_arg_error(a, "rl", "warmup", "%s: expected %s, got %s", key,
                         key[0] == 'm'   ? "an integer >= 1"
                         : key[6] == 'l' ? "a number >= 0"
                                         : "a number in [0, 1]",
                         rl_mp_describe(v, d, sizeof d));
        else if (k->type == MSGPACK_OBJECT_STR)
            rl_arg_error(a, "rl", "warmup",
                         "%.*s: unknown key (until_loss, until_success, max_steps)",
                         (int)k->via.str.size, k->via.str.ptr);
        else
            rl_arg_error(a, "rl", "warmup", "a key that is not a string");
    }
    int until = w->until_loss >= 0 || w->until_success >= 0;
    w->max_steps = max_steps > 0 ? max_steps : until ? WARMUP_MAX_STEPS : 0;
}

/* rl.resume: true (this run folder's latest checkpoint), false, or a path:
 * a run folder (its latest checkpoint) or one checkpoint folder. */
static void read_resume(rl_args *a, ctl_state *s)
{
    const msgpack_object *v = rl_arg_get(a, "rl", "resume");
    char d[64];
    if (!v || a->rc) return;
    if (v->type == MSGPACK_OBJECT_BOOLEAN) {
        if (v->via.boolean) snprintf(s->resume, sizeof s->resume, "%s", s->run_dir);
    } else if (v->type == MSGPACK_OBJECT_STR && v->via.str.size > 0 &&
               v->via.str.size < sizeof s->resume) {
        memcpy(s->resume, v->via.str.ptr, v->via.str.size);
        s->resume[v->via.str.size] = 0;
    } else {
        rl_arg_error(a, "rl", "resume", "expected true, false or a folder, got %s",
                     rl_mp_describe(v, d, sizeof d));
    }
}

static int read_settings(ctl_state *s, manta_ctx *m, const void *args, size_t len)
{
    rl_args a;
    rl_args_open(&a, args, len);
    rl_arg_str(&a, "", "job", s->job, sizeof s->job, "job");
    s->G = (int)rl_arg_int(&a, "rl", "group_size", 8, 1, 1 << 16);
    s->B = (int)rl_arg_int(&a, "rl", "batch_episodes", 64, 1, 1 << 24);
    s->eta = (int)rl_arg_int(&a, "rl", "eta", 2, 0, 1 << 20);
    s->lr = rl_arg_num(&a, "rl", "lr", 1e-3, 0, 1e3);
    s->warmup_lr = rl_arg_num(&a, "rl", "warmup_lr", s->lr, 0, 1e3);
    read_warmup(&a, &s->wu);
    s->wu_given = rl_arg_get(&a, "rl", "warmup") || rl_arg_get(&a, "rl", "warmup_steps");
    s->dynamic_sampling = read_bool(&a, "rl", "dynamic_sampling", 1);
    s->no_reward_warn_versions =
        (int)rl_arg_int(&a, "rl", "no_reward_warn_versions", 50, 0, 1 << 30);
    s->warmup_batch = (int)rl_arg_int(&a, "rl", "warmup_batch", 64, 1, 1 << 24);
    s->max_versions = (int)rl_arg_int(&a, "rl", "max_versions", 100, 0, 1 << 30);
    s->max_time_s = rl_arg_num(&a, "rl", "max_time_s", 600, 0, 1e9);
    s->eval_every = (int)rl_arg_int(&a, "rl", "eval_every", 10, 0, 1 << 30);
    s->eval_n = (int)rl_arg_int(&a, "rl", "eval_problems", 200, 0, 1 << 30);
    s->stop_at = rl_arg_num(&a, "rl", "stop_at", 2.0, 0, 1e9);
    s->max_missing_s = rl_arg_num(&a, "rl", "max_missing_s", 30, 0, 1e9);
    s->max_step_failures = (int)rl_arg_int(&a, "rl", "max_step_failures", 10, 1, 1 << 30);
    s->step_timeout_ms = (int)(1000 * rl_arg_num(&a, "rl", "step_timeout_s", 600, 1, 86400));
    s->max_error_drop_rate = rl_arg_num(&a, "rl", "max_error_drop_rate", 0.5, 0, 1);
    s->ckpt_every = (int)rl_arg_int(&a, "rl", "checkpoint_every", 20, 0, 1 << 30);
    s->ckpt_keep = (int)rl_arg_int(&a, "rl", "checkpoint_keep", 2, 1, 1 << 20);
    rl_arg_str(&a, NULL, "learner_group", s->learner_group, sizeof s->learner_group, "learner");
    s->S = (int)rl_arg_int(&a, NULL, "learners", 0, 0, MAX_LEARNERS);
    rl_run_dir_read(&a, s->run_dir, sizeof s->run_dir); /* as the learners read it */
    read_resume(&a, s);
    rl_arg_str(&a, "task", "train", s->train_path, sizeof s->train_path, "");
    rl_arg_str(&a, "task", "heldout", s->heldout_path, sizeof s->heldout_path, "");
    rl_arg_str(&a, "task", "demos", s->demos_path, sizeof s->demos_path, "");
    rl_model_read(&a, &s->ms);
    if (!a.rc && s->B < s->G)
        rl_arg_error(&a, "rl", "batch_episodes", "%d is smaller than group_size (%d)", s->B, s->G);
    return rl_args_close(&a, m);
}

static int ctl_init(manta_ctx *m, void *state, const void *args, size_t len)
{
    ctl_state *s = state;
    s->m = m;
    int rc = read_settings(s, m, args, len);
    if (rc) return rc;
    s->g_r = calloc((size_t)s->G, sizeof *s->g_r);
    s->g_adv = calloc((size_t)s->G, sizeof *s->g_adv);
    s->g_idx = calloc((size_t)s->G, sizeof *s->g_idx);
    if (!s->g_r || !s->g_adv || !s->g_idx) return MANTA_ENOMEM;
    if (!s->train_path[0]) {
        rl_log(m, "controller: task.train: no training data named");
        return MANTA_EINVAL;
    }
    if ((rc = load_problems(s->train_path, &s->train, &s->n_train)) ||
        (s->heldout_path[0] && (rc = load_problems(s->heldout_path, &s->heldout, &s->n_heldout))) ||
        (s->demos_path[0] && (rc = load_demos(s, s->demos_path)))) {
        rl_log(m, "controller: task: %s", rl_last_error());
        return rc;
    }
    if (s->n_train == 0) {
        rl_log(m, "controller: task.train: no problems in '%s'", s->train_path);
        return MANTA_EINVAL;
    }
    if (s->eval_n > s->n_heldout) s->eval_n = s->n_heldout;
    s->version = -1;
    s->success_initial = s->success_final = -1;
    s->t_start = rl_now_s();
    rl_log(m, "controller: %d train, %d held-out, %d demos; G=%d B=%d eta=%d", s->n_train,
           s->n_heldout, s->n_demos, s->G, s->B, s->eta);
    if (s->wu.fixed >= 0 && s->wu.max_steps > 0)
        rl_log(m,
               "controller: rl.warmup_steps %d given: a warm-up of exactly %d steps "
               "(rl.warmup is not used)",
               s->wu.fixed, s->wu.fixed);
    return 0;
}

static void write_summary(ctl_state *s, const char *status);

static void ctl_fini(manta_ctx *m, void *state)
{
    ctl_state *s = state;
    if (s->phase != PH_NONE && s->phase != PH_DONE && s->run_dir_open) {
        rl_log(m, "controller: stopped during the run: summary.json says interrupted");
        write_summary(s, "interrupted");
    }
    rl_text_free(s->text);
    if (s->eval_out) fclose(s->eval_out);
    for (int i = 0; i < s->n_train; i++) free(s->train[i].text), free(s->train[i].answer);
    for (int i = 0; i < s->n_heldout; i++) free(s->heldout[i].text), free(s->heldout[i].answer);
    free(s->train), free(s->heldout);
    for (int i = 0; i < s->n_demos; i++) free(s->demos[i].tok), free(s->demos[i].mask);
    free(s->demos);
    for (int64_t g = 0; g < s->n_groups - s->g_base; g++) {
        for (int i = 0; s->groups[g].trajs && i < s->groups[g].n; i++)
            rl_traj_destroy(&s->groups[g].trajs[i]);
        free(s->groups[g].trajs), free(s->groups[g].usable);
    }
    free(s->groups), free(s->eps), free(s->queue), free(s->ready), free(s->eval_queue);
    free(s->holders), free(s->reason), free(s->reason_n), free(s->L), free(s->warnings);
    free(s->L_inc);
    free(s->g_r), free(s->g_adv), free(s->g_idx);
    rl_buckets_destroy(&s->buckets);
    cJSON_Delete(s->tool_errors_by_kind);
    if (s->timer) manta_timer_cancel(m, s->timer);
    if (s->metrics) fclose(s->metrics);
    if (s->traj_dump) fclose(s->traj_dump);
}

/* ---- bookkeeping ---- */

/* Room for n more episodes; 0 or MANTA_ENOMEM. */
static int reserve_episodes(ctl_state *s, int64_t n)
{
    int64_t len = s->n_eps - s->eps_base;
    if (len + n <= s->cap_eps) return 0;
    int64_t cap = s->cap_eps ? s->cap_eps : 4096;
    while (cap < len + n) cap *= 2;
    episode *e = realloc(s->eps, (size_t)cap * sizeof *e);
    if (!e) return rl_fail(MANTA_ENOMEM, "out of memory for %lld episodes", (long long)cap);
    s->eps = e, s->cap_eps = cap;
    return 0;
}

static int64_t new_episode(ctl_state *s, int64_t gid, int32_t prompt, int eval)
{
    if (reserve_episodes(s, 1)) return -1;
    EPI(s, s->n_eps) = (episode){eval ? EP_EVAL : EP_INFLIGHT, -1, gid, prompt};
    return s->n_eps++;
}

static int64_t new_group(ctl_state *s, int32_t prompt)
{
    if (s->n_groups - s->g_base == s->cap_groups) {
        int64_t cap = s->cap_groups ? s->cap_groups * 2 : 1024;
        group *g = realloc(s->groups, (size_t)cap * sizeof *g);
        if (!g) return -1;
        s->groups = g, s->cap_groups = cap;
    }
    group *g = &GRP(s, s->n_groups);
    memset(g, 0, sizeof *g);
    g->prompt = prompt;
    g->n = s->G;
    g->trajs = calloc((size_t)s->G, sizeof *g->trajs);
    g->usable = calloc((size_t)s->G, 1);
    if (!g->trajs || !g->usable || reserve_episodes(s, s->G)) {
        free(g->trajs), free(g->usable);
        g->trajs = NULL, g->usable = NULL;
        return -1;
    }
    return s->n_groups++; /* its G episodes cannot fail now */
}

/* Append v to a growing array. Out of memory is a broken run (an episode
 * or group would silently leave the ledger): stop loudly. */
static void push64(int64_t **arr, int64_t *len, int64_t *cap, int64_t v)
{
    if (*len == *cap) {
        int64_t c = *cap ? *cap * 2 : 256;
        int64_t *n = realloc(*arr, (size_t)c * sizeof *n);
        if (!n) {
            fprintf(stderr,
                    "%s:%d: controller: out of memory growing a queue to %lld entries; "
                    "the ledger cannot stay exact. HINT: give the controller more memory\n",
                    __FILE__, __LINE__, (long long)c);
            abort();
        }
        *arr = n, *cap = c;
    }
    (*arr)[(*len)++] = v;
}

#define MAX_REASONS 32 /* distinct drop reasons kept; the rest count as "other" */

static void count_reason_n(ctl_state *s, const char *why, int64_t k)
{
    if (s->n_reasons >= MAX_REASONS - 1) {
        int known = 0;
        for (int i = 0; i < s->n_reasons && !known; i++)
            known = !strncmp(s->reason[i], why, sizeof s->reason[i] - 1);
        if (!known) why = "other";
    }
    for (int i = 0; i < s->n_reasons; i++)
        if (!strncmp(s->reason[i], why, sizeof s->reason[i] - 1)) {
            s->reason_n[i] += k;
            return;
        }
    if (s->n_reasons == s->cap_reasons) {
        int cap = s->cap_reasons ? 2 * s->cap_reasons : 8;
        char(*r)[96] = realloc(s->reason, (size_t)cap * sizeof *r);
        if (r) s->reason = r;
        int64_t *n = realloc(s->reason_n, (size_t)cap * sizeof *n);
        if (n) s->reason_n = n;
        if (!r || !n) {
            rl_log(s->m, "controller: out of memory counting drop reason '%s'", why);
            return;
        }
        s->cap_reasons = cap;
    }
    snprintf(s->reason[s->n_reasons], sizeof s->reason[0], "%s", why);
    s->reason_n[s->n_reasons++] = k;
}

static void count_reason(ctl_state *s, const char *why)
{
    count_reason_n(s, why, 1);
}

#define MAX_WARNINGS 16 /* kept for summary.json; later ones go to the log only */

/* Something the user must know about a run that goes on: the controller's
 * log ("WARNING: ..."), a {"warning"} line in metrics.jsonl, and the
 * `warnings` list of summary.json (which `manta run` prints at the end). */
static void warn(ctl_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(ctl_state *s, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rl_log(s->m, "controller: WARNING: %s", msg);
    if (s->metrics) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "warning", msg);
        cJSON_AddNumberToObject(j, "version", (double)s->version);
        cJSON_AddNumberToObject(j, "time_s", rl_now_s() - s->t_start);
        char *txt = cJSON_PrintUnformatted(j);
        if (txt) fprintf(s->metrics, "%s\n", txt), fflush(s->metrics);
        free(txt);
        cJSON_Delete(j);
    }
    if (!s->warnings) s->warnings = calloc(MAX_WARNINGS, sizeof *s->warnings);
    if (s->warnings && s->n_warnings < MAX_WARNINGS)
        snprintf(s->warnings[s->n_warnings++], sizeof s->warnings[0], "%s", msg);
}

/* A group's trajectories are done with (trained, dropped, or none usable):
 * its storage goes; the record goes with the next compaction. */
static void group_release(group *g)
{
    for (int j = 0; g->trajs && j < g->n; j++) rl_traj_destroy(&g->trajs[j]);
    free(g->trajs), free(g->usable);
    g->trajs = NULL, g->usable = NULL;
}

static void drop(ctl_state *s, int64_t ep, int stale, const char *why);

#define NO_SIGNAL "no_signal" /* the ledger's reason for a group without signal */

/* The rewards of group g's usable members into s->g_r, their indices into
 * s->g_idx; returns how many. */
static int group_rewards(ctl_state *s, const group *g)
{
    int k = 0;
    for (int i = 0; i < g->n; i++)
        if (g->usable[i]) s->g_idx[k] = i, s->g_r[k] = g->trajs[i].reward, k++;
    return k;
}

/* Dynamic sampling (DAPO): a group whose usable members' rewards are all
 * equal (or that has one usable member) has no advantage to learn from, so
 * it never reaches the learner: its members are dropped with reason
 * "no_signal", which gives their admission back so that new groups take
 * their place in the batch. Returns the members dropped (0: it has signal). */
static int drop_no_signal(ctl_state *s, group *g)
{
    if (!s->dynamic_sampling) return 0;
    int k = group_rewards(s, g);
    if (k == 0 || rl_group_has_signal(s->g_r, k)) return 0;
    for (int j = 0; j < k; j++) {
        int i = s->g_idx[j];
        g->usable[i] = 0;
        drop(s, g->first_ep + i, 0, NO_SIGNAL);
        s->dropped_no_signal++;
        rl_traj_destroy(&g->trajs[i]);
    }
    s->no_signal_groups++, s->v_no_signal_groups++;
    return k;
}

static void member_resolved(ctl_state *s, int64_t gid)
{
    group *g = &GRP(s, gid);
    g->resolved++;
    if (g->resolved == g->n && !g->ready) {
        g->ready = 1;
        int usable = 0;
        for (int i = 0; i < g->n; i++) usable += g->usable[i];
        usable -= drop_no_signal(s, g);
        if (usable == 0) {
            group_release(g);
            return;
        }
        int64_t cap = s->r_cap;
        push64(&s->ready, &s->r_len, &cap, gid);
        s->r_cap = cap;
        s->ready_eps += usable;
    }
}

static void drop(ctl_state *s, int64_t ep, int stale, const char *why)
{
    EPI(s, ep).state = stale ? EP_STALE : EP_ERROR;
    if (stale)
        s->led.dropped_stale++;
    else {
        s->led.dropped_error++;
        count_reason(s, why);
    }
    s->credits++;
}

/* Episodes dropped because a group the rollouts need has no actor ("no
 * reward actor in group 'reward'", "no env actor in group 'env'") start a
 * streak; a submission that shows the group at work ends it (a scored
 * episode for the reward group, a tool call answered for the env group).
 * The run fails when a streak's drops span rl.max_missing_s (one drop
 * followed by a quiet spell, say while a step waits, does not). */
static void note_missing(ctl_state *s, const rl_traj *t)
{
    int k = -1;
    if (t->status != RL_EP_OK && !strncmp(t->error, "no reward actor", 15)) k = 0;
    if (t->status != RL_EP_OK && !strncmp(t->error, "no env actor", 12)) k = 1;
    if (k >= 0) {
        s->missing_last[k] = rl_now_s();
        if (s->missing_since[k] == 0) {
            s->missing_since[k] = s->missing_last[k];
            snprintf(s->missing_why[k], sizeof s->missing_why[k], "%s", t->error);
        }
        return;
    }
    if (t->status != RL_EP_OK) return;
    s->missing_since[0] = 0;
    if (t->tool_calls > t->tool_errors) s->missing_since[1] = 0;
}

/* A run that sees no reward learns nothing (every group is dropped without
 * signal, no version is trained): after rl.no_reward_warn_versions batches'
 * worth of scored training episodes in a row with reward <= 0 it says so,
 * once per such streak, with what to check. */
static void note_reward(ctl_state *s, const rl_traj *t)
{
    s->v_scored++, s->v_reward += t->reward, s->v_successes += t->reward >= 0.5f;
    if (t->reward > 0) {
        if (s->no_reward_warned)
            rl_log(s->m, "controller: a reward again at version %lld, after %lld episodes without",
                   (long long)s->version, (long long)s->no_reward_run);
        s->no_reward_run = 0, s->no_reward_warned = 0;
        return;
    }
    int64_t limit = (int64_t)s->no_reward_warn_versions * s->B;
    if (++s->no_reward_run < limit || limit == 0 || s->no_reward_warned) return;
    s->no_reward_warned = 1;
    char txt[300];
    rl_traj_render(t, txt, sizeof txt);
    rl_log(s->m, "controller: the latest episode without reward: %s", txt);
    warn(s,
         "no reward in %lld training episodes in a row (rl.no_reward_warn_versions %d x "
         "batch_episodes %d) at version %lld: every group's rewards are equal, so %s. Check "
         "that the warm-up reproduces the demonstrations (summary.json warmup), the tool "
         "errors (%lld of %lld calls) and the reward rule against the samples in the "
         "controller log",
         (long long)s->no_reward_run, s->no_reward_warn_versions, s->B, (long long)s->version,
         s->dynamic_sampling ? "nothing is trained (dropped as no_signal)"
                             : "every advantage is 0 (rl.dynamic_sampling is off)",
         (long long)s->tool_errors, (long long)s->tool_calls);
}

/* The error-drop window (rl.max_error_drop_rate, checked in advance): a
 * training episode resolved, and whether it was dropped for an error. A
 * missing reward or env group has its own rule (rl.max_missing_s), which
 * tolerates a restart; these drops are not counted here. */
static void note_error_drop(ctl_state *s, const rl_traj *t)
{
    s->win_resolved++;
    if (t->status == RL_EP_OK || !strncmp(t->error, "no reward actor", 15) ||
        !strncmp(t->error, "no env actor", 12))
        return;
    s->win_errors++;
    snprintf(s->win_why, sizeof s->win_why, "%s", t->error[0] ? t->error : "error");
}

static int ep_final(int state)
{
    return state == EP_TRAINED || state == EP_STALE || state == EP_ERROR || state == EP_EVAL_DONE;
}

/* Let go of the records of resolved episodes and released groups at the
 * front of their windows, and of the consumed heads of the queues: what the
 * controller holds is bounded by what is in flight, not by the versions
 * trained. Runs from the run loop and from admit, never nested in a step
 * (advancing). */
static void compact(ctl_state *s)
{
    int64_t len = s->n_eps - s->eps_base, d = 0;
    while (d < len && ep_final(s->eps[d].state)) d++;
    if (d > 0) {
        memmove(s->eps, s->eps + d, (size_t)(len - d) * sizeof *s->eps);
        s->eps_base += d;
    }
    len = s->n_groups - s->g_base, d = 0;
    while (d < len && s->groups[d].resolved == s->groups[d].n && !s->groups[d].trajs) d++;
    if (d > 0) {
        memmove(s->groups, s->groups + d, (size_t)(len - d) * sizeof *s->groups);
        s->g_base += d;
    }
    if (s->r_head > 0) {
        memmove(s->ready, s->ready + s->r_head, (size_t)(s->r_len - s->r_head) * sizeof *s->ready);
        s->r_len -= s->r_head, s->r_head = 0;
    }
    if (s->q_head > 0) {
        memmove(s->queue, s->queue + s->q_head, (size_t)(s->q_len - s->q_head) * sizeof *s->queue);
        s->q_len -= s->q_head, s->q_head = 0;
    }
}

/* ---- methods ---- */

static void schedule(ctl_state *s, int64_t after_ms);
static int batch_ready(ctl_state *s);

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
    if (s->n_holders == s->cap_holders) {
        int cap = s->cap_holders ? 2 * s->cap_holders : 16;
        holder *hs = realloc(s->holders, (size_t)cap * sizeof *hs);
        if (!hs) {
            rl_log(s->m, "controller: out of memory tracking rollout %s", name);
            return -1;
        }
        s->holders = hs, s->cap_holders = cap;
    }
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
        for (int64_t id = s->eps_base; id < s->n_eps; id++) {
            episode *e = &EPI(s, id);
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

/* Choose up to `want` episodes for a rollout: evaluation episodes first,
 * then handed-back ones, then new GRPO groups within the staleness bound. */
static int choose_episodes(ctl_state *s, int64_t want, int64_t *out)
{
    int n = 0;
    if (!s->have_weights || s->stop) return 0;
    while (n < want && s->eq_head < s->eq_len) out[n++] = s->eval_queue[s->eq_head++];
    while (n < want && s->q_head < s->q_len) {
        int64_t id = s->queue[s->q_head++];
        if (id < s->eps_base || EPI(s, id).state != EP_QUEUED) continue; /* abandoned */
        EPI(s, id).state = EPI(s, id).group < 0 ? EP_EVAL : EP_INFLIGHT;
        out[n++] = id;
    }
    while (s->admit_train && n + s->G <= want &&
           rl_admit_ok(s->led.admitted - s->credits, s->G, s->version, s->eta, s->B)) {
        int32_t prompt = (int32_t)(s->next_train++ % s->n_train);
        int64_t gid = new_group(s, prompt);
        if (gid < 0) {
            rl_log(s->m, "controller: out of memory for group %lld; admitting none",
                   (long long)s->n_groups);
            break;
        }
        for (int i = 0; i < s->G; i++) {
            int64_t id = new_episode(s, gid, prompt, 0);
            if (i == 0) GRP(s, gid).first_ep = id;
            out[n++] = id;
            s->led.admitted++;
        }
    }
    return n;
}

/* One line of RUN_DIR/eval_final.jsonl (open_eval_out). */
static void write_eval_answer(ctl_state *s, int prompt, const rl_traj *t)
{
    char ans[1024];
    rl_text_answer(s->text, t, ans, sizeof ans);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "prompt", s->heldout[prompt].text);
    cJSON_AddStringToObject(j, "reference", s->heldout[prompt].answer);
    cJSON_AddStringToObject(j, "answer", ans);
    cJSON_AddNumberToObject(j, "reward", t->reward);
    cJSON_AddStringToObject(j, "status", t->status == RL_EP_OK ? "ok" : "error");
    cJSON_AddNumberToObject(j, "tool_calls", t->tool_calls);
    char *line = cJSON_PrintUnformatted(j);
    if (line) fprintf(s->eval_out, "%s\n", line);
    free(line);
    cJSON_Delete(j);
}

static int ctl_admit(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    rl_admit_req q;
    int rc = rl_admit_req_decode(&q, arg, len);
    if (rc) return manta_reply_error(req, rc, "%s", rl_last_error());
    /* at most what was asked for, and never more than the episodes there are */
    int64_t groups = q.groups < (1 << 20) ? q.groups : (1 << 20);
    int64_t want = groups * s->G, bound = s->n_eps + s->eq_len + s->q_len + 16 * (int64_t)s->B;
    if (want > bound) want = bound;
    if (!s->advancing) compact(s); /* not nested in a step: no batch is being formed */
    int h = want > 0 ? holder_of(s, q.rollout) : -1;
    int64_t *ids = want > 0 ? malloc((size_t)want * sizeof *ids) : NULL;
    rl_admit_reply r = {.version = s->version, .stop = s->stop};
    r.n_eps = ids || want == 0 ? choose_episodes(s, want, ids) : 0;
    r.eps = r.n_eps ? calloc((size_t)r.n_eps, sizeof *r.eps) : NULL;
    if ((want > 0 && !ids) || (r.n_eps && !r.eps)) {
        free(ids), free(r.eps);
        return manta_reply_error(req, MANTA_ENOMEM, "admit: out of memory for %lld episodes",
                                 (long long)want);
    }
    for (int i = 0; i < r.n_eps; i++) {
        episode *e = &EPI(s, ids[i]);
        e->holder = h;
        int eval = e->group < 0;
        problem *p = eval ? &s->heldout[e->prompt] : &s->train[e->prompt];
        r.eps[i] = (rl_admit_ep){ids[i], e->group, e->prompt, eval, p->text, p->answer};
    }
    r.has_buckets = s->have_weights && q.version < s->version;
    r.buckets = s->buckets; /* borrowed */
    char *buf;
    size_t n;
    rc = rl_admit_reply_encode(&r, &buf, &n);
    free(ids), free(r.eps);
    if (rc) return manta_reply_error(req, rc, "%s", rl_last_error());
    rc = manta_reply(req, buf, n);
    free(buf);
    return rc;
}

static int ctl_submit(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    rl_traj t;
    rl_traj_init(&t);
    if (rl_traj_decode_vocab(&t, arg, len, s->ms.vocab)) {
        rl_traj_destroy(&t);
        return manta_reply_error(req, MANTA_EINVAL, "submit: not a trajectory");
    }
    int64_t id = t.episode;
    if (id < 0 || id >= s->n_eps) {
        rl_traj_destroy(&t);
        return manta_reply_error(req, MANTA_EINVAL, "submit: unknown episode %lld", (long long)id);
    }
    note_missing(s, &t);
    if (id < s->eps_base) { /* resolved long ago (its record is gone): a duplicate */
        s->duplicates++;
        rl_traj_destroy(&t);
        return manta_reply(req, "dup", 3);
    }
    episode *e = &EPI(s, id);
    s->tool_calls += t.tool_calls, s->tool_errors += t.tool_errors;
    s->v_tool_calls += t.tool_calls, s->v_tool_errors += t.tool_errors;
    int gen = rl_traj_trained_tokens(&t);
    s->gen_tokens += gen, s->v_gen_tokens += gen;
    if (!s->text && rl_text_new(&s->ms, &s->text)) s->text = NULL; /* for the log and answers */
    if (e->group < 0) {                                            /* evaluation */
        if (e->state == EP_EVAL && t.reward < 0.5f && s->eval_logged++ < 4) {
            char txt[512];
            if (s->text)
                rl_text_render(s->text, &t, txt, sizeof txt);
            else
                rl_traj_render(&t, txt, sizeof txt);
            rl_log(s->m, "eval sample (reward %.0f, ref %s): %s", t.reward,
                   s->heldout[e->prompt].answer, txt);
        }
        if (e->state == EP_EVAL && s->eval_out && s->text) write_eval_answer(s, e->prompt, &t);
        if (e->state == EP_EVAL) {
            e->state = EP_EVAL_DONE;
            if (++s->eval_done >= s->eval_total) schedule(s, 0);
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
        if (s->text)
            rl_text_render(s->text, &t, txt, sizeof txt);
        else
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
    group *g = &GRP(s, e->group);
    int idx = (int)(id - g->first_ep);
    if (t.status == RL_EP_OK) note_reward(s, &t);
    note_error_drop(s, &t);
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
    if (batch_ready(s)) schedule(s, 0);
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
            if (id < s->eps_base || id >= s->n_eps) continue;
            if (EPI(s, id).state != EP_INFLIGHT && EPI(s, id).state != EP_EVAL) continue;
            EPI(s, id).state = EP_QUEUED;
            EPI(s, id).holder = -1;
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
    for (int i = 0; i < s->n_reasons; i++)
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
    cJSON *r = cJSON_AddObjectToObject(j, "records"); /* what the controller holds */
    cJSON_AddNumberToObject(r, "episodes", (double)(s->n_eps - s->eps_base));
    cJSON_AddNumberToObject(r, "groups", (double)(s->n_groups - s->g_base));
    cJSON_AddNumberToObject(r, "episode_capacity", (double)s->cap_eps);
    cJSON_AddNumberToObject(r, "group_capacity", (double)s->cap_groups);
    cJSON_AddNumberToObject(r, "queue_capacity", (double)(s->q_cap + s->r_cap));
    cJSON_AddNumberToObject(r, "drop_reasons", s->n_reasons);
    struct mallinfo2 mi = mallinfo2(); /* live heap bytes of this process */
    cJSON_AddNumberToObject(r, "heap_in_use", (double)mi.uordblks);
    if (s->n_eps > s->eps_base) { /* what holds the window open */
        cJSON_AddNumberToObject(r, "oldest_episode", (double)s->eps_base);
        cJSON_AddNumberToObject(r, "oldest_state", s->eps[0].state);
        cJSON_AddNumberToObject(r, "oldest_group", (double)s->eps[0].group);
    }
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    int rc = manta_reply(req, txt, strlen(txt));
    free(txt);
    return rc;
}

/* ---- the training loop ---- */

/* Find the S learner shards (the learners setting, else learner-0.. until
 * one is missing). */
static int find_learners(ctl_state *s)
{
    int n = 0, cap = 0;
    for (int i = 0; i < MAX_LEARNERS; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s-%d", s->learner_group, i);
        manta_actor *a;
        if (manta_actor_lookup(s->m, name, &a)) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            manta_actor **L = realloc(s->L, (size_t)cap * sizeof *L);
            if (!L) return rl_fail(MANTA_ENOMEM, "out of memory for %d learners", cap);
            s->L = L;
        }
        s->L[n++] = a;
        if (s->S > 0 && n == s->S) break;
    }
    return n;
}

/* A shard that is not alive fails a call to all of them at once: the
 * others would wait for it in their collectives until the deadline. */
static int learners_alive(ctl_state *s)
{
    for (int i = 0; i < s->S; i++) {
        manta_actor_info info;
        if (manta_actor_info_get(s->m, s->L[i], &info) == 0 && info.state != MANTA_ACTOR_ALIVE)
            return rl_fail(MANTA_EREMOTE, "learner %d is not alive", i);
    }
    return 0;
}

/* The shards' incarnations now: the ones whose state the group holds. */
static void note_incarnations(ctl_state *s)
{
    for (int i = 0; i < s->S; i++) {
        manta_actor_info info;
        if (manta_actor_info_get(s->m, s->L[i], &info) == 0) s->L_inc[i] = info.incarnation;
    }
}

/* The first shard that came back as a new incarnation (its parameters are
 * the seed's and its AdamW state is gone), or -1; its incarnation in *inc. */
static int learner_restarted(ctl_state *s, int *inc)
{
    for (int i = 0; i < s->S; i++) {
        manta_actor_info info;
        if (manta_actor_info_get(s->m, s->L[i], &info) == 0 && info.state == MANTA_ACTOR_ALIVE &&
            info.incarnation != s->L_inc[i]) {
            *inc = info.incarnation;
            return i;
        }
    }
    return -1;
}

/* A path as the learners take it: they confine save, checkpoint and
 * restore to the run folder they read from the spec (learner.c), so a
 * path in it goes relative to it; one elsewhere (rl.resume's folder)
 * absolute. Returns path, a suffix of it, or out (PATH_MAX bytes). */
static const char *learner_path(const ctl_state *s, const char *path, char *out)
{
    size_t n = strlen(s->run_dir);
    if (!strncmp(path, s->run_dir, n) && path[n] == '/' && path[n + 1]) return path + n + 1;
    return path[0] != '/' && realpath(path, out) ? out : path;
}

/* Call `method` with a path (learner_path's form) on every shard and wait
 * for all (up to timeout_ms); 0 when every one answered. */
static int call_all(ctl_state *s, const char *method, const char *path, int timeout_ms)
{
    char abs[PATH_MAX];
    const char *arg = learner_path(s, path, abs);
    int rc = learners_alive(s);
    if (rc) return rc;
    if (s->S < 1) return rl_fail(MANTA_EINVAL, "%s: no learner shards", method);
    manta_future **f = calloc((size_t)s->S, sizeof *f);
    if (!f) return rl_fail(MANTA_ENOMEM, "%s: out of memory", method);
    for (int i = 0; i < s->S; i++)
        f[i] = manta_call_timeout(s->m, s->L[i], method, arg, strlen(arg), timeout_ms);
    manta_wait(f, (size_t)s->S, (size_t)s->S, timeout_ms);
    for (int i = 0; i < s->S; i++) {
        int r = manta_get(f[i], 0, NULL, NULL);
        if (r && !rc) rc = rl_fail(r, "learner %d %s: %s", i, method, manta_future_error(f[i]));
        manta_future_free(f[i]);
    }
    free(f);
    return rc;
}

/* Call `method` with args[i] on every shard, wait for all; replies decoded
 * into out[i] (whose buckets are appended to *buckets in shard order). */
static int call_learners(ctl_state *s, const char *method, char **args, size_t *lens,
                         rl_step_reply *out, rl_buckets *buckets)
{
    int rc = learners_alive(s);
    if (rc) return rc;
    manta_future **f = calloc((size_t)s->S, sizeof *f);
    if (!f) return rl_fail(MANTA_ENOMEM, "%s: out of memory", method);
    for (int i = 0; i < s->S; i++)
        f[i] = manta_call_timeout(s->m, s->L[i], method, args ? args[i] : "", args ? lens[i] : 0,
                                  s->step_timeout_ms);
    manta_wait(f, (size_t)s->S, (size_t)s->S, s->step_timeout_ms);
    for (int i = 0; i < s->S; i++) {
        const void *d;
        size_t n;
        char why[700] = "";
        int r = manta_get(f[i], 0, &d, &n);
        if (r)
            snprintf(why, sizeof why, "%s", manta_future_error(f[i]));
        else if ((r = rl_step_reply_decode(&out[i], d, n)) == 0)
            r = rl_buckets_append(buckets, &out[i].buckets);
        else
            snprintf(why, sizeof why, "%s", rl_last_error());
        if (why[0]) rl_log(s->m, "controller: learner %d %s: %s", i, method, why);
        if (r && !rc)
            rc = rl_fail(r, "learner %d %s failed%s%s", i, method, why[0] ? ": " : "", why);
        manta_future_free(f[i]);
    }
    free(f);
    return rc;
}

/* Make the buckets just collected the current version's weights. */
static void take_buckets(ctl_state *s, rl_buckets *b)
{
    rl_buckets_destroy(&s->buckets);
    s->buckets = *b;
    memset(b, 0, sizeof *b);
}

/* The statistics of one step over the whole batch (shard 0's view of the
 * all-reduced values; busy time the slowest shard's). */
static void step_stats(const rl_step_reply *r, int S, rl_step_reply *o)
{
    *o = r[0];
    memset(&o->buckets, 0, sizeof o->buckets);
    for (int i = 1; i < S; i++)
        if (r[i].busy_s > o->busy_s) o->busy_s = r[i].busy_s;
}

/* One step on every shard: shard i gets sequences i, i+S, ... On success
 * the shards' buckets become the current weights. */
static int learn_step(ctl_state *s, int mode, double lr, const rl_step_item *q, int nq,
                      int64_t new_version, rl_step_reply *o)
{
    int S = s->S, rc = 0;
    char **args = calloc((size_t)S, sizeof *args);
    size_t *lens = calloc((size_t)S, sizeof *lens);
    rl_step_item *mine = calloc((size_t)(nq / S + 1), sizeof *mine);
    rl_step_reply *out = calloc((size_t)S, sizeof *out);
    rl_buckets nb = {0};
    if (!args || !lens || !mine || !out) rc = rl_fail(MANTA_ENOMEM, "step: out of memory");
    for (int i = 0; !rc && i < S; i++) {
        rl_step_req r = {.mode = mode, .version = new_version, .lr = lr, .items = mine};
        for (int k = i; k < nq; k += S) mine[r.n_items++] = q[k];
        rc = rl_step_req_encode(&r, &args[i], &lens[i]);
    }
    if (!rc) rc = call_learners(s, "step", args, lens, out, &nb);
    if (!rc) step_stats(out, S, o), take_buckets(s, &nb);
    for (int i = 0; i < S; i++) {
        if (args) free(args[i]);
        if (out) rl_step_reply_destroy(&out[i]);
    }
    rl_buckets_destroy(&nb);
    free(args), free(lens), free(mine), free(out);
    return rc;
}

/* Version 0: every shard publishes its slice of the initial parameters. */
static int publish_initial(ctl_state *s)
{
    rl_step_reply *out = calloc((size_t)s->S, sizeof *out);
    rl_buckets nb = {0};
    int rc = out ? call_learners(s, "publish", NULL, NULL, out, &nb)
                 : rl_fail(MANTA_ENOMEM, "publish: out of memory");
    if (!rc) take_buckets(s, &nb);
    for (int i = 0; out && i < s->S; i++) rl_step_reply_destroy(&out[i]);
    rl_buckets_destroy(&nb);
    free(out);
    return rc;
}

/* The supervised warm-up on the demonstrations (policy tokens only): a
 * fixed number of steps (rl.warmup_steps), or until they are reproduced
 * (rl.warmup: until_loss / until_success, at most max_steps). Every step
 * reports the demo loss and the fraction reproduced before its update; a
 * warm-up that hits max_steps first says so (warn). */
static void warmup(ctl_state *s)
{
    const rl_warmup *w = &s->wu;
    if (w->fixed == 0 || (w->fixed < 0 && w->max_steps <= 0)) return;
    if (s->n_demos == 0) {
        if (s->wu_given)
            warn(s, "a warm-up is set (rl.warmup / rl.warmup_steps) but task.demos names no "
                    "demonstrations: RL starts from the initial policy");
        return;
    }
    /* each step the next nb demonstrations, in turn (all of them when they
     * fit in one batch) */
    int nb = s->n_demos < s->warmup_batch ? s->n_demos : s->warmup_batch, next = 0;
    rl_step_item *q = calloc((size_t)nb, sizeof *q);
    if (!q) return;
    int limit = w->fixed >= 0 ? w->fixed : w->max_steps;
    rl_step_reply o;
    int failures = 0;
    for (int t = 1; s->wu_outcome == RL_WARMUP_GO; t++) {
        for (int i = 0; i < nb; i++) {
            const demo *d = &s->demos[(next + i) % s->n_demos];
            q[i] = (rl_step_item){d->n, d->tok, NULL, d->mask, 0};
        }
        if (learn_step(s, RL_STEP_SFT, s->warmup_lr, q, nb, -1, &o)) {
            rl_log(s->m, "warm-up step %d: %s", t, rl_last_error());
            if (++failures >= s->max_step_failures) {
                snprintf(s->wu_error, sizeof s->wu_error,
                         "warm-up step failed %d times in a row (rl.max_step_failures): %s",
                         failures, rl_last_error());
                break;
            }
            t--; /* the same step again */
            continue;
        }
        failures = 0;
        next = (next + nb) % s->n_demos;
        s->wu_steps = t, s->wu_loss = o.loss, s->wu_reproduced = o.reproduced;
        s->wu_outcome = rl_warmup_check(w, t, o.loss, o.reproduced);
        if (t % 10 == 1 || s->wu_outcome != RL_WARMUP_GO)
            rl_log(s->m, "warm-up step %d/%d: demo loss %.4f, reproduced %.3f", t, limit, o.loss,
                   o.reproduced);
    }
    free(q);
    if (s->wu_error[0]) return;
    if (s->wu_outcome == RL_WARMUP_LIMIT)
        warn(s,
             "the warm-up stopped at rl.warmup.max_steps (%d) before the demonstrations were "
             "reproduced: demo loss %.4f (until_loss %g), reproduced %.3f (until_success %g). "
             "Raise max_steps or warmup_lr, or check the demonstrations",
             s->wu_steps, s->wu_loss, w->until_loss, s->wu_reproduced, w->until_success);
    else if (w->fixed < 0 && (w->until_loss >= 0 || w->until_success >= 0))
        rl_log(s->m,
               "warm-up: demonstrations reproduced after %d steps (demo loss %.4f, "
               "reproduced %.3f)",
               s->wu_steps, s->wu_loss, s->wu_reproduced);
}

/* Queue an evaluation over the first n held-out problems. */
static void start_eval(ctl_state *s, int n)
{
    /* the previous evaluation's episodes that never came back are abandoned
     * (a late answer is a duplicate) */
    for (int64_t id = s->eval_first > s->eps_base ? s->eval_first : s->eps_base; id < s->n_eps;
         id++)
        if (EPI(s, id).group < 0 && (EPI(s, id).state == EP_EVAL || EPI(s, id).state == EP_QUEUED))
            EPI(s, id).state = EP_EVAL_DONE;
    s->eval_first = s->n_eps;
    free(s->eval_queue);
    s->eval_queue = calloc((size_t)(n ? n : 1), sizeof *s->eval_queue);
    s->eq_len = s->eq_head = 0;
    for (int i = 0; s->eval_queue && i < n; i++) {
        int64_t id = new_episode(s, -1, i, 1);
        if (id >= 0) s->eval_queue[s->eq_len++] = id;
    }
    s->eval_active = 1, s->eval_total = (int)s->eq_len, s->eval_done = s->eval_success = 0;
    s->eval_vmin = -1, s->eval_vmax = -1;
    s->eval_logged = 0;
}

static double eval_success(const ctl_state *s)
{
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
    if (s->phase != PH_TRAIN) return 0;
    if (s->ready_eps >= s->B) return 1;
    if (s->ready_eps == 0) return 0;
    rl_ledger l;
    ledger_now(s, &l);
    int64_t pending = l.in_flight - s->ready_eps; /* generating or waiting for group mates */
    return pending == 0 &&
           !rl_admit_ok(s->led.admitted - s->credits, s->G, s->version, s->eta, s->B);
}

/* A batch being formed: sequences with their advantages, the groups they
 * came from, and what the metrics line reports. */
typedef struct batch {
    rl_step_item *q;
    int nq, cap;
    int64_t *taken; /* group ids consumed */
    int ntaken;
    double rsum, succ;
    int64_t hist[STALE_BINS];
} batch;

/* Drop the members of group g that became too stale for this version;
 * returns how many usable members are left. */
static int drop_stale(ctl_state *s, group *g)
{
    int usable = 0;
    for (int i = 0; i < g->n; i++) {
        if (g->usable[i] && rl_is_stale(rl_traj_min_version(&g->trajs[i]), s->version, s->eta)) {
            g->usable[i] = 0;
            s->ready_eps--;
            drop(s, g->first_ep + i, 1, "stale");
            rl_traj_destroy(&g->trajs[i]);
        }
        usable += g->usable[i];
    }
    return usable;
}

/* Add the usable members of group g with their GRPO advantages (a group
 * without signal only comes here when rl.dynamic_sampling is false). */
static void add_group(ctl_state *s, batch *b, group *g)
{
    int k = group_rewards(s, g);
    if (!rl_group_advantages(s->g_r, k, 1e-6f, s->g_adv)) /* rl.dynamic_sampling false */
        s->no_signal_groups++, s->v_no_signal_groups++;
    for (int j = 0; j < k; j++) {
        rl_traj *t = &g->trajs[s->g_idx[j]];
        b->q[b->nq++] = (rl_step_item){t->n, t->tok, t->logp, t->mask, s->g_adv[j]};
        b->rsum += t->reward, b->succ += t->reward >= 0.5f;
        int32_t st = (int32_t)(s->version - rl_traj_min_version(t));
        b->hist[st < 0 ? 0 : st >= STALE_BINS ? STALE_BINS - 1 : st]++;
    }
}

/* Take complete groups from the ready queue, B episodes at most (rounded up
 * to a multiple of S), re-checking staleness against the training version. */
static int form_batch(ctl_state *s, batch *b)
{
    memset(b, 0, sizeof *b);
    b->cap = s->S * ((s->B + s->S - 1) / s->S);
    if (b->cap < s->G) b->cap = s->G;
    b->q = calloc((size_t)b->cap, sizeof *b->q);
    b->taken = calloc((size_t)(s->r_len - s->r_head) + 1, sizeof *b->taken);
    if (!b->q || !b->taken) return rl_fail(MANTA_ENOMEM, "batch: out of memory");
    while (s->r_head < s->r_len) {
        group *g = &GRP(s, s->ready[s->r_head]);
        int usable = drop_stale(s, g);
        if (usable > 0) { /* stale members gone: the rest may have no signal left */
            int ns = drop_no_signal(s, g);
            s->ready_eps -= ns, usable -= ns;
        }
        if (usable > 0 && b->nq + usable > b->cap) break;
        s->r_head++;
        if (usable == 0) {
            group_release(g);
            continue;
        }
        add_group(s, b, g);
        b->taken[b->ntaken++] = s->ready[s->r_head - 1];
    }
    s->ready_eps -= b->nq;
    return 0;
}

/* The trajectories of consumed groups are done with: trained, or dropped
 * when the step failed. */
static void release_groups(ctl_state *s, const batch *b, int trained)
{
    for (int i = 0; i < b->ntaken; i++) {
        group *g = &GRP(s, b->taken[i]);
        for (int j = 0; j < g->n; j++) {
            if (g->usable[j] && trained)
                EPI(s, g->first_ep + j).state = EP_TRAINED;
            else if (g->usable[j])
                drop(s, g->first_ep + j, 0, "learner step failed");
        }
        group_release(g); /* nothing refers to a consumed group's trajectories */
    }
}

/* The mean reward of the training episodes scored since the last version. */
static double scored_reward(const ctl_state *s)
{
    return s->v_scored ? s->v_reward / s->v_scored : 0;
}

/* The version registry in Redis (for `manta status` and any other reader)
 * and the metrics line of a new version. */
static void record_version(ctl_state *s, const batch *b, const rl_step_reply *o, double dt)
{
    rl_ledger l;
    ledger_now(s, &l);
    double now = rl_now_s(), rate = dt > 1e-9 ? dt : 1e-9;
    char pub[256];
    int pn = snprintf(pub, sizeof pub,
                      "{\"version\": %lld, \"time_s\": %.2f, \"admitted\": %lld, "
                      "\"trained\": %lld, \"dropped_stale\": %lld, "
                      "\"dropped_error\": %lld, \"in_flight\": %lld}",
                      (long long)s->version, now - s->t_start, (long long)l.admitted,
                      (long long)l.trained, (long long)l.dropped_stale, (long long)l.dropped_error,
                      (long long)l.in_flight);
    int rc = manta_kv_set(s->m, "policy", pub, (size_t)pn);
    if (rc) rl_log(s->m, "controller: policy record: %s", manta_last_error());
    rl_progress_publish(
        s->m,
        &(rl_progress){
            s->version, s->max_versions, now - s->t_start, s->max_time_s, b->rsum / b->nq,
            s->eval_active || !s->eval_total ? -1 : eval_success(s), o->tokens / rate,
            s->v_gen_tokens / rate, b->hist, s->eta + 2 < STALE_BINS ? s->eta + 2 : STALE_BINS,
            l.dropped_stale + l.dropped_error, s->tool_calls, s->tool_errors, s->stop_at});
    if (!s->metrics) return;
    fprintf(s->metrics,
            "{\"version\":%lld,\"time_s\":%.2f,\"episodes\":%d,\"reward\":%.4f,"
            "\"success\":%.4f,\"scored\":%lld,\"batch_reward\":%.4f,\"trained_tokens\":%.0f,"
            "\"trained_tokens_per_s\":%.1f,"
            "\"gen_tokens_per_s\":%.1f,\"loss\":%.5f,\"kl\":%.5f,\"clip_frac\":%.4f,"
            "\"entropy\":%.4f,\"grad_norm\":%.4f,\"learner_busy_s\":%.3f,"
            "\"no_signal_groups\":%lld,\"staleness\":[",
            (long long)s->version, now - s->t_start, b->nq, scored_reward(s),
            s->v_scored ? (double)s->v_successes / s->v_scored : 0, (long long)s->v_scored,
            b->rsum / b->nq, o->tokens, o->tokens / rate, s->v_gen_tokens / rate, o->loss, o->kl,
            o->clip_frac, o->entropy, o->grad_norm, o->busy_s, (long long)s->v_no_signal_groups);
    for (int i = 0; i <= s->eta + 1 && i < STALE_BINS; i++)
        fprintf(s->metrics, "%s%lld", i ? "," : "", (long long)b->hist[i]);
    fprintf(s->metrics,
            "],\"dropped_stale\":%lld,\"dropped_error\":%lld,\"dropped_no_signal\":%lld,"
            "\"tool_calls\":%lld,"
            "\"tool_errors\":%lld,\"admitted\":%lld,\"in_flight\":%lld}\n",
            (long long)l.dropped_stale, (long long)l.dropped_error, (long long)s->dropped_no_signal,
            (long long)s->v_tool_calls, (long long)s->v_tool_errors, (long long)l.admitted,
            (long long)l.in_flight);
    fflush(s->metrics);
}

/* A step succeeded: the version moves on, counters and metrics follow. */
static void new_version(ctl_state *s, const batch *b, const rl_step_reply *o)
{
    s->version++;
    s->learner_busy_s += o->busy_s;
    s->led.trained += b->nq;
    s->trained_tokens += (int64_t)o->tokens;
    for (int i = 0; i < STALE_BINS; i++) s->stale_hist[i] += b->hist[i];
    double now = rl_now_s(), dt = now - s->t_last_version;
    s->t_last_version = now;
    record_version(s, b, o, dt);
    if (s->version % 5 == 0)
        rl_log(s->m,
               "version %lld: reward %.3f over %lld episodes, %d trained, %lld groups without "
               "signal, kl %.4f, %.1f tok/s",
               (long long)s->version, scored_reward(s), (long long)s->v_scored, b->nq,
               (long long)s->v_no_signal_groups, o->kl, o->tokens / dt);
    s->v_tool_calls = s->v_tool_errors = s->v_gen_tokens = s->v_no_signal_groups = 0;
    s->v_scored = s->v_successes = 0, s->v_reward = 0;
}

/* One RL step: form a batch, train on it, publish version V+1. */
static int rl_step(ctl_state *s)
{
    batch b;
    int rc = form_batch(s, &b);
    if (!rc && b.nq > 0) {
        rl_step_reply o;
        rc = learn_step(s, RL_STEP_PPO, s->lr, b.q, b.nq, s->version + 1, &o);
        if (!rc) new_version(s, &b, &o);
    }
    release_groups(s, &b, rc == 0);
    free(b.q), free(b.taken);
    return rc;
}

/* ---- checkpoints and resume ---- *
 * Every rl.checkpoint_every versions (and at version 0, after the warm-up)
 * the state needed to go on is written to RUN_DIR/checkpoints/vNNNNNNNN:
 * each shard's learner-R.state and shard 0's model/ (learner.c "checkpoint")
 * and controller.json (the version, the data position, the ledger and the
 * counters of summary.json). Everything goes into a hidden .vNNNNNNNN.tmp
 * folder first, is fsynced, and is renamed into place, so a folder with
 * that name is complete; the newest rl.checkpoint_keep stay. rl.resume
 * (`manta run SPEC --resume [RUN_DIR]`) restores the newest one; a learner
 * shard that restarts mid-run is answered by restoring every shard from it. */

#define CKPT_STATE "controller.json"

static int sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove a checkpoint folder (files and folders, links not followed). */
static int remove_tree(const char *path, int depth)
{
    struct stat st;
    if (lstat(path, &st)) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = depth < 4 ? opendir(path) : NULL;
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    char sub[1100];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            if (remove_tree(sub, depth + 1)) rc = -1;
        }
    closedir(d);
    return rmdir(path) || rc ? -1 : 0;
}

/* The version a complete checkpoint's name stands for ("v00000040"), or -1. */
static int64_t ckpt_version(const char *name)
{
    size_t n = strlen(name);
    if (name[0] != 'v' || n < 2 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 1; i < n; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

/* The versions of the complete checkpoints in root, newest first, into
 * *out (the caller frees it); returns how many, -1 when root is unreadable. */
static int list_ckpts(const char *root, int64_t **out)
{
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return -1;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t v = ckpt_version(e->d_name);
        if (v < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(*out, (size_t)cap * sizeof *nv);
            if (!nv) break;
            *out = nv;
        }
        int k = n++;
        while (k > 0 && (*out)[k - 1] < v) (*out)[k] = (*out)[k - 1], k--;
        (*out)[k] = v;
    }
    closedir(d);
    return n;
}

/* The checkpoint a resume names: a checkpoint folder itself, or the newest
 * one of a run folder's checkpoints/. */
static int find_checkpoint(const char *path, char *out, size_t cap)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/" CKPT_STATE, path);
    if (access(p, R_OK) == 0) {
        snprintf(out, cap, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/checkpoints", path);
    int64_t *v;
    int n = list_ckpts(p, &v);
    if (n > 0) snprintf(out, cap, "%s/v%08lld", p, (long long)v[0]);
    free(v);
    if (n > 0) return 0;
    return rl_fail(MANTA_ENOTFOUND, "no checkpoint in %s (neither %s nor a checkpoint folder)",
                   path, p);
}

/* What controller.json keeps: what summary.json reports, and where the
 * data and the episode ids stand. */
static cJSON *ckpt_state_json(ctl_state *s)
{
    rl_ledger l;
    ledger_now(s, &l);
    double now = rl_now_s();
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "format", 1);
    cJSON_AddNumberToObject(j, "version", (double)s->version);
    cJSON_AddNumberToObject(j, "learners", s->S);
    cJSON_AddNumberToObject(j, "next_train", (double)s->next_train);
    cJSON_AddNumberToObject(j, "episodes", (double)s->n_eps);
    cJSON_AddNumberToObject(j, "groups", (double)s->n_groups);
    cJSON_AddItemToObject(j, "ledger", ledger_json(s));
    cJSON_AddNumberToObject(j, "credits", (double)s->credits);
    cJSON *h = cJSON_AddArrayToObject(j, "staleness_histogram");
    for (int i = 0; i < STALE_BINS; i++)
        cJSON_AddItemToArray(h, cJSON_CreateNumber((double)s->stale_hist[i]));
    const struct {
        const char *k;
        double v;
    } n[] = {{"tool_calls", (double)s->tool_calls},
             {"tool_errors", (double)s->tool_errors},
             {"gen_tokens", (double)s->gen_tokens},
             {"trained_tokens", (double)s->trained_tokens},
             {"duplicates", (double)s->duplicates},
             {"no_signal_groups", (double)s->no_signal_groups},
             {"dropped_no_signal", (double)s->dropped_no_signal},
             {"learner_busy_s", s->learner_busy_s},
             {"success_initial", s->success_initial},
             {"best_eval", s->best_eval},
             {"wall_s", now - s->t_start},
             {"warmup_s", s->t_warm},
             {"rl_s", s->t_rl_start > 0 ? now - s->t_rl_start : 0},
             {"warmup_steps", s->wu_steps},
             {"warmup_outcome", s->wu_outcome},
             {"warmup_loss", s->wu_loss},
             {"warmup_reproduced", s->wu_reproduced},
             {"learner_restores", s->learner_restores}};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) cJSON_AddNumberToObject(j, n[i].k, n[i].v);
    return j;
}

static double jnum(const cJSON *j, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* Back to the state controller.json describes. The episodes that were in
 * flight then are gone with the job that ran them: they end as dropped
 * ("lost in the stop before the resume"), so the ledger stays exact. */
static int ckpt_load_state(ctl_state *s, const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/" CKPT_STATE, dir);
    FILE *f = fopen(path, "rb");
    if (!f) return rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
    char *txt = NULL;
    size_t cap = 0, n = 0, k;
    char buf[8192];
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        if (n + k + 1 > cap) {
            char *t = realloc(txt, cap = 2 * (n + k + 1));
            if (!t) break;
            txt = t;
        }
        memcpy(txt + n, buf, k), n += k;
    }
    fclose(f);
    cJSON *j = txt ? cJSON_ParseWithLength(txt, n) : NULL;
    free(txt);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "ledger");
    if (!j || jnum(j, "format", 0) != 1 || !cJSON_IsObject(l) || jnum(j, "version", -1) < 0) {
        cJSON_Delete(j);
        return rl_fail(MANTA_EINVAL, "%s: not a controller checkpoint", path);
    }
    s->version = (int64_t)jnum(j, "version", 0);
    s->next_train = (int)jnum(j, "next_train", 0);
    s->n_eps = s->eps_base = s->eval_first = (int64_t)jnum(j, "episodes", 0);
    s->n_groups = s->g_base = (int64_t)jnum(j, "groups", 0);
    s->led.admitted = (int64_t)jnum(l, "admitted", 0);
    s->led.trained = (int64_t)jnum(l, "trained", 0);
    s->led.dropped_stale = (int64_t)jnum(l, "dropped_stale", 0);
    s->led.dropped_error = (int64_t)jnum(l, "dropped_error", 0);
    s->led.handed_back = (int64_t)jnum(l, "handed_back", 0);
    s->reclaimed = (int64_t)jnum(l, "reclaimed", 0);
    s->credits = (int64_t)jnum(j, "credits", 0);
    const cJSON *r;
    cJSON_ArrayForEach(r,
                       cJSON_GetObjectItemCaseSensitive(l, "error_reasons")) if (cJSON_IsNumber(r))
        count_reason_n(s, r->string, (int64_t)r->valuedouble);
    int i = 0;
    cJSON_ArrayForEach(
        r, cJSON_GetObjectItemCaseSensitive(j, "staleness_histogram")) if (i < STALE_BINS)
        s->stale_hist[i++] = (int64_t)r->valuedouble;
    s->tool_calls = (int64_t)jnum(j, "tool_calls", 0);
    s->tool_errors = (int64_t)jnum(j, "tool_errors", 0);
    s->gen_tokens = (int64_t)jnum(j, "gen_tokens", 0);
    s->trained_tokens = (int64_t)jnum(j, "trained_tokens", 0);
    s->duplicates = (int64_t)jnum(j, "duplicates", 0);
    s->no_signal_groups = (int64_t)jnum(j, "no_signal_groups", 0);
    s->dropped_no_signal = (int64_t)jnum(j, "dropped_no_signal", 0);
    s->learner_busy_s = jnum(j, "learner_busy_s", 0);
    s->success_initial = jnum(j, "success_initial", -1);
    s->best_eval = jnum(j, "best_eval", 0);
    s->t_start = rl_now_s() - jnum(j, "wall_s", 0);
    s->t_warm = jnum(j, "warmup_s", 0);
    s->rl_before = jnum(j, "rl_s", 0);
    s->wu_steps = (int)jnum(j, "warmup_steps", 0);
    s->wu_outcome = (int)jnum(j, "warmup_outcome", 0);
    s->wu_loss = jnum(j, "warmup_loss", 0);
    s->wu_reproduced = jnum(j, "warmup_reproduced", 0);
    s->learner_restores = (int)jnum(j, "learner_restores", 0);
    cJSON_Delete(j);
    rl_ledger now;
    ledger_now(s, &now);
    s->resumed_lost = now.in_flight;
    if (now.in_flight > 0) {
        s->led.dropped_error += now.in_flight, s->credits += now.in_flight;
        count_reason_n(s, "lost in the stop before the resume", now.in_flight);
    }
    return 0;
}

static int write_ckpt_state(ctl_state *s, const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/" CKPT_STATE, dir);
    cJSON *j = ckpt_state_json(s);
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    if (!txt) return rl_fail(MANTA_ENOMEM, "%s: out of memory", path);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(txt, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f)) ok = 0;
    free(txt);
    return ok ? 0 : rl_fail(MANTA_ESYS, "%s: %s", path, strerror(errno));
}

/* Keep the newest rl.checkpoint_keep checkpoints. */
static void prune_ckpts(ctl_state *s, const char *root)
{
    int64_t *v;
    int n = list_ckpts(root, &v);
    char p[1100];
    for (int i = s->ckpt_keep; i < n; i++) {
        snprintf(p, sizeof p, "%s/v%08lld", root, (long long)v[i]);
        if (remove_tree(p, 0)) rl_log(s->m, "controller: cannot remove %s: %s", p, strerror(errno));
    }
    free(v);
}

/* A checkpoint of the current version; a failure is logged and warned
 * about (the run goes on; the previous checkpoint stays). */
static void checkpoint(ctl_state *s)
{
    if (s->ckpt_every <= 0) return;
    double t0 = rl_now_s();
    char root[600], tmp[700], dst[700];
    snprintf(root, sizeof root, "%s/checkpoints", s->run_dir);
    snprintf(tmp, sizeof tmp, "%s/.v%08lld.tmp", root, (long long)s->version);
    snprintf(dst, sizeof dst, "%s/v%08lld", root, (long long)s->version);
    int rc = 0;
    if ((mkdir(root, 0755) && errno != EEXIST) || remove_tree(tmp, 0) || mkdir(tmp, 0755))
        rc = rl_fail(MANTA_ESYS, "%s: %s", tmp, strerror(errno));
    if (!rc) rc = call_all(s, "checkpoint", tmp, SAVE_TIMEOUT_MS);
    if (!rc) rc = write_ckpt_state(s, tmp);
    if (!rc && (sync_path(tmp) || remove_tree(dst, 0) || rename(tmp, dst) || sync_path(root)))
        rc = rl_fail(MANTA_ESYS, "%s: %s", dst, strerror(errno));
    if (rc) {
        remove_tree(tmp, 0);
        if (s->ckpt_failures++ == 0)
            warn(s,
                 "checkpoint of version %lld failed: %s (the run goes on; the last "
                 "checkpoint is %s)",
                 (long long)s->version, rl_last_error(), s->last_ckpt[0] ? s->last_ckpt : "none");
        else
            rl_log(s->m, "controller: checkpoint of version %lld failed: %s", (long long)s->version,
                   rl_last_error());
        return;
    }
    snprintf(s->last_ckpt, sizeof s->last_ckpt, "%s", dst);
    s->last_ckpt_version = s->version;
    prune_ckpts(s, root);
    rl_log(s->m, "controller: checkpoint %s (%.2f s)", dst, rl_now_s() - t0);
}

/* A shard came back as a new incarnation: every shard goes back to the
 * last checkpoint (the restarted one has nothing of the group's state, and
 * the others' moments must match its), the restored weights are published
 * as a new version, and the run goes on; with no checkpoint, or when the
 * restore fails, the run fails. */
static void fail_run(ctl_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void recover_learners(ctl_state *s, int i, int inc)
{
    if (!s->last_ckpt[0]) {
        fail_run(s,
                 "learner shard %d restarted (incarnation %d) and there is no checkpoint to "
                 "restore the group from (%s): its parameters and AdamW state are lost",
                 i, inc, s->ckpt_every ? "none written yet" : "rl.checkpoint_every is 0");
        return;
    }
    rl_log(s->m, "controller: learner shard %d restarted (incarnation %d): restoring %s", i, inc,
           s->last_ckpt);
    int rc = call_all(s, "restore", s->last_ckpt, SAVE_TIMEOUT_MS);
    if (!rc) rc = publish_initial(s);
    if (rc) {
        fail_run(s, "learner shard %d restarted (incarnation %d) and restoring %s failed: %s", i,
                 inc, s->last_ckpt, rl_last_error());
        return;
    }
    note_incarnations(s);
    s->learner_restores++;
    s->version++;
    warn(s,
         "learner shard %d restarted (incarnation %d): every shard was restored from %s "
         "(version %lld); the %lld versions trained after it are lost, its weights go on as "
         "version %lld",
         i, inc, s->last_ckpt, (long long)s->last_ckpt_version,
         (long long)(s->version - 1 - s->last_ckpt_version), (long long)s->version);
}

/* rl.resume: the newest checkpoint of the folder named, restored into every
 * shard and published; the controller's state from its controller.json. */
static int resume_run(ctl_state *s)
{
    char dir[700];
    int rc = find_checkpoint(s->resume, dir, sizeof dir);
    if (!rc) rc = ckpt_load_state(s, dir);
    if (!rc) rc = call_all(s, "restore", dir, SAVE_TIMEOUT_MS);
    if (!rc) rc = publish_initial(s);
    if (rc) return rc;
    snprintf(s->last_ckpt, sizeof s->last_ckpt, "%s", dir);
    snprintf(s->resumed_from, sizeof s->resumed_from, "%s", dir);
    s->last_ckpt_version = s->resumed_version = s->version;
    rl_log(s->m,
           "controller: resumed from %s: version %lld, %lld trained; %lld episodes that were in "
           "flight are dropped",
           dir, (long long)s->version, (long long)s->led.trained, (long long)s->resumed_lost);
    return 0;
}

/* ---- "run": phases driven by events ---- *
 * ctl_run does the warm-up and publishes version 0, then defers its reply.
 * From then on `advance` moves the run along; it runs from a loop timer that
 * submissions arm at once (a group completed, an evaluation finished) and
 * that re-arms itself every HEARTBEAT_MS for what has no event of its own
 * (rollouts that died, the time limit, an evaluation's deadline). */

static void on_timer(void *arg);

/* Run `advance` after_ms from now (sooner if already due sooner). */
static void schedule(ctl_state *s, int64_t after_ms)
{
    if (s->phase == PH_NONE || s->phase == PH_DONE) return;
    int64_t due = rl_now_ms() + after_ms;
    if (s->timer && s->timer_due_ms <= due) return;
    if (s->timer) manta_timer_cancel(s->m, s->timer);
    s->timer = manta_timer_add(s->m, after_ms, on_timer, s);
    s->timer_due_ms = due;
}

/* The policy: family, where it came from, size, and the final checkpoint
 * (a Hugging Face folder of the same family) once saved. */
static cJSON *model_json(const ctl_state *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", mk_arch_name(s->ms.cfg.arch));
    cJSON_AddStringToObject(o, "path", s->ms.path);
    cJSON_AddNumberToObject(o, "params", (double)mk_config_num_params(&s->ms.cfg));
    cJSON_AddNumberToObject(o, "vocab_size", s->ms.cfg.vocab_size);
    cJSON_AddNumberToObject(o, "context", s->ms.context);
    if (s->checkpoint[0]) cJSON_AddStringToObject(o, "checkpoint", s->checkpoint);
    if (s->checkpoint_err[0]) cJSON_AddStringToObject(o, "checkpoint_error", s->checkpoint_err);
    cJSON_AddStringToObject(o, "checkpoint_dtype", rl_dtype_name(s->ms.dtype));
    return o;
}

/* The warm-up as it ran: its rule, the steps taken, the last demo loss and
 * reproduced fraction (each measured before its step's update), and
 * whether it stopped because the rule was met. */
static cJSON *warmup_json(const ctl_state *s)
{
    static const char *const outcome[] = {"not run", "met", "max_steps"};
    cJSON *o = cJSON_CreateObject();
    const rl_warmup *w = &s->wu;
    if (w->fixed >= 0) cJSON_AddNumberToObject(o, "fixed_steps", w->fixed);
    if (w->fixed < 0 && w->until_loss >= 0) cJSON_AddNumberToObject(o, "until_loss", w->until_loss);
    if (w->fixed < 0 && w->until_success >= 0)
        cJSON_AddNumberToObject(o, "until_success", w->until_success);
    if (w->fixed < 0) cJSON_AddNumberToObject(o, "max_steps", w->max_steps);
    cJSON_AddNumberToObject(o, "steps", s->wu_steps);
    cJSON_AddNumberToObject(o, "demo_loss", s->wu_steps ? s->wu_loss : -1);
    cJSON_AddNumberToObject(o, "demo_reproduced", s->wu_steps ? s->wu_reproduced : -1);
    cJSON_AddStringToObject(o, "stopped", s->wu_steps ? outcome[s->wu_outcome] : outcome[0]);
    return o;
}

static cJSON *summary_json(ctl_state *s)
{
    double wall = rl_now_s() - s->t_start, t_rl = s->t_rl > 0 ? s->t_rl : 1;
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
    cJSON_AddNumberToObject(j, "warmup_s", s->t_warm);
    cJSON_AddNumberToObject(j, "rl_s", s->t_rl);
    cJSON_AddItemToObject(j, "ledger", ledger_json(s));
    if (s->tool_errors_by_kind)
        cJSON_AddItemToObject(j, "tool_errors_by_kind", cJSON_Duplicate(s->tool_errors_by_kind, 1));
    cJSON_AddItemToObject(j, "model", model_json(s));
    cJSON *r = cJSON_AddObjectToObject(j, "rates");
    cJSON_AddNumberToObject(r, "trained_tokens", (double)s->trained_tokens);
    cJSON_AddNumberToObject(r, "trained_tokens_per_s", s->trained_tokens / t_rl);
    cJSON_AddNumberToObject(r, "gen_tokens", (double)s->gen_tokens);
    cJSON_AddNumberToObject(r, "gen_tokens_per_s", s->gen_tokens / t_rl);
    cJSON_AddNumberToObject(r, "learner_busy_fraction", s->learner_busy_s / t_rl);
    cJSON_AddNumberToObject(r, "tool_calls", (double)s->tool_calls);
    cJSON_AddNumberToObject(r, "tool_errors", (double)s->tool_errors);
    cJSON_AddNumberToObject(r, "no_signal_groups", (double)s->no_signal_groups);
    cJSON_AddNumberToObject(r, "duplicate_submissions", (double)s->duplicates);
    cJSON *h = cJSON_AddArrayToObject(j, "staleness_histogram");
    for (int i = 0; i < STALE_BINS; i++)
        cJSON_AddItemToArray(h, cJSON_CreateNumber((double)s->stale_hist[i]));
    cJSON_AddItemToObject(j, "warmup", warmup_json(s));
    cJSON *c = cJSON_AddObjectToObject(j, "checkpoints");
    cJSON_AddNumberToObject(c, "every", s->ckpt_every);
    cJSON_AddNumberToObject(c, "keep", s->ckpt_keep);
    if (s->last_ckpt[0]) cJSON_AddStringToObject(c, "latest", s->last_ckpt);
    cJSON_AddNumberToObject(c, "failures", s->ckpt_failures);
    cJSON_AddNumberToObject(c, "learner_restores", s->learner_restores);
    if (s->resumed_from[0]) {
        cJSON *r2 = cJSON_AddObjectToObject(j, "resumed");
        cJSON_AddStringToObject(r2, "from", s->resumed_from);
        cJSON_AddNumberToObject(r2, "version", (double)s->resumed_version);
        cJSON_AddNumberToObject(r2, "episodes_lost", (double)s->resumed_lost);
    }
    cJSON *w = cJSON_AddArrayToObject(j, "warnings");
    for (int i = 0; i < s->n_warnings; i++)
        cJSON_AddItemToArray(w, cJSON_CreateString(s->warnings[i]));
    return j;
}

/* summary.json with `status` ("done", "failed: <why>", "interrupted"),
 * written atomically (a temporary file renamed over it); returns the text
 * (the caller frees it) or NULL when out of memory. */
static char *summary_text(ctl_state *s, const char *status)
{
    cJSON *j = summary_json(s);
    cJSON_AddStringToObject(j, "status", status);
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    return txt;
}

static void write_summary_text(ctl_state *s, const char *txt)
{
    char path[700], tmp[720];
    snprintf(path, sizeof path, "%s/summary.json", s->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok =
        f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f)) ok = 0;
    if (ok && rename(tmp, path) == 0) return;
    rl_log(s->m, "controller: cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
}

static void write_summary(ctl_state *s, const char *status)
{
    char *txt = summary_text(s, status);
    if (txt) write_summary_text(s, txt);
    free(txt);
}

/* The run failed for good: summary.json says why, the run method answers
 * with an error naming the cause (so `manta run` exits non-zero). */
static void fail_run(ctl_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_run(ctl_state *s, const char *fmt, ...)
{
    char why[400], status[420];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    s->stop = 1, s->admit_train = 0;
    s->phase = PH_DONE;
    if (s->t_rl_start > 0 && s->t_rl == 0) s->t_rl = rl_now_s() - s->t_rl_start;
    snprintf(status, sizeof status, "failed: %s", why);
    rl_log(s->m, "controller: run %s", status);
    write_summary(s, status);
    if (s->metrics) fclose(s->metrics), s->metrics = NULL;
    if (s->traj_dump) fclose(s->traj_dump), s->traj_dump = NULL;
    if (s->run_req) manta_reply_error(s->run_req, MANTA_EREMOTE, "run failed: %s", why);
    s->run_req = NULL;
}

/* The end: the model saved by shard 0 as a Hugging Face folder RUN_DIR/model
 * (a large model takes a while: up to SAVE_TIMEOUT_MS), summary.json naming
 * it, the deferred reply. */
static void finish_run(ctl_state *s)
{
    s->stop = 1;
    s->phase = PH_DONE;
    if (s->metrics) fclose(s->metrics), s->metrics = NULL;
    if (s->traj_dump) fclose(s->traj_dump), s->traj_dump = NULL;
    char path[700];
    snprintf(path, sizeof path, "%s/model", s->run_dir);
    char abs[PATH_MAX];
    const char *lp = learner_path(s, path, abs);
    manta_future *sf = manta_call(s->m, s->L[0], "save", lp, strlen(lp));
    if (manta_get(sf, SAVE_TIMEOUT_MS, NULL, NULL)) {
        rl_log(s->m, "controller: save %s: %s", path, manta_future_error(sf));
        snprintf(s->checkpoint_err, sizeof s->checkpoint_err, "%s", manta_future_error(sf));
    } else {
        snprintf(s->checkpoint, sizeof s->checkpoint, "%s", path);
    }
    manta_future_free(sf);
    s->tool_errors_by_kind = rl_env_errors_json(s->m, "env", 2000); /* into summary.json */
    char *txt = summary_text(s, "done");
    if (txt) write_summary_text(s, txt);
    if (txt)
        manta_reply(s->run_req, txt, strlen(txt));
    else
        manta_reply_error(s->run_req, MANTA_ENOMEM, "run: out of memory for the summary");
    s->run_req = NULL;
    free(txt);
}

/* The final evaluation writes one line per held-out problem to
 * RUN_DIR/eval_final.jsonl: {"prompt", "reference", "answer", "reward",
 * "status", "tool_calls"}, the answer as the policy wrote it (greedy). */
static void open_eval_out(ctl_state *s)
{
    char path[800];
    snprintf(path, sizeof path, "%s/eval_final.jsonl", s->run_dir);
    s->eval_out = fopen(path, "w");
    if (!s->eval_out) rl_log(s->m, "controller: cannot write %s: %s", path, strerror(errno));
}

/* The final evaluation with the last version (no more training
 * admissions), or the end when there is none. */
static void end_training(ctl_state *s)
{
    s->t_rl = rl_now_s() - s->t_rl_start;
    s->admit_train = 0;
    if (s->eval_n == 0) {
        finish_run(s);
        return;
    }
    start_eval(s, s->eval_n);
    s->eval_until = rl_now_s() + 300;
    s->phase = PH_EVAL_FINAL;
    open_eval_out(s);
}

static void start_training(ctl_state *s)
{
    s->admit_train = 1;
    s->t_last_version = rl_now_s();
    s->t_rl_start = s->t_last_version - s->rl_before; /* a resumed run's RL time goes on */
    if (s->success_initial > s->best_eval) s->best_eval = s->success_initial;
    s->phase = PH_TRAIN;
}

/* A periodic evaluation that completed: logged; 1 when it reached stop_at. */
static int periodic_eval_done(ctl_state *s)
{
    if (!s->eval_active || s->eval_done < s->eval_total) return 0;
    double sc = eval_success(s);
    s->eval_active = 0;
    write_eval_metric(s, "periodic", sc);
    rl_log(s->m, "version %lld: held-out success %.3f", (long long)s->version, sc);
    if (sc > s->best_eval) s->best_eval = sc;
    return sc >= s->stop_at;
}

/* One turn of training: stop conditions, evaluations, at most one step. */
static void train_turn(ctl_state *s)
{
    if (s->version == 0 && s->max_versions > 0 && rl_now_s() - s->t_start >= s->max_time_s) {
        fail_run(s, "no policy version trained in rl.max_time_s (%g s)%s", s->max_time_s,
                 s->no_signal_groups == 0 ? ""
                 : s->no_reward_run > 0
                     ? ": no episode was rewarded, every group was dropped without signal "
                       "(no_signal)"
                     : ": the groups' rewards were all equal, every group was dropped without "
                       "signal (no_signal)");
        return;
    }
    if (s->version >= s->max_versions || rl_now_s() - s->t_start >= s->max_time_s ||
        periodic_eval_done(s)) {
        end_training(s);
        return;
    }
    if (!s->eval_active && s->eval_every > 0 && s->eval_n > 0 && s->version > 0 &&
        s->version % s->eval_every == 0 && s->eval_vmax < s->version) {
        start_eval(s, s->eval_n);
        s->eval_vmax = (int32_t)s->version; /* one evaluation per version */
    }
    if (rl_now_s() < s->retry_at || !batch_ready(s)) return;
    int inc, restarted = learner_restarted(s, &inc);
    if (restarted >= 0) { /* never step with a shard that lost the group's state */
        recover_learners(s, restarted, inc);
        return;
    }
    if (rl_step(s) == 0) {
        s->step_failures = 0;
        if (s->ckpt_every > 0 && s->version % s->ckpt_every == 0) checkpoint(s);
        return;
    }
    if (++s->step_failures >= s->max_step_failures) {
        fail_run(s, "learner step failed %d times in a row (rl.max_step_failures): %s",
                 s->step_failures, rl_last_error());
        return;
    }
    rl_log(s->m, "controller: learner step failed (%s); retry %d of %d", rl_last_error(),
           s->step_failures, s->max_step_failures - 1);
    s->retry_at = rl_now_s() + 0.1 * s->step_failures;
}

/* An evaluation phase is over when every episode is in or its time is up. */
static int eval_over(const ctl_state *s)
{
    return s->eval_done >= s->eval_total || rl_now_s() >= s->eval_until;
}

/* rl.max_error_drop_rate over windows of ERROR_WINDOW batches' worth of
 * training episodes: a run whose episodes mostly fail (a tool server gone,
 * a broken reward) stops instead of spinning until max_time_s. */
#define ERROR_WINDOW 4
static void check_error_drops(ctl_state *s)
{
    if (s->phase == PH_DONE || s->win_resolved < ERROR_WINDOW * (int64_t)s->B) return;
    double rate = (double)s->win_errors / (double)s->win_resolved;
    if (rate > s->max_error_drop_rate)
        fail_run(s,
                 "%lld of the last %lld training episodes were dropped for errors (%.0f%%, "
                 "rl.max_error_drop_rate %g); the latest: %s",
                 (long long)s->win_errors, (long long)s->win_resolved, 100 * rate,
                 s->max_error_drop_rate, s->win_why);
    s->win_resolved = s->win_errors = 0;
}

/* A shard that restarted is restored about a second later even when no
 * step is due: the rollouts cannot fetch the buckets its old incarnation
 * served, so they would wait for weights until the next step. */
static void watch_learners(ctl_state *s)
{
    double now = rl_now_s();
    if (s->phase == PH_NONE || s->phase == PH_DONE || now - s->last_learner_check < 1.0) return;
    s->last_learner_check = now;
    int inc, restarted = learner_restarted(s, &inc);
    if (restarted >= 0) recover_learners(s, restarted, inc);
}

static void advance(ctl_state *s)
{
    if (s->advancing) return; /* a step waits on the learners: the loop runs nested */
    s->advancing = 1;
    reclaim(s);
    compact(s);
    watch_learners(s);
    for (int k = 0; k < 2 && s->phase != PH_DONE; k++)
        if (s->missing_since[k] > 0 && s->missing_last[k] - s->missing_since[k] > s->max_missing_s)
            fail_run(s, "episodes dropped for %.0f s (rl.max_missing_s %g): %s",
                     s->missing_last[k] - s->missing_since[k], s->max_missing_s, s->missing_why[k]);
    check_error_drops(s);
    switch (s->phase) {
    case PH_EVAL_INITIAL:
        if (!eval_over(s)) break;
        s->eval_active = 0;
        s->success_initial = eval_success(s);
        write_eval_metric(s, "initial", s->success_initial);
        rl_log(s->m, "held-out success after warm-up: %.3f", s->success_initial);
        start_training(s);
        break;
    case PH_TRAIN:
        train_turn(s);
        break;
    case PH_EVAL_FINAL:
        if (!eval_over(s)) break;
        s->eval_active = 0;
        s->success_final = eval_success(s);
        write_eval_metric(s, "final", s->success_final);
        if (s->eval_out) fclose(s->eval_out);
        s->eval_out = NULL;
        finish_run(s);
        break;
    }
    s->advancing = 0;
    int again = s->phase == PH_EVAL_INITIAL || s->phase == PH_EVAL_FINAL
                    ? s->eval_done >= s->eval_total
                    : batch_ready(s) && rl_now_s() >= s->retry_at;
    schedule(s, again ? 0 : s->retry_at > rl_now_s() ? 100 : HEARTBEAT_MS);
}

static void on_timer(void *arg)
{
    ctl_state *s = arg;
    s->timer = 0;
    advance(s);
}

/* The run folder and its files. */
static int open_run_dir(ctl_state *s)
{
    if (mkdir_p(s->run_dir)) return rl_fail(MANTA_ESYS, "cannot create %s", s->run_dir);
    char path[700];
    int resume = s->resume[0] != 0; /* a resumed run adds to its metrics */
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->run_dir);
    s->metrics = fopen(path, resume ? "a" : "w");
    snprintf(path, sizeof path, "%s/trajectories.msgpack", s->run_dir);
    s->traj_dump = resume ? NULL : fopen(path, "wb");
    if (!s->metrics || (!resume && !s->traj_dump))
        return rl_fail(MANTA_ESYS, "cannot write in %s", s->run_dir);
    snprintf(path, sizeof path, "%s/summary.json", s->run_dir);
    unlink(path); /* a previous run's must not pass for this one's */
    s->run_dir_open = 1;
    return 0;
}

/* The run cannot start (its folder is open): summary.json and the reply
 * say why, with rl_last_error()'s cause after `what`. */
static int refuse_run(ctl_state *s, manta_req *req, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse_run(ctl_state *s, manta_req *req, int rc, const char *fmt, ...)
{
    char what[600], status[1000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(status, sizeof status, "failed: %s: %s", what, rl_last_error());
    rl_log(s->m, "controller: run %s", status);
    write_summary(s, status);
    return manta_reply_error(req, rc, "run: %s: %s", what, rl_last_error());
}

static int ctl_run(manta_req *req, void *state, const void *arg, size_t len)
{
    ctl_state *s = state;
    (void)arg, (void)len;
    if (s->phase != PH_NONE) return manta_reply_error(req, MANTA_EBUSY, "run: already run");
    int S = find_learners(s);
    if (S < 0) return manta_reply_error(req, S, "run: %s", rl_last_error());
    s->S = S;
    if (s->S == 0) return manta_reply_error(req, MANTA_ENOTFOUND, "run: no learner actors");
    s->L_inc = calloc((size_t)s->S, sizeof *s->L_inc);
    if (!s->L_inc) return manta_reply_error(req, MANTA_ENOMEM, "run: out of memory");
    note_incarnations(s);
    int rc = open_run_dir(s);
    if (rc) return manta_reply_error(req, rc, "run: %s", rl_last_error());
    s->t_start = rl_now_s();
    if (s->resume[0]) {
        if ((rc = resume_run(s))) return refuse_run(s, req, rc, "rl.resume %s", s->resume);
    } else {
        warmup(s);
        if (s->wu_error[0]) {
            rl_fail(MANTA_EREMOTE, "%s", s->wu_error);
            return refuse_run(s, req, MANTA_EREMOTE, "warm-up");
        }
        if (publish_initial(s))
            return refuse_run(s, req, MANTA_EREMOTE, "learners could not publish");
        s->version = 0;
        s->t_warm = rl_now_s() - s->t_start;
    }
    s->have_weights = 1;
    s->run_req = manta_req_defer(req);
    if (s->eval_n > 0 && s->success_initial < 0) { /* the baseline: version 0 on the held-out set */
        start_eval(s, s->eval_n);
        s->eval_until = rl_now_s() + 300;
        s->phase = PH_EVAL_INITIAL;
    } else {
        start_training(s);
    }
    /* version 0, so that the warm-up is not done twice: written once the run
     * is open (admissions and submissions are served while the learners
     * write, as during a step), with no turn of the loop nested in it */
    if (!s->resume[0]) {
        s->advancing = 1;
        checkpoint(s);
        s->advancing = 0;
    }
    schedule(s, 0);
    return 0;
}

static const manta_method ctl_methods[] = {{"admit", ctl_admit},       {"submit", ctl_submit},
                                           {"handback", ctl_handback}, {"status", ctl_status},
                                           {"run", ctl_run},           {NULL, NULL}};

const manta_class rl_controller_class = {"controller", sizeof(ctl_state), ctl_init, ctl_fini,
                                         ctl_methods};
