/* What the tokenizer's sources share: the loaded tokenizer and the tables its stages read. Load
 * (tokenizer_load.c) fills it; encoding runs added-token extraction and the pre-tokenizer steps
 * (tokenizer_pretok.c), then BPE (tokenizer_bpe.c) over hash tables (tokenizer_hash.c). */
#ifndef FSDP_TOKENIZER_INTERNAL_H
#define FSDP_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_hash.h"

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

/* Metaspace's prepend_scheme: when "▁" is put before a piece that does not start with one. */
enum tok_prepend {
    TOK_PREPEND_NEVER = 0,
    TOK_PREPEND_FIRST, /* only the piece at offset 0 of the text */
    TOK_PREPEND_ALWAYS,
};

/* One step of the pre-tokenizer: a Split, a Metaspace (spaces to "▁", the prepend, then when split a
 * split before each "▁"), or a ByteLevel (its regex when use_regex, isolated), which is then the last
 * step and makes the model byte-level. */
struct tok_step {
    struct tok_regex re; /* code NULL: no split (ByteLevel with use_regex false, Metaspace with split false) */
    enum tok_behavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel: prepend " " to each piece that does not start with one */
    bool metaspace;
    enum tok_prepend prepend;
};

#define TOK_MAX_STEPS 8

/* One normalizer (tokenizer_normalize.c): a Unicode normal form through utf8proc, or Prepend / Replace
 * of a literal string. A Sequence is these in order. */
enum tok_norm_kind {
    TOK_NORM_NFC = 0,
    TOK_NORM_NFKC,
    TOK_NORM_NFD,
    TOK_NORM_NFKD,
    TOK_NORM_PREPEND, /* a: the string put before a non-empty text */
    TOK_NORM_REPLACE, /* every a (non-empty, leftmost first, not overlapping) becomes b */
};

struct tok_norm {
    enum tok_norm_kind kind;
    char *a, *b;
    size_t an, bn;
};

#define TOK_MAX_NORMS 8

/* One decoder of a Sequence (tokenizer_decode.c), applied to the list of token strings in order. */
enum tok_dec_kind {
    TOK_DEC_REPLACE = 0, /* a -> b in each token */
    TOK_DEC_BYTE_FALLBACK, /* runs of <0xXX> tokens -> their bytes (U+FFFD per byte when not UTF-8) */
    TOK_DEC_FUSE,          /* all tokens -> one */
    TOK_DEC_STRIP,         /* up to start leading and stop trailing characters a off each token */
    TOK_DEC_METASPACE,     /* "▁" -> " ", and dropped from the first token unless prepend is never */
    TOK_DEC_BYTE_LEVEL,    /* the ByteLevel characters -> bytes, all tokens -> one */
};

struct tok_dec {
    enum tok_dec_kind kind;
    char *a, *b;
    size_t an, bn;
    size_t start, stop;
    bool prepend;
};

#define TOK_MAX_DECS 8

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
    /* false: a SentencePiece-style BPE, whose symbols are the characters of the piece looked up in vocab
     * (the pre-tokenizer has no ByteLevel), byte_fallback to the <0xXX> tokens of byte_token */
    bool byte_level;
    const struct tok_map *vocab; /* token text -> id, the tokenizer's vocab_text */
    int64_t byte_token[256];     /* id of <0xXX>, -1 when missing */
    bool merge_right_meta;       /* a merge whose right side starts with "▁" has a left side not all "▁" */
    bool split_meta;             /* SentencePiece-style, "▁" a token, !merge_right_meta: see bpe_words */
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
    struct tok_norm norms[TOK_MAX_NORMS];
    int n_norms;
    char *norm_buf[2]; /* scratch of the normalizers: the text goes back and forth between the two */
    size_t norm_cap[2];
    int32_t *norm_cp; /* code points of a span being normalized */
    size_t norm_cp_cap;
    const char *style;
    char style_buf[160];
    struct tok_bpe bpe;
    /* every id: its token text (UTF-8, as in the JSON) and the bytes it decodes to */
    uint32_t n_ids;          /* max id + 1 */
    char **id_text;          /* NULL where no token has that id */
    unsigned char **id_bytes;
    size_t *id_bytes_len;
    bool *id_special;
    bool decoder_bytelevel; /* the decoder is ByteLevel alone: decode is a concatenation of id_bytes */
    bool decoder_null;      /* no decoder: tokenizers joins the token texts with spaces */
    struct tok_dec decs[TOK_MAX_DECS]; /* otherwise this chain, on the token texts */
    int n_decs;
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

/* ---- decoding (tokenizer_decode.c) ---- */
/* What one token decodes to alone under a decoder chain (tokenizer_token_bytes): a <0xXX> token its byte
 * when the chain has ByteFallback, else its text through the chain's Replace and Metaspace steps. */
int tok_dec_token_bytes(const struct tokenizer *t, const char *text, size_t n, char **out, size_t *out_n);

/* ---- normalizers (tokenizer_normalize.c) ---- */
/* The text after every normalizer of t, in one of t's scratch buffers (valid until the next call), or s
 * itself when nothing changes it. */
int tok_normalize(struct tokenizer *t, const unsigned char *s, size_t n, const unsigned char **out, size_t *out_n);
void tok_norm_free(struct tokenizer *t);

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
