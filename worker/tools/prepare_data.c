/* fsdp-prepare-data: turns text files and directories into token files train.bin and val.bin. Without a
 * tokenizer a token is a byte (vocab 256), so a run needs no tokenizer and no download; with
 * --tokenizer tokenizer.json the text is encoded with that BPE, each document (input file)
 * followed by the end-of-text token, and the tokenizer's files are copied beside the token files, where
 * fsdp-ckpt finds them. Files are visited in sorted path order and cut into chunks; whole chunks go to
 * val.bin at a steady rate (about one in 1/fraction by bytes), so the split is deterministic and val covers
 * the whole corpus rather than only the files that sort last. With a tokenizer a chunk ends on a
 * pre-token boundary, so the ids of a file are the tokenizer's ids of the whole file, whichever side each
 * chunk lands on. See docs/data.md. */
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/tools/byte_progress.h"
#include "worker/tools/prepare_input.h"
#include "worker/tools/prepare_meta.h"
#include "worker/tools/token_file.h"
#include "worker/tools/tokenizer.h"
#include "worker/train/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct path_list {
    char **v;
    size_t n, cap;
    uint64_t bytes;
};

static int path_list_add(struct path_list *l, const char *path, uint64_t size)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return error_set(FSDP_ENOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(path)))
        return error_set(FSDP_ENOMEM, "out of memory");
    l->n++;
    l->bytes += size;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Hidden entries (.git, editor files) are skipped: they are not the corpus anyone means by a directory. */
static int collect(const char *path, int top, struct path_list *l)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set(FSDP_ENOTFOUND, "%s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode))
        return path_list_add(l, path, (uint64_t)st.st_size);
    if (!S_ISDIR(st.st_mode))
        return top ? error_set(FSDP_EINVAL, "%s: not a file or directory", path) : 0;
    DIR *dir = opendir(path);
    if (!dir)
        return error_set(FSDP_EIO, "%s: cannot read directory: %s", path, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        char *child;
        if (asprintf(&child, "%s/%s", path, e->d_name) < 0) {
            rc = error_set(FSDP_ENOMEM, "out of memory");
            goto out;
        }
        rc = collect(child, 0, l);
        free(child);
        if (rc < 0)
            goto out;
    }
out:
    closedir(dir);
    return rc;
}

/* Binary = a NUL byte in the first 8 KiB, the same test git and grep use. */
static int is_text(const unsigned char *data, size_t len)
{
    size_t n = len < 8192 ? len : 8192;
    return memchr(data, 0, n) == NULL;
}

/* One input file is read whole (decompressed); this bounds what one file can make the tool hold. */
#define PREPARE_MAX_FILE_BYTES ((size_t)8 << 30)

enum invalid_utf8 { UTF8_ERROR = 0, UTF8_REPLACE, UTF8_SKIP };

struct prep_options {
    const char *out_dir;
    double val_fraction;
    enum data_format format;
    bool format_set;
    size_t chunk_size;
    const char *tokenizer; /* NULL: byte-level */
    const char *eot, *bos;
    enum invalid_utf8 invalid_utf8;
    int progress; /* -1: on a terminal */
    const char *text_field; /* JSON Lines: the field that holds each document */
    bool skip_bad_lines;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fsdp-prepare-data [options] INPUT...\n"
            "Turns text files, JSON Lines files and directories (recursively; hidden entries and binary files are\n"
            "skipped; .gz and .zst inputs are decompressed) into\n"
            "token files OUT/train.bin and OUT/val.bin: byte-level tokens (vocab_size 256, token = byte value), or\n"
            "with --tokenizer the ids of a BPE tokenizer.json, each file followed by the end-of-text\n"
            "token. OUT/meta.json records what was made (docs/data.md).\n"
            "  -o, --out DIR            output directory (created if missing; default .)\n"
            "  -v, --val-fraction F     share of the corpus for val.bin, 0 <= F < 1 (default 0.1)\n"
            "  -f, --format FMT         nanogpt (headerless uint16, default) or llmc (llm.c header; uint32 tokens\n"
            "                           with llm.c's Llama 3 header when the vocabulary is above 65,536, which\n"
            "                           is then the default)\n"
            "  -c, --chunk-size BYTES   files are split into chunks of about this size for the train/val split\n"
            "                           (default 16384; with a tokenizer a chunk ends on a pre-token boundary)\n"
            "  -t, --tokenizer FILE     a Hugging Face tokenizer.json (BPE: GPT-2, Llama 3, Qwen2, Llama 2, Mistral\n"
            "                           or Gemma style), or\n"
            "                           a directory holding one; it is copied to OUT with tokenizer_config.json\n"
            "      --eot TOKEN          the token after each document: default the eos_token of the\n"
            "                           tokenizer_config.json beside the tokenizer, else <|endoftext|>, else\n"
            "                           <|end_of_text|>, else </s>; `none` for no separator\n"
            "      --bos TOKEN          also put TOKEN before each document (default: none)\n"
            "      --text-field NAME    JSON Lines inputs (.jsonl, .json): the field of each line that holds the\n"
            "                           document (default text); each document is followed by the end-of-text token\n"
            "      --skip-bad-lines     count and skip JSON Lines lines that are not JSON or lack the field (default:\n"
            "                           an error naming file:line)\n"
            "      --invalid-utf8 MODE  a file that is not UTF-8 (with --tokenizer): error (default), replace\n"
            "                           (each bad sequence becomes U+FFFD, as Python's errors=\"replace\") or skip\n"
            "      --progress, --no-progress   draw a progress bar (default: when stderr is a terminal)\n"
            "  -h, --help               this text\n");
}

struct split {
    struct token_file *train, *val;
    double val_fraction;
    uint64_t train_bytes, val_bytes; /* text bytes sent to each side */
};

/* Sends a chunk of `bytes` text bytes to val while val is behind its share of all bytes seen so far
 * (counting half this chunk), which keeps the split within one chunk of the requested fraction. */
static struct token_file *split_side(struct split *s, size_t bytes)
{
    double seen = (double)(s->train_bytes + s->val_bytes) + (double)bytes / 2;
    bool to_val = s->val_fraction > 0 && (double)s->val_bytes < s->val_fraction * seen;
    if (to_val)
        s->val_bytes += bytes;
    else
        s->train_bytes += bytes;
    return to_val ? s->val : s->train;
}

struct doc {
    struct split *split;
    struct byte_progress *progress;
    uint64_t done;   /* bytes of the corpus finished, for the bar */
    int64_t bos;     /* -1: none */
    bool first;      /* the next run starts the document */
    struct token_file *last;
};

static int doc_run(void *ctx, const uint32_t *ids, size_t n, size_t text_bytes)
{
    struct doc *d = ctx;
    struct token_file *f = split_side(d->split, text_bytes);
    if (d->first && d->bos >= 0) {
        uint32_t b = (uint32_t)d->bos;
        FSDP_TRY(token_file_put(f, &b, 1));
    }
    d->first = false;
    FSDP_TRY(token_file_put(f, ids, n));
    d->last = f;
    d->done += text_bytes;
    byte_progress_update(d->progress, d->done);
    return 0;
}

struct tok_setup {
    struct tokenizer *tok;
    char *path;       /* the tokenizer.json read */
    int64_t eot, bos; /* -1: none */
    char *eot_text, *bos_text;
};

static int resolve_token(const struct tokenizer *t, const char *path, const char *flag, const char *text,
                         int64_t *id)
{
    uint32_t v;
    if (tokenizer_token_id(t, text, &v) != 0)
        return error_set(FSDP_EINVAL, "%s \"%s\": not a token of %s", flag, text, path);
    *id = v;
    return 0;
}

static int setup_tokenizer(const struct prep_options *opt, struct tok_setup *s)
{
    memset(s, 0, sizeof *s);
    s->eot = s->bos = -1;
    struct stat st;
    if (stat(opt->tokenizer, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (asprintf(&s->path, "%s/tokenizer.json", opt->tokenizer) < 0) {
            s->path = NULL;
            return error_set(FSDP_ENOMEM, "out of memory");
        }
    } else if (!(s->path = strdup(opt->tokenizer))) {
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    FSDP_TRY(tokenizer_load(s->path, &s->tok));
    if (opt->bos) {
        FSDP_TRY(resolve_token(s->tok, s->path, "--bos", opt->bos, &s->bos));
        s->bos_text = strdup(opt->bos);
    }
    if (opt->eot && strcmp(opt->eot, "none") == 0)
        return 0; /* no separator */
    if (opt->eot) {
        FSDP_TRY(resolve_token(s->tok, s->path, "--eot", opt->eot, &s->eot));
        s->eot_text = strdup(opt->eot);
        return 0;
    }
    char *cfg_eos = NULL;
    FSDP_TRY(prepare_meta_config_eos(s->path, &cfg_eos));
    uint32_t v;
    int rc = 0;
    if (cfg_eos && tokenizer_token_id(s->tok, cfg_eos, &v) != 0) {
        rc = error_set(FSDP_EINVAL, "the tokenizer_config.json beside %s names eos_token \"%s\", which is not one "
                       "of its tokens: name the end-of-text token with --eot TOKEN", s->path, cfg_eos);
        goto out;
    }
    const char *cands[] = {cfg_eos, "<|endoftext|>", "<|end_of_text|>", "</s>"};
    for (int i = 0; i < 4 && s->eot < 0; i++) {
        if (cands[i] && tokenizer_token_id(s->tok, cands[i], &v) == 0) {
            s->eot = v;
            s->eot_text = strdup(cands[i]);
        }
    }
    if (s->eot < 0)
        rc = error_set(FSDP_EINVAL, "%s has no end-of-text token (no eos_token in a tokenizer_config.json beside it, "
                       "no <|endoftext|>, no <|end_of_text|>, no </s>): name one with --eot TOKEN, or --eot none", s->path);
out:
    free(cfg_eos);
    return rc;
}

static void free_setup(struct tok_setup *s)
{
    tokenizer_free(s->tok);
    free(s->path);
    free(s->eot_text);
    free(s->bos_text);
}

/* One text file with a tokenizer: its UTF-8 checked (or repaired), encoded in runs, then the EOT. */
static int encode_file(const struct prep_options *opt, const struct tok_setup *ts, struct doc *d, const char *path,
                       unsigned char *data, size_t len, struct prepare_stats *stats)
{
    char *text = (char *)data, *repaired = NULL;
    size_t n = len, bad_at = tokenizer_utf8_check(text, len);
    if (bad_at < len) {
        if (opt->invalid_utf8 == UTF8_SKIP) {
            stats->utf8_skipped++;
            return 1;
        }
        if (opt->invalid_utf8 == UTF8_ERROR)
            return error_set(FSDP_EINVAL, "%s: not UTF-8 (invalid byte 0x%02x at offset %zu); convert it (iconv), or "
                             "pass --invalid-utf8 replace (U+FFFD, as Python's errors=\"replace\") or --invalid-utf8 "
                             "skip", path, data[bad_at], bad_at);
        size_t replaced;
        FSDP_TRY(tokenizer_utf8_repair(text, len, &repaired, &n, &replaced));
        stats->utf8_replaced += replaced;
        text = repaired;
    }
    d->first = true;
    d->last = NULL;
    uint64_t done0 = d->done;
    int rc = 0;
    FSDP_TRY_GOTO(tokenizer_encode_runs(ts->tok, text, n, opt->chunk_size, doc_run, d), rc, out);
    if (ts->eot >= 0) {
        uint32_t e = (uint32_t)ts->eot;
        FSDP_TRY_GOTO(token_file_put(d->last ? d->last : d->split->train, &e, 1), rc, out);
    }
out:
    d->done = done0 + len; /* a repaired text is longer than the file: the bar counts the file's bytes */
    free(repaired);
    return rc;
}

/* Byte-level tokens of one text: whole chunks to one side of the split. */
static int put_bytes(const struct prep_options *opt, struct doc *d, const unsigned char *data, size_t len)
{
    for (size_t off = 0; off < len; off += opt->chunk_size) {
        size_t n = len - off < opt->chunk_size ? len - off : opt->chunk_size;
        FSDP_TRY(token_file_put_bytes(split_side(d->split, n), data + off, n));
        d->done += n;
        byte_progress_update(d->progress, d->done);
    }
    return 0;
}

/* A JSON Lines document, as a text file would be: byte-level tokens, or the tokenizer's ids then the EOT. */
struct jsonl_ctx {
    const struct prep_options *opt;
    const struct tok_setup *ts;
    struct doc *doc;
    const char *path;
    struct prepare_stats *stats;
};

static int jsonl_doc(void *ctx, const struct prepare_doc *d)
{
    struct jsonl_ctx *j = ctx;
    j->stats->documents++;
    if (!j->ts->tok)
        return put_bytes(j->opt, j->doc, (const unsigned char *)d->text, d->len);
    uint64_t done0 = j->doc->done;
    int rc = encode_file(j->opt, j->ts, j->doc, j->path, (unsigned char *)d->text, d->len, j->stats);
    j->doc->done = done0; /* the bar counts the file's bytes once, after the file */
    return rc < 0 ? rc : 0;
}

/* Every input file into the split, with the bar. */
static int fill(const struct prep_options *opt, const struct tok_setup *ts, const struct path_list *files,
                struct split *split, struct prepare_stats *stats)
{
    struct byte_progress bar;
    byte_progress_init(&bar, stderr, opt->progress, "encoding", files->bytes);
    struct doc doc = {.split = split, .progress = &bar, .bos = ts->bos};
    unsigned char *data = NULL;
    int rc = 0;
    double t0 = log_elapsed_s();
    for (size_t i = 0; i < files->n; i++) {
        size_t len;
        FSDP_TRY_GOTO(prepare_input_read(files->v[i], PREPARE_MAX_FILE_BYTES, &data, &len), rc, out);
        if (len > 0 && prepare_input_is_jsonl(files->v[i])) {
            stats->input_bytes += len;
            stats->text_files++;
            uint64_t done0 = doc.done;
            struct jsonl_ctx j = {.opt = opt, .ts = ts, .doc = &doc, .path = files->v[i], .stats = stats};
            FSDP_TRY_GOTO(prepare_input_jsonl(files->v[i], data, len, opt->text_field, opt->skip_bad_lines,
                                              &stats->bad_lines, jsonl_doc, &j),
                          rc, out);
            doc.done = done0 + len;
            byte_progress_update(&bar, doc.done);
        } else if (len == 0 || !is_text(data, len)) {
            stats->binary_skipped += len != 0;
            doc.done += len;
        } else if (!ts->tok) {
            stats->input_bytes += len;
            stats->text_files++;
            stats->documents++;
            FSDP_TRY_GOTO(put_bytes(opt, &doc, data, len), rc, out);
        } else {
            stats->input_bytes += len;
            int done = encode_file(opt, ts, &doc, files->v[i], data, len, stats);
            FSDP_TRY_GOTO(done, rc, out);
            stats->text_files += done == 0; /* 1: skipped, not UTF-8 */
            stats->documents += done == 0;
        }
        free(data);
        data = NULL;
    }
out:
    free(data);
    stats->seconds = log_elapsed_s() - t0;
    byte_progress_finish(&bar, doc.done);
    return rc;
}

static void report(const struct prepare_meta *m, const struct tok_setup *ts, const struct token_file *train,
                   const struct token_file *val)
{
    const struct prepare_stats *s = m->stats;
    printf("%zu text files (%zu binary skipped), %zu documents (%zu bad JSON Lines lines skipped), vocab_size %u, "
           "format %s\n", s->text_files, s->binary_skipped, s->documents, s->bad_lines,
           m->vocab_size, m->format == DATA_FORMAT_NANOGPT ? "nanogpt" : m->format == DATA_FORMAT_LLMC ? "llmc"
                                                                                       : "llmc uint32");
    if (ts->tok)
        printf("tokenizer %s: %s, %zu merges, %zu added tokens; each document ends with %s%s%s\n", ts->path,
               tokenizer_style(ts->tok), tokenizer_merge_count(ts->tok), tokenizer_added_count(ts->tok),
               ts->eot_text ? ts->eot_text : "nothing", ts->bos_text ? ", starts with " : "",
               ts->bos_text ? ts->bos_text : "");
    printf("%s: %lld tokens\n", train->final_path, (long long)train->tokens);
    printf("%s: %lld tokens\n", val->final_path, (long long)val->tokens);
    printf("%.1f MB of text in %.2f s (%.1f MB/s)\n", (double)s->input_bytes / 1e6, s->seconds,
           s->seconds > 0 ? (double)s->input_bytes / 1e6 / s->seconds : 0.0);
}

static int prepare(const struct prep_options *opt, char **inputs, int n_inputs)
{
    struct path_list files = {0};
    struct tok_setup ts = {.eot = -1, .bos = -1};
    struct token_file *train = NULL, *val = NULL;
    int rc = 0;
    for (int i = 0; i < n_inputs; i++)
        FSDP_TRY_GOTO(collect(inputs[i], 1, &files), rc, done);
    if (files.n == 0) {
        rc = error_set(FSDP_EINVAL, "no input files found in the %d input(s) given", n_inputs);
        goto done;
    }
    qsort(files.v, files.n, sizeof *files.v, cmp_str);
    enum data_format format = opt->format;
    uint32_t vocab = 256;
    if (opt->tokenizer) {
        FSDP_TRY_GOTO(setup_tokenizer(opt, &ts), rc, done);
        vocab = tokenizer_vocab_size(ts.tok);
        if (vocab > 65536 && opt->format_set && format == DATA_FORMAT_NANOGPT) {
            rc = error_set(FSDP_EINVAL, "--format nanogpt holds uint16 tokens, but %s has %u ids: use --format llmc "
                           "(uint32 tokens with llm.c's Llama 3 header)", ts.path, vocab);
            goto done;
        }
        if (vocab > 65536)
            format = DATA_FORMAT_LLMC_U32;
    }
    FSDP_TRY_GOTO(fs_mkdir_p(opt->out_dir, "output directory"), rc, done);
    train = calloc(1, sizeof *train);
    val = calloc(1, sizeof *val);
    if (!train || !val) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto done;
    }
    train->fd = val->fd = -1;
    FSDP_TRY_GOTO(token_file_open(train, opt->out_dir, "train.bin", format), rc, done);
    FSDP_TRY_GOTO(token_file_open(val, opt->out_dir, "val.bin", format), rc, done);
    struct split split = {.train = train, .val = val, .val_fraction = opt->val_fraction};
    struct prepare_stats stats = {0};
    FSDP_TRY_GOTO(fill(opt, &ts, &files, &split, &stats), rc, done);
    if (stats.text_files == 0) {
        rc = error_set(FSDP_EINVAL, "no text files among the %zu input files (%zu binary skipped, %zu not UTF-8)",
                       files.n, stats.binary_skipped, stats.utf8_skipped);
        goto done;
    }
    if (train->tokens == 0 || (opt->val_fraction > 0 && val->tokens == 0)) {
        rc = error_set(FSDP_EINVAL, "corpus too small to split: train %lld, val %lld tokens; lower --chunk-size",
                       (long long)train->tokens, (long long)val->tokens);
        goto done;
    }
    stats.train_tokens = train->tokens;
    stats.val_tokens = val->tokens;
    stats.train_bytes = split.train_bytes;
    stats.val_bytes = split.val_bytes;
    FSDP_TRY_GOTO(token_file_commit(train), rc, done);
    FSDP_TRY_GOTO(token_file_commit(val), rc, done);
    struct prepare_meta meta = {.out_dir = opt->out_dir, .tokenizer_path = ts.path, .tok = ts.tok,
                                .vocab_size = vocab, .format = format, .eot = ts.eot, .eot_text = ts.eot_text,
                                .bos = ts.bos, .bos_text = ts.bos_text, .stats = &stats};
    FSDP_TRY_GOTO(prepare_meta_write(&meta), rc, done);
    int dfd = open(opt->out_dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd); /* makes the renames durable */
        close(dfd);
    }
    report(&meta, &ts, train, val);
done:
    if (train)
        token_file_cleanup(train);
    if (val)
        token_file_cleanup(val);
    free(train);
    free(val);
    free_setup(&ts);
    for (size_t i = 0; i < files.n; i++)
        free(files.v[i]);
    free(files.v);
    return rc;
}

int main(int argc, char **argv)
{
    log_init("fsdp-prepare-data");
    struct prep_options opt = {.out_dir = ".", .val_fraction = 0.1, .format = DATA_FORMAT_NANOGPT,
                               .chunk_size = 16384, .progress = -1, .text_field = "text"};
    enum { OPT_EOT = 256, OPT_BOS, OPT_UTF8, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_TEXT_FIELD, OPT_SKIP_BAD };
    static const struct option longopts[] = {
        {"out", required_argument, NULL, 'o'},        {"val-fraction", required_argument, NULL, 'v'},
        {"format", required_argument, NULL, 'f'},     {"chunk-size", required_argument, NULL, 'c'},
        {"tokenizer", required_argument, NULL, 't'},  {"eot", required_argument, NULL, OPT_EOT},
        {"bos", required_argument, NULL, OPT_BOS},    {"invalid-utf8", required_argument, NULL, OPT_UTF8},
        {"progress", no_argument, NULL, OPT_PROGRESS}, {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
        {"text-field", required_argument, NULL, OPT_TEXT_FIELD}, {"skip-bad-lines", no_argument, NULL, OPT_SKIP_BAD},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "o:v:f:c:t:h", longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'o':
            opt.out_dir = optarg;
            break;
        case 'v':
            opt.val_fraction = strtod(optarg, &end);
            if (*end || end == optarg || !(opt.val_fraction >= 0 && opt.val_fraction < 1)) {
                log_error("--val-fraction %s: use a number in [0, 1)", optarg);
                return 2;
            }
            break;
        case 'f':
            if (strcmp(optarg, "nanogpt") == 0) {
                opt.format = DATA_FORMAT_NANOGPT;
            } else if (strcmp(optarg, "llmc") == 0) {
                opt.format = DATA_FORMAT_LLMC;
            } else {
                log_error("--format %s: use nanogpt or llmc", optarg);
                return 2;
            }
            opt.format_set = true;
            break;
        case 'c': {
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 1) {
                log_error("--chunk-size %s: use a positive number of bytes", optarg);
                return 2;
            }
            opt.chunk_size = (size_t)v;
            break;
        }
        case 't':
            opt.tokenizer = optarg;
            break;
        case OPT_EOT:
            opt.eot = optarg;
            break;
        case OPT_BOS:
            opt.bos = optarg;
            break;
        case OPT_UTF8:
            if (strcmp(optarg, "error") == 0) {
                opt.invalid_utf8 = UTF8_ERROR;
            } else if (strcmp(optarg, "replace") == 0) {
                opt.invalid_utf8 = UTF8_REPLACE;
            } else if (strcmp(optarg, "skip") == 0) {
                opt.invalid_utf8 = UTF8_SKIP;
            } else {
                log_error("--invalid-utf8 %s: use error, replace or skip", optarg);
                return 2;
            }
            break;
        case OPT_TEXT_FIELD:
            if (!optarg[0]) {
                log_error("--text-field: name the JSON field that holds each document (default text)");
                return 2;
            }
            opt.text_field = optarg;
            break;
        case OPT_SKIP_BAD:
            opt.skip_bad_lines = true;
            break;
        case OPT_PROGRESS:
        case OPT_NO_PROGRESS:
            opt.progress = c == OPT_PROGRESS;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!opt.tokenizer && (opt.eot || opt.bos)) {
        log_error("--%s needs --tokenizer: byte-level tokens have no end-of-text token", opt.eot ? "eot" : "bos");
        return 2;
    }
    if (optind >= argc) {
        log_error("no input files: give text files or directories, e.g. fsdp-prepare-data -o data docs");
        usage(stderr);
        return 2;
    }
    int rc = prepare(&opt, argv + optind, argc - optind);
    if (rc < 0) {
        log_error("%s", error_message());
        return 1;
    }
    return 0;
}
