/*
 * keys.c -- `manta keys`: make and show the CURVE key files of jobs.
 *
 *   manta keys new FILE        a new key pair in FILE (mode 0600; never overwrites)
 *   manta keys show FILE       check FILE; print its public key and allow-list
 *   manta keys allow FILE KEY  add a client's public key to FILE's allow-list
 *
 * A tcp job whose machines share one FILE (MANTA_KEYS=FILE for `manta run`
 * and `manta node`) admits only processes that hold it, or whose own public
 * key is on its allow-list. The secret key is never printed.
 */
#include "manta_cli.h"

#include <stdio.h>
#include <string.h>

static const char *keys_help =
    "manta keys new FILE | show FILE | allow FILE PUBLIC_KEY\n"
    "  new:   writes a new CURVE key pair (zmq_z85) to FILE, mode 0600; an existing FILE\n"
    "         is never overwritten.\n"
    "  show:  checks FILE (owned by you, mode 0600, not a link, a matching pair) and\n"
    "         prints its public key and allow-list; never the secret key.\n"
    "  allow: adds a client's public key to FILE's allow-list (FILE is replaced whole).\n"
    "  Give FILE to a job with MANTA_KEYS=FILE on every machine (`manta run`, `manta\n"
    "  node`). Without it, a tcp job makes its own pair in RUN_DIR/curve.key. The\n"
    "  spec-free setting MANTA_CURVE=auto|on|off says whether CURVE is used (auto: tcp).\n";

static int fail(const char *what)
{
    fprintf(stderr, "manta keys %s: %s\n", what, manta_last_error());
    return MANTA_EXIT_RUNTIME;
}

static int keys_show(const char *path)
{
    manta_keys k;
    if (manta_keys_read(path, &k) != 0) return fail("show");
    printf("public-key = %s\n", k.public_key);
    for (size_t i = 0; i < k.nallow; i++) printf("allow = %s\n", k.allow[i]);
    return MANTA_EXIT_OK;
}

static int keys_new(const char *path)
{
    manta_keys k;
    if (manta_keys_generate(&k) != 0 || manta_keys_write(path, &k, 0) != 0) return fail("new");
    fprintf(stderr, "manta keys: wrote a new key pair to %s (mode 0600)\n", path);
    printf("public-key = %s\n", k.public_key);
    return MANTA_EXIT_OK;
}

static int keys_allow(const char *path, const char *key)
{
    if (!manta_key_valid(key)) {
        fprintf(stderr, "manta keys allow: '%s' is not a 40-character Z85 public key\n", key);
        return MANTA_EXIT_USAGE;
    }
    manta_keys k;
    if (manta_keys_read(path, &k) != 0) return fail("allow");
    for (size_t i = 0; i < k.nallow; i++)
        if (!strcmp(k.allow[i], key)) return keys_show(path); /* already there */
    if (k.nallow == MANTA_KEYS_MAX_ALLOW) {
        fprintf(stderr, "manta keys allow: %s already allows %d keys, the most it may\n", path,
                MANTA_KEYS_MAX_ALLOW);
        return MANTA_EXIT_USAGE;
    }
    memcpy(k.allow[k.nallow++], key, MANTA_KEY_Z85_LEN + 1);
    if (manta_keys_write(path, &k, 1) != 0) return fail("allow");
    return keys_show(path);
}

int manta_cli_keys(int argc, char **argv)
{
    const char *verb = argc > 1 ? argv[1] : "";
    if (!strcmp(verb, "--help") || !strcmp(verb, "-h") || !strcmp(verb, "help")) {
        fputs(keys_help, stdout);
        return MANTA_EXIT_OK;
    }
    if (argc == 3 && !strcmp(verb, "new")) return keys_new(argv[2]);
    if (argc == 3 && !strcmp(verb, "show")) return keys_show(argv[2]);
    if (argc == 4 && !strcmp(verb, "allow")) return keys_allow(argv[2], argv[3]);
    fputs(keys_help, stderr);
    return MANTA_EXIT_USAGE;
}
