/*
 * errors.c - the error table of libmanta_tok and the last-error message.
 */
#include <stdarg.h>
#include <stdio.h>

#include "tok_internal.h"

static _Thread_local char last_msg[1024];

const char *mtok_strerror(int code)
{
    switch (code) {
#define MTOK_X_CASE(name, c, text)                                                                 \
    case c:                                                                                        \
        return text;
        MTOK_ERRORS(MTOK_X_CASE)
#undef MTOK_X_CASE
    }
    return "unknown error code";
}

const char *mtok_last_error(void)
{
    return last_msg;
}

int mtok__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return code;
}
