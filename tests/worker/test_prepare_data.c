#include "common/error.h"
#include "worker/train/data.h"
#include "wtest.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char tmpdir[64];
static void setup(void)
{
    strcpy(tmpdir, "/tmp/fsdp-prep-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}
static void teardown(void) { wtest_rm_tree(tmpdir); }
TestSuite(prepare_data, .init = setup, .fini = teardown);

/* Runs fsdp-prepare-data with argv (NULL-terminated, without argv[0]); returns the exit code and the
 * combined stdout+stderr in out. */
static int run_prepare(char *out, size_t cap, const char **args)
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
        const char *argv[32] = {exe};
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(exe, (char **)argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    char *text = wtest_read_file(outpath, NULL);
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
    wtest_write_file(p, data, len);
    data[len] = 0;
    return data;
}

static uint16_t *read_tokens(const char *path, int llmc, int64_t *n)
{
    size_t len;
    char *raw = wtest_read_file(path, &len);
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
    wtest_write_file(p, bin, sizeof bin);

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
