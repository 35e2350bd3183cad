/*
 * redis_url.c -- the one parser (and printer) of Redis addresses.
 *
 * Every part of Manta names its Redis the same way: "embedded", or
 * redis://[[user]:password@]host[:port][/db], with an IPv6 host in
 * brackets and %XX escapes in the user and password. The driver, the actor
 * processes (which get the URL in MANTA_REDIS), the spec loader and the CLI
 * all go through manta_redis_url_parse(); what they hand on is the parsed
 * manta_redis_addr, or a URL written back by manta_redis_url_format().
 */
#include "internal.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Copy [s, e) into out[cap] decoding %XX. False on a bad escape or overflow. */
static bool pct_decode(const char *s, const char *e, char *out, size_t cap)
{
    size_t o = 0;
    while (s < e) {
        int ch = (unsigned char)*s++;
        if (ch == '%') {
            if (e - s < 2 || hexval(s[0]) < 0 || hexval(s[1]) < 0) return false;
            ch = hexval(s[0]) * 16 + hexval(s[1]);
            s += 2;
            if (ch == 0) return false;
        }
        if (o + 1 >= cap) return false;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return true;
}

/* Parse the user and password before '@' (if any); *p moves past it. */
static const char *parse_userinfo(const char **p, manta_redis_addr *out)
{
    const char *at = strrchr(*p, '@');
    if (!at) return NULL;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    if (colon) {
        if (!pct_decode(*p, colon, out->user, sizeof out->user) ||
            !pct_decode(colon + 1, at, out->password, sizeof out->password))
            return "bad user or password (too long, or a bad %XX escape)";
    } else if (!pct_decode(*p, at, out->user, sizeof out->user)) {
        return "bad user (too long, or a bad %XX escape)";
    }
    *p = at + 1;
    return NULL;
}

static const char *parse_host(const char **pp, manta_redis_addr *out)
{
    const char *p = *pp, *hs = p, *he;
    if (*p == '[') {
        he = strchr(p, ']');
        if (!he) return "unclosed [ in the IPv6 address";
        hs = p + 1;
        p = he + 1;
    } else {
        while (*p && *p != ':' && *p != '/') p++;
        he = p;
    }
    if (he == hs) return "no host";
    if ((size_t)(he - hs) >= sizeof out->host) return "host name too long";
    for (const char *q = hs; q < he; q++)
        if (!isalnum((unsigned char)*q) && !strchr(".-_:", *q)) return "bad host name";
    memcpy(out->host, hs, (size_t)(he - hs));
    out->host[he - hs] = '\0';
    *pp = p;
    return NULL;
}

static const char *parse_port_db(const char *p, manta_redis_addr *out)
{
    if (*p == ':') {
        p++;
        long port = 0;
        if (!isdigit((unsigned char)*p)) return "no port after ':'";
        for (; isdigit((unsigned char)*p); p++) {
            port = port * 10 + (*p - '0');
            if (port > 65535) return "port out of range";
        }
        if (port < 1) return "port out of range";
        out->port = (int)port;
    }
    if (*p == '/') {
        p++;
        long db = 0;
        for (; isdigit((unsigned char)*p); p++) {
            db = db * 10 + (*p - '0');
            if (db > 1000000) return "database number out of range";
        }
        out->db = (int)db;
    }
    if (*p) return "unexpected characters after host:port";
    return NULL;
}

static const char *parse(const char *url, manta_redis_addr *out)
{
    if (!url) return "no address";
    if (!strcmp(url, "embedded")) {
        out->embedded = 1;
        return NULL;
    }
    if (strncmp(url, "redis://", 8) != 0) return "not \"embedded\" and not a redis:// URL";
    const char *p = url + 8, *why;
    if ((why = parse_userinfo(&p, out)) || (why = parse_host(&p, out))) return why;
    return parse_port_db(p, out);
}

int manta_redis_url_parse(const char *url, manta_redis_addr *out, char *why, size_t why_len)
{
    if (why && why_len) why[0] = '\0';
    if (!out) return mn_fail(MANTA_EINVAL, "manta_redis_url_parse: no output");
    memset(out, 0, sizeof *out);
    out->port = MANTA_REDIS_DEFAULT_PORT;
    const char *err = parse(url, out);
    if (!err) return 0;
    if (why && why_len) snprintf(why, why_len, "%s", err);
    memset(out, 0, sizeof *out);
    out->port = MANTA_REDIS_DEFAULT_PORT;
    return mn_fail(MANTA_EINVAL, "redis URL '%s': %s", url ? url : "(null)", err);
}

/* Append s, %XX-escaping what would end the user or password. */
static void put_escaped(char *out, size_t n, size_t *o, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (isalnum(ch) || strchr("-._~!$&'()*+,;=", ch))
            *o += (size_t)snprintf(out + (*o < n ? *o : n), *o < n ? n - *o : 0, "%c", ch);
        else
            *o += (size_t)snprintf(out + (*o < n ? *o : n), *o < n ? n - *o : 0, "%%%02X", ch);
    }
}

int manta_redis_url_format(const manta_redis_addr *a, char *out, size_t n)
{
    if (!a || !out || !n) return mn_fail(MANTA_EINVAL, "manta_redis_url_format: bad arguments");
    size_t o = 0;
    if (a->embedded) {
        o = (size_t)snprintf(out, n, "embedded");
    } else {
        o = (size_t)snprintf(out, n, "redis://");
        if (a->user[0] || a->password[0]) {
            put_escaped(out, n, &o, a->user);
            if (a->password[0]) {
                o += (size_t)snprintf(out + (o < n ? o : n), o < n ? n - o : 0, ":");
                put_escaped(out, n, &o, a->password);
            }
            o += (size_t)snprintf(out + (o < n ? o : n), o < n ? n - o : 0, "@");
        }
        const char *fmt = strchr(a->host, ':') ? "[%s]:%d" : "%s:%d";
        o += (size_t)snprintf(out + (o < n ? o : n), o < n ? n - o : 0, fmt, a->host, a->port);
        if (a->db) o += (size_t)snprintf(out + (o < n ? o : n), o < n ? n - o : 0, "/%d", a->db);
    }
    if (o >= n) {
        out[0] = '\0';
        return mn_fail(MANTA_EINVAL, "redis URL for %s: longer than %zu bytes", a->host, n - 1);
    }
    return 0;
}
