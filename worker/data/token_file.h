/* Writing token files (docs/data.md, "Token files"): nanoGPT's headerless uint16, llm.c's header +
 * uint16, or llm.c's Llama 3 variant (magic 20240801, version 7) + uint32. A file is built under a
 * temporary name in its directory and renamed into place by token_file_commit after an fsync, so a reader
 * sees the old file or the complete new one. */
#ifndef FSDP_DATA_TOKEN_FILE_H
#define FSDP_DATA_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "worker/data/data_format.h"

struct token_file {
    char *final_path, *tmp_path;
    int fd;
    enum data_format format;
    int64_t tokens;
    unsigned char buf[65536];
    size_t buffered; /* bytes */
};

/* Creates DIR/.NAME.XXXXXX for DIR/NAME; with an llm.c format, a zeroed header to be filled at commit. */
int token_file_open(struct token_file *f, const char *dir, const char *name, enum data_format format);
/* Appends ids; each must fit the format's token size (checked: FSDP_ERANGE names the id). */
int token_file_put(struct token_file *f, const uint32_t *ids, size_t n);
/* Appends bytes as tokens (byte-level data: token = byte value). */
int token_file_put_bytes(struct token_file *f, const unsigned char *bytes, size_t n);
/* Writes the header's count, fsyncs, renames into place. */
int token_file_commit(struct token_file *f);
/* Closes, removes the temporary file if it was not committed, frees the paths. */
void token_file_cleanup(struct token_file *f);

/* Writes data to DIR/NAME the same atomic way (a sidecar JSON, a tokenizer copy). */
int token_file_write_small(const char *dir, const char *name, const void *data, size_t len);

#endif
