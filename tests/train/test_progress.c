#include "worker/train/progress.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(progress, format_fields_and_eta)
{
    char buf[256];
    struct progress_stats s = {.step = 9, .loss = 2.345678, .lr = 6e-4, .grad_norm = 0.875,
                               .tokens_per_s = 12345.4, .mfu = 0.4123, .mem_bytes = 3.5 * 1024 * 1024 * 1024};
    /* 10 steps in 20 s -> 2 s/step; 90 steps left -> 180 s. */
    progress_format(buf, sizeof buf, &s, 0, 100, 20.0);
    cr_assert_str_eq(buf, "step 10/100 | loss 2.3457 | lr 6.000e-04 | grad norm 0.875 | 12345 tok/s | mfu 41.2% | "
                          "mem 3.50GiB | eta 3m00s");
    /* Resumed at step 50: 5 steps done in 10 s, 2 s/step for the remaining 45 steps. */
    s.step = 54;
    s.mfu = -1;
    s.mem_bytes = 512.0 * 1024 * 1024;
    progress_format(buf, sizeof buf, &s, 50, 100, 10.0);
    cr_assert(strstr(buf, "step 55/100 |"), "%s", buf);
    cr_assert(strstr(buf, "mfu - | mem 512MiB | eta 1m30s"), "%s", buf);
    s.step = 0;
    /* 99 steps left at 7300 s each = 722700 s. */
    progress_format(buf, sizeof buf, &s, 0, 100, 7300.0);
    cr_assert(strstr(buf, "eta 200h45m"), "%s", buf);
}

static char *run_updates(int tty, int64_t total, int64_t interval)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    struct progress p;
    progress_init(&p, f, tty, 0, total, interval);
    for (int64_t step = 0; step < total; step++) {
        struct progress_stats s = {.step = step, .loss = 1, .lr = 1, .grad_norm = 1, .tokens_per_s = 1,
                                   .mfu = -1, .mem_bytes = -1};
        progress_update(&p, &s);
    }
    progress_finish(&p);
    fclose(f);
    return text;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

Test(progress, pipe_prints_one_line_per_interval)
{
    char *text = run_updates(0, 25, 10);
    /* steps 10, 20 and the last one (25) */
    cr_assert_eq(count(text, "\n"), 3, "%s", text);
    cr_assert_eq(count(text, "\r"), 0);
    cr_assert(strstr(text, "step 10/25"));
    cr_assert(strstr(text, "step 20/25"));
    cr_assert(strstr(text, "step 25/25"));
    free(text);
}

Test(progress, terminal_redraws_in_place)
{
    char *text = run_updates(1, 5, 10);
    cr_assert_eq(count(text, "\r"), 5, "%s", text);
    cr_assert_eq(count(text, "\033[K"), 5);
    cr_assert_eq(count(text, "\n"), 1); /* only progress_finish ends the line */
    cr_assert(text[strlen(text) - 1] == '\n');
    free(text);
}
