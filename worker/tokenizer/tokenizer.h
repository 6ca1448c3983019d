/* A BPE tokenizer read from a Hugging Face tokenizer.json (docs/data.md, "Tokenizer"). Byte-level: the
 * GPT-2 style (ByteLevel pre-tokenizer with its regex), the Llama 3 / tiktoken style (Split with a
 * Unicode-class regex, then ByteLevel) and Qwen2's (an NFC normalizer, then the same with single
 * digits). SentencePiece-style, as Llama 2, Mistral and Gemma ship it: characters as symbols with
 * byte_fallback to <0xXX> tokens, a Metaspace pre-tokenizer or the Prepend/Replace normalizers, and the
 * Replace/ByteFallback/Fuse/Strip decoders. Normalizers NFC, NFKC, NFD, NFKD (utf8proc), Prepend,
 * Replace; merges in both JSON forms; added and special tokens with their lstrip/rstrip/single_word
 * flags. The ids are those `tokenizers` gives for
 * `encode(text, add_special_tokens=False)`: the post-processor (a BOS template) is not applied.
 *
 * Regexes run on PCRE2 (JIT where the build has it) with UTF and UCP; what Oniguruma, the engine of
 * `tokenizers`, means by \s, \w and \h is spelled out before compiling, so both engines split alike.
 * Encoding keeps a cache of pieces it has seen, so a tokenizer is used by one thread at a time. */
#ifndef FSDP_TOKENIZER_H
#define FSDP_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/tokenizer/tokenizer_ids.h"

struct tokenizer;

/* Reads and checks tokenizer.json; every error names the file and the JSON key that is wrong or not
 * supported (a Lowercase normalizer, a model other than BPE, a Whitespace pre-tokenizer, ...). */
int tokenizer_load(const char *path, struct tokenizer **out);
/* The same from JSON text in memory; `name` is used in messages. */
int tokenizer_load_string(const char *json, size_t len, const char *name, struct tokenizer **out);
void tokenizer_free(struct tokenizer *t);

/* One more than the largest id of the vocabulary and the added tokens: the model's vocab_size must be
 * at least this. */
uint32_t tokenizer_vocab_size(const struct tokenizer *t);
/* Number of merges and of added tokens, for reports. */
size_t tokenizer_merge_count(const struct tokenizer *t);
size_t tokenizer_added_count(const struct tokenizer *t);
/* The normalizers and pre-tokenizer steps joined with "+", for reports: "ByteLevel" (GPT-2),
 * "Split+ByteLevel" (Llama 3), "NFC+Split+ByteLevel" (Qwen2), "Metaspace+SentencePiece" (Llama 2,
 * Mistral), "Prepend+Replace+SentencePiece" (older Llama 2 files), "Replace+Split+SentencePiece" (Gemma). */
const char *tokenizer_style(const struct tokenizer *t);
/* The id of a token given by its content: an added token first, then the vocabulary (as in `tokenizers`'
 * token_to_id). FSDP_ENOTFOUND (without a message) when there is none. */
int tokenizer_token_id(const struct tokenizer *t, const char *content, uint32_t *id);
/* Whether id is an added token marked special. */
bool tokenizer_is_special(const struct tokenizer *t, uint32_t id);

/* Encodes UTF-8 text (checked by the caller: tokenizer_utf8_check) and appends its ids to out. */
int tokenizer_encode(struct tokenizer *t, const char *text, size_t len, struct tokenizer_ids *out);

/* Encodes text and hands the ids over in runs that end on pre-token boundaries: fn is called whenever at
 * least chunk_bytes of text were consumed since the last call (and once at the end), with the ids of
 * that run and the number of text bytes it covers. The runs, concatenated, are exactly
 * tokenizer_encode's ids, so cutting a file between runs never cuts text inside a pre-token. A negative
 * return of fn (an enum fsdp_error, its message set) stops the encoding and is returned. */
typedef int (*tokenizer_run_fn)(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes);
int tokenizer_encode_runs(struct tokenizer *t, const char *text, size_t len, size_t chunk_bytes,
                          tokenizer_run_fn fn, void *ctx);

/* The pre-tokens of text (after the added tokens are cut out, before BPE), in order; added tokens are
 * passed with is_added set. For tests and for looking at how a text is split. */
typedef int (*tokenizer_piece_fn)(void *ctx, const char *piece, size_t len, bool is_added);
int tokenizer_pieces(struct tokenizer *t, const char *text, size_t len, tokenizer_piece_fn fn, void *ctx);

/* The bytes a token decodes to alone (the ByteLevel decoder: a token whose characters all belong to the
 * byte map becomes those bytes, any other token its UTF-8 text; a decoder chain: a <0xXX> token its byte
 * under ByteFallback, else its text with the chain's Replace/Metaspace applied, "▁" -> " "). NULL for an
 * id that has no token. */
const unsigned char *tokenizer_token_bytes(const struct tokenizer *t, uint32_t id, size_t *len);
/* Decodes ids into a malloc'ed byte string (NUL-terminated; *len excludes the NUL), as `tokenizers`'
 * decode does. Special tokens are kept unless skip_special (`tokenizers`' decode drops them by default);
 * unknown ids are an error naming the id. With the ByteLevel decoder alone the bytes are not repaired: a
 * run of ids that ends inside a UTF-8 character gives its first bytes (a chain's ByteFallback gives
 * U+FFFD, as there). */
int tokenizer_decode(const struct tokenizer *t, const uint32_t *ids, size_t n, bool skip_special, char **out,
                     size_t *len);

/* Statistics of the piece cache since load: hits and misses, for benchmarks. */
void tokenizer_cache_stats(const struct tokenizer *t, uint64_t *hits, uint64_t *misses);
/* Pieces longer than this many symbols use the heap merge instead of the quadratic scan; both give the
 * same ids (tests compare them). Default 64. */
void tokenizer_set_heap_threshold(struct tokenizer *t, size_t symbols);
/* Turns the piece cache off (tests: every piece then goes through the merge loop). */
void tokenizer_set_cache(struct tokenizer *t, bool on);

/* ---- UTF-8 ---- */
/* Length of the longest valid UTF-8 prefix of s (== len when all of s is valid). Overlong forms,
 * surrogates and code points above U+10FFFF are invalid, as in Python's strict decoder. */
size_t tokenizer_utf8_check(const char *s, size_t len);
/* A malloc'ed copy of s in which each maximal invalid subsequence is replaced by U+FFFD, the result of
 * Python's bytes.decode("utf-8", errors="replace"); *replaced counts the replacements. */
int tokenizer_utf8_repair(const char *s, size_t len, char **out, size_t *out_len, size_t *replaced);

#endif
