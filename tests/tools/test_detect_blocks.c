/* fsdp-worker --detect-blocks: the class table of the configured model (and, with the PyPI venv, the same
 * counts from transformers' GPT2Model), model.init_from as a safetensors file, a Hugging Face directory or
 * an fsdpc checkpoint, and the JSON cache: hit, --refresh, keys by shape and checkpoint identity,
 * --clear-cache, a corrupt file replaced, the ~/.cache default. */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/fs.h"
#include "tests/util/launch_util.h"
#include "tests/util/tu_check.h"
#include "tests/util/tu_venv.h"
#include "worker/model/model.h"

#define TINY "[model]\nn_layer = 3\nn_head = 2\nn_embd = 32\nvocab_size = 100\nblock_size = 16\n"

struct db {
    char *dir;
    char ini[FSDP_PATH_MAX], cache_file[FSDP_PATH_MAX];
    char cache_env[FSDP_PATH_MAX + 32]; /* "NAME=" and a path */
};

static void db_setup(struct db *d)
{
    d->dir = lu_tmpdir();
    snprintf(d->ini, sizeof d->ini, "%s/model.ini", d->dir);
    lu_write_text(d->ini, TINY);
    snprintf(d->cache_env, sizeof d->cache_env, "XDG_CACHE_HOME=%s/cache", d->dir);
    snprintf(d->cache_file, sizeof d->cache_file, "%s/cache/fsdpc/fsdp_block_cache.json", d->dir);
}

/* Runs fsdp-worker --detect-blocks ARGS --json; returns the parsed output (asserting exit 0). */
static cJSON *detect(struct db *d, const char *const *args, const char *const *env)
{
    const char *argv[16] = {lu_build_path("worker/fsdp-worker"), "--detect-blocks"};
    int n = 2;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n++] = "--json";
    argv[n] = NULL;
    const char *e[8] = {d->cache_env};
    int m = 1;
    for (int i = 0; env && env[i]; i++)
        e[m++] = env[i];
    e[m] = NULL;
    int code = lu_exit_code(lu_wait(lu_spawn(argv, d->dir, "db", e), 60));
    char *out = lu_slurp_tag(d->dir, "db", "out");
    cr_assert_eq(code, 0, "--detect-blocks exited %d: %s", code, lu_slurp_tag(d->dir, "db", "err"));
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    free(out);
    return j;
}

static const cJSON *row(const cJSON *j, const char *cls)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "classes"))
    {
        if (strcmp(cJSON_GetObjectItem(c, "class_name")->valuestring, cls) == 0)
            return c;
    }
    return NULL;
}

static double num(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuedouble; }
static const char *str(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuestring; }
static bool cached(const cJSON *j) { return cJSON_IsTrue(cJSON_GetObjectItem(j, "cached")); }

Test(detect_blocks, table_of_the_configured_model, .timeout = 120)
{
    struct db d;
    db_setup(&d);
    const char *args[] = {d.ini, NULL};
    cJSON *j = detect(&d, args, NULL);
    const int L = 3, C = 32, V = 100, T = 16;
    const double block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
    const double total = V * C + T * C + 2 * C + L * block;
    cr_expect_eq(num(j, "total_parameter_count"), total);
    const cJSON *b = row(j, "DecoderBlock");
    cr_assert_not_null(b);
    cr_expect_str_eq(str(b, "hf_class_name"), "GPT2Block");
    cr_expect_eq(num(b, "count"), L);
    cr_expect_eq(num(b, "params_each_min"), block);
    cr_expect_eq(num(b, "params_each_max"), block);
    cr_expect_eq(num(b, "params_total"), L * block);
    cr_expect(fabs(num(b, "share") - L * block / total) < 1e-12);
    cr_expect_str_eq(str(b, "fsdp_unit"), "yes");
    cr_expect_str_eq(str(row(j, "GPT2Model"), "fsdp_unit"), "root");
    cr_expect_str_eq(str(row(j, "MLP"), "fsdp_unit"), "no");
    cr_expect_str_eq(str(row(j, "MLP"), "hf_class_name"), "GPT2MLP");
    const cJSON *emb = row(j, "Embedding");
    cr_expect_eq(num(emb, "count"), 2);
    cr_expect_eq(num(emb, "params_each_min"), T * C);
    cr_expect_eq(num(emb, "params_each_max"), V * C, "the vocabulary without its padding rows");
    cr_expect_str_eq(str(j, "suggested_transformer_layer_cls_to_wrap"), "DecoderBlock");
    cr_expect_str_eq(str(j, "suggested_hf_class_names"), "GPT2Block");
    cr_expect(!cached(j));
    cr_expect_str_eq(str(j, "cache_file"), d.cache_file);

    /* the text table says the same */
    const char *argv[] = {lu_build_path("worker/fsdp-worker"), "--detect-blocks", d.ini, NULL};
    const char *env[] = {d.cache_env, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(argv, d.dir, "text", env), 60)), 0);
    char *text = lu_slurp_tag(d.dir, "text", "out");
    cr_expect(strstr(text, "Suggested: transformer_layer_cls_to_wrap = DecoderBlock"), "%s", text);
    cr_expect(strstr(text, "from the cache"), "the second run reads the cache:\n%s", text);
    free(text);
    cJSON_Delete(j);
    lu_rm_rf(d.dir);
}

/* Every Llama-style family of the registry: its decoder layers are the blocks, under its own Hugging Face
 * class name (what accelerate's transformer_layer_cls_to_wrap takes), one per layer, all of one size, below
 * its *ForCausalLM root. */
Test(detect_blocks, every_family_names_its_decoder_layer, .timeout = 120)
{
    static const struct {
        const char *family, *extra, *hf_block, *hf_root;
    } fam[] = {
        {"llama", "", "LlamaDecoderLayer", "LlamaForCausalLM"},
        {"qwen2", "", "Qwen2DecoderLayer", "Qwen2ForCausalLM"},
        {"qwen3", "head_dim = 12\n", "Qwen3DecoderLayer", "Qwen3ForCausalLM"},
        {"mistral", "sliding_window = 8\n", "MistralDecoderLayer", "MistralForCausalLM"},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        struct db d;
        db_setup(&d);
        char ini[512];
        snprintf(ini, sizeof ini,
                 "[model]\nmodel_family = %s\nn_layer = 3\nn_head = 4\nn_kv_head = 2\nn_embd = 32\n"
                 "vocab_size = 100\nblock_size = 16\n%s",
                 fam[i].family, fam[i].extra);
        lu_write_text(d.ini, ini);
        const char *args[] = {d.ini, NULL};
        cJSON *j = detect(&d, args, NULL);
        const cJSON *b = row(j, fam[i].hf_block);
        cr_assert_not_null(b, "%s: no %s row", fam[i].family, fam[i].hf_block);
        cr_expect_str_eq(str(b, "hf_class_name"), fam[i].hf_block, "%s", fam[i].family);
        cr_expect_eq(num(b, "count"), 3, "%s", fam[i].family);
        cr_expect_eq(num(b, "params_each_min"), num(b, "params_each_max"), "%s: blocks of one size", fam[i].family);
        cr_expect_eq(num(b, "params_total"), 3 * num(b, "params_each_min"), "%s", fam[i].family);
        cr_expect_str_eq(str(b, "fsdp_unit"), "yes", "%s", fam[i].family);
        cr_expect_str_eq(str(j, "suggested_hf_class_names"), fam[i].hf_block, "%s", fam[i].family);
        cr_expect_str_eq(str(j, "suggested_transformer_layer_cls_to_wrap"), fam[i].hf_block, "%s", fam[i].family);
        const cJSON *root = NULL, *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "classes"))
        {
            if (strcmp(str(c, "fsdp_unit"), "root") == 0)
                root = c;
        }
        cr_assert_not_null(root, "%s: no root row", fam[i].family);
        cr_expect_str_eq(str(root, "hf_class_name"), fam[i].hf_root, "%s", fam[i].family);
        cJSON_Delete(j);
        lu_rm_rf(d.dir);
    }
}

/* transformers' GPT2Model of the same shape: per class, the module count and parameters (subtree) agree. */
Test(detect_blocks, counts_match_transformers, .timeout = 120)
{
    char py[FSDP_PATH_MAX];
    if (!tu_venv_bin("python", py, sizeof py))
        cr_skip_test("no PyPI venv with transformers at %s (.ci/run makes it; FSDP_TORCH_VENV names another)", py);
    struct db d;
    db_setup(&d);
    const char *args[] = {d.ini, NULL};
    cJSON *j = detect(&d, args, NULL);
    const char *argv[] = {py, "-c",
                          "import json, collections\n"
                          "from transformers import GPT2Config, GPT2Model\n"
                          "m = GPT2Model(GPT2Config(n_layer=3, n_head=2, n_embd=32, vocab_size=100, n_positions=16))\n"
                          "c = collections.defaultdict(lambda: [0, 0])\n"
                          "for name, mod in m.named_modules():\n"
                          "    n = sum(p.numel() for p in mod.parameters())\n"
                          "    if n: c[type(mod).__name__][0] += 1; c[type(mod).__name__][1] += n\n"
                          "print(json.dumps(c))\n",
                          NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, d.dir, "hf", NULL), 100));
    cr_assert_eq(code, 0, "%s", lu_slurp_tag(d.dir, "hf", "err"));
    cJSON *hf = cJSON_Parse(lu_slurp_tag(d.dir, "hf", "out"));
    cr_assert_not_null(hf);
    const cJSON *c;
    int compared = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "classes"))
    {
        const char *name = str(c, "hf_class_name");
        const cJSON *h = cJSON_GetObjectItem(hf, name);
        cr_assert_not_null(h, "transformers' GPT2Model has no %s with parameters", name);
        cr_expect_eq(num(c, "count"), cJSON_GetArrayItem(h, 0)->valuedouble, "%s count", name);
        /* transformers sums nested modules of one class twice (none here); ours counts the outer ones */
        cr_expect_eq(num(c, "params_total"), cJSON_GetArrayItem(h, 1)->valuedouble, "%s parameters", name);
        compared++;
    }
    cr_expect_eq(compared, cJSON_GetArraySize(hf), "every class of transformers' model is in the table");
    cJSON_Delete(hf);
    cJSON_Delete(j);
    lu_rm_rf(d.dir);
}

Test(detect_blocks, cache_refresh_keys_clear_and_corruption, .timeout = 120)
{
    struct db d;
    db_setup(&d);
    const char *args[] = {d.ini, NULL};
    cJSON *j = detect(&d, args, NULL);
    cr_expect(!cached(j));
    cJSON_Delete(j);
    j = detect(&d, args, NULL);
    cr_expect(cached(j), "the second detection is a cache hit");
    cJSON_Delete(j);
    const char *refresh[] = {d.ini, "--refresh", NULL};
    j = detect(&d, refresh, NULL);
    cr_expect(!cached(j), "--refresh recomputes");
    cJSON_Delete(j);
    const char *other[] = {d.ini, "--model.n_layer=5", NULL};
    j = detect(&d, other, NULL);
    cr_expect(!cached(j), "another shape is another key");
    cr_expect_eq(num(row(j, "DecoderBlock"), "count"), 5);
    cJSON_Delete(j);
    char *text = tu_read_ok(d.cache_file, NULL);
    cJSON *cache = cJSON_Parse(text);
    cr_assert_not_null(cache, "the cache is JSON: %s", text);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(cache, "entries")), 2, "%s", text);
    cJSON_Delete(cache);
    free(text);

    /* a corrupt cache is replaced, never fatal */
    lu_write_text(d.cache_file, "{\"entries\": [1, 2");
    j = detect(&d, args, NULL);
    cr_expect(!cached(j));
    cJSON_Delete(j);
    cr_expect(strstr(lu_slurp_tag(d.dir, "db", "err"), "not a cache of this version (corrupt or old): replacing it"));
    text = tu_read_ok(d.cache_file, NULL);
    cache = cJSON_Parse(text);
    cr_expect_not_null(cache, "replaced by a valid cache: %s", text);
    cJSON_Delete(cache);
    free(text);

    /* --clear-cache removes the file */
    const char *argv[] = {lu_build_path("worker/fsdp-worker"), "--clear-cache", NULL};
    const char *env[] = {d.cache_env, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(argv, d.dir, "clear", env), 30)), 0);
    cr_expect_neq(access(d.cache_file, F_OK), 0, "--clear-cache left %s", d.cache_file);

    /* without XDG_CACHE_HOME: ~/.cache */
    char home[FSDP_PATH_MAX], want[FSDP_PATH_MAX], home_env[FSDP_PATH_MAX + 32]; /* + 32: "HOME=" */
    snprintf(home, sizeof home, "%s/home", d.dir);
    cr_assert_eq(mkdir(home, 0755), 0);
    snprintf(home_env, sizeof home_env, "HOME=%s", home);
    tu_pathf(want, sizeof want, "%s/.cache/fsdpc/fsdp_block_cache.json", home);
    const char *env2[] = {"XDG_CACHE_HOME=", home_env, NULL};
    j = detect(&d, args, env2);
    cr_expect_str_eq(str(j, "cache_file"), want);
    cr_expect_eq(access(want, F_OK), 0);
    cJSON_Delete(j);
    lu_rm_rf(d.dir);
}

static void write_weights(const char *path)
{
    struct model_config mc;
    model_config_default(&mc);
    mc.n_layer = 3, mc.n_head = 2, mc.n_embd = 32, mc.vocab_size = 100, mc.block_size = 16;
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &mc), 0);
    float *p = calloc(l.numel, sizeof *p);
    cr_assert_eq(model_weights_save(&l, path, p), 0, "%s", path);
    free(p);
    model_layout_free(&l);
}

Test(detect_blocks, init_from_safetensors_hf_directory_and_checkpoint, .timeout = 180)
{
    struct db d;
    db_setup(&d);
    /* a safetensors file: checked against the configured shape; its identity is part of the key */
    char st[FSDP_PATH_MAX], arg[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(st, sizeof st, "%s/w.safetensors", d.dir);
    write_weights(st);
    snprintf(arg, sizeof arg, "--model.init_from=%s", st);
    const char *args[] = {d.ini, arg, NULL};
    cJSON *j = detect(&d, args, NULL);
    cr_expect(strstr(str(j, "source"), "safetensors file"), "%s", str(j, "source"));
    cr_expect(strstr(str(j, "checkpoint_identity"), "w.safetensors@"), "%s", str(j, "checkpoint_identity"));
    cJSON_Delete(j);
    j = detect(&d, args, NULL);
    cr_expect(cached(j));
    cJSON_Delete(j);
    struct timespec later[2] = {{.tv_sec = time(NULL) + 100}, {.tv_sec = time(NULL) + 100}};
    cr_assert_eq(utimensat(AT_FDCWD, st, later, 0), 0);
    j = detect(&d, args, NULL);
    cr_expect(!cached(j), "a rewritten checkpoint is another key");
    cJSON_Delete(j);
    const char *argv[] = {lu_build_path("worker/fsdp-worker"), "--detect-blocks", d.ini, arg, "--model.n_embd=64",
                          NULL};
    const char *env[] = {d.cache_env, NULL};
    cr_expect_eq(lu_exit_code(lu_wait(lu_spawn(argv, d.dir, "bad", env), 30)), 1);
    char *err = lu_slurp_tag(d.dir, "bad", "err");
    cr_expect(strstr(err, "the configured model wants") && strstr(err, "set model.* to the checkpoint's shape"), "%s",
              err);
    free(err);

    /* a Hugging Face directory: the shape comes from its config.json */
    char hf[FSDP_PATH_MAX], cfg[FSDP_PATH_MAX], model[FSDP_PATH_MAX];
    snprintf(hf, sizeof hf, "%s/hf", d.dir);
    cr_assert_eq(mkdir(hf, 0755), 0);
    tu_pathf(cfg, sizeof cfg, "%s/config.json", hf);
    lu_write_text(cfg, "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_head\": 2, \"n_embd\": 32, "
                       "\"vocab_size\": 100, \"n_positions\": 16}");
    tu_pathf(model, sizeof model, "%s/model.safetensors", hf);
    write_weights(model);
    snprintf(arg, sizeof arg, "--model.init_from=%s", hf);
    const char *hfargs[] = {d.ini, arg, "--model.n_layer=7", NULL};
    j = detect(&d, hfargs, NULL);
    cr_expect_eq(num(row(j, "DecoderBlock"), "count"), 3, "config.json's n_layer, not the INI's");
    cr_expect(strstr(str(j, "source"), "Hugging Face directory"), "%s", str(j, "source"));
    cJSON_Delete(j);

    /* an fsdpc checkpoint: the shape recorded in its metadata */
    char data[FSDP_PATH_MAX], corpus[FSDP_PATH_MAX];
    char ck[FSDP_PATH_MAX + 32], log[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(data, sizeof data, "%s/data", d.dir);
    snprintf(corpus, sizeof corpus, "%s/tests/data/corpus", getenv("FSDP_SOURCE_ROOT"));
    const char *prep[] = {lu_build_path("worker/fsdp-prepare-data"), "-o", data, corpus, NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(prep, d.dir, "prep", NULL), 60)), 0);
    char train_file[FSDP_PATH_MAX + 32]; /* + 32: "--key=" and a path */
    snprintf(train_file, sizeof train_file, "--data.train_file=%s/train.bin", data);
    snprintf(ck, sizeof ck, "--checkpoint.dir=%s/ck", d.dir);
    snprintf(log, sizeof log, "--log.dir=%s/log", d.dir);
    const char *train[] = {lu_build_path("worker/fsdp-worker"), d.ini, train_file, ck, log, "--train.max_steps=1",
                           "--train.train_batch=2", "--train.micro_batch=1", "--model.n_layer=2",
                           "--model.vocab_size=256", "--train.device=cpu", NULL};
    const char *tenv[] = {"OMP_NUM_THREADS=1", "RANK=", "WORLD_SIZE=", NULL};
    cr_assert_eq(lu_exit_code(lu_wait(lu_spawn(train, d.dir, "train", tenv), 120)), 0, "%s",
                 lu_slurp_tag(d.dir, "train", "err"));
    snprintf(arg, sizeof arg, "--model.init_from=%s/ck/fsdp_sharded_cpt1", d.dir);
    const char *ckargs[] = {d.ini, arg, NULL};
    j = detect(&d, ckargs, NULL);
    cr_expect_eq(num(row(j, "DecoderBlock"), "count"), 2, "the checkpoint's n_layer, not the INI's");
    cr_expect(strstr(str(j, "source"), "fsdpc checkpoint"), "%s", str(j, "source"));
    cJSON_Delete(j);
    lu_rm_rf(d.dir);
}
