#include "common/error.h"
#include "tests/util/tu_check.h"
#include "worker/train/data.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <zlib.h>
#include <zstd.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char tmpdir[64];
static void setup(void)
{
    strcpy(tmpdir, "/tmp/fsdp-prep-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}
static void teardown(void) { tu_rm_tree(tmpdir); }
TestSuite(prepare_data, .init = setup, .fini = teardown);

/* Runs fsdp-prepare-data with argv (NULL-terminated, without argv[0]); returns the exit code and the
 * combined stdout+stderr in out. */
static int run_prepare_env(char *out, size_t cap, const char **args, const char *const *env);
static int run_prepare(char *out, size_t cap, const char **args) { return run_prepare_env(out, cap, args, NULL); }

/* The same with env ("NAME=value" pairs, NULL-terminated; may be NULL) added in the child. */
static int run_prepare_env(char *out, size_t cap, const char **args, const char *const *env)
{
    const char *root = getenv("FSDP_BUILD_ROOT");
    cr_assert(root, "FSDP_BUILD_ROOT is not set (run through meson test)");
    char exe[512];
    snprintf(exe, sizeof exe, "%s/worker/fsdp-prepare-data", root);
    char outpath[256];
    snprintf(outpath, sizeof outpath, "%s/.out.txt", tmpdir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        const char *argv[32] = {exe};
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(exe, (char **)argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    char *text = tu_read_ok(outpath, NULL);
    snprintf(out, cap, "%s", text);
    free(text);
    unlink(outpath);
    cr_assert(WIFEXITED(st), "killed by a signal: %s", out);
    return WEXITSTATUS(st);
}

static void mk(const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    cr_assert_eq(mkdir(p, 0755), 0);
}

static char *put(const char *rel, size_t len, int seed)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    char *data = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        data[i] = (char)(' ' + (i * 31 + (size_t)seed * 7) % 95);
    if (len)
        data[len - 1] = '\n';
    tu_write_ok(p, data, len);
    data[len] = 0;
    return data;
}

static cJSON *read_json(const char *path)
{
    char *text = tu_read_ok(path, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

static uint16_t *read_tokens(const char *path, int llmc, int64_t *n)
{
    size_t len;
    char *raw = tu_read_ok(path, &len);
    size_t hdr = llmc ? 1024 : 0;
    if (llmc) {
        int32_t head[3];
        memcpy(head, raw, sizeof head);
        cr_assert_eq(head[0], DATA_LLMC_MAGIC);
        cr_assert_eq(head[1], DATA_LLMC_VERSION);
        cr_assert_eq((size_t)head[2] * 2, len - hdr);
    }
    *n = (int64_t)(len - hdr) / 2;
    uint16_t *t = malloc(len - hdr + 2);
    memcpy(t, raw + hdr, len - hdr);
    free(raw);
    return t;
}

static void round_trip(int llmc)
{
    mk("corpus");
    mk("corpus/sub");
    mk("corpus/.git");
    /* Sorted path order: a.txt, b.md, sub/c.c; the hidden and binary files must be left out. */
    char *a = put("corpus/a.txt", 5000, 1);
    char *b = put("corpus/b.md", 3000, 2);
    char *c = put("corpus/sub/c.c", 12000, 3);
    free(put("corpus/.git/objects", 4000, 4));
    char p[256];
    snprintf(p, sizeof p, "%s/corpus/sub/image.bin", tmpdir);
    unsigned char bin[300] = {0x89, 'P', 'N', 'G', 0, 0, 1};
    tu_write_ok(p, bin, sizeof bin);

    char corpus[128], outdir[128], out[4096];
    snprintf(corpus, sizeof corpus, "%s/corpus", tmpdir);
    snprintf(outdir, sizeof outdir, "%s/out", tmpdir);
    const char *args[] = {"--out", outdir, "--chunk-size", "1000", "--val-fraction", "0.25",
                          "--format", llmc ? "llmc" : "nanogpt", corpus, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, args), 0, "%s", out);
    cr_assert(strstr(out, "3 text files (1 binary skipped)"), "%s", out);

    char tp[256], vp[256];
    snprintf(tp, sizeof tp, "%s/train.bin", outdir);
    snprintf(vp, sizeof vp, "%s/val.bin", outdir);
    int64_t nt, nv;
    uint16_t *train = read_tokens(tp, llmc, &nt), *val = read_tokens(vp, llmc, &nv);
    cr_assert_eq(nt + nv, 20000);
    /* Split within one chunk of 25%. */
    cr_assert(nv >= 5000 - 1000 && nv <= 5000 + 1000, "val %lld tokens", (long long)nv);
    char counts[64];
    snprintf(counts, sizeof counts, "train.bin: %lld tokens", (long long)nt);
    cr_assert(strstr(out, counts), "%s", out);

    /* Re-interleave: walking the corpus in 1000-byte chunks, each chunk is the next piece of train or of
     * val, in order, byte for byte. */
    char *all = malloc(20001);
    snprintf(all, 20001, "%s%s%s", a, b, c);
    int64_t it = 0, iv = 0;
    const char *files[3] = {a, b, c};
    size_t base = 0;
    for (int f = 0; f < 3; f++) {
        size_t flen = strlen(files[f]);
        for (size_t off = 0; off < flen; off += 1000) {
            size_t n = flen - off < 1000 ? flen - off : 1000;
            const char *src = all + base + off;
            int in_train = it + (int64_t)n <= nt;
            for (size_t k = 0; in_train && k < n; k++)
                in_train = train[it + (int64_t)k] == (uint8_t)src[k];
            if (in_train) {
                it += (int64_t)n;
                continue;
            }
            for (size_t k = 0; k < n; k++)
                cr_assert_eq(val[iv + (int64_t)k], (uint8_t)src[k], "chunk at %zu of file %d", off, f);
            iv += (int64_t)n;
        }
        base += flen;
    }
    cr_assert_eq(it, nt);
    cr_assert_eq(iv, nv);

    /* The outputs open as token data of the declared format with vocab 256. */
    struct data_options o = {.block_size = 64, .vocab_size = 256, .batch_rows = 2, .order = DATA_ORDER_SEQUENTIAL};
    struct data_file *d;
    cr_assert_eq(data_open(tp, &o, &d), 0, "%s", error_message());
    cr_assert_eq(data_format_of(d), llmc ? DATA_FORMAT_LLMC : DATA_FORMAT_NANOGPT);
    data_close(d);

    /* Deterministic: a second run gives identical files; no temp files are left behind. */
    cr_assert_eq(run_prepare(out, sizeof out, args), 0, "%s", out);
    int64_t nt2;
    uint16_t *train2 = read_tokens(tp, llmc, &nt2);
    cr_assert_eq(nt2, nt);
    cr_assert_arr_eq(train2, train, (size_t)nt * 2);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s/.train.bin.", outdir);
    struct stat st;
    cr_assert_neq(stat(cmd, &st), 0);
    free(train2);
    free(train);
    free(val);
    free(all);
    free(a);
    free(b);
    free(c);
}

Test(prepare_data, round_trip_nanogpt) { round_trip(0); }
Test(prepare_data, round_trip_llmc) { round_trip(1); }

Test(prepare_data, errors)
{
    char out[4096], p[256];
    const char *none[] = {NULL};
    cr_assert_eq(run_prepare(out, sizeof out, none), 2);
    cr_assert(strstr(out, "no input files"), "%s", out);

    mk("empty");
    snprintf(p, sizeof p, "%s/empty", tmpdir);
    const char *empty[] = {"--out", tmpdir, p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, empty), 1);
    cr_assert(strstr(out, "no input files found"), "%s", out);

    snprintf(p, sizeof p, "%s/missing", tmpdir);
    const char *missing[] = {"--out", tmpdir, p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, missing), 1);
    cr_assert(strstr(out, p), "%s", out);

    free(put("t.txt", 10000, 1));
    snprintf(p, sizeof p, "%s/t.txt", tmpdir);
    char ro[256];
    snprintf(ro, sizeof ro, "%s/t.txt/sub", tmpdir); /* a path under a regular file is never writable */
    const char *unwritable[] = {"--out", ro, p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, unwritable), 1);
    cr_assert(strstr(out, "cannot create"), "%s", out);

    const char *badfrac[] = {"--val-fraction", "1.5", p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, badfrac), 2);
    cr_assert(strstr(out, "--val-fraction"), "%s", out);
}

/* gzip (zlib's deflate in a gzip wrapper) and zstd copies of a buffer, made here with the libraries. */
static void put_gzip(const char *rel, const char *data, size_t len)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    gzFile g = gzopen(p, "wb");
    cr_assert_not_null(g);
    cr_assert_eq(gzwrite(g, data, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(g), Z_OK);
}

static void put_zstd(const char *rel, const char *data, size_t len)
{
    size_t cap = ZSTD_compressBound(len);
    char *z = malloc(cap);
    size_t n = ZSTD_compress(z, cap, data, len, 3);
    cr_assert(!ZSTD_isError(n));
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    tu_write_ok(p, z, n);
    free(z);
}

/* JSON Lines, plain, gzip and zstd: the documents of the "text" field (escapes decoded), in order; with a
 * tokenizer each document's ids then the end-of-text token, exactly as the same documents in text files. */
Test(prepare_data, json_lines_plain_gzip_zstd)
{
    const char *jsonl = "{\"text\": \"first \\u00e9t\\u00e9 doc\\n\", \"id\": 1}\n"
                        "\n"
                        "{\"id\": 2, \"text\": \"second \\\"doc\\\"\"}\r\n"
                        "{\"text\": \"third\"}";
    const char *docs[] = {"first \xc3\xa9t\xc3\xa9 doc\n", "second \"doc\"", "third"};
    char p[256], want[256] = "";
    for (int i = 0; i < 3; i++)
        strcat(want, docs[i]);
    snprintf(p, sizeof p, "%s/c.jsonl", tmpdir);
    tu_write_ok(p, jsonl, strlen(jsonl));
    put_gzip("c.jsonl.gz", jsonl, strlen(jsonl));
    put_zstd("c.jsonl.zst", jsonl, strlen(jsonl));
    mk("docs");
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/docs/%d.txt", tmpdir, i);
        tu_write_ok(p, docs[i], strlen(docs[i]));
    }
    const char *names[] = {"c.jsonl", "c.jsonl.gz", "c.jsonl.zst"};
    char out[8192], in[256], dir[256], bin[300], meta[300];
    for (int i = 0; i < 3; i++) {
        snprintf(in, sizeof in, "%s/%s", tmpdir, names[i]);
        snprintf(dir, sizeof dir, "%s/o%d", tmpdir, i);
        const char *args[] = {"--out", dir, "--val-fraction", "0", in, NULL};
        cr_assert_eq(run_prepare(out, sizeof out, args), 0, "%s: %s", names[i], out);
        snprintf(bin, sizeof bin, "%s/train.bin", dir);
        int64_t n;
        uint16_t *t = read_tokens(bin, 0, &n);
        cr_assert_eq(n, (int64_t)strlen(want), "%s", names[i]);
        for (int64_t k = 0; k < n; k++)
            cr_assert_eq(t[k], (unsigned char)want[k], "%s: token %lld", names[i], (long long)k);
        free(t);
        snprintf(meta, sizeof meta, "%s/meta.json", dir);
        cJSON *m = read_json(meta);
        cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "inputs"), "documents")->valueint, 3, "%s", names[i]);
        cJSON_Delete(m);
    }
    /* with a tokenizer: the ids of three text files, each followed by the end-of-text token */
    const char *src = getenv("FSDP_SOURCE_ROOT");
    char tok[512], gz[256], docsdir[256];
    snprintf(tok, sizeof tok, "%s/examples/tokenizer.json", src);
    snprintf(gz, sizeof gz, "%s/c.jsonl.gz", tmpdir);
    snprintf(docsdir, sizeof docsdir, "%s/docs", tmpdir);
    char da[256], db[256], ba[300], bb[300];
    snprintf(da, sizeof da, "%s/ta", tmpdir);
    snprintf(db, sizeof db, "%s/tb", tmpdir);
    const char *a1[] = {"--out", da, "--val-fraction", "0", "--tokenizer", tok, gz, NULL};
    const char *a2[] = {"--out", db, "--val-fraction", "0", "--tokenizer", tok, docsdir, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, a1), 0, "%s", out);
    cr_assert_eq(run_prepare(out, sizeof out, a2), 0, "%s", out);
    snprintf(ba, sizeof ba, "%s/train.bin", da);
    snprintf(bb, sizeof bb, "%s/train.bin", db);
    size_t la, lb;
    char *xa = tu_read_ok(ba, &la), *xb = tu_read_ok(bb, &lb);
    cr_assert(la == lb && memcmp(xa, xb, la) == 0, "JSON Lines ids differ from the same documents as files");
    free(xa);
    free(xb);
}

/* A line that is not JSON, or lacks the field, names file:line; --skip-bad-lines counts it instead;
 * --text-field reads another field. */
Test(prepare_data, json_lines_bad_lines_and_field)
{
    const char *jsonl = "{\"text\": \"aaaa\", \"body\": \"bb\"}\nnot json\n{\"other\": 1}\n{\"text\": \"cccc\"}\n";
    char p[256], dir[256], out[8192];
    snprintf(p, sizeof p, "%s/d.json", tmpdir);
    tu_write_ok(p, jsonl, strlen(jsonl));
    snprintf(dir, sizeof dir, "%s/o", tmpdir);
    const char *strict[] = {"--out", dir, "--val-fraction", "0", p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, strict), 1, "%s", out);
    char where[300];
    snprintf(where, sizeof where, "%s:2: the line is not JSON", p);
    cr_assert(strstr(out, where), "%s", out);
    const char *skip[] = {"--out", dir, "--val-fraction", "0", "--skip-bad-lines", p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, skip), 0, "%s", out);
    char meta[300];
    snprintf(meta, sizeof meta, "%s/meta.json", dir);
    cJSON *m = read_json(meta);
    const cJSON *in = cJSON_GetObjectItem(m, "inputs");
    cr_assert_eq(cJSON_GetObjectItem(in, "documents")->valueint, 2);
    cr_assert_eq(cJSON_GetObjectItem(in, "bad_lines_skipped")->valueint, 2);
    cJSON_Delete(m);
    const char *field[] = {"--out", dir, "--val-fraction", "0", "--text-field", "body", "--skip-bad-lines", p, NULL};
    cr_assert_eq(run_prepare(out, sizeof out, field), 0, "%s", out);
    char bin[300];
    snprintf(bin, sizeof bin, "%s/train.bin", dir);
    int64_t n;
    free(read_tokens(bin, 0, &n));
    cr_assert_eq(n, 2, "the body field's document");
}

/* Issue 28: a file that grows while it is read. Only the bytes it held when it was opened are used, and a
 * warning says so. tests/tools/grow_on_read.c, preloaded, appends to the input after the program opened it
 * and before its first read returns (a real writer would race a read of microseconds): a text file gets a
 * line, a gzip file a whole second gzip member, which a reader that reads to the end would decompress too. */
Test(prepare_data, input_that_grows_while_read_gives_its_size_at_open)
{
    const char *module = getenv("FSDP_TEST_GROW_MODULE");
    if (!module || !*module)
        cr_skip_test("FSDP_TEST_GROW_MODULE is not set (run through meson test)");
    const char *extra = "APPENDED WHILE READ\n";
    char with_txt[256], with_gz[256], marker_gz[64], p[512], out[8192];
    snprintf(with_txt, sizeof with_txt, "%s/with.txt", tmpdir);
    tu_write_ok(with_txt, extra, strlen(extra));
    snprintf(marker_gz, sizeof marker_gz, "with.gz");
    put_gzip(marker_gz, extra, strlen(extra));
    snprintf(with_gz, sizeof with_gz, "%s/with.gz", tmpdir);
    const char *preload = getenv("LD_PRELOAD"), *asan = getenv("ASAN_OPTIONS");
    char env_preload[1024], env_asan[1024], env_file[300], env_with[300];
    snprintf(env_preload, sizeof env_preload, "LD_PRELOAD=%s%s%s", preload ? preload : "", preload ? ":" : "", module);
    /* the sanitizer build: the preloaded module comes before ASan's runtime, which is fine for this one */
    snprintf(env_asan, sizeof env_asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0", asan ? asan : "", asan ? ":" : "");
    for (int gz = 0; gz < 2; gz++) {
        mk(gz ? "in_gz" : "in_txt");
        char *orig = put(gz ? "orig.txt" : "in_txt/a.txt", 200000, 3);
        if (gz)
            put_gzip("in_gz/a.txt.gz", orig, 200000);
        char input[256], outdir[256];
        snprintf(input, sizeof input, "%s/%s", tmpdir, gz ? "in_gz/a.txt.gz" : "in_txt/a.txt");
        snprintf(outdir, sizeof outdir, "%s/out%d", tmpdir, gz);
        struct stat before, after;
        cr_assert_eq(stat(input, &before), 0);
        snprintf(env_file, sizeof env_file, "FSDP_TEST_GROW_FILE=%s", input);
        snprintf(env_with, sizeof env_with, "FSDP_TEST_GROW_WITH=%s", gz ? with_gz : with_txt);
        const char *env[] = {env_preload, env_asan, env_file, env_with, NULL};
        const char *args[] = {"--val-fraction", "0", "-o", outdir, input, NULL};
        int rc = run_prepare_env(out, sizeof out, args, env);
        cr_assert_eq(rc, 0, "%s", out);
        cr_assert_eq(stat(input, &after), 0);
        cr_assert_gt(after.st_size, before.st_size, "the hook did not append to %s: the test tested nothing", input);
        cr_assert(strstr(out, "grew while it was read"), "no warning about the growth:\n%s", out);
        snprintf(p, sizeof p, "%s/train.bin", outdir);
        int64_t n;
        uint16_t *t = read_tokens(p, 0, &n);
        cr_assert_eq(n, 200000, "%s: %lld tokens, the file had 200000 bytes when opened (%lld with the appended "
                     "part)", gz ? "gzip" : "text", (long long)n, (long long)(200000 + strlen(extra)));
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(t[i], (unsigned char)orig[i], "token %lld", (long long)i);
        cJSON *m = read_json((snprintf(p, sizeof p, "%s/meta.json", outdir), p));
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(m, "inputs");
        cr_assert_eq(cJSON_GetObjectItemCaseSensitive(in, "bytes")->valuedouble, 200000);
        cJSON_Delete(m);
        free(t);
        free(orig);
    }
}
