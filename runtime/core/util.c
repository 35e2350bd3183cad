/*
 * util.c -- errors, clocks, random ids, logging and the id map.
 *
 * Errors: every failure goes through mn_fail(), which records a message in a
 * thread-local buffer (manta_last_error) and returns the code, so a caller
 * can write `return mn_fail(MANTA_EINVAL, "...")` and the user sees both.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char last_error[512];

/* The table's codes must run 0, -1, -2 ... in order, so that -code is the
 * index of a code (manta_err_index) and no two names share a value. */
#define MANTA_X_CHECK(name, c, text)                                                               \
    _Static_assert(c == -MANTA_ERR_INDEX_##name, "MANTA_ERRORS: " #name " is out of sequence");
MANTA_ERRORS(MANTA_X_CHECK)
#undef MANTA_X_CHECK

const char *manta_strerror(int code)
{
    static const char *const text[MANTA_ERR_COUNT] = {
#define MANTA_X_TEXT(name, c, t) t,
        MANTA_ERRORS(MANTA_X_TEXT)
#undef MANTA_X_TEXT
    };
    return code <= 0 && code > -MANTA_ERR_COUNT ? text[-code] : "unknown error code";
}

const char *manta_errname(int code)
{
    static const char *const names[MANTA_ERR_COUNT] = {
#define MANTA_X_NAME(name, c, t) #name,
        MANTA_ERRORS(MANTA_X_NAME)
#undef MANTA_X_NAME
    };
    return code <= 0 && code > -MANTA_ERR_COUNT ? names[-code] : "?";
}

const char *manta_last_error(void)
{
    return last_error;
}

static int vfail(int code, const char *fmt, va_list ap)
{
    /* Format aside first: callers often wrap the last message, passing
     * manta_last_error() itself as an argument. */
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof msg);
    return code;
}

int mn_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

int manta_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

int64_t manta_now_ms(void)
{
    return mn_now_ms();
}

void manta_random_hex(char *out, size_t nhex)
{
    mn_random_hex(out, nhex);
}

int64_t mn_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mn_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void mn_random_hex(char *out, size_t nhex)
{
    unsigned char buf[64];
    size_t nbytes = (nhex + 1) / 2;
    if (nbytes > sizeof buf) nbytes = sizeof buf;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, nbytes) : -1;
    if (fd >= 0) close(fd);
    if (got != (ssize_t)nbytes) {
        /* No /dev/urandom: fall back on time and pid, still unique enough
         * for key names (never used for secrets without urandom). */
        uint64_t x = (uint64_t)mn_wall_ms() ^ ((uint64_t)getpid() << 32);
        for (size_t i = 0; i < nbytes; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (unsigned char)x;
        }
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < nhex && i / 2 < nbytes; i++)
        out[i] = hex[(buf[i / 2] >> ((i & 1) ? 0 : 4)) & 15];
    out[nhex] = 0;
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define MN_LSAN 1
#endif

_Noreturn void mn_exit(int code)
{
    fflush(stdout);
    fflush(stderr);
#ifdef MN_LSAN
    if (code == 0 && __lsan_do_recoverable_leak_check()) code = MN_EXIT_LEAKED;
#endif
    _exit(code);
}

void mn_log(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mn_log_line(MANTA_LOG_WARN, buf);
}

char *mn_strdup(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- id map: linear probing, tombstones marked by a NULL value ---- */

static size_t slot_of(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static int grow(mn_idmap *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 64;
    if (t->len * 4 < t->cap) ncap = t->cap; /* mostly tombstones: rehash same size */
    uint64_t *keys = calloc(ncap, sizeof *keys);
    void **vals = calloc(ncap, sizeof *vals);
    if (!keys || !vals) {
        free(keys), free(vals);
        return MANTA_ENOMEM;
    }
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->keys[i] || !t->vals[i]) continue;
        size_t j = slot_of(t->keys[i], ncap);
        while (keys[j]) j = (j + 1) & (ncap - 1);
        keys[j] = t->keys[i], vals[j] = t->vals[i];
    }
    free(t->keys), free(t->vals);
    t->keys = keys, t->vals = vals, t->cap = ncap, t->used = t->len;
    return 0;
}

int mn_idmap_put(mn_idmap *t, uint64_t key, void *val)
{
    if (!key || !val) return MANTA_EINVAL;
    if ((t->used + 1) * 2 > t->cap && grow(t)) return MANTA_ENOMEM;
    size_t j = slot_of(key, t->cap);
    while (t->keys[j] && t->keys[j] != key) j = (j + 1) & (t->cap - 1);
    if (!t->keys[j]) t->used++;
    if (!t->keys[j] || !t->vals[j]) t->len++;
    t->keys[j] = key, t->vals[j] = val;
    return 0;
}

static size_t find(const mn_idmap *t, uint64_t key)
{
    if (!t->cap) return (size_t)-1;
    size_t j = slot_of(key, t->cap);
    while (t->keys[j]) {
        if (t->keys[j] == key) return t->vals[j] ? j : (size_t)-1;
        j = (j + 1) & (t->cap - 1);
    }
    return (size_t)-1;
}

void *mn_idmap_get(const mn_idmap *t, uint64_t key)
{
    size_t j = find(t, key);
    return j == (size_t)-1 ? NULL : t->vals[j];
}

void *mn_idmap_del(mn_idmap *t, uint64_t key)
{
    size_t j = find(t, key);
    if (j == (size_t)-1) return NULL;
    void *v = t->vals[j];
    t->vals[j] = NULL; /* tombstone: the key stays so probing continues */
    t->len--;
    return v;
}

void mn_idmap_free(mn_idmap *t)
{
    free(t->keys), free(t->vals);
    memset(t, 0, sizeof *t);
}

char **mn_child_env(const char *const *keep, const mn_var *vars, size_t nvars)
{
    extern char **environ;
    size_t nenv = 0, bytes = 0;
    while (environ[nenv]) nenv++;
    for (size_t i = 0; i < nvars; i++) bytes += strlen(vars[i].name) + strlen(vars[i].value) + 2;
    /* One block: the pointer array, then the new NAME=value strings. */
    size_t slots = nenv + nvars + 1;
    char **envp = malloc(slots * sizeof *envp + bytes);
    if (!envp) {
        mn_fail(MANTA_ENOMEM, "environment of a child process: out of memory");
        return NULL;
    }
    char *text = (char *)(envp + slots);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++) {
        bool pass = strncmp(environ[i], "MANTA_", 6) != 0;
        for (size_t j = 0; !pass && keep && keep[j]; j++)
            pass = !strncmp(environ[i], keep[j], strlen(keep[j]));
        for (size_t j = 0; pass && j < nvars; j++) { /* the new value replaces the old */
            size_t nl = strlen(vars[j].name);
            pass = !(strncmp(environ[i], vars[j].name, nl) == 0 && environ[i][nl] == '=');
        }
        if (pass) envp[k++] = environ[i];
    }
    for (size_t i = 0; i < nvars; i++) {
        envp[k++] = text;
        text += sprintf(text, "%s=%s", vars[i].name, vars[i].value) + 1;
    }
    envp[k] = NULL;
    return envp;
}

int mn_self_exe(char *out, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", out, n);
    if (len <= 0) return mn_fail(MANTA_ESYS, "readlink /proc/self/exe: %s", strerror(errno));
    if ((size_t)len >= n)
        return mn_fail(MANTA_EINVAL, "this program's path is longer than %zu bytes", n - 1);
    out[len] = 0;
    return 0;
}

int mn_private_dir(const char *path, const char *what)
{
    if (mkdir(path, 0700) == 0) return 0;
    if (errno != EEXIST)
        return mn_fail(MANTA_ESYS, "%s %s: cannot create it: %s", what, path, strerror(errno));
    /* It was there before us: someone else may have made it to receive our
     * sockets. Trust it only if it is exactly what we would have made. */
    struct stat st;
    if (lstat(path, &st) != 0) return mn_fail(MANTA_ESYS, "%s %s: %s", what, path, strerror(errno));
    if (S_ISLNK(st.st_mode))
        return mn_fail(MANTA_ESYS, "%s %s exists and is a symbolic link; refusing to use it", what,
                       path);
    if (!S_ISDIR(st.st_mode))
        return mn_fail(MANTA_ESYS, "%s %s exists and is not a directory; refusing to use it", what,
                       path);
    if (st.st_uid != geteuid())
        return mn_fail(MANTA_ESYS,
                       "%s %s exists and is owned by uid %u, not this user (uid %u); refusing "
                       "to use it",
                       what, path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 07777) != 0700)
        return mn_fail(MANTA_ESYS,
                       "%s %s exists with mode %04o, not 0700; refusing to use it (remove it, "
                       "or chmod 700 it if it is yours)",
                       what, path, (unsigned)(st.st_mode & 07777));
    return 0;
}

int manta_private_dir(const char *path, const char *what)
{
    if (!path || !*path) return mn_fail(MANTA_EINVAL, "manta_private_dir: no path");
    return mn_private_dir(path, what && *what ? what : "folder");
}

int mn_limit_socket(void *sock, int64_t max_frame)
{
    int hwm = MN_RCVHWM;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame) != 0) return -1;
    return zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
}

int64_t mn_max_frame(const manta_ctx *m)
{
    const int64_t cap = INT64_MAX / 4;
    int64_t mm = m->max_message > (size_t)cap ? cap : (int64_t)m->max_message;
    return 2 * mm + 64 * 1024;
}

int mn_valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}
