/* Tokenizer throughput on one thread against Hugging Face `tokenizers` (the venv's, run by
 * tests/tokenizer/tokenizer_ref.py with RAYON_NUM_THREADS=1), measured in the same run on the same text.
 * Tokenizers are trained here with `tokenizers` on local text (this repository's docs and sources,
 * Python's standard library) and generated multi-script text, nothing downloaded: GPT-2 style with a
 * GPT-2-sized vocabulary (50,257) and a small one (1,200, the figure), Llama 3 style at 50,257,
 * and at 32,000 Qwen2 style (NFC, single digits) and Llama 2 / Mistral SentencePiece style (Metaspace with
 * split false: each text is one pre-token of megabytes, tokenizers' encode() then merges the whole text,
 * its encode_batch_fast() each paragraph).
 * Each is timed on two texts it was not trained on: code and docs (English), and multi-script text.
 * Output, one line per tokenizer and text:
 *   bench=tokenizer style=gpt2 vocab=50257 text=code_docs mb=... ours_mb_s=... ours_cold_mb_s=...
 *         tokenizers_mb_s=... ratio=... ids_equal=1 cache_hit=...
 * ours_mb_s is the best of 3 encodes (the piece cache warm, as `tokenizers`' own cache is over its repeats),
 * ours_cold_mb_s the first encode with a fresh tokenizer; ratio = ours_mb_s / tokenizers_mb_s. Without the
 * venv only the committed examples/tokenizer.json is timed, with no peer. */
#include "common/error.h"
#include "worker/tokenizer/tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/util/tu_proc.h"
#include "tests/util/tu_venv.h"

static char python[1024], script[1024], dir[64];

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(s);
        return NULL;
    }
    fclose(f);
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

/* Runs tokenizer_ref.py; its stdout in out (may be NULL). */
static int ref(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int ref(char *out, size_t cap, const char *fmt, ...)
{
    char args[4096], cmd[8192], log[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/ref.out", dir);
    snprintf(cmd, sizeof cmd, "RAYON_NUM_THREADS=1 '%s' '%s' %s > '%s' 2>&1", python, script, args, log);
    int rc = tu_sh(cmd);
    size_t n;
    char *text = slurp(log, &n);
    if (rc != 0)
        fprintf(stderr, "bench_tokenizer: tokenizer_ref.py %s failed:\n%s\n", args, text ? text : "");
    if (out && text)
        snprintf(out, cap, "%s", text);
    free(text);
    return rc;
}

struct ours {
    double mb_s, cold_mb_s, hit;
    uint32_t vocab; /* the trained tokenizer's ids */
    struct tokenizer_ids ids;
};

static int time_ours(const char *tok_path, const char *text, size_t len, struct ours *o)
{
    memset(o, 0, sizeof *o);
    struct tokenizer *t;
    if (tokenizer_load(tok_path, &t) != 0) {
        fprintf(stderr, "bench_tokenizer: %s\n", error_message());
        return -1;
    }
    double best = 1e30;
    int rc = 0;
    for (int rep = 0; rep < 4 && rc == 0; rep++) {
        o->ids.n = 0;
        double t0 = tu_now();
        rc = tokenizer_encode(t, text, len, &o->ids);
        double dt = tu_now() - t0;
        if (rep == 0)
            o->cold_mb_s = (double)len / dt / 1e6; /* a fresh tokenizer: every piece new to the cache */
        else
            best = dt < best ? dt : best;
    }
    if (rc != 0)
        fprintf(stderr, "bench_tokenizer: %s\n", error_message());
    uint64_t h, m;
    tokenizer_cache_stats(t, &h, &m);
    o->hit = h + m ? (double)h / (double)(h + m) : 0;
    o->mb_s = (double)len / best / 1e6;
    o->vocab = tokenizer_vocab_size(t);
    tokenizer_free(t);
    return rc;
}

static int bench(const char *style, const char *tok_path, const char *text_name, const char *text_path,
                 bool peer)
{
    size_t len;
    char *text = slurp(text_path, &len);
    if (!text || tokenizer_utf8_check(text, len) != len) {
        fprintf(stderr, "bench_tokenizer: %s: unreadable or not UTF-8\n", text_path);
        free(text);
        return -1;
    }
    struct ours o;
    if (time_ours(tok_path, text, len, &o) != 0) {
        free(text);
        return -1;
    }
    double theirs = 0;
    int equal = -1;
    if (peer) {
        char out[256], ids_path[256];
        snprintf(ids_path, sizeof ids_path, "%s/peer.ids", dir);
        if (ref(out, sizeof out, "bench '%s' '%s' '%s' --repeat 2", tok_path, text_path, ids_path) != 0 ||
            sscanf(out, "mb_s=%lf", &theirs) != 1) {
            free(text);
            tokenizer_ids_free(&o.ids);
            return -1;
        }
        size_t n;
        char *pids = slurp(ids_path, &n);
        equal = pids && n == o.ids.n * 4 && memcmp(pids, o.ids.v, n) == 0;
        free(pids);
    }
    if (peer)
        printf("bench=tokenizer style=%s vocab=%u text=%s mb=%.1f ours_mb_s=%.2f ours_cold_mb_s=%.2f "
               "tokenizers_mb_s=%.3f ratio=%.1f ids_equal=%d cache_hit=%.3f\n",
               style, o.vocab, text_name, (double)len / 1e6, o.mb_s, o.cold_mb_s, theirs, o.mb_s / theirs, equal,
               o.hit);
    else
        printf("bench=tokenizer style=%s vocab=%u text=%s mb=%.1f ours_mb_s=%.2f ours_cold_mb_s=%.2f "
               "tokenizers_mb_s=nan ratio=nan cache_hit=%.3f\n",
               style, o.vocab, text_name, (double)len / 1e6, o.mb_s, o.cold_mb_s, o.hit);
    fflush(stdout);
    free(text);
    tokenizer_ids_free(&o.ids);
    return equal == 0 ? -1 : 0;
}

int main(void)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    if (!src) {
        fprintf(stderr, "bench_tokenizer: FSDP_SOURCE_ROOT is not set (run through meson test --benchmark)\n");
        return 1;
    }
    strcpy(dir, "/tmp/fsdp-bench-tok-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(script, sizeof script, "%s/tests/tokenizer/tokenizer_ref.py", src);
    char why[2048], example[1024], p[1024], docs[1024], worker[1024];
    snprintf(example, sizeof example, "%s/examples/tokenizer.json", src);
    snprintf(docs, sizeof docs, "%s/docs", src);
    snprintf(worker, sizeof worker, "%s/worker", src);
    int rc = 0;
    if (tu_venv_python("tokenizers", python, sizeof python, why, sizeof why) != 0) {
        printf("bench_tokenizer: no peer: %s; timing examples/tokenizer.json alone\n", why);
        /* the repository's own text as the sample */
        snprintf(p, sizeof p, "%s/docs/data.md", src);
        rc = bench("gpt2", example, "docs_data_md", p, false);
        goto out;
    }
    /* training text: 12 MB, half local, half multi-script; timing texts: local text past the training
     * part, and multi-script text of another seed */
    char train[256], code[256], multi[256];
    snprintf(train, sizeof train, "%s/train.txt", dir);
    snprintf(code, sizeof code, "%s/code_docs.txt", dir);
    snprintf(multi, sizeof multi, "%s/multiscript.txt", dir);
    if (ref(NULL, 0, "corpus '%s' --bytes 12000000 --src '%s' --src '%s'", train, docs, worker) != 0 ||
        ref(NULL, 0, "corpus '%s' --bytes 4000000 --multiscript 0 --skip 7000000", code) != 0 ||
        ref(NULL, 0, "multiscript '%s' --bytes 2000000 --seed 99", multi) != 0) {
        rc = 1;
        goto out;
    }
    static const struct {
        const char *style;
        int vocab;
    } toks[] = {{"gpt2", 50257}, {"gpt2", 1200}, {"llama3", 50257}, {"qwen2", 32000}, {"spm", 32000}};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s_%d.json", dir, toks[i].style, toks[i].vocab);
        double t0 = tu_now();
        if (ref(NULL, 0, "train --style %s --vocab %d --out '%s' '%s'", toks[i].style, toks[i].vocab, p, train) !=
            0) {
            rc = 1;
            goto out;
        }
        fprintf(stderr, "bench_tokenizer: trained %s %d in %.1f s\n", toks[i].style, toks[i].vocab, tu_now() - t0);
        if (bench(toks[i].style, p, "code_docs", code, true) != 0 ||
            bench(toks[i].style, p, "multiscript", multi, true) != 0)
            rc = 1;
    }
out:
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    tu_sh(p);
    return rc;
}
