/* Where a run's tokenizer is (docs/data.md, "A run's tokenizer"), for fsdp-ckpt (sample, export): the
 * first of
 *   1. CKPT_DIR/tokenizer.json (a Hugging Face style directory carries its own),
 *   2. beside the run's [data] train_file (from the config text the checkpoint stores): the file that
 *      DATA_DIR/meta.json names (fsdp-prepare-data writes both), or DATA_DIR/tokenizer.json when there is no
 *      meta.json.
 * meta.json with "tokenizer": null means byte-level tokens: no tokenizer. A relative train_file is taken
 * relative to the current directory, as the worker that trained took it. */
#ifndef FSDP_TOOLS_RUN_TOKENIZER_H
#define FSDP_TOOLS_RUN_TOKENIZER_H

#include <stddef.h>

/* 0 with the tokenizer.json path in out; FSDP_ENOTFOUND (with a message saying where it looked) when the
 * run used byte-level tokens or its data directory is gone. ckpt_dir and config_text may be NULL. */
int run_tokenizer_find(const char *ckpt_dir, const char *config_text, char *out, size_t cap);

/* The value of `key` in [section] of an INI text (the effective config a checkpoint stores), without
 * surrounding quotes; FSDP_ENOTFOUND (no message) when absent or empty. */
int run_config_value(const char *config_text, const char *section, const char *key, char *out, size_t cap);

#endif
