#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_error_msg[1024];

const char *error_name(int code)
{
    switch (code) {
    case FSDP_OK: return "success";
    case FSDP_EINVAL: return "invalid argument";
    case FSDP_ENOMEM: return "out of memory";
    case FSDP_EIO: return "input/output error";
    case FSDP_ETIMEDOUT: return "timed out";
    case FSDP_EPROTO: return "protocol error";
    case FSDP_ECLOSED: return "connection closed";
    case FSDP_ENOTFOUND: return "not found";
    case FSDP_EREFUSED: return "refused";
    case FSDP_EEXIST: return "already exists";
    case FSDP_ERANGE: return "out of range";
    case FSDP_EUNSUPPORTED: return "not supported";
    case FSDP_EABORTED: return "aborted";
    default: return "unknown error";
    }
}

int error_set(int code, const char *fmt, ...)
{
    /* Callers wrap a lower error with `error_set(rc, "...: %s", error_message())`: format into a
     * scratch buffer first, since vsnprintf into the buffer it is reading from is undefined. */
    char tmp[sizeof g_error_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(g_error_msg, tmp, sizeof tmp);
    return code;
}

const char *error_message(void) { return g_error_msg; }
void error_clear(void) { g_error_msg[0] = '\0'; }
