/* What fsdp-prepare-data leaves beside the token files besides train.bin and val.bin (docs/data.md):
 * meta.json, a record of how they were made, and with a tokenizer its files (tokenizer.json, and
 * tokenizer_config.json / special_tokens_map.json copied when the tokenizer has them, else a
 * tokenizer_config.json naming the end-of-text token), so a run's tokenizer is found from its data. */
#ifndef FSDP_TOOLS_PREPARE_META_H
#define FSDP_TOOLS_PREPARE_META_H

#include <stddef.h>
#include <stdint.h>

#include "worker/data/data_format.h"
#include "worker/tokenizer/tokenizer.h"

#define PREPARE_META_FILE "meta.json"
#define PREPARE_META_VERSION 1

struct prepare_stats {
    size_t text_files, binary_skipped, utf8_skipped, utf8_replaced;
    size_t documents, bad_lines; /* JSON Lines: the documents read, the lines skipped (--skip-bad-lines) */
    uint64_t input_bytes, train_bytes, val_bytes; /* text bytes read; sent to each side */
    int64_t train_tokens, val_tokens;
    double seconds;
};

struct prepare_meta {
    const char *out_dir;
    const char *tokenizer_path; /* NULL: byte-level tokens */
    const struct tokenizer *tok;
    uint32_t vocab_size;
    enum data_format format;
    int64_t eot, bos; /* -1: none */
    const char *eot_text, *bos_text;
    const struct prepare_stats *stats;
};

/* The eos_token of the tokenizer_config.json beside tokenizer_json (a string or {"content": ...});
 * *eos NULL when there is no such file or key. A file that is not JSON is an error naming it. */
int prepare_meta_config_eos(const char *tokenizer_json, char **eos);
/* Copies the tokenizer's files into out_dir (when there is a tokenizer) and writes meta.json. */
int prepare_meta_write(const struct prepare_meta *m);

#endif
