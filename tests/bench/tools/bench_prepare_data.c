/* fsdp-prepare-data's threads: tokens/s at -j 1 and -j 2 on the same input, in one run, with their ratio, and
 * whether the two outputs are byte-identical (they must be). The inputs are made here from this repository's
 * docs and sources, about 25 MB each: a JSON Lines file, one paragraph a document (input=jsonl), and a
 * directory of text files, one source file a document (input=text_files). The tokenizer is the committed
 * examples/tokenizer.json (GPT-2 style); nothing is downloaded. Each -j is run 3 times, alternating, and the
 * fastest run of each counts (the whole process: start, read, encode, write, fsync).
 * On a shared machine other work takes cores from the threads, so the run also says what this machine gives
 * two processes: two_processes_ratio = 2 x (-j 1 alone) / (two -j 1 runs at once), 2.0 with two free cores,
 * the ceiling of ratio; and the 1-minute load average before and after:
 *   bench=prepare_data_threads input=jsonl|text_files mb=25.2 documents=... tokens=... cpus=2 load1_before=...
 *         j1_s=... j2_s=... j1_tokens_s=... j2_tokens_s=... ratio=... two_processes_ratio=... identical=1
 *         load1_after=...
 * Exit 1 when the outputs differ or a run fails. */
#include <dirent.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "tests/util/tu_file.h"
#include "tests/util/tu_proc.h"

#define CORPUS_BYTES (24u << 20)

static char dir[64];

struct corpus {
    FILE *out;         /* JSON Lines: one paragraph a document */
    const char *files; /* or a directory: one text file a source file */
    size_t bytes, docs, pass;
};

/* One paragraph as a JSON Lines document (the pass number keeps repeated paragraphs apart). */
static void put_doc(struct corpus *c, const char *text, size_t len)
{
    cJSON *o = cJSON_CreateObject();
    char *t = malloc(len + 32);
    snprintf(t, len + 32, "%.*s (%zu)", (int)len, text, c->pass);
    cJSON_AddStringToObject(o, "text", t);
    char *line = cJSON_PrintUnformatted(o);
    c->bytes += (size_t)fprintf(c->out, "%s\n", line);
    c->docs++;
    free(line);
    free(t);
    cJSON_Delete(o);
}

static void put_file(struct corpus *c, const char *path)
{
    char *s = tu_slurp(path);
    if (c->files) {
        char name[512];
        snprintf(name, sizeof name, "%s/%06zu.txt", c->files, c->docs);
        FILE *f = fopen(name, "w");
        if (f) {
            c->bytes += (size_t)fprintf(f, "%s (%zu)\n", s, c->pass);
            c->docs++;
            fclose(f);
        }
        free(s);
        return;
    }
    for (char *p = s; *p && c->bytes < CORPUS_BYTES;) {
        char *e = strstr(p, "\n\n");
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0)
            put_doc(c, p, n);
        p += n + (e ? 2 : 0);
    }
    free(s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The .md and .c files of src/sub, sorted. */
static void put_dir(struct corpus *c, const char *src, const char *sub)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", src, sub);
    DIR *d = opendir(path);
    if (!d)
        return;
    char *names[512];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 512) {
        size_t k = strlen(e->d_name);
        if (k > 3 && (strcmp(e->d_name + k - 3, ".md") == 0 || strcmp(e->d_name + k - 2, ".c") == 0))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s/%s", src, sub, names[i]);
        put_file(c, path);
        free(names[i]);
    }
}

static double load1(void)
{
    char *s = tu_slurp("/proc/loadavg");
    double v = atof(s);
    free(s);
    return v;
}

static long long meta_tokens(const char *out)
{
    char p[512];
    snprintf(p, sizeof p, "%s/meta.json", out);
    char *s = tu_slurp(p);
    cJSON *m = cJSON_Parse(s);
    free(s);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(m, "files");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "train.bin"), "tokens");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "val.bin"), "tokens");
    long long n = cJSON_IsNumber(t) && cJSON_IsNumber(v) ? (long long)(t->valuedouble + v->valuedouble) : -1;
    cJSON_Delete(m);
    return n;
}

static bool same_file(const char *a, const char *b)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return tu_sh(cmd) == 0;
}

/* `copies` runs of fsdp-prepare-data -j J at once, into dir/outJ (and dir/outJ_K for more copies); the wall
 * seconds until all ended, or -1. */
static double run(const char *exe, const char *tok, const char *input, int j, int copies)
{
    char out[4][128], log[4][128], js[16];
    snprintf(js, sizeof js, "%d", j);
    pid_t pids[4];
    double t0 = tu_now();
    for (int k = 0; k < copies; k++) {
        snprintf(out[k], sizeof out[k], k ? "%s/out%d_%d" : "%s/out%d", dir, j, k);
        snprintf(log[k], sizeof log[k], "%s/log%d_%d", dir, j, k);
        const char *argv[] = {exe, "-j", js, "--tokenizer", tok, "--no-progress", "-o", out[k], input, NULL};
        pids[k] = tu_spawn(argv, log[k], log[k], NULL);
    }
    int bad = 0;
    for (int k = 0; k < copies; k++) {
        int st;
        if (pids[k] < 0 || waitpid(pids[k], &st, 0) != pids[k] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            char *l = tu_slurp(log[k]);
            fprintf(stderr, "bench_prepare_data: -j %d failed:\n%s\n", j, l);
            free(l);
            bad = 1;
        }
    }
    double s = tu_now() - t0;
    return bad ? -1 : s;
}

/* -j 1 and -j 2 (and two -j 1 at once) on one input, 3 times each; the line; 0 when the outputs agree. */
static int bench(const char *exe, const char *tok, const char *kind, const char *input, const struct corpus *c)
{
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    /* best[1], best[2]: -j 1 and -j 2; best[0]: two -j 1 runs at once, which tells how much of a second core
     * this machine gives right now (2 x best[1] / best[0] is 2 on two free cores) */
    double before = load1(), best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 3; rep++) {
        for (int j = 0; j <= 2; j++) {
            double s = run(exe, tok, input, j ? j : 1, j ? 1 : 2);
            if (s < 0)
                return 1;
            best[j] = s < best[j] ? s : best[j];
        }
    }
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/out1/train.bin", dir);
    snprintf(p2, sizeof p2, "%s/out2/train.bin", dir);
    bool identical = same_file(p1, p2);
    snprintf(p1, sizeof p1, "%s/out1/val.bin", dir);
    snprintf(p2, sizeof p2, "%s/out2/val.bin", dir);
    identical = identical && same_file(p1, p2);
    snprintf(p1, sizeof p1, "%s/out1", dir);
    long long tokens = meta_tokens(p1);
    printf("bench=prepare_data_threads input=%s mb=%.1f documents=%zu tokens=%lld cpus=%d load1_before=%.2f "
           "j1_s=%.3f j2_s=%.3f j1_tokens_s=%.0f j2_tokens_s=%.0f ratio=%.2f two_processes_ratio=%.2f identical=%d "
           "load1_after=%.2f\n",
           kind, (double)c->bytes / 1e6, c->docs, tokens, cpus, before, best[1], best[2], (double)tokens / best[1],
           (double)tokens / best[2], best[1] / best[2], 2 * best[1] / best[0], identical, load1());
    fflush(stdout);
    return identical && tokens > 0 ? 0 : 1;
}

static const char *subs[] = {"docs", "worker/tools", "worker/train", "worker/model", "common", "launcher"};

static void fill_corpus(struct corpus *c, const char *src)
{
    for (c->pass = 0; c->bytes < CORPUS_BYTES; c->pass++)
        for (size_t i = 0; i < sizeof subs / sizeof *subs && c->bytes < CORPUS_BYTES; i++)
            put_dir(c, src, subs[i]);
}

int main(void)
{
    const char *src = getenv("FSDP_SOURCE_ROOT"), *build = getenv("FSDP_BUILD_ROOT");
    if (!src || !build) {
        fprintf(stderr, "bench_prepare_data: FSDP_SOURCE_ROOT and FSDP_BUILD_ROOT must be set (meson test --benchmark)\n");
        return 1;
    }
    strcpy(dir, "/tmp/fsdp-bench-prep-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    char exe[1024], tok[1024], input[256];
    snprintf(exe, sizeof exe, "%s/worker/fsdp-prepare-data", build);
    snprintf(tok, sizeof tok, "%s/examples/tokenizer.json", src);
    snprintf(input, sizeof input, "%s/corpus.jsonl", dir);
    struct corpus c = {.out = fopen(input, "w")};
    if (!c.out)
        return 1;
    fill_corpus(&c, src);
    fclose(c.out);
    int rc = bench(exe, tok, "jsonl", input, &c);
    snprintf(input, sizeof input, "%s/files", dir);
    struct corpus f = {.files = input};
    if (rc == 0 && mkdir(input, 0755) == 0) {
        fill_corpus(&f, src);
        rc = bench(exe, tok, "text_files", input, &f);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    tu_sh(cmd);
    return rc;
}
