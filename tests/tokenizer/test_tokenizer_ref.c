/* The tokenizer against its peer, Hugging Face `tokenizers` from the venv (tests/tokenizer/tokenizer_ref.py;
 * skipped with a message without it): tokenizers trained here in both styles on local text (this
 * repository and Python's standard library) and generated multi-script text, plus variants covering
 * the rest of the format, must give identical ids on mixed-script text (tests/tokenizer/data/mixed.txt:
 * accents, CJK, Devanagari, Cyrillic, Arabic, emoji with ZWJ, combining marks, digits, whitespace runs,
 * CRLF, special tokens), and decode must give the bytes back exactly when tokenizers' does. Then
 * fsdp-prepare-data's files hold exactly tokenizers' ids of each whole file followed by the end-of-text
 * token, and transformers' AutoTokenizer reads the directory it writes. */
#include "common/error.h"
#include "tests/util/tooltest.h"
#include "worker/tokenizer/tokenizer.h"

TestSuite(tokenizer_ref, .init = tt_setup, .fini = tt_teardown);

static char python[1024];

static void need(const char *modules)
{
    char why[2048];
    if (tu_venv_python(modules, python, sizeof python, why, sizeof why) != 0)
        cr_skip_test("%s", why);
}

/* A corpus to train on and the two trained tokenizers: tt_dir/gpt2.json and tt_dir/llama3.json. */
static void train_both(int vocab, int corpus_bytes)
{
    char corpus[256], docs[1024], worker[1024], g[256], l[256];
    tt_path(corpus, sizeof corpus, "corpus.txt");
    free(tt_ref(python, "corpus '%s' --bytes %d --src '%s' --src '%s'", corpus, corpus_bytes,
                tu_source_path(docs, sizeof docs, "docs"), tu_source_path(worker, sizeof worker, "worker")));
    free(tt_ref(python, "train --style gpt2 --vocab %d --out '%s' '%s'", vocab, tt_path(g, sizeof g, "gpt2.json"),
                corpus));
    free(tt_ref(python, "train --style llama3 --vocab %d --out '%s' '%s'", vocab,
                tt_path(l, sizeof l, "llama3.json"), corpus));
}

/* C's ids of a text file with tokenizer `tok`, compared with tokenizers' (ref/<tok>__<text>.ids) and the
 * round trip with tokenizers' verdict. */
static void compare(const char *tok_path, const char *tok_stem, const char *text_path, const char *text_stem)
{
    struct tokenizer *t;
    cr_assert_eq(tokenizer_load(tok_path, &t), 0, "%s", error_message());
    size_t len;
    char *text = tu_read_ok(text_path, &len);
    cr_assert_eq(tokenizer_utf8_check(text, len), len);
    struct tokenizer_ids ids = {0};
    cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s", error_message());
    char p[512];
    snprintf(p, sizeof p, "%s/ref/%s__%s.ids", tt_dir, tok_stem, text_stem);
    size_t rlen;
    uint32_t *ref = (uint32_t *)tu_read_ok(p, &rlen);
    size_t n = rlen / 4, first = 0;
    while (first < n && first < ids.n && ids.v[first] == ref[first])
        first++;
    cr_expect(ids.n == n && first == n, "%s on %s: %zu ids, tokenizers %zu; first difference at %zu (%u vs %u)",
              tok_stem, text_stem, ids.n, n, first, first < ids.n ? ids.v[first] : 0, first < n ? ref[first] : 0);
    snprintf(p, sizeof p, "%s/ref/%s__%s.roundtrip", tt_dir, tok_stem, text_stem);
    char *rt = tu_read_ok(p, NULL);
    char *back;
    size_t blen;
    cr_assert_eq(tokenizer_decode(t, ids.v, ids.n, false, &back, &blen), 0, "%s", error_message());
    bool same = blen == len && memcmp(back, text, len) == 0;
    cr_expect_eq(same, rt[0] == '1', "%s on %s: decode gives the text back: ours %d, tokenizers' %c", tok_stem,
                 text_stem, same, rt[0]);
    free(back);
    free(rt);
    free(ref);
    free(text);
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

Test(tokenizer_ref, ids_equal_tokenizers_for_both_styles_and_variants, .timeout = 240)
{
    need("tokenizers");
    train_both(4000, 1500000);
    char vg[256], vl[256], ms[256], mixed[1024], refdir[256];
    tt_path(vg, sizeof vg, "vg");
    tt_path(vl, sizeof vl, "vl");
    char *names_g = tt_ref(python, "variants '%s/gpt2.json' '%s'", tt_dir, vg);
    char *names_l = tt_ref(python, "variants '%s/llama3.json' '%s'", tt_dir, vl);
    free(tt_ref(python, "multiscript '%s' --bytes 300000 --seed 11", tt_path(ms, sizeof ms, "multiscript.txt")));
    tu_source_path(mixed, sizeof mixed, "tests/tokenizer/data/mixed.txt");
    cr_assert_eq(mkdir(tt_path(refdir, sizeof refdir, "ref"), 0755), 0);
    /* every tokenizer path for one python run */
    static char list[16384];
    size_t k = (size_t)snprintf(list, sizeof list, "'%s/gpt2.json' '%s/llama3.json'", tt_dir, tt_dir);
    struct {
        char path[512], stem[128];
    } toks[64];
    int nt = 0;
    snprintf(toks[nt].path, sizeof toks[nt].path, "%s/gpt2.json", tt_dir);
    snprintf(toks[nt++].stem, sizeof toks[0].stem, "gpt2");
    snprintf(toks[nt].path, sizeof toks[nt].path, "%s/llama3.json", tt_dir);
    snprintf(toks[nt++].stem, sizeof toks[0].stem, "llama3");
    const char *dirs[2] = {vg, vl};
    char *names[2] = {names_g, names_l};
    /* variants of both styles share names: copy them to distinct stems */
    for (int d = 0; d < 2; d++) {
        for (char *save = NULL, *name = strtok_r(names[d], " \n", &save); name; name = strtok_r(NULL, " \n", &save)) {
            cr_assert_lt(nt, 64);
            char from[512];
            snprintf(from, sizeof from, "%s/%s.json", dirs[d], name);
            snprintf(toks[nt].stem, sizeof toks[nt].stem, "%s_%s", d ? "llama3" : "gpt2", name);
            snprintf(toks[nt].path, sizeof toks[nt].path, "%s/%s.json", tt_dir, toks[nt].stem);
            tu_copy_ok(from, toks[nt].path);
            k += (size_t)snprintf(list + k, sizeof list - k, " '%s'", toks[nt].path);
            nt++;
        }
    }
    cr_assert_geq(nt, 20, "variants: %d tokenizers", nt);
    free(tt_ref(python, "encode --out-dir '%s' --text '%s' --text '%s' %s", refdir, mixed, ms, list));
    for (int i = 0; i < nt; i++) {
        compare(toks[i].path, toks[i].stem, mixed, "mixed");
        compare(toks[i].path, toks[i].stem, ms, "multiscript");
    }
    free(names_g);
    free(names_l);
}

/* ids of a token file, checked against tokenizers' ids of each input file + the end-of-text token. */
static void check_prepared(const char *out_dir, const char *stem, const char *const *inputs, int n_inputs,
                           uint32_t eot)
{
    char p[512];
    snprintf(p, sizeof p, "%s/train.bin", out_dir);
    size_t n;
    enum data_format fmt;
    uint32_t *got = tt_tokens(p, &n, &fmt);
    cr_assert_eq(fmt, DATA_FORMAT_NANOGPT);
    size_t at = 0;
    for (int i = 0; i < n_inputs; i++) {
        snprintf(p, sizeof p, "%s/ref/%s__%s.ids", tt_dir, stem, inputs[i]);
        size_t rlen;
        uint32_t *ref = (uint32_t *)tu_read_ok(p, &rlen);
        size_t rn = rlen / 4;
        cr_assert_leq(at + rn + 1, n, "%s: train.bin ends inside %s", stem, inputs[i]);
        for (size_t j = 0; j < rn; j++)
            cr_assert_eq(got[at + j], ref[j], "%s: file %s, id %zu", stem, inputs[i], j);
        cr_assert_eq(got[at + rn], eot, "%s: %s is not followed by the end-of-text token", stem, inputs[i]);
        at += rn + 1;
        free(ref);
    }
    cr_assert_eq(at, n, "%s: train.bin has %zu ids, the files %zu", stem, n, at);
    free(got);
}

Test(tokenizer_ref, prepare_data_holds_tokenizers_ids_of_whole_files, .timeout = 240)
{
    need("tokenizers");
    train_both(1500, 400000);
    char in[256], p[512], src[1024], refdir[256], ex[1024];
    tt_path(in, sizeof in, "in");
    cr_assert_eq(mkdir(in, 0755), 0);
    snprintf(p, sizeof p, "%s/a.txt", in);
    tu_copy_ok(tu_source_path(src, sizeof src, "tests/tokenizer/data/mixed.txt"), p);
    snprintf(p, sizeof p, "%s/b.txt", in);
    free(tt_ref(python, "multiscript '%s' --bytes 60000 --seed 3", p));
    snprintf(p, sizeof p, "%s/c.md", in);
    tu_copy_ok(tu_source_path(src, sizeof src, "docs/data.md"), p);
    tu_source_path(ex, sizeof ex, "examples/tokenizer.json");
    cr_assert_eq(mkdir(tt_path(refdir, sizeof refdir, "ref"), 0755), 0);
    free(tt_ref(python, "encode --out-dir '%s' --text '%s/a.txt' --text '%s/b.txt' --text '%s/c.md' '%s' "
                "'%s/llama3.json'", refdir, in, in, in, ex, tt_dir));
    const char *inputs[] = {"a", "b", "c"};
    char exe[1024], out[256];
    tu_build_path(exe, sizeof exe, "worker/fsdp-prepare-data");
    /* GPT-2 style (the committed example): documents end with <|endoftext|> (id 0) */
    tt_path(out, sizeof out, "out_gpt2");
    char *log;
    const char *argv1[] = {exe, "--tokenizer", ex, "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(argv1, &log), 0, "%s", log);
    free(log);
    check_prepared(out, "tokenizer", inputs, 3, 0);
    /* Llama 3 style: no tokenizer_config.json beside it, so <|end_of_text|> (id 1 in the trained file) */
    tt_path(out, sizeof out, "out_llama3");
    snprintf(p, sizeof p, "%s/llama3.json", tt_dir);
    const char *argv2[] = {exe, "--tokenizer", p, "--val-fraction", "0", "-o", out, in, NULL};
    cr_assert_eq(tt_run(argv2, &log), 0, "%s", log);
    free(log);
    check_prepared(out, "llama3", inputs, 3, 1);
}

Test(tokenizer_ref, autotokenizer_reads_the_prepared_directory, .timeout = 240)
{
    need("tokenizers, transformers");
    char in[256], src[1024], ex[1024], exe[1024], out[256], p[512];
    tt_path(in, sizeof in, "in.txt");
    tu_copy_ok(tu_source_path(src, sizeof src, "tests/tokenizer/data/mixed.txt"), in);
    tu_source_path(ex, sizeof ex, "examples/tokenizer.json");
    tt_path(out, sizeof out, "out");
    const char *argv[] = {tu_build_path(exe, sizeof exe, "worker/fsdp-prepare-data"), "--tokenizer", ex, "--val-fraction",
                          "0", "-o", out, in, NULL};
    char *log;
    cr_assert_eq(tt_run(argv, &log), 0, "%s", log);
    free(log);
    /* train.bin without its final end-of-text token, as uint32 */
    snprintf(p, sizeof p, "%s/train.bin", out);
    size_t n;
    enum data_format fmt;
    uint32_t *ids = tt_tokens(p, &n, &fmt);
    snprintf(p, sizeof p, "%s/ids.bin", tt_dir);
    tu_write_ok(p, ids, (n - 1) * sizeof *ids);
    free(ids);
    free(tt_ref(python, "autotokenizer '%s' '%s' '%s'", out, in, p));
}

/* The Qwen2 and SentencePiece styles (tests/tokenizer/make_fixtures.py: Qwen2 with NFC and NFKC, Llama 2's
 * Metaspace with split false and true, prepend always with the Metaspace decoder, the older Prepend +
 * Replace normalizers, Gemma's Replace, NFKC), trained afresh: ids and decode equal tokenizers' on the
 * test texts and on generated multi-script text. */
Test(tokenizer_ref, qwen2_and_sentencepiece_styles_equal_tokenizers, .timeout = 240)
{
    need("tokenizers");
    char ms[256], mixed[1024], edges[1024], start[1024], out[256];
    free(tt_ref(python, "multiscript '%s' --bytes 200000 --seed 13", tt_path(ms, sizeof ms, "multiscript.txt")));
    tu_source_path(mixed, sizeof mixed, "tests/tokenizer/data/mixed.txt");
    tu_source_path(edges, sizeof edges, "tests/tokenizer/data/edges.txt");
    tu_source_path(start, sizeof start, "tests/tokenizer/data/special_start.txt");
    tt_path(out, sizeof out, "fx");
    char *names = tt_ref(python, "fixtures '%s' '%s' '%s' '%s' '%s'", out, mixed, edges, start, ms);
    const char *paths[] = {mixed, edges, start, ms}, *stems[] = {"mixed", "edges", "special_start", "multiscript"};
    int count = 0;
    for (char *save = NULL, *name = strtok_r(names, " \n", &save); name; name = strtok_r(NULL, " \n", &save)) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s.json", out, name);
        struct tokenizer *t;
        cr_assert_eq(tokenizer_load(p, &t), 0, "%s", error_message());
        for (int j = 0; j < 4; j++) {
            size_t len, rlen, dlen;
            char *text = tu_read_ok(paths[j], &len);
            snprintf(p, sizeof p, "%s/%s__%s.ids", out, name, stems[j]);
            uint32_t *ref = (uint32_t *)tu_read_ok(p, &rlen);
            snprintf(p, sizeof p, "%s/%s__%s.decoded", out, name, stems[j]);
            char *want = tu_read_ok(p, &dlen);
            struct tokenizer_ids ids = {0};
            cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s", error_message());
            size_t n = rlen / 4, first = 0;
            while (first < n && first < ids.n && ids.v[first] == ref[first])
                first++;
            cr_expect(ids.n == n && first == n, "%s on %s: %zu ids, tokenizers %zu; first difference at %zu", name,
                      stems[j], ids.n, n, first);
            char *back;
            size_t blen;
            cr_assert_eq(tokenizer_decode(t, ids.v, ids.n, false, &back, &blen), 0, "%s", error_message());
            cr_expect(blen == dlen && memcmp(back, want, dlen) == 0, "%s on %s: decode differs from tokenizers'",
                      name, stems[j]);
            free(back);
            free(want);
            free(ref);
            free(text);
            tokenizer_ids_free(&ids);
        }
        tokenizer_free(t);
        count++;
    }
    cr_expect_geq(count, 8, "%d tokenizers", count);
    free(names);
}

/* Short texts drawn from the characters where a tokenizer goes wrong (tokenizer_ref.py adversarial:
 * combining marks after ASCII, ▁ and its runs, special-token strings next to spaces, CRLF, NUL, Hangul
 * jamo, compatibility characters, "<0x41>" typed as text), through every committed fixture: ids and decode
 * equal tokenizers'. */
Test(tokenizer_ref, adversarial_texts_equal_tokenizers_for_the_fixtures, .timeout = 240)
{
    need("tokenizers");
    static const char *const names[] = {"qwen2", "qwen2_nfkc", "spm", "spm_split", "spm_always_metaspace_decoder",
                                        "spm_legacy", "spm_gemma", "spm_nfkc", "spm_unk_fused", "spm_unk"};
    const int nt = (int)(sizeof names / sizeof *names);
    static char list[8192];
    char out[256], src[1024], rel[256];
    tt_path(out, sizeof out, "adv");
    cr_assert_eq(mkdir(out, 0755), 0);
    size_t k = 0;
    for (int i = 0; i < nt; i++) {
        snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s.json", names[i]);
        k += (size_t)snprintf(list + k, sizeof list - k, " '%s'", tu_source_path(src, sizeof src, rel));
    }
    free(tt_ref(python, "adversarial '%s' --seed 7 --count 2000 %s", out, list));
    char p[512];
    snprintf(p, sizeof p, "%s/texts.bin", out);
    size_t tn;
    unsigned char *texts = (unsigned char *)tu_read_ok(p, &tn);
    for (int i = 0; i < nt; i++) {
        snprintf(rel, sizeof rel, "tests/tokenizer/data/fixtures/%s.json", names[i]);
        struct tokenizer *t;
        cr_assert_eq(tokenizer_load(tu_source_path(src, sizeof src, rel), &t), 0, "%s", error_message());
        snprintf(p, sizeof p, "%s/%s.adv", out, names[i]);
        size_t rn;
        unsigned char *ref = (unsigned char *)tu_read_ok(p, &rn);
        size_t ti = 0, ri = 0;
        int count = 0, bad = 0;
        while (ti + 4 <= tn) {
            uint32_t len, n, dlen;
            memcpy(&len, texts + ti, 4);
            const char *text = (const char *)texts + ti + 4;
            ti += 4 + len;
            cr_assert_leq(ri + 4, rn);
            memcpy(&n, ref + ri, 4);
            const unsigned char *ids_ref = ref + ri + 4;
            ri += 4 + 4 * (size_t)n;
            memcpy(&dlen, ref + ri, 4);
            const char *dec = (const char *)ref + ri + 4;
            ri += 4 + dlen;
            struct tokenizer_ids ids = {0};
            cr_assert_eq(tokenizer_encode(t, text, len, &ids), 0, "%s", error_message());
            bool ok = ids.n == n && (n == 0 || memcmp(ids.v, ids_ref, 4 * (size_t)n) == 0);
            char *back = NULL;
            size_t blen = 0;
            if (ok) {
                cr_assert_eq(tokenizer_decode(t, ids.v, ids.n, false, &back, &blen), 0, "%s", error_message());
                ok = blen == dlen && memcmp(back, dec, dlen) == 0;
            }
            if (!ok && bad++ < 3)
                cr_log_error("%s on \"%.*s\": %s differ", names[i], (int)len, text, back ? "decodes" : "ids");
            free(back);
            tokenizer_ids_free(&ids);
            count++;
        }
        cr_expect_eq(bad, 0, "%s: %d of %d texts differ from tokenizers", names[i], bad, count);
        cr_expect_eq(count, 2000);
        free(ref);
        tokenizer_free(t);
    }
    free(texts);
}
