/* fsdp-prepare-data -j N: the token files and meta.json are the same for any N (meta.json's `seconds`, a
 * timing, aside), on plain text, JSON Lines (cut into many chunks), gzip and zstd inputs, byte-level and with
 * a tokenizer; the first error of the input is the one reported whatever N; bad -j values are refused naming
 * the flag and what is allowed. */
#include "tests/util/tooltest.h"

#include <cjson/cJSON.h>
#include <zlib.h>
#include <zstd.h>

TestSuite(prepare_threads, .init = tt_setup, .fini = tt_teardown);

static char exe[1024], example[1024];

static void paths(void)
{
    tu_build_path(exe, sizeof exe, "worker/fsdp-prepare-data");
    tu_source_path(example, sizeof example, "examples/tokenizer.json");
}

static void put_gzip(const char *path, const char *data, size_t len)
{
    gzFile g = gzopen(path, "wb");
    cr_assert_not_null(g);
    cr_assert_eq(gzwrite(g, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(g), Z_OK);
}

static void put_zstd(const char *path, const char *data, size_t len)
{
    size_t cap = ZSTD_compressBound(len);
    char *z = malloc(cap);
    size_t n = ZSTD_compress(z, cap, data, len, 3);
    cr_assert(!ZSTD_isError(n));
    tu_write_ok(path, z, n);
    free(z);
}

/* JSON Lines of the paragraphs of a few docs pages, repeated to about `bytes`; every `bad_every`-th line (0:
 * none) is not JSON, and one document holds a byte that is not UTF-8. Returns the number of lines and counts
 * the bad ones in *bad. */
static size_t jsonl(const char *path, size_t bytes, size_t bad_every, size_t *bad)
{
    static const char *pages[] = {"docs/data.md", "docs/architecture.md", "docs/launcher.md", "tests/tokenizer/data/mixed.txt"};
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    size_t written = 0, lines = 0;
    *bad = 0;
    for (int pass = 0; written < bytes; pass++) {
        for (int i = 0; i < 4 && written < bytes; i++) {
            char src[1024];
            char *text = tu_read_ok(tu_source_path(src, sizeof src, pages[i]), NULL);
            for (char *p = text; *p && written < bytes;) {
                char *e = strstr(p, "\n\n");
                size_t n = e ? (size_t)(e - p) : strlen(p);
                char *para = strndup(p, n);
                p += n + (e ? 2 : 0);
                lines++;
                if (bad_every && lines % bad_every == 0) {
                    written += (size_t)fprintf(f, "{\"text\": broken %zu\n", lines);
                    (*bad)++;
                    free(para);
                    continue;
                }
                if (lines == 7)
                    para[0] = (char)0xff; /* not UTF-8: --invalid-utf8 replace repairs it */
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "pass", pass);
                cJSON_AddStringToObject(o, "text", para);
                char *line = cJSON_PrintUnformatted(o);
                written += (size_t)fprintf(f, "%s\n", line);
                free(line);
                cJSON_Delete(o);
                free(para);
            }
            free(text);
        }
    }
    fclose(f);
    return lines;
}

/* The corpus: text files, a JSON Lines file of some 1.2 MB (several chunks per thread), a gzip JSON Lines file,
 * a zstd text file, an empty file and a binary one. Returns the JSON Lines lines and bad lines. */
static void corpus(const char *in, size_t *lines, size_t *bad)
{
    char src[1024], p[1024], q[1024];
    cr_assert_eq(mkdir(in, 0755), 0);
    snprintf(p, sizeof p, "%s/a.txt", in);
    tu_copy_ok(tu_source_path(src, sizeof src, "tests/tokenizer/data/mixed.txt"), p);
    snprintf(p, sizeof p, "%s/b.md", in);
    tu_copy_ok(tu_source_path(src, sizeof src, "docs/architecture.md"), p);
    snprintf(p, sizeof p, "%s/c.jsonl", in);
    size_t b1, b2;
    *lines = jsonl(p, 1200000, 97, &b1);
    tt_path(q, sizeof q, "d.jsonl");
    *lines += jsonl(q, 300000, 0, &b2);
    *bad = b1 + b2;
    size_t n;
    char *d = tu_read_ok(q, &n);
    snprintf(p, sizeof p, "%s/d.jsonl.gz", in);
    put_gzip(p, d, n);
    free(d);
    d = tu_read_ok(tu_source_path(src, sizeof src, "docs/data.md"), &n);
    snprintf(p, sizeof p, "%s/e.txt.zst", in);
    put_zstd(p, d, n);
    free(d);
    snprintf(p, sizeof p, "%s/f.txt", in);
    tu_write_ok(p, "", 0);
    snprintf(p, sizeof p, "%s/g.bin", in);
    tu_write_ok(p, "\0\1\2binary", 9);
}

/* meta.json without its timing. */
static char *meta_without_seconds(const char *out)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/meta.json", out);
    char *s = tu_read_ok(p, NULL);
    cJSON *m = cJSON_Parse(s);
    free(s);
    cr_assert_not_null(m, "%s is not JSON", p);
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "inputs"), "seconds");
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = tu_read_ok(a, &na), *y = tu_read_ok(b, &nb);
    cr_assert(na == nb && memcmp(x, y, na) == 0, "%s (%zu bytes) and %s (%zu bytes) differ", a, na, b, nb);
    free(x);
    free(y);
}

static double inputs_num(const char *out, const char *key)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/meta.json", out);
    char *s = tu_read_ok(p, NULL);
    cJSON *m = cJSON_Parse(s);
    free(s);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "inputs"), key);
    cr_assert(cJSON_IsNumber(v), "meta.json inputs.%s", key);
    double d = v->valuedouble;
    cJSON_Delete(m);
    return d;
}

/* Runs the corpus at -j 1, 2 and 3 (with or without the tokenizer) and compares with -j 1. */
static void same_for_any_j(bool tokenizer)
{
    paths();
    char in[256], out1[256];
    size_t lines, bad;
    corpus(tt_path(in, sizeof in, "in"), &lines, &bad);
    for (int j = 1; j <= 3; j++) {
        char out[256], js[8], *log;
        snprintf(out, sizeof out, "%s/out%d", tt_dir, j);
        snprintf(js, sizeof js, "%d", j);
        const char *with_tok[] = {exe, "-j", js, "--tokenizer", example, "--invalid-utf8", "replace", "--skip-bad-lines",
                                  "--chunk-size", "4096", "--val-fraction", "0.1", "-o", out, in, NULL};
        const char *bytes[] = {exe, "--jobs", js, "--skip-bad-lines", "--chunk-size", "4096", "--val-fraction", "0.1",
                               "-o", out, in, NULL};
        cr_assert_eq(tt_run(tokenizer ? with_tok : bytes, &log), 0, "-j %d: %s", j, log);
        free(log);
        /* the counts summed over the chunks */
        cr_assert_eq(inputs_num(out, "bad_lines_skipped"), (double)bad, "-j %d", j);
        cr_assert_eq(inputs_num(out, "documents"), (double)(lines - bad + 3), "-j %d: JSON Lines documents + 3 text files", j);
        cr_assert_eq(inputs_num(out, "text_files"), 5, "-j %d", j);
        cr_assert_eq(inputs_num(out, "binary_skipped"), 1, "-j %d", j);
        cr_assert_eq(inputs_num(out, "utf8_replaced"), tokenizer ? 2 : 0, "-j %d: one bad byte in each JSON Lines file", j);
        if (j == 1) {
            snprintf(out1, sizeof out1, "%s", out);
            continue;
        }
        const char *files[] = {"train.bin", "val.bin"};
        for (int f = 0; f < 2; f++) {
            char a[512], b[512];
            snprintf(a, sizeof a, "%s/%s", out1, files[f]);
            snprintf(b, sizeof b, "%s/%s", out, files[f]);
            assert_same_file(a, b);
        }
        char *m1 = meta_without_seconds(out1), *mj = meta_without_seconds(out);
        cr_assert_str_eq(mj, m1, "meta.json at -j %d", j);
        free(m1);
        free(mj);
    }
}

Test(prepare_threads, tokenizer_output_same_for_any_j, .timeout = 90) { same_for_any_j(true); }
Test(prepare_threads, byte_level_output_same_for_any_j, .timeout = 60) { same_for_any_j(false); }

/* The first error in input order is reported, as on one thread: a bad line in the second chunk of a.jsonl (256 KiB each),
 * another in its third chunk, and a later file that is not valid gzip, read while the earlier chunks are
 * still being encoded. */
Test(prepare_threads, first_error_of_the_input_whatever_j)
{
    paths();
    char in[256], p[512], q[512];
    tt_path(in, sizeof in, "in");
    cr_assert_eq(mkdir(in, 0755), 0);
    snprintf(p, sizeof p, "%s/a.jsonl", in);
    FILE *f = fopen(p, "wb");
    size_t line = 0, first_bad = 0;
    for (size_t bytes = 0; bytes < 1200000;) {
        line++;
        if ((line == 5000 || line == 9000) && !first_bad)
            first_bad = line;
        if (line == 5000 || line == 9000)
            bytes += (size_t)fprintf(f, "not json at all\n");
        else
            bytes += (size_t)fprintf(f, "{\"text\": \"document %zu of a JSON Lines file, long enough to fill chunks\"}\n", line);
    }
    fclose(f);
    cr_assert_gt((double)line, 9000);
    snprintf(q, sizeof q, "%s/b.jsonl.gz", in);
    tu_write_ok(q, "\x1f\x8b\x08\x00garbage", 12);
    char want[600];
    snprintf(want, sizeof want, "%s:%zu: the line is not JSON", p, first_bad);
    for (int j = 1; j <= 3; j++) {
        char js[8], out[256], *log;
        snprintf(js, sizeof js, "%d", j);
        snprintf(out, sizeof out, "%s/out%d", tt_dir, j);
        const char *argv[] = {exe, "-j", js, "--tokenizer", example, "-o", out, in, NULL};
        cr_assert_eq(tt_run(argv, &log), 1, "-j %d: %s", j, log);
        cr_assert(strstr(log, want), "-j %d: want \"%s\" in:\n%s", j, want, log);
        free(log);
        /* without a.jsonl the gzip error is the first */
        remove(p);
        cr_assert_eq(tt_run(argv, &log), 1, "-j %d: %s", j, log);
        cr_assert(strstr(log, "not valid gzip"), "-j %d: %s", j, log);
        free(log);
        /* put a.jsonl back for the next j */
        f = fopen(p, "wb");
        for (size_t i = 1; i <= line; i++)
            fprintf(f, i == 5000 || i == 9000 ? "not json at all\n"
                                              : "{\"text\": \"document %zu of a JSON Lines file, long enough to fill chunks\"}\n", i);
        fclose(f);
    }
}

Test(prepare_threads, bad_j_refused)
{
    paths();
    char in[256], out[256];
    tt_path(in, sizeof in, "a.txt");
    tu_write_ok(in, "some text\n", 10);
    tt_path(out, sizeof out, "out");
    const char *bad[][2] = {{"-j", "0"}, {"-j", "-1"}, {"-j", "257"}, {"-j", "abc"}, {"-j", ""}, {"-j", "2x"},
                            {"--jobs", "1.5"}, {"--jobs=0", NULL}, {"--jobs", "99999999999999999999"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *argv[] = {exe, bad[i][0], bad[i][1] ? bad[i][1] : "--val-fraction=0", "--val-fraction=0", "-o", out,
                              in, NULL};
        char *log;
        cr_assert_eq(tt_run(argv, &log), 2, "%s %s: %s", bad[i][0], bad[i][1] ? bad[i][1] : "", log);
        cr_assert(strstr(log, "-j/--jobs"), "%s: the message names the flag:\n%s", bad[i][0], log);
        cr_assert(strstr(log, "use a whole number of threads from 1 to 256"), "%s: says what is allowed:\n%s", bad[i][0],
                  log);
        free(log);
    }
    /* the bounds themselves are taken */
    const char *lo[] = {exe, "-j", "1", "--val-fraction", "0", "-o", out, in, NULL};
    const char *hi[] = {exe, "--jobs=256", "--val-fraction", "0", "-o", out, in, NULL};
    char *log;
    cr_assert_eq(tt_run(lo, &log), 0, "%s", log);
    free(log);
    cr_assert_eq(tt_run(hi, &log), 0, "%s", log);
    free(log);
}
