#include "common/error.h"
#include "tests/util/tu_check.h"
#include "worker/train/data.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Token i of a test file is (i * 7 + 3) % mod, so a row's tokens reveal its offset. */
static uint16_t tok(int64_t i, int mod) { return (uint16_t)((i * 7 + 3) % mod); }

static void make_nanogpt(const char *path, int64_t n, int mod)
{
    uint16_t *t = malloc((size_t)n * 2 + 2);
    for (int64_t i = 0; i < n; i++)
        t[i] = tok(i, mod);
    tu_write_ok(path, t, (size_t)n * 2);
    free(t);
}

static void make_llmc(const char *path, int64_t n, int32_t count, int mod)
{
    size_t len = 1024 + (size_t)n * 2;
    uint8_t *buf = calloc(1, len);
    int32_t head[3] = {DATA_LLMC_MAGIC, DATA_LLMC_VERSION, count};
    memcpy(buf, head, sizeof head);
    for (int64_t i = 0; i < n; i++) {
        uint16_t v = tok(i, mod);
        memcpy(buf + 1024 + 2 * i, &v, 2);
    }
    tu_write_ok(path, buf, len);
    free(buf);
}

/* llm.c's Llama 3 variant: magic 20240801, version 7, uint32 tokens; token i is 70000 + tok(i, mod). */
static void make_llmc_u32(const char *path, int64_t n, int32_t count, int32_t version, int mod)
{
    size_t len = 1024 + (size_t)n * 4;
    uint8_t *buf = calloc(1, len);
    int32_t head[3] = {DATA_LLMC_U32_MAGIC, version, count};
    memcpy(buf, head, sizeof head);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = 70000u + tok(i, mod);
        memcpy(buf + 1024 + 4 * i, &v, 4);
    }
    tu_write_ok(path, buf, len);
    free(buf);
}

static char tmpdir[64];
static char path_a[128];

static void setup(void)
{
    strcpy(tmpdir, "/tmp/fsdp-data-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
    snprintf(path_a, sizeof path_a, "%s/a.bin", tmpdir);
}

static void teardown(void) { tu_rm_tree(tmpdir); }

TestSuite(data, .init = setup, .fini = teardown);

static struct data_options opts(int64_t block, int64_t batch, enum data_order order, uint64_t seed)
{
    struct data_options o = {.block_size = block, .vocab_size = 50304, .batch_rows = batch, .order = order,
                             .seed = seed, .stream = DATA_STREAM_TRAIN};
    return o;
}

static void check_rows_at(const struct data_file *d, int64_t step, int64_t row, int64_t expect_off, int64_t T,
                          int mod)
{
    int32_t in[64], tg[64];
    cr_assert(T <= 64);
    cr_assert_eq(data_row_offset(d, step, row), expect_off, "step %lld row %lld", (long long)step, (long long)row);
    /* Fetch a window of rows that ends at `row`, so row_begin is exercised as well. */
    cr_assert_eq(data_get_rows(d, step, row, 1, in, tg), 0, "%s", error_message());
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(in[t], tok(expect_off + t, mod));
        cr_assert_eq(tg[t], tok(expect_off + t + 1, mod));
    }
}

Test(data, nanogpt_detected_and_sequential_formula)
{
    const int64_t N = 1000, T = 16, B = 8;
    make_nanogpt(path_a, N, 50000);
    struct data_options o = opts(T, B, DATA_ORDER_SEQUENTIAL, 0);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    cr_assert_eq(data_format_of(d), DATA_FORMAT_NANOGPT);
    cr_assert_eq(data_num_tokens(d), N);
    /* off = ((s * B + i) * T) mod (N - T), N - T = 984. */
    check_rows_at(d, 0, 0, 0, T, 50000);
    check_rows_at(d, 0, 7, 112, T, 50000);
    check_rows_at(d, 3, 5, (3 * 8 + 5) * 16, T, 50000);   /* 464 */
    check_rows_at(d, 7, 6, (7 * 8 + 6) * 16 % 984, T, 50000); /* 992 -> 8: first wrap-around */
    check_rows_at(d, 123456, 3, (123456LL * 8 + 3) * 16 % 984, T, 50000);
    data_close(d);
}

Test(data, llmc_u32_detected_and_checked)
{
    const int64_t N = 300, T = 8;
    make_llmc_u32(path_a, N, (int32_t)N, DATA_LLMC_U32_VERSION, 1000);
    struct data_options o = opts(T, 2, DATA_ORDER_SEQUENTIAL, 0);
    o.vocab_size = 71000;
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    cr_assert_eq(data_format_of(d), DATA_FORMAT_LLMC_U32);
    cr_assert_eq(data_num_tokens(d), N);
    int32_t in[8], tg[8];
    cr_assert_eq(data_get_rows(d, 3, 1, 1, in, tg), 0);
    int64_t off = (3 * 2 + 1) * T;
    for (int t = 0; t < T; t++) {
        cr_assert_eq(in[t], 70000 + tok(off + t, 1000));
        cr_assert_eq(tg[t], 70000 + tok(off + t + 1, 1000));
    }
    data_close(d);
    /* every token is checked against vocab_size; version and count must agree */
    o.vocab_size = 70900;
    cr_assert_lt(data_open(path_a, &o, &d), 0);
    cr_assert(strstr(error_message(), ">= vocab_size 70900"), "%s", error_message());
    o.vocab_size = 71000;
    make_llmc_u32(path_a, N, (int32_t)N + 1, DATA_LLMC_U32_VERSION, 1000);
    cr_assert_lt(data_open(path_a, &o, &d), 0);
    cr_assert(strstr(error_message(), "uint32 tokens"), "%s", error_message());
    make_llmc_u32(path_a, N, (int32_t)N, 1, 1000);
    cr_assert_lt(data_open(path_a, &o, &d), 0);
    cr_assert(strstr(error_message(), "has version 1, expected 7"), "%s", error_message());
}

Test(data, llmc_detected_and_read_past_header)
{
    const int64_t N = 500, T = 8;
    make_llmc(path_a, N, (int32_t)N, 60000);
    struct data_options o = opts(T, 4, DATA_ORDER_SEQUENTIAL, 0);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    cr_assert_eq(data_format_of(d), DATA_FORMAT_LLMC);
    cr_assert_eq(data_num_tokens(d), N);
    check_rows_at(d, 0, 0, 0, T, 60000);
    check_rows_at(d, 2, 1, (2 * 4 + 1) * 8, T, 60000);
    check_rows_at(d, 100, 3, (100 * 4 + 3) * 8 % (N - T), T, 60000);
    data_close(d);
}

static void check_world_size_independent(enum data_order order)
{
    const int64_t N = 4099, T = 32, B = 12;
    make_nanogpt(path_a, N, 50000);
    struct data_options o = opts(T, B, order, 42);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    static int32_t full_in[12 * 32], full_tg[12 * 32], in[12 * 32], tg[12 * 32];
    for (int64_t step = 0; step < 40; step += 13) {
        cr_assert_eq(data_get_rows(d, step, 0, B, full_in, full_tg), 0);
        for (int world = 1; world <= 4; world++) {
            memset(in, 0xff, sizeof in);
            memset(tg, 0xff, sizeof tg);
            int64_t per = B / world; /* 12 splits evenly 1, 2, 3 and 4 ways */
            for (int r = 0; r < world; r++)
                cr_assert_eq(data_get_rows(d, step, r * per, per, in + r * per * T, tg + r * per * T), 0);
            cr_assert_arr_eq(in, full_in, sizeof in, "world %d step %lld", world, (long long)step);
            cr_assert_arr_eq(tg, full_tg, sizeof tg, "world %d step %lld", world, (long long)step);
        }
        /* Uneven splits too (5 + 7), as a rank with a remainder would take. */
        cr_assert_eq(data_get_rows(d, step, 0, 5, in, tg), 0);
        cr_assert_eq(data_get_rows(d, step, 5, 7, in + 5 * T, tg + 5 * T), 0);
        cr_assert_arr_eq(in, full_in, sizeof in);
    }
    data_close(d);
}

Test(data, world_size_independent_sequential) { check_world_size_independent(DATA_ORDER_SEQUENTIAL); }
Test(data, world_size_independent_shuffled) { check_world_size_independent(DATA_ORDER_SHUFFLED); }

Test(data, shuffled_deterministic_seeded_and_in_range)
{
    const int64_t N = 100000, T = 64, B = 16;
    make_nanogpt(path_a, N, 50000);
    struct data_options o1 = opts(T, B, DATA_ORDER_SHUFFLED, 1337), o2 = o1, o3 = opts(T, B, DATA_ORDER_SHUFFLED, 1338);
    struct data_options ov = o1;
    ov.stream = DATA_STREAM_VAL;
    struct data_file *d1, *d2, *d3, *dv;
    cr_assert_eq(data_open(path_a, &o1, &d1), 0);
    cr_assert_eq(data_open(path_a, &o2, &d2), 0);
    cr_assert_eq(data_open(path_a, &o3, &d3), 0);
    cr_assert_eq(data_open(path_a, &ov, &dv), 0);
    int same_seed_diff = 0, other_seed_same = 0, val_same = 0, prev_step_same = 0;
    int64_t sum = 0, n = 0;
    for (int64_t s = 0; s < 50; s++) {
        for (int64_t i = 0; i < B; i++) {
            int64_t a = data_row_offset(d1, s, i);
            cr_assert(a >= 0 && a < N - T, "offset %lld out of range", (long long)a);
            same_seed_diff += a != data_row_offset(d2, s, i);
            other_seed_same += a == data_row_offset(d3, s, i);
            val_same += a == data_row_offset(dv, s, i);
            prev_step_same += s > 0 && a == data_row_offset(d1, s - 1, i);
            sum += a;
            n++;
        }
    }
    cr_assert_eq(same_seed_diff, 0);
    /* 800 draws from 99936 values: a handful of coincidences at most. */
    cr_assert(other_seed_same <= 3, "%d", other_seed_same);
    cr_assert(val_same <= 3, "%d", val_same);
    cr_assert(prev_step_same <= 3, "%d", prev_step_same);
    /* Mean of 800 uniform draws on [0, 99936): sd of the mean ~1020; 5 sd margin. */
    double mean = (double)sum / (double)n;
    cr_assert(mean > 49968 - 5100 && mean < 49968 + 5100, "mean %f", mean);
    /* Resume: a fresh open (another process, another rank) gives the same rows at a late step. */
    int32_t in1[64], tg1[64], in2[64], tg2[64];
    cr_assert_eq(data_get_rows(d1, 7777, 3, 1, in1, tg1), 0);
    data_close(d2);
    cr_assert_eq(data_open(path_a, &o2, &d2), 0);
    cr_assert_eq(data_get_rows(d2, 7777, 3, 1, in2, tg2), 0);
    cr_assert_arr_eq(in1, in2, sizeof in1);
    cr_assert_arr_eq(tg1, tg2, sizeof tg1);
    data_close(d1);
    data_close(d2);
    data_close(d3);
    data_close(dv);
}

Test(data, rows_outside_batch_rejected)
{
    make_nanogpt(path_a, 100, 50000);
    struct data_options o = opts(8, 4, DATA_ORDER_SEQUENTIAL, 0);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0);
    int32_t in[64], tg[64];
    cr_assert_eq(data_get_rows(d, 0, 3, 2, in, tg), FSDP_ERANGE);
    cr_assert(strstr(error_message(), path_a), "%s", error_message());
    cr_assert_eq(data_get_rows(d, -1, 0, 1, in, tg), FSDP_ERANGE);
    data_close(d);
}

static void expect_open_error(const char *path, const struct data_options *o, int code, const char *needle)
{
    struct data_file *d = (struct data_file *)1;
    cr_assert_eq(data_open(path, o, &d), code, "%s: %s", path, error_message());
    cr_assert_null(d);
    cr_assert(strstr(error_message(), path) != NULL, "message does not name the file: %s", error_message());
    cr_assert(strstr(error_message(), needle) != NULL, "'%s' not in: %s", needle, error_message());
}

Test(data, bad_files_rejected_with_their_names)
{
    struct data_options o = opts(16, 4, DATA_ORDER_SEQUENTIAL, 0);
    char p[160];

    snprintf(p, sizeof p, "%s/missing.bin", tmpdir);
    expect_open_error(p, &o, FSDP_ENOTFOUND, "cannot open");

    snprintf(p, sizeof p, "%s/empty.bin", tmpdir);
    tu_write_ok(p, "", 0);
    expect_open_error(p, &o, FSDP_EINVAL, "empty");

    snprintf(p, sizeof p, "%s/short.bin", tmpdir);
    make_nanogpt(p, 16, 50000); /* block_size tokens: one short of a row */
    expect_open_error(p, &o, FSDP_EINVAL, "too few");

    snprintf(p, sizeof p, "%s/short_llmc.bin", tmpdir);
    make_llmc(p, 10, 10, 50000);
    expect_open_error(p, &o, FSDP_EINVAL, "too few");

    snprintf(p, sizeof p, "%s/odd.bin", tmpdir);
    tu_write_ok(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ", 43);
    expect_open_error(p, &o, FSDP_EINVAL, "odd size");

    snprintf(p, sizeof p, "%s/count.bin", tmpdir);
    make_llmc(p, 100, 120, 50000);
    expect_open_error(p, &o, FSDP_EINVAL, "header says 120 tokens");

    snprintf(p, sizeof p, "%s/truncated_header.bin", tmpdir);
    int32_t head[3] = {DATA_LLMC_MAGIC, DATA_LLMC_VERSION, 5};
    tu_write_ok(p, head, sizeof head);
    expect_open_error(p, &o, FSDP_EINVAL, "shorter than");

    snprintf(p, sizeof p, "%s/version.bin", tmpdir);
    make_llmc(p, 100, 100, 50000);
    FILE *f = fopen(p, "r+b");
    int32_t v = 7;
    fseek(f, 4, SEEK_SET);
    fwrite(&v, 4, 1, f);
    fclose(f);
    expect_open_error(p, &o, FSDP_EINVAL, "version 7");

    /* vocab_size: tokens go up to 255 with mod 256; vocab 200 must fail, 256 pass. */
    snprintf(p, sizeof p, "%s/vocab.bin", tmpdir);
    make_nanogpt(p, 300, 256);
    o.vocab_size = 200;
    expect_open_error(p, &o, FSDP_EINVAL, ">= vocab_size 200");
    /* First token >= 200 is i = 29 (29 * 7 + 3 = 206). */
    cr_assert(strstr(error_message(), "token 206 at index 29"), "%s", error_message());
    o.vocab_size = 256;
    struct data_file *d;
    cr_assert_eq(data_open(p, &o, &d), 0, "%s", error_message());
    data_close(d);
    snprintf(p, sizeof p, "%s/vocab_llmc.bin", tmpdir);
    make_llmc(p, 300, 300, 256);
    o.vocab_size = 255;
    expect_open_error(p, &o, FSDP_EINVAL, "token 255");
}

/* A FIFO (or a directory) given as the token file is refused by its type before anything reads it: a
 * blocking open of a FIFO with no writer would hang the rank forever. The timeout makes a hang a failure. */
Test(data, fifo_or_directory_refused_naming_the_file, .timeout = 20)
{
    struct data_options o = opts(16, 4, DATA_ORDER_SEQUENTIAL, 0);
    char p[160];
    snprintf(p, sizeof p, "%s/tokens.fifo", tmpdir);
    cr_assert_eq(mkfifo(p, 0600), 0, "mkfifo %s: %s", p, strerror(errno));
    expect_open_error(p, &o, FSDP_EINVAL, "is not a regular file (it is a FIFO)");
    cr_assert(strstr(error_message(), "token file"), "%s", error_message());
    expect_open_error(tmpdir, &o, FSDP_EINVAL, "is not a regular file (it is a directory)");
}

/* A token file truncated under a running job: the next read fails naming the file instead of dying of
 * SIGBUS (the mapping's pages past the new end no longer exist). */
Test(data, truncated_under_a_reader_is_an_error_naming_the_file)
{
    const int64_t N = 1 << 20, T = 64, B = 8;
    make_nanogpt(path_a, N, 50000);
    struct data_options o = opts(T, B, DATA_ORDER_SHUFFLED, 5);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    int32_t in[8 * 64], tg[8 * 64];
    cr_assert_eq(data_get_rows(d, 0, 0, B, in, tg), 0, "%s", error_message());
    cr_assert_eq(truncate(path_a, 4096), 0);
    int rc = 0;
    for (int64_t s = 1; s < 50 && rc == 0; s++)
        rc = data_get_rows(d, s, 0, B, in, tg);
    cr_assert_eq(rc, FSDP_EIO, "reads after the truncation: %d", rc);
    cr_assert(strstr(error_message(), path_a) && strstr(error_message(), "shrank"), "%s", error_message());
    data_close(d);
}

struct truncator {
    const char *path;
    off_t full;
    volatile int stop;
};

static void *truncate_loop(void *arg)
{
    struct truncator *t = arg;
    while (!t->stop)
        if (truncate(t->path, 0) != 0 || truncate(t->path, t->full) != 0)
            break;
    return NULL;
}

/* Truncations racing the reads (after a read's size check, before its copy): every read returns 0 or the
 * error, none crashes. */
Test(data, racing_truncation_never_crashes)
{
    const int64_t N = 1 << 20, T = 64, B = 8;
    make_nanogpt(path_a, N, 50000);
    struct data_options o = opts(T, B, DATA_ORDER_SHUFFLED, 5);
    struct data_file *d;
    cr_assert_eq(data_open(path_a, &o, &d), 0, "%s", error_message());
    struct truncator t = {.path = path_a, .full = (off_t)N * 2};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, truncate_loop, &t), 0);
    int32_t in[8 * 64], tg[8 * 64];
    int ok = 0, failed = 0;
    /* At least 20000 reads, and on a busy machine on until the truncating thread has had its turn. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t s = 0;; s++) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (s >= 20000 && (failed > 0 || now.tv_sec - t0.tv_sec > 20))
            break;
        int rc = data_get_rows(d, s, 0, B, in, tg);
        cr_assert(rc == 0 || rc == FSDP_EIO, "rc %d: %s", rc, error_message());
        if (rc)
            cr_assert(strstr(error_message(), path_a), "%s", error_message());
        rc ? failed++ : ok++;
    }
    t.stop = 1;
    pthread_join(th, NULL);
    cr_log_info("racing truncation: %d reads ok, %d refused", ok, failed);
    cr_assert_gt(failed, 0, "no read saw the truncation");
    data_close(d);
}
