/*
 * context.c -- manta_init, manta_shutdown and actor handles.
 *
 * manta_init() decides what this process is. A node agent starts actors by
 * executing the same program with MANTA_ROLE=actor (or =node for an agent)
 * and the actor's identity in the environment; manta_init() then runs that
 * role and exits. Otherwise the process is a driver: it connects to Redis
 * (or starts the embedded one), starts a local node agent, and returns.
 *
 * Actor creation goes through a node agent: the driver calls the agent's
 * "spawn" method, which writes the directory record, starts the process and
 * answers with the actor's endpoint; the driver then waits for the record's
 * state to turn "alive" (or "failed", with the init error).
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static void ctx_free(manta_ctx *m)
{
    mn_objstore_free(m);
    mn_loop_free(m);
    if (m->zmq) zmq_ctx_term(m->zmq);
    m->zmq = NULL;
    if (m->redis) redisFree(m->redis);
    free(m->redis_url), free(m->redis_dir);
    free(m->transport), free(m->host), free(m->log_dir), free(m->libraries);
    free(m->state);
    free(m);
}

/* Settings from the options and the environment (which wins: a node agent
 * hands its children theirs that way). */
static int init_settings(manta_ctx *m, const manta_options *opts)
{
    m->classes = opts->classes;
    m->max_pending = opts->max_pending ? opts->max_pending : 10000;
    m->max_message = opts->max_message ? opts->max_message : (size_t)1 << 30;
    m->call_timeout_ms = opts->call_timeout_ms > 0 ? opts->call_timeout_ms : 60000;
    m->transport = mn_strdup(env_or("MANTA_TRANSPORT", opts->transport ? opts->transport : "ipc"));
    m->host = mn_strdup(env_or("MANTA_HOST", opts->host ? opts->host : "127.0.0.1"));
    const char *logd = env_or("MANTA_LOG_DIR", opts->log_dir);
    m->log_dir = logd ? mn_strdup(logd) : NULL;
    if (!m->transport || !m->host || (logd && !m->log_dir))
        return mn_fail(MANTA_ENOMEM, "manta_init: out of memory");
    if (getenv("MANTA_MAX_MESSAGE")) m->max_message = strtoull(getenv("MANTA_MAX_MESSAGE"), 0, 10);
    if (strcmp(m->transport, "ipc") && strcmp(m->transport, "tcp"))
        return mn_fail(MANTA_EINVAL, "transport '%s': expected ipc or tcp", m->transport);
    const char *job = env_or("MANTA_JOB", opts->job);
    if (job) {
        if (!mn_valid_name(job, 40))
            return mn_fail(MANTA_EINVAL, "job name '%s': use 1..40 of [A-Za-z0-9._-]", job);
        snprintf(m->job, sizeof m->job, "%s", job);
    } else {
        memcpy(m->job, "job-", 4);
        mn_random_hex(m->job + 4, 8);
    }
    snprintf(m->rundir, sizeof m->rundir, "/tmp/manta-%s", m->job);
    m->zmq = zmq_ctx_new();
    if (!m->zmq) return mn_fail(MANTA_EZMQ, "zmq_ctx_new failed");
    zmq_ctx_set(m->zmq, ZMQ_BLOCKY, 0);
    return 0;
}

/* An actor or node agent started by a node agent: run it; never returns. */
static void run_role(manta_ctx *m, const char *role, const manta_options *opts)
{
    m->role = role[0] == 'a' ? MN_ROLE_ACTOR : MN_ROLE_NODE;
    const char *url = getenv("MANTA_REDIS");
    const char *name = getenv("MANTA_NAME");
    if (!url || !name || !env_or("MANTA_JOB", opts->job)) {
        mn_log("MANTA_ROLE=%s needs MANTA_REDIS, MANTA_JOB and MANTA_NAME", role);
        _exit(3);
    }
    /* The name becomes Redis keys, routing ids and (an actor's) a log file. */
    if (!mn_valid_name(name, 100)) {
        mn_log("MANTA_ROLE=%s: name '%s': use 1..100 of [A-Za-z0-9._-]", role, name);
        _exit(3);
    }
    snprintf(m->self, sizeof m->self, "%s", name);
    snprintf(m->node, sizeof m->node, "%s", env_or("MANTA_NODE", ""));
    manta_redis_addr addr;
    if (manta_redis_url_parse(url, &addr, NULL, 0) || mn_redis_set_addr(m, &addr) ||
        mn_redis_connect(m)) {
        mn_log("%s %s: %s", role, name, manta_last_error());
        _exit(3);
    }
    if (mn_auth_setup(m, opts) != 0) {
        mn_log("%s %s: %s", role, name, manta_last_error());
        _exit(3);
    }
    if (m->role == MN_ROLE_ACTOR) mn_actor_main(m);
    mn_node_main(m);
    _exit(0); /* not reached */
}

/* The driver's Redis: the parsed address, else the URL (options, then
 * MANTA_REDIS), else an embedded server. */
static int driver_redis(manta_ctx *m, const manta_options *opts)
{
    manta_redis_addr parsed;
    const manta_redis_addr *a = opts->redis;
    const char *url = opts->redis_url ? opts->redis_url : getenv("MANTA_REDIS");
    if (!a && url && *url) {
        int rc = manta_redis_url_parse(url, &parsed, NULL, 0);
        if (rc) return rc;
        a = &parsed;
    }
    if (!a || a->embedded) return mn_redis_start_embedded(m);
    int rc = mn_redis_set_addr(m, a);
    return rc ? rc : mn_redis_connect(m);
}

int manta_init(manta_ctx **out, const manta_options *opts)
{
    static const manta_options none;
    if (!opts) opts = &none;
    if (out) *out = NULL;
    manta_ctx *m = calloc(1, sizeof *m);
    if (!m) return mn_fail(MANTA_ENOMEM, "manta_init: out of memory");
    int rc = init_settings(m, opts);
    if (rc) {
        ctx_free(m);
        return rc;
    }
    const char *role = env_or("MANTA_ROLE", "driver");
    if (!strcmp(role, "actor") || !strcmp(role, "node")) run_role(m, role, opts);

    m->role = MN_ROLE_DRIVER;
    snprintf(m->self, sizeof m->self, "driver");
    /* The ipc sockets live here: a folder someone else made could hand
     * them (and the calls meant for our actors) to that someone. */
    rc = mn_private_dir(m->rundir, "run folder");
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", manta_last_error());
        ctx_free(m);
        return mn_fail(rc, "%s", why);
    }
    rc = mn_node_libraries_set(m, opts);
    if (rc == 0) rc = driver_redis(m, opts);
    /* After Redis: an attached driver follows the owner's record there. */
    if (rc == 0) rc = mn_auth_setup(m, opts);
    if (rc == 0 && !opts->attach) rc = mn_auth_publish(m);
    m->attached = opts->attach != 0;
    if (rc == 0 && !opts->no_local_node && !opts->attach) rc = mn_node_spawn_local(m);
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", manta_last_error());
        mn_redis_stop_embedded(m);
        /* An attached driver's folder is the running job's: keep it. */
        if (!opts->attach) mn_remove_dir(m->rundir);
        ctx_free(m);
        return mn_fail(rc, "%s", why);
    }
    *out = m;
    return 0;
}

const char *manta_job(const manta_ctx *m)
{
    return m ? m->job : "";
}

const char *manta_redis_url(const manta_ctx *m)
{
    return m && m->redis_url ? m->redis_url : "";
}

const char *manta_self(const manta_ctx *m)
{
    return m ? m->self : "";
}

const char *manta_node_id(const manta_ctx *m)
{
    return m ? m->node : "";
}

const char *manta_transport(const manta_ctx *m)
{
    return m && m->transport ? m->transport : "";
}

const char *manta_bind_host(const manta_ctx *m)
{
    return m && m->host ? m->host : "";
}

const char *manta_run_dir(const manta_ctx *m)
{
    return m ? m->rundir : "";
}

int manta_attached(const manta_ctx *m)
{
    return m && m->attached;
}

void manta_stats_get(const manta_ctx *m, manta_stats *out)
{
    if (m && out) *out = m->stats;
    if (m && out) out->auth_refused = atomic_load(&m->auth_refused);
}

/* ---- handles ---- */

static manta_actor *handle_new(manta_ctx *m, const char *name, const char *endpoint)
{
    for (manta_actor *a = m->actors; a; a = a->next)
        if (a->name && !strcmp(a->name, name)) return a;
    manta_actor *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->ctx = m;
    a->name = mn_strdup(name);
    a->peer = mn_peer_get(m, endpoint);
    if (!a->peer) {
        free(a->name);
        free(a);
        return NULL;
    }
    a->peer->owner = a;
    a->next = m->actors;
    m->actors = a;
    return a;
}

const char *manta_actor_name(const manta_actor *a)
{
    return a && a->name ? a->name : "";
}

int manta_actor_info_get(manta_ctx *m, const manta_actor *a, manta_actor_info *out)
{
    if (!m || !a || !out) return mn_fail(MANTA_EINVAL, "manta_actor_info_get: bad arguments");
    return mn_directory_read(m, a->name, out);
}

int manta_actor_lookup(manta_ctx *m, const char *name, manta_actor **out)
{
    if (!m || !name || !out) return mn_fail(MANTA_EINVAL, "manta_actor_lookup: bad arguments");
    for (manta_actor *a = m->actors; a; a = a->next)
        if (a->name && !strcmp(a->name, name)) return *out = a, 0;
    manta_actor_info info;
    int rc = mn_directory_read(m, name, &info);
    if (rc) return rc;
    if (!info.endpoint[0]) return mn_fail(MANTA_ENOTFOUND, "actor '%s' has no endpoint", name);
    *out = handle_new(m, name, mn_pick_endpoint(&info));
    return *out ? 0 : mn_fail(MANTA_EZMQ, "actor '%s': %s", name, manta_last_error());
}

/* The node agent's handle: not in the actor directory, so no owner. */
static mn_peer *node_peer(manta_ctx *m, const char *node)
{
    manta_reg_node rec;
    int rc = manta_reg_node_read(m, node, &rec);
    if (rc == 0 && !rec.endpoint[0])
        rc = mn_fail(MANTA_ENOTFOUND, "node '%s' of job %s has no endpoint", node, m->job);
    return rc ? NULL : mn_peer_get(m, rec.endpoint);
}

static int call_node(manta_ctx *m, const char *node, const char *method, const void *arg,
                     size_t len, int timeout_ms, char *out, size_t outlen)
{
    mn_peer *p = node_peer(m, node && *node ? node : m->node);
    if (!p) return MANTA_ENOTFOUND;
    manta_future *f = mn_call_peer(m, p, method, arg, len, timeout_ms, NULL);
    if (!f) return MANTA_ENOMEM;
    const void *data;
    size_t n;
    int rc = manta_get(f, -1, &data, &n);
    if (rc == 0 && out && n >= outlen)
        rc = mn_fail(MANTA_EPROTO, "node %s: %s: an answer of %zu bytes, more than %zu",
                     node && *node ? node : m->node, method, n, outlen - 1);
    else if (rc == 0 && out)
        memcpy(out, data, n), out[n] = 0;
    else if (rc)
        mn_fail(rc, "node %s: %s: %s", node && *node ? node : m->node, method,
                manta_future_error(f));
    manta_future_free(f);
    return rc;
}

static void pack_str(msgpack_packer *pk, const char *k, const char *v)
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

int manta_actor_create(manta_ctx *m, const manta_actor_options *o, manta_actor **out)
{
    if (!m || !o || !o->cls || !out)
        return mn_fail(MANTA_EINVAL, "manta_actor_create: ctx, options with cls, and out needed");
    *out = NULL;
    if (m->role != MN_ROLE_DRIVER && !m->node[0])
        return mn_fail(MANTA_EINVAL, "manta_actor_create: no node agent known");
    char name[128];
    if (o->name) {
        if (!mn_valid_name(o->name, 100))
            return mn_fail(MANTA_EINVAL, "actor name '%s': use 1..100 of [A-Za-z0-9._-]", o->name);
        snprintf(name, sizeof name, "%s", o->name);
    } else {
        char hex[9];
        mn_random_hex(hex, 8);
        snprintf(name, sizeof name, "%.60s-%s", o->cls, hex);
    }
    char exe[PATH_MAX];
    int rc = mn_self_exe(exe, sizeof exe);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    pack_str(&pk, "name", name);
    pack_str(&pk, "class", o->cls);
    pack_str(&pk, "library", o->library);
    pack_str(&pk, "exe", exe);
    msgpack_pack_str(&pk, 12);
    msgpack_pack_str_body(&pk, "max_restarts", 12);
    msgpack_pack_int(&pk, o->max_restarts);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "gpu", 3);
    msgpack_pack_double(&pk, o->gpu);
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "args", 4);
    msgpack_pack_bin(&pk, o->args_len);
    msgpack_pack_bin_body(&pk, o->args, o->args_len);
    /* The answer: "ENDPOINT" or "ENDPOINT\nLOCAL_ENDPOINT\nHOST" (multi-node). */
    char reply[600];
    rc = call_node(m, o->node, "spawn", sb.data, sb.size, 30000, reply, sizeof reply);
    msgpack_sbuffer_destroy(&sb);
    if (rc) return rc;
    manta_actor_info where;
    memset(&where, 0, sizeof where);
    char *nl = strchr(reply, '\n');
    if (nl) {
        *nl = 0;
        char *nl2 = strchr(nl + 1, '\n');
        if (nl2) {
            *nl2 = 0;
            snprintf(where.endpoint_local, sizeof where.endpoint_local, "%s", nl + 1);
            snprintf(where.host, sizeof where.host, "%s", nl2 + 1);
        }
    }
    snprintf(where.endpoint, sizeof where.endpoint, "%s", reply);
    manta_actor *a = handle_new(m, name, mn_pick_endpoint(&where));
    if (!a) return mn_fail(MANTA_EZMQ, "actor '%s': %s", name, manta_last_error());
    if (!o->no_wait) {
        rc = manta_actor_wait_ready(m, a, o->ready_timeout_ms > 0 ? o->ready_timeout_ms : 30000);
        if (rc) return rc;
    }
    *out = a;
    return 0;
}

int manta_actor_wait_ready(manta_ctx *m, manta_actor *a, int timeout_ms)
{
    if (!m || !a) return mn_fail(MANTA_EINVAL, "manta_actor_wait_ready: bad arguments");
    int64_t until = mn_now_ms() + timeout_ms;
    int step = 1;
    for (;;) {
        manta_reg_actor rec;
        const manta_actor_info *info = &rec.info;
        int rc = manta_reg_actor_read(m, a->name, &rec);
        if (rc == 0 && info->state == MANTA_ACTOR_ALIVE) {
            if (info->incarnation > a->peer->incarnation) a->peer->incarnation = info->incarnation;
            a->peer->dead = false;
            return mn_peer_connect(a->peer); /* now: the endpoint is bound */
        }
        if (rc == 0 && (info->state == MANTA_ACTOR_FAILED || info->state == MANTA_ACTOR_DEAD))
            return mn_fail(MANTA_ESPAWN, "actor %s %s: %s", a->name,
                           manta_actor_state_name(info->state),
                           rec.error[0] ? rec.error : "no reason recorded");
        if (rc && rc != MANTA_ENOTFOUND) return rc;
        if (mn_now_ms() > until)
            return mn_fail(MANTA_ETIMEDOUT, "actor %s not ready after %d ms (state %s)", a->name,
                           timeout_ms, rc ? "unknown" : manta_actor_state_name(info->state));
        /* Serve the loop meanwhile instead of sleeping. */
        mn_loop_once(m, step);
        if (step < 20) step *= 2;
    }
}

static int node_of(manta_ctx *m, const manta_actor *a, char *node, size_t n)
{
    manta_actor_info info;
    int rc = mn_directory_read(m, a->name, &info);
    if (rc) return rc;
    snprintf(node, n, "%s", info.node);
    return 0;
}

int manta_actor_kill(manta_ctx *m, manta_actor *a, int restart)
{
    if (!m || !a) return mn_fail(MANTA_EINVAL, "manta_actor_kill: bad arguments");
    char node[64], arg[160];
    int rc = node_of(m, a, node, sizeof node);
    if (rc) return rc;
    snprintf(arg, sizeof arg, "%d %s", restart ? 1 : 0, a->name);
    return call_node(m, node, "kill", arg, strlen(arg), 10000, NULL, 0);
}

int manta_actor_stop(manta_ctx *m, manta_actor *a, int timeout_ms)
{
    if (!m || !a) return mn_fail(MANTA_EINVAL, "manta_actor_stop: bad arguments");
    char node[64];
    int rc = node_of(m, a, node, sizeof node);
    if (rc) return rc;
    /* The node agent asks the actor to stop and answers once it has exited. */
    return call_node(m, node, "stop", a->name, strlen(a->name), timeout_ms > 0 ? timeout_ms : 30000,
                     NULL, 0);
}

/* ---- shutdown ---- */

/* Ask every node agent of the job (other machines' too) to stop its actors
 * and leave; they answer once their actors are gone. */
static void shutdown_nodes(manta_ctx *m)
{
    manta_reg_names ids;
    if (manta_reg_node_ids(m, &ids) != 0) {
        mn_log("shutdown: %s", manta_last_error());
        return;
    }
    manta_future **fs = calloc(ids.n + 1, sizeof *fs);
    size_t n = 0;
    if (!fs) mn_log("shutdown: out of memory for %zu node agents", ids.n);
    for (size_t i = 0; fs && i < ids.n; i++) {
        mn_peer *p = node_peer(m, ids.v[i]);
        if (p && (fs[n] = mn_call_peer(m, p, "shutdown", NULL, 0, 15000, NULL))) n++;
    }
    manta_reg_names_free(&ids);
    manta_wait(fs, n, n, 16000);
    for (size_t i = 0; i < n; i++) {
        if (manta_future_status(fs[i]) != 0)
            mn_log("shutdown: a node agent: %s", manta_future_error(fs[i]));
        manta_future_free(fs[i]);
    }
    free(fs);
}

void manta_shutdown(manta_ctx *m)
{
    if (!m) return;
    if (m->role == MN_ROLE_DRIVER && !m->attached && m->redis_url) shutdown_nodes(m);
    if (m->role == MN_ROLE_DRIVER && m->node_pid > 0) {
        /* The agent gives its actors 3 s to run fini, then 2 s after SIGKILL. */
        int64_t until = mn_now_ms() + 8000;
        int status;
        while (waitpid(m->node_pid, &status, WNOHANG) == 0) {
            if (mn_now_ms() > until) {
                kill(m->node_pid, SIGKILL);
                waitpid(m->node_pid, &status, 0);
                break;
            }
            mn_loop_once(m, 5);
        }
        m->node_pid = 0;
    }
    if (m->role == MN_ROLE_DRIVER) mn_objstore_free(m);
    if (m->role == MN_ROLE_DRIVER && !m->attached) {
        if (m->redis_url && mn_delete_job_keys(m) != 0)
            mn_log("shutdown: job %s's keys: %s", m->job, manta_last_error());
        mn_remove_dir(m->rundir);
    }
    mn_redis_stop_embedded(m);
    ctx_free(m);
}

/* ---- spawning a local node agent (driver) ---- */

int mn_node_spawn_local(manta_ctx *m)
{
    char exe[PATH_MAX];
    int rc = mn_self_exe(exe, sizeof exe);
    if (rc) return rc;
    char id[16] = "node-";
    mn_random_hex(id + 5, 6);
    snprintf(m->node, sizeof m->node, "%s", id);
    char maxm[32];
    snprintf(maxm, sizeof maxm, "%zu", m->max_message);
    static const char *const keep[] = {"MANTA_DEBUG=", "MANTA_RUN_DIR=", "MANTA_NODE_",
                                       "MANTA_LOG_LEVEL=", NULL};
    const mn_var vars[] = {
        {"MANTA_ROLE", "node"},
        {"MANTA_REDIS", m->redis_url},
        {"MANTA_JOB", m->job},
        {"MANTA_NAME", id},
        {"MANTA_TRANSPORT", m->transport},
        {"MANTA_HOST", m->host},
        {"MANTA_LOG_DIR", m->log_dir ? m->log_dir : ""},
        {"MANTA_MAX_MESSAGE", maxm},
        {"MANTA_CURVE", m->curve ? "on" : "off"},
        {"MANTA_KEYS", m->keys_path},
        {"MANTA_LIBRARIES", m->libraries ? m->libraries : ""},
    };
    char **envp = mn_child_env(keep, vars, sizeof vars / sizeof vars[0]);
    if (!envp) return MANTA_ENOMEM;
    char *argv[] = {exe, NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        free(envp);
        return mn_fail(MANTA_ESYS, "fork node agent: %s", strerror(errno));
    }
    if (pid == 0) {
        /* The agent (and so its actors) go when the driver goes. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1);
        execve(exe, argv, envp);
        _exit(127);
    }
    free(envp);
    m->node_pid = pid;
    int64_t until = mn_now_ms() + 10000;
    while (mn_now_ms() < until) {
        manta_reg_node rec;
        if (manta_reg_node_read(m, id, &rec) == 0 && rec.state == MANTA_ACTOR_ALIVE) return 0;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            m->node_pid = 0;
            return mn_fail(MANTA_ESPAWN,
                           "node agent exited at start (status %d): does main() "
                           "call manta_init() before anything else?",
                           status);
        }
        usleep(2000); /* the agent is another process: poll its record until a deadline */
    }
    return mn_fail(MANTA_ETIMEDOUT, "node agent %s not alive after 10 s", id);
}
