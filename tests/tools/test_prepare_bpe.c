/* fsdp-prepare-data --tokenizer, run as a user runs it, checked without a peer: the ids are the library's
 * ids of each whole file plus the end-of-text token, the train/val split only partitions that stream,
 * meta.json and the tokenizer files land beside the token files, vocabularies above 65,536 ids give
 * llm.c's uint32 files that the data reader takes, and bad input is refused with what to do. */
#include "common/error.h"
#include "tests/util/tooltest.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/train/data.h"

#include <cjson/cJSON.h>

TestSuite(prepare_bpe, .init = tt_setup, .fini = tt_teardown);

static char exe[1024], example[1024];

static void paths(void)
{
    tu_build_path(exe, sizeof exe, "worker/fsdp-prepare-data");
    tu_source_path(example, sizeof example, "examples/tokenizer.json");
}

/* The library's ids of a file. */
static struct tokenizer_ids ids_of(const char *tok_path, const char *text, size_t len)
{
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(tok_path, &t), 0, "%s", error_message());
    struct tokenizer_ids ids = {0};
    cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s", error_message());
    tokenizer_free(t);
    return ids;
}

static cJSON *meta(const char *out_dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/meta.json", out_dir);
    char *s = tu_read_ok(p, NULL);
    cJSON *j = cJSON_Parse(s);
    free(s);
    cr_assert_not_null(j, "meta.json is not JSON");
    return j;
}

static double num(const cJSON *j, const char *a, const char *b, const char *c)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    if (c)
        v = cJSON_GetObjectItemCaseSensitive(v, c);
    cr_assert(cJSON_IsNumber(v), "meta.json: %s.%s.%s is not a number", a, b ? b : "", c ? c : "");
    return v->valuedouble;
}

/* Two documents: mixed.txt and a docs page; the corpus the tests below split. */
static void corpus(char *in, size_t cap, char **a, size_t *na, char **b, size_t *nb)
{
    char src[1024], p[512];
    tt_path(in, cap, "in");
    cr_assert_eq(mkdir(in, 0755), 0);
    *a = tu_read_ok(tu_source_path(src, sizeof src, "tests/tokenizer/data/mixed.txt"), na);
    *b = tu_read_ok(tu_source_path(src, sizeof src, "docs/architecture.md"), nb);
    snprintf(p, sizeof p, "%s/a.txt", in);
    tu_write_ok(p, *a, *na);
    snprintf(p, sizeof p, "%s/b.md", in);
    tu_write_ok(p, *b, *nb);
}

Test(prepare_bpe, whole_files_then_eot_and_files_beside)
{
    paths();
    char in[256], out[256], p[512];
    char *a, *b;
    size_t na, nb;
    corpus(in, sizeof in, &a, &na, &b, &nb);
    tt_path(out, sizeof out, "out");
    const char *argv[] = {exe, "--tokenizer", example, "--val-fraction", "0", "-o", out, in, NULL};
    char *log;
    cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
    free(log);
    struct tokenizer_ids ia = ids_of(example, a, na), ib = ids_of(example, b, nb);
    snprintf(p, sizeof p, "%s/train.bin", out);
    size_t n;
    enum data_format fmt;
    uint32_t *got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(fmt, DATA_FORMAT_NANOGPT);
    cr_assert_eq(n, ia.n + 1 + ib.n + 1);
    cr_assert_arr_eq(got, ia.v, ia.n * 4);
    cr_assert_eq(got[ia.n], 0u, "<|endoftext|> (id 0) after the first document");
    cr_assert_arr_eq(got + ia.n + 1, ib.v, ib.n * 4);
    cr_assert_eq(got[n - 1], 0u);
    free(got);
    /* meta.json says what was made; the tokenizer is copied byte for byte; a tokenizer_config.json names the eot */
    cJSON *m = meta(out);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(m, "tokenizer")->valuestring, "tokenizer.json");
    cr_assert_eq(num(m, "vocab_size", NULL, NULL), 2048);
    cr_assert_eq(num(m, "eot", "id", NULL), 0);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(m, "token_format")->valuestring, "nanogpt");
    cr_assert_eq(num(m, "files", "train.bin", "tokens"), (double)n);
    cr_assert_eq(num(m, "files", "train.bin", "text_bytes"), (double)(na + nb));
    cr_assert_eq(num(m, "files", "val.bin", "tokens"), 0);
    cr_assert_eq(num(m, "inputs", "text_files", NULL), 2);
    cJSON_Delete(m);
    size_t l1, l2;
    char *orig = tu_read_ok(example, &l1);
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    char *copy = tu_read_ok(p, &l2);
    cr_assert(l1 == l2 && memcmp(orig, copy, l1) == 0, "tokenizer.json is not a copy");
    free(orig);
    free(copy);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", out);
    char *cfg = tu_read_ok(p, NULL);
    cJSON *c = cJSON_Parse(cfg);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(c, "eos_token")->valuestring, "<|endoftext|>");
    cJSON_Delete(c);
    free(cfg);
    tokenizer_ids_free(&ia);
    tokenizer_ids_free(&ib);
    free(a);
    free(b);
}

/* docs/data.md's split rule replayed on the library's runs: a run of `bytes` text bytes goes to val while val
 * holds less than F of all bytes seen (counting half the run); a document's eot follows its last run. */
struct replay {
    struct tokenizer_ids side[2]; /* train, val */
    double seen[2];
    int last;
};

static int replay_run(void *ctx, const uint32_t *ids, size_t n, size_t bytes)
{
    struct replay *r = ctx;
    double all = r->seen[0] + r->seen[1] + (double)bytes / 2;
    int v = r->seen[1] < 0.3 * all;
    r->seen[v] += (double)bytes;
    cr_assert_eq(tokenizer_ids_reserve(&r->side[v], n), 0);
    memcpy(r->side[v].v + r->side[v].n, ids, n * 4);
    r->side[v].n += n;
    r->last = v;
    return 0;
}

Test(prepare_bpe, split_partitions_the_stream_on_piece_boundaries)
{
    paths();
    char in[256], out[256], p[512];
    char *a, *b;
    size_t na, nb;
    corpus(in, sizeof in, &a, &na, &b, &nb);
    tt_path(out, sizeof out, "out");
    const char *argv[] = {exe, "-t", example, "--val-fraction", "0.3", "--chunk-size", "700", "-o", out, in, NULL};
    char *log;
    cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
    free(log);
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(example, &t), 0, "%s", error_message());
    struct replay r = {0};
    const char *docs[2] = {a, b};
    size_t lens[2] = {na, nb};
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(tokenizer_encode_runs(t, docs[d], lens[d], 700, replay_run, &r), 0);
        cr_assert_eq(tokenizer_ids_push(&r.side[r.last], 0), 0);
    }
    tokenizer_free(t);
    size_t nt, nv;
    enum data_format fmt;
    snprintf(p, sizeof p, "%s/train.bin", out);
    uint32_t *train = tt_tokens(p, &nt, &fmt);
    snprintf(p, sizeof p, "%s/val.bin", out);
    uint32_t *val = tt_tokens(p, &nv, &fmt);
    cr_assert_eq(nt, r.side[0].n);
    cr_assert_eq(nv, r.side[1].n);
    cr_assert_gt(nv, 0u);
    cr_assert_arr_eq(train, r.side[0].v, nt * 4);
    cr_assert_arr_eq(val, r.side[1].v, nv * 4);
    /* val holds about 30% of the text bytes */
    cJSON *m = meta(out);
    double vb = num(m, "files", "val.bin", "text_bytes"), tb = num(m, "files", "train.bin", "text_bytes");
    cr_assert_eq(vb + tb, (double)(na + nb));
    cr_assert_eq(vb, r.seen[1]);
    cr_assert(vb > 0.2 * (vb + tb) && vb < 0.4 * (vb + tb), "val %.0f of %.0f bytes", vb, vb + tb);
    cJSON_Delete(m);
    free(train);
    free(val);
    tokenizer_ids_free(&r.side[0]);
    tokenizer_ids_free(&r.side[1]);
    free(a);
    free(b);
}

Test(prepare_bpe, bos_eot_choices_and_directory_argument)
{
    paths();
    char in[256], out[256], p[512], dir[256];
    tt_path(in, sizeof in, "doc.txt");
    tu_write_ok(in, "hello world\n", 12);
    /* a directory holding tokenizer.json, with a tokenizer_config.json whose eos_token is an object */
    tt_path(dir, sizeof dir, "tok");
    cr_assert_eq(mkdir(dir, 0755), 0);
    /* the example with one more special token, <|eos|> (id 2048) */
    char *ex = tu_read_ok(example, NULL);
    cJSON *j = cJSON_Parse(ex);
    free(ex);
    cJSON *tok = cJSON_CreateObject();
    cJSON_AddNumberToObject(tok, "id", 2048);
    cJSON_AddStringToObject(tok, "content", "<|eos|>");
    cJSON_AddTrueToObject(tok, "special");
    cJSON_AddFalseToObject(tok, "normalized");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(j, "added_tokens"), tok);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    tu_write_ok(p, text, strlen(text));
    free(text);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    const char cfg[] = "{\"eos_token\": {\"content\": \"<|eos|>\", \"special\": true}}";
    tu_write_ok(p, cfg, sizeof cfg - 1);
    tt_path(out, sizeof out, "out");
    const char *argv[] = {exe, "-t", dir, "--bos", "<|endoftext|>", "--val-fraction", "0", "-o", out, in, NULL};
    char *log;
    cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
    free(log);
    struct tokenizer_ids ids = ids_of(example, "hello world\n", 12);
    snprintf(p, sizeof p, "%s/train.bin", out);
    size_t n;
    enum data_format fmt;
    uint32_t *got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(n, ids.n + 2);
    cr_assert_eq(got[0], 0u, "--bos first");
    cr_assert_arr_eq(got + 1, ids.v, ids.n * 4);
    cr_assert_eq(got[n - 1], 2048u, "the eos_token of tokenizer_config.json last");
    free(got);
    /* the tokenizer_config.json is copied, not generated */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", out);
    char *copy = tu_read_ok(p, NULL);
    cr_assert_str_eq(copy, cfg);
    free(copy);
    /* --eot none: nothing between documents */
    const char *argv2[] = {exe, "-t", example, "--eot", "none", "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(argv2, &log), 0, "%s", log);
    free(log);
    snprintf(p, sizeof p, "%s/train.bin", out);
    got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(n, ids.n);
    cJSON *m = meta(out);
    cr_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "eot")));
    cJSON_Delete(m);
    free(got);
    tokenizer_ids_free(&ids);
    /* an eos_token that is not a token is refused, not replaced by a guess */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    tu_write_ok(p, "{\"eos_token\": \"</s>\"}", 21);
    const char *argv3[] = {exe, "-t", dir, "-o", out, in, NULL};
    cr_assert_eq(tt_run(argv3, &log), 1);
    cr_assert(strstr(log, "names eos_token \"</s>\", which is not one of its tokens"), "%s", log);
    free(log);
}

Test(prepare_bpe, refusals)
{
    paths();
    char in[256], out[256], bad[256];
    tt_path(in, sizeof in, "doc.txt");
    tu_write_ok(in, "hello\n", 6);
    tt_path(out, sizeof out, "out");
    char *log;
    const char *eot[] = {exe, "-t", example, "--eot", "<|nope|>", "-o", out, in, NULL};
    cr_assert_eq(tt_run(eot, &log), 1);
    cr_assert(strstr(log, "--eot \"<|nope|>\": not a token of"), "%s", log);
    free(log);
    const char *nobpe[] = {exe, "--eot", "x", "-o", out, in, NULL};
    cr_assert_eq(tt_run(nobpe, &log), 2);
    cr_assert(strstr(log, "--eot needs --tokenizer"), "%s", log);
    free(log);
    tt_path(bad, sizeof bad, "bad.json");
    const char unigram_json[] = "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}";
    tu_write_ok(bad, unigram_json, sizeof unigram_json - 1);
    const char *unigram[] = {exe, "-t", bad, "-o", out, in, NULL};
    cr_assert_eq(tt_run(unigram, &log), 1);
    cr_assert(strstr(log, "bad.json: model.type is Unigram"), "%s", log);
    free(log);
    const char *utf[] = {exe, "-t", example, "--invalid-utf8", "maybe", "-o", out, in, NULL};
    cr_assert_eq(tt_run(utf, &log), 2);
    cr_assert(strstr(log, "--invalid-utf8 maybe: use error, replace or skip"), "%s", log);
    free(log);
    /* a FIFO given as the tokenizer is refused, not waited on for a writer that never comes */
    char fifo[256];
    tt_path(fifo, sizeof fifo, "tokenizer.fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *pipe_tok[] = {exe, "-t", fifo, "-o", out, in, NULL};
    cr_assert_eq(tt_run(pipe_tok, &log), 1);
    cr_assert(strstr(log, "tokenizer.fifo is not a regular file (it is a FIFO)"), "%s", log);
    free(log);
}

Test(prepare_bpe, invalid_utf8_error_replace_or_skip)
{
    paths();
    char in[256], out[256], p[512];
    tt_path(in, sizeof in, "in");
    cr_assert_eq(mkdir(in, 0755), 0);
    snprintf(p, sizeof p, "%s/a.txt", in);
    tu_write_ok(p, "ok text\n", 8);
    snprintf(p, sizeof p, "%s/b.txt", in);
    tu_write_ok(p, "caf\xe9 latin-1\n", 13);
    tt_path(out, sizeof out, "out");
    char *log;
    const char *err[] = {exe, "-t", example, "-o", out, "--val-fraction", "0", in, NULL};
    cr_assert_eq(tt_run(err, &log), 1);
    cr_assert(strstr(log, "b.txt: not UTF-8 (invalid byte 0xe9 at offset 3)") && strstr(log, "--invalid-utf8 replace"),
              "%s", log);
    free(log);
    const char *rep[] = {exe, "-t", example, "-o", out, "--val-fraction", "0", "--invalid-utf8", "replace", in, NULL};
    cr_assert_eq(tt_run(rep, &log), 0, "%s", log);
    free(log);
    struct tokenizer_ids a = ids_of(example, "ok text\n", 8), b = ids_of(example, "caf\xef\xbf\xbd latin-1\n", 15);
    snprintf(p, sizeof p, "%s/train.bin", out);
    size_t n;
    enum data_format fmt;
    uint32_t *got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(n, a.n + b.n + 2);
    cr_assert_arr_eq(got + a.n + 1, b.v, b.n * 4);
    free(got);
    cJSON *m = meta(out);
    cr_assert_eq(num(m, "inputs", "utf8_replaced", NULL), 1);
    cJSON_Delete(m);
    const char *skip[] = {exe, "-t", example, "-o", out, "--val-fraction", "0", "--invalid-utf8", "skip", in, NULL};
    cr_assert_eq(tt_run(skip, &log), 0, "%s", log);
    free(log);
    got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(n, a.n + 1);
    free(got);
    m = meta(out);
    cr_assert_eq(num(m, "inputs", "utf8_skipped", NULL), 1);
    cr_assert_eq(num(m, "inputs", "text_files", NULL), 1);
    cJSON_Delete(m);
    tokenizer_ids_free(&a);
    tokenizer_ids_free(&b);
}

/* A byte-level tokenizer whose ids reach 70,000: " hello" is a token (ignore_merges) with id 70000. */
static void big_vocab(const char *path)
{
    static char json[65536];
    size_t k = (size_t)snprintf(json, sizeof json, "{\"added_tokens\":[{\"id\":70001,\"content\":\"<|endoftext|>\","
                                "\"special\":true}],\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":"
                                "false},\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
                                "\"ignore_merges\":true,\"vocab\":{");
    for (int c = 0; c < 256; c++) {
        /* the byte characters as JSON \u escapes */
        unsigned cp = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae ? (unsigned)c
                      : c <= 0x20 ? 0x100u + (unsigned)c : c <= 0xa0 ? 0x100u + 33 + ((unsigned)c - 0x7f) : 0x143u;
        k += (size_t)snprintf(json + k, sizeof json - k, "\"\\u%04x\":%d,", cp, c);
    }
    snprintf(json + k, sizeof json - k, "\"\\u0120hello\":70000,\"<|endoftext|>\":70001}}}");
    tu_write_ok(path, json, strlen(json));
}

Test(prepare_bpe, vocab_above_65536_gives_uint32_files)
{
    paths();
    char tok[256], in[256], out[256], p[512];
    big_vocab(tt_path(tok, sizeof tok, "big.json"));
    tt_path(in, sizeof in, "doc.txt");
    tu_write_ok(in, "say hello hello\n", 16);
    tt_path(out, sizeof out, "out");
    char *log;
    const char *argv[] = {exe, "-t", tok, "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
    free(log);
    snprintf(p, sizeof p, "%s/train.bin", out);
    size_t n;
    enum data_format fmt;
    uint32_t *got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(fmt, DATA_FORMAT_LLMC_U32);
    uint32_t want[] = {'s', 'a', 'y', 70000, 70000, '\n', 70001};
    cr_assert_eq(n, 7u);
    cr_assert_arr_eq(got, want, sizeof want);
    free(got);
    /* the data reader takes the file and hands out the large ids */
    struct data_options o = {.block_size = 3, .vocab_size = 70002, .batch_rows = 1, .order = DATA_ORDER_SEQUENTIAL};
    struct data_file *d;
    cr_assert_eq(data_open(p, &o, &d), 0, "%s", error_message());
    cr_assert_eq(data_format_of(d), DATA_FORMAT_LLMC_U32);
    int32_t inp[3], tgt[3];
    cr_assert_eq(data_get_rows(d, 1, 0, 1, inp, tgt), 0);
    cr_assert(inp[0] == 70000 && inp[1] == 70000 && inp[2] == '\n' && tgt[2] == 70001, "%d %d %d %d", inp[0], inp[1],
              inp[2], tgt[2]);
    data_close(d);
    /* too small a vocab_size is caught at open, naming the id */
    o.vocab_size = 70000;
    cr_assert_lt(data_open(p, &o, &d), 0);
    cr_assert(strstr(error_message(), "token 70000 at index 3"), "%s", error_message());
    /* nanoGPT's format cannot hold them */
    const char *nano[] = {exe, "-t", tok, "--format", "nanogpt", "-o", out, in, NULL};
    cr_assert_eq(tt_run(nano, &log), 1);
    cr_assert(strstr(log, "--format nanogpt holds uint16 tokens") && strstr(log, "--format llmc"), "%s", log);
    free(log);
}

Test(prepare_bpe, progress_bar_on_request)
{
    paths();
    char in[256], out[256];
    tt_path(in, sizeof in, "doc.txt");
    tu_write_ok(in, "hello world\n", 12);
    tt_path(out, sizeof out, "out");
    char *log;
    const char *on[] = {exe, "-t", example, "--progress", "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(on, &log), 0, "%s", log);
    cr_assert(strstr(log, "encoding [##############################] 100%"), "%s", log);
    free(log);
    /* not a terminal: no bar */
    const char *off[] = {exe, "-t", example, "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(off, &log), 0, "%s", log);
    cr_assert_null(strstr(log, "encoding ["), "%s", log);
    free(log);
}

/* The Qwen2 and SentencePiece fixtures (tests/tokenizer/data/fixtures/): each file's ids are tokenizers' (the
 * committed .ids) then the end-of-text token, <|endoftext|> for Qwen2 and </s> for Llama 2 style, found
 * without a tokenizer_config.json; meta.json names the style and counts the raw text bytes. */
Test(prepare_bpe, qwen2_and_sentencepiece_fixtures)
{
    paths();
    static const char *const names[] = {"qwen2", "spm", "spm_legacy"};
    static const char *const styles[] = {"NFC+Split+ByteLevel", "Metaspace+SentencePiece",
                                         "Prepend+Replace+SentencePiece"};
    static const uint32_t eots[] = {0, 2, 2};
    char in[256], src[1024], rel[256];
    tt_path(in, sizeof in, "in.txt");
    size_t len;
    free(tu_read_ok(tu_source_path(src, sizeof src, "tests/tokenizer/data/mixed.txt"), &len));
    tu_copy_ok(src, in);
    for (int k = 0; k < 3; k++) {
        char tok[1024], out[256], p[512], stem[64];
        snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s.json", names[k]);
        tu_source_path(tok, sizeof tok, rel);
        snprintf(stem, sizeof stem, "out_%s", names[k]);
        tt_path(out, sizeof out, stem);
        const char *argv[] = {exe, "--tokenizer", tok, "--val-fraction", "0", "-o", out, in, NULL};
        char *log;
        cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
        free(log);
        snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s__mixed.ids", names[k]);
        size_t rlen, n;
        uint32_t *ref = (uint32_t *)tu_read_ok(tu_source_path(src, sizeof src, rel), &rlen);
        snprintf(p, sizeof p, "%s/train.bin", out);
        enum data_format fmt;
        uint32_t *got = tt_tokens(p, &n, &fmt);
        cr_assert_eq(n, rlen / 4 + 1, "%s: %zu ids, tokenizers %zu + 1", names[k], n, rlen / 4);
        cr_expect_arr_eq(got, ref, rlen, "%s: ids", names[k]);
        cr_expect_eq(got[n - 1], eots[k], "%s: end-of-text", names[k]);
        cJSON *m = meta(out);
        cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(m, "tokenizer_style")->valuestring, styles[k]);
        cr_expect_eq(num(m, "files", "train.bin", "text_bytes"), (double)len);
        cJSON_Delete(m);
        free(got);
        free(ref);
    }
}
