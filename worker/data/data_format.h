/* The token-file formats (docs/data.md, "Token files"): what the reader (worker/train/data.c) and the
 * writer (token_file.c) agree on. nanoGPT's headerless uint16; llm.c's GPT-2 files, a 256 x int32 header
 * (magic 20240520, version 1, token count) then uint16; llm.c's Llama 3 files, the same header with magic
 * 20240801 and version 7 then uint32, for vocabularies above 65,536. */
#ifndef FSDP_DATA_DATA_FORMAT_H
#define FSDP_DATA_DATA_FORMAT_H

#include <stddef.h>
#include <stdint.h>

enum data_format { DATA_FORMAT_NANOGPT = 0, DATA_FORMAT_LLMC, DATA_FORMAT_LLMC_U32 };

#define DATA_LLMC_MAGIC 20240520
#define DATA_LLMC_VERSION 1
#define DATA_LLMC_U32_MAGIC 20240801
#define DATA_LLMC_U32_VERSION 7
#define DATA_LLMC_HEADER_INTS 256

/* "nanoGPT", "llm.c" or "llm.c uint32", for messages. */
const char *data_format_name(enum data_format f);
/* Bytes per token of a format: 2, or 4 for DATA_FORMAT_LLMC_U32. */
int data_format_token_bytes(enum data_format f);

/* Tells the format of a whole file of `size` bytes from its contents: an llm.c header is trusted only if
 * the rest of it agrees (version and token count), so a nanoGPT file that happens to start with the magic
 * is reported rather than silently misread. Gives the header's size in bytes (0 for nanoGPT) and the
 * number of tokens after it; errors (FSDP_EINVAL) name path. */
int data_format_detect(const void *bytes, size_t size, const char *path, enum data_format *format,
                       size_t *header_bytes, int64_t *n_tokens);

#endif
