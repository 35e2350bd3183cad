/*
 * auth.c -- who may talk to this process: CURVE on its ZeroMQ sockets, the
 * ZAP handler that admits only the job's members, and the key files.
 *
 * A job has one CURVE key pair. Every socket that receives from other
 * processes (a mailbox, a node agent's mailbox, an object server) is a
 * CURVE server with the job's secret key; every socket that calls is a
 * CURVE client that knows the server key (the job's public key) and
 * presents the job's pair as its own. So a client without the file cannot
 * even finish the handshake (it does not know the server key), and one that
 * has the server key but another pair is refused by the ZAP handler, which
 * admits only the job's public key and the file's allow-list.
 *
 * The ZAP handler (RFC 27) is a REP socket bound at inproc://zeromq.zap.01
 * in this process's ZeroMQ context, served by a thread of its own rather
 * than the event loop: a method that computes for seconds must not stall
 * every handshake. libzmq 4.3 accepts CURVE clients without asking when no
 * handler is bound, so the handler is bound before the first server socket
 * and lives until zmq_ctx_term, after every server socket has closed: the
 * term makes its receive fail with ETERM, and it closes its socket then.
 *
 * Refusals are counted (manta_stats.auth_refused) and logged with the peer
 * address the ZAP request carries. A client that speaks no CURVE at all
 * (mechanism NULL) or with a wrong server key fails before ZAP is asked;
 * the mailbox's socket monitor counts those (serve.c).
 *
 * ipc sockets live in the private 0700 run folder, so by default ("auto")
 * only tcp jobs use CURVE; "on" uses it for ipc too, "off" for neither.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZAP_ENDPOINT  "inproc://zeromq.zap.01"
#define ZAP_DOMAIN    "manta"
#define KEY_FILE      "curve.key"
#define KEYS_MAX_FILE (64 * 1024)
/* libzmq's ZMQ_ZAP_ENFORCE_DOMAIN (a draft option in 4.3): when the build
 * has it, a server refuses clients if no handler answers; without it the
 * handler's lifetime (see above) gives the same guarantee. */
#define OPT_ZAP_ENFORCE_DOMAIN 93

static pthread_mutex_t zap_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- key files ---- */

int manta_key_valid(const char *z85)
{
    uint8_t bin[32];
    return z85 && strlen(z85) == MANTA_KEY_Z85_LEN && zmq_z85_decode(bin, z85) != NULL;
}

int manta_keys_generate(manta_keys *k)
{
    if (!k) return mn_fail(MANTA_EINVAL, "manta_keys_generate: no keys");
    memset(k, 0, sizeof *k);
    if (!zmq_has("curve"))
        return mn_fail(MANTA_EINVAL,
                       "this libzmq was built without CURVE (zmq_has(\"curve\") is 0)");
    if (zmq_curve_keypair(k->public_key, k->secret_key) != 0)
        return mn_fail(MANTA_EZMQ, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    return 0;
}

static int write_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w, n -= (size_t)w;
    }
    return 0;
}

int manta_keys_write(const char *path, const manta_keys *k, int replace)
{
    if (!path || !k) return mn_fail(MANTA_EINVAL, "manta_keys_write: path and keys needed");
    if (!manta_key_valid(k->public_key) || !manta_key_valid(k->secret_key))
        return mn_fail(MANTA_EINVAL, "key file %s: the key pair is not two Z85 keys", path);
    char text[128 + MANTA_KEYS_MAX_ALLOW * 64];
    int n = snprintf(text, sizeof text,
                     "# Manta CURVE keys (zmq_z85). Whoever reads this file can join the job:\n"
                     "# keep it mode 0600 and copy it only to the job's machines.\n"
                     "public-key = %s\nsecret-key = %s\n",
                     k->public_key, k->secret_key);
    for (size_t i = 0; i < k->nallow && i < MANTA_KEYS_MAX_ALLOW; i++) {
        if (!manta_key_valid(k->allow[i]))
            return mn_fail(MANTA_EINVAL, "key file %s: allow-list entry %zu is not a Z85 key", path,
                           i + 1);
        n += snprintf(text + n, sizeof text - (size_t)n, "allow = %s\n", k->allow[i]);
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmpXXXXXX", path) >= (int)sizeof tmp)
        return mn_fail(MANTA_EINVAL, "key file %s: path too long", path);
    /* mkstemp makes the file 0600 with O_EXCL: no one else's file or link
     * is written through; the rename then puts it in place whole. */
    int fd = replace ? mkstemp(tmp)
                     : open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return mn_fail(MANTA_ESYS, "key file %s: cannot create it: %s%s", path, strerror(errno),
                       errno == EEXIST ? " (it exists; not overwritten)" : "");
    int rc = fchmod(fd, 0600) != 0 || write_all(fd, text, (size_t)n) != 0 || fsync(fd) != 0;
    int err = errno;
    if (close(fd) != 0 && !rc) rc = 1, err = errno;
    if (!rc && replace && rename(tmp, path) != 0) rc = 1, err = errno;
    if (rc) {
        unlink(replace ? tmp : path);
        return mn_fail(MANTA_ESYS, "key file %s: cannot write it: %s", path, strerror(err));
    }
    return 0;
}

/* Read the whole file, checking that only this user can read it. */
static int read_private_file(const char *path, char *buf, size_t cap, size_t *len)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return mn_fail(MANTA_ESYS, "key file %s: %s%s", path, strerror(errno),
                       errno == ELOOP ? " (a symbolic link: refused)" : "");
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = mn_fail(MANTA_ESYS, "key file %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = mn_fail(MANTA_EINVAL, "key file %s: not a regular file", path);
    else if (st.st_uid != geteuid())
        rc = mn_fail(MANTA_ESYS, "key file %s: owned by uid %u, not this user (uid %u); refused",
                     path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & 077)
        rc = mn_fail(MANTA_ESYS,
                     "key file %s: mode %04o lets others read the job's secret key; refused "
                     "(chmod 600 it, and make new keys if others may have read them)",
                     path, (unsigned)(st.st_mode & 07777));
    else if (st.st_size < 0 || (size_t)st.st_size >= cap)
        rc = mn_fail(MANTA_EINVAL, "key file %s: over %zu bytes", path, cap - 1);
    size_t n = 0;
    while (rc == 0) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = mn_fail(MANTA_ESYS, "key file %s: %s", path, strerror(errno));
        if (r <= 0) break;
        n += (size_t)r;
        if (n == cap - 1) rc = mn_fail(MANTA_EINVAL, "key file %s: over %zu bytes", path, cap - 1);
    }
    close(fd);
    buf[n] = 0;
    *len = n;
    return rc;
}

/* One "name = value" line into the keys. */
static int parse_line(const char *path, int lineno, char *line, manta_keys *k)
{
    char *eq = strchr(line, '=');
    if (!eq) return mn_fail(MANTA_EINVAL, "key file %s:%d: expected NAME = KEY", path, lineno);
    char *name = line, *val = eq + 1, *e = eq;
    while (*name == ' ' || *name == '\t') name++;
    while (e > name && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *e = 0;
    while (*val == ' ' || *val == '\t') val++;
    size_t vl = strlen(val);
    while (vl && (val[vl - 1] == ' ' || val[vl - 1] == '\t' || val[vl - 1] == '\r')) val[--vl] = 0;
    if (!manta_key_valid(val))
        return mn_fail(MANTA_EINVAL, "key file %s:%d: %s: not a 40-character Z85 key", path, lineno,
                       name);
    char *dst;
    if (!strcmp(name, "public-key")) {
        dst = k->public_key;
    } else if (!strcmp(name, "secret-key")) {
        dst = k->secret_key;
    } else if (!strcmp(name, "allow")) {
        if (k->nallow == MANTA_KEYS_MAX_ALLOW)
            return mn_fail(MANTA_EINVAL, "key file %s:%d: more than %d allow lines", path, lineno,
                           MANTA_KEYS_MAX_ALLOW);
        dst = k->allow[k->nallow++];
    } else {
        return mn_fail(MANTA_EINVAL,
                       "key file %s:%d: unknown name '%s' (public-key, secret-key or allow)", path,
                       lineno, name);
    }
    memcpy(dst, val, MANTA_KEY_Z85_LEN + 1);
    return 0;
}

int manta_keys_read(const char *path, manta_keys *k)
{
    if (!path || !k) return mn_fail(MANTA_EINVAL, "manta_keys_read: path and keys needed");
    memset(k, 0, sizeof *k);
    char *buf = malloc(KEYS_MAX_FILE);
    if (!buf) return mn_fail(MANTA_ENOMEM, "key file %s: out of memory", path);
    size_t len = 0;
    int rc = read_private_file(path, buf, KEYS_MAX_FILE, &len);
    int lineno = 0;
    for (char *line = buf, *next; rc == 0 && line < buf + len; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : buf + len;
        if (nl) *nl = 0;
        lineno++;
        const char *p = line + strspn(line, " \t\r");
        if (*p == 0 || *p == '#') continue;
        rc = parse_line(path, lineno, line, k);
    }
    free(buf);
    if (rc) return rc;
    if (!k->public_key[0] || !k->secret_key[0])
        return mn_fail(MANTA_EINVAL, "key file %s: needs a public-key and a secret-key line", path);
    char derived[MANTA_KEY_Z85_LEN + 1];
    if (zmq_curve_public(derived, k->secret_key) != 0 || strcmp(derived, k->public_key))
        return mn_fail(MANTA_EINVAL, "key file %s: the public key is not the secret key's", path);
    return 0;
}

/* ---- this process's setup ---- */

static int make_job_keys(manta_ctx *m)
{
    int rc = manta_keys_generate(&m->keys);
    if (rc) return rc;
    if (snprintf(m->keys_path, sizeof m->keys_path, "%s/%s", m->rundir, KEY_FILE) >=
        (int)sizeof m->keys_path)
        return mn_fail(MANTA_EINVAL, "key file in %s: path too long", m->rundir);
    /* A job of this name may be running (a second driver is refused later,
     * by the job library): its key file is kept and used, never replaced
     * under the feet of its members. A file that does not read well (not
     * ours, wrong mode, broken) is an error, not something to overwrite. */
    if (access(m->keys_path, F_OK) == 0) return manta_keys_read(m->keys_path, &m->keys);
    return manta_keys_write(m->keys_path, &m->keys, 0);
}

static int read_job_keys(manta_ctx *m, const char *path)
{
    /* Absolute, so that children that change folder still find it. */
    char abs[PATH_MAX];
    if (!realpath(path, abs)) return mn_fail(MANTA_ESYS, "key file %s: %s", path, strerror(errno));
    if (snprintf(m->keys_path, sizeof m->keys_path, "%s", abs) >= (int)sizeof m->keys_path)
        return mn_fail(MANTA_EINVAL, "key file %s: path too long", abs);
    return manta_keys_read(m->keys_path, &m->keys);
}

/* A member's "auto": CURVE when its transport is tcp or a key file is given
 * (never turned off from outside), or when the owner's record says the job
 * uses it. Without a record (an owner of an older version) the owner's key
 * file on this machine says so, as before; with one, a file left in the run
 * folder by an earlier job of the same name no longer turns CURVE on. */
static bool member_auto(manta_ctx *m, bool given, bool rec_found, int rec_curve, bool job_keys_here)
{
    if (!strcmp(m->transport, "tcp") || given) return true;
    return rec_found ? rec_curve != 0 : job_keys_here;
}

static const char *role_name(const manta_ctx *m)
{
    return m->role == MN_ROLE_NODE    ? "node"
           : m->role == MN_ROLE_ACTOR ? "actor"
                                      : "attached driver";
}

int mn_auth_setup(manta_ctx *m, const manta_options *opts)
{
    const char *mode = getenv("MANTA_CURVE");
    if (!mode || !*mode) mode = opts->curve && *opts->curve ? opts->curve : "auto";
    if (strcmp(mode, "auto") && strcmp(mode, "on") && strcmp(mode, "off"))
        return mn_fail(MANTA_EINVAL, "security curve '%s': expected auto, on or off", mode);
    /* A process that does not own the job (an attached driver, a node
     * agent, an actor) follows the owner: its record in Redis says whether
     * the job uses CURVE and with which public key. */
    char own[PATH_MAX];
    snprintf(own, sizeof own, "%s/%s", m->rundir, KEY_FILE);
    bool owner = m->role == MN_ROLE_DRIVER && !opts->attach;
    bool job_keys_here = !owner && access(own, F_OK) == 0;
    int rec_curve = 0;
    char rec_key[MANTA_KEY_Z85_LEN + 1] = "";
    bool rec_found = false;
    if (!owner) {
        int rc = mn_reg_security_read(m, &rec_curve, rec_key, sizeof rec_key);
        if (rc && rc != MANTA_ENOTFOUND) return rc;
        rec_found = rc == 0;
    }
    /* A key file given is a request to use it. */
    const char *path = getenv("MANTA_KEYS");
    if (!path || !*path) path = opts->keys_file;
    bool given = path && *path;
    bool is_auto = !strcmp(mode, "auto");
    m->curve = !strcmp(mode, "on") ||
               (is_auto && (owner ? !strcmp(m->transport, "tcp") || given
                                  : member_auto(m, given, rec_found, rec_curve, job_keys_here)));
    if (!m->curve) return 0;
    if (!zmq_has("curve"))
        return mn_fail(MANTA_EINVAL,
                       "CURVE is %s for this %s job but libzmq was built without it (set "
                       "security curve off only where every port is private)",
                       mode, m->transport);
    int rc;
    if (given) {
        rc = read_job_keys(m, path);
    } else if (owner) {
        rc = make_job_keys(m);
    } else if (job_keys_here) {
        /* on the owner's machine: its file, in our private run folder */
        rc = read_job_keys(m, own);
    } else {
        rc = mn_fail(MANTA_EINVAL,
                     "%s %s of job %s: CURVE is on (%s transport) but no key file was given "
                     "(MANTA_KEYS) and %s is not here; make one with `manta keys new FILE` and "
                     "give it to every machine of the job",
                     role_name(m), m->self, m->job, m->transport, own);
    }
    if (rc) return rc;
    /* The owner said which keys the job uses: a file of another job (one
     * left by an earlier job of this name, or the wrong copy) fails here,
     * by name, instead of as handshakes that never complete. */
    if (rec_found && rec_key[0] && strcmp(rec_key, m->keys.public_key))
        return mn_fail(MANTA_EINVAL,
                       "%s %s of job %s: key file %s holds public key %.8s..., but the job "
                       "uses %.8s... (a file of an earlier job of this name?); give the job's "
                       "key file with MANTA_KEYS",
                       role_name(m), m->self, m->job, m->keys_path, m->keys.public_key, rec_key);
    m->nallow_bin = 0;
    zmq_z85_decode(m->allow_bin[m->nallow_bin++], m->keys.public_key);
    for (size_t i = 0; i < m->keys.nallow; i++)
        zmq_z85_decode(m->allow_bin[m->nallow_bin++], m->keys.allow[i]);
    return 0;
}

int mn_auth_publish(manta_ctx *m)
{
    /* A job of this name already claimed by a driver (a second driver, which
     * the job library refuses next) keeps the record of its own: members of
     * the running job must not follow this process's settings. */
    manta_reg_driver *d = calloc(1, sizeof *d);
    if (!d) return mn_fail(MANTA_ENOMEM, "job %s: security record: out of memory", m->job);
    int rc = manta_reg_driver_read(m, d);
    free(d);
    if (rc == 0) return 0;
    if (rc != MANTA_ENOTFOUND) return rc;
    return mn_reg_security_write(m, m->curve, m->curve ? m->keys.public_key : "");
}

/* ---- refusals ---- */

void mn_auth_refused(manta_ctx *m, const char *fmt, ...)
{
    uint64_t n = atomic_fetch_add(&m->auth_refused, 1) + 1;
    if (n > 10 && n % 100) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mn_log("%s %s: refused a connection: %s (%llu refused so far)",
           m->role == MN_ROLE_NODE    ? "node"
           : m->role == MN_ROLE_ACTOR ? "actor"
                                      : "driver",
           m->self, buf, (unsigned long long)n);
}

/* ---- the ZAP handler ---- */

static bool member(const manta_ctx *m, const void *key)
{
    for (size_t i = 0; i < m->nallow_bin; i++)
        if (!memcmp(m->allow_bin[i], key, 32)) return true;
    return false;
}

#define ZAP_FRAMES 7 /* version, id, domain, address, identity, mechanism, key */

/* Answer one ZAP request; -1 when the context is ending. */
static int zap_serve_one(manta_ctx *m, void *sock)
{
    zmq_msg_t f[ZAP_FRAMES + 1];
    int nf = 0;
    for (int more = 1; more;) {
        zmq_msg_t *dst = &f[nf < ZAP_FRAMES ? nf : ZAP_FRAMES];
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, sock, 0) < 0) {
            int err = zmq_errno();
            zmq_msg_close(dst);
            for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
            return err == ETERM ? -1 : 0;
        }
        more = zmq_msg_more(dst);
        if (nf < ZAP_FRAMES)
            nf++;
        else
            zmq_msg_close(dst); /* frames past the key: ignored */
    }
    bool ok =
        nf == ZAP_FRAMES && zmq_msg_size(&f[0]) == 3 && !memcmp(zmq_msg_data(&f[0]), "1.0", 3);
    bool curve = ok && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5);
    bool admit = curve && zmq_msg_size(&f[6]) == 32 && member(m, zmq_msg_data(&f[6]));
    if (ok) {
        const char *status = admit ? "200" : "400";
        const char *text = admit ? "OK" : "not a member of this job";
        zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        zmq_send(sock, status, 3, ZMQ_SNDMORE);
        zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(sock, "", 0, ZMQ_SNDMORE); /* user id */
        zmq_send(sock, "", 0, 0);           /* metadata */
    } else {
        /* Not a ZAP request libzmq would send; REP still owes an answer. */
        zmq_send(sock, "", 0, 0);
    }
    if (!admit) {
        char addr[64] = "?", key[MANTA_KEY_Z85_LEN + 1] = "none";
        if (nf > 3)
            snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&f[3]),
                     (const char *)zmq_msg_data(&f[3]));
        if (curve && zmq_msg_size(&f[6]) == 32) zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        mn_auth_refused(m, "peer %s presented CURVE key %s, not one of job %s's", addr, key,
                        m->job);
    }
    for (int i = 0; i < nf; i++) zmq_msg_close(&f[i]);
    return 0;
}

typedef struct zap_arg {
    manta_ctx *m;
    void *sock;
} zap_arg;

/* Serve ZAP requests until the context ends. After its socket closes the
 * thread touches nothing of the ctx: zmq_ctx_term returns at that point,
 * and a driver's ctx is freed right after. */
static void *zap_thread(void *arg)
{
    zap_arg a = *(zap_arg *)arg;
    free(arg);
    while (zap_serve_one(a.m, a.sock) == 0) {
    }
    zmq_close(a.sock);
    return NULL;
}

/* Bind a handler in ZeroMQ context `zctx` in the calling thread (so that it
 * is in place before the server socket that needs it binds), then hand the
 * socket to a detached thread (pthread_create is the memory barrier ZeroMQ
 * asks for). The thread ends at zmq_ctx_term of that context. With
 * `taken_ok`, a handler already bound there (by an earlier call) is fine. */
static int zap_bind(manta_ctx *m, void *zctx, bool taken_ok)
{
    int rc = 0;
    zap_arg *a = malloc(sizeof *a);
    void *sock = zmq_socket(zctx, ZMQ_REP);
    int zero = 0;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (!a || !sock) {
        rc = mn_fail(MANTA_EZMQ, "ZAP handler: %s", a ? zmq_strerror(zmq_errno()) : "no memory");
    } else if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
               zmq_bind(sock, ZAP_ENDPOINT) != 0) {
        if (!taken_ok || zmq_errno() != EADDRINUSE)
            rc = mn_fail(MANTA_EZMQ, "ZAP handler: bind %s: %s", ZAP_ENDPOINT,
                         zmq_strerror(zmq_errno()));
    } else {
        *a = (zap_arg){m, sock};
        if (pthread_create(&t, &attr, zap_thread, a) != 0)
            rc = mn_fail(MANTA_ESYS, "ZAP handler: cannot start its thread");
        else
            a = NULL, sock = NULL;
    }
    pthread_attr_destroy(&attr);
    free(a);
    if (sock) zmq_close(sock);
    return rc;
}

/* The handler of this process's own context, once. */
static int zap_start(manta_ctx *m)
{
    int rc = 0;
    pthread_mutex_lock(&zap_lock);
    if (!m->zap_started) {
        rc = zap_bind(m, m->zmq, false);
        m->zap_started = rc == 0;
    }
    pthread_mutex_unlock(&zap_lock);
    return rc;
}

/* ---- sockets ---- */

/* CURVE server options (the handler is already bound). */
static int curve_server(manta_ctx *m, void *sock)
{
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, m->keys.secret_key, MANTA_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0)
        return mn_fail(MANTA_EZMQ, "CURVE server options: %s", zmq_strerror(zmq_errno()));
    zmq_setsockopt(sock, OPT_ZAP_ENFORCE_DOMAIN, &one, sizeof one); /* where the build has it */
    return 0;
}

int mn_auth_server(manta_ctx *m, void *sock)
{
    if (!m->curve) return 0;
    int rc = zap_start(m);
    return rc ? rc : curve_server(m, sock);
}

int mn_auth_client(manta_ctx *m, void *sock)
{
    if (!m->curve) return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, m->keys.public_key, MANTA_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, m->keys.public_key, MANTA_KEY_Z85_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, m->keys.secret_key, MANTA_KEY_Z85_LEN + 1) != 0)
        return mn_fail(MANTA_EZMQ, "CURVE client options: %s", zmq_strerror(zmq_errno()));
    return 0;
}

/* ---- sockets of the libraries beside the core ---- */

int manta_curve_on(const manta_ctx *m)
{
    return m && m->curve;
}

int manta_secure_server(manta_ctx *m, void *zctx, void *sock, int64_t max_frame)
{
    if (!m || !zctx || !sock || max_frame <= 0)
        return mn_fail(MANTA_EINVAL, "manta_secure_server: ctx, ZeroMQ context, socket and a "
                                     "positive frame limit needed");
    if (mn_limit_socket(sock, max_frame) != 0)
        return mn_fail(MANTA_EZMQ, "message limits: %s", zmq_strerror(zmq_errno()));
    if (!m->curve) return 0;
    int rc = 0;
    if (zctx == m->zmq) {
        rc = zap_start(m);
    } else {
        /* Another context needs its own handler: ZeroMQ asks ZAP within the
         * server socket's context. Whoever owns that context calls this for
         * each of its server sockets; the first call binds the handler, and
         * a later one finds the address taken (inproc addresses are private
         * to their context, so only an earlier call can have bound it). */
        pthread_mutex_lock(&zap_lock);
        rc = zap_bind(m, zctx, true);
        pthread_mutex_unlock(&zap_lock);
    }
    return rc ? rc : curve_server(m, sock);
}

int manta_secure_client(manta_ctx *m, void *sock)
{
    if (!m || !sock) return mn_fail(MANTA_EINVAL, "manta_secure_client: ctx and socket needed");
    return mn_auth_client(m, sock);
}
