/*
 * test_recover.c -- the runtime's recoveries, one process each, without a
 * whole job:
 *
 *   redis   the embedded redis-server killed with SIGKILL comes back on
 *           the same port with its data (append-only file): a value
 *           written before is read after, through the same ctx, within 5 s
 *   readmit a node agent declared dead while alive (its record says dead,
 *           it left the node set: what the driver's watchdog writes) joins
 *           again at its next heartbeat; its actor whose directory record
 *           went elsewhere is stopped, the one still recorded on it answers
 *
 * Real redis-server and node agent processes; this program is also the
 * agent and its actors (MANTA_ROLE).
 */
#include <manta_job.h>
#include <manta_schema.h>

#include <dirent.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static manta_ctx *ctx;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int w_ping(manta_req *call, void *state, const void *arg, size_t len)
{
    (void)state;
    return manta_reply(call, arg, len);
}
static const manta_method worker_methods[] = {{"ping", w_ping}, {NULL, NULL}};
static const manta_class worker_class = {"worker", 0, NULL, NULL, worker_methods};
static const manta_class *const classes[] = {&worker_class, NULL};

/* The pid of this process's child named comm (redis-server), or 0. */
static int child_named(const char *comm)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d)) && !found) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        int ppid = 0;
        char state = 0;
        if (!open || !close || sscanf(close + 1, " %c %d", &state, &ppid) != 2) continue;
        *close = 0;
        if (ppid == getpid() && state != 'Z' && !strcmp(open + 1, comm)) found = pid;
    }
    if (d) closedir(d);
    return found;
}

static void test_redis(void)
{
    const char *val = "written before the crash";
    if (manta_kv_set(ctx, "recover", val, strlen(val)) != 0) die("kv set: %s", manta_last_error());
    int pid = child_named("redis-server");
    if (!pid) die("no redis-server child");
    kill(pid, SIGKILL);
    int64_t t0 = manta_now_ms();
    void *got = NULL;
    size_t len = 0;
    int rc = -1;
    while (manta_now_ms() - t0 < 5000 && (rc = manta_kv_get(ctx, "recover", &got, &len)) != 0)
        usleep(50000);
    if (rc != 0) die("no value 5 s after the kill: %s", manta_last_error());
    if (len != strlen(val) || memcmp(got, val, len)) die("the value came back changed");
    free(got);
    int again = child_named("redis-server");
    if (!again || again == pid) die("no new redis-server (old pid %d, now %d)", pid, again);
    printf("redis: killed pid %d, pid %d answers with the data after %lld ms\n", pid, again,
           (long long)(manta_now_ms() - t0));
}

/* Start this program as the node agent `name` of the job. */
static pid_t start_node(const char *name)
{
    char vars[4][700];
    snprintf(vars[0], sizeof vars[0], "MANTA_ROLE=node");
    snprintf(vars[1], sizeof vars[1], "MANTA_NAME=%s", name);
    snprintf(vars[2], sizeof vars[2], "MANTA_JOB=%s", manta_job(ctx));
    snprintf(vars[3], sizeof vars[3], "MANTA_REDIS=%s", manta_redis_url(ctx));
    char *env[] = {vars[0], vars[1], vars[2], vars[3], NULL};
    char self[64];
    snprintf(self, sizeof self, "/proc/%d/exe", (int)getpid());
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no agent behind */
        if (getppid() != parent) _exit(1);
        execle(self, self, (char *)NULL, env);
        _exit(127);
    }
    return pid;
}

static int actor_pid(const char *name)
{
    manta_reg_actor *a = malloc(sizeof *a);
    int pid = a && manta_reg_actor_read(ctx, name, a) == 0 ? a->info.pid : 0;
    free(a);
    return pid;
}

static bool node_alive_in_set(const char *id)
{
    manta_reg_node_list l;
    if (manta_reg_node_list_read(ctx, &l) != 0) return false;
    bool ok = false;
    for (size_t i = 0; i < l.n; i++)
        if (!strcmp(l.v[i].id, id) && l.v[i].rec.state == MANTA_ACTOR_ALIVE) ok = true;
    manta_reg_node_list_free(&l);
    return ok;
}

static void test_readmit(void)
{
    pid_t agent = start_node("n2");
    for (int t = 0; t < 100 && !node_alive_in_set("n2"); t++) usleep(50000);
    if (!node_alive_in_set("n2")) die("node n2 did not join");
    manta_actor *keep, *gone;
    if (manta_actor_create(ctx,
                           &(manta_actor_options){.cls = "worker", .name = "w-keep", .node = "n2"},
                           &keep) != 0 ||
        manta_actor_create(ctx,
                           &(manta_actor_options){.cls = "worker", .name = "w-gone", .node = "n2"},
                           &gone) != 0)
        die("create on n2: %s", manta_last_error());
    int gone_pid = actor_pid("w-gone");
    if (gone_pid <= 0) die("w-gone has no pid");
    /* what the watchdog writes when it declares n2 dead and re-creates
     * w-gone elsewhere (its old record forgotten) */
    if (manta_reg_actor_forget(ctx, "w-gone") != 0 ||
        manta_reg_node_set_state(ctx, "n2", MANTA_ACTOR_DEAD) != 0 ||
        manta_reg_node_leave(ctx, "n2") != 0)
        die("declaring n2 dead: %s", manta_last_error());
    int64_t t0 = manta_now_ms();
    while (manta_now_ms() - t0 < 5000 && !node_alive_in_set("n2")) usleep(50000);
    if (!node_alive_in_set("n2")) die("n2 was not re-admitted within 5 s");
    printf("readmit: n2 back in the node set after %lld ms\n", (long long)(manta_now_ms() - t0));
    while (manta_now_ms() - t0 < 5000 && kill(gone_pid, 0) == 0) usleep(50000);
    if (kill(gone_pid, 0) == 0) die("w-gone (pid %d), replaced elsewhere, still runs", gone_pid);
    manta_future *f = manta_call(ctx, keep, "ping", "hi", 2);
    const void *d;
    size_t n;
    if (manta_get(f, 10000, &d, &n) != 0 || n != 2 || memcmp(d, "hi", 2))
        die("w-keep does not answer after the re-admission: %s", manta_future_error(f));
    manta_future_free(f);
    if (actor_pid("w-gone") != 0) die("w-gone's record came back");
    kill(agent, SIGTERM);
    waitpid(agent, NULL, 0);
}

int main(int argc, char **argv)
{
    char job[64];
    snprintf(job, sizeof job, "fault-recover-%d", (int)getpid());
    if (manta_init(&ctx, &(manta_options){.classes = classes, .job = job}) != 0) {
        fprintf(stderr, "manta_init: %s\n", manta_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *which = argc > 1 ? argv[1] : "";
    if (!strcmp(which, "redis"))
        test_redis();
    else if (!strcmp(which, "readmit"))
        test_readmit();
    else
        die("usage: test_recover redis|readmit");
    manta_shutdown(ctx);
    printf("ok: %s\n", which);
    return 0;
}
