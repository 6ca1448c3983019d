#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

/* Runs fn with stderr redirected to a temp file and returns what it wrote. */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/fsdp_logXXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    static char buf[4096];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n < 0 ? 0 : n] = '\0';
    close(fd);
    unlink(path);
    return buf;
}

static void emit_ranked(void)
{
    log_init("t");
    log_set_level(LOG_INFO);
    log_set_rank(3);
    log_debug("hidden %d", 1);
    log_warn("shown %d", 2);
}

Test(log, rank_prefix_and_level_filter)
{
    char *out = capture_stderr(emit_ranked);
    cr_assert(strstr(out, "[rank 3] W: shown 2\n") != NULL, "got: %s", out);
    cr_assert(strstr(out, "hidden") == NULL, "debug line leaked: %s", out);
}

static void emit_env_level(void)
{
    setenv("FSDP_LOG_LEVEL", "error", 1);
    log_init("t");
    log_set_rank(-1);
    log_warn("warn-line");
    log_error("error-line");
}

Test(log, level_from_environment)
{
    char *out = capture_stderr(emit_env_level);
    cr_assert(strstr(out, "warn-line") == NULL, "got: %s", out);
    cr_assert(strstr(out, "[t] E: error-line") != NULL, "got: %s", out);
}

static void emit_errors(void)
{
    log_init("t");
    log_set_level(LOG_INFO);
    log_set_rank(1);
    log_error("comm: all_gather #%d failed", 7);
    log_warn("a warning after it");
}

/* fsdp-worker skips its final error line when the latest error printed said the same (a collective's
 * progress thread printed it when it happened); only the message part counts, and warnings do not. */
Test(log, latest_error_text_is_remembered)
{
    char *out = capture_stderr(emit_errors);
    cr_assert(strstr(out, "[rank 1] E: comm: all_gather #7 failed\n") != NULL, "got: %s", out);
    cr_assert(log_error_is_last("comm: all_gather #7 failed"));
    cr_assert_not(log_error_is_last("comm: all_gather #7 failed "));
    cr_assert_not(log_error_is_last("a warning after it"));
    cr_assert_not(log_error_is_last(NULL));
}

Test(log, parse_level)
{
    enum log_level l;
    cr_assert_eq(log_parse_level("WARNING", &l), 0);
    cr_assert_eq(l, LOG_WARN);
    cr_assert_eq(log_parse_level("loud", &l), -1);
}

Test(log, elapsed_is_monotonic)
{
    double a = log_elapsed_s();
    usleep(2000);
    double b = log_elapsed_s();
    cr_assert(b > a);
}

Test(error, set_returns_code_and_keeps_message)
{
    int rc = error_set(FSDP_ETIMEDOUT, "waited %d s for key '%s'", 5, "x");
    cr_assert_eq(rc, FSDP_ETIMEDOUT);
    cr_assert_str_eq(error_message(), "waited 5 s for key 'x'");
    cr_assert_str_eq(error_name(FSDP_ETIMEDOUT), "timed out");
    error_clear();
    cr_assert_str_eq(error_message(), "");
}
