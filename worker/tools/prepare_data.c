/* fsdp-prepare-data: turns text files and directories into token files train.bin and val.bin. Without a
 * tokenizer a token is a byte (vocab 256), so a run needs no tokenizer and no download; with
 * --tokenizer tokenizer.json the text is encoded with that BPE, each document (input file)
 * followed by the end-of-text token, and the tokenizer's files are copied beside the token files, where
 * fsdp-ckpt finds them. Files are visited in sorted path order and cut into chunks; whole chunks go to
 * val.bin at a steady rate (about one in 1/fraction by bytes), so the split is deterministic and val covers
 * the whole corpus rather than only the files that sort last. With a tokenizer a chunk ends on a
 * pre-token boundary, so the ids of a file are the tokenizer's ids of the whole file, whichever side each
 * chunk lands on. The encoding runs on -j threads (prepare_pool.h), a chunk of whole documents each
 * (prepare_chunk.h); this file reads the inputs and writes the split on one thread, both in input order, so
 * the output is the same for any -j. See docs/data.md. */
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/data/data_format.h"
#include "worker/data/token_file.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tools/byte_progress.h"
#include "worker/tools/prepare_chunk.h"
#include "worker/tools/prepare_input.h"
#include "worker/tools/prepare_meta.h"
#include "worker/tools/prepare_pool.h"

#include <dirent.h>
#include <sched.h>
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

struct prep_options {
    const char *out_dir;
    double val_fraction;
    enum data_format format;
    bool format_set;
    size_t chunk_size;
    const char *tokenizer; /* NULL: byte-level */
    const char *eot, *bos;
    enum prepare_invalid_utf8 invalid_utf8;
    int progress; /* -1: on a terminal */
    const char *text_field; /* JSON Lines: the field that holds each document */
    bool skip_bad_lines;
    int threads; /* -j: the threads that encode */
};

/* -j's bound: each thread holds its own copy of the tokenizer. */
#define PREPARE_MAX_THREADS 256

/* The cores this process may run on (its affinity mask: a taskset or a container's cpuset), at most -j's
 * bound. */
static int default_threads(void)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n < 1) {
        long k = sysconf(_SC_NPROCESSORS_ONLN);
        n = k > 0 ? (int)k : 1;
    }
    return n < PREPARE_MAX_THREADS ? n : PREPARE_MAX_THREADS;
}

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
            "  -j, --jobs N             encode on N threads, 1 to %d (default: the cores this process may run on,\n"
            "                           %d here); the output is the same for any N\n"
            "      --progress, --no-progress   draw a progress bar (default: when stderr is a terminal)\n"
            "  -h, --help               this text\n", PREPARE_MAX_THREADS, default_threads());
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

static int doc_run(struct doc *d, const uint32_t *ids, size_t n, size_t text_bytes)
{
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
    char *json;       /* its text, read once: every thread's tokenizer is made from it */
    size_t json_len;
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

/* A tokenizer.json is read whole, once; every thread's tokenizer is made from those bytes. */
#define PREPARE_MAX_TOKENIZER_BYTES ((size_t)1 << 30)

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
    FSDP_TRY(prepare_input_read_file(s->path, "tokenizer", PREPARE_MAX_TOKENIZER_BYTES, (unsigned char **)&s->json,
                                     &s->json_len));
    FSDP_TRY(tokenizer_load_string(s->json, s->json_len, s->path, &s->tok));
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
    free(s->json);
    free(s->eot_text);
    free(s->bos_text);
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

/* ---- the threads: one tokenizer each (thread 0 uses the one already loaded) ---- */

struct pool_ctx {
    const struct tok_setup *ts;
    struct prepare_encode_opts enc;
};

struct thread_state {
    struct tokenizer *tok; /* NULL: byte-level */
    const struct prepare_encode_opts *enc;
};

static int thread_init(void *ctx, int thread, void **state)
{
    struct pool_ctx *pc = ctx;
    struct thread_state *s = calloc(1, sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory");
    s->enc = &pc->enc;
    s->tok = pc->ts->tok;
    if (pc->ts->tok && thread > 0) {
        int rc = tokenizer_load_string(pc->ts->json, pc->ts->json_len, pc->ts->path, &s->tok);
        if (rc < 0) {
            free(s);
            return rc;
        }
    }
    *state = s;
    return 0;
}

static void thread_fini(void *ctx, int thread, void *state)
{
    (void)ctx;
    struct thread_state *s = state;
    if (thread > 0)
        tokenizer_free(s->tok);
    free(s);
}

static void thread_work(void *state, void *job)
{
    struct thread_state *s = state;
    prepare_chunk_encode(s->tok, s->enc, job);
}

/* ---- reading (in file order) and writing (in the same order) ---- */

/* One input file's bytes, shared by its chunks: freed when the last of them is written. */
struct file_data {
    unsigned char *data;
    size_t refs;
};

static void file_data_release(struct file_data *f)
{
    if (f && --f->refs == 0) {
        free(f->data);
        free(f);
    }
}

static void chunk_release(struct prepare_chunk *c)
{
    prepare_chunk_free_output(c);
    file_data_release(c->owner);
    free(c);
}

/* JSON Lines files are cut into chunks of whole lines of about this many bytes: small enough to keep every
 * thread busy on a file of a few MB, large enough that handing them over costs nothing measurable. */
#define PREPARE_JSONL_CHUNK_BYTES ((size_t)256 << 10)
/* In flight between reading and writing: at most this many chunks per thread, and this much input. */
#define PREPARE_CHUNKS_PER_THREAD 4
#define PREPARE_INFLIGHT_BYTES ((size_t)64 << 20)

struct fill {
    const struct prep_options *opt;
    const struct tok_setup *ts;
    struct prepare_stats *stats;
    struct prepare_pool *pool;
    struct doc doc;
    bool write_failed; /* the output is abandoned: what is still in flight is not written */
};

/* A chunk's documents into the split, in order; the first error of the input is the one reported. */
static int write_chunk(struct fill *f, const struct prepare_chunk *c)
{
    if (c->rc < 0)
        return error_set(c->rc, "%s", c->error ? c->error : "out of memory");
    struct doc *d = &f->doc;
    uint64_t done0 = d->done;
    for (size_t i = 0; i < c->n_docs; i++) {
        const struct prepare_chunk_doc *doc = &c->docs[i];
        if (doc->skipped)
            continue;
        if (!f->ts->tok) {
            FSDP_TRY(put_bytes(f->opt, d, (doc->in_input ? c->data : c->bytes) + doc->off, doc->len));
            continue;
        }
        d->first = true;
        d->last = NULL;
        const uint32_t *ids = c->ids;
        for (size_t r = 0; r < doc->first_run; r++)
            ids += c->runs[r].n;
        for (size_t r = doc->first_run; r < doc->first_run + doc->n_runs; r++) {
            FSDP_TRY(doc_run(d, ids, c->runs[r].n, c->runs[r].text_bytes));
            ids += c->runs[r].n;
        }
        if (f->ts->eot >= 0) {
            uint32_t e = (uint32_t)f->ts->eot;
            FSDP_TRY(token_file_put(d->last ? d->last : d->split->train, &e, 1));
        }
    }
    struct prepare_stats *s = f->stats;
    s->documents += c->documents;
    s->text_files += c->kind == PREPARE_CHUNK_TEXT ? c->documents : 0;
    s->bad_lines += c->bad_lines;
    s->utf8_skipped += c->utf8_skipped;
    s->utf8_replaced += c->utf8_replaced;
    d->done = done0 + c->len; /* a repaired text is longer than the file: the bar counts the file's bytes */
    byte_progress_update(d->progress, d->done);
    return 0;
}

static int write_next(struct fill *f, bool wait)
{
    struct prepare_chunk *c = prepare_pool_pop(f->pool, wait);
    if (!c)
        return 0;
    int rc = write_chunk(f, c);
    chunk_release(c);
    f->write_failed |= rc < 0;
    return rc < 0 ? rc : 1;
}

/* Hands a chunk to the threads, first writing the oldest ones while the pool is full. */
static int submit(struct fill *f, struct file_data *fd, enum prepare_chunk_kind kind, const char *path,
                  size_t off, size_t len, size_t first_line)
{
    int rc = 0;
    while (!prepare_pool_has_room(f->pool, len))
        FSDP_TRY(write_next(f, true));
    struct prepare_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return error_set(FSDP_ENOMEM, "out of memory");
    *c = (struct prepare_chunk){.kind = kind, .path = path, .data = fd->data + off, .len = len,
                                .first_line = first_line, .owner = fd};
    fd->refs++;
    prepare_pool_push(f->pool, c, len);
    while ((rc = write_next(f, false)) > 0)
        ;
    return rc;
}

/* A JSON Lines file in chunks of whole lines. */
static int submit_jsonl(struct fill *f, struct file_data *fd, const char *path, size_t len)
{
    size_t off = 0, line = 1;
    while (off < len) {
        size_t end = off + PREPARE_JSONL_CHUNK_BYTES < len ? off + PREPARE_JSONL_CHUNK_BYTES : len;
        if (end < len) {
            const unsigned char *nl = memchr(fd->data + end, '\n', len - end);
            end = nl ? (size_t)(nl - fd->data) + 1 : len;
        }
        FSDP_TRY(submit(f, fd, PREPARE_CHUNK_JSONL, path, off, end - off, line));
        for (const unsigned char *p = fd->data + off; (p = memchr(p, '\n', (size_t)(fd->data + end - p))); p++)
            line++;
        off = end;
    }
    return 0;
}

/* One input file, read whole, into chunks. */
static int read_file(struct fill *f, const char *path)
{
    struct file_data *fd = calloc(1, sizeof *fd);
    if (!fd)
        return error_set(FSDP_ENOMEM, "out of memory");
    fd->refs = 1; /* the reader's, until every chunk is submitted */
    size_t len;
    int rc = 0;
    FSDP_TRY_GOTO(prepare_input_read(path, PREPARE_MAX_FILE_BYTES, &fd->data, &len), rc, out);
    struct prepare_stats *s = f->stats;
    if (len > 0 && prepare_input_is_jsonl(path)) {
        s->input_bytes += len;
        s->text_files++;
        rc = submit_jsonl(f, fd, path, len);
    } else if (len == 0 || !is_text(fd->data, len)) {
        s->binary_skipped += len != 0;
        rc = submit(f, fd, PREPARE_CHUNK_SKIP, path, 0, len, 0);
    } else {
        s->input_bytes += len;
        rc = submit(f, fd, PREPARE_CHUNK_TEXT, path, 0, len, 0);
    }
out:
    file_data_release(fd);
    return rc;
}

/* Every input file into the split, with the bar: read here in order, encoded on opt->threads threads,
 * written here in order. */
static int fill(const struct prep_options *opt, const struct tok_setup *ts, const struct path_list *files,
                struct split *split, struct prepare_stats *stats)
{
    struct byte_progress bar;
    byte_progress_init(&bar, stderr, opt->progress, "encoding", files->bytes);
    struct fill f = {.opt = opt, .ts = ts, .stats = stats,
                     .doc = {.split = split, .progress = &bar, .bos = ts->bos}};
    struct pool_ctx pc = {.ts = ts, .enc = {.run_bytes = opt->chunk_size, .invalid_utf8 = opt->invalid_utf8,
                                            .text_field = opt->text_field, .skip_bad_lines = opt->skip_bad_lines}};
    struct prepare_pool_config cfg = {.threads = opt->threads,
                                      .max_jobs = (size_t)PREPARE_CHUNKS_PER_THREAD * (size_t)opt->threads,
                                      .max_bytes = PREPARE_INFLIGHT_BYTES, .init = thread_init,
                                      .fini = thread_fini, .work = thread_work, .ctx = &pc};
    double t0 = log_elapsed_s();
    int rc = prepare_pool_start(&cfg, &f.pool);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < files->n && rc == 0; i++)
        rc = read_file(&f, files->v[i]);
    /* The chunks before the point of failure are written first: an error of an earlier file, found by a
     * thread, is the one the run reports, as it would be on one thread. */
    char *read_error = rc < 0 && !f.write_failed ? strdup(error_message()) : NULL;
    int wrc = 0;
    while (!f.write_failed && (wrc = write_next(&f, true)) > 0)
        ;
    if (wrc < 0)
        rc = wrc;
    else if (read_error)
        error_set(rc, "%s", read_error);
    if (f.write_failed) {
        prepare_pool_cancel(f.pool);
        struct prepare_chunk *c;
        while ((c = prepare_pool_pop(f.pool, true)))
            chunk_release(c);
    }
    free(read_error);
    prepare_pool_stop(f.pool);
    stats->seconds = log_elapsed_s() - t0;
    byte_progress_finish(&bar, f.doc.done);
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
                               .chunk_size = 16384, .progress = -1, .text_field = "text", .threads = 0};
    enum { OPT_EOT = 256, OPT_BOS, OPT_UTF8, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_TEXT_FIELD, OPT_SKIP_BAD };
    static const struct option longopts[] = {
        {"out", required_argument, NULL, 'o'},        {"val-fraction", required_argument, NULL, 'v'},
        {"format", required_argument, NULL, 'f'},     {"chunk-size", required_argument, NULL, 'c'},
        {"tokenizer", required_argument, NULL, 't'},  {"eot", required_argument, NULL, OPT_EOT},
        {"bos", required_argument, NULL, OPT_BOS},    {"invalid-utf8", required_argument, NULL, OPT_UTF8},
        {"progress", no_argument, NULL, OPT_PROGRESS}, {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
        {"text-field", required_argument, NULL, OPT_TEXT_FIELD}, {"skip-bad-lines", no_argument, NULL, OPT_SKIP_BAD},
        {"jobs", required_argument, NULL, 'j'},       {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "o:v:f:c:t:j:h", longopts, NULL)) != -1) {
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
        case 'j': {
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > PREPARE_MAX_THREADS) {
                log_error("-j/--jobs %s: use a whole number of threads from 1 to %d (default: the cores this "
                          "process may run on, %d here)", optarg, PREPARE_MAX_THREADS, default_threads());
                return 2;
            }
            opt.threads = (int)v;
            break;
        }
        case OPT_EOT:
            opt.eot = optarg;
            break;
        case OPT_BOS:
            opt.bos = optarg;
            break;
        case OPT_UTF8:
            if (strcmp(optarg, "error") == 0) {
                opt.invalid_utf8 = PREPARE_UTF8_ERROR;
            } else if (strcmp(optarg, "replace") == 0) {
                opt.invalid_utf8 = PREPARE_UTF8_REPLACE;
            } else if (strcmp(optarg, "skip") == 0) {
                opt.invalid_utf8 = PREPARE_UTF8_SKIP;
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
    if (opt.threads == 0)
        opt.threads = default_threads();
    int rc = prepare(&opt, argv + optind, argc - optind);
    if (rc < 0) {
        log_error("%s", error_message());
        return 1;
    }
    return 0;
}
