/* Hugging Face interchange: the directory `save_pretrained` writes and `from_pretrained` opens.
 *
 *   config.json                      architecture, model_type and the family's shape keys
 *   model.safetensors                every parameter under its Hugging Face name, or, past a size limit,
 *   model.safetensors.index.json     {"metadata": {"total_size": ...}, "weight_map": {name: shard file}}
 *   model-00001-of-0000N.safetensors ...
 *
 * What differs between families (architecture name, config.json keys, the name prefix, buffers and tied
 * heads a file may hold beside the weights) is a field of the family's registry entry (model_internal.h);
 * the code here is the same for every family. docs/checkpoints.md describes the formats. */
#ifndef FSDP_WORKER_MODEL_HF_H
#define FSDP_WORKER_MODEL_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/model/model.h"

#define MODEL_HF_CONFIG "config.json"
#define MODEL_HF_WEIGHTS "model.safetensors"
#define MODEL_HF_INDEX "model.safetensors.index.json"
#define MODEL_HF_TOKENIZER "tokenizer.json"
#define MODEL_HF_MAX_SETTINGS 32

/* One [model] setting that a config.json implies, so the worker can reconcile it with its own config. */
struct model_hf_setting {
    char key[48];    /* the [model] key, e.g. "n_embd" (the longest: rope_original_max_position_embeddings) */
    char value[64];  /* its value in config syntax, e.g. "768" */
    char hf_key[48]; /* the config.json key it came from, e.g. "n_embd" */
    bool at_most;    /* an upper bound (the context length): a smaller [model] value is allowed */
};

struct model_hf_config {
    char path[FSDP_PATH_MAX]; /* the config.json that was read */
    struct model_config config;
    struct model_hf_setting settings[MODEL_HF_MAX_SETTINGS];
    int n_settings;
};

/* Special token ids for config.json; -1 = unknown (the family picks ids inside the vocabulary). */
struct model_hf_tokens {
    int bos, eos;
};

/* True when path is a directory holding config.json. */
bool model_hf_is_dir(const char *path);

/* Reads DIR/config.json: the family from "architectures" (else "model_type"), then the family's keys into
 * out->config (the family's defaults for absent keys, as transformers uses them) and out->settings.
 * Errors name the file and the key: an architecture no family has (the known ones are listed), a value
 * the family's model cannot compute (e.g. another activation function). */
int model_hf_config_read(const char *dir, struct model_hf_config *out);

/* Writes DIR/config.json for layout atomically: the family's architecture and keys, "dtype" and
 * "torch_dtype" (transformers 5's and 4's key; "float32", "bfloat16" or "float16"), the special ids. */
int model_hf_config_write(const struct model_layout *layout, const char *dir, const struct model_hf_tokens *tokens,
                          const char *torch_dtype);

/* Hugging Face's name of parameter p (the family's prefix + the layout name), e.g. "transformer.wte.weight". */
void model_hf_param_name(const struct model_layout *layout, int p, char *out, size_t cap);

/* Special token ids of a tokenizer.json: its added special tokens named like an end-of-text token
 * (<|endoftext|>, <|end_of_text|>, </s>, <eos>) and a beginning one (<|begin_of_text|>, <s>, <bos>);
 * without a beginning token bos = eos (GPT-2's convention). Absent ones are -1. */
int model_hf_tokenizer_tokens(const char *tokenizer_json, struct model_hf_tokens *out);

/* ---- weights, read by byte ranges ---- */

/* An open source of weights: a Hugging Face directory (model.safetensors, or the index and its shards),
 * a bare safetensors file, or an index file. Every tensor's name, dtype (F32, BF16, F16) and shape is
 * checked against the layout at open; no tensor data is read until asked for. */
struct model_weights;

/* Opens path for layout. A PyTorch pickle (.bin, .pt, .pth, .ckpt, or a directory holding only
 * pytorch_model.bin) is refused with the one line of Python that converts it; a training checkpoint
 * directory without config.json is refused naming resume_from and fsdp-ckpt export. what names the
 * setting in messages ("model.init_from"). */
int model_weights_open(const struct model_layout *layout, const char *path, const char *what,
                       struct model_weights **out);
/* The checks of model_weights_open that need no layout (the path exists; no pickle; a directory holds
 * weights), so a bad model.init_from fails before any work starts. */
int model_weights_check_path(const char *path, const char *what);
/* Elements [begin, begin + count) of parameter p's row-major tensor in the layout's shape: one pread of
 * exactly those bytes (converted to fp32 from BF16/F16); vocabulary padding rows read as 0. */
int model_weights_read(struct model_weights *w, int p, size_t begin, size_t count, float *dst);
/* Tensor data bytes read so far (headers excluded). */
uint64_t model_weights_bytes_read(const struct model_weights *w);
/* The safetensors dtype name of parameter p's tensor in the source ("F32", "BF16", "F16"). */
const char *model_weights_dtype(const struct model_weights *w, int p);
void model_weights_close(struct model_weights *w);

#endif
