/* fsdp-worker's schema and the real fsdp-worker binary: defaults are valid, the accelerate-style flags
 * reach the right keys, cross-key checks name their keys, --print-config round-trips through the
 * binary, training without data.train_file fails before any work (exit 2), and docs/config.md is what the schema generates
 * (docs/environment.md what `--help-env` prints). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "tests/util/tu_file.h"
#include "worker/config/worker_config.h"
#include "worker/model/model.h"

static struct config *make(void)
{
    struct config *cfg = NULL;
    cr_assert_eq(config_create(worker_config_schema(), &cfg), 0, "%s", error_message());
    return cfg;
}

Test(worker_config, defaults_are_a_small_valid_model)
{
    struct config *cfg = make();
    struct worker_config wc;
    cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s", error_message());
    cr_assert_eq(wc.model.n_layer, 4);
    cr_assert_eq(wc.model.n_embd, 128);
    cr_assert_eq(wc.model.n_head, 4);
    cr_assert_eq(wc.model.vocab_size, 256);
    cr_assert_eq(wc.model.block_size, 128);
    cr_assert_float_eq(wc.model.init_std, 0.02, 1e-15);
    cr_assert_eq(wc.fsdp.version, 2);
    cr_assert_eq(wc.fsdp.sharding_strategy, WORKER_FULL_SHARD);
    cr_assert_eq(wc.fsdp.auto_wrap_policy, WORKER_WRAP_TRANSFORMER);
    cr_assert_str_eq(wc.fsdp.transformer_layer_cls_to_wrap, "DecoderBlock");
    cr_assert_str_eq(wc.log.dir, "./runs/<run_id>");
    cr_assert_str_eq(wc.model.init_from, "");
    config_destroy(cfg);
}

/* Each flat flag as accelerate / SimpleTuner users write it, the key it must set and the canonical value. */
static const struct {
    const char *arg, *section, *key, *want;
} flat[] = {
    {"--fsdp_version=1", "fsdp", "version", "1"},
    {"--fsdp_state_dict_type=sharded", "checkpoint", "state_dict_type", "SHARDED_STATE_DICT"},
    {"--fsdp_state_dict_type=full", "checkpoint", "state_dict_type", "FULL_STATE_DICT"},
    {"--fsdp_auto_wrap_policy=transformer", "fsdp", "auto_wrap_policy", "TRANSFORMER_BASED_WRAP"},
    {"--fsdp_auto_wrap_policy=size_based_wrap", "fsdp", "auto_wrap_policy", "SIZE_BASED_WRAP"},
    {"--fsdp_sharding_strategy=1", "fsdp", "sharding_strategy", "FULL_SHARD"},
    {"--fsdp_sharding_strategy=2", "fsdp", "sharding_strategy", "SHARD_GRAD_OP"},
    {"--fsdp_sharding_strategy=3", "fsdp", "sharding_strategy", "NO_SHARD"},
    {"--fsdp_sharding_strategy=4", "fsdp", "sharding_strategy", "HYBRID_SHARD"},
    {"--fsdp_sharding_strategy=5", "fsdp", "sharding_strategy", "HYBRID_SHARD_ZERO2"},
    {"--fsdp_sharding_strategy=hybrid-shard", "fsdp", "sharding_strategy", "HYBRID_SHARD"},
    {"--fsdp_backward_prefetch", "fsdp", "backward_prefetch", "BACKWARD_PRE"},
    {"--fsdp_backward_prefetch=NO_PREFETCH", "fsdp", "backward_prefetch", "NO_PREFETCH"},
    {"--fsdp_offload_params", "fsdp", "offload_params", "true"},
    {"--fsdp_cpu_ram_efficient_loading", "checkpoint", "cpu_ram_efficient_loading", "true"},
    {"--fsdp_sync_module_states=false", "fsdp", "sync_module_states", "false"},
    {"--fsdp_forward_prefetch", "fsdp", "forward_prefetch", "true"},
    {"--fsdp_transformer_layer_cls_to_wrap=Block", "fsdp", "transformer_layer_cls_to_wrap", "Block"},
    {"--fsdp_min_num_params=1000", "fsdp", "min_num_params", "1000"},
    {"--fsdp_reshard_after_forward=no", "fsdp", "reshard_after_forward", "false"},
    {"--mixed_precision=bf16", "fsdp", "mixed_precision", "bf16"},
    {"--mixed_precision=no", "fsdp", "mixed_precision", "fp32"},
    {"--resume_from=latest", "checkpoint", "resume_from", "latest"},
    {"--learning_rate=0.001", "optim", "lr", "0.001"},
    {"--seed=7", "train", "seed", "7"},
    {"--FSDP-VERSION=1", "fsdp", "version", "1"},
    {"--context_parallel_size=2", "fsdp", "context_parallel_size", "2"},
    {"--context-parallel-size=4", "fsdp", "context_parallel_size", "4"},
    {"--context_parallel_comm_strategy=alltoall", "fsdp", "context_parallel_comm_strategy", "alltoall"},
    {"--Context-Parallel-Comm-Strategy=ALLGATHER", "fsdp", "context_parallel_comm_strategy", "allgather"},
    {"--context_parallel_comm_strategy=ulysses", "fsdp", "context_parallel_comm_strategy", "alltoall"},
};

Test(worker_config, accelerate_flags_map_to_their_keys)
{
    for (size_t i = 0; i < sizeof flat / sizeof flat[0]; i++) {
        char *argv[] = {"fsdp-worker", (char *)flat[i].arg, NULL};
        struct config_cli cli;
        cr_assert_eq(config_cli_parse(worker_config_schema(), 2, argv, &cli), 0, "%s: %s", flat[i].arg,
                     error_message());
        struct config *cfg = make();
        cr_assert_eq(config_cli_apply(&cli, cfg), 0, "%s: %s", flat[i].arg, error_message());
        char *out = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&out, &len);
        config_print_ini(cfg, f);
        fclose(f);
        /* Look for "key = want" inside the key's own section of the printed config. */
        char header[64], line[256];
        snprintf(header, sizeof header, "\n[%s]\n", flat[i].section);
        snprintf(line, sizeof line, "\n%s = %s\n", flat[i].key, flat[i].want);
        const char *sec = strstr(out, header);
        cr_assert_not_null(sec, "%s", flat[i].arg);
        const char *next = strstr(sec + 1, "\n[");
        const char *hit = strstr(sec, line);
        cr_assert(hit && (!next || hit < next), "%s did not give %s.%s = %s:\n%s", flat[i].arg, flat[i].section,
                  flat[i].key, flat[i].want, out);
        free(out);
        config_destroy(cfg);
        config_cli_free(&cli);
    }
}

static void expect_invalid(const char *name, const char *value, const char *needle)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, name, value), 0, "%s=%s: %s", name, value, error_message());
    struct worker_config wc;
    cr_assert_eq(worker_config_view(cfg, &wc), FSDP_EINVAL, "%s=%s accepted", name, value);
    cr_assert(strstr(error_message(), needle), "%s=%s: message lacks \"%s\": %s", name, value, needle,
              error_message());
    config_destroy(cfg);
}

Test(worker_config, cross_key_checks_name_the_keys)
{
    expect_invalid("model.n_head", "3", "model.n_embd (128) must be a multiple of model.n_head (3)");
    expect_invalid("train.micro_batch", "32", "train.micro_batch (32) must be at most train.train_batch (16)");
    expect_invalid("optim.min_lr", "0.1", "optim.min_lr (0.1) must be at most optim.lr (0.0006)");
    expect_invalid("optim.lr", "0", "optim.lr must be above 0");
    expect_invalid("optim.beta2", "1", "optim.beta2 (1) must be below 1");
    expect_invalid("fsdp.hybrid_shard_size", "2", "fsdp.hybrid_shard_size (2) applies only to");
    expect_invalid("fsdp.transformer_layer_cls_to_wrap", "", "needs fsdp.transformer_layer_cls_to_wrap");
}

/* Sets name=value pairs (NULL-terminated) and expects worker_config_view to refuse with every needle. */
static void expect_invalid_set(const char *const *kv, const char *const *needles)
{
    struct config *cfg = make();
    for (int i = 0; kv[i]; i += 2)
        cr_assert_eq(config_set(cfg, kv[i], kv[i + 1]), 0, "%s=%s: %s", kv[i], kv[i + 1], error_message());
    struct worker_config wc;
    cr_assert_eq(worker_config_view(cfg, &wc), FSDP_EINVAL, "%s=%s ... accepted", kv[0], kv[1]);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(error_message(), needles[i]), "%s=%s: message lacks \"%s\": %s", kv[0], kv[1], needles[i],
                  error_message());
    config_destroy(cfg);
}

Test(worker_config, context_parallel_checks_name_the_keys)
{
    expect_invalid_set((const char *[]){"fsdp.context_parallel_size", "2", "fsdp.version", "1", NULL},
                       (const char *[]){"Context parallelism requires FSDP2.", "fsdp.version = 1",
                                        "context_parallel_size = 1", NULL});
    expect_invalid_set((const char *[]){"fsdp.context_parallel_size", "2", "fsdp.enable", "false", NULL},
                       (const char *[]){"Context parallelism requires FSDP2.", "fsdp.enable = false", NULL});
    expect_invalid_set((const char *[]){"fsdp.context_parallel_size", "2", "fsdp.sharding_strategy", "NO_SHARD", NULL},
                       (const char *[]){"fsdp.context_parallel_size = 2", "NO_SHARD", "FULL_SHARD", NULL});
    expect_invalid_set((const char *[]){"fsdp.context_parallel_size", "3", "model.block_size", "128", NULL},
                       (const char *[]){"model.block_size = 128 is not divisible by 2 x fsdp.context_parallel_size = 6",
                                        "multiple of 6", "one of 1, 2, 4, 8, 16, 32, 64", NULL});
    expect_invalid_set((const char *[]){"fsdp.context_parallel_size", "8", "fsdp.context_parallel_comm_strategy",
                                        "alltoall", NULL},
                       (const char *[]){"model.n_head = 4 is not divisible by 8", "allgather", NULL});
    /* Llama's key/value heads split too */
    expect_invalid_set((const char *[]){"model.model_family", "llama", "model.n_kv_head", "2", "fsdp.context_parallel_size",
                                        "4", "fsdp.context_parallel_comm_strategy", "alltoall", NULL},
                       (const char *[]){"model.n_kv_head = 2 is not divisible by 4", "allgather", NULL});
    /* The same sizes pass where they hold. */
    const char *ok[][4] = {{"fsdp.context_parallel_size", "4", "fsdp.context_parallel_comm_strategy", "alltoall"},
                           {"fsdp.context_parallel_size", "8", "fsdp.context_parallel_comm_strategy", "allgather"},
                           {"fsdp.context_parallel_size", "1", "fsdp.version", "1"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct config *cfg = make();
        cr_assert_eq(config_set(cfg, ok[i][0], ok[i][1]), 0, "%s", error_message());
        cr_assert_eq(config_set(cfg, ok[i][2], ok[i][3]), 0, "%s", error_message());
        struct worker_config wc;
        cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s=%s %s=%s: %s", ok[i][0], ok[i][1], ok[i][2], ok[i][3],
                     error_message());
        config_destroy(cfg);
    }
}

Test(worker_config, model_family_unknown_lists_known)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "model.model_family", "mamba"), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "model.model_family: 'mamba' is not valid; expected one of: gpt2, llama"), "%s",
              error_message());
    /* Hugging Face's architecture names are aliases */
    cr_assert_eq(config_set(cfg, "model.model_family", "LlamaForCausalLM"), 0, "%s", error_message());
    cr_assert_str_eq(config_get_string(cfg, "model", "model_family"), "llama");
    config_destroy(cfg);
}

/* model_family's values, aliases and help are the model registry's: every family, in the registry's order
 * (the view's index is the family's place there), each Hugging Face architecture an alias of its family,
 * and the error for an unknown family lists exactly the registry's names. */
Test(worker_config, model_family_values_are_the_registry)
{
    const struct config_schema *s = worker_config_schema();
    int k = config_find_key(s, "model.model_family");
    cr_assert(k >= 0);
    const struct config_key *key = &s->keys[k];
    int n = model_family_count();
    cr_assert_geq(n, 4, "gpt2, llama, qwen2 and qwen3 at least");
    char listed[512] = "";
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(key->values[i], model_family_name(i), "value %d", i);
        snprintf(listed + strlen(listed), sizeof listed - strlen(listed), "%s%s", i ? ", " : "", key->values[i]);
        cr_assert(strstr(key->help, model_family_name(i)), "help does not name %s: %s", model_family_name(i),
                  key->help);
    }
    cr_assert_null(key->values[n], "more values than families");
    cr_assert_str_eq(listed, model_family_names());
    int aliases = 0;
    for (int i = 0; i < n; i++) {
        const char *arch = model_family_hf_architecture(i);
        if (!arch)
            continue;
        cr_assert_str_eq(key->value_aliases[aliases].from, arch);
        cr_assert_str_eq(key->value_aliases[aliases].to, model_family_name(i));
        aliases++;
        /* the alias selects the family: the view's index names it */
        struct config *cfg = make();
        cr_assert_eq(config_set(cfg, "model.model_family", arch), 0, "%s: %s", arch, error_message());
        struct worker_config wc;
        cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s: %s", arch, error_message());
        cr_assert_eq(wc.model.family, i, "%s", arch);
        cr_assert_str_eq(worker_model_family_name(wc.model.family), model_family_name(i));
        config_destroy(cfg);
    }
    cr_assert_null(key->value_aliases[aliases].from, "an alias that is not a family's architecture");
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "model.model_family", "mamba"), FSDP_EINVAL);
    char want[600];
    snprintf(want, sizeof want, "'mamba' is not valid; expected one of: %s (also ", listed);
    cr_assert(strstr(error_message(), want), "want \"%s\" in: %s", want, error_message());
    config_destroy(cfg);
    /* a key only some families read names them, from the registry, before its help */
    char readers[256], prefix[300];
    cr_assert_gt(model_families_reading("n_kv_head", readers, sizeof readers), 0);
    snprintf(prefix, sizeof prefix, "%s: ", readers);
    k = config_find_key(s, "model.n_kv_head");
    cr_assert_eq(strncmp(s->keys[k].help, prefix, strlen(prefix)), 0, "%s", s->keys[k].help);
}

/* The Llama keys: unset they take the family's defaults (0 = derived by the model); each bad combination
 * has its own message naming the keys; set for gpt2 they are refused, naming the key and where it was set. */
static void set_all(struct config *cfg, const char *const *kv)
{
    for (; kv[0]; kv += 2)
        cr_assert_eq(config_set(cfg, kv[0], kv[1]), 0, "%s=%s: %s", kv[0], kv[1], error_message());
}

static void expect_llama_invalid(const char *const *kv, const char *needle)
{
    struct config *cfg = make();
    set_all(cfg, kv);
    struct worker_config wc;
    cr_assert_eq(worker_config_view(cfg, &wc), FSDP_EINVAL, "%s=%s accepted", kv[0], kv[1]);
    cr_assert(strstr(error_message(), needle), "message lacks \"%s\": %s", needle, error_message());
    config_destroy(cfg);
}

Test(worker_config, llama_keys_defaults_and_values)
{
    struct config *cfg = make();
    struct worker_config wc;
    cr_assert_eq(config_set(cfg, "model.model_family", "llama"), 0);
    cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s", error_message());
    cr_assert_str_eq(worker_model_family_name(wc.model.family), "llama");
    cr_assert_eq(wc.model.n_kv_head, 0);
    cr_assert_eq(wc.model.intermediate_size, 0);
    cr_assert_float_eq(wc.model.rope_theta, 10000.0, 1e-9);
    cr_assert_float_eq(wc.model.rms_norm_eps, 1e-6, 1e-18);
    cr_assert(!wc.model.tie_word_embeddings);
    set_all(cfg, (const char *const[]){"model.n_kv_head", "2", "model.intermediate_size", "344", "model.rope_theta",
                                       "500000", "model.rms_norm_eps", "1e-5", "model.tie_word_embeddings", "true",
                                       NULL});
    cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s", error_message());
    cr_assert_eq(wc.model.n_kv_head, 2);
    cr_assert_eq(wc.model.intermediate_size, 344);
    cr_assert_float_eq(wc.model.rope_theta, 500000.0, 1e-9);
    cr_assert_float_eq(wc.model.rms_norm_eps, 1e-5, 1e-18);
    cr_assert(wc.model.tie_word_embeddings);
    /* an empty value unsets an optional key again (what --print-config writes for it) */
    cr_assert_eq(config_set(cfg, "model.n_kv_head", ""), 0, "%s", error_message());
    cr_assert(!config_is_set(cfg, "model", "n_kv_head"));
    /* keys with a default still refuse empty text */
    cr_assert_eq(config_set(cfg, "model.n_head", ""), FSDP_EINVAL);
    config_destroy(cfg);
    /* gpt2 is the default family: no Llama key is set */
    cfg = make();
    cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s", error_message());
    cr_assert_str_eq(worker_model_family_name(wc.model.family), "gpt2");
    config_destroy(cfg);
}

Test(worker_config, llama_cross_key_checks_name_the_keys)
{
    expect_llama_invalid((const char *const[]){"model.model_family", "llama", "model.n_kv_head", "3", NULL},
                         "model.n_kv_head (3) must divide model.n_head (4)");
    expect_llama_invalid((const char *const[]){"model.model_family", "llama", "model.n_head", "8", "model.n_embd",
                                               "120", NULL},
                         "the head size model.n_embd / model.n_head = 120 / 8 = 15 must be even");
    /* the Llama-style families share the checks (the registry's) */
    expect_llama_invalid((const char *const[]){"model.model_family", "qwen2", "model.n_kv_head", "3", NULL},
                         "model.n_kv_head (3) must divide model.n_head (4)");
    expect_llama_invalid((const char *const[]){"model.model_family", "qwen3", "model.head_dim", "15", NULL},
                         "model_family = qwen3: the head size model.head_dim = 15 must be even");
    expect_llama_invalid((const char *const[]){"model.model_family", "llama", "model.n_head", "3", NULL},
                         "model.n_embd (128) must be a multiple of model.n_head (3)");
    static const char *const llama_only[] = {"n_kv_head", "2", "intermediate_size", "300", "rope_theta", "1e6",
                                             "rms_norm_eps", "1e-5", "tie_word_embeddings", "false", NULL};
    for (const char *const *k = llama_only; k[0]; k += 2) {
        char key[64], want[256];
        snprintf(key, sizeof key, "model.%s", k[0]);
        snprintf(want, sizeof want, "%s applies only to model_family = llama, qwen2, qwen3 or mistral, but model_family is gpt2", key);
        expect_llama_invalid((const char *const[]){key, k[1], NULL}, want);
    }
    /* the window: Mistral's, Qwen2's and Qwen3's, not Llama's; max_window_layers Qwen2's and Qwen3's only, and
     * only with a window */
    expect_llama_invalid((const char *const[]){"model.model_family", "llama", "model.sliding_window", "64", NULL},
                         "model.sliding_window applies only to model_family = qwen2, qwen3 or mistral, "
                         "but model_family is llama; remove it or set model.model_family = qwen2");
    expect_llama_invalid((const char *const[]){"model.model_family", "mistral", "model.max_window_layers", "1", NULL},
                         "model.max_window_layers applies only to model_family = qwen2 or qwen3");
    expect_llama_invalid((const char *const[]){"model.model_family", "qwen2", "model.max_window_layers", "1", NULL},
                         "model.max_window_layers (1) needs model.sliding_window");

    /* from a file, the message names the file and line */
    char dir[] = "/tmp/fsdp-cfg-XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/gpt.ini", dir);
    cr_assert_eq(tu_write_text(path, "[model]\nn_layer = 2\nrope_theta = 500000\n"), 0);
    struct config *cfg = make();
    cr_assert_eq(config_load_file(cfg, path), 0, "%s", error_message());
    struct worker_config wc;
    cr_assert_eq(worker_config_view(cfg, &wc), FSDP_EINVAL);
    char want[160];
    snprintf(want, sizeof want, "model.rope_theta (%s line 3) applies only to model_family = llama, qwen2, qwen3 or mistral", path);
    cr_assert(strstr(error_message(), want), "%s", error_message());
    config_destroy(cfg);
    unlink(path);
    rmdir(dir);
}

/* ---- the real binary ------------------------------------------------------------------------------- */

struct run {
    int status; /* exit code, or 128 + signal */
    char out[65536], err[8192];
};

static void slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0, "%s", path);
    ssize_t n = read(fd, buf, cap - 1);
    buf[n < 0 ? 0 : n] = '\0';
    close(fd);
}

static void run_worker(struct run *r, const char *dir, const char *const *args)
{
    const char *root = getenv("FSDP_BUILD_ROOT");
    cr_assert_not_null(root, "FSDP_BUILD_ROOT is not set (run through meson test)");
    char exe[512], out_path[512], err_path[512];
    snprintf(exe, sizeof exe, "%s/worker/fsdp-worker", root);
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", dir);
    char *argv[32];
    int argc = 0;
    argv[argc++] = exe;
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        unsetenv("RANK");
        execv(exe, argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    cr_assert_neq(r->status, 127, "cannot exec %s", exe);
    slurp(out_path, r->out, sizeof r->out);
    slurp(err_path, r->err, sizeof r->err);
}

/* Drops the `; from ...` lines of --print-config. */
static void strip_origins(char *text)
{
    char *w = text;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
        if (line[0] != ';') {
            memmove(w, line, n);
            w += n;
        }
        line += n;
    }
    *w = 0;
}

static char *make_dir(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/cfgworkerXXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static void write_file(const char *path, const char *text)
{
    cr_assert_eq(tu_write_text(path, text), 0, "%s", path);
}

static void cleanup(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(worker_binary, print_config_round_trips_and_overrides_win, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256], printed[256];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    snprintf(printed, sizeof printed, "%s/printed.ini", dir);
    write_file(ini, "[model]\nn_layer = 2\n[train]\nmicro_batch = 2\n[fsdp]\nsharding_strategy = 2\n"
                    "[optim]\nlr = 0.001\n");
    static struct run r1, r2;
    const char *a1[] = {ini, "--train.micro_batch=8", "--fsdp_offload_params", "--print-config", NULL};
    run_worker(&r1, dir, a1);
    cr_assert_eq(r1.status, 0, "stderr: %s", r1.err);
    cr_assert(strstr(r1.out, "\nn_layer = 2\n"), "%s", r1.out);
    cr_assert(strstr(r1.out, "\nmicro_batch = 8\n"), "the command line must win over the file:\n%s", r1.out);
    cr_assert(strstr(r1.out, "\nsharding_strategy = SHARD_GRAD_OP\n"), "%s", r1.out);
    cr_assert(strstr(r1.out, "\noffload_params = true\n"), "%s", r1.out);
    char want[600];
    snprintf(want, sizeof want, "\n; from %s:2\nn_layer = 2\n", ini);
    cr_assert(strstr(r1.out, want), "each value not at its default says where it came from:\n%s", r1.out);
    cr_assert(strstr(r1.out, "\n; from command line\nmicro_batch = 8\n"), "%s", r1.out);
    cr_assert(strstr(r1.out, "\n[model]\nmodel_family = gpt2\n"), "defaults have no origin line:\n%s", r1.out);
    write_file(printed, r1.out);
    const char *a2[] = {printed, "--print-config", NULL};
    run_worker(&r2, dir, a2);
    cr_assert_eq(r2.status, 0, "stderr: %s", r2.err);
    strip_origins(r1.out);
    strip_origins(r2.out);
    cr_assert_str_eq(r1.out, r2.out, "print -> reload -> print must give the same values");
    cleanup(dir);
}

/* fsdp-launch hands an accelerate YAML's settings (under the INI file) and its own flags (over it) down in
 * FSDP_LAUNCH_CONFIG; the worker's own flags come last. */
Test(worker_binary, launch_config_layers_yaml_ini_command_line, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    write_file(ini, "[fsdp]\nversion = 1\nsharding_strategy = NO_SHARD\n");
    setenv("FSDP_LAUNCH_CONFIG",
           "{\"under_file\": [{\"key\": \"fsdp.version\", \"value\": \"2\", \"origin\": \"a.yaml:4 (fsdp_config.fsdp_version)\"},"
           " {\"key\": \"fsdp.offload_params\", \"value\": \"true\", \"origin\": \"a.yaml:5 (fsdp_config.fsdp_offload_params)\"},"
           " {\"key\": \"fsdp.sharding_strategy\", \"value\": \"SHARD_GRAD_OP\", \"origin\": \"a.yaml:6\"}],"
           " \"over_file\": [{\"key\": \"fsdp.sharding_strategy\", \"value\": \"HYBRID_SHARD\", \"origin\": \"fsdp-launch --fsdp_sharding_strategy\"},"
           " {\"key\": \"fsdp.mixed_precision\", \"value\": \"bf16\", \"origin\": \"fsdp-launch --mixed_precision\"}]}",
           1);
    static struct run r;
    const char *a[] = {ini, "--mixed_precision=fp16", "--print-config", NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    char want[600];
    snprintf(want, sizeof want, "; from %s:2\nversion = 1\n", ini);
    cr_assert(strstr(r.out, want), "the INI file wins over the YAML:\n%s", r.out);
    cr_assert(strstr(r.out, "; from a.yaml:5 (fsdp_config.fsdp_offload_params)\noffload_params = true\n"),
              "a YAML value the INI leaves alone stays:\n%s", r.out);
    cr_assert(strstr(r.out, "; from fsdp-launch --fsdp_sharding_strategy\nsharding_strategy = HYBRID_SHARD\n"),
              "the launcher's flags win over the INI file:\n%s", r.out);
    cr_assert(strstr(r.out, "; from command line\nmixed_precision = fp16\n"),
              "the worker's own flags win over everything:\n%s", r.out);

    setenv("FSDP_LAUNCH_CONFIG", "{\"under_file\": [{\"key\": \"fsdp.version\", \"value\": \"7\", "
                                 "\"origin\": \"a.yaml:4 (fsdp_config.fsdp_version)\"}]}", 1);
    const char *b[] = {ini, "--print-config", NULL};
    run_worker(&r, dir, b);
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "a.yaml:4 (fsdp_config.fsdp_version): bad value for fsdp.version"), "%s", r.err);
    unsetenv("FSDP_LAUNCH_CONFIG");
    cleanup(dir);
}

Test(worker_binary, missing_train_file_is_named_before_work, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    write_file(ini, "[train]\ndevice = cpu\nmax_steps = 5\n");
    static struct run r;
    const char *a[] = {ini, NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "data.train_file is not set"), "%s", r.err);
    cr_assert_str_eq(r.out, "", "no training output before the error");
    cleanup(dir);
}

Test(worker_binary, errors_name_file_line_key_and_suggestion, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256], want[512];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    write_file(ini, "[train]\nmax_steps = 5\nmicro_bach = 2\n");
    static struct run r;
    const char *a[] = {ini, "--print-config", NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    snprintf(want, sizeof want, "%s:3: unknown key 'micro_bach' in [train]; did you mean 'train.micro_batch'?", ini);
    cr_assert(strstr(r.err, want), "%s", r.err);
    cr_assert_str_eq(r.out, "");

    const char *b[] = {ini, "--fsdp_sharding_strategy=9", NULL};
    write_file(ini, "[train]\nmax_steps = 5\n");
    run_worker(&r, dir, b);
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "bad value for fsdp.sharding_strategy: '9' is not valid; expected one of: FULL_SHARD"),
              "%s", r.err);

    const char *c[] = {ini, "--fsdp_verison=2", NULL};
    run_worker(&r, dir, c);
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "unknown option '--fsdp_verison'; did you mean '--fsdp_version'?"), "%s", r.err);

    const char *d[] = {ini, "--model.n_head=5", NULL};
    run_worker(&r, dir, d);
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "model.n_embd (128) must be a multiple of model.n_head (5)"), "%s", r.err);
    cleanup(dir);
}

Test(worker_binary, log_level_flag_applies, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    write_file(ini, "[train]\ndevice = cpu\nmax_steps = 5\n");
    static struct run r;
    const char *quiet[] = {ini, "--log_level=off", NULL};
    run_worker(&r, dir, quiet);
    cr_assert_eq(r.status, 2);
    cr_assert_str_eq(r.err, "", "--log_level=off silences even errors");
    const char *debug[] = {ini, "--log-level", "debug", "--print-config", NULL};
    run_worker(&r, dir, debug);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, " D: config ok"), "%s", r.err);
    cleanup(dir);
}

Test(worker_binary, docs_config_md_is_generated_from_the_schema, .timeout = 60)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert_not_null(src);
    char *dir = make_dir();
    static struct run r;
    const char *a[] = {"--help-config=markdown", NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char path[512];
    snprintf(path, sizeof path, "%s/docs/config.md", src);
    static char doc[65536];
    slurp(path, doc, sizeof doc);
    cr_assert(strlen(r.out) < sizeof r.out - 1, "reference outgrew the test buffer");
    cr_assert_str_eq(doc, r.out, "docs/config.md is stale: regenerate it with `ninja -C BUILD config-docs`");
    cleanup(dir);
}

Test(worker_binary, help_env_prints_docs_environment_md, .timeout = 60)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert_not_null(src);
    char *dir = make_dir();
    static struct run r;
    const char *a[] = {"--help-env=markdown", NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char path[512];
    snprintf(path, sizeof path, "%s/docs/environment.md", src);
    static char doc[65536];
    slurp(path, doc, sizeof doc);
    cr_assert(strlen(r.out) < sizeof r.out - 1, "reference outgrew the test buffer");
    cr_assert_str_eq(doc, r.out, "docs/environment.md is stale: regenerate it with `ninja -C BUILD env-docs`");
    const char *bad[] = {"--help-env=html", NULL};
    run_worker(&r, dir, bad);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "--help-env=html: the only format is markdown"), "%s", r.err);
    cleanup(dir);
}

/* The keys the worker's issue asks for, all declared now so that later work only reads values. */
Test(worker_config, schema_has_every_section_and_key)
{
    static const char *const want[] = {
        "model.model_family", "model.n_layer", "model.n_head", "model.head_dim", "model.n_kv_head", "model.n_embd",
        "model.intermediate_size", "model.rope_theta", "model.rope_scaling", "model.rope_scaling_factor",
        "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_position_embeddings",
        "model.rms_norm_eps", "model.tie_word_embeddings", "model.sliding_window", "model.max_window_layers",
        "model.vocab_size", "model.block_size", "model.init_std", "model.seed", "model.init_from", "model.activation_checkpointing",
        "train.train_batch", "train.micro_batch", "train.max_steps", "train.eval_interval", "train.eval_steps",
        "train.seed", "train.device", "optim.lr", "optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay",
        "optim.grad_clip", "optim.warmup_steps", "optim.lr_schedule", "optim.min_lr", "data.train_file",
        "data.val_file", "data.order", "fsdp.enable", "fsdp.version", "fsdp.sharding_strategy",
        "fsdp.hybrid_shard_size", "fsdp.context_parallel_size", "fsdp.context_parallel_comm_strategy",
        "fsdp.reshard_after_forward", "fsdp.auto_wrap_policy",
        "fsdp.transformer_layer_cls_to_wrap", "fsdp.min_num_params", "fsdp.backward_prefetch",
        "fsdp.forward_prefetch", "fsdp.limit_all_gathers", "fsdp.sync_module_states", "fsdp.offload_params",
        "fsdp.use_orig_params",
        "fsdp.mixed_precision", "fsdp.reduce_dtype", "log.interval", "log.dir", "checkpoint.dir",
        "checkpoint.interval", "checkpoint.state_dict_type", "checkpoint.keep_last",
        "checkpoint.cpu_ram_efficient_loading", "checkpoint.resume_from",
    };
    const struct config_schema *s = worker_config_schema();
    cr_assert_eq(s->n_keys, sizeof want / sizeof want[0], "a key was added or removed: update this list");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int k = config_find_key(s, want[i]);
        cr_assert(k >= 0, "missing %s", want[i]);
        cr_assert(s->keys[k].help && *s->keys[k].help, "%s has no help", want[i]);
    }
}

Test(worker_binary, space_separated_values_and_flat_keys_in_a_file, .timeout = 60)
{
    char *dir = make_dir();
    char ini[256];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    write_file(ini, "fsdp_state_dict_type = full\n\n[Model]\nN-Layer = 6\n");
    static struct run r;
    const char *a[] = {"--train.micro_batch", "2", ini, "--mixed_precision", "bfloat16", "--print-config", NULL};
    run_worker(&r, dir, a);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\nstate_dict_type = FULL_STATE_DICT\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\nn_layer = 6\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\nmicro_batch = 2\n"), "%s", r.out);
    cr_assert(strstr(r.out, "\nmixed_precision = bf16\n"), "%s", r.out);
    cleanup(dir);
}

/* The configs in examples/ load and pass every check (the Llama one as a Llama, the Mistral one with its window;
 * the seed-guide shapes as GPT-2s of their documented sizes; the long-context one with its context group of 2). */
Test(worker_config, example_configs_are_valid)
{
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert(src, "FSDP_SOURCE_ROOT not set: run through meson test");
    static const char *const files[] = {"quickstart.ini", "llama_small.ini", "train90M_fsdp.ini", "train300M_fsdp.ini",
                                        "long_context_cp.ini", "mistral_small.ini"};
    static const int n_layer[] = {4, 4, 12, 20, 4, 4}, n_embd[] = {128, 128, 640, 1024, 256, 128};
    for (int i = 0; i < 6; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/examples/%s", src, files[i]);
        struct config *cfg = make();
        cr_assert_eq(config_load_file(cfg, path), 0, "%s", error_message());
        struct worker_config wc;
        cr_assert_eq(worker_config_view(cfg, &wc), 0, "%s: %s", path, error_message());
        cr_assert_str_eq(worker_model_family_name(wc.model.family), i == 1 ? "llama" : i == 5 ? "mistral" : "gpt2", "%s",
                         path);
        cr_assert_eq(wc.model.sliding_window, i == 5 ? 64 : 0, "%s", path);
        cr_assert_eq(wc.model.n_layer, n_layer[i], "%s", path);
        cr_assert_eq(wc.model.n_embd, n_embd[i], "%s", path);
        cr_assert_eq(wc.fsdp.context_parallel_size, i == 4 ? 2 : 1, "%s", path);
        config_destroy(cfg);
    }
}
