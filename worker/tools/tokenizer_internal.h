/* What the tokenizer's sources share: the loaded tokenizer and the tables its stages read. Load
 * (tokenizer_load.c) fills it; encoding runs added-token extraction and the pre-tokenizer steps
 * (tokenizer_pretok.c), then BPE (tokenizer_bpe.c) over hash tables (tokenizer_hash.c). */
#ifndef FSDP_TOOLS_TOKENIZER_INTERNAL_H
#define FSDP_TOOLS_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "worker/tools/tokenizer.h"
#include "worker/tools/tokenizer_hash.h"

/* How a Split step treats the matches of its pattern (tokenizers' SplitDelimiterBehavior). */
enum tok_behavior {
    TOK_REMOVED = 0,
    TOK_ISOLATED,
    TOK_MERGED_WITH_PREVIOUS,
    TOK_MERGED_WITH_NEXT,
    TOK_CONTIGUOUS,
};

/* A compiled pattern: PCRE2 code, JIT-compiled when the library has a JIT for this CPU. */
struct tok_regex {
    pcre2_code *code;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    bool jit;
};

/* One step of the pre-tokenizer: a Split, or a ByteLevel (its regex when use_regex, isolated). The last
 * step is always the ByteLevel one. */
struct tok_step {
    struct tok_regex re; /* code NULL: no split (ByteLevel with use_regex false) */
    enum tok_behavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel: prepend " " to each piece that does not start with one */
};

#define TOK_MAX_STEPS 8

struct tok_added {
    uint32_t id;
    char *content;
    size_t len;
    bool single_word, lstrip, rstrip, normalized, special;
};

/* Added tokens matched on the raw text (normalized false) or on its normalized form (normalized true;
 * without a normalizer both are the raw text): sorted by content for the leftmost-longest search. */
struct tok_added_set {
    struct tok_added **v; /* sorted by content bytes */
    size_t n;
    bool first[256]; /* a token starts with this byte */
};

/* BPE model state and the piece cache. */
struct tok_bpe {
    int64_t byte_id[256];    /* id of the byte's ByteLevel character; -1 when the vocabulary lacks it */
    uint32_t fallback[256][3]; /* byte_fallback: ids of <0xXX> for the UTF-8 bytes of that character */
    uint8_t fallback_n[256];   /* 0: no complete fallback */
    struct tok_pairs merges;   /* (left id, right id) -> (rank, merged id) */
    struct tok_map vocab_bytes; /* raw bytes of a vocabulary token -> id (ignore_merges) */
    bool ignore_merges, byte_fallback, fuse_unk;
    int64_t unk_id; /* -1: none */
    size_t n_merges;
    /* cache: piece bytes -> (offset, count) of its ids in cache_ids */
    struct tok_map cache;
    uint32_t *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
    bool cache_on;
    uint64_t hits, misses;
    size_t heap_threshold;
    /* scratch of the merge loops */
    uint32_t *sym, *rank_new; /* symbol ids; per pair: rank, merged id */
    uint32_t *rank;
    size_t scratch_cap;
    void *heap_nodes, *heap;
    size_t heap_cap;
};

struct tokenizer {
    char *name; /* the file, for messages */
    struct tok_step steps[TOK_MAX_STEPS];
    int n_steps;
    const char *style;
    struct tok_bpe bpe;
    /* every id: its token text (UTF-8, as in the JSON) and the bytes it decodes to */
    uint32_t n_ids;          /* max id + 1 */
    char **id_text;          /* NULL where no token has that id */
    unsigned char **id_bytes;
    size_t *id_bytes_len;
    bool *id_special;
    bool decoder_bytelevel; /* false: decode joins the token texts */
    bool decoder_ok;        /* false: decode is refused with decoder_error */
    char decoder_error[160];
    struct tok_map vocab_text; /* token text -> id (model vocabulary) */
    struct tok_map added_text; /* added token content -> id */
    struct tok_added *added;
    size_t n_added;
    struct tok_added_set raw_set, norm_set;
    struct tok_regex word_re; /* one Unicode word character (single_word) */
    /* scratch for add_prefix_space */
    char *prefix_buf[TOK_MAX_STEPS];
    size_t prefix_cap[TOK_MAX_STEPS];
};

/* ---- the ByteLevel byte <-> character map (tokenizer_bpe.c) ---- */
/* The code point byte b is written as (b itself for the 188 printable bytes, U+0100.. for the others). */
uint32_t tok_byte_char(unsigned char b);
/* The byte a code point stands for, -1 when it is not one of the 256 characters. */
int tok_char_byte(uint32_t cp);

/* ---- BPE (tokenizer_bpe.c) ---- */
int tok_bpe_init(struct tok_bpe *b);
void tok_bpe_free(struct tok_bpe *b);
/* Appends the ids of one pre-token (raw bytes) to out. */
int tok_bpe_piece(struct tok_bpe *b, const unsigned char *p, size_t n, struct tokenizer_ids *out);

/* ---- regexes and pre-tokenization (tokenizer_pretok.c) ---- */
/* Compiles a tokenizer.json pattern for PCRE2, rewriting Oniguruma's \s \S \w \W \h \H to the classes
 * Oniguruma means. Errors name `what` (the JSON key) and the position. */
int tok_regex_compile(struct tok_regex *re, const char *pattern, size_t len, bool literal, const char *name,
                      const char *what);
void tok_regex_free(struct tok_regex *re);
/* Calls emit for every segment of text: added tokens (is_added, id set) and the pre-tokens between them.
 * end: offset in text just past the piece's last byte (pieces are in order). */
typedef int (*tok_emit_fn)(void *ctx, const unsigned char *p, size_t n, bool is_added, uint32_t id, size_t end);
int tok_pretok_run(struct tokenizer *t, const unsigned char *text, size_t len, tok_emit_fn emit, void *ctx);

/* ---- UTF-8 helpers (tokenizer_utf8.c); the text is valid UTF-8 ---- */
/* The code point at s (n > 0 bytes left); *k its length in bytes. */
uint32_t tok_utf8_next(const unsigned char *s, size_t n, size_t *k);
/* The code point that ends at s + n (n > 0); *k its length. */
uint32_t tok_utf8_prev(const unsigned char *s, size_t n, size_t *k);
/* Writes cp as UTF-8 (1-4 bytes); returns the length. */
size_t tok_utf8_put(uint32_t cp, char *out);
/* Unicode White_Space: the 25 characters Oniguruma's and Rust's \s match. */
bool tok_is_white_space(uint32_t cp);

#endif
