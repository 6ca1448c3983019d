#include "worker/train/data.h"

#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct data_file {
    char *path;
    struct data_options opt;
    enum data_format format;
    int fd; /* kept open: its size is checked before every read of the map */
    void *map;
    size_t map_len;
    const void *tokens; /* uint16_t or, for DATA_FORMAT_LLMC_U32, uint32_t */
    int64_t n_tokens;
};

/* A token file truncated under a running job turns reads of its mapping past the new end into SIGBUS.
 * The size check before each read (data_check_size) names the file; a truncation between that check and
 * the read is caught here: while a thread copies from a map, a SIGBUS inside that map jumps back to the
 * copy's caller, which reports the file. Any other SIGBUS keeps its default action (a crash). */
static _Thread_local struct {
    sigjmp_buf env;
    const char *lo, *hi; /* the map being read; lo == NULL outside a guarded read */
} g_guard;

static struct sigaction g_old_bus;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    const char *at = si->si_addr;
    if (g_guard.lo && at >= g_guard.lo && at < g_guard.hi) {
        g_guard.lo = NULL;
        siglongjmp(g_guard.env, 1);
    }
    /* Not ours: the previous disposition, or the default action when the faulting access runs again. */
    if (g_old_bus.sa_flags & SA_SIGINFO && g_old_bus.sa_sigaction) {
        g_old_bus.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_old_bus.sa_handler != SIG_DFL && g_old_bus.sa_handler != SIG_IGN && g_old_bus.sa_handler) {
        g_old_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL);
}

static void install_guard(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

static pthread_once_t g_guard_once = PTHREAD_ONCE_INIT;

static int truncated_error(const struct data_file *d, const char *when)
{
    struct stat st;
    long long now = fstat(d->fd, &st) == 0 ? (long long)st.st_size : -1;
    return error_set(FSDP_EIO, "%s: the token file shrank from %zu to %lld bytes %s: a token file must not "
                     "change while a job reads it (write a new file and point data.train_file at it)",
                     d->path, d->map_len, now, when);
}

static int data_check_size(const struct data_file *d, const char *when)
{
    struct stat st;
    if (fstat(d->fd, &st) != 0)
        return error_set(FSDP_EIO, "%s: cannot stat the token file: %s", d->path, strerror(errno));
    if ((size_t)st.st_size < d->map_len)
        return truncated_error(d, when);
    return 0;
}

const char *data_path(const struct data_file *d) { return d->path; }
enum data_format data_format_of(const struct data_file *d) { return d->format; }
int64_t data_num_tokens(const struct data_file *d) { return d->n_tokens; }

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int64_t data_row_offset(const struct data_file *d, int64_t step, int64_t row)
{
    uint64_t range = (uint64_t)(d->n_tokens - d->opt.block_size);
    if (d->opt.order == DATA_ORDER_SEQUENTIAL) {
        /* Unsigned 128-bit product: step * batch * block overflows 64 bits only in absurd runs, but the
         * formula must stay exact wherever it is defined. */
        unsigned __int128 pos = ((unsigned __int128)(uint64_t)step * (uint64_t)d->opt.batch_rows + (uint64_t)row) *
                                (uint64_t)d->opt.block_size;
        return (int64_t)(pos % range);
    }
    /* Counter-based: each input word passes through a full splitmix64 round, so neighbouring (step, row)
     * pairs give unrelated offsets and no state is carried between calls. */
    uint64_t h = splitmix64(d->opt.seed);
    h = splitmix64(h ^ (uint64_t)d->opt.stream);
    h = splitmix64(h ^ (uint64_t)step);
    h = splitmix64(h ^ (uint64_t)row);
    /* Lemire's multiply-shift maps 64 random bits to [0, range) with a bias below range / 2^64. */
    return (int64_t)(((unsigned __int128)h * range) >> 64);
}

int data_get_rows(const struct data_file *d, int64_t step, int64_t row_begin, int64_t row_count,
                  int32_t *inputs, int32_t *targets)
{
    if (step < 0 || row_begin < 0 || row_count < 0 || row_begin + row_count > d->opt.batch_rows)
        return error_set(FSDP_ERANGE, "%s: rows [%lld, %lld) of step %lld are outside the batch of %lld rows",
                         d->path, (long long)row_begin, (long long)(row_begin + row_count), (long long)step,
                         (long long)d->opt.batch_rows);
    FSDP_TRY(data_check_size(d, "during training"));
    int64_t T = d->opt.block_size;
    g_guard.lo = d->map;
    g_guard.hi = (const char *)d->map + d->map_len;
    if (sigsetjmp(g_guard.env, 1)) {
        g_guard.lo = NULL;
        return truncated_error(d, "during training");
    }
    for (int64_t r = 0; r < row_count; r++) {
        int64_t off = data_row_offset(d, step, row_begin + r);
        int32_t *in = inputs + r * T, *tg = targets + r * T;
        if (d->format == DATA_FORMAT_LLMC_U32) {
            /* data_scan checked every token < vocab_size <= INT32_MAX */
            const uint32_t *src = (const uint32_t *)d->tokens + off;
            for (int64_t t = 0; t < T; t++) {
                in[t] = (int32_t)src[t];
                tg[t] = (int32_t)src[t + 1];
            }
        } else {
            const uint16_t *src = (const uint16_t *)d->tokens + off;
            for (int64_t t = 0; t < T; t++) {
                in[t] = src[t];
                tg[t] = src[t + 1];
            }
        }
    }
    g_guard.lo = NULL;
    return 0;
}

static int data_check_options(const char *path, const struct data_options *opt)
{
    if (opt->block_size < 1)
        return error_set(FSDP_EINVAL, "%s: block_size %lld must be >= 1", path, (long long)opt->block_size);
    if (opt->vocab_size < 1)
        return error_set(FSDP_EINVAL, "%s: vocab_size %lld must be >= 1", path, (long long)opt->vocab_size);
    if (opt->batch_rows < 1)
        return error_set(FSDP_EINVAL, "%s: batch of %lld rows must be >= 1", path, (long long)opt->batch_rows);
    if ((unsigned)opt->order > DATA_ORDER_SEQUENTIAL)
        return error_set(FSDP_EINVAL, "%s: unknown order %d", path, (int)opt->order);
    return 0;
}

/* The format decides where the tokens start and how many there are (worker/data/data_format.c). */
static int data_detect(struct data_file *d, size_t size)
{
    size_t hdr = 0;
    FSDP_TRY(data_format_detect(d->map, size, d->path, &d->format, &hdr, &d->n_tokens));
    d->tokens = (const uint8_t *)d->map + hdr;
    return 0;
}

static int data_scan(const struct data_file *d)
{
    int64_t i = 0;
    uint64_t bad = 0;
    if (d->format == DATA_FORMAT_LLMC_U32) {
        const uint32_t *tok = d->tokens;
        uint64_t vocab = (uint64_t)d->opt.vocab_size;
        uint32_t max = 0;
        for (int64_t k = 0; k < d->n_tokens; k++)
            max = tok[k] > max ? tok[k] : max;
        if (max < vocab)
            return 0;
        while (tok[i] < vocab)
            i++;
        bad = tok[i];
    } else {
        if (d->opt.vocab_size > UINT16_MAX)
            return 0; /* every uint16 is a valid token */
        const uint16_t *tok = d->tokens;
        uint16_t vocab = (uint16_t)d->opt.vocab_size;
        /* Branch-free max over the file vectorises; the position is searched only on failure. */
        uint16_t max = 0;
        for (int64_t k = 0; k < d->n_tokens; k++)
            max = tok[k] > max ? tok[k] : max;
        if (max < vocab)
            return 0;
        while (tok[i] < vocab)
            i++;
        bad = tok[i];
    }
    return error_set(FSDP_EINVAL, "%s: token %llu at index %lld is >= vocab_size %lld (the file was made for "
                                  "another tokenizer, or vocab_size is too small)", d->path,
                     (unsigned long long)bad, (long long)i, (long long)d->opt.vocab_size);
}

/* The format, the length and every token of a freshly mapped file (under the SIGBUS guard). */
static int check_mapped(struct data_file *d, const struct data_options *opt)
{
    FSDP_TRY(data_detect(d, d->map_len));
    if (d->n_tokens < opt->block_size + 1)
        return error_set(FSDP_EINVAL, "%s: %lld tokens is too few: a row needs block_size + 1 = %lld tokens",
                         d->path, (long long)d->n_tokens, (long long)opt->block_size + 1);
    return data_scan(d);
}

int data_open(const char *path, const struct data_options *opt, struct data_file **out)
{
    *out = NULL;
    FSDP_TRY(data_check_options(path, opt));
    int rc = 0, fd = -1;
    struct data_file *d = calloc(1, sizeof *d);
    if (d)
        d->fd = -1;
    if (!d || !(d->path = strdup(path))) {
        rc = error_set(FSDP_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    d->opt = *opt;
    /* checks the type before a blocking open: a FIFO given as train_file or val_file would hang the rank */
    fd = fs_open_regular(path, "token file");
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = error_set(FSDP_EIO, "token file %s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (st.st_size == 0) {
        rc = error_set(FSDP_EINVAL, "%s: empty token file (need at least block_size + 1 = %lld tokens)", path,
                       (long long)opt->block_size + 1);
        goto fail;
    }
    d->map_len = (size_t)st.st_size;
    /* MAP_SHARED and read-only: ranks on one node share the page cache instead of each holding a copy. */
    d->map = mmap(NULL, d->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (d->map == MAP_FAILED) {
        d->map = NULL;
        rc = error_set(FSDP_EIO, "%s: cannot map %zu bytes: %s", path, d->map_len, strerror(errno));
        goto fail;
    }
    d->fd = fd;
    fd = -1;
    pthread_once(&g_guard_once, install_guard);
    madvise(d->map, d->map_len, MADV_SEQUENTIAL);
    g_guard.lo = d->map;
    g_guard.hi = (const char *)d->map + d->map_len;
    if (sigsetjmp(g_guard.env, 1)) {
        g_guard.lo = NULL;
        rc = truncated_error(d, "while it was being checked");
        goto fail;
    }
    int checked = check_mapped(d, opt);
    g_guard.lo = NULL;
    FSDP_TRY_GOTO(checked, rc, fail);
    /* Shuffled rows jump around: read-ahead beyond a row would be wasted I/O once the cache is cold. */
    madvise(d->map, d->map_len, opt->order == DATA_ORDER_SHUFFLED ? MADV_RANDOM : MADV_SEQUENTIAL);
    log_debug("%s: %s format, %lld tokens, %s order", path, data_format_name(d->format), (long long)d->n_tokens,
              opt->order == DATA_ORDER_SHUFFLED ? "shuffled" : "sequential");
    *out = d;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    data_close(d);
    return rc;
}

void data_close(struct data_file *d)
{
    if (!d)
        return;
    if (d->map)
        munmap(d->map, d->map_len);
    if (d->fd >= 0)
        close(d->fd);
    free(d->path);
    free(d);
}
