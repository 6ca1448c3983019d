/* One piece of fsdp-prepare-data's work: whole documents of one input file (a text file is one document; a
 * JSON Lines file is cut on line ends into pieces of many lines), encoded on any thread into what the writer
 * needs to place them: per document, its runs of ids (or its bytes) and the text bytes each run covers. The
 * writer takes chunks in input order and does the train/val split itself (prepare_data.c), so which thread
 * encoded a chunk, and where the chunks were cut, never changes the token files. */
#ifndef FSDP_TOOLS_PREPARE_CHUNK_H
#define FSDP_TOOLS_PREPARE_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/tokenizer/tokenizer.h"

enum prepare_invalid_utf8 { PREPARE_UTF8_ERROR = 0, PREPARE_UTF8_REPLACE, PREPARE_UTF8_SKIP };

struct prepare_encode_opts {
    size_t run_bytes; /* --chunk-size: a run of ids ends on the first pre-token boundary this far in */
    enum prepare_invalid_utf8 invalid_utf8;
    const char *text_field; /* JSON Lines */
    bool skip_bad_lines;
};

enum prepare_chunk_kind {
    PREPARE_CHUNK_SKIP,  /* an empty or binary file: nothing to encode, only the progress bar moves */
    PREPARE_CHUNK_TEXT,  /* a whole text file: one document */
    PREPARE_CHUNK_JSONL, /* whole lines of a JSON Lines file: one document each */
};

/* A run of a document's ids and the text bytes it covers (the split's unit). */
struct prepare_run {
    size_t n, text_bytes;
};

struct prepare_chunk_doc {
    bool skipped;             /* not UTF-8 under --invalid-utf8 skip: nothing is written */
    bool in_input;            /* byte-level: the text is data[off, off+len), else bytes[off, off+len) */
    size_t off, len;          /* byte-level: the document's text */
    size_t first_run, n_runs; /* with a tokenizer: runs[first_run, first_run+n_runs) */
};

struct prepare_chunk {
    /* set by the reader */
    enum prepare_chunk_kind kind;
    const char *path;
    const unsigned char *data; /* not owned: a part of the file's bytes */
    size_t len;
    size_t first_line;         /* JSON Lines: the line number of data's first line */
    void *owner;               /* the reader's record of the file data points into */
    /* set by prepare_chunk_encode */
    struct prepare_chunk_doc *docs;
    size_t n_docs, docs_cap;
    struct prepare_run *runs; /* their ids, in order, are ids[] */
    size_t n_runs, runs_cap;
    uint32_t *ids;
    size_t n_ids, ids_cap;
    unsigned char *bytes; /* byte-level JSON Lines: the documents' unescaped text */
    size_t n_bytes, bytes_cap;
    size_t documents, bad_lines, utf8_skipped, utf8_replaced; /* counted as meta.json counts them */
    int rc;      /* the first error (0: none); the writer reports the first one in input order */
    char *error; /* its message */
};

/* Encodes c's documents with t (NULL: byte-level tokens). Never fails by itself: an error (a file that is not
 * UTF-8, a bad JSON Lines line, no memory) stops the chunk and is kept in c->rc and c->error. */
void prepare_chunk_encode(struct tokenizer *t, const struct prepare_encode_opts *o, struct prepare_chunk *c);
/* Frees what prepare_chunk_encode made (not the input). */
void prepare_chunk_free_output(struct prepare_chunk *c);

#endif
