/*
 * errors.c - the one error table of the kernels library, the thread-local
 * message behind mk_last_error, and the loud stop for broken invariants.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "mk_internal.h"

#define MK_ERRORS(X)                                                                               \
    X(MK_OK, "ok")                                                                                 \
    X(MK_ERR_ARG, "invalid argument")                                                              \
    X(MK_ERR_NOMEM, "out of memory")                                                               \
    X(MK_ERR_IO, "i/o error")                                                                      \
    X(MK_ERR_FORMAT, "malformed checkpoint")                                                       \
    X(MK_ERR_MISSING, "missing tensor")                                                            \
    X(MK_ERR_SHAPE, "shape mismatch")                                                              \
    X(MK_ERR_DTYPE, "unsupported dtype")                                                           \
    X(MK_ERR_TRUNCATED, "truncated file")                                                          \
    X(MK_ERR_FULL, "context full")                                                                 \
    X(MK_ERR_STATE, "call out of order")                                                           \
    X(MK_ERR_DEVICE, "device error")                                                               \
    X(MK_ERR_UNSUPPORTED, "unsupported model")

const char *mk_strerror(int code)
{
    switch (code) {
#define X(c, s)                                                                                    \
    case c:                                                                                        \
        return s;
        MK_ERRORS(X)
#undef X
    }
    return "unknown error";
}

static _Thread_local char last_error[512];

const char *mk_last_error(void)
{
    return last_error;
}

int mk__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void mk__die(const char *file, int line, const char *msg, const char *hint)
{
    fprintf(stderr, "[manta kernels] %s:%d: %s\n", file, line, msg);
    if (hint) fprintf(stderr, "---> HINT: %s\n", hint);
    abort();
}
