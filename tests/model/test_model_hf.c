/* Hugging Face interchange in the model library: config.json read (defaults, settings, keys the model
 * cannot honour) and written back; weights from a directory (one file or an index with shards, F32 / BF16
 * / F16, with or without the "transformer." prefix, mask buffers and the tied head skipped), read by byte
 * ranges (the bytes a quarter of the model needs, counted by the kernel in /proc/self/io); pickles and
 * training checkpoints refused with what to do instead. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "worker/model/model_hf.h"

static char dir[64];

static void setup(void)
{
    strcpy(dir, "/tmp/model_hf_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(model_hf, .init = setup, .fini = teardown);

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static char *sub(const char *name)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

/* config.json as transformers 5.24 writes it for GPT2Config(n_layer=2, n_head=3, n_embd=36, vocab_size=77,
 * n_positions=40). */
static const char gpt2_config[] =
    "{\n  \"activation_function\": \"gelu_new\",\n  \"add_cross_attention\": false,\n  \"architectures\": [\n"
    "    \"GPT2LMHeadModel\"\n  ],\n  \"attn_pdrop\": 0.1,\n  \"bos_token_id\": 50256,\n  \"dtype\": \"float32\",\n"
    "  \"embd_pdrop\": 0.1,\n  \"eos_token_id\": 50256,\n  \"initializer_range\": 0.02,\n"
    "  \"layer_norm_epsilon\": 1e-05,\n  \"model_type\": \"gpt2\",\n  \"n_embd\": 36,\n  \"n_head\": 3,\n"
    "  \"n_inner\": null,\n  \"n_layer\": 2,\n  \"n_positions\": 40,\n  \"pad_token_id\": null,\n"
    "  \"reorder_and_upcast_attn\": false,\n  \"resid_pdrop\": 0.1,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
    "  \"scale_attn_weights\": true,\n  \"summary_activation\": null,\n  \"tie_word_embeddings\": true,\n"
    "  \"transformers_version\": \"5.24.0\",\n  \"use_cache\": true,\n  \"vocab_size\": 77\n}\n";

static const struct model_hf_setting *setting(const struct model_hf_config *c, const char *key)
{
    for (int i = 0; i < c->n_settings; i++)
        if (strcmp(c->settings[i].key, key) == 0)
            return &c->settings[i];
    return NULL;
}

Test(model_hf, reads_gpt2_config_json)
{
    write_text(sub("config.json"), gpt2_config);
    cr_assert(model_hf_is_dir(dir));
    struct model_hf_config c;
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_str_eq(c.config.model_family, "gpt2");
    cr_assert_eq(c.config.n_layer, 2);
    cr_assert_eq(c.config.n_head, 3);
    cr_assert_eq(c.config.n_embd, 36);
    cr_assert_eq(c.config.vocab_size, 77);
    cr_assert_eq(c.config.block_size, 40);
    const struct model_hf_setting *s = setting(&c, "block_size");
    cr_assert(s && strcmp(s->value, "40") == 0 && strcmp(s->hf_key, "n_positions") == 0 && s->at_most);
    s = setting(&c, "n_embd");
    cr_assert(s && strcmp(s->value, "36") == 0 && !s->at_most);
    s = setting(&c, "model_family");
    cr_assert(s && strcmp(s->value, "gpt2") == 0);
    cr_assert_null(setting(&c, "init_std"), "initializer_range is not a shape setting");
}

Test(model_hf, absent_keys_take_transformers_defaults)
{
    write_text(sub("config.json"), "{\"model_type\": \"gpt2\"}");
    struct model_hf_config c;
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_eq(c.config.n_layer, 12);
    cr_assert_eq(c.config.n_embd, 768);
    cr_assert_eq(c.config.vocab_size, 50257);
    cr_assert_eq(c.config.block_size, 1024);
}

/* Each key the model cannot honour names itself, its value and what fsdpc computes. */
Test(model_hf, refuses_what_the_model_cannot_compute)
{
    static const struct {
        const char *json, *frag;
    } cases[] = {
        {"{\"model_type\":\"gpt2\",\"activation_function\":\"relu\"}", "\"activation_function\" is \"relu\""},
        {"{\"model_type\":\"gpt2\",\"layer_norm_epsilon\":1e-6}", "LayerNorm uses 1e-05"},
        {"{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_inner\":100}", "\"n_inner\" is 100"},
        /* 4 x n_embd past int: refused before anything overflows (UBSan stopped here) */
        {"{\"model_type\":\"gpt2\",\"n_embd\":1000000000}", "\"n_embd\" is 1000000000, too large"},
        {"{\"model_type\":\"gpt2\",\"tie_word_embeddings\":false}", "tie_word_embeddings"},
        {"{\"model_type\":\"gpt2\",\"scale_attn_by_inverse_layer_idx\":true}", "scale_attn_by_inverse_layer_idx"},
        {"{\"model_type\":\"gpt2\",\"n_layer\":2.5}", "\"n_layer\" must be an integer"},
        {"{\"architectures\":[\"BertForMaskedLM\"],\"model_type\":\"bert\"}", "GPT2LMHeadModel"},
        {"[1, 2]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(sub("config.json"), cases[i].json);
        struct model_hf_config c;
        cr_assert_neq(model_hf_config_read(dir, &c), 0, "accepted %s", cases[i].json);
        cr_assert(strstr(error_message(), cases[i].frag) && strstr(error_message(), "config.json"),
                  "%s: %s (expected %s)", cases[i].json, error_message(), cases[i].frag);
    }
    /* model_type alone is enough when the architecture is a sibling class (GPT2Model). */
    write_text(sub("config.json"), "{\"architectures\":[\"GPT2Model\"],\"model_type\":\"gpt2\",\"n_layer\":3}");
    struct model_hf_config c;
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_eq(c.config.n_layer, 3);
}

static void small_config(struct model_config *c, int vocab, int block)
{
    model_config_default(c);
    c->n_layer = 2;
    c->n_head = 3;
    c->n_embd = 36;
    c->vocab_size = vocab;
    c->block_size = block;
}

Test(model_hf, config_write_reads_back_with_special_ids_inside_the_vocabulary)
{
    struct model_config mc;
    small_config(&mc, 77, 40);
    mc.init_std = 0.013f;
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &mc), 0, "%s", error_message());
    cr_assert_eq(model_hf_config_write(&l, dir, NULL, "bfloat16"), 0, "%s", error_message());
    struct model_hf_config c;
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_eq(c.config.n_layer, 2);
    cr_assert_eq(c.config.n_head, 3);
    cr_assert_eq(c.config.n_embd, 36);
    cr_assert_eq(c.config.vocab_size, 77);
    cr_assert_eq(c.config.block_size, 40);
    cr_assert_eq(c.config.init_std, 0.013f);
    FILE *f = fopen(sub("config.json"), "r");
    char text[4096] = "";
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cr_assert(strstr(text, "\"GPT2LMHeadModel\"") && strstr(text, "\"bfloat16\""), "%s", text);
    /* No tokenizer: GPT-2's 50256 does not fit a 77-token vocabulary; the last id does. */
    cr_assert(strstr(text, "\"eos_token_id\":\t76") && strstr(text, "\"bos_token_id\":\t76"), "%s", text);
    cr_assert(strstr(text, "\"initializer_range\":\t0.013,"), "%s", text);
    struct model_hf_tokens t = {.bos = 3, .eos = 5};
    cr_assert_eq(model_hf_config_write(&l, dir, &t, "float32"), 0);
    f = fopen(sub("config.json"), "r");
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cr_assert(strstr(text, "\"eos_token_id\":\t5") && strstr(text, "\"bos_token_id\":\t3"), "%s", text);
    model_layout_free(&l);
}

Test(model_hf, tokenizer_special_ids)
{
    write_text(sub("tokenizer.json"),
               "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":300,\"content\":\"<|endoftext|>\",\"special\":true}],"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}");
    struct model_hf_tokens t;
    cr_assert_eq(model_hf_tokenizer_tokens(sub("tokenizer.json"), &t), 0, "%s", error_message());
    cr_assert_eq(t.eos, 300);
    cr_assert_eq(t.bos, 300);
    write_text(sub("tokenizer.json"),
               "{\"added_tokens\":[{\"id\":1,\"content\":\"<|begin_of_text|>\"},{\"id\":2,\"content\":\"<|end_of_text|>\"}]}");
    cr_assert_eq(model_hf_tokenizer_tokens(sub("tokenizer.json"), &t), 0);
    cr_assert_eq(t.bos, 1);
    cr_assert_eq(t.eos, 2);
}

/* Element i of parameter p, exactly representable in bf16 and f16 so every dtype reads back the same. */
static float value(int p, size_t i)
{
    return (float)((int)((i * 7 + (size_t)p * 13) % 61) - 30) / 64.0f;
}

enum { PREFIXED = 1, BUFFERS = 2 };

/* Writes the model of l as Hugging Face files in dir: shards files (1: model.safetensors, more: an
 * index), dtype, optional "transformer." prefix and the buffers transformers used to save. */
static void write_hf(const struct model_layout *l, int shards, enum safetensors_dtype dt, int flags, int wpe_rows)
{
    int n = l->n_params;
    struct safetensors_entry *e = calloc((size_t)n + 8, sizeof *e);
    char(*names)[96] = calloc((size_t)n + 8, sizeof *names);
    void **data = calloc((size_t)n + 8, sizeof *data);
    int *shard = calloc((size_t)n + 8, sizeof *shard);
    int m = 0;
    for (int p = 0; p < n; p++, m++) {
        const struct model_param *mp = &l->params[p];
        int rows = mp->position_rows && wpe_rows ? wpe_rows : mp->init_rows;
        size_t cnt = (size_t)rows * mp->shape[1];
        snprintf(names[m], 96, "%s%s", flags & PREFIXED ? "transformer." : "", mp->name);
        void *d = malloc(cnt * 4);
        for (size_t i = 0; i < cnt; i++) {
            float v = value(p, i);
            if (dt == SAFETENSORS_F32)
                ((float *)d)[i] = v;
            else
                ((uint16_t *)d)[i] = dt == SAFETENSORS_BF16 ? dtype_f32_to_bf16(v) : dtype_f32_to_f16(v);
        }
        data[m] = d;
        e[m] = (struct safetensors_entry){.name = names[m], .dtype = dt, .ndim = mp->ndim,
                                          .shape = {rows, mp->ndim == 2 ? mp->shape[1] : 0}, .data = d};
        shard[m] = p * shards / n;
    }
    if (flags & BUFFERS) {
        static uint8_t mask[16];
        static float tied[1];
        snprintf(names[m], 96, "%sh.1.attn.bias", flags & PREFIXED ? "transformer." : "");
        e[m] = (struct safetensors_entry){.name = names[m], .dtype = SAFETENSORS_U8, .ndim = 4,
                                          .shape = {1, 1, 4, 4}, .data = mask};
        shard[m++] = 0;
        snprintf(names[m], 96, "%sh.0.attn.masked_bias", flags & PREFIXED ? "transformer." : "");
        e[m] = (struct safetensors_entry){.name = names[m], .dtype = SAFETENSORS_F32, .ndim = 0, .data = tied};
        shard[m++] = shards - 1;
        snprintf(names[m], 96, "lm_head.weight");
        e[m] = (struct safetensors_entry){.name = names[m], .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {1},
                                          .data = tied};
        shard[m++] = shards - 1;
    }
    FILE *idx = NULL;
    int listed = 0;
    if (shards > 1) {
        idx = fopen(sub("model.safetensors.index.json"), "w");
        fprintf(idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    }
    for (int s = 0; s < shards; s++) {
        struct safetensors_entry *part = calloc((size_t)m, sizeof *part);
        int k = 0;
        char file[64];
        if (shards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
        for (int i = 0; i < m; i++)
            if (shard[i] == s) {
                part[k++] = e[i];
                if (idx)
                    fprintf(idx, "%s\"%s\": \"%s\"", listed++ ? ", " : "", e[i].name, file);
            }
        struct safetensors_meta meta = {.key = "format", .value = "pt"};
        cr_assert_eq(safetensors_write(sub(file), part, (size_t)k, &meta, 1, NULL, NULL), 0, "%s", error_message());
        free(part);
    }
    if (idx) {
        fprintf(idx, "}}\n");
        fclose(idx);
    }
    for (int i = 0; i < n; i++)
        free(data[i]);
    free(data);
    free(e);
    free(names);
    free(shard);
}

static void check_all(const struct model_layout *l, const char *path)
{
    float *got = malloc(l->numel * sizeof *got);
    memset(got, 0xff, l->numel * sizeof *got);
    cr_assert_eq(model_weights_load(l, path, got), 0, "%s: %s", path, error_message());
    for (int p = 0; p < l->n_params; p++) {
        const struct model_param *mp = &l->params[p];
        size_t real = (size_t)mp->init_rows * mp->shape[1];
        for (size_t i = 0; i < mp->numel; i++) {
            float want = i < real ? value(p, i) : 0.0f;
            cr_assert_eq(got[mp->offset + i], want, "%s: %s[%zu] = %g, want %g", path, mp->name, i,
                         (double)got[mp->offset + i], (double)want);
        }
    }
    free(got);
}

Test(model_hf, loads_every_layout_save_pretrained_writes)
{
    struct model_config mc;
    small_config(&mc, 77, 16);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &mc), 0, "%s", error_message());
    const enum safetensors_dtype dts[] = {SAFETENSORS_F32, SAFETENSORS_BF16, SAFETENSORS_F16};
    for (int d = 0; d < 3; d++)
        for (int shards = 1; shards <= 3; shards += 2)
            for (int flags = 0; flags < 4; flags++) {
                char cmd[160];
                snprintf(cmd, sizeof cmd, "rm -f %s/*", dir);
                cr_assert_eq(system(cmd), 0);
                /* wpe with 40 rows, as n_positions 40: a block_size of 16 uses the first 16. */
                write_hf(&l, shards, dts[d], flags, 40);
                check_all(&l, dir);
                if (shards > 1) /* the index file itself also names the model */
                    check_all(&l, sub("model.safetensors.index.json"));
                else
                    check_all(&l, sub("model.safetensors"));
            }
    model_layout_free(&l);
}

static unsigned long long rchar(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    cr_assert_not_null(f, "no /proc/self/io");
    char line[128];
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %llu", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* A rank of 4 that owns a quarter of every tensor reads about a quarter of the data: counted by the
 * reader and by the kernel (every read syscall of this process, headers included). */
Test(model_hf, a_rank_reads_only_the_bytes_it_holds)
{
    struct model_config mc;
    small_config(&mc, 4000, 64);
    mc.n_embd = 96;
    mc.n_head = 4;
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &mc), 0, "%s", error_message());
    write_hf(&l, 2, SAFETENSORS_BF16, PREFIXED, 0);
    unsigned long long total = 0;
    for (int p = 0; p < l.n_params; p++)
        total += (unsigned long long)l.params[p].init_rows * l.params[p].shape[1] * 2;
    struct model_weights *w;
    cr_assert_eq(model_weights_open(&l, dir, "model.init_from", &w), 0, "%s", error_message());
    float *buf = malloc(l.numel * sizeof *buf);
    unsigned long long before = rchar(), want = 0;
    for (int p = 0; p < l.n_params; p++) {
        /* rank 1 of 4 under fsdp_version 2: its dim-0 chunk of rows */
        const struct model_param *mp = &l.params[p];
        size_t chunk = ((size_t)mp->shape[0] + 3) / 4, r0 = chunk, r1 = 2 * chunk;
        r1 = r1 < (size_t)mp->shape[0] ? r1 : (size_t)mp->shape[0];
        size_t cols = (size_t)mp->shape[1], begin = r0 * cols, count = r1 > r0 ? (r1 - r0) * cols : 0;
        cr_assert_eq(model_weights_read(w, p, begin, count, buf), 0, "%s", error_message());
        for (size_t i = 0; i < count; i++) {
            size_t at = begin + i;
            float want_v = at < (size_t)mp->init_rows * cols ? value(p, at) : 0.0f;
            cr_assert_eq(buf[i], want_v, "%s[%zu]", mp->name, at);
        }
        size_t real = (size_t)mp->init_rows * cols;
        want += (begin < real ? (count < real - begin ? count : real - begin) : 0) * 2;
    }
    unsigned long long kernel = rchar() - before;
    cr_assert_eq(model_weights_bytes_read(w), want);
    cr_assert(want < total / 4 + total / 50, "a quarter of the rows is %llu of %llu bytes", want, total);
    cr_assert(kernel >= want && kernel <= want + 4096, "the kernel counted %llu bytes read for %llu of tensor data",
              kernel, want);
    cr_log_info("read %llu of %llu bytes (kernel: %llu)", want, total, kernel);
    model_weights_close(w);
    free(buf);
    model_layout_free(&l);
}

Test(model_hf, shape_and_name_errors_name_the_file_and_tensor)
{
    struct model_config mc;
    small_config(&mc, 77, 16);
    struct model_layout l, other;
    cr_assert_eq(model_layout_build(&l, &mc), 0);
    mc.n_embd = 48;
    cr_assert_eq(model_layout_build(&other, &mc), 0);
    write_hf(&other, 1, SAFETENSORS_F32, PREFIXED, 0);
    struct model_weights *w;
    cr_assert_neq(model_weights_open(&l, dir, "model.init_from", &w), 0);
    cr_assert(strstr(error_message(), "model.safetensors") && strstr(error_message(), "has shape"), "%s",
              error_message());
    mc.n_embd = 36;
    mc.n_layer = 3;
    struct model_layout deeper;
    cr_assert_eq(model_layout_build(&deeper, &mc), 0);
    write_hf(&l, 1, SAFETENSORS_F32, 0, 0);
    cr_assert_neq(model_weights_open(&deeper, dir, "model.init_from", &w), 0);
    cr_assert(strstr(error_message(), "'h.2.ln_1.weight' is missing"), "%s", error_message());
    model_layout_free(&l);
    model_layout_free(&other);
    model_layout_free(&deeper);
}

/* The seed guide's habits: a torch pickle where weights belong says pickles are not read and gives the
 * line of Python that converts it. */
Test(model_hf, pickles_are_refused_with_the_conversion)
{
    struct model_config mc;
    small_config(&mc, 77, 16);
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &mc), 0);
    write_text(sub("fsdp_cpt4000.pth"), "not read");
    write_text(sub("weights"), "PK\3\4 a zip archive, as torch.save writes");
    mkdir(sub("hfbin"), 0755);
    write_text(sub("hfbin/config.json"), gpt2_config);
    write_text(sub("hfbin/pytorch_model.bin"), "x");
    const char *paths[] = {sub("fsdp_cpt4000.pth"), sub("weights"), sub("hfbin")};
    for (int i = 0; i < 3; i++) {
        struct model_weights *w;
        cr_assert_eq(model_weights_open(&l, paths[i], "model.init_from", &w), FSDP_EUNSUPPORTED, "%s", paths[i]);
        const char *m = error_message();
        cr_assert(strstr(m, "model.init_from = ") && strstr(m, "pickles are not read") &&
                      strstr(m, "from safetensors.torch import save_file") && strstr(m, "weights_only=True"),
                  "%s", m);
        cr_assert_eq(model_weights_check_path(paths[i], "model.init_from"), FSDP_EUNSUPPORTED);
    }
    model_layout_free(&l);
}

Test(model_hf, a_training_checkpoint_or_an_empty_directory_says_what_to_pass)
{
    mkdir(sub("fsdp_sharded_cpt8"), 0755);
    write_text(sub("fsdp_sharded_cpt8/metadata.json"), "{}");
    cr_assert_neq(model_weights_check_path(sub("fsdp_sharded_cpt8"), "model.init_from"), 0);
    cr_assert(strstr(error_message(), "checkpoint.resume_from = ") && strstr(error_message(), "fsdp-ckpt export"),
              "%s", error_message());
    mkdir(sub("empty"), 0755);
    cr_assert_eq(model_weights_check_path(sub("empty"), "model.init_from"), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "neither model.safetensors nor model.safetensors.index.json"), "%s",
              error_message());
    cr_assert_eq(model_weights_check_path(sub("missing"), "model.init_from"), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "model.init_from = ") && strstr(error_message(), "missing"), "%s",
              error_message());
}

/* Llama's config.json, as transformers 5 writes it (rope_parameters) and as 4.x did (top-level rope_theta),
 * written back and read again; what the model cannot compute is refused. */
Test(model_hf, llama_config_json)
{
    write_text(sub("config.json"),
               "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
               "\"intermediate_size\":96,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
               "\"vocab_size\":300,\"max_position_embeddings\":128,\"rms_norm_eps\":1e-05,\"head_dim\":16,"
               "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"default\"},\"tie_word_embeddings\":true}");
    struct model_hf_config c;
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_str_eq(c.config.model_family, "llama");
    cr_assert(c.config.n_layer == 2 && c.config.n_head == 4 && c.config.n_kv_head == 2 && c.config.n_embd == 64 &&
              c.config.intermediate_size == 96 && c.config.vocab_size == 300 && c.config.block_size == 128);
    cr_assert_eq(c.config.rope_theta, 500000.0f);
    cr_assert_eq(c.config.rms_norm_eps, 1e-5f);
    cr_assert(c.config.tie_word_embeddings);
    const struct model_hf_setting *s = setting(&c, "rms_norm_eps");
    cr_assert(s && strcmp(s->value, "1e-05") == 0, "%s", s ? s->value : "none");
    s = setting(&c, "rope_theta");
    cr_assert(s && strcmp(s->hf_key, "rope_theta") == 0 && strcmp(s->value, "500000") == 0);
    /* written back, read again */
    struct model_layout l;
    cr_assert_eq(model_layout_build(&l, &c.config), 0, "%s", error_message());
    cr_assert_eq(model_hf_config_write(&l, dir, NULL, "float32"), 0, "%s", error_message());
    struct model_hf_config c2;
    cr_assert_eq(model_hf_config_read(dir, &c2), 0, "%s", error_message());
    cr_assert(c2.config.n_kv_head == 2 && c2.config.rope_theta == 500000.0f && c2.config.tie_word_embeddings &&
              c2.config.intermediate_size == 96);
    model_layout_free(&l);
    /* 4.x: rope_theta at the top */
    write_text(sub("config.json"), "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                                   "\"rope_theta\":250000.0,\"rope_scaling\":null}");
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_eq(c.config.rope_theta, 250000.0f);
    cr_assert_eq(c.config.n_kv_head, 4, "num_key_value_heads defaults to num_attention_heads");
    cr_assert_eq(c.config.rope_scaling, MODEL_ROPE_DEFAULT);
    /* Llama 3.1's rope scaling, in transformers 5's spelling and in 4.x's: the same config */
    static const char *const scaled[] = {
        "{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"llama3\",\"factor\":32,"
        "\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}",
        "{\"model_type\":\"llama\",\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32,"
        "\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}",
    };
    for (int i = 0; i < 2; i++) {
        write_text(sub("config.json"), scaled[i]);
        cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
        cr_assert_eq(c.config.rope_scaling, MODEL_ROPE_LLAMA3);
        cr_assert_eq(c.config.rope_theta, 500000.0f);
        cr_assert_eq(c.config.rope_factor, 32.0f);
        cr_assert_eq(c.config.rope_low_freq_factor, 1.0f);
        cr_assert_eq(c.config.rope_high_freq_factor, 4.0f);
        cr_assert_eq(c.config.rope_original_max_position, 8192);
    }
    static const struct {
        const char *json, *frag;
    } bad[] = {
        {"{\"model_type\":\"llama\",\"hidden_act\":\"gelu\"}", "SwiGLU"},
        {"{\"model_type\":\"llama\",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}",
         "rope_type \"linear\" is not one fsdpc's Llama computes; it reads \"default\" and \"llama3\""},
        {"{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_theta\":1e4,\"rope_type\":\"yarn\"}}", "\"yarn\""},
        /* llama3 needs all four of its numbers */
        {"{\"model_type\":\"llama\",\"rope_parameters\":{\"rope_theta\":1e4,\"rope_type\":\"llama3\"}}",
         "\"factor\" is missing"},
        {"{\"model_type\":\"llama\",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
         "\"high_freq_factor\":4}}", "\"original_max_position_embeddings\" is missing"},
        {"{\"model_type\":\"llama\",\"rope_scaling\":\"llama3\"}", "must be an object or null"},
        {"{\"model_type\":\"llama\",\"attention_bias\":true}", "no biases"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(sub("config.json"), bad[i].json);
        cr_assert_neq(model_hf_config_read(dir, &c), 0, "accepted %s", bad[i].json);
        cr_assert(strstr(error_message(), bad[i].frag), "%s: %s", bad[i].json, error_message());
    }
    /* head_dim independent of hidden_size / num_attention_heads (Qwen3's 128 with 1024 / 16) is read, and
     * recorded as the [model] setting */
    write_text(sub("config.json"), "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                                   "\"head_dim\":32}");
    cr_assert_eq(model_hf_config_read(dir, &c), 0, "%s", error_message());
    cr_assert_eq(c.config.head_dim, 32);
    bool recorded = false;
    for (int i = 0; i < c.n_settings; i++)
        recorded |= strcmp(c.settings[i].key, "head_dim") == 0 && strcmp(c.settings[i].value, "32") == 0;
    cr_assert(recorded, "no [model] head_dim = 32 setting");
}
