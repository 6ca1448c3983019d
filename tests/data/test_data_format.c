/* worker/data/ on its own: what token_file writes, data_format_detect reads back as the same format, header
 * and tokens in every format (the golden header bytes spelled out here, not taken from the writer); ids
 * that do not fit a uint16 format are refused by name; detect refuses a wrong version, a count that
 * disagrees with the size and an odd-sized headerless file, naming the file; an uncommitted file leaves
 * nothing behind. */
#include "common/error.h"
#include "tests/util/tu_check.h"
#include "worker/data/data_format.h"
#include "worker/data/token_file.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <string.h>

static char dir[64];

static void setup(void) { tu_mkdtemp(dir, sizeof dir, "fsdp-data-format"); }
static void teardown(void) { tu_rm_tree(dir); }

TestSuite(data_format, .init = setup, .fini = teardown);

/* Writes ids (i * mul) & mask for i in [0, n) as NAME in format f and returns the file's bytes. */
static char *write_ids(const char *name, enum data_format f, size_t n, uint32_t mul, uint32_t mask, size_t *len)
{
    struct token_file tf;
    cr_assert_eq(token_file_open(&tf, dir, name, f), 0, "%s", error_message());
    uint32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = ((uint32_t)i * mul) & mask;
    cr_assert_eq(token_file_put(&tf, ids, n), 0, "%s", error_message());
    cr_assert_eq(token_file_commit(&tf), 0, "%s", error_message());
    token_file_cleanup(&tf);
    free(ids);
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return tu_read_ok(path, len);
}

Test(data_format, every_format_round_trips)
{
    const struct {
        enum data_format f;
        int32_t magic, version;
        size_t hdr, tb;
        uint32_t mul;
    } cases[] = {
        {DATA_FORMAT_NANOGPT, 0, 0, 0, 2, 7},
        {DATA_FORMAT_LLMC, 20240520, 1, 1024, 2, 7},
        {DATA_FORMAT_LLMC_U32, 20240801, 7, 1024, 4, 70001},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = 70000, len; /* more than one 64 KiB buffer of the writer */
        uint32_t mask = cases[c].tb == 2 ? 0xffffu : 0xffffffffu;
        char *raw = write_ids("t.bin", cases[c].f, n, cases[c].mul, mask, &len);
        cr_assert_eq(len, cases[c].hdr + n * cases[c].tb, "%s: %zu bytes", data_format_name(cases[c].f), len);
        if (cases[c].hdr) {
            int32_t head[3];
            memcpy(head, raw, sizeof head);
            cr_assert_eq(head[0], cases[c].magic);
            cr_assert_eq(head[1], cases[c].version);
            cr_assert_eq(head[2], (int32_t)n);
        }
        enum data_format f;
        size_t hdr;
        int64_t count;
        cr_assert_eq(data_format_detect(raw, len, "t.bin", &f, &hdr, &count), 0, "%s", error_message());
        cr_assert_eq(f, cases[c].f);
        cr_assert_eq(hdr, cases[c].hdr);
        cr_assert_eq(count, (int64_t)n);
        cr_assert_eq(data_format_token_bytes(f), (int)cases[c].tb);
        for (size_t i = 0; i < n; i += 997) {
            uint32_t v = 0;
            memcpy(&v, raw + hdr + i * cases[c].tb, cases[c].tb);
            cr_assert_eq(v, ((uint32_t)i * cases[c].mul) & mask, "token %zu", i);
        }
        free(raw);
    }
}

Test(data_format, a_uint16_format_refuses_a_large_id_by_name)
{
    struct token_file tf;
    cr_assert_eq(token_file_open(&tf, dir, "big.bin", DATA_FORMAT_LLMC), 0, "%s", error_message());
    uint32_t ids[] = {1, 65535, 65536, 2};
    cr_assert_eq(token_file_put(&tf, ids, 4), FSDP_ERANGE);
    cr_assert(strstr(error_message(), "token id 65536") && strstr(error_message(), "big.bin") &&
              strstr(error_message(), "llm.c"), "%s", error_message());
    token_file_cleanup(&tf); /* not committed: the temporary file goes too */
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    cr_assert_eq(entries, 0, "an uncommitted token file left something in %s", dir);
}

Test(data_format, detect_refuses_inconsistent_files_naming_them)
{
    int32_t file[256 + 4] = {20240520, 2, 8};
    enum data_format f;
    size_t hdr;
    int64_t count;
    cr_assert_eq(data_format_detect(file, sizeof file, "v.bin", &f, &hdr, &count), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "v.bin") && strstr(error_message(), "version 2, expected 1"), "%s",
              error_message());
    file[1] = 1; /* 8 tokens claimed, 16 bytes = 8 uint16 held: consistent */
    cr_assert_eq(data_format_detect(file, sizeof file, "v.bin", &f, &hdr, &count), 0, "%s", error_message());
    cr_assert_eq(count, 8);
    file[2] = 9;
    cr_assert_eq(data_format_detect(file, sizeof file, "c.bin", &f, &hdr, &count), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "c.bin") && strstr(error_message(), "truncated or corrupt"), "%s",
              error_message());
    cr_assert_eq(data_format_detect("abc", 3, "odd.bin", &f, &hdr, &count), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "odd.bin") && strstr(error_message(), "odd size"), "%s", error_message());
    cr_assert_eq(data_format_detect("abcd", 4, "n.bin", &f, &hdr, &count), 0);
    cr_assert_eq(f, DATA_FORMAT_NANOGPT);
    cr_assert_eq(count, 2);
}
