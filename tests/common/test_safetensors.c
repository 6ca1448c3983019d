/* safetensors: the 104-byte test vector from NOTES.md byte for byte, round trips, ranged reads, and
 * malformed headers rejected with the file and the tensor named. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/safetensors.h"

static const unsigned char vector104[] = {
    0x58, 0, 0, 0, 0, 0, 0, 0,
    '{', '"', '_', '_', 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', '_', '_', '"', ':', '{', '"', 'f', 'o',
    'r', 'm', 'a', 't', '"', ':', '"', 'p', 't', '"', '}', ',', '"', 'x', '"', ':', '{', '"', 'd', 't',
    'y', 'p', 'e', '"', ':', '"', 'F', '3', '2', '"', ',', '"', 's', 'h', 'a', 'p', 'e', '"', ':', '[',
    '2', ']', ',', '"', 'd', 'a', 't', 'a', '_', 'o', 'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '0',
    ',', '8', ']', '}', '}', ' ', ' ', ' ',
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,
};

static char dir[64];

static void setup_dir(void)
{
    strcpy(dir, "/tmp/st_test_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

TestSuite(safetensors, .init = setup_dir, .fini = teardown_dir);

static char *path_in_dir(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* A file with the given JSON header (padded to 8) followed by data_len bytes of data. */
static char *write_raw(const char *name, const char *json, size_t data_len)
{
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    unsigned char *buf = calloc(1, 8 + hl + data_len);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', hl - jl);
    char *p = path_in_dir(name);
    write_bytes(p, buf, 8 + hl + data_len);
    free(buf);
    return p;
}

Test(safetensors, writes_test_vector_byte_exact)
{
    float x[2] = {1.0f, 2.0f};
    struct safetensors_entry e = {.name = "x", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = x};
    struct safetensors_meta m = {.key = "format", .value = "pt"};
    char *p = path_in_dir("v.safetensors");
    cr_assert_eq(safetensors_write(p, &e, 1, &m, 1, NULL, NULL), 0, "%s", error_message());
    unsigned char got[256];
    FILE *f = fopen(p, "rb");
    size_t n = fread(got, 1, sizeof got, f);
    fclose(f);
    cr_assert_eq(n, sizeof vector104, "wrote %zu bytes, expected 104", n);
    cr_assert_arr_eq(got, vector104, sizeof vector104);
    /* Atomic writer leaves no temporary file behind. */
    DIR *d = opendir(dir);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d)))
        files += de->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 1);
}

Test(safetensors, reads_test_vector)
{
    char *p = path_in_dir("v.safetensors");
    write_bytes(p, vector104, sizeof vector104);
    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, p), 0, "%s", error_message());
    cr_assert_eq(f->n_tensors, 1);
    cr_assert_str_eq(safetensors_meta_get(f, "format"), "pt");
    const struct safetensors_tensor *t = safetensors_find(f, "x");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, SAFETENSORS_F32);
    cr_assert_eq(t->ndim, 1);
    cr_assert_eq(t->shape[0], 2);
    float v[2] = {0};
    cr_assert_eq(safetensors_read(f, t, 0, v, 8), 0);
    cr_assert_eq(v[0], 1.0f);
    cr_assert_eq(v[1], 2.0f);
    cr_assert_eq(safetensors_read(f, t, 4, v, 4), 0);
    cr_assert_eq(v[0], 2.0f);
    cr_assert_neq(safetensors_read(f, t, 4, v, 8), 0, "read past the tensor must fail");
    cr_assert_null(safetensors_find(f, "y"));
    safetensors_close(f);
}

static int fill(void *ctx, size_t index, uint64_t off, void *buf, size_t n)
{
    (void)index;
    memcpy(buf, (const char *)ctx + off, n);
    return 0;
}

Test(safetensors, round_trip_several_dtypes_and_fill_callback)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
    int32_t c[4] = {-1, 7, 1 << 30, 0};
    struct safetensors_entry e[4] = {
        {.name = "a.weight", .dtype = SAFETENSORS_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = SAFETENSORS_BF16, .ndim = 1, .shape = {3}, .data = b},
        {.name = "empty", .dtype = SAFETENSORS_F16, .ndim = 2, .shape = {0, 5}, .data = b},
        {.name = "c", .dtype = SAFETENSORS_I32, .ndim = 1, .shape = {4}, .data = NULL},
    };
    char *p = strdup(path_in_dir("rt.safetensors"));
    cr_assert_eq(safetensors_write(p, e, 4, NULL, 0, fill, c), 0, "%s", error_message());
    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, p), 0, "%s", error_message());
    cr_assert_eq(f->n_tensors, 4);
    cr_assert_eq(f->n_meta, 0);
    float ra[6];
    const struct safetensors_tensor *t = safetensors_find(f, "a.weight");
    cr_assert_eq(t->shape[1], 3);
    cr_assert_eq(safetensors_read(f, t, 0, ra, sizeof ra), 0);
    cr_assert_arr_eq(ra, a, sizeof a);
    uint16_t rb[3];
    cr_assert_eq(safetensors_read(f, safetensors_find(f, "b"), 0, rb, sizeof rb), 0);
    cr_assert_arr_eq(rb, b, sizeof b);
    cr_assert_eq(safetensors_find(f, "empty")->numel, 0);
    int32_t rc_[4];
    cr_assert_eq(safetensors_read(f, safetensors_find(f, "c"), 0, rc_, sizeof rc_), 0);
    cr_assert_arr_eq(rc_, c, sizeof c);
    safetensors_close(f);
    free(p);
}

/* Opens a malformed file and checks the message names the file and every given fragment. */
static void expect_reject(const char *path, const char *frag1, const char *frag2)
{
    struct safetensors_file *f = NULL;
    int rc = safetensors_open(&f, path);
    cr_assert_neq(rc, 0, "malformed file %s accepted", path);
    cr_assert_null(f);
    const char *msg = error_message();
    cr_assert(strstr(msg, path), "message does not name the file: %s", msg);
    if (frag1)
        cr_assert(strstr(msg, frag1), "message lacks '%s': %s", frag1, msg);
    if (frag2)
        cr_assert(strstr(msg, frag2), "message lacks '%s': %s", frag2, msg);
}

Test(safetensors, rejects_bad_json)
{
    expect_reject(write_raw("a", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8), "JSON",
                  NULL);
    expect_reject(write_raw("b", "[1,2]", 0), "'{'", NULL);
    expect_reject(write_raw("c", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8),
                  NULL, NULL);
    expect_reject(write_raw("d", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), "'x'", NULL);
    expect_reject(write_raw("e", "{\"__metadata__\":{\"n\":1}}", 0), "__metadata__", NULL);
}

Test(safetensors, rejects_overlap_and_hole)
{
    expect_reject(write_raw("ov",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            12),
                  "'b'", "overlaps");
    expect_reject(write_raw("hole",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
                            16),
                  "'b'", "hole");
    expect_reject(write_raw("dup",
                            "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            8),
                  "'a'", "twice");
}

Test(safetensors, rejects_out_of_bounds_and_trailing_bytes)
{
    expect_reject(write_raw("oob", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12),
                  "'w'", "past the end");
    expect_reject(write_raw("tail", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12),
                  "after the last tensor", NULL);
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    write_bytes(path_in_dir("hlen"), big, sizeof big);
    expect_reject(path_in_dir("hlen"), "header length", NULL);
    write_bytes(path_in_dir("short"), big, 5);
    expect_reject(path_in_dir("short"), "too short", NULL);
}

Test(safetensors, rejects_wrong_dtype_and_shape)
{
    expect_reject(write_raw("dt", "{\"w\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8), "'w'",
                  "F33");
    expect_reject(write_raw("sh", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8), "'w'",
                  "needs 12");
    expect_reject(write_raw("neg", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
                  "'w'", "shape[0]");
    expect_reject(write_raw("frac", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2.5],\"data_offsets\":[0,5]}}", 8),
                  "'w'", NULL);
}

Test(safetensors, missing_file_is_not_found)
{
    struct safetensors_file *f;
    cr_assert_eq(safetensors_open(&f, path_in_dir("nope")), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "nope"));
}

/* A written file has the mode any file the user creates has (0666 less the umask), like checkpoints,
 * not mkstemp's 0600; no temporary file is left beside it. */
Test(safetensors, written_file_follows_the_umask)
{
    float v[2] = {1, 2};
    struct safetensors_entry e = {.name = "x", .dtype = SAFETENSORS_F32, .ndim = 1, .shape = {2}, .data = v};
    const mode_t masks[] = {022, 077, 002};
    for (int i = 0; i < 3; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/m%d.safetensors", dir, i);
        mode_t old = umask(masks[i]);
        int rc = safetensors_write(path, &e, 1, NULL, 0, NULL, NULL);
        umask(old);
        cr_assert_eq(rc, 0, "%s", error_message());
        struct stat st;
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0666 & ~masks[i], "umask %03o: mode %03o", (unsigned)masks[i],
                     (unsigned)(st.st_mode & 0777));
    }
    DIR *d = opendir(dir);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            files++;
            cr_assert_null(strstr(de->d_name, ".tmp."), "temporary file left: %s", de->d_name);
        }
    closedir(d);
    cr_assert_eq(files, 3);
}
