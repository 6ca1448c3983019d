#include "common/error.h"
#include "tests/util/tu_check.h"
#include "tests/util/tu_summary.h"
#include "worker/train/metrics.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <criterion/criterion.h>
#include <math.h>
#include <sys/stat.h>

static char tmpdir[64];
static void setup(void)
{
    strcpy(tmpdir, "/tmp/fsdp-metrics-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}
static void teardown(void) { tu_rm_tree(tmpdir); }
TestSuite(metrics, .init = setup, .fini = teardown);

/* Significant digits of a JSON number's text: digits of the mantissa without leading zeros. */
static int significant_digits(const char *s, size_t n)
{
    int count = 0, started = 0;
    for (size_t i = 0; i < n && s[i] != 'e' && s[i] != 'E'; i++) {
        if (!isdigit((unsigned char)s[i]))
            continue;
        if (s[i] != '0')
            started = 1;
        count += started;
    }
    return count;
}

/* The significant digits of "key": in a line, for checking how the number was printed. */
static int raw_digits(const char *line, const char *key)
{
    size_t n = 0;
    const char *p = tu_json_raw(line, key, &n);
    cr_assert(p, "%s missing in %s", key, line);
    return significant_digits(p, n);
}

Test(metrics, line_format)
{
    char buf[512];
    struct metrics_row r = {.step = 12, .loss = 3.14159265358979, .lr = 6e-4, .grad_norm = 1.25,
                            .tokens_per_s = 12345.678, .has_val = 0};
    int n = metrics_format_line(buf, sizeof buf, &r);
    cr_assert_eq(n, (int)strlen(buf));
    cr_assert_str_eq(buf, "{\"step\":12,\"loss\":3.1415927,\"lr\":0.0006,\"grad_norm\":1.25,"
                          "\"tokens_per_s\":12345.678}\n",
                     "float32 values (TensorBoard's), in the fewest digits that read back to them");
    r.loss = NAN;
    r.has_val = 1;
    r.val_loss = 2.0;
    metrics_format_line(buf, sizeof buf, &r);
    cr_assert(strstr(buf, "\"loss\":null,"), "%s", buf);
    cr_assert(strstr(buf, "\"val_loss\":2}"), "%s", buf);
    cr_assert_eq(metrics_format_line(buf, 20, &r), FSDP_ERANGE);
}

Test(metrics, jsonl_holds_float32_values_and_events_written)
{
    struct metrics *m;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/log", tmpdir); /* created by metrics_open */
    cr_assert_eq(metrics_open(dir, 0, &m), 0, "%s", error_message());
    double losses[4] = {10.987654321987, 5.5, 1.0 / 3.0, 2.718281828459045};
    for (int s = 0; s < 4; s++) {
        struct metrics_row r = {.step = s * 10, .loss = losses[s], .lr = 1e-3 / (s + 1), .grad_norm = 0.5 + s,
                                .tokens_per_s = 1000.0 * (s + 1), .has_val = s == 3, .val_loss = 2.5};
        cr_assert_eq(metrics_log(m, &r), 0, "%s", error_message());
    }
    char events[512];
    snprintf(events, sizeof events, "%s", metrics_events_path(m));
    /* Lines are on disk before close: a crash after metrics_log loses nothing. */
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    size_t len;
    char *text = tu_read_ok(path, &len);
    metrics_close(m);

    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(j, "not JSON: %s", line);
        cr_assert_eq(cJSON_GetObjectItem(j, "step")->valuedouble, lines * 10);
        double loss = cJSON_GetObjectItem(j, "loss")->valuedouble;
        cr_assert((float)loss == (float)losses[lines], "%.17g is not the float32 of %.17g", loss, losses[lines]);
        int digits = raw_digits(line, "loss");
        cr_assert(digits <= 9, "%d digits in %s", digits, line);
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(j, "lr")));
        cr_assert_eq(cJSON_GetObjectItem(j, "grad_norm")->valuedouble, 0.5 + lines);
        cr_assert_eq(cJSON_GetObjectItem(j, "tokens_per_s")->valuedouble, 1000.0 * (lines + 1));
        cJSON *val = cJSON_GetObjectItem(j, "val_loss");
        if (lines == 3)
            cr_assert(val && val->valuedouble == 2.5);
        else
            cr_assert_null(val);
        cJSON_Delete(j);
    }
    /* float32 values in the fewest digits that read back to them. */
    cr_assert_eq(lines, 4);
    free(text);
    text = tu_read_ok(path, NULL);
    cr_assert(strstr(text, "\"loss\":10.987655,"), "%s", text);
    cr_assert(strstr(text, "\"loss\":0.33333334,"), "%s", text);
    cr_assert(strstr(text, "\"tokens_per_s\":1000}"), "%s", text);
    free(text);

    struct stat st;
    cr_assert_eq(stat(events, &st), 0);
    /* version record + 4 events with 4 or 5 scalars each. */
    cr_assert(st.st_size > 4 * 100, "events file has %lld bytes", (long long)st.st_size);

    /* resume appends; a fresh start truncates. */
    cr_assert_eq(metrics_open(dir, 1, &m), 0);
    struct metrics_row r = {.step = 40, .loss = 1, .lr = 1, .grad_norm = 1, .tokens_per_s = 1};
    cr_assert_eq(metrics_log(m, &r), 0);
    metrics_close(m);
    text = tu_read_ok(path, &len);
    int nl = 0;
    for (size_t i = 0; i < len; i++)
        nl += text[i] == '\n';
    cr_assert_eq(nl, 5);
    free(text);
    cr_assert_eq(metrics_open(dir, 0, &m), 0);
    metrics_close(m);
    text = tu_read_ok(path, &len);
    cr_assert_eq(len, 0);
    free(text);
}

Test(metrics, unwritable_dir_is_an_error)
{
    struct metrics *m = (struct metrics *)1;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/no/such/parent", tmpdir);
    cr_assert_eq(metrics_open(dir, 0, &m), FSDP_EIO);
    cr_assert(strstr(error_message(), dir), "%s", error_message());
}
