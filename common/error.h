/* Error codes returned by every library function (0 = success, negative = failure) and a per-thread
 * message that says what exactly went wrong, so a caller can report it without guessing. */
#ifndef FSDP_COMMON_ERROR_H
#define FSDP_COMMON_ERROR_H

enum fsdp_error {
    FSDP_OK = 0,
    FSDP_EINVAL = -1,    /* bad argument, config value or input file */
    FSDP_ENOMEM = -2,    /* allocation failed */
    FSDP_EIO = -3,       /* read/write/socket error */
    FSDP_ETIMEDOUT = -4, /* a wait ran out of time */
    FSDP_EPROTO = -5,    /* peer spoke a different or malformed protocol */
    FSDP_ECLOSED = -6,   /* peer closed the connection or died */
    FSDP_ENOTFOUND = -7, /* key, file or program not found */
    FSDP_EREFUSED = -8,  /* peer refused us (token, version, duplicate rank) */
    FSDP_EEXIST = -9,    /* already exists / already in use */
    FSDP_ERANGE = -10,   /* value or size outside the allowed range */
    FSDP_EUNSUPPORTED = -11,
    FSDP_EABORTED = -12, /* another rank or node failed and the job is being torn down */
};

/* Short name of a code ("timed out"); never NULL. */
const char *error_name(int code);

/* Records a formatted message for this thread and returns code, so callers can write
 * `return error_set(FSDP_EINVAL, "...", ...);`. */
int error_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message set on this thread ("" if none). */
const char *error_message(void);
void error_clear(void);

/* The one way to pass an error up. A call succeeds with 0 (a few return a non-negative result, such as
 * an index) and fails with a negative enum fsdp_error whose message it has already set.
 * - FSDP_TRY(call): when nothing needs undoing, return the call's code on failure.
 * - FSDP_TRY_GOTO(call, rc, label): when something does (memory, a handle, a buffer back to its pool) or
 *   a step must run whatever happened (a collective every rank enters, sharing the error with the other
 *   ranks), store the code in rc and jump to the function's one cleanup label, which ends in `return rc`.
 *   rc is written only on failure, so it keeps the first error. An error found in the function itself
 *   takes the same path: `rc = error_set(...); goto label;`.
 * In .cu files (C++) a goto must not jump over an initialised declaration: use FSDP_TRY there. */
#define FSDP_TRY(call)                                                                                    \
    do {                                                                                                  \
        int fsdp_try_rc_ = (call);                                                                        \
        if (fsdp_try_rc_ < 0)                                                                             \
            return fsdp_try_rc_;                                                                          \
    } while (0)
#define FSDP_TRY_GOTO(call, rc, label)                                                                    \
    do {                                                                                                  \
        int fsdp_try_rc_ = (call);                                                                        \
        if (fsdp_try_rc_ < 0) {                                                                           \
            (rc) = fsdp_try_rc_;                                                                          \
            goto label;                                                                                   \
        }                                                                                                 \
    } while (0)

#endif
