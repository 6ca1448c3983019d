/* BPE on one pre-token: its bytes become the ids of their ByteLevel characters (a SentencePiece-style
 * model: its characters the ids of their tokens, or byte-fallback tokens), then the
 * adjacent pair with the lowest merge rank is merged (the leftmost of equal ranks), one merge at a time,
 * a new pair competing at once, until no pair has a merge. Short pieces use a scan of a rank array,
 * long ones a heap ordered by (rank, position) as `tokenizers` does; both give the same ids. Results
 * are cached by the piece's bytes: text repeats its words, so most pieces are one hash lookup. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"

#include <stdlib.h>

/* Pieces up to this many bytes are cached; the cache is emptied when it holds this many pieces or ids. */
#define CACHE_MAX_KEY 64
#define CACHE_MAX_PIECES (1u << 18)
#define CACHE_MAX_IDS (1u << 22)

uint32_t tok_byte_char(unsigned char b)
{
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
        return b;
    if (b <= 0x20)
        return 0x100u + b;
    if (b <= 0xa0)
        return 0x100u + 33 + (b - 0x7fu);
    return 0x143; /* 0xad */
}

int tok_char_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(0x7f + cp - 0x121);
    if (cp == 0x143)
        return 0xad;
    return -1;
}

int tok_bpe_init(struct tok_bpe *b)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++)
        b->byte_id[i] = b->byte_token[i] = -1;
    b->byte_level = true;
    b->unk_id = -1;
    b->cache_on = true;
    b->heap_threshold = 64;
    FSDP_TRY(tok_map_init(&b->cache, 1024));
    return tok_map_init(&b->vocab_bytes, 1024);
}

void tok_bpe_free(struct tok_bpe *b)
{
    tok_pairs_free(&b->merges);
    tok_map_free(&b->vocab_bytes);
    tok_map_free(&b->cache);
    free(b->cache_ids);
    free(b->sym);
    free(b->rank);
    free(b->rank_new);
    free(b->heap_nodes);
    free(b->heap);
    memset(b, 0, sizeof *b);
}

struct heap_node {
    uint32_t id;
    int32_t prev, next;
    bool alive;
};

struct heap_item {
    uint32_t rank, pos, id;
};

static int scratch_reserve(struct tok_bpe *b, size_t n)
{
    if (n <= b->scratch_cap)
        return 0;
    size_t cap = b->scratch_cap ? b->scratch_cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *s = realloc(b->sym, cap * sizeof *s);
    if (s)
        b->sym = s;
    uint32_t *r = realloc(b->rank, cap * sizeof *r);
    if (r)
        b->rank = r;
    uint32_t *rn = realloc(b->rank_new, cap * sizeof *rn);
    if (rn)
        b->rank_new = rn;
    if (!s || !r || !rn)
        return error_set(FSDP_ENOMEM, "out of memory for a piece of %zu symbols", n);
    b->scratch_cap = cap;
    return 0;
}

static inline void pair_rank(const struct tok_bpe *b, uint32_t l, uint32_t r, uint32_t *rank, uint32_t *id)
{
    if (!tok_pairs_get(&b->merges, l, r, rank, id))
        *rank = UINT32_MAX;
}

/* Merges sym[0..m) in place; returns the new count. */
static size_t merge_scan(const struct tok_bpe *b, uint32_t *sym, size_t m, uint32_t *rank, uint32_t *rank_new)
{
    if (m < 2)
        return m;
    for (size_t i = 0; i + 1 < m; i++)
        pair_rank(b, sym[i], sym[i + 1], &rank[i], &rank_new[i]);
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        }
        if (best == UINT32_MAX)
            return m;
        sym[bi] = rank_new[bi];
        memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
        if (bi + 2 < m) {
            memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof *rank);
            memmove(rank_new + bi + 1, rank_new + bi + 2, (m - bi - 2) * sizeof *rank_new);
        }
        m--;
        if (bi > 0)
            pair_rank(b, sym[bi - 1], sym[bi], &rank[bi - 1], &rank_new[bi - 1]);
        if (bi + 1 < m)
            pair_rank(b, sym[bi], sym[bi + 1], &rank[bi], &rank_new[bi]);
        if (m < 2)
            return m;
    }
}

static bool item_less(const struct heap_item *x, const struct heap_item *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n)
{
    struct heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && item_less(&h[c + 1], &h[c]))
            c++;
        if (!item_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* The same merges with a heap of (rank, position): O(m log m) for long pieces (a page of CJK text without
 * punctuation is one pre-token). An entry is stale when its left symbol was merged away or its pair
 * changed; the pair's merged id tells (a symbol only grows rightwards, so the same merged id at the same
 * position means the same pair). */
static int merge_heap(struct tok_bpe *b, uint32_t *sym, size_t *m_io)
{
    size_t m = *m_io;
    if (m < 2)
        return 0;
    if (m > b->heap_cap) {
        size_t cap = b->heap_cap ? b->heap_cap : 1024;
        while (cap < m)
            cap *= 2;
        void *nodes = realloc(b->heap_nodes, cap * sizeof(struct heap_node));
        if (nodes)
            b->heap_nodes = nodes;
        /* every merge pushes at most two items: m initial + 2m */
        void *heap = realloc(b->heap, 3 * cap * sizeof(struct heap_item));
        if (heap)
            b->heap = heap;
        if (!nodes || !heap)
            return error_set(FSDP_ENOMEM, "out of memory for a piece of %zu symbols", m);
        b->heap_cap = cap;
    }
    struct heap_node *nd = b->heap_nodes;
    struct heap_item *h = b->heap;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++)
        nd[i] = (struct heap_node){.id = sym[i], .prev = (int32_t)i - 1, .next = i + 1 < m ? (int32_t)i + 1 : -1,
                                   .alive = true};
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t r, id;
        if (tok_pairs_get(&b->merges, sym[i], sym[i + 1], &r, &id))
            heap_push(h, &hn, (struct heap_item){r, (uint32_t)i, id});
    }
    while (hn) {
        struct heap_item top = heap_pop(h, &hn);
        struct heap_node *cur = &nd[top.pos];
        if (!cur->alive || cur->next < 0)
            continue;
        struct heap_node *right = &nd[cur->next];
        uint32_t r, id;
        if (!tok_pairs_get(&b->merges, cur->id, right->id, &r, &id) || id != top.id)
            continue;
        cur->id = top.id;
        right->alive = false;
        cur->next = right->next;
        if (right->next >= 0)
            nd[right->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && tok_pairs_get(&b->merges, nd[cur->prev].id, cur->id, &r, &id))
            heap_push(h, &hn, (struct heap_item){r, (uint32_t)cur->prev, id});
        if (cur->next >= 0 && tok_pairs_get(&b->merges, cur->id, nd[cur->next].id, &r, &id))
            heap_push(h, &hn, (struct heap_item){r, top.pos, id});
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = nd[i].next)
        sym[k++] = nd[i].id;
    *m_io = k;
    return 0;
}

/* The initial symbols of a piece, as `tokenizers`' merge_word builds them: a byte whose character is
 * missing from the vocabulary becomes its <0xXX> fallback tokens, else an unknown token (fused with
 * the one before when fuse_unk; a pending unknown is added only when a known character or the end comes,
 * so it lands after fallback tokens, as there), else nothing. */
static size_t initial_symbols(const struct tok_bpe *b, const unsigned char *p, size_t n, uint32_t *sym);

/* The same for a SentencePiece-style BPE: the symbols are the piece's characters as vocabulary tokens;
 * a character the vocabulary lacks becomes the <0xXX> tokens of its UTF-8 bytes when all of them exist
 * (byte_fallback), else the unknown token. */
static size_t initial_chars(const struct tok_bpe *b, const unsigned char *p, size_t n, uint32_t *sym)
{
    size_t m = 0;
    bool unk = false;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        if (p[i] >= 0x80)
            tok_utf8_next(p + i, n - i, &k);
        const struct tok_map_entry *e = tok_map_get(b->vocab, p + i, k, tok_hash(p + i, k));
        if (e) {
            if (unk)
                sym[m++] = (uint32_t)b->unk_id;
            unk = false;
            sym[m++] = e->a;
            i += k;
            continue;
        }
        bool all = b->byte_fallback;
        for (size_t j = 0; j < k && all; j++)
            all = b->byte_token[p[i + j]] >= 0;
        if (all) {
            for (size_t j = 0; j < k; j++)
                sym[m++] = (uint32_t)b->byte_token[p[i + j]];
        } else if (b->unk_id >= 0) {
            if (unk && !b->fuse_unk)
                sym[m++] = (uint32_t)b->unk_id;
            unk = true;
        }
        i += k;
    }
    if (unk)
        sym[m++] = (uint32_t)b->unk_id;
    return m;
}

static size_t initial_symbols(const struct tok_bpe *b, const unsigned char *p, size_t n, uint32_t *sym)
{
    size_t m = 0;
    bool unk = false;
    for (size_t i = 0; i < n; i++) {
        int64_t id = b->byte_id[p[i]];
        if (id >= 0) {
            if (unk)
                sym[m++] = (uint32_t)b->unk_id;
            unk = false;
            sym[m++] = (uint32_t)id;
            continue;
        }
        if (b->byte_fallback && b->fallback_n[p[i]]) {
            for (int k = 0; k < b->fallback_n[p[i]]; k++)
                sym[m++] = b->fallback[p[i]][k];
            continue;
        }
        if (b->unk_id >= 0) {
            if (unk && !b->fuse_unk)
                sym[m++] = (uint32_t)b->unk_id;
            unk = true;
        }
    }
    if (unk)
        sym[m++] = (uint32_t)b->unk_id;
    return m;
}

static int cache_put(struct tok_bpe *b, const unsigned char *p, size_t n, uint64_t h, const uint32_t *ids,
                     size_t k)
{
    if (b->cache.n >= CACHE_MAX_PIECES || b->cache_ids_n + k > CACHE_MAX_IDS) {
        tok_map_clear(&b->cache);
        b->cache_ids_n = 0;
    }
    if (b->cache_ids_cap - b->cache_ids_n < k) {
        size_t cap = b->cache_ids_cap ? b->cache_ids_cap : 65536;
        while (cap - b->cache_ids_n < k)
            cap *= 2;
        uint32_t *v = realloc(b->cache_ids, cap * sizeof *v);
        if (!v)
            return error_set(FSDP_ENOMEM, "out of memory for the tokenizer cache");
        b->cache_ids = v;
        b->cache_ids_cap = cap;
    }
    memcpy(b->cache_ids + b->cache_ids_n, ids, k * sizeof *ids);
    FSDP_TRY(tok_map_put(&b->cache, p, n, h, (uint32_t)b->cache_ids_n, (uint32_t)k));
    b->cache_ids_n += k;
    return 0;
}

/* The merges of one word: from the cache, or merged and cached. */
static int bpe_word(struct tok_bpe *b, const unsigned char *p, size_t n, struct tokenizer_ids *out)
{
    uint64_t h = 0;
    bool cacheable = b->cache_on && n <= CACHE_MAX_KEY;
    if (cacheable) {
        h = tok_hash(p, n);
        const struct tok_map_entry *e = tok_map_get(&b->cache, p, n, h);
        if (e) {
            b->hits++;
            FSDP_TRY(tokenizer_ids_reserve(out, e->b));
            memcpy(out->v + out->n, b->cache_ids + e->a, e->b * sizeof *out->v);
            out->n += e->b;
            return 0;
        }
    }
    b->misses++;
    FSDP_TRY(scratch_reserve(b, 3 * n + 1));
    size_t m = b->byte_level ? initial_symbols(b, p, n, b->sym) : initial_chars(b, p, n, b->sym);
    if (m > b->heap_threshold)
        FSDP_TRY(merge_heap(b, b->sym, &m));
    else
        m = merge_scan(b, b->sym, m, b->rank, b->rank_new);
    FSDP_TRY(tokenizer_ids_reserve(out, m));
    memcpy(out->v + out->n, b->sym, m * sizeof *out->v);
    out->n += m;
    return cacheable ? cache_put(b, p, n, h, b->sym, m) : 0;
}

static const unsigned char meta[3] = {0xe2, 0x96, 0x81}; /* U+2581 */

/* A long SentencePiece-style pre-token (a whole document under Metaspace with split false) cut into words
 * before each "▁" that follows a character other than "▁". When split_meta holds (load checked that
 * every merge whose right side starts with "▁" has a left side made of "▁" only, and "▁" is a token), no
 * merge can join a symbol ending before such a "▁" to the one starting at it, so merging each word alone
 * gives the whole piece's merges, and the words hit the cache as a byte-level text's words do. */
static int bpe_words(struct tok_bpe *b, const unsigned char *p, size_t n, struct tokenizer_ids *out)
{
    size_t start = 0;
    for (size_t i = 3; i + 3 <= n;) {
        const unsigned char *hit = memchr(p + i, 0xe2, n - i - 2);
        if (!hit)
            break;
        i = (size_t)(hit - p);
        if (memcmp(hit, meta, 3) == 0 && memcmp(hit - 3, meta, 3) != 0) {
            FSDP_TRY(bpe_word(b, p + start, i - start, out));
            start = i;
        }
        i++;
    }
    return bpe_word(b, p + start, n - start, out);
}

int tok_bpe_piece(struct tok_bpe *b, const unsigned char *p, size_t n, struct tokenizer_ids *out)
{
    if (n == 0)
        return 0;
    if (b->ignore_merges) {
        const struct tok_map_entry *e = tok_map_get(b->byte_level ? &b->vocab_bytes : b->vocab, p, n, tok_hash(p, n));
        if (e)
            return tokenizer_ids_push(out, e->a);
    }
    if (b->split_meta && n > CACHE_MAX_KEY)
        return bpe_words(b, p, n, out);
    return bpe_word(b, p, n, out);
}

void tokenizer_cache_stats(const struct tokenizer *t, uint64_t *hits, uint64_t *misses)
{
    *hits = t->bpe.hits;
    *misses = t->bpe.misses;
}

void tokenizer_set_heap_threshold(struct tokenizer *t, size_t symbols) { t->bpe.heap_threshold = symbols; }

void tokenizer_set_cache(struct tokenizer *t, bool on)
{
    t->bpe.cache_on = on;
    tok_map_clear(&t->bpe.cache);
    t->bpe.cache_ids_n = 0;
}
