/* fsdp-ckpt, run as a user runs it: inspect (and its checksum verdict on a damaged file), merge and
 * export (loaded back with the model's own loader and checked by Debian's python3 + torch reading the
 * format by hand), and sample (greedy output equal to the model's argmax computed here). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "kernels/kernels.h"
#include "tests/ckpt/ctest.h"
#include "worker/ckpt/ckpt_internal.h"
#include "worker/model/model_hf.h"

static char dir[64];
static void setup(void)
{
    tu_mkdtemp(dir, sizeof dir, "ckpt_test");
}
static void teardown(void)
{
    tu_rm_tree(dir);
}

TestSuite(ckpt_tool, .init = setup, .fini = teardown);

/* Runs argv with stdout+stderr into out; returns the exit status (or 128 + signal). seconds > 0: an alarm
 * that survives exec ends a child that hangs. */
static int run_with_alarm(char *const argv[], char *out, size_t cap, unsigned seconds)
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
        if (seconds)
            alarm(seconds);
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

static int run(char *const argv[], char *out, size_t cap)
{
    return run_with_alarm(argv, out, cap, 0);
}

static const char *tool(void)
{
    static char path[1024];
    const char *b = getenv("FSDP_BUILD_ROOT");
    cr_assert_not_null(b, "FSDP_BUILD_ROOT not set (run through meson test)");
    snprintf(path, sizeof path, "%s/worker/fsdp-ckpt", b);
    return path;
}

static char out[1 << 16];

Test(ckpt_tool, inspect_prints_state_and_verifies)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 7, 2, 2, 1, 0);
    char target[128];
    snprintf(target, sizeof target, "%s:latest", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "inspect", target, NULL}, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "format: sharded") && strstr(out, "step: 7") && strstr(out, "world_size: 2") &&
                  strstr(out, "strategy: FULL_SHARD") && strstr(out, "fsdp_version: 2") &&
                  strstr(out, "h.1.mlp.c_fc.weight") && strstr(out, "(36, 144)") && strstr(out, "(128, 36)") &&
                  strstr(out, "checksums: OK"),
              "%s", out);
    /* A root also works without :latest; a damaged shard makes inspect fail and name it. */
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt7/fsdp_sharded_cpt7_rank0", dir);
    int fd = open(path, O_RDWR);
    struct stat st;
    fstat(fd, &st);
    unsigned char b = 0;
    cr_assert_eq(pread(fd, &b, 1, st.st_size - 8), 1);
    b ^= 1;
    cr_assert_eq(pwrite(fd, &b, 1, st.st_size - 8), 1);
    close(fd);
    cr_assert_eq(run((char *[]){(char *)tool(), "inspect", dir, NULL}, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "FAILED") && strstr(out, path) && strstr(out, "CRC32C mismatch"), "%s", out);
    model_layout_free(&l);
}

Test(ckpt_tool, usage_errors)
{
    cr_assert_eq(run((char *[]){(char *)tool(), NULL}, out, sizeof out), 2);
    cr_assert(strstr(out, "usage"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "frobnicate", NULL}, out, sizeof out), 2);
    cr_assert_eq(run((char *[]){(char *)tool(), "inspect", "/nonexistent/ckpt", NULL}, out, sizeof out), 1);
    cr_assert(strstr(out, "/nonexistent/ckpt"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, "x.safetensors", "--dtype", "f8", NULL}, out,
                     sizeof out),
                 2);
    cr_assert(strstr(out, "--dtype"), "%s", out);
}

/* Each command's flags, as docs/checkpoints.md lists them: the tables in worker/tools/ckpt_tool*.c must
 * keep every one. */
static const struct {
    const char *cmd;
    const char *flags[7];
} cmd_flags[] = {
    {"inspect", {NULL}},
    {"merge", {NULL}},
    {"export", {"--dtype", "--max_shard_size", "--tokenizer", NULL}},
    {"eval", {"--data", "--steps", "--batch", "--block_size", "--json", NULL}},
    {"score", {"--data", "--steps", "--batch", "--block_size", "--json", NULL}},
    {"sample", {"--prompt", "--temperature", "--top_k", "--length", "--seed", "--tokenizer", NULL}},
};

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* A flag a command does not know is named, with the flags it does know, once, and exits 2 before any
 * model is read (the model path does not exist). */
Test(ckpt_tool, unknown_flag_names_it_and_lists_the_allowed_ones)
{
    for (size_t c = 0; c < sizeof cmd_flags / sizeof cmd_flags[0]; c++) {
        const char *cmd = cmd_flags[c].cmd;
        int rc = run((char *[]){(char *)tool(), (char *)cmd, "/nonexistent/ckpt", "--frob=3", NULL}, out, sizeof out);
        cr_assert_eq(rc, 2, "%s --frob=3 exited %d: %s", cmd, rc, out);
        cr_assert(strstr(out, "unknown flag '--frob=3'"), "%s: %s", cmd, out);
        cr_assert_eq(count(out, "unknown flag"), 1, "%s: the message is printed once: %s", cmd, out);
        cr_assert(!strstr(out, "/nonexistent/ckpt"), "%s read its model before its flags: %s", cmd, out);
        for (int f = 0; cmd_flags[c].flags[f]; f++)
            cr_assert(strstr(out, cmd_flags[c].flags[f]), "%s: %s not listed: %s", cmd, cmd_flags[c].flags[f], out);
        if (!cmd_flags[c].flags[0])
            cr_assert(strstr(out, "takes no flags"), "%s: %s", cmd, out);
        char want[64];
        snprintf(want, sizeof want, "fsdp-ckpt %s --help", strcmp(cmd, "score") == 0 ? "eval" : cmd);
        cr_assert(strstr(out, want), "%s: the message points at %s: %s", cmd, want, out);
    }
    /* a flag of another command is unknown too: merge always writes f32 */
    cr_assert_eq(run((char *[]){(char *)tool(), "merge", dir, "x.safetensors", "--dtype", "bf16", NULL}, out,
                     sizeof out),
                 2);
    cr_assert(strstr(out, "fsdp-ckpt merge: unknown flag '--dtype': fsdp-ckpt merge takes no flags"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "frobnicate", NULL}, out, sizeof out), 2);
    cr_assert(strstr(out, "unknown command 'frobnicate'") && strstr(out, "inspect, export, merge, eval and sample"),
              "%s", out);
}

Test(ckpt_tool, missing_value_names_the_flag_and_what_it_takes)
{
    static const struct {
        const char *cmd, *flag, *want;
    } cases[] = {
        {"sample", "--length", "fsdp-ckpt sample: --length needs a value (an integer >= 0)"},
        {"sample", "--prompt", "fsdp-ckpt sample: --prompt needs a value (any text"},
        {"eval", "--data", "fsdp-ckpt eval: --data needs a value (a token file"},
        {"eval", "--steps", "fsdp-ckpt eval: --steps needs a value (an integer in [1, 1000000000])"},
        {"export", "--dtype", "fsdp-ckpt export: --dtype needs a value (f32, bf16 or f16)"},
        {"export", "--max_shard_size", "fsdp-ckpt export: --max_shard_size needs a value (a size such as 5GB"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bool two = strcmp(cases[c].cmd, "export") == 0;
        char *argv[] = {(char *)tool(), (char *)cases[c].cmd, "/nonexistent/ckpt", two ? "out" : (char *)cases[c].flag,
                        two ? (char *)cases[c].flag : NULL, NULL};
        int rc = run(argv, out, sizeof out);
        cr_assert_eq(rc, 2, "%s %s exited %d: %s", cases[c].cmd, cases[c].flag, rc, out);
        cr_assert(strstr(out, cases[c].want), "%s %s: %s", cases[c].cmd, cases[c].flag, out);
        cr_assert_eq(count(out, "needs a value"), 1, "%s", out);
    }
    /* a missing argument or required flag says which, with the usage */
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", "--length", "2", NULL}, out, sizeof out), 2);
    cr_assert(strstr(out, "fsdp-ckpt sample: missing MODEL") && strstr(out, "usage: fsdp-ckpt sample MODEL"), "%s",
              out);
    cr_assert_eq(run((char *[]){(char *)tool(), "eval", "/nonexistent/ckpt", "--batch", "2", NULL}, out, sizeof out),
                 2);
    cr_assert(strstr(out, "fsdp-ckpt eval: --data TOKENS.bin is required"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", "/nonexistent/ckpt", NULL}, out, sizeof out), 2);
    cr_assert(strstr(out, "fsdp-ckpt export: missing OUT_DIR|OUT.safetensors"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "inspect", dir, "extra", NULL}, out, sizeof out), 2);
    cr_assert(strstr(out, "fsdp-ckpt inspect: unexpected argument 'extra'; usage: fsdp-ckpt inspect CKPT"), "%s",
              out);
}

Test(ckpt_tool, bad_number_names_the_flag_the_value_and_what_is_allowed)
{
    static const struct {
        const char *cmd, *flag, *value, *want;
    } cases[] = {
        {"sample", "--top_k", "abc", "fsdp-ckpt sample: --top_k: 'abc' is not an integer >= 0"},
        {"sample", "--length", "1.5", "fsdp-ckpt sample: --length: '1.5' is not an integer >= 0"},
        {"sample", "--seed", "-3", "fsdp-ckpt sample: --seed: '-3' is not an integer >= 0"},
        {"sample", "--temperature", "-0.5", "fsdp-ckpt sample: --temperature: '-0.5' is not a number >= 0"},
        {"sample", "--temperature", "inf", "fsdp-ckpt sample: --temperature: 'inf' is not a number >= 0"},
        {"sample", "--length", "", "fsdp-ckpt sample: --length: '' is not an integer >= 0"},
        {"eval", "--steps", "0", "fsdp-ckpt eval: --steps: '0' is not an integer in [1, 1000000000]"},
        {"eval", "--batch", "2x", "fsdp-ckpt eval: --batch: '2x' is not an integer in [1, 1000000000]"},
        {"eval", "--block_size", "2000000000", "--block_size: '2000000000' is not an integer in [1, 1000000000]"},
        {"export", "--dtype", "f8", "fsdp-ckpt export: --dtype: 'f8' is not f32, bf16 or f16"},
        {"export", "--max_shard_size", "-5GB", "fsdp-ckpt export: --max_shard_size: '-5GB' is not a size such as"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bool two = strcmp(cases[c].cmd, "export") == 0;
        char arg[128];
        snprintf(arg, sizeof arg, "%s=%s", cases[c].flag, cases[c].value);
        /* both spellings: --flag VALUE and --flag=VALUE */
        for (int joined = 0; joined < 2; joined++) {
            char *argv[8] = {(char *)tool(), (char *)cases[c].cmd, "/nonexistent/ckpt"};
            int n = 3;
            if (two)
                argv[n++] = "out";
            if (joined) {
                argv[n++] = arg;
            } else {
                argv[n++] = (char *)cases[c].flag;
                argv[n++] = (char *)cases[c].value;
            }
            if (strcmp(cases[c].cmd, "eval") == 0 && strcmp(cases[c].flag, "--data") != 0) {
                argv[n++] = "--data";
                argv[n++] = "/nonexistent/tokens.bin";
            }
            argv[n] = NULL;
            int rc = run(argv, out, sizeof out);
            cr_assert_eq(rc, 2, "%s %s %s exited %d: %s", cases[c].cmd, cases[c].flag, cases[c].value, rc, out);
            cr_assert(strstr(out, cases[c].want), "%s %s '%s': %s", cases[c].cmd, cases[c].flag, cases[c].value, out);
            cr_assert_eq(count(out, "is not"), 1, "%s", out);
        }
    }
}

/* --help (or -h) of each command lists every flag of its table and exits 0 without reading anything;
 * fsdp-ckpt --help lists every command's usage. */
Test(ckpt_tool, each_command_help_lists_its_flags)
{
    for (size_t c = 0; c < sizeof cmd_flags / sizeof cmd_flags[0]; c++) {
        const char *cmd = cmd_flags[c].cmd, *name = strcmp(cmd, "score") == 0 ? "eval" : cmd;
        for (int h = 0; h < 2; h++) {
            int rc = run((char *[]){(char *)tool(), (char *)cmd, h ? "-h" : "--help", NULL}, out, sizeof out);
            cr_assert_eq(rc, 0, "%s --help exited %d: %s", cmd, rc, out);
            char want[64];
            snprintf(want, sizeof want, "usage: fsdp-ckpt %s ", name);
            cr_assert(strstr(out, want), "%s: %s", cmd, out);
            for (int f = 0; cmd_flags[c].flags[f]; f++) {
                char line[64]; /* each flag has a line of its own: "  --flag VALUE  help" */
                snprintf(line, sizeof line, "\n  %s ", cmd_flags[c].flags[f]);
                cr_assert(strstr(out, line), "%s --help lacks %s: %s", cmd, cmd_flags[c].flags[f], out);
            }
        }
    }
    /* the defaults docs/checkpoints.md gives */
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", "--help", NULL}, out, sizeof out), 0);
    cr_assert(strstr(out, "default 0.8") && strstr(out, "default 200") && strstr(out, "default 1337"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", "--help", NULL}, out, sizeof out), 0);
    cr_assert(strstr(out, "[--dtype f32|bf16|f16]") && strstr(out, "default 50GB"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "--help", NULL}, out, sizeof out), 0);
    for (size_t c = 0; c < sizeof cmd_flags / sizeof cmd_flags[0]; c++) {
        char want[64];
        snprintf(want, sizeof want, "\n  %s ", cmd_flags[c].cmd);
        cr_assert(strcmp(cmd_flags[c].cmd, "score") == 0 || strstr(out, want), "%s: %s", cmd_flags[c].cmd, out);
        for (int f = 0; cmd_flags[c].flags[f]; f++)
            cr_assert(strstr(out, cmd_flags[c].flags[f]), "fsdp-ckpt --help lacks %s: %s", cmd_flags[c].flags[f], out);
    }
}

/* Runs /usr/bin/python3 check_full.py on a model file and compares its per-tensor sums with ours. */
static void python_check(const char *model, const struct model_layout *l, uint32_t salt)
{
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("Debian's /usr/bin/python3 with torch (python3-torch) is not installed");
    char script[1024], n_layer[16], n_embd[16], vocab[16], block[16];
    snprintf(script, sizeof script, "%s/tests/ckpt/check_full.py", getenv("FSDP_SOURCE_ROOT"));
    snprintf(n_layer, sizeof n_layer, "%d", l->config.n_layer);
    snprintf(n_embd, sizeof n_embd, "%d", l->config.n_embd);
    snprintf(vocab, sizeof vocab, "%d", l->config.vocab_size);
    snprintf(block, sizeof block, "%d", l->config.block_size);
    int rc = run((char *[]){"/usr/bin/python3", script, (char *)model, n_layer, n_embd, vocab, block, NULL}, out,
                 sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    char ok[32];
    snprintf(ok, sizeof ok, "OK %d", l->n_params);
    cr_assert(strstr(out, ok), "%s", out);
    /* A leading newline lets every tensor line be found as "\nNAME ". */
    static char lines[sizeof out + 1];
    lines[0] = '\n';
    memcpy(lines + 1, out, sizeof out);
    for (int p = 0; p < l->n_params; p++) {
        char key[96];
        snprintf(key, sizeof key, "\n%s ", l->params[p].name);
        const char *line = strstr(lines, key);
        cr_assert_not_null(line, "%s missing in:\n%s", l->params[p].name, out);
        const char *sum = strchr(line + strlen(key), ' ');
        double got = strtod(sum, NULL), want = 0;
        for (size_t i = 0; i < ckpt_param_real_numel(&l->params[p]); i++)
            want += ct_value(l, CKPT_PARAM, p, i, salt);
        cr_assert(fabs(got - want) <= 1e-9 * (1 + fabs(want)), "%s: python sum %.17g, saved %.17g",
                  l->params[p].name, got, want);
    }
}

Test(ckpt_tool, merge_sharded_to_hf_safetensors)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 12, 3, 1, 6, 0);
    char src[128], dst[128];
    snprintf(src, sizeof src, "%s/fsdp_sharded_cpt12", dir);
    snprintf(dst, sizeof dst, "%s/merged.safetensors", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "merge", src, dst, NULL}, out, sizeof out), 0, "%s", out);
    float *got = malloc(l.numel * sizeof *got);
    cr_assert_eq(model_weights_load(&l, dst, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++) {
            float want = ct_value(&l, CKPT_PARAM, p, i, 6);
            cr_assert(memcmp(&want, &got[l.params[p].offset + i], 4) == 0, "%s[%zu]", l.params[p].name, i);
        }
    free(got);
    python_check(dst, &l, 6);
    model_layout_free(&l);
}

Test(ckpt_tool, full_checkpoint_model_file_opens_in_python)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 4, 8, 0);
    char model[128];
    snprintf(model, sizeof model, "%s/fsdp_cpt4/model.safetensors", dir);
    python_check(model, &l, 8);
    model_layout_free(&l);
}

Test(ckpt_tool, export_bf16_and_f16)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 4, 2, 0);
    const char *dtypes[] = {"bf16", "f16"};
    for (int d = 0; d < 2; d++) {
        char dst[128];
        snprintf(dst, sizeof dst, "%s/export_%s.safetensors", dir, dtypes[d]);
        cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, dst, "--dtype", (char *)dtypes[d], NULL}, out,
                         sizeof out),
                     0, "%s", out);
        struct safetensors_file *f;
        cr_assert_eq(safetensors_open(&f, dst), 0, "%s", error_message());
        int p = model_layout_find(&l, "h.1.attn.c_attn.weight");
        const struct safetensors_tensor *t = safetensors_find(f, "h.1.attn.c_attn.weight");
        cr_assert_not_null(t);
        cr_assert_eq(t->dtype, d == 0 ? SAFETENSORS_BF16 : SAFETENSORS_F16);
        uint16_t v[50];
        cr_assert_eq(safetensors_read(f, t, 200, v, sizeof v), 0);
        for (int i = 0; i < 50; i++) {
            float x = ct_value(&l, CKPT_PARAM, p, 100 + (size_t)i, 2);
            uint16_t want = d == 0 ? dtype_f32_to_bf16(x) : dtype_f32_to_f16(x);
            cr_assert_eq(v[i], want, "element %d: %04x vs %04x", i, v[i], want);
        }
        cr_assert_eq(safetensors_find(f, "wte.weight")->shape[0], 77, "padding rows exported");
        safetensors_close(f);
        /* The model loader widens bf16/f16 files. */
        float *w = malloc(l.numel * sizeof *w);
        cr_assert_eq(model_weights_load(&l, dst, w), 0, "%s", error_message());
        free(w);
    }
    model_layout_free(&l);
}

/* Greedy continuation computed here with the model API, as the sampler should. */
static void greedy(const struct model_layout *l, const float *params, const char *prompt, int n_new, char *res)
{
    struct model *m;
    int T = l->config.block_size;
    cr_assert_eq(model_create(&m, &l->config, kernels_cpu(), 1, T), 0, "%s", error_message());
    int ctx[256], n = 0;
    for (const char *c = prompt; *c; c++)
        ctx[n++] = (unsigned char)*c;
    for (int g = 0; g < n_new; g++) {
        int w = n < T ? n : T;
        int32_t tok[64], tgt[64];
        for (int i = 0; i < T; i++) {
            tok[i] = i < w ? ctx[n - w + i] : 0;
            tgt[i] = -1;
        }
        float loss;
        cr_assert_eq(model_set_batch(m, tok, tgt), 0);
        cr_assert_eq(model_forward(m, params, &loss), 0);
        const float *lg = model_logits(m) + (size_t)(w - 1) * l->vocab_padded;
        int best = 0;
        for (int v = 1; v < l->config.vocab_size; v++)
            if (lg[v] > lg[best])
                best = v;
        ctx[n++] = best;
        res[g] = (char)best;
    }
    model_destroy(m);
}

Test(ckpt_tool, sample_greedy_matches_model_and_seed_repeats)
{
    struct model_layout l;
    ct_layout(&l, 256);
    ct_save_full(dir, &l, 3, 11, 0);
    float *params = kernels_cpu()->mem_alloc(l.numel * sizeof *params);
    for (int p = 0; p < l.n_params; p++)
        ct_fill(&l, CKPT_PARAM, p, 0, l.params[p].numel, params + l.params[p].offset, 11);
    /* 20 tokens from a 3-byte prompt overrun block_size 16: the window slides. */
    char want[21] = "";
    greedy(&l, params, "abc", 20, want);
    kernels_cpu()->mem_free(params);
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", dir, "--prompt", "abc", "--temperature", "0", "--length",
                                "20", NULL},
                     out, sizeof out),
                 0, "%s", out);
    cr_assert(memcmp(out, "abc", 3) == 0 && memcmp(out + 3, want, 20) == 0 && out[23] == '\n', "got %s", out);
    char first[4096];
    const char *args[] = {"--temperature=1.0", "--top_k=50", "--length=40", "--seed=5"};
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", dir, (char *)args[0], (char *)args[1], (char *)args[2],
                                (char *)args[3], NULL},
                     out, sizeof out),
                 0, "%s", out);
    memcpy(first, out, sizeof first);
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", dir, (char *)args[0], (char *)args[1], (char *)args[2],
                                (char *)args[3], NULL},
                     out, sizeof out),
                 0, "%s", out);
    cr_assert(memcmp(first, out, 1 + 40 + 1) == 0, "same seed, different text");
    cr_assert_eq(first[0], '\n', "default prompt is a newline");
    /* a flag's '-' spelling, an integer written as a number, and a count above its bound (taken as the bound:
     * --top_k of 5e9 keeps every token) give the same text as the plain spellings */
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", dir, "--prompt=abc", "--temperature", "0", "--length=2e1",
                                "--top-k", "5e9", NULL},
                     out, sizeof out),
                 0, "%s", out);
    cr_assert(memcmp(out, "abc", 3) == 0 && memcmp(out + 3, want, 20) == 0 && out[23] == '\n', "got %s", out);
    /* A prompt byte outside a 77-token vocabulary is refused with the reason. */
    model_layout_free(&l);
    struct model_layout small;
    char d2[64];
    tu_mkdtemp(d2, sizeof d2, "ckpt_test");
    ct_layout(&small, 77);
    ct_save_full(d2, &small, 1, 1, 0);
    cr_assert_eq(run((char *[]){(char *)tool(), "sample", d2, "--prompt", "zzz", NULL}, out, sizeof out), 1);
    cr_assert(strstr(out, "vocab_size 77"), "%s", out);
    tu_rm_tree(d2);
    model_layout_free(&small);
}

/* The end-to-end check: a sharded checkpoint (world 3, flat units) exported by fsdp-ckpt, loaded
 * by Debian's python3-torch into a PyTorch GPT-2 (tests/model/torch_ref.py), gives the logits that our
 * model computes from the same checkpoint read back at world 2. */
Test(ckpt_tool, exported_model_logits_match_pytorch, .timeout = 170)
{
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        cr_skip_test("Debian's /usr/bin/python3 with torch (python3-torch) is not installed");
    struct model_layout l;
    ct_layout(&l, 77);
    float *init = malloc(l.numel * sizeof *init);
    cr_assert_eq(model_init_params(&l, init), 0, "%s", error_message());
    /* Norm gains and biases start at 1 and 0: perturb them so a mix-up of tensors would show. */
    for (int p = 0; p < l.n_params; p++)
        if (l.params[p].init_std == 0)
            for (size_t i = 0; i < l.params[p].numel; i++)
                init[l.params[p].offset + i] += 0.1f * ct_value(&l, CKPT_EXP_AVG, p, i, 3);
    /* Pieces of world 3, version 1, the param kind taken from init. */
    for (int r = 0; r < 3; r++) {
        struct ct_pieces ps = {0};
        ct_rank_pieces(&ps, &l, 1, r, 3, 1);
        for (size_t i = 0; i < ps.n; i++)
            if (ps.v[i].kind == CKPT_PARAM)
                memcpy((float *)ps.v[i].data, init + l.params[ps.v[i].param].offset + ps.v[i].begin,
                       ps.v[i].count * sizeof(float));
        cr_assert_eq(ckpt_sharded_write_rank(dir, 30, r, &l, ps.v, ps.n), 0, "%s", error_message());
        ct_free(&ps);
    }
    struct ckpt_state st;
    ct_state(&st, &l, 30, 3, 1);
    cr_assert_eq(ckpt_sharded_commit(dir, 30, 3, &l, &st, 0), 0, "%s", error_message());

    char wpath[128], bpath[128], opath[128], cmd[1024];
    snprintf(wpath, sizeof wpath, "%s/export.safetensors", dir);
    snprintf(bpath, sizeof bpath, "%s/batch.safetensors", dir);
    snprintf(opath, sizeof opath, "%s/torch_out.safetensors", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, wpath, NULL}, out, sizeof out), 0, "%s", out);
    enum { B = 2, T = 16 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 37 + 11) % 77;
        tgt[i] = (i * 53 + 5) % 77;
    }
    struct safetensors_entry be[2] = {
        {.name = "tokens", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {B, T}, .data = tok},
        {.name = "targets", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {B, T}, .data = tgt},
    };
    cr_assert_eq(safetensors_write(bpath, be, 2, NULL, 0, NULL, NULL), 0, "%s", error_message());
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 /usr/bin/python3 %s/tests/model/torch_ref.py --weights %s --batch %s --n_head %d "
             "--out %s >/dev/null",
             getenv("FSDP_SOURCE_ROOT"), wpath, bpath, l.config.n_head, opath);
    cr_assert_eq(system(cmd), 0, "torch_ref.py failed: %s", cmd);

    /* Our evaluation of the checkpoint, read as two ranks would. */
    const struct kernels *k = kernels_cpu();
    float *params = k->mem_alloc(l.numel * sizeof *params);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (int rank = 0; rank < 2; rank++) {
            size_t b, e;
            ct_v2_range(&l, p, rank, 2, &b, &e);
            cr_assert_eq(ckpt_read(r, CKPT_PARAM, p, b, e - b, params + l.params[p].offset + b), 0, "%s",
                         error_message());
        }
    ckpt_close(r);
    cr_assert(memcmp(params, init, l.numel * sizeof *params) == 0, "params differ after the round trip");
    struct model *m;
    cr_assert_eq(model_create(&m, &l.config, k, B, T), 0, "%s", error_message());
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    float loss;
    cr_assert_eq(model_forward(m, params, &loss), 0, "%s", error_message());
    const float *lg = model_logits(m);

    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, opath), 0, "%s", error_message());
    const struct safetensors_tensor *lt = safetensors_find(f, "logits");
    cr_assert_not_null(lt);
    cr_assert_eq(lt->numel, (uint64_t)B * T * 77);
    float *ref = malloc(lt->end - lt->begin);
    cr_assert_eq(safetensors_read(f, lt, 0, ref, lt->end - lt->begin), 0);
    double num = 0, den = 0;
    for (int i = 0; i < B * T; i++)
        for (int v = 0; v < 77; v++) {
            double a = lg[(size_t)i * l.vocab_padded + v], b = ref[(size_t)i * 77 + v];
            num += (a - b) * (a - b);
            den += b * b;
        }
    double rel = sqrt(num / den);
    cr_assert_leq(rel, 1e-5, "logits: relative error %.3g vs PyTorch", rel);
    float ref_loss;
    cr_assert_eq(safetensors_read(f, safetensors_find(f, "loss"), 0, &ref_loss, 4), 0);
    cr_assert_leq(fabs(loss - ref_loss) / fabs(ref_loss), 1e-5, "loss %.9g vs torch %.9g", loss, ref_loss);
    cr_log_info("logits vs PyTorch: relative error %.3g, loss %.6f vs %.6f", rel, loss, ref_loss);
    safetensors_close(f);
    free(ref);
    model_destroy(m);
    k->mem_free(params);
    free(init);
    model_layout_free(&l);
}

static void read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no %s", path);
    buf[fread(buf, 1, cap - 1, f)] = 0;
    fclose(f);
}

static int count_shards(const char *d)
{
    DIR *dd = opendir(d);
    struct dirent *e;
    int n = 0;
    while (dd && (e = readdir(dd)))
        n += strncmp(e->d_name, "model-", 6) == 0;
    if (dd)
        closedir(dd);
    return n;
}

/* export to a directory: config.json, one model.safetensors under GPT2LMHeadModel's names, or shards and
 * an index past --max_shard_size (a later export with fewer shards removes the stale ones); the model
 * loads back exactly through the Hugging Face reader; the files get the user's umask (also merge's). */
Test(ckpt_tool, export_hugging_face_directory_sharded_and_not)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 12, 2, 2, 5, 0);
    char out_dir[128], path[256], text[1 << 14];
    snprintf(out_dir, sizeof out_dir, "%s/hf", dir);
    mode_t old = umask(027);
    int rc = run((char *[]){(char *)tool(), "export", dir, out_dir, "--max_shard_size", "20KB", NULL}, out, sizeof out);
    umask(old);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "sharded") && strstr(out, "config.json"), "%s", out);
    int shards = count_shards(out_dir);
    cr_assert_gt(shards, 2, "20 KB shards of a %zu-parameter model: %d", l.numel_real, shards);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    read_text(path, text, sizeof text);
    char want[96];
    snprintf(want, sizeof want, "\"transformer.h.1.mlp.c_fc.weight\":\t\"model-");
    cr_assert(strstr(text, "\"weight_map\"") && strstr(text, "\"total_size\"") && strstr(text, want), "%s", text);
    snprintf(want, sizeof want, "-of-%05d.safetensors\"", shards);
    cr_assert(strstr(text, want), "%s", text);
    struct stat st;
    snprintf(path, sizeof path, "%s/model-00001-of-%05d.safetensors", out_dir, shards);
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    cr_assert_eq(st.st_mode & 0777, 0640, "export under umask 027 made mode %03o", (unsigned)(st.st_mode & 0777));
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0640, "config.json mode %03o", (unsigned)(st.st_mode & 0777));
    float *got = malloc(l.numel * sizeof *got);
    cr_assert_eq(model_weights_load(&l, out_dir, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++)
            cr_assert_eq(got[l.params[p].offset + i], ct_value(&l, CKPT_PARAM, p, i, 5), "%s[%zu]", l.params[p].name, i);

    /* again without a limit: one file, the shards and the index of the first export gone */
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, out_dir, NULL}, out, sizeof out), 0, "%s", out);
    cr_assert_eq(count_shards(out_dir), 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    cr_assert(!tu_exists(path));
    memset(got, 0, l.numel * sizeof *got);
    cr_assert_eq(model_weights_load(&l, out_dir, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++)
            cr_assert_eq(got[l.params[p].offset + i], ct_value(&l, CKPT_PARAM, p, i, 5));
    /* export from the Hugging Face directory itself (bf16) reads it back within bf16 rounding */
    char out2[128];
    snprintf(out2, sizeof out2, "%s/hf_bf16", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", out_dir, out2, "--dtype", "bf16", NULL}, out, sizeof out), 0,
                 "%s", out);
    snprintf(path, sizeof path, "%s/config.json", out2);
    read_text(path, text, sizeof text);
    cr_assert(strstr(text, "\"dtype\":\t\"bfloat16\""), "%s", text);
    cr_assert_eq(model_weights_load(&l, out2, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++) {
            float w = ct_value(&l, CKPT_PARAM, p, i, 5);
            cr_assert(fabsf(got[l.params[p].offset + i] - w) <= fabsf(w) / 128, "%s[%zu]", l.params[p].name, i);
        }
    free(got);
    /* merge's single file, also under the umask */
    snprintf(path, sizeof path, "%s/merged.safetensors", dir);
    old = umask(077);
    rc = run((char *[]){(char *)tool(), "merge", dir, path, NULL}, out, sizeof out);
    umask(old);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "merge under umask 077 made mode %03o", (unsigned)(st.st_mode & 0777));
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, out2, "--max_shard_size", "5 parsecs", NULL}, out,
                     sizeof out),
                 2);
    cr_assert(strstr(out, "--max_shard_size: '5 parsecs' is not a size such as 5GB"), "%s", out);
    model_layout_free(&l);
}

/* The tokenizer travels: --tokenizer (or the one in the checkpoint) is copied into the export, and its
 * end-of-text id becomes config.json's eos/bos. */
Test(ckpt_tool, export_copies_the_tokenizer)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 3, 1, 0);
    char tok[128], out_dir[128], path[256], text[4096];
    snprintf(tok, sizeof tok, "%s/my_tokenizer.json", dir);
    FILE *f = fopen(tok, "w");
    fputs("{\"added_tokens\":[{\"id\":76,\"content\":\"<|endoftext|>\",\"special\":true}],\"model\":{\"type\":\"BPE\"}}", f);
    fclose(f);
    snprintf(out_dir, sizeof out_dir, "%s/hf", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, out_dir, "--tokenizer", tok, NULL}, out, sizeof out), 0,
                 "%s", out);
    cr_assert(strstr(out, "tokenizer"), "%s", out);
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    read_text(path, text, sizeof text);
    cr_assert(strstr(text, "<|endoftext|>"), "%s", text);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    read_text(path, text, sizeof text);
    cr_assert(strstr(text, "\"eos_token_id\":\t76"), "%s", text);
    model_layout_free(&l);
}

/* eval: the loss the JSON reports is the mean loss the model computes on the same consecutive windows. */
Test(ckpt_tool, eval_reports_the_mean_loss_as_json)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 9, 2, 2, 3, 0);
    enum { B = 2, T = 16, STEPS = 3, N = B * T * STEPS + 1 };
    uint16_t tokens[N + 40];
    for (int i = 0; i < N + 40; i++)
        tokens[i] = (uint16_t)((i * 31 + 7) % 77);
    char data[128], json[128];
    snprintf(data, sizeof data, "%s/val.bin", dir);
    snprintf(json, sizeof json, "%s/eval.json", dir);
    FILE *f = fopen(data, "wb");
    fwrite(tokens, 2, N + 40, f);
    fclose(f);
    char target[128];
    snprintf(target, sizeof target, "%s:latest", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "eval", target, "--data", data, "--steps", "3", "--batch", "2", "--json",
                                json, NULL},
                     out, sizeof out),
                 0, "%s", out);
    char text[2048];
    read_text(json, text, sizeof text);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o, "%s", text);
    double loss = cJSON_GetObjectItem(o, "loss")->valuedouble;
    cr_assert_eq(cJSON_GetObjectItem(o, "tokens")->valuedouble, B * T * STEPS);
    cr_assert_eq(cJSON_GetObjectItem(o, "step")->valuedouble, 9);
    cJSON_Delete(o);

    const struct kernels *k = kernels_cpu();
    float *params = k->mem_alloc(l.numel * sizeof *params);
    for (int p = 0; p < l.n_params; p++)
        ct_fill(&l, CKPT_PARAM, p, 0, l.params[p].numel, params + l.params[p].offset, 3);
    struct model *m;
    cr_assert_eq(model_create(&m, &l.config, k, B, T), 0, "%s", error_message());
    double sum = 0;
    for (int s = 0; s < STEPS; s++) {
        int32_t tok[B * T], tgt[B * T];
        for (int i = 0; i < B * T; i++) {
            tok[i] = tokens[s * B * T + i];
            tgt[i] = tokens[s * B * T + i + 1];
        }
        float lo;
        cr_assert_eq(model_set_batch(m, tok, tgt), 0);
        cr_assert_eq(model_forward(m, params, &lo), 0);
        sum += lo;
    }
    cr_assert(fabs(loss - sum / STEPS) <= 1e-6 * fabs(loss), "eval %.9g vs %.9g", loss, sum / STEPS);
    /* the default: every whole window of the file; a file too short for one batch is an error */
    cr_assert_eq(run((char *[]){(char *)tool(), "eval", target, "--data", data, "--batch", "2", NULL}, out, sizeof out),
                 0, "%s", out);
    cr_assert(strstr(out, "loss ") && strstr(out, "4 batch(es) of 2 x 16"), "%s", out);
    cr_assert_eq(run((char *[]){(char *)tool(), "eval", target, "--data", data, "--batch", "100", NULL}, out,
                     sizeof out),
                 1);
    cr_assert(strstr(out, "lower --batch"), "%s", out);
    model_destroy(m);
    k->mem_free(params);
    model_layout_free(&l);
}

/* run() with the child's address space capped (RLIMIT_AS), so a tool that sizes an allocation from a hostile
 * file fails inside the cap instead of driving the host into OOM. ASan reserves terabytes of shadow memory
 * up front: no cap there (the checks that keep the allocation small are the same). */
static int run_capped(char *const argv[], char *buf, size_t cap, size_t bytes)
{
#if !defined(__SANITIZE_ADDRESS__)
    struct rlimit old;
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    struct rlimit lim = {.rlim_cur = bytes, .rlim_max = old.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0, "setrlimit: %s", strerror(errno));
    int rc = run(argv, buf, cap); /* the child inherits the cap; this process only forks and reads a pipe */
    cr_assert_eq(setrlimit(RLIMIT_AS, &old), 0);
    return rc;
#else
    (void)bytes;
    return run(argv, buf, cap);
#endif
}

/* Sets key of DIR/config.json to the number v (the rest of the file as exported). */
static void set_config_number(const char *hf, const char *key, double v)
{
    char path[256], text[1 << 14];
    snprintf(path, sizeof path, "%s/config.json", hf);
    read_text(path, text, sizeof text);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o, "%s", text);
    cJSON_DeleteItemFromObject(o, key);
    cJSON_AddNumberToObject(o, key, v);
    char *s = cJSON_Print(o);
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
    free(s);
    cJSON_Delete(o);
}

/* A hostile config.json: sizes past [model]'s bounds are refused as model.init_from refuses them, and sizes
 * inside the bounds that the weights do not have are refused by the tensor check; both before the model's
 * memory is allocated (the 1 GiB cap would turn that into "out of memory"), with exit 1 and a message
 * naming config.json and the key. n_layer 10^9 used to allocate the layout's tables and then the weights. */
Test(ckpt_tool, eval_and_sample_refuse_a_hostile_config_json, .timeout = 60)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 3, 1, 0);
    char hf[128], data[128];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, hf, NULL}, out, sizeof out), 0, "%s", out);
    snprintf(data, sizeof data, "%s/val.bin", dir);
    uint16_t tokens[200];
    for (int i = 0; i < 200; i++)
        tokens[i] = (uint16_t)(i % 77);
    FILE *f = fopen(data, "wb");
    fwrite(tokens, 2, 200, f);
    fclose(f);
    const size_t cap = (size_t)1 << 30;
    static const struct {
        const char *key;
        double v;
        const char *says, *names; /* names: the file the message names */
    } cases[] = {
        {"n_layer", 1e9, "n_layer", "config.json"},
        /* 1e8, not 1e9: the GPT-2 reader computes 4 n_embd (n_inner) in an int before any check can run
         * (worker/model/model_gpt2_hf.c; UBSan stops there) */
        {"n_embd", 1e8, "n_embd", "config.json"},
        {"vocab_size", 2e9, "vocab_size", "config.json"},
        /* inside the bounds: layers the file does not have, then shapes it does not have */
        {"n_layer", 1000, "'h.2.", "/hf"},
        {"n_embd", 60000, "n_embd", "/hf"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, hf, NULL}, out, sizeof out), 0, "%s", out);
        set_config_number(hf, cases[c].key, cases[c].v);
        int rc = run_capped((char *[]){(char *)tool(), "eval", hf, "--data", data, "--batch", "1", NULL}, out,
                            sizeof out, cap);
        cr_assert_eq(rc, 1, "eval with %s = %g exited %d: %s", cases[c].key, cases[c].v, rc, out);
        cr_assert(strstr(out, cases[c].names) && strstr(out, cases[c].says) && !strstr(out, "out of memory"),
                  "eval with %s = %g: %s", cases[c].key, cases[c].v, out);
        rc = run_capped((char *[]){(char *)tool(), "sample", hf, "--prompt", "ab", "--length", "2", NULL}, out,
                        sizeof out, cap);
        cr_assert_eq(rc, 1, "sample with %s = %g exited %d: %s", cases[c].key, cases[c].v, rc, out);
        cr_assert(strstr(out, cases[c].names) && strstr(out, cases[c].says) && !strstr(out, "out of memory"),
                  "sample with %s = %g: %s", cases[c].key, cases[c].v, out);
    }
    model_layout_free(&l);
}

/* A full checkpoint of ct_fill's values except one element of parameter bad_p, set to bad. */
static void save_full_with(const char *root, const struct model_layout *l, int bad_p, size_t bad_i, float bad)
{
    struct ckpt_full_writer *w;
    cr_assert_eq(ckpt_full_open(root, 4, l, &w), 0, "%s", error_message());
    for (int p = l->n_params - 1; p >= 0; p--)
        for (int k = CKPT_KINDS - 1; k >= 0; k--) {
            float *t = malloc(l->params[p].numel * sizeof *t);
            ct_fill(l, k, p, 0, l->params[p].numel, t, 1);
            if (p == bad_p && k == CKPT_PARAM)
                t[bad_i] = bad;
            cr_assert_eq(ckpt_full_put(w, k, p, t), 0, "%s", error_message());
            free(t);
        }
    struct ckpt_state s;
    ct_state(&s, l, 4, 1, 2);
    cr_assert_eq(ckpt_full_commit(w, &s, 0), 0, "%s", error_message());
}

/* Weights holding NaN or an infinity: eval used to print `loss nan` and exit 0; eval and sample now exit 1
 * naming the tensor and the element. */
Test(ckpt_tool, eval_and_sample_refuse_non_finite_weights)
{
    struct model_layout l;
    ct_layout(&l, 77);
    char data[128], want[160];
    snprintf(data, sizeof data, "%s/val.bin", dir);
    uint16_t tokens[200];
    for (int i = 0; i < 200; i++)
        tokens[i] = (uint16_t)(i % 77);
    FILE *f = fopen(data, "wb");
    fwrite(tokens, 2, 200, f);
    fclose(f);
    const int bad_p = 3;
    const float bads[2] = {NAN, -INFINITY};
    const char *says[2] = {"holds NaN at element 5 ", "holds an infinity at element 5 "};
    for (int c = 0; c < 2; c++) {
        char root[128], target[160];
        snprintf(root, sizeof root, "%s/ck%d", dir, c);
        save_full_with(root, &l, bad_p, 5, bads[c]);
        snprintf(target, sizeof target, "%s:latest", root);
        snprintf(want, sizeof want, "tensor '%s' %s", l.params[bad_p].name, says[c]);
        int rc = run((char *[]){(char *)tool(), "eval", target, "--data", data, "--batch", "1", NULL}, out, sizeof out);
        cr_assert_eq(rc, 1, "eval of non-finite weights exited %d: %s", rc, out);
        cr_assert(strstr(out, want) && !strstr(out, "loss nan"), "want \"%s\": %s", want, out);
        rc = run((char *[]){(char *)tool(), "sample", target, "--length", "2", NULL}, out, sizeof out);
        cr_assert_eq(rc, 1, "sample of non-finite weights exited %d: %s", rc, out);
        cr_assert(strstr(out, want), "want \"%s\": %s", want, out);
    }
    model_layout_free(&l);
}

/* An export killed before its renames leaves "<name>.tmp.<hex>" files as large as the model; the next
 * export into the directory removes those of its own names (not other files that look alike). A failed
 * export (here: --tokenizer names no file, found after the weights were written) removes the directories
 * it created instead of leaving them, empty or half-filled. */
Test(ckpt_tool, export_cleans_its_temp_files_and_a_failed_export_its_directory)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 3, 1, 0);
    char hf[128], path[256];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    cr_assert_eq(mkdir(hf, 0755), 0);
    static const char *const stale[] = {"model.safetensors.tmp.1f2e3d", "config.json.tmp.abc",
                                        "model-00001-of-00003.safetensors.tmp.77",
                                        "model.safetensors.index.json.tmp.0"};
    static const char *const kept[] = {"notes.tmp.1", "model.safetensors.tmp.mine", "mine.txt"};
    for (size_t i = 0; i < sizeof stale / sizeof *stale; i++) {
        snprintf(path, sizeof path, "%s/%s", hf, stale[i]);
        FILE *f = fopen(path, "w");
        fputs("partial", f);
        fclose(f);
    }
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        snprintf(path, sizeof path, "%s/%s", hf, kept[i]);
        FILE *f = fopen(path, "w");
        fputs("user", f);
        fclose(f);
    }
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, hf, NULL}, out, sizeof out), 0, "%s", out);
    for (size_t i = 0; i < sizeof stale / sizeof *stale; i++) {
        snprintf(path, sizeof path, "%s/%s", hf, stale[i]);
        cr_assert(!tu_exists(path), "%s was kept", path);
    }
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        snprintf(path, sizeof path, "%s/%s", hf, kept[i]);
        cr_assert(tu_exists(path), "%s (not an export's) was removed", path);
    }
    /* the bare-file export cleans its own temp names beside the file */
    char file[160], ftmp[192];
    snprintf(file, sizeof file, "%s/one.safetensors", dir);
    snprintf(ftmp, sizeof ftmp, "%s.tmp.9a", file);
    FILE *f = fopen(ftmp, "w");
    fputs("partial", f);
    fclose(f);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, file, NULL}, out, sizeof out), 0, "%s", out);
    cr_assert(!tu_exists(ftmp) && tu_exists(file), "%s", out);

    /* a failed export into a new directory (two levels) leaves neither */
    char fresh[160], parent[128];
    snprintf(parent, sizeof parent, "%s/new", dir);
    snprintf(fresh, sizeof fresh, "%s/new/hf", dir);
    int rc = run((char *[]){(char *)tool(), "export", dir, fresh, "--tokenizer", "/nonexistent/tokenizer.json", NULL},
                 out, sizeof out);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "/nonexistent/tokenizer.json"), "%s", out);
    cr_assert(!tu_exists(fresh) && !tu_exists(parent), "a failed export left %s: %s", fresh, out);
    /* into an existing directory: the directory and its earlier export stay */
    rc = run((char *[]){(char *)tool(), "export", dir, hf, "--tokenizer", "/nonexistent/tokenizer.json", NULL}, out,
             sizeof out);
    cr_assert_eq(rc, 1, "%s", out);
    snprintf(path, sizeof path, "%s/config.json", hf);
    cr_assert(tu_exists(path), "a failed export removed an earlier export's %s", path);
    model_layout_free(&l);
}

/* A FIFO in place of a rank file of a sharded checkpoint, or of a Hugging Face directory's
 * weight shards: open(2) of a FIFO without a writer blocks forever, so the tools hung; now they refuse
 * it, naming the file. */
Test(ckpt_tool, fifo_as_a_shard_is_refused, .timeout = 60)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 12, 2, 2, 5, 0);
    char hf[128], target[160], shard[256], weights[256];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    cr_assert_eq(run((char *[]){(char *)tool(), "export", dir, hf, "--max_shard_size", "20KB", NULL}, out, sizeof out),
                 0, "%s", out);
    snprintf(target, sizeof target, "%s/fsdp_sharded_cpt12", dir);
    snprintf(shard, sizeof shard, "%s/fsdp_sharded_cpt12_rank1", target);
    cr_assert(tu_exists(shard), "no %s", shard);
    cr_assert_eq(unlink(shard), 0);
    cr_assert_eq(mkfifo(shard, 0644), 0, "mkfifo: %s", strerror(errno));
    int rc = run_with_alarm((char *[]){(char *)tool(), "inspect", target, NULL}, out, sizeof out, 20);
    cr_assert_neq(rc, 128 + SIGALRM, "fsdp-ckpt inspect hung on the FIFO %s", shard);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, shard) && strstr(out, "not a regular file"), "%s", out);
    snprintf(weights, sizeof weights, "%s/model-00002-of-%05d.safetensors", hf, count_shards(hf));
    cr_assert_eq(unlink(weights), 0, "%s: %s", weights, strerror(errno));
    cr_assert_eq(mkfifo(weights, 0644), 0, "mkfifo: %s", strerror(errno));
    rc = run_with_alarm((char *[]){(char *)tool(), "sample", hf, "--length", "2", NULL}, out, sizeof out, 20);
    cr_assert_neq(rc, 128 + SIGALRM, "fsdp-ckpt sample hung on the FIFO %s", weights);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, weights) && strstr(out, "not a regular file"), "%s", out);
    model_layout_free(&l);
}

/* A FIFO as eval's --data token file: refused by its type, naming it, not waited on for a writer. */
Test(ckpt_tool, fifo_as_eval_data_is_refused, .timeout = 60)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 9, 2, 2, 3, 0);
    char data[128], target[128];
    snprintf(data, sizeof data, "%s/val.fifo", dir);
    cr_assert_eq(mkfifo(data, 0644), 0, "mkfifo: %s", strerror(errno));
    snprintf(target, sizeof target, "%s:latest", dir);
    int rc = run_with_alarm((char *[]){(char *)tool(), "eval", target, "--data", data, "--steps", "1", "--batch", "2",
                                       NULL},
                            out, sizeof out, 20);
    cr_assert_neq(rc, 128 + SIGALRM, "fsdp-ckpt eval hung on the FIFO %s", data);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, data) && strstr(out, "is not a regular file (it is a FIFO)"), "%s", out);
    model_layout_free(&l);
}
