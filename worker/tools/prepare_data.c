/* fsdp-prepare-data: turns text files and directories into byte-level token files (vocab 256, token =
 * byte value) train.bin and val.bin, so a training run needs no tokenizer and no download. Files are
 * visited in sorted path order and cut into chunks; whole chunks go to val.bin at a steady rate (about one
 * in 1/fraction by bytes), so the split is deterministic and val covers the whole corpus rather than only
 * the files that sort last. See docs/data.md. */
#include "common/error.h"
#include "common/log.h"
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
};

struct out_file {
    char *final_path, *tmp_path;
    int fd;
    int64_t tokens;
    uint16_t buf[32768];
    size_t buffered;
};

static int path_list_add(struct path_list *l, const char *path)
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
        return path_list_add(l, path);
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

static int read_file(const char *path, unsigned char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(FSDP_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? 2 * cap : 65536;
            unsigned char *p = realloc(*data, cap);
            if (!p) {
                rc = error_set(FSDP_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            *data = p;
        }
        size_t k = fread(*data + *len, 1, cap - *len, f);
        *len += k;
        if (k == 0)
            break;
    }
    if (ferror(f))
        rc = error_set(FSDP_EIO, "%s: read error", path);
out:
    fclose(f);
    return rc;
}

static int write_all(int fd, const void *buf, size_t len, const char *path)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return error_set(FSDP_EIO, "%s: cannot write: %s", path, k < 0 ? strerror(errno) : "short write");
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int out_open(struct out_file *o, const char *dir, const char *name, enum data_format fmt)
{
    o->fd = -1;
    if (asprintf(&o->final_path, "%s/%s", dir, name) < 0 || asprintf(&o->tmp_path, "%s/.%s.XXXXXX", dir, name) < 0)
        return error_set(FSDP_ENOMEM, "out of memory");
    o->fd = mkstemp(o->tmp_path);
    if (o->fd < 0)
        return error_set(FSDP_EIO, "%s: cannot create a file in the output directory: %s", o->final_path,
                         strerror(errno));
    if (fmt == DATA_FORMAT_LLMC) {
        int32_t header[DATA_LLMC_HEADER_INTS] = {0}; /* the count is filled in at the end */
        return write_all(o->fd, header, sizeof header, o->tmp_path);
    }
    return 0;
}

static int out_flush(struct out_file *o)
{
    int rc = write_all(o->fd, o->buf, o->buffered * sizeof o->buf[0], o->tmp_path);
    o->buffered = 0;
    return rc;
}

static int out_put(struct out_file *o, const unsigned char *bytes, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (o->buffered == sizeof o->buf / sizeof o->buf[0])
            FSDP_TRY(out_flush(o));
        o->buf[o->buffered++] = bytes[i]; /* little-endian host: uint16 in memory is the file format */
    }
    o->tokens += (int64_t)len;
    return 0;
}

/* temp + fsync + rename: a reader sees the old file or the complete new one, never a partial one. */
static int out_commit(struct out_file *o, enum data_format fmt)
{
    FSDP_TRY(out_flush(o));
    if (fmt == DATA_FORMAT_LLMC) {
        if (o->tokens > INT32_MAX)
            return error_set(FSDP_ERANGE, "%s: %lld tokens do not fit llm.c's int32 count; use the nanoGPT "
                                          "format", o->final_path, (long long)o->tokens);
        int32_t head[3] = {DATA_LLMC_MAGIC, DATA_LLMC_VERSION, (int32_t)o->tokens};
        if (pwrite(o->fd, head, sizeof head, 0) != (ssize_t)sizeof head)
            return error_set(FSDP_EIO, "%s: cannot write the header: %s", o->tmp_path, strerror(errno));
    }
    if (fsync(o->fd) != 0)
        return error_set(FSDP_EIO, "%s: fsync failed: %s", o->tmp_path, strerror(errno));
    if (fchmod(o->fd, 0644) != 0)
        return error_set(FSDP_EIO, "%s: chmod failed: %s", o->tmp_path, strerror(errno));
    if (rename(o->tmp_path, o->final_path) != 0)
        return error_set(FSDP_EIO, "%s: cannot rename into place: %s", o->final_path, strerror(errno));
    free(o->tmp_path);
    o->tmp_path = NULL;
    return 0;
}

static void out_cleanup(struct out_file *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp_path)
        unlink(o->tmp_path);
    free(o->tmp_path);
    free(o->final_path);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fsdp-prepare-data [options] INPUT...\n"
            "Turns text files and directories (recursively; hidden entries and binary files are skipped) into\n"
            "byte-level token files OUT/train.bin and OUT/val.bin (vocab_size 256, token = byte value).\n"
            "  -o, --out DIR            output directory (created if missing; default .)\n"
            "  -v, --val-fraction F     share of the corpus for val.bin, 0 <= F < 1 (default 0.1)\n"
            "  -f, --format FMT         nanogpt (headerless uint16, default) or llmc (llm.c header)\n"
            "  -c, --chunk-size BYTES   files are split into chunks of this size for the train/val split\n"
            "                           (default 16384)\n"
            "  -h, --help               this text\n");
}

struct prep_options {
    const char *out_dir;
    double val_fraction;
    enum data_format format;
    size_t chunk_size;
};

static int prepare(const struct prep_options *opt, char **inputs, int n_inputs)
{
    struct path_list files = {0};
    struct out_file *train = NULL, *val = NULL;
    unsigned char *data = NULL; /* the input file being split */
    int rc = 0;
    for (int i = 0; i < n_inputs; i++)
        FSDP_TRY_GOTO(collect(inputs[i], 1, &files), rc, out);
    if (files.n == 0) {
        rc = error_set(FSDP_EINVAL, "no input files found in the %d input(s) given", n_inputs);
        goto out;
    }
    qsort(files.v, files.n, sizeof *files.v, cmp_str);
    if (mkdir(opt->out_dir, 0755) != 0 && errno != EEXIST) {
        rc = error_set(FSDP_EIO, "%s: cannot create the output directory: %s", opt->out_dir, strerror(errno));
        goto out;
    }
    train = calloc(1, sizeof *train);
    val = calloc(1, sizeof *val);
    if (!train || !val) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    FSDP_TRY_GOTO(out_open(train, opt->out_dir, "train.bin", opt->format), rc, out);
    FSDP_TRY_GOTO(out_open(val, opt->out_dir, "val.bin", opt->format), rc, out);
    size_t n_text = 0, n_skipped = 0;
    for (size_t i = 0; i < files.n; i++) {
        size_t len;
        FSDP_TRY_GOTO(read_file(files.v[i], &data, &len), rc, out);
        if (len == 0 || !is_text(data, len)) {
            n_skipped += len != 0;
            free(data);
            data = NULL;
            continue;
        }
        n_text++;
        for (size_t off = 0; off < len; off += opt->chunk_size) {
            size_t n = len - off < opt->chunk_size ? len - off : opt->chunk_size;
            /* Send a chunk to val while val is behind its share of all bytes seen so far (counting half
             * this chunk), which keeps the split within one chunk of the requested fraction. */
            double seen = (double)(train->tokens + val->tokens) + (double)n / 2;
            int to_val = opt->val_fraction > 0 && (double)val->tokens < opt->val_fraction * seen;
            FSDP_TRY_GOTO(out_put(to_val ? val : train, data + off, n), rc, out);
        }
        free(data);
        data = NULL;
    }
    if (n_text == 0) {
        rc = error_set(FSDP_EINVAL, "no text files among the %zu input files (%zu binary files skipped)",
                       files.n, n_skipped);
        goto out;
    }
    if (train->tokens == 0 || (opt->val_fraction > 0 && val->tokens == 0)) {
        rc = error_set(FSDP_EINVAL, "corpus too small to split: train %lld, val %lld tokens; lower --chunk-size",
                       (long long)train->tokens, (long long)val->tokens);
        goto out;
    }
    FSDP_TRY_GOTO(out_commit(train, opt->format), rc, out);
    FSDP_TRY_GOTO(out_commit(val, opt->format), rc, out);
    int dfd = open(opt->out_dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd); /* makes the renames durable */
        close(dfd);
    }
    printf("%zu text files (%zu binary skipped), vocab_size 256, format %s\n", n_text, n_skipped,
           opt->format == DATA_FORMAT_LLMC ? "llmc" : "nanogpt");
    printf("%s: %lld tokens\n", train->final_path, (long long)train->tokens);
    printf("%s: %lld tokens\n", val->final_path, (long long)val->tokens);
out:
    free(data);
    if (train && val) { /* both allocated: the files may exist */
        out_cleanup(train);
        out_cleanup(val);
    }
    free(train);
    free(val);
    for (size_t i = 0; i < files.n; i++)
        free(files.v[i]);
    free(files.v);
    return rc;
}

int main(int argc, char **argv)
{
    log_init("fsdp-prepare-data");
    struct prep_options opt = {".", 0.1, DATA_FORMAT_NANOGPT, 16384};
    static const struct option longopts[] = {
        {"out", required_argument, NULL, 'o'},        {"val-fraction", required_argument, NULL, 'v'},
        {"format", required_argument, NULL, 'f'},     {"chunk-size", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "o:v:f:c:h", longopts, NULL)) != -1) {
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
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
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
