/* Hugging Face in and out, with transformers from PyPI (the venv FSDP_TORCH_VENV names; skipped with a
 * message without it):
 * - in: save_pretrained's fp32, bf16, fp16 and sharded directories give `fsdp-ckpt eval` the loss
 *   transformers computes (1e-5); fsdp-worker at world 2 starts from a directory with [model] taken from its
 *   config.json, each rank reading only its shards' bytes (run summary: model.init_bytes_read); a [model]
 *   key that disagrees, a pickle and a .pth resume_from fail before work with their messages.
 * - out: a run at world 2 with FULL_STATE_DICT; its checkpoint directory and `fsdp-ckpt export`'s sharded
 *   directory open with from_pretrained unchanged and give fsdpc's own logits (computed here with the model
 *   library from the checkpoint) within 1e-5, the run's tokenizer with them; the same for Llama and for a Qwen3
 *   trained 3 steps (head_dim != hidden / heads), whose export gives transformers the trained model's loss.
 * And without transformers: a full checkpoint as init_from sets [model] and reports a disagreeing key. */
#include <sys/stat.h>

#include "common/error.h"
#include "common/fs.h"
#include "common/safetensors.h"
#include "kernels/kernels.h"
#include "tests/train/ttest.h"
#include "tests/util/tu_venv.h"
#include "worker/ckpt/ckpt.h"

static char venv_python[FSDP_PATH_MAX];

/* The venv's python with torch and transformers, or a skip naming what is missing. */
static void need_venv(void)
{
    bool found = tu_venv_bin("python", venv_python, sizeof venv_python);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch, transformers, safetensors, tokenizers' >/dev/null 2>&1",
             venv_python);
    if (!found || system(cmd) != 0)
        cr_skip_test("no PyPI venv with torch, transformers, safetensors and tokenizers at %s (.ci/run makes it: "
                     "python3 -m venv ~/.cache/fsdpc-venv && ~/.cache/fsdpc-venv/bin/pip install torch transformers "
                     "safetensors tokenizers numpy; FSDP_TORCH_VENV names another)",
                     venv_python);
}

/* Runs hf_check.py with args (NULL-terminated) in dir; asserts success. */
static void hf_check(const char *dir, const char *tag, const char *const *args)
{
    char script[2048];
    snprintf(script, sizeof script, "%s/tests/train/hf_check.py", getenv("FSDP_SOURCE_ROOT"));
    const char *argv[16] = {venv_python, script};
    int n = 2;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    static const char *const env[] = {"OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, tag, env), 240));
    char *err = lu_slurp_tag(dir, tag, "err");
    size_t len = strlen(err);
    cr_assert_eq(code, 0, "hf_check.py %s failed (%d):\n%s", args[0], code, err + (len > 3000 ? len - 3000 : 0));
    free(err);
}

/* Runs fsdp-ckpt with args; returns the exit code, *out_err its stderr (caller frees). */
static int ckpt_tool(const char *dir, const char *tag, const char *const *args, char **out_err)
{
    const char *argv[24] = {lu_build_path("worker/fsdp-ckpt")};
    int n = 1;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    static const char *const env[] = {"OMP_NUM_THREADS=1", NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, dir, tag, env), 240));
    *out_err = lu_slurp_tag(dir, tag, "err");
    return code;
}

static cJSON *load_json(const char *path)
{
    char *text = tu_slurp(path);
    cJSON *o = cJSON_Parse(text);
    cr_assert_not_null(o, "%s is not JSON: %s", path, text);
    free(text);
    return o;
}

Test(train_hf, import_save_pretrained_directories, .timeout = 600)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    char hf[2048], val[2048];
    snprintf(hf, sizeof hf, "%s/hf", c.dir);
    snprintf(val, sizeof val, "%s/val.bin", c.data);
    hf_check(c.dir, "make", (const char *const[]){"make", hf, val, "4", "32", "3", NULL});
    char ref_path[2100];
    snprintf(ref_path, sizeof ref_path, "%s/ref.json", hf);
    cJSON *ref = load_json(ref_path);
    cr_assert_gt(tu_json_num(ref, "shards"), 1, "the sharded save has one file");

    /* fsdp-ckpt eval of each layout = transformers' loss on the same windows */
    const char *variants[] = {"f32", "bf16", "f16", "sharded"};
    for (int v = 0; v < 4; v++) {
        char dir[2100], json[2200], tag[32];
        snprintf(dir, sizeof dir, "%s/%s", hf, variants[v]);
        snprintf(json, sizeof json, "%s/eval_%s.json", c.dir, variants[v]);
        snprintf(tag, sizeof tag, "eval_%s", variants[v]);
        char *err;
        int code = ckpt_tool(c.dir, tag,
                             (const char *const[]){"eval", dir, "--data", val, "--batch", "4", "--block_size", "32",
                                                   "--steps", "3", "--json", json, NULL},
                             &err);
        cr_assert_eq(code, 0, "eval %s: %s", variants[v], err);
        free(err);
        cJSON *e = load_json(json);
        double got = tu_json_num(e, "loss"), want = tu_json_num(ref, variants[v]);
        cr_assert(fabs(got - want) <= 1e-5 * fabs(want), "%s: fsdp-ckpt eval %.9g, transformers %.9g", variants[v],
                  got, want);
        cr_log_info("%s: eval %.7f vs transformers %.7f", variants[v], got, want);
        cJSON_Delete(e);
    }
    cJSON_Delete(ref);

    /* fsdp-worker at world 2 from the sharded directory: [model] from config.json (tiny.ini agrees; its
     * block_size 16 is below n_positions 48), each rank reads its half of the bytes. */
    char from[2200];
    snprintf(from, sizeof from, "--model.init_from=%s/sharded", hf);
    struct tt_result r;
    tt_run_ok(&c, 2, "w2", (const char *const[]){from, "--train.max_steps=2", NULL}, &r);
    double total = 0, bytes[2];
    for (int rank = 0; rank < 2; rank++) {
        cJSON *s = tt_summary(&r, rank);
        bytes[rank] = tt_num(s, "model.init_bytes_read");
        total = tt_num(s, "model.parameters") * 4;
        cr_assert(tu_json_str(s, "model.init_from") && strstr(tu_json_str(s, "model.init_from"), "sharded"));
        cJSON_Delete(s);
    }
    cr_assert_eq(bytes[0] + bytes[1], total, "ranks read %.0f + %.0f bytes of a %.0f-byte model", bytes[0], bytes[1],
                 total);
    for (int rank = 0; rank < 2; rank++)
        cr_assert(bytes[rank] < 0.6 * total, "rank %d read %.0f of %.0f bytes", rank, bytes[rank], total);
    cr_log_info("world 2 init_from: rank 0 read %.0f, rank 1 %.0f of %.0f bytes", bytes[0], bytes[1], total);
    tt_result_free(&r);
    /* cpu_ram_efficient_loading: rank 0 reads all, unit by unit, and broadcasts */
    tt_run_ok(&c, 2, "w2bcast",
              (const char *const[]){from, "--train.max_steps=2", "--checkpoint.cpu_ram_efficient_loading=true", NULL},
              &r);
    cJSON *s0 = tt_summary(&r, 0), *s1 = tt_summary(&r, 1);
    cr_assert_eq(tt_num(s0, "model.init_bytes_read"), total);
    cr_assert_eq(tt_num(s1, "model.init_bytes_read"), 0);
    cJSON_Delete(s0);
    cJSON_Delete(s1);
    tt_result_free(&r);

    /* What fails before any work, with its message. */
    tt_run(&c, 0, "mismatch", (const char *const[]){from, "--model.n_embd=64", NULL}, &r);
    cr_assert_eq(r.code, 1, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "[model] n_embd = 64 (command line) disagrees with \"n_embd\": 32 in ") &&
                  strstr(r.err, "sharded/config.json"),
              "%s", r.err);
    tt_result_free(&r);
    char pickle[2200], arg[2300];
    snprintf(pickle, sizeof pickle, "%s/pytorch_model.bin", c.dir);
    lu_write_text(pickle, "not a model");
    snprintf(arg, sizeof arg, "--model.init_from=%s", pickle);
    tt_run(&c, 0, "pickle", (const char *const[]){arg, NULL}, &r);
    cr_assert_eq(r.code, 1, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "pickles are not read") && strstr(r.err, "save_file("), "%s", r.err);
    tt_result_free(&r);
    snprintf(arg, sizeof arg, "--resume_from=%s/runs/fsdp_cpt4000.pth", c.dir);
    tt_run(&c, 0, "pth", (const char *const[]){arg, NULL}, &r);
    cr_assert_eq(r.code, 1, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "does not resume from PyTorch .pth files") && strstr(r.err, "fsdp_cpt<step>"), "%s",
              r.err);
    tt_result_free(&r);
    tt_teardown(&c);
}

enum { LB = 2, LT = 16 };

/* fsdpc's logits of the checkpoint on LB x LT tokens of val.bin, with the tokens, into a safetensors file
 * for hf_check.py. */
static void our_logits(const char *root, const char *val, const char *out)
{
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(root, "latest", NULL, &r), 0, "%s", error_message());
    const struct model_layout *l = ckpt_reader_layout(r);
    const struct kernels *k = kernels_cpu();
    float *params = k->mem_alloc(l->numel * sizeof *params);
    for (int p = 0; p < l->n_params; p++)
        cr_assert_eq(ckpt_read(r, CKPT_PARAM, p, 0, l->params[p].numel, params + l->params[p].offset), 0, "%s",
                     error_message());
    struct model *m;
    cr_assert_eq(model_create(&m, &l->config, k, LB, LT), 0, "%s", error_message());
    FILE *f = fopen(val, "rb");
    cr_assert_not_null(f);
    uint16_t raw[LB * LT + 1];
    cr_assert_eq(fread(raw, 2, LB * LT + 1, f), (size_t)(LB * LT + 1));
    fclose(f);
    int32_t tok[LB * LT], tgt[LB * LT];
    for (int i = 0; i < LB * LT; i++) {
        tok[i] = raw[i];
        tgt[i] = raw[i + 1];
    }
    float loss;
    cr_assert_eq(model_set_batch(m, tok, tgt), 0);
    cr_assert_eq(model_forward(m, params, &loss), 0, "%s", error_message());
    int V = l->config.vocab_size, VP = l->vocab_padded;
    float *lg = malloc((size_t)LB * LT * V * sizeof *lg);
    for (int i = 0; i < LB * LT; i++)
        memcpy(lg + (size_t)i * V, model_logits(m) + (size_t)i * VP, (size_t)V * sizeof *lg);
    struct safetensors_entry e[2] = {
        {.name = "tokens", .dtype = SAFETENSORS_I32, .ndim = 2, .shape = {LB, LT}, .data = tok},
        {.name = "logits", .dtype = SAFETENSORS_F32, .ndim = 3, .shape = {LB, LT, V}, .data = lg},
    };
    cr_assert_eq(safetensors_write(out, e, 2, NULL, 0, NULL, NULL), 0, "%s", error_message());
    free(lg);
    model_destroy(m);
    k->mem_free(params);
    ckpt_close(r);
}

static void check_logits_of(const struct tt_ctx *c, const char *model_dir, const char *batch, const char *tag,
                            const char *architecture, bool tokenizer)
{
    char out[2300];
    snprintf(out, sizeof out, "%s/%s.json", c->dir, tag);
    hf_check(c->dir, tag, (const char *const[]){"logits", model_dir, batch, out, NULL});
    cJSON *o = load_json(out);
    cr_assert_str_eq(tu_json_str(o, "architecture"), architecture);
    double rel = tu_json_num(o, "rel");
    cr_assert(rel <= 1e-5, "%s: transformers' logits differ from fsdpc's by %.3g (max |a - b| %.3g, max |logit| %.3g)",
              tag, rel, tu_json_num(o, "max_abs_diff"), tu_json_num(o, "max_abs_logit"));
    if (tokenizer) {
        cr_assert(tu_json_str(o, "tokenizer") != NULL, "%s: the tokenizer did not travel", tag);
        cr_assert(cJSON_IsTrue(tu_json_at(o, "tokenizer_round_trip")), "%s: the tokenizer does not decode bytes", tag);
    }
    cr_log_info("%s: logits within %.3g (max |diff| %.3g of max |logit| %.3g), tokenizer %s", tag, rel,
                tu_json_num(o, "max_abs_diff"), tu_json_num(o, "max_abs_logit"),
                tu_json_str(o, "tokenizer") ? tu_json_str(o, "tokenizer") : "none");
    cJSON_Delete(o);
}

static void check_logits(const struct tt_ctx *c, const char *model_dir, const char *batch, const char *tag)
{
    check_logits_of(c, model_dir, batch, tag, "GPT2LMHeadModel", true);
}

Test(train_hf, export_opens_in_transformers_with_our_logits, .timeout = 600)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    /* the run's data made with a tokenizer, as a BPE run's is: fsdp-prepare-data --tokenizer leaves it and
     * its meta.json beside the token files (a byte-level tokenizer, so the ids are the corpus bytes) */
    char tok[2100], data[2100], val[2200], corpus[2100];
    snprintf(tok, sizeof tok, "%s/bytes_tokenizer.json", c.dir);
    hf_check(c.dir, "tokenizer", (const char *const[]){"tokenizer", tok, NULL});
    snprintf(data, sizeof data, "%s/tokdata", c.dir);
    snprintf(corpus, sizeof corpus, "%s/tests/data/corpus", getenv("FSDP_SOURCE_ROOT"));
    const char *prep[] = {lu_build_path("worker/fsdp-prepare-data"), "--tokenizer", tok, "--eot", "none", "-o", data,
                          corpus, NULL};
    int pcode = lu_exit_code(lu_wait(lu_spawn(prep, c.dir, "prepare_tok", NULL), 120));
    cr_assert_eq(pcode, 0, "fsdp-prepare-data --tokenizer: %s", lu_slurp_tag(c.dir, "prepare_tok", "err"));
    snprintf(val, sizeof val, "%s/val.bin", data);
    char train_arg[2300], val_arg[2300];
    snprintf(train_arg, sizeof train_arg, "--data.train_file=%s/train.bin", data);
    snprintf(val_arg, sizeof val_arg, "--data.val_file=%s", val);
    struct tt_result r;
    tt_run_ok(&c, 2, "full",
              (const char *const[]){"--checkpoint.state_dict_type=FULL_STATE_DICT", "--checkpoint.interval=0",
                                    "--train.max_steps=6", train_arg, val_arg, NULL},
              &r);
    char root[2300], ck[2400], batch[2300], out_dir[2300], path[2500];
    snprintf(root, sizeof root, "%s/full/ckpt", c.dir);
    snprintf(ck, sizeof ck, "%s/fsdp_cpt6", root);
    snprintf(path, sizeof path, "%s/tokenizer.json", ck);
    cr_assert_eq(access(path, R_OK), 0, "the checkpoint has no tokenizer.json");
    snprintf(batch, sizeof batch, "%s/batch.safetensors", c.dir);
    our_logits(root, val, batch);
    /* the checkpoint directory itself */
    check_logits(&c, ck, batch, "full_checkpoint");
    /* the export, sharded */
    snprintf(out_dir, sizeof out_dir, "%s/export", c.dir);
    char *err;
    int code = ckpt_tool(c.dir, "export",
                         (const char *const[]){"export", root, out_dir, "--max_shard_size", "40KB", NULL}, &err);
    cr_assert_eq(code, 0, "export: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    cr_assert_eq(access(path, R_OK), 0, "no index: the export is not sharded");
    check_logits(&c, out_dir, batch, "export_sharded");
    tt_result_free(&r);
    tt_teardown(&c);
}

/* Without transformers: a FULL_STATE_DICT checkpoint is a Hugging Face directory, and as init_from its
 * config.json gives the [model] shape (--print-config shows it), a [model] key of the config file that
 * disagrees names both values and the file's line, and a lone worker reads every byte once. */
Test(train_hf, init_from_directory_sets_the_model_shape, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    struct tt_result r;
    tt_run_ok(&c, 0, "src",
              (const char *const[]){"--checkpoint.state_dict_type=FULL_STATE_DICT", "--checkpoint.interval=0",
                                    "--train.max_steps=2", NULL},
              &r);
    tt_result_free(&r);
    char ck[2200], ini[2200], text[8192];
    snprintf(ck, sizeof ck, "%s/src/ckpt/fsdp_cpt2", c.dir);
    char tokpath[2300];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", ck);
    cr_assert_neq(access(tokpath, F_OK), 0, "a byte-token run (meta.json: no tokenizer) copied a tokenizer");
    /* no [model] keys at all: the directory gives every one */
    snprintf(ini, sizeof ini, "%s/from_hf.ini", c.dir);
    snprintf(text, sizeof text,
             "[model]\ninit_from = %s\n[train]\ndevice = cpu\ntrain_batch = 4\nmicro_batch = 2\nmax_steps = 1\neval_interval = 0\n"
             "[data]\ntrain_file = %s/train.bin\nval_file = %s/val.bin\n",
             ck, c.data, c.data);
    lu_write_text(ini, text);
    tt_run_ini(&c, ini, 0, "print", (const char *const[]){"--print-config", NULL}, &r);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "n_layer = 2\n") && strstr(r.out, "n_head = 2\n") && strstr(r.out, "n_embd = 32\n") &&
                  strstr(r.out, "vocab_size = 256\n") && strstr(r.out, "block_size = 16\n"),
              "%s", r.out);
    tt_result_free(&r);
    tt_run_ini(&c, ini, 0, "run", NULL, &r);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cJSON *s = tt_summary(&r, -1);
    cr_assert_eq(tt_num(s, "model.init_bytes_read"), tt_num(s, "model.parameters") * 4);
    cJSON_Delete(s);
    tt_result_free(&r);
    /* a disagreeing key on line 2 of the file */
    snprintf(text, sizeof text,
             "[model]\nn_embd = 48\ninit_from = %s\n[train]\ndevice = cpu\ntrain_batch = 4\nmicro_batch = 2\n"
             "[data]\ntrain_file = %s/train.bin\n",
             ck, c.data);
    lu_write_text(ini, text);
    tt_run_ini(&c, ini, 0, "disagree", NULL, &r);
    cr_assert_eq(r.code, 1, "%s", r.err);
    char want[4800];
    snprintf(want, sizeof want, "[model] n_embd = 48 (%s line 2) disagrees with \"n_embd\": 32 in %s/config.json", ini,
             ck);
    cr_assert(strstr(r.err, want) && strstr(r.err, "drop n_embd in the config file"), "want %s in:\n%s", want, r.err);
    tt_result_free(&r);
    tt_teardown(&c);
}

/* Llama the same way: LlamaForCausalLM's sharded save_pretrained directories (grouped-query attention,
 * tied and untied head, rope_theta in rope_parameters) evaluate to transformers' loss; a world-2 run from
 * one reads half the bytes per rank, saves a FULL_STATE_DICT checkpoint, and that directory and its export
 * open in from_pretrained with fsdpc's logits. */
Test(train_hf, llama_in_and_out, .timeout = 600)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    char hf[2048], val[2048];
    snprintf(hf, sizeof hf, "%s/llama", c.dir);
    snprintf(val, sizeof val, "%s/val.bin", c.data);
    hf_check(c.dir, "make_llama", (const char *const[]){"make_llama", hf, val, "4", "32", "3", NULL});
    char ref_path[2100];
    snprintf(ref_path, sizeof ref_path, "%s/ref.json", hf);
    cJSON *ref = load_json(ref_path);
    /* llama3: Llama 3.1's rope scaling, in transformers 5's config.json spelling and in 4.x's */
    const char *variants[] = {"untied", "tied", "llama3", "llama3_v4"};
    for (int v = 0; v < 4; v++) {
        char dir[2100], json[2200], tag[32];
        snprintf(dir, sizeof dir, "%s/%s", hf, variants[v]);
        snprintf(json, sizeof json, "%s/eval_%s.json", c.dir, variants[v]);
        snprintf(tag, sizeof tag, "eval_%s", variants[v]);
        char *err;
        int code = ckpt_tool(c.dir, tag,
                             (const char *const[]){"eval", dir, "--data", val, "--batch", "4", "--block_size", "32",
                                                   "--steps", "3", "--json", json, NULL},
                             &err);
        cr_assert_eq(code, 0, "eval %s: %s", variants[v], err);
        free(err);
        cJSON *e = load_json(json);
        double got = tu_json_num(e, "loss"), want = tu_json_num(ref, variants[v]);
        cr_assert(fabs(got - want) <= 1e-5 * fabs(want), "llama %s: fsdp-ckpt eval %.9g, transformers %.9g",
                  variants[v], got, want);
        cr_log_info("llama %s: eval %.7f vs transformers %.7f", variants[v], got, want);
        cJSON_Delete(e);
    }
    cJSON_Delete(ref);
    /* tiny.ini's [model] is GPT-2's: a Llama directory takes a config without one */
    char ini[2200], text[8192], from[2200];
    snprintf(ini, sizeof ini, "%s/llama.ini", c.dir);
    snprintf(text, sizeof text,
             "[train]\ndevice = cpu\ntrain_batch = 4\nmicro_batch = 2\nmax_steps = 3\neval_interval = 0\n"
             "[data]\ntrain_file = %s/train.bin\nval_file = %s\n",
             c.data, val);
    lu_write_text(ini, text);
    snprintf(from, sizeof from, "--model.init_from=%s/untied", hf);
    struct tt_result r;
    tt_run_ini(&c, ini, 2, "w2",
               (const char *const[]){from, "--checkpoint.state_dict_type=FULL_STATE_DICT", "--checkpoint.interval=0",
                                     "--model.block_size=32", NULL},
               &r);
    cr_assert_eq(r.code, 0, "%s", r.err);
    double total = 0, bytes[2];
    for (int rank = 0; rank < 2; rank++) {
        cJSON *s = tt_summary(&r, rank);
        bytes[rank] = tt_num(s, "model.init_bytes_read");
        total = tt_num(s, "model.parameters") * 4;
        cr_assert_str_eq(tu_json_str(s, "model.family"), "llama");
        cJSON_Delete(s);
    }
    cr_assert_eq(bytes[0] + bytes[1], total);
    cr_assert(bytes[0] < 0.6 * total && bytes[1] < 0.6 * total, "%.0f + %.0f of %.0f", bytes[0], bytes[1], total);
    tt_result_free(&r);
    char root[2300], ck[2400], batch[2300], out_dir[2300];
    snprintf(root, sizeof root, "%s/w2/ckpt", c.dir);
    snprintf(ck, sizeof ck, "%s/fsdp_cpt3", root);
    snprintf(batch, sizeof batch, "%s/llama_batch.safetensors", c.dir);
    our_logits(root, val, batch);
    check_logits_of(&c, ck, batch, "llama_full_checkpoint", "LlamaForCausalLM", false);
    snprintf(out_dir, sizeof out_dir, "%s/llama_export", c.dir);
    char *err;
    int code = ckpt_tool(c.dir, "llama_export",
                         (const char *const[]){"export", root, out_dir, "--max_shard_size", "60KB", NULL}, &err);
    cr_assert_eq(code, 0, "export: %s", err);
    free(err);
    check_logits_of(&c, out_dir, batch, "llama_export_sharded", "LlamaForCausalLM", false);
    /* a rope-scaled model's export keeps its scaling: transformers' loss of the export is the original's */
    char scaled[2200], scaled_out[2300], scaled_json[2300];
    snprintf(scaled, sizeof scaled, "%s/llama3", hf);
    snprintf(scaled_out, sizeof scaled_out, "%s/llama3_export", c.dir);
    snprintf(scaled_json, sizeof scaled_json, "%s/llama3_export_loss.json", c.dir);
    code = ckpt_tool(c.dir, "llama3_export", (const char *const[]){"export", scaled, scaled_out, NULL}, &err);
    cr_assert_eq(code, 0, "export llama3: %s", err);
    free(err);
    hf_check(c.dir, "loss", (const char *const[]){"loss", scaled_out, val, "4", "32", "3", scaled_json, NULL});
    cJSON *ex = load_json(scaled_json), *ref2 = load_json(ref_path);
    double got = tu_json_num(ex, "loss"), want = tu_json_num(ref2, "llama3");
    cr_assert(fabs(got - want) <= 1e-6 * fabs(want), "llama3 export in transformers %.9g, original %.9g", got, want);
    cJSON_Delete(ex);
    cJSON_Delete(ref2);
    tt_teardown(&c);
}

/* Sliding-window attention the same way: a save_pretrained MistralForCausalLM (window 7 over windows of 32
 * tokens) and a Qwen2ForCausalLM with the window from layer 1 on evaluate to transformers' losses (which the
 * window changes: the Mistral's differs from its full-attention loss), and their exports open in transformers
 * with the same losses and the same window in config.json. */
Test(train_hf, sliding_window_in_and_out, .timeout = 300)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    char hf[2048], val[2048], ref_path[2100];
    snprintf(hf, sizeof hf, "%s/window", c.dir);
    snprintf(val, sizeof val, "%s/val.bin", c.data);
    hf_check(c.dir, "make_window", (const char *const[]){"make_window", hf, val, "4", "32", "3", NULL});
    snprintf(ref_path, sizeof ref_path, "%s/ref.json", hf);
    cJSON *ref = load_json(ref_path);
    cr_assert(fabs(tu_json_num(ref, "mistral") - tu_json_num(ref, "mistral_full")) > 1e-4,
              "the window does not change transformers' loss (%.9g): the test would not see it ignored",
              tu_json_num(ref, "mistral"));
    static const struct {
        const char *name, *arch, *window_key;
        int window;
    } m[] = {{"mistral", "MistralForCausalLM", "sliding_window", 7}, {"qwen2w", "Qwen2ForCausalLM", "sliding_window", 5}};
    for (int i = 0; i < 2; i++) {
        char model[2200], json[2200], exp[2200], exp_json[2300], tag[64], cfg[2300];
        snprintf(model, sizeof model, "%s/%s", hf, m[i].name);
        snprintf(json, sizeof json, "%s/eval_%s.json", c.dir, m[i].name);
        snprintf(tag, sizeof tag, "eval_%s", m[i].name);
        char *err;
        int code = ckpt_tool(c.dir, tag,
                             (const char *const[]){"eval", model, "--data", val, "--batch", "4", "--block_size", "32",
                                                   "--steps", "3", "--json", json, NULL},
                             &err);
        cr_assert_eq(code, 0, "eval %s: %s", m[i].name, err);
        free(err);
        cJSON *e = load_json(json);
        double want = tu_json_num(ref, m[i].name), got = tu_json_num(e, "loss");
        cr_assert(fabs(got - want) <= 1e-5 * fabs(want), "%s: fsdp-ckpt eval %.9g, transformers %.9g", m[i].name, got,
                  want);
        cr_log_info("%s: eval %.7f vs transformers %.7f", m[i].name, got, want);
        snprintf(exp, sizeof exp, "%s/%s_export", c.dir, m[i].name);
        snprintf(exp_json, sizeof exp_json, "%s/%s_export_loss.json", c.dir, m[i].name);
        snprintf(tag, sizeof tag, "export_%s", m[i].name);
        code = ckpt_tool(c.dir, tag, (const char *const[]){"export", model, exp, NULL}, &err);
        cr_assert_eq(code, 0, "export %s: %s", m[i].name, err);
        free(err);
        snprintf(cfg, sizeof cfg, "%s/config.json", exp);
        cJSON *cj = load_json(cfg);
        cr_assert_eq(tu_json_num(cj, m[i].window_key), m[i].window, "%s: the export's config.json", m[i].name);
        snprintf(tag, sizeof tag, "loss_%s", m[i].name);
        hf_check(c.dir, tag, (const char *const[]){"loss", exp, val, "4", "32", "3", exp_json, NULL});
        cJSON *x = load_json(exp_json);
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(x, "architecture")->valuestring, m[i].arch);
        cr_assert(fabs(tu_json_num(x, "loss") - want) <= 1e-6 * fabs(want), "%s export in transformers %.9g, original %.9g",
                  m[i].name, tu_json_num(x, "loss"), want);
        cJSON_Delete(x);
        cJSON_Delete(cj);
        cJSON_Delete(e);
    }
    cJSON_Delete(ref);
    tt_teardown(&c);
}

/* Qwen2 the same way: a save_pretrained Qwen2ForCausalLM directory (q/k/v biases, tied head) evaluates to
 * transformers' loss, and its export opens in transformers with the same loss. */
Test(train_hf, qwen2_in_and_out, .timeout = 300)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    char hf[2048], val[2048], model[2100], ref_path[2100], json[2200], exp[2200], exp_json[2300];
    snprintf(hf, sizeof hf, "%s/qwen2", c.dir);
    snprintf(val, sizeof val, "%s/val.bin", c.data);
    hf_check(c.dir, "make_qwen2", (const char *const[]){"make_qwen2", hf, val, "4", "32", "3", NULL});
    snprintf(model, sizeof model, "%s/model", hf);
    snprintf(ref_path, sizeof ref_path, "%s/ref.json", hf);
    snprintf(json, sizeof json, "%s/eval_qwen2.json", c.dir);
    char *err;
    int code = ckpt_tool(c.dir, "eval_qwen2",
                         (const char *const[]){"eval", model, "--data", val, "--batch", "4", "--block_size", "32",
                                               "--steps", "3", "--json", json, NULL},
                         &err);
    cr_assert_eq(code, 0, "eval qwen2: %s", err);
    free(err);
    cJSON *ref = load_json(ref_path), *e = load_json(json);
    double want = tu_json_num(ref, "model"), got = tu_json_num(e, "loss");
    cr_assert(fabs(got - want) <= 1e-5 * fabs(want), "qwen2: fsdp-ckpt eval %.9g, transformers %.9g", got, want);
    cr_log_info("qwen2: eval %.7f vs transformers %.7f", got, want);
    snprintf(exp, sizeof exp, "%s/qwen2_export", c.dir);
    snprintf(exp_json, sizeof exp_json, "%s/qwen2_export_loss.json", c.dir);
    code = ckpt_tool(c.dir, "qwen2_export", (const char *const[]){"export", model, exp, NULL}, &err);
    cr_assert_eq(code, 0, "export qwen2: %s", err);
    free(err);
    hf_check(c.dir, "loss", (const char *const[]){"loss", exp, val, "4", "32", "3", exp_json, NULL});
    cJSON *x = load_json(exp_json);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(x, "architecture")->valuestring, "Qwen2ForCausalLM");
    cr_assert(fabs(tu_json_num(x, "loss") - want) <= 1e-6 * fabs(want), "qwen2 export in transformers %.9g, original %.9g",
              tu_json_num(x, "loss"), want);
    cJSON_Delete(x);
    cJSON_Delete(e);
    cJSON_Delete(ref);
    tt_teardown(&c);
}

/* Qwen3 out: a save_pretrained Qwen3ForCausalLM (q/k norms, head_dim 16 where hidden / heads is 12)
 * evaluates to transformers' loss; fsdp-worker trains it 3 steps at world 2 and saves a FULL_STATE_DICT
 * checkpoint; that directory and its sharded export open in from_pretrained as Qwen3ForCausalLM with
 * head_dim 16 and give fsdpc's logits (1e-5), and transformers' loss of the export on the eval windows is
 * the trained model's loss that `fsdp-ckpt eval` computes from the checkpoint (the next step's loss, 1e-5),
 * away from the untrained model's. */
Test(train_hf, qwen3_out_of_training, .timeout = 600)
{
    need_venv();
    struct tt_ctx c;
    tt_setup(&c);
    char hf[2048], val[2048], model[2100], ref_path[2100], json[2200];
    snprintf(hf, sizeof hf, "%s/qwen3", c.dir);
    snprintf(val, sizeof val, "%s/val.bin", c.data);
    hf_check(c.dir, "make_qwen3", (const char *const[]){"make_qwen3", hf, val, "4", "32", "3", NULL});
    snprintf(model, sizeof model, "%s/model", hf);
    snprintf(ref_path, sizeof ref_path, "%s/ref.json", hf);
    snprintf(json, sizeof json, "%s/eval_qwen3.json", c.dir);
    char *err;
    int code = ckpt_tool(c.dir, "eval_qwen3",
                         (const char *const[]){"eval", model, "--data", val, "--batch", "4", "--block_size", "32",
                                               "--steps", "3", "--json", json, NULL},
                         &err);
    cr_assert_eq(code, 0, "eval qwen3: %s", err);
    free(err);
    cJSON *ref = load_json(ref_path), *e = load_json(json);
    double untrained = tu_json_num(ref, "model"), got = tu_json_num(e, "loss");
    cr_assert(fabs(got - untrained) <= 1e-5 * fabs(untrained), "qwen3: fsdp-ckpt eval %.9g, transformers %.9g", got,
              untrained);
    cJSON_Delete(e);
    cJSON_Delete(ref);

    char ini[2200], text[8192], from[2200];
    snprintf(ini, sizeof ini, "%s/qwen3.ini", c.dir);
    snprintf(text, sizeof text,
             "[train]\ndevice = cpu\ntrain_batch = 4\nmicro_batch = 2\nmax_steps = 3\neval_interval = 0\n"
             "[optim]\nlr = 0.01\nwarmup_steps = 0\n[data]\ntrain_file = %s/train.bin\nval_file = %s\n",
             c.data, val);
    lu_write_text(ini, text);
    snprintf(from, sizeof from, "--model.init_from=%s", model);
    struct tt_result r;
    tt_run_ini(&c, ini, 2, "w2",
               (const char *const[]){from, "--checkpoint.state_dict_type=FULL_STATE_DICT", "--checkpoint.interval=0",
                                     "--model.block_size=32", NULL},
               &r);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_assert(tt_summary_matches(&r, 0, "{\"model\":{\"family\":\"qwen3\",\"head_dim\":16}}"), "%s", r.err);
    tt_result_free(&r);

    char root[2300], ck[2400], batch[2300], out_dir[2300], cfg_path[2400];
    snprintf(root, sizeof root, "%s/w2/ckpt", c.dir);
    snprintf(ck, sizeof ck, "%s/fsdp_cpt3", root);
    snprintf(batch, sizeof batch, "%s/qwen3_batch.safetensors", c.dir);
    our_logits(root, val, batch);
    check_logits_of(&c, ck, batch, "qwen3_full_checkpoint", "Qwen3ForCausalLM", false);
    snprintf(out_dir, sizeof out_dir, "%s/qwen3_export", c.dir);
    code = ckpt_tool(c.dir, "qwen3_export",
                     (const char *const[]){"export", root, out_dir, "--max_shard_size", "60KB", NULL}, &err);
    cr_assert_eq(code, 0, "export qwen3: %s", err);
    free(err);
    check_logits_of(&c, out_dir, batch, "qwen3_export_sharded", "Qwen3ForCausalLM", false);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out_dir);
    cJSON *cfg = load_json(cfg_path);
    cr_assert_eq(tu_json_num(cfg, "head_dim"), 16, "the export's config.json: head_dim");
    cr_assert_eq(tu_json_num(cfg, "hidden_size"), 48);
    cr_assert_eq(tu_json_num(cfg, "num_attention_heads"), 4);
    cJSON_Delete(cfg);

    /* the next step's loss: fsdpc's of the trained checkpoint, transformers' of its export */
    char ours_json[2400], theirs_json[2400];
    snprintf(ours_json, sizeof ours_json, "%s/eval_trained.json", c.dir);
    code = ckpt_tool(c.dir, "eval_trained",
                     (const char *const[]){"eval", root, "--data", val, "--batch", "4", "--block_size", "32",
                                           "--steps", "3", "--json", ours_json, NULL},
                     &err);
    cr_assert_eq(code, 0, "eval of the trained checkpoint: %s", err);
    free(err);
    snprintf(theirs_json, sizeof theirs_json, "%s/qwen3_export_loss.json", c.dir);
    hf_check(c.dir, "loss", (const char *const[]){"loss", out_dir, val, "4", "32", "3", theirs_json, NULL});
    cJSON *ours = load_json(ours_json), *theirs = load_json(theirs_json);
    double want = tu_json_num(ours, "loss"), hf_loss = tu_json_num(theirs, "loss");
    cr_assert_str_eq(tu_json_str(theirs, "architecture"), "Qwen3ForCausalLM");
    cr_assert(fabs(hf_loss - want) <= 1e-5 * fabs(want), "qwen3 export in transformers %.9g, fsdpc %.9g", hf_loss,
              want);
    cr_assert(fabs(want - untrained) > 1e-3 * fabs(untrained),
              "3 steps did not move the loss (%.9g, untrained %.9g): the check would not see a stale export", want,
              untrained);
    cr_log_info("qwen3: trained loss %.7f in fsdpc, %.7f in transformers (untrained %.7f)", want, hf_loss, untrained);
    cJSON_Delete(ours);
    cJSON_Delete(theirs);
    tt_teardown(&c);
}
