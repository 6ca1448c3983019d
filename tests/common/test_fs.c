/* common/fs.h's fs_path_format: a path that fits is written whole; one that does not is refused with
 * FSDP_ERANGE and a message naming what it was for and its length, never used cut. */
#include "common/error.h"
#include "common/fs.h"

#include <criterion/criterion.h>
#include <string.h>

Test(fs, path_format_writes_a_path_that_fits)
{
    char p[FSDP_PATH_MAX];
    cr_assert_eq(fs_path_format(p, sizeof p, "log.dir", "%s/%s", "/tmp/run", "metrics.jsonl"), 0);
    cr_assert_str_eq(p, "/tmp/run/metrics.jsonl");
    char small[9];
    cr_assert_eq(fs_path_format(small, sizeof small, "x", "%s", "12345678"), 0, "8 bytes and the NUL fit 9");
}

Test(fs, path_format_refuses_a_path_that_does_not_fit)
{
    static char dir[FSDP_PATH_MAX];
    memset(dir, 'd', sizeof dir - 1);
    char p[FSDP_PATH_MAX];
    cr_assert_eq(fs_path_format(p, sizeof p, "checkpoint.dir", "/%s", dir), FSDP_ERANGE);
    const char *m = error_message();
    cr_assert(strstr(m, "checkpoint.dir: the path \"/ddd") && strstr(m, "is 4096 bytes, over the 4095"), "%s", m);
    char small[8];
    cr_assert_eq(fs_path_format(small, sizeof small, "x", "%s", "12345678"), FSDP_ERANGE);
}
