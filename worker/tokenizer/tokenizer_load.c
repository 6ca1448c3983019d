/* tokenizer.json -> struct tokenizer: the BPE model (vocab, merges in both JSON forms, unk/byte
 * fallback/ignore_merges), the added tokens with the ids `tokenizers` gives them, the normalizers, the
 * pre-tokenizer steps (a ByteLevel step makes the model byte-level, else it is SentencePiece-style) and
 * the decoder or decoder chain. Anything this tokenizer would not encode exactly as `tokenizers` does is
 * refused with the key that says so. */
#include "worker/tokenizer/tokenizer_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Ids above this would make the per-id tables absurdly large; no real vocabulary comes near it. */
#define MAX_ID ((1u << 24) - 1)

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const cJSON *key(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int get_bool(const struct tokenizer *t, const cJSON *o, const char *k, const char *where, bool def,
                    bool *out)
{
    const cJSON *v = key(o, k);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return error_set(FSDP_EINVAL, "%s: %s.%s must be true or false", t->name, where, k);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_id(const struct tokenizer *t, const cJSON *v, const char *where, const char *tok, uint32_t *id)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > MAX_ID || v->valuedouble != floor(v->valuedouble))
        return error_set(FSDP_EINVAL, "%s: %s: the id of \"%s\" must be an integer in [0, %u]", t->name, where,
                         tok, MAX_ID);
    *id = (uint32_t)v->valuedouble;
    return 0;
}

static int vocab_lookup(const struct tokenizer *t, const char *s, size_t n, uint32_t *id)
{
    const struct tok_map_entry *e = tok_map_get(&t->vocab_text, s, n, tok_hash(s, n));
    if (!e)
        return FSDP_ENOTFOUND;
    *id = e->a;
    return 0;
}

int tokenizer_token_id(const struct tokenizer *t, const char *content, uint32_t *id)
{
    size_t n = strlen(content);
    const struct tok_map_entry *e = tok_map_get(&t->added_text, content, n, tok_hash(content, n));
    if (e) {
        *id = e->a;
        return 0;
    }
    return vocab_lookup(t, content, n, id);
}

uint32_t tokenizer_vocab_size(const struct tokenizer *t) { return t->n_ids; }
size_t tokenizer_merge_count(const struct tokenizer *t) { return t->bpe.n_merges; }
size_t tokenizer_added_count(const struct tokenizer *t) { return t->n_added; }
const char *tokenizer_style(const struct tokenizer *t) { return t->style; }
bool tokenizer_is_special(const struct tokenizer *t, uint32_t id) { return id < t->n_ids && t->id_special[id]; }

static int parse_model(struct tokenizer *t, const cJSON *model, uint32_t *max_id)
{
    const cJSON *type = key(model, "type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0))
        return error_set(FSDP_EUNSUPPORTED, "%s: model.type is %s: only BPE models are supported (not WordPiece, "
                         "Unigram or WordLevel)", t->name, cJSON_IsString(type) ? type->valuestring : "not a string");
    const cJSON *vocab = key(model, "vocab"), *merges = key(model, "merges");
    if (!cJSON_IsObject(vocab))
        return error_set(FSDP_EINVAL, "%s: model.vocab must be an object {token: id}", t->name);
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return error_set(FSDP_EINVAL, "%s: model.merges must be a list", t->name);
    const cJSON *dropout = key(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return error_set(FSDP_EUNSUPPORTED, "%s: model.dropout is set: BPE dropout makes encoding random; use null for "
                         "data preparation", t->name);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = key(model, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return error_set(FSDP_EUNSUPPORTED, "%s: model.%s is set: not a byte-level BPE (only null is supported)",
                             t->name, affixes[i]);
    }
    struct tok_bpe *b = &t->bpe;
    FSDP_TRY(get_bool(t, model, "fuse_unk", "model", false, &b->fuse_unk));
    FSDP_TRY(get_bool(t, model, "byte_fallback", "model", false, &b->byte_fallback));
    FSDP_TRY(get_bool(t, model, "ignore_merges", "model", false, &b->ignore_merges));
    FSDP_TRY(tok_map_init(&t->vocab_text, (size_t)cJSON_GetArraySize(vocab)));
    /* which token owns each id, to refuse two tokens with one id (their decode would be ambiguous) */
    const cJSON *e;
    *max_id = 0;
    cJSON_ArrayForEach(e, vocab)
    {
        uint32_t id = 0;
        FSDP_TRY(get_id(t, e, "model.vocab", e->string, &id));
        size_t n = strlen(e->string);
        FSDP_TRY(tok_map_put(&t->vocab_text, e->string, n, tok_hash(e->string, n), id, 0));
        *max_id = id > *max_id ? id : *max_id;
    }
    const cJSON *unk = key(model, "unk_token");
    if (unk && !cJSON_IsNull(unk)) {
        uint32_t id;
        if (!cJSON_IsString(unk) || vocab_lookup(t, unk->valuestring, strlen(unk->valuestring), &id) != 0)
            return error_set(FSDP_EINVAL, "%s: model.unk_token must be null or a token of model.vocab", t->name);
        b->unk_id = id;
    }
    FSDP_TRY(tok_pairs_init(&b->merges, merges ? (size_t)cJSON_GetArraySize(merges) : 0));
    int rc = 0, form = 0; /* 1: "a b" strings, 2: ["a", "b"] pairs */
    size_t rank = 0;
    char *joined = NULL;
    size_t joined_cap = 0;
    cJSON_ArrayForEach(e, merges)
    {
        const char *l, *r;
        size_t ln, rn;
        int f = cJSON_IsString(e) ? 1 : cJSON_IsArray(e) ? 2 : 0;
        if (f == 1) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = error_set(FSDP_EINVAL, "%s: model.merges[%zu] \"%s\" must be two tokens separated by one space",
                               t->name, rank, e->valuestring);
                goto out;
            }
            l = e->valuestring;
            ln = (size_t)(sp - l);
            r = sp + 1;
            rn = strlen(r);
        } else if (f == 2 && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            l = cJSON_GetArrayItem(e, 0)->valuestring;
            r = cJSON_GetArrayItem(e, 1)->valuestring;
            ln = strlen(l);
            rn = strlen(r);
        } else {
            rc = error_set(FSDP_EINVAL, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", t->name, rank);
            goto out;
        }
        if (form && f != form) {
            rc = error_set(FSDP_EINVAL, "%s: model.merges mixes \"a b\" strings and [\"a\", \"b\"] pairs (at %zu), "
                           "which tokenizers refuses too", t->name, rank);
            goto out;
        }
        form = f;
        if (joined_cap < ln + rn + 1) {
            joined_cap = 2 * (ln + rn + 1);
            char *j = realloc(joined, joined_cap);
            if (!j) {
                rc = error_set(FSDP_ENOMEM, "out of memory");
                goto out;
            }
            joined = j;
        }
        memcpy(joined, l, ln);
        memcpy(joined + ln, r, rn);
        uint32_t li, ri, mi;
        const char *missing = vocab_lookup(t, l, ln, &li) ? "left" : vocab_lookup(t, r, rn, &ri) ? "right"
                              : vocab_lookup(t, joined, ln + rn, &mi) ? "merged" : NULL;
        if (missing) {
            rc = error_set(FSDP_EINVAL, "%s: model.merges[%zu] (\"%.*s\" + \"%.*s\"): its %s token is not in "
                           "model.vocab", t->name, rank, (int)ln, l, (int)rn, r, missing);
            goto out;
        }
        FSDP_TRY_GOTO(tok_pairs_put(&b->merges, li, ri, (uint32_t)rank, mi), rc, out);
        if (rn >= 3 && memcmp(r, "\xe2\x96\x81", 3) == 0) {
            size_t k = 0;
            while (k + 3 <= ln && memcmp(l + k, "\xe2\x96\x81", 3) == 0)
                k += 3;
            b->merge_right_meta |= k != ln;
        }
        rank++;
    }
out:
    free(joined);
    b->n_merges = rank;
    return rc;
}

static int parse_added(struct tokenizer *t, const cJSON *list, uint32_t *max_id)
{
    FSDP_TRY(tok_map_init(&t->added_text, 64));
    if (!list || cJSON_IsNull(list))
        return 0;
    if (!cJSON_IsArray(list))
        return error_set(FSDP_EINVAL, "%s: added_tokens must be a list", t->name);
    size_t n = (size_t)cJSON_GetArraySize(list);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added)
        return error_set(FSDP_ENOMEM, "out of memory");
    size_t vocab_len = t->vocab_text.n;
    const cJSON *e;
    size_t i = 0;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *content = key(e, "content");
        if (!cJSON_IsString(content))
            return error_set(FSDP_EINVAL, "%s: added_tokens[%zu].content must be a string", t->name, i);
        struct tok_added a = {0};
        a.len = strlen(content->valuestring);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i++);
        FSDP_TRY(get_bool(t, e, "special", where, false, &a.special));
        FSDP_TRY(get_bool(t, e, "single_word", where, false, &a.single_word));
        FSDP_TRY(get_bool(t, e, "lstrip", where, false, &a.lstrip));
        FSDP_TRY(get_bool(t, e, "rstrip", where, false, &a.rstrip));
        FSDP_TRY(get_bool(t, e, "normalized", where, !a.special, &a.normalized));
        if (a.len == 0)
            continue; /* tokenizers ignores an empty token */
        /* tokenizers' AddedVocabulary::add_tokens: the id of a known content, else the next free one */
        uint64_t h = tok_hash(content->valuestring, a.len);
        const struct tok_map_entry *known = tok_map_get(&t->added_text, content->valuestring, a.len, h);
        uint32_t id;
        if (known) {
            id = known->a;
        } else if (vocab_lookup(t, content->valuestring, a.len, &id) != 0) {
            uint32_t max_added = 0;
            for (size_t k = 0; k < t->n_added; k++)
                max_added = t->added[k].id > max_added ? t->added[k].id : max_added;
            if (t->n_added == 0)
                id = (uint32_t)vocab_len;
            else
                id = (max_added >= vocab_len || vocab_len == 0) ? max_added + 1 : (uint32_t)vocab_len;
            if (id > MAX_ID)
                return error_set(FSDP_ERANGE, "%s: %s gets id %u, above %u", t->name, where, id, MAX_ID);
        }
        const cJSON *jid = key(e, "id");
        if (cJSON_IsNumber(jid) && jid->valuedouble != (double)id)
            log_warn("%s: %s \"%s\" says id %.0f but gets id %u, as in tokenizers", t->name, where,
                     content->valuestring, jid->valuedouble, id);
        FSDP_TRY(tok_map_put(&t->added_text, content->valuestring, a.len, h, id, 0));
        a.id = id;
        size_t k = 0;
        while (k < t->n_added && t->added[k].id != id)
            k++;
        if (k < t->n_added) {
            free(t->added[k].content); /* the same content again: its latest flags count */
        } else {
            t->n_added++;
        }
        if (!(a.content = strdup(content->valuestring)))
            return error_set(FSDP_ENOMEM, "out of memory");
        t->added[k] = a;
        *max_id = id > *max_id ? id : *max_id;
    }
    return 0;
}

static int cmp_added(const void *x, const void *y)
{
    const struct tok_added *a = *(struct tok_added *const *)x, *b = *(struct tok_added *const *)y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->content, b->content, n);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int build_sets(struct tokenizer *t)
{
    struct tok_added_set *sets[2] = {&t->raw_set, &t->norm_set};
    for (int s = 0; s < 2; s++) {
        sets[s]->v = calloc(t->n_added ? t->n_added : 1, sizeof *sets[s]->v);
        if (!sets[s]->v)
            return error_set(FSDP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < t->n_added; i++) {
        struct tok_added_set *set = t->added[i].normalized ? &t->norm_set : &t->raw_set;
        set->v[set->n++] = &t->added[i];
        set->first[(unsigned char)t->added[i].content[0]] = true;
    }
    for (int s = 0; s < 2; s++)
        qsort(sets[s]->v, sets[s]->n, sizeof *sets[s]->v, cmp_added);
    return 0;
}

static int add_step(struct tokenizer *t, const char *where)
{
    if (t->n_steps == TOK_MAX_STEPS)
        return error_set(FSDP_EUNSUPPORTED, "%s: %s: more than %d pre-tokenizer steps", t->name, where, TOK_MAX_STEPS);
    t->n_steps++;
    return 0;
}

/* A JSON string key that must be there, copied. */
static int get_string(const struct tokenizer *t, const cJSON *o, const char *k, const char *where, char **out,
                      size_t *n)
{
    const cJSON *v = key(o, k);
    if (!cJSON_IsString(v))
        return error_set(FSDP_EINVAL, "%s: %s.%s must be a string", t->name, where, k);
    *n = strlen(v->valuestring);
    if (!(*out = strdup(v->valuestring)))
        return error_set(FSDP_ENOMEM, "out of memory");
    return 0;
}

/* Replace's pattern: only {"String": ...} (a regex replacement has not been needed by a known model). */
static int get_literal_pattern(const struct tokenizer *t, const cJSON *o, const char *where, char **out, size_t *n)
{
    const cJSON *pat = key(o, "pattern");
    const cJSON *str = pat ? key(pat, "String") : NULL;
    if (!cJSON_IsString(str) || !str->valuestring[0])
        return error_set(FSDP_EUNSUPPORTED, "%s: %s.pattern must be {\"String\": \"...\"}, not empty (a Regex pattern "
                         "is not supported in Replace)", t->name, where);
    *n = strlen(str->valuestring);
    if (!(*out = strdup(str->valuestring)))
        return error_set(FSDP_ENOMEM, "out of memory");
    return 0;
}

static const char meta_char[] = "\xe2\x96\x81"; /* U+2581 */

static int parse_metaspace(struct tokenizer *t, const cJSON *p, const char *where, struct tok_step *st)
{
    const cJSON *rep = key(p, "replacement"), *scheme = key(p, "prepend_scheme");
    if (rep && !(cJSON_IsString(rep) && strcmp(rep->valuestring, meta_char) == 0))
        return error_set(FSDP_EUNSUPPORTED, "%s: %s.replacement must be \"%s\" (U+2581), as SentencePiece's", t->name,
                         where, meta_char);
    st->metaspace = true;
    if (cJSON_IsString(scheme)) {
        static const char *const names[] = {"never", "first", "always"};
        int i = 0;
        while (i < 3 && strcmp(scheme->valuestring, names[i]) != 0)
            i++;
        if (i == 3)
            return error_set(FSDP_EINVAL, "%s: %s.prepend_scheme must be first, always or never", t->name, where);
        st->prepend = (enum tok_prepend)i;
    } else {
        /* files from before prepend_scheme: add_prefix_space */
        bool prefix = true;
        FSDP_TRY(get_bool(t, p, "add_prefix_space", where, true, &prefix));
        st->prepend = prefix ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    }
    bool split = true;
    FSDP_TRY(get_bool(t, p, "split", where, true, &split));
    if (split) {
        st->behavior = TOK_MERGED_WITH_NEXT;
        char what[96];
        snprintf(what, sizeof what, "%s.replacement", where);
        FSDP_TRY(tok_regex_compile(&st->re, meta_char, 3, true, t->name, what));
    }
    return 0;
}

static int parse_pretok_one(struct tokenizer *t, const cJSON *p, const char *where, bool *byte_level,
                            bool *metaspace)
{
    const cJSON *type = key(p, "type");
    if (!cJSON_IsString(type))
        return error_set(FSDP_EINVAL, "%s: %s has no \"type\"", t->name, where);
    if (*byte_level)
        return error_set(FSDP_EUNSUPPORTED, "%s: %s (%s) comes after ByteLevel: a byte-level BPE ends its "
                         "pre-tokenizer with ByteLevel", t->name, where, type->valuestring);
    if (strcmp(type->valuestring, "ByteLevel") == 0) {
        if (*metaspace)
            return error_set(FSDP_EUNSUPPORTED, "%s: %s: ByteLevel after Metaspace: a BPE is either byte-level or "
                             "SentencePiece-style, not both", t->name, where);
        bool use_regex = true, prefix = true;
        if (!cJSON_IsBool(key(p, "add_prefix_space")))
            return error_set(FSDP_EINVAL, "%s: %s.add_prefix_space must be true or false (tokenizers requires it)",
                             t->name, where);
        FSDP_TRY(get_bool(t, p, "use_regex", where, true, &use_regex));
        FSDP_TRY(get_bool(t, p, "add_prefix_space", where, true, &prefix));
        FSDP_TRY(add_step(t, where));
        struct tok_step *st = &t->steps[t->n_steps - 1];
        st->behavior = TOK_ISOLATED;
        st->add_prefix_space = prefix;
        if (use_regex)
            FSDP_TRY(tok_regex_compile(&st->re, gpt2_pattern, strlen(gpt2_pattern), false, t->name, where));
        *byte_level = true;
        return 0;
    }
    if (strcmp(type->valuestring, "Metaspace") == 0) {
        FSDP_TRY(add_step(t, where));
        *metaspace = true;
        return parse_metaspace(t, p, where, &t->steps[t->n_steps - 1]);
    }
    if (strcmp(type->valuestring, "Split") == 0) {
        const cJSON *pat = key(p, "pattern"), *beh = key(p, "behavior");
        const cJSON *rx = pat ? key(pat, "Regex") : NULL, *str = pat ? key(pat, "String") : NULL;
        if (!cJSON_IsString(rx) && !cJSON_IsString(str))
            return error_set(FSDP_EINVAL, "%s: %s.pattern must be {\"Regex\": ...} or {\"String\": ...}", t->name,
                             where);
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int bi = -1;
        for (int i = 0; i < 5 && cJSON_IsString(beh); i++)
            if (strcmp(beh->valuestring, names[i]) == 0)
                bi = i;
        if (bi < 0)
            return error_set(FSDP_EINVAL, "%s: %s.behavior must be one of Removed, Isolated, MergedWithPrevious, "
                             "MergedWithNext, Contiguous", t->name, where);
        bool invert = false;
        FSDP_TRY(get_bool(t, p, "invert", where, false, &invert));
        FSDP_TRY(add_step(t, where));
        struct tok_step *st = &t->steps[t->n_steps - 1];
        st->behavior = (enum tok_behavior)bi;
        st->invert = invert;
        const char *s = cJSON_IsString(rx) ? rx->valuestring : str->valuestring;
        char what[64];
        snprintf(what, sizeof what, "%s.pattern", where);
        return tok_regex_compile(&st->re, s, strlen(s), !cJSON_IsString(rx), t->name, what);
    }
    return error_set(FSDP_EUNSUPPORTED, "%s: %s is a %s pre-tokenizer: supported are ByteLevel, Split, Metaspace and "
                     "a Sequence of them (ByteLevel last)", t->name, where, type->valuestring);
}

static void style_add(struct tokenizer *t, const char *name)
{
    size_t n = strlen(t->style_buf);
    snprintf(t->style_buf + n, sizeof t->style_buf - n, "%s%s", n ? "+" : "", name);
}

/* Without a ByteLevel step the model is SentencePiece-style: its symbols are characters. */
static int parse_pretok(struct tokenizer *t, const cJSON *p)
{
    bool byte_level = false, metaspace = false;
    if (p && !cJSON_IsNull(p)) {
        const cJSON *type = key(p, "type");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
            const cJSON *list = key(p, "pretokenizers"), *e;
            size_t i = 0;
            cJSON_ArrayForEach(e, list)
            {
                char where[64];
                snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i++);
                FSDP_TRY(parse_pretok_one(t, e, where, &byte_level, &metaspace));
            }
        } else {
            FSDP_TRY(parse_pretok_one(t, p, "pre_tokenizer", &byte_level, &metaspace));
        }
    }
    t->bpe.byte_level = byte_level;
    for (int i = 0; i < t->n_steps; i++)
        style_add(t, t->steps[i].metaspace ? "Metaspace" : i == t->n_steps - 1 && byte_level ? "ByteLevel" : "Split");
    if (!byte_level)
        style_add(t, "SentencePiece");
    t->style = t->style_buf;
    return 0;
}

static int parse_norm_one(struct tokenizer *t, const cJSON *n, const char *where)
{
    const cJSON *type = key(n, "type");
    if (!cJSON_IsString(type))
        return error_set(FSDP_EINVAL, "%s: %s has no \"type\"", t->name, where);
    const char *ty = type->valuestring;
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = key(n, "normalizers"), *e;
        if (list && !cJSON_IsArray(list))
            return error_set(FSDP_EINVAL, "%s: %s.normalizers must be a list", t->name, where);
        size_t i = 0;
        cJSON_ArrayForEach(e, list)
        {
            char w[96];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i++);
            FSDP_TRY(parse_norm_one(t, e, w));
        }
        return 0;
    }
    static const char *const forms[] = {"NFC", "NFKC", "NFD", "NFKD"};
    int kind = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(ty, forms[i]) == 0)
            kind = i;
    if (strcmp(ty, "Prepend") == 0)
        kind = TOK_NORM_PREPEND;
    if (strcmp(ty, "Replace") == 0)
        kind = TOK_NORM_REPLACE;
    if (kind < 0)
        return error_set(FSDP_EUNSUPPORTED, "%s: %s is %s: supported normalizers are NFC, NFKC, NFD, NFKD, Prepend, "
                         "Replace (of a String) and a Sequence of them", t->name, where, ty);
    if (t->n_norms == TOK_MAX_NORMS)
        return error_set(FSDP_EUNSUPPORTED, "%s: %s: more than %d normalizers", t->name, where, TOK_MAX_NORMS);
    struct tok_norm *nm = &t->norms[t->n_norms++];
    nm->kind = (enum tok_norm_kind)kind;
    if (kind == TOK_NORM_PREPEND)
        FSDP_TRY(get_string(t, n, "prepend", where, &nm->a, &nm->an));
    if (kind == TOK_NORM_REPLACE) {
        FSDP_TRY(get_literal_pattern(t, n, where, &nm->a, &nm->an));
        FSDP_TRY(get_string(t, n, "content", where, &nm->b, &nm->bn));
    }
    style_add(t, ty);
    return 0;
}

static int parse_normalizer(struct tokenizer *t, const cJSON *n)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    return parse_norm_one(t, n, "normalizer");
}

/* A decoder this tokenizer cannot run makes decode fail with why (encoding still works). */
static int parse_dec_one(struct tokenizer *t, const cJSON *d, const char *where)
{
    const cJSON *type = key(d, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "(no type)";
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = key(d, "decoders"), *e;
        size_t i = 0;
        cJSON_ArrayForEach(e, list)
        {
            char w[96];
            snprintf(w, sizeof w, "%s.decoders[%zu]", where, i++);
            int rc = parse_dec_one(t, e, w);
            if (rc != 0)
                return rc; /* an error, or 1: a decoder that cannot run */
        }
        return 0;
    }
    static const char *const names[] = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace", "ByteLevel"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (strcmp(ty, names[i]) == 0)
            kind = i;
    if (kind < 0 || t->n_decs == TOK_MAX_DECS) {
        snprintf(t->decoder_error, sizeof t->decoder_error, "%s: %s is %s: supported decoders are ByteLevel, "
                 "Replace, ByteFallback, Fuse, Strip, Metaspace and a Sequence of them", t->name, where, ty);
        return 1;
    }
    if (kind == TOK_DEC_REPLACE) {
        const cJSON *pat = key(d, "pattern");
        const cJSON *str = pat ? key(pat, "String") : NULL;
        if (!cJSON_IsString(str) || !str->valuestring[0]) {
            snprintf(t->decoder_error, sizeof t->decoder_error, "%s: %s.pattern is not a non-empty {\"String\": "
                     "...}: a Regex Replace decoder is not supported", t->name, where);
            return 1;
        }
    }
    struct tok_dec *dc = &t->decs[t->n_decs++];
    dc->kind = (enum tok_dec_kind)kind;
    if (kind == TOK_DEC_REPLACE) {
        FSDP_TRY(get_literal_pattern(t, d, where, &dc->a, &dc->an));
        FSDP_TRY(get_string(t, d, "content", where, &dc->b, &dc->bn));
    } else if (kind == TOK_DEC_STRIP) {
        FSDP_TRY(get_string(t, d, "content", where, &dc->a, &dc->an));
        const cJSON *a = key(d, "start"), *b = key(d, "stop");
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0 || dc->an == 0)
            return error_set(FSDP_EINVAL, "%s: %s needs a content character and start and stop counts", t->name,
                             where);
        dc->start = (size_t)a->valuedouble;
        dc->stop = (size_t)b->valuedouble;
    } else if (kind == TOK_DEC_METASPACE) {
        struct tok_step st = {0};
        FSDP_TRY(parse_metaspace(t, d, where, &st));
        tok_regex_free(&st.re);
        dc->prepend = st.prepend != TOK_PREPEND_NEVER;
        if (!(dc->a = strdup(meta_char)))
            return error_set(FSDP_ENOMEM, "out of memory");
        dc->an = 3;
    }
    return 0;
}

static int parse_decoder(struct tokenizer *t, const cJSON *d)
{
    t->decoder_ok = true;
    if (!d || cJSON_IsNull(d)) {
        t->decoder_null = true;
        return 0;
    }
    const cJSON *type = key(d, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "ByteLevel") == 0) {
        t->decoder_bytelevel = true;
        return 0;
    }
    int rc = parse_dec_one(t, d, "decoder");
    if (rc > 0)
        t->decoder_ok = false; /* decode is refused; the per-id bytes are the token texts */
    return rc < 0 ? rc : 0;
}

/* The per-id tables: text, decoded bytes, special flag. */
static int build_ids(struct tokenizer *t, uint32_t max_id)
{
    t->n_ids = max_id + 1;
    t->id_text = calloc(t->n_ids, sizeof *t->id_text);
    t->id_bytes = calloc(t->n_ids, sizeof *t->id_bytes);
    t->id_bytes_len = calloc(t->n_ids, sizeof *t->id_bytes_len);
    t->id_special = calloc(t->n_ids, sizeof *t->id_special);
    if (!t->id_text || !t->id_bytes || !t->id_bytes_len || !t->id_special)
        return error_set(FSDP_ENOMEM, "out of memory for %u ids", t->n_ids);
    const struct tok_map *vm = &t->vocab_text;
    for (size_t i = 0; i < vm->cap; i++) {
        const struct tok_map_entry *e = &vm->e[i];
        if (!e->hash)
            continue;
        if (t->id_text[e->a])
            return error_set(FSDP_EINVAL, "%s: model.vocab gives id %u to two tokens (\"%s\" and \"%.*s\")", t->name,
                             e->a, t->id_text[e->a], (int)e->len, tok_map_key(vm, e));
        if (!(t->id_text[e->a] = strndup(tok_map_key(vm, e), e->len)))
            return error_set(FSDP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < t->n_added; i++) {
        struct tok_added *a = &t->added[i];
        t->id_special[a->id] = a->special;
        if (!t->id_text[a->id] && !(t->id_text[a->id] = strdup(a->content)))
            return error_set(FSDP_ENOMEM, "out of memory");
    }
    unsigned char *buf = malloc(4096);
    size_t cap = 4096;
    if (!buf)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        const char *s = t->id_text[id];
        if (!s)
            continue;
        size_t n = strlen(s), k = 0;
        bool bytes = true;
        if (n > cap) {
            cap = n;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                rc = error_set(FSDP_ENOMEM, "out of memory");
                goto out;
            }
            buf = nb;
        }
        for (size_t i = 0; i < n;) {
            size_t len;
            int byte = tok_char_byte(tok_utf8_next((const unsigned char *)s + i, n - i, &len));
            if (byte < 0) {
                bytes = false;
                break;
            }
            buf[k++] = (unsigned char)byte;
            i += len;
        }
        /* raw bytes of a vocabulary token, for ignore_merges (an added token is not a model token) */
        uint32_t vid;
        if (bytes && vocab_lookup(t, s, n, &vid) == 0 && vid == id)
            FSDP_TRY_GOTO(tok_map_put(&t->bpe.vocab_bytes, buf, k, tok_hash(buf, k), id, 0), rc, out);
        if (t->decoder_ok && t->n_decs && !t->decoder_bytelevel) {
            char *d;
            FSDP_TRY_GOTO(tok_dec_token_bytes(t, s, n, &d, &t->id_bytes_len[id]), rc, out);
            t->id_bytes[id] = (unsigned char *)d;
            continue;
        }
        const void *src = bytes && t->decoder_bytelevel ? (const void *)buf : (const void *)s;
        size_t len = bytes && t->decoder_bytelevel ? k : n;
        if (!(t->id_bytes[id] = malloc(len + 1))) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
        memcpy(t->id_bytes[id], src, len);
        t->id_bytes_len[id] = len;
    }
out:
    free(buf);
    return rc;
}

/* The id of each byte's character and of its <0xXX> fallback tokens. */
static void build_bytes(struct tokenizer *t)
{
    struct tok_bpe *b = &t->bpe;
    for (int c = 0; c < 256; c++) {
        char ch[4];
        size_t n = tok_utf8_put(tok_byte_char((unsigned char)c), ch);
        uint32_t id;
        b->byte_id[c] = vocab_lookup(t, ch, n, &id) == 0 ? (int64_t)id : -1;
        b->fallback_n[c] = 0;
        bool all = true;
        for (size_t k = 0; k < n && all; k++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (unsigned char)ch[k]);
            all = vocab_lookup(t, name, strlen(name), &b->fallback[c][k]) == 0;
        }
        if (all)
            b->fallback_n[c] = (uint8_t)n;
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned)c);
        b->byte_token[c] = vocab_lookup(t, name, strlen(name), &id) == 0 ? (int64_t)id : -1;
    }
    b->vocab = &t->vocab_text;
    uint32_t id;
    b->split_meta = !b->byte_level && !b->merge_right_meta && vocab_lookup(t, "\xe2\x96\x81", 3, &id) == 0;
}

int tokenizer_load_string(const char *json, size_t len, const char *name, struct tokenizer **out)
{
    *out = NULL;
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name))) {
        free(t);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    int rc = 0;
    cJSON *root = NULL;
    FSDP_TRY_GOTO(tok_bpe_init(&t->bpe), rc, done);
    if (!(root = cJSON_ParseWithLength(json, len))) {
        const char *at = cJSON_GetErrorPtr();
        rc = error_set(FSDP_EINVAL, "%s: not valid JSON (near byte %td)", name, at ? at - json : (ptrdiff_t)-1);
        goto done;
    }
    const cJSON *model = key(root, "model");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(model)) {
        rc = error_set(FSDP_EINVAL, "%s: not a tokenizer.json (%s)", name,
                       cJSON_IsObject(root) ? "no \"model\" object" : "the top level is not an object");
        goto done;
    }
    uint32_t max_id = 0;
    FSDP_TRY_GOTO(parse_model(t, model, &max_id), rc, done);
    FSDP_TRY_GOTO(parse_added(t, key(root, "added_tokens"), &max_id), rc, done);
    FSDP_TRY_GOTO(build_sets(t), rc, done);
    FSDP_TRY_GOTO(parse_normalizer(t, key(root, "normalizer")), rc, done);
    FSDP_TRY_GOTO(parse_pretok(t, key(root, "pre_tokenizer")), rc, done);
    FSDP_TRY_GOTO(parse_decoder(t, key(root, "decoder")), rc, done);
    FSDP_TRY_GOTO(build_ids(t, max_id), rc, done);
    build_bytes(t);
    /* Rust's \w, which tokenizers' single_word test uses */
    static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
    FSDP_TRY_GOTO(tok_regex_compile(&t->word_re, word, strlen(word), false, name, "single_word"), rc, done);
done:
    cJSON_Delete(root);
    if (rc < 0) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tokenizer_load(const char *path, struct tokenizer **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(errno == ENOENT ? FSDP_ENOTFOUND : FSDP_EIO, "%s: cannot open the tokenizer: %s", path,
                         strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 20;
            char *b = realloc(buf, cap);
            if (!b) {
                rc = error_set(FSDP_ENOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = b;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        rc = error_set(FSDP_EIO, "%s: read error", path);
        goto done;
    }
    rc = tokenizer_load_string(buf, n, path, out);
done:
    fclose(f);
    free(buf);
    return rc;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < TOK_MAX_STEPS; i++) {
        tok_regex_free(&t->steps[i].re);
        free(t->prefix_buf[i]);
    }
    tok_regex_free(&t->word_re);
    tok_bpe_free(&t->bpe);
    tok_norm_free(t);
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    for (uint32_t i = 0; t->id_text && i < t->n_ids; i++) {
        free(t->id_text[i]);
        free(t->id_bytes[i]);
    }
    free(t->id_text);
    free(t->id_bytes);
    free(t->id_bytes_len);
    free(t->id_special);
    tok_map_free(&t->vocab_text);
    tok_map_free(&t->added_text);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->raw_set.v);
    free(t->norm_set.v);
    free(t->name);
    free(t);
}
