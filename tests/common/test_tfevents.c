#include "common/error.h"
#include "common/tfevents.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* NOTES.md's golden record: wall_time 1700000000.0, step 5, tag "loss", 2.5. */
static const uint8_t golden[] = {0x1a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x9b, 0xd8, 0x2d, 0x09, 0x00,
                                 0x00, 0x00, 0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x05, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a,
                                 0x04, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x20, 0x40, 0x95, 0xd4, 0xad, 0x7b};

Test(tfevents, golden_record_byte_exact)
{
    uint8_t data[128], rec[160];
    const char *tag = "loss";
    float v = 2.5f;
    int n = tfevents_encode_scalars(data, sizeof data, 1700000000.0, 5, 1, &tag, &v);
    cr_assert_eq(n, 26);
    int m = tfevents_frame_record(rec, sizeof rec, data, (size_t)n);
    cr_assert_eq(m, (int)sizeof golden);
    cr_assert_arr_eq(rec, golden, sizeof golden);
}

/* Event{wall_time, step 5, session_log{status START}}: field 7 (0x3a) holding field 1 = 1. */
Test(tfevents, session_start_record_byte_exact)
{
    static const uint8_t want[] = {0x09, 0x00, 0x00, 0x00, 0x40, 0xfc, 0x54, 0xd9, 0x41,
                                   0x10, 0x05, 0x3a, 0x02, 0x08, 0x01};
    uint8_t data[64];
    int n = tfevents_encode_session_start(data, sizeof data, 1700000000.0, 5);
    cr_assert_eq(n, (int)sizeof want);
    cr_assert_arr_eq(data, want, sizeof want);
    cr_assert_eq(tfevents_encode_session_start(data, 8, 1.0, 5), FSDP_ERANGE);
}

Test(tfevents, too_small_buffer_is_an_error)
{
    uint8_t data[16];
    const char *tag = "loss";
    float v = 1;
    cr_assert_eq(tfevents_encode_scalars(data, sizeof data, 1.0, 1, 1, &tag, &v), FSDP_ERANGE);
    cr_assert_eq(tfevents_frame_record(data, sizeof data, data, 8), FSDP_ERANGE);
}

/* --- An independent reader: its own bitwise CRC32C and protobuf walk, sharing no code with the writer. */

static uint32_t ref_crc32c(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static uint32_t ref_masked(const uint8_t *p, size_t n)
{
    uint32_t c = ref_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t rd_varint(const uint8_t *p, size_t *i, size_t end)
{
    uint64_t v = 0;
    for (int shift = 0; *i < end; shift += 7) {
        uint8_t b = p[(*i)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    cr_assert_fail("varint runs past the end");
    return 0;
}

struct parsed {
    int n_events, n_versions, n_scalars;
    double wall[16];
    int64_t step[16];
    char tag[16][32];
    float value[16];
    int has_version_first;
};

static void parse_value(const uint8_t *p, size_t end, struct parsed *out, int64_t step)
{
    size_t i = 0;
    int k = out->n_scalars++;
    cr_assert(k < 16);
    out->step[k] = step;
    while (i < end) {
        uint64_t key = rd_varint(p, &i, end);
        if (key == 0x0a) {
            uint64_t n = rd_varint(p, &i, end);
            cr_assert(n < 32 && i + n <= end);
            memcpy(out->tag[k], p + i, n);
            out->tag[k][n] = 0;
            i += n;
        } else if (key == 0x15) {
            uint32_t bits = (uint32_t)rd_le(p + i, 4);
            memcpy(&out->value[k], &bits, 4);
            i += 4;
        } else {
            cr_assert_fail("unexpected Value field key 0x%llx", (unsigned long long)key);
        }
    }
    cr_assert_eq(i, end);
}

static void parse_file(const char *path, struct parsed *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    uint8_t buf[8192];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t pos = 0;
    while (pos < len) {
        cr_assert(pos + 12 <= len);
        uint64_t n = rd_le(buf + pos, 8);
        cr_assert_eq((uint32_t)rd_le(buf + pos + 8, 4), ref_masked(buf + pos, 8), "length crc at %zu", pos);
        cr_assert(pos + 16 + n <= len, "record at %zu runs past the end", pos);
        const uint8_t *d = buf + pos + 12;
        cr_assert_eq((uint32_t)rd_le(d + n, 4), ref_masked(d, n), "data crc at %zu", pos);
        size_t i = 0;
        int64_t step = 0;
        int e = out->n_events++;
        while (i < n) {
            uint64_t key = rd_varint(d, &i, n);
            if (key == 0x09) {
                uint64_t bits = rd_le(d + i, 8);
                memcpy(&out->wall[e < 16 ? e : 15], &bits, 8);
                i += 8;
            } else if (key == 0x10) {
                step = (int64_t)rd_varint(d, &i, n);
            } else if (key == 0x1a) {
                uint64_t sl = rd_varint(d, &i, n);
                cr_assert(sl == 13 && memcmp(d + i, "brain.Event:2", 13) == 0);
                if (e == 0)
                    out->has_version_first = 1;
                out->n_versions++;
                i += sl;
            } else if (key == 0x2a) {
                uint64_t sl = rd_varint(d, &i, n);
                size_t send = i + sl;
                while (i < send) {
                    cr_assert_eq(rd_varint(d, &i, send), 0x0a);
                    uint64_t vl = rd_varint(d, &i, send);
                    parse_value(d + i, vl, out, step);
                    i += vl;
                }
            } else {
                cr_assert_fail("unexpected Event field key 0x%llx", (unsigned long long)key);
            }
        }
        cr_assert_eq(i, n);
        pos += 16 + n;
    }
}

static void write_sample(char *dir, char *path_out, size_t cap)
{
    cr_assert(mkdtemp(dir));
    struct tfevents_writer *w;
    cr_assert_eq(tfevents_open(dir, &w), 0, "%s", error_message());
    const char *tags[3] = {"train/loss", "train/lr", "a/tag/with/a/long/name/x"};
    float vals[3] = {3.25f, 6e-4f, -1.5e10f};
    cr_assert_eq(tfevents_write_scalars(w, 1700000001.5, 0, 3, tags, vals), 0);
    cr_assert_eq(tfevents_write_scalar(w, 1700000002.5, 300, "val/loss", 2.75f), 0);
    snprintf(path_out, cap, "%s", tfevents_path(w));
    tfevents_close(w);
}

Test(tfevents, written_file_parses_back)
{
    char dir[] = "/tmp/fsdp-tfevents-XXXXXX", path[512];
    write_sample(dir, path, sizeof path);
    char host[256];
    gethostname(host, sizeof host);
    host[255] = 0;
    const char *base = strrchr(path, '/') + 1;
    cr_assert(strncmp(base, "events.out.tfevents.", 20) == 0, "%s", base);
    cr_assert(strstr(base, host) != NULL, "%s lacks the host name %s", base, host);

    struct parsed p;
    parse_file(path, &p);
    cr_assert_eq(p.n_events, 3);
    cr_assert(p.has_version_first);
    cr_assert_eq(p.n_versions, 1);
    cr_assert_eq(p.n_scalars, 4);
    cr_assert_str_eq(p.tag[0], "train/loss");
    cr_assert_eq(p.value[0], 3.25f);
    cr_assert_eq(p.step[0], 0);
    cr_assert_eq(p.wall[1], 1700000001.5);
    cr_assert_str_eq(p.tag[1], "train/lr");
    cr_assert_eq(p.value[1], 6e-4f);
    cr_assert_str_eq(p.tag[2], "a/tag/with/a/long/name/x");
    cr_assert_eq(p.value[2], -1.5e10f);
    cr_assert_str_eq(p.tag[3], "val/loss");
    cr_assert_eq(p.step[3], 300);
    cr_assert_eq(p.value[3], 2.75f);

    /* A second writer in the same second must not clobber or share the first file. */
    struct tfevents_writer *w2;
    cr_assert_eq(tfevents_open(dir, &w2), 0);
    cr_assert_str_neq(tfevents_path(w2), path);
    tfevents_close(w2);
    parse_file(path, &p);
    cr_assert_eq(p.n_events, 3);
}

Test(tfevents, python_reader_verifies_crcs)
{
    char dir[] = "/tmp/fsdp-tfevents-XXXXXX", path[512];
    write_sample(dir, path, sizeof path);
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert(src, "FSDP_SOURCE_ROOT is not set (run through meson test)");
    cr_assert(access("/usr/bin/python3", X_OK) == 0, "/usr/bin/python3 is required by this test");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/common/read_tfevents.py' '%s'", src, path);
    FILE *f = popen(cmd, "r");
    cr_assert(f);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int st = pclose(f);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reader failed: %s", out);
    /* The version record carries the time the file was opened, so only its shape is checked. */
    cr_assert(strncmp(out, "version ", 8) == 0, "got:\n%s", out);
    char *rest = strchr(out, '\n');
    cr_assert(rest && rest - out > 14 && strncmp(rest - 14, " brain.Event:2", 14) == 0, "got:\n%s", out);
    cr_assert_str_eq(rest + 1, "scalar 0 train/loss 3.25\n"
                               "scalar 0 train/lr 0.0006000000284984708\n"
                               "scalar 0 a/tag/with/a/long/name/x -15000000512.0\n"
                               "scalar 300 val/loss 2.75\n", "got:\n%s", out);
}
