/* fsdp-prepare-data's inputs: a file's bytes, decompressed when it is gzip or zstd (by its magic bytes, not
 * its name), and JSON Lines (a `.jsonl` or `.json` name, before any `.gz`/`.zst`) cut into the documents of
 * one string field per line. See docs/data.md. */
#ifndef FSDP_WORKER_TOOLS_PREPARE_INPUT_H
#define FSDP_WORKER_TOOLS_PREPARE_INPUT_H

#include <stdbool.h>
#include <stddef.h>

/* The whole content of path, decompressed (gzip through zlib, zstd through libzstd, members and frames
 * concatenated); *data is malloc'd. path must be a regular file (a FIFO is refused, never waited on), and
 * only the bytes it held when it was opened are read: what is appended while it is read is left out, with
 * a warning. Both the file and the decompressed size are bounded by max_bytes (a decompression bomb is an
 * error naming the file and the bound). */
int prepare_input_read(const char *path, size_t max_bytes, unsigned char **data, size_t *len);
/* The bytes of the regular file path as they are (no decompression), up to its size when it was opened, as
 * prepare_input_read reads them; `what` names the file in messages ("tokenizer FILE: cannot open: ..."). */
int prepare_input_read_file(const char *path, const char *what, size_t max, unsigned char **data, size_t *len);

/* True when path names JSON Lines: `.jsonl` or `.json`, before an optional `.gz` or `.zst`. */
bool prepare_input_is_jsonl(const char *path);

/* One document of a JSON Lines text: the field's string, unescaped (UTF-8; malloc'd). */
struct prepare_doc {
    char *text;
    size_t len;
};

/* Calls fn for each line's field value in order; data's first line is line first_line of path (a part of a
 * file cut on line ends is walked alone). Blank lines are skipped. A line that is not a JSON object, or
 * lacks the field as a string, is an error naming path:line and the field, unless skip_bad is set: then it
 * is counted in *bad and skipped. fn's error stops the walk. */
int prepare_input_jsonl(const char *path, const unsigned char *data, size_t len, size_t first_line, const char *field,
                        bool skip_bad, size_t *bad, int (*fn)(void *ctx, const struct prepare_doc *doc), void *ctx);

#endif
