/* fsdp-ckpt sample with a tokenizer: the prompt is encoded and the greedy continuation decoded with the
 * run's tokenizer.json (here the checkpoint directory's own), ids the tokenizer lacks print as <id>, and
 * a tokenizer with more ids than the model is refused. Without one, tests/ckpt/test_ckpt_tool.c covers
 * byte tokens. */
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "tests/ckpt/ctest.h"
#include "worker/tokenizer/tokenizer.h"

static char dir[64];
static void setup(void) { tu_mkdtemp(dir, sizeof dir, "ckpt_test"); }
static void teardown(void) { tu_rm_tree(dir); }
TestSuite(ckpt_sample, .init = setup, .fini = teardown);

/* A byte-level tokenizer: the 256 byte characters, "ab" (256), "abc" (257), <|endoftext|> (258) and,
 * with extra, ids up to 256 + extra. */
static void write_tokenizer(const char *path, int extra)
{
    static char json[1 << 16];
    size_t k = (size_t)snprintf(json, sizeof json, "{\"added_tokens\":[{\"id\":258,\"content\":\"<|endoftext|>\","
                                "\"special\":true}],\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
                                "false},\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"merges\":"
                                "[[\"a\",\"b\"],[\"ab\",\"c\"]],\"vocab\":{");
    for (int c = 0; c < 256; c++) {
        unsigned cp = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae ? (unsigned)c
                      : c <= 0x20 ? 0x100u + (unsigned)c : c <= 0xa0 ? 0x100u + 33 + ((unsigned)c - 0x7f) : 0x143u;
        k += (size_t)snprintf(json + k, sizeof json - k, "\"\\u%04x\":%d,", cp, c);
    }
    for (int i = 0; i < extra; i++)
        k += (size_t)snprintf(json + k, sizeof json - k, "\"x%d\":%d,", i, 259 + i);
    snprintf(json + k, sizeof json - k, "\"ab\":256,\"abc\":257,\"<|endoftext|>\":258}}}");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
}

static int run(char *const argv[], char *out, size_t cap)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t got;
    while ((got = read(p[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)got;
    out[n] = '\0';
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(ckpt_sample, decodes_with_the_checkpoints_tokenizer)
{
    struct model_layout l;
    ct_layout(&l, 300);
    ct_save_full(dir, &l, 3, 11, 0);
    char tok_path[256];
    snprintf(tok_path, sizeof tok_path, "%s/fsdp_cpt3/tokenizer.json", dir);
    write_tokenizer(tok_path, 0);
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(tok_path, &t), 0, "%s", error_message());
    /* greedy continuation of the prompt's ids, computed with the model API */
    struct tokenizer_ids ctx = {0};
    cr_assert_eq(tokenizer_encode(t, "abc ab", 6, &ctx), 0);
    cr_assert_eq(ctx.n, 3u); /* abc, Ġ, ab */
    float *params = kernels_cpu()->mem_alloc(l.numel * sizeof *params);
    for (int p = 0; p < l.n_params; p++)
        ct_fill(&l, CKPT_PARAM, p, 0, l.params[p].numel, params + l.params[p].offset, 11);
    struct model *m;
    int T = l.config.block_size;
    cr_assert_eq(model_create(&m, &l.config, kernels_cpu(), 1, T), 0, "%s", error_message());
    char want[4096] = "abc ab";
    size_t wn = 6;
    int unknown = 0;
    for (int g = 0; g < 24; g++) {
        size_t w = ctx.n < (size_t)T ? ctx.n : (size_t)T;
        int32_t tok[64], tgt[64];
        for (int i = 0; i < T; i++) {
            tok[i] = (size_t)i < w ? (int32_t)ctx.v[ctx.n - w + (size_t)i] : 0;
            tgt[i] = -1;
        }
        float loss;
        cr_assert_eq(model_set_batch(m, tok, tgt), 0);
        cr_assert_eq(model_forward(m, params, &loss), 0);
        const float *lg = model_logits(m) + (w - 1) * (size_t)l.vocab_padded;
        int best = 0;
        for (int v = 1; v < l.config.vocab_size; v++)
            if (lg[v] > lg[best])
                best = v;
        cr_assert_eq(tokenizer_ids_push(&ctx, (uint32_t)best), 0);
        size_t n;
        const unsigned char *b = tokenizer_token_bytes(t, (uint32_t)best, &n);
        if (b) {
            memcpy(want + wn, b, n);
            wn += n;
        } else {
            wn += (size_t)snprintf(want + wn, sizeof want - wn, "<%d>", best);
            unknown++;
        }
    }
    want[wn++] = '\n';
    model_destroy(m);
    kernels_cpu()->mem_free(params);
    tokenizer_ids_free(&ctx);
    tokenizer_free(t);
    char tool[1024], out[8192];
    snprintf(tool, sizeof tool, "%s/worker/fsdp-ckpt", getenv("FSDP_BUILD_ROOT"));
    cr_assert_eq(run((char *[]){tool, "sample", dir, "--prompt", "abc ab", "--temperature", "0", "--length", "24",
                                NULL},
                     out, sizeof out),
                 0, "%s", out);
    cr_assert(strlen(out) == wn && memcmp(out, want, wn) == 0, "got\n%s\nwant\n%.*s", out, (int)wn, want);
    /* --tokenizer names one explicitly; more ids than the model has is refused */
    char big[256];
    snprintf(big, sizeof big, "%s/big.json", dir);
    write_tokenizer(big, 100);
    cr_assert_eq(run((char *[]){tool, "sample", dir, "--tokenizer", big, NULL}, out, sizeof out), 1);
    cr_assert(strstr(out, "has 359 ids but the model's vocab_size is 300"), "%s", out);
    model_layout_free(&l);
}
