/* Damaged and impossible checkpoints: a flipped byte, a truncated or missing file, an edited metadata
 * file, the wrong model, and a disk that fills up during a save. Each must be an error naming the file
 * and the problem, and must leave every earlier complete checkpoint readable. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "tests/ckpt/ctest.h"

static char dir[64];
static void setup(void)
{
    tu_mkdtemp(dir, sizeof dir, "ckpt_test");
}
static void teardown(void)
{
    tu_rm_tree(dir);
}

TestSuite(ckpt_fail, .init = setup, .fini = teardown);

static void flip_byte(const char *path, off_t at)
{
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0, "%s", path);
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    cr_assert_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static off_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return st.st_size;
}

/* Reads everything at world 1; returns the first error. */
static int read_all(struct ckpt_reader *r, const struct model_layout *l)
{
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int p = 0; p < l->n_params; p++) {
            float *buf = malloc(l->params[p].numel * sizeof *buf);
            int rc = ckpt_read(r, k, p, 0, l->params[p].numel, buf);
            free(buf);
            if (rc != 0)
                return rc;
        }
    return 0;
}

Test(ckpt_fail, flipped_byte_in_rank_file_is_a_crc_error_naming_it)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt10/fsdp_sharded_cpt10_rank1", dir);
    flip_byte(path, file_size(path) - 4000);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_eq(read_all(r, &l), FSDP_EINVAL);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "CRC32C mismatch"), "%s", error_message());
    cr_assert_neq(ckpt_verify(r, NULL), 0);
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt_fail, flipped_byte_in_full_model_file_is_a_crc_error_naming_it)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 5, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_cpt5/model.safetensors", dir);
    flip_byte(path, file_size(path) / 2);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_eq(read_all(r, &l), FSDP_EINVAL);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "CRC32C"), "%s", error_message());
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt_fail, damaged_safetensors_header_is_refused_at_open)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 5, 1, 0);
    ct_save_sharded(dir, &l, 6, 2, 2, 1, 0);
    const char *files[] = {"fsdp_cpt5/model.safetensors", "fsdp_sharded_cpt6/fsdp_sharded_cpt6_rank1"};
    for (int i = 0; i < 2; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        flip_byte(path, 30); /* inside the JSON header: invisible to the data CRCs */
        struct ckpt_reader *r;
        cr_assert_eq(ckpt_open(dir, i ? "fsdp_sharded_cpt6" : "fsdp_cpt5", &l, &r), FSDP_EINVAL);
        cr_assert(strstr(error_message(), path) && strstr(error_message(), "header"), "%s", error_message());
    }
    model_layout_free(&l);
}

Test(ckpt_fail, edited_metadata_is_refused)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 1, 2, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt10/metadata.json", dir);
    FILE *f = fopen(path, "r+");
    cr_assert_not_null(f);
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    char *step = strstr(text, "\"step\":\t10");
    cr_assert_not_null(step, "%.200s", text);
    step[9] = '2'; /* 10 -> 20, still valid JSON */
    rewind(f);
    fwrite(text, 1, n, f);
    fclose(f);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), FSDP_EINVAL);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "CRC32C mismatch"), "%s", error_message());
    model_layout_free(&l);
}

/* metadata.json with `key`'s number replaced by `value` and a CRC that matches again: what a parser meets
 * when the file is wrong but consistent (a bug elsewhere, or a hand edit that fixed the checksum). */
static void rewrite_number(const char *path, const char *key, const char *value)
{
    char *text = malloc(1 << 20);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[n] = '\0';
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *at = strstr(text, pat);
    cr_assert_not_null(at, "%s", key);
    at += strlen(pat);
    while (*at == ' ' || *at == '\t')
        at++;
    size_t old = strspn(at, "-+.0123456789eE");
    char *out = malloc(n + strlen(value) + 1);
    size_t head = (size_t)(at - text);
    memcpy(out, text, head);
    strcpy(out + head, value);
    strcat(out, at + old);
    size_t len = strlen(out);
    char *q = strchr(strstr(out, "\"metadata_crc32c\":") + strlen("\"metadata_crc32c\":"), '"');
    memset(q + 1, '0', 8);
    char crc[9];
    snprintf(crc, sizeof crc, "%08x", crc32c(out, len && out[len - 1] == '\n' ? len - 1 : len));
    memcpy(q + 1, crc, 8);
    f = fopen(path, "w");
    cr_assert_not_null(f);
    fwrite(out, 1, len, f);
    fclose(f);
    free(out);
    free(text);
}

/* Found by the metadata fuzzer (tests/fuzz/regress/ckpt_meta): a count beyond what a double holds exactly
 * was converted to int64_t (undefined behaviour). Counts must be whole numbers up to 2^53, the loss scale a
 * positive finite number; anything else is refused as malformed. */
Test(ckpt_fail, out_of_range_numbers_in_metadata_are_refused)
{
    struct model_layout l;
    ct_layout(&l, 77);
    static const struct {
        const char *key, *value;
    } cases[] = {{"scaler_good_steps", "55555555555555555550"}, {"step", "1e300"}, {"step", "-3"},
                 {"step", "2.5"}, {"loss_scale", "0"}, {"loss_scale", "-1e400"}, {"loss_scale", "1e400"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_save_sharded(dir, &l, (int64_t)(10 + i), 1, 2, 1, 0);
        char path[256], name[64];
        snprintf(name, sizeof name, "fsdp_sharded_cpt%zu", 10 + i);
        snprintf(path, sizeof path, "%s/%s/metadata.json", dir, name);
        rewrite_number(path, cases[i].key, cases[i].value);
        struct ckpt_reader *r = NULL;
        cr_assert_eq(ckpt_open(dir, name, &l, &r), FSDP_EINVAL, "%s = %s accepted", cases[i].key, cases[i].value);
        cr_assert(strstr(error_message(), "malformed scalar state"), "%s = %s: %s", cases[i].key, cases[i].value,
                  error_message());
    }
    model_layout_free(&l);
}

Test(ckpt_fail, truncated_rank_file_is_named_at_open)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 3, 1, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt10/fsdp_sharded_cpt10_rank2", dir);
    cr_assert_eq(truncate(path, file_size(path) - 100), 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), FSDP_EINVAL);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "truncated"), "%s", error_message());
    model_layout_free(&l);
}

Test(ckpt_fail, truncated_full_file_is_named_at_open)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 5, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_cpt5/optimizer.safetensors", dir);
    cr_assert_eq(truncate(path, 1000), 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), FSDP_EINVAL);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "truncated"), "%s", error_message());
    model_layout_free(&l);
}

Test(ckpt_fail, missing_rank_file_is_named_at_open)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt10/fsdp_sharded_cpt10_rank1", dir);
    cr_assert_eq(unlink(path), 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), path) && strstr(error_message(), "missing"), "%s", error_message());
    model_layout_free(&l);
}

Test(ckpt_fail, wrong_model_shape_says_both_shapes)
{
    struct model_layout l, other;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    struct model_config c;
    ct_config(&c, 77);
    c.n_embd = 48;
    cr_assert_eq(model_layout_build(&other, &c), 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &other, &r), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "wrong model shape") && strstr(error_message(), "n_embd 36") &&
                  strstr(error_message(), "n_embd 48") && strstr(error_message(), "metadata.json"),
              "%s", error_message());
    model_layout_free(&other);
    model_layout_free(&l);
}

/* ---- disk full ---- */

/* Mounts a tmpfs of `bytes` over path in a private mount namespace of this (child) process. */
static int mount_small_tmpfs(const char *path, size_t bytes)
{
    if (unshare(geteuid() == 0 ? CLONE_NEWNS : CLONE_NEWUSER | CLONE_NEWNS) != 0)
        return -1;
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return -1;
    char opt[64];
    snprintf(opt, sizeof opt, "size=%zu", bytes);
    return mount("tmpfs", path, "tmpfs", 0, opt);
}

enum { DF_SHARDED = 0, DF_FULL = 1 };

static int child_save_sharded(const char *root, const struct model_layout *l, int64_t step)
{
    struct ct_pieces ps = {0};
    int rc = 0;
    for (int r = 0; r < 2 && rc == 0; r++) {
        /* ct_rank_pieces asserts only on allocation failure, which does not happen here. */
        ct_rank_pieces(&ps, l, 2, r, 2, (uint32_t)step);
        rc = ckpt_sharded_write_rank(root, step, r, l, ps.v, ps.n);
        ct_free(&ps);
    }
    if (rc != 0) {
        ckpt_sharded_abort(root, step);
        return rc;
    }
    struct ckpt_state s;
    ct_state(&s, l, step, 2, 2);
    return ckpt_sharded_commit(root, step, 2, l, &s, 1);
}

static int child_save_full(const char *root, const struct model_layout *l, int64_t step)
{
    struct ckpt_full_writer *w;
    int rc = ckpt_full_open(root, step, l, &w);
    for (int p = 0; p < l->n_params && rc == 0; p++)
        for (int k = 0; k < CKPT_KINDS && rc == 0; k++) {
            float *t = malloc(l->params[p].numel * sizeof *t);
            ct_fill(l, k, p, 0, l->params[p].numel, t, (uint32_t)step);
            rc = ckpt_full_put(w, k, p, t);
            free(t);
        }
    if (rc != 0) {
        ckpt_full_abort(w);
        return rc;
    }
    struct ckpt_state s;
    ct_state(&s, l, step, 1, 2);
    return ckpt_full_commit(w, &s, 1);
}

/* In a child: a first save that fits, then a second that cannot. Exit code 0 = all checks passed; the
 * message (or the failed check) goes through the pipe. 77 = no way to fill a disk here. */
static void disk_full_child(int fd, int format)
{
    struct model_layout l;
    struct model_config c;
    ct_config(&c, 77);
    char msg[2048] = "";
    int code = 1;
    if (model_layout_build(&l, &c) != 0)
        _exit(3);
    size_t ckpt_bytes = 3 * l.numel * sizeof(float);
    const char *how = "tmpfs";
    if (mount_small_tmpfs(dir, ckpt_bytes + ckpt_bytes / 2) != 0)
        how = "RLIMIT_FSIZE";
    int rc = format == DF_FULL ? child_save_full(dir, &l, 1) : child_save_sharded(dir, &l, 1);
    if (rc != 0) {
        snprintf(msg, sizeof msg, "first save failed: %s", error_message());
        goto out;
    }
    if (strcmp(how, "RLIMIT_FSIZE") == 0) {
        /* No mount allowed: a file size limit makes write() fail with EFBIG the same way. */
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {ckpt_bytes / 8, ckpt_bytes / 8};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) {
            code = 77;
            goto out;
        }
    }
    rc = format == DF_FULL ? child_save_full(dir, &l, 2) : child_save_sharded(dir, &l, 2);
    snprintf(msg, sizeof msg, "[%s] %s", how, error_message());
    if (rc == 0) {
        snprintf(msg, sizeof msg, "[%s] second save succeeded on a full disk", how);
        goto out;
    }
    if (!strstr(msg, "disk full"))
        goto out;
    char path[256], out[4096];
    snprintf(path, sizeof path, "%s/.tmp_%s2", dir, format == DF_FULL ? "fsdp_cpt" : "fsdp_sharded_cpt");
    if (tu_exists(path)) {
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " | temp dir %s left behind", path);
        goto out;
    }
    if (ckpt_resolve(dir, "latest", out, sizeof out) != 0 || !strstr(out, "cpt1")) {
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " | latest no longer names step 1");
        goto out;
    }
    struct ckpt_reader *r;
    if (ckpt_open(dir, "latest", &l, &r) != 0 || read_all(r, &l) != 0) {
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " | step 1 unreadable: %s", error_message());
        goto out;
    }
    ckpt_close(r);
    code = 0;
out:
    if (write(fd, msg, strlen(msg)) < 0)
        code = 4;
    close(fd);
    umount2(dir, MNT_DETACH);
    model_layout_free(&l);
    _exit(code);
}

static void disk_full(int format)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        disk_full_child(p[1], format);
    }
    close(p[1]);
    char msg[2048] = "";
    size_t n = 0;
    ssize_t got;
    while ((got = read(p[0], msg + n, sizeof msg - 1 - n)) > 0)
        n += (size_t)got;
    msg[n] = '\0';
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        cr_skip_test("cannot simulate a full disk here (no tmpfs mount, no RLIMIT_FSIZE): %s", msg);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, msg);
    cr_log_info("disk full reported as: %s", msg);
}

Test(ckpt_fail, disk_full_during_sharded_save_fails_cleanly)
{
    disk_full(DF_SHARDED);
}

Test(ckpt_fail, disk_full_during_full_save_fails_cleanly)
{
    disk_full(DF_FULL);
}
