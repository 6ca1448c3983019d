/* Checkpoint round trips: sharded saves at world 1, 2, 3 in both piece styles read back at other world
 * sizes, full saves read back and loaded by model_weights_load, scalar state, `latest`, keep_last
 * pruning and the invisibility of unfinished saves. Damage and disk-full cases are test_ckpt_fail.c. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "tests/ckpt/ctest.h"
#include "worker/model/model_hf.h"

static char dir[64];
static void setup(void)
{
    tu_mkdtemp(dir, sizeof dir, "ckpt_test");
}
static void teardown(void)
{
    tu_rm_tree(dir);
}

TestSuite(ckpt, .init = setup, .fini = teardown);

static void reshard(int save_world, int version, const int *read_worlds, int n_read)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, save_world, version, 1, 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_str_eq(ckpt_reader_format(r), "sharded");
    for (int i = 0; i < n_read; i++)
        ct_check_read(r, &l, read_worlds[i], 1);
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt, sharded_world1_read_at_2_and_3)
{
    reshard(1, 2, (int[]){1, 2, 3}, 3);
}

Test(ckpt, sharded_v2_world2_read_at_1_3_4)
{
    reshard(2, 2, (int[]){1, 3, 4}, 3);
}

Test(ckpt, sharded_v2_world3_read_at_2)
{
    reshard(3, 2, (int[]){2, 5}, 2);
}

Test(ckpt, sharded_v1_flat_units_world2_read_at_3)
{
    reshard(2, 1, (int[]){1, 3}, 2);
}

Test(ckpt, sharded_v1_flat_units_world3_read_at_2)
{
    reshard(3, 1, (int[]){2, 4}, 2);
}

Test(ckpt, unaligned_ranges_cross_pieces_and_crc_blocks)
{
    /* wte of a 2048-row vocabulary is 288 KiB per kind: still one CRC block, so use n_embd 36 and vocab
     * 16384 (2.25 MiB) to get several blocks and reads that start and end inside them. */
    struct model_layout l;
    ct_layout(&l, 16384);
    ct_save_sharded(dir, &l, 3, 3, 2, 9, 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    int p = model_layout_find(&l, "wte.weight");
    size_t n = l.params[p].numel;
    size_t cuts[][2] = {{0, 1}, {1, 262143}, {262143, 262146}, {100000, 400000}, {n - 5, 5}, {0, n}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        size_t b = cuts[c][0], cnt = cuts[c][1];
        float *got = malloc(cnt * sizeof *got), *want = malloc(cnt * sizeof *want);
        ct_fill(&l, CKPT_EXP_AVG, p, b, cnt, want, 9);
        cr_assert_eq(ckpt_read(r, CKPT_EXP_AVG, p, b, cnt, got), 0, "%s", error_message());
        cr_assert(memcmp(got, want, cnt * sizeof *got) == 0, "range [%zu, +%zu) differs", b, cnt);
        free(got);
        free(want);
    }
    float x;
    cr_assert_eq(ckpt_read(r, CKPT_PARAM, p, n, 1, &x), FSDP_ERANGE);
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt, scalar_state_round_trip)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 42, 2, 1, 1, 0);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", NULL, &r), 0, "%s", error_message());
    const struct ckpt_state *s = ckpt_reader_state(r);
    struct ckpt_state want;
    ct_state(&want, &l, 42, 2, 1);
    cr_assert_eq(s->step, 42);
    cr_assert_eq(s->loss_scale, want.loss_scale);
    cr_assert_eq(s->scaler_good_steps, want.scaler_good_steps);
    cr_assert_eq(s->world_size, 2);
    cr_assert_eq(s->fsdp_version, 1);
    cr_assert_str_eq(s->strategy, "FULL_SHARD");
    cr_assert_str_eq(s->config_text, want.config_text);
    cr_assert_str_eq(s->model.model_family, "gpt2");
    cr_assert_eq(s->model.n_layer, 2);
    cr_assert_eq(s->model.n_embd, 36);
    cr_assert_eq(s->model.vocab_size, 77);
    cr_assert_eq(s->model.seed, l.config.seed);
    /* No layout given: the reader builds the checkpoint's own. */
    cr_assert_eq(ckpt_reader_layout(r)->numel, l.numel);
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt, full_round_trip_any_put_order_and_reshard)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 5, 3, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_cpt5/model.safetensors", dir);
    cr_assert(tu_exists(path));
    snprintf(path, sizeof path, "%s/fsdp_cpt5/optimizer.safetensors", dir);
    cr_assert(tu_exists(path));
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_str_eq(ckpt_reader_format(r), "full");
    ct_check_read(r, &l, 1, 3);
    ct_check_read(r, &l, 3, 3); /* padding rows of wte come back as zeros */
    ckpt_close(r);
    model_layout_free(&l);
}

Test(ckpt, full_model_file_loads_with_model_weights_load)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 8, 4, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_cpt8/model.safetensors", dir);
    float *got = malloc(l.numel * sizeof *got);
    memset(got, 0xff, l.numel * sizeof *got);
    cr_assert_eq(model_weights_load(&l, path, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++) {
            float want = ct_value(&l, CKPT_PARAM, p, i, 4);
            cr_assert(memcmp(&got[l.params[p].offset + i], &want, 4) == 0, "%s[%zu]", l.params[p].name, i);
        }
    /* The optimizer file: the same names behind "exp_avg." / "exp_avg_sq.", real rows only. */
    struct safetensors_file *f;
    snprintf(path, sizeof path, "%s/fsdp_cpt8/optimizer.safetensors", dir);
    cr_assert_eq(safetensors_open(&f, path), 0, "%s", error_message());
    cr_assert_eq(f->n_tensors, 2 * (size_t)l.n_params);
    const struct safetensors_tensor *t = safetensors_find(f, "exp_avg_sq.wte.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->shape[0], 77);
    cr_assert_eq(t->shape[1], 36);
    float v;
    cr_assert_eq(safetensors_read(f, t, 4 * 37, &v, 4), 0);
    cr_assert_eq(v, ct_value(&l, CKPT_EXP_AVG_SQ, model_layout_find(&l, "wte.weight"), 37, 4));
    safetensors_close(f);
    free(got);
    model_layout_free(&l);
}

Test(ckpt, full_commit_refuses_missing_tensor)
{
    struct model_layout l;
    ct_layout(&l, 77);
    struct ckpt_full_writer *w;
    cr_assert_eq(ckpt_full_open(dir, 3, &l, &w), 0, "%s", error_message());
    float *t = calloc(l.params[0].numel, sizeof *t);
    cr_assert_eq(ckpt_full_put(w, CKPT_PARAM, 0, t), 0);
    cr_assert_eq(ckpt_full_put(w, CKPT_PARAM, 0, t), FSDP_EINVAL, "a second put of one tensor was accepted");
    struct ckpt_state s;
    ct_state(&s, &l, 3, 1, 2);
    cr_assert_neq(ckpt_full_commit(w, &s, 0), 0);
    cr_assert(strstr(error_message(), "never put"), "%s", error_message());
    char path[256];
    snprintf(path, sizeof path, "%s/.tmp_fsdp_cpt3", dir);
    cr_assert(!tu_exists(path), "temporary directory left behind");
    snprintf(path, sizeof path, "%s/fsdp_cpt3", dir);
    cr_assert(!tu_exists(path));
    free(t);
    model_layout_free(&l);
}

Test(ckpt, latest_points_at_newest_and_resolves)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    ct_save_full(dir, &l, 20, 2, 0);
    char out[4096], want[256];
    cr_assert_eq(ckpt_resolve(dir, "latest", out, sizeof out), 0, "%s", error_message());
    snprintf(want, sizeof want, "%s/fsdp_cpt20", dir);
    cr_assert_str_eq(out, want);
    cr_assert_eq(ckpt_resolve(dir, "fsdp_sharded_cpt10", out, sizeof out), 0);
    snprintf(want, sizeof want, "%s/fsdp_sharded_cpt10", dir);
    cr_assert_str_eq(out, want);
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(want, NULL, &l, &r), 0, "%s", error_message());
    cr_assert_eq(ckpt_reader_state(r)->step, 10);
    ckpt_close(r);
    /* A root without any checkpoint: not found, saying so. */
    char empty[64];
    tu_mkdtemp(empty, sizeof empty, "ckpt_test");
    cr_assert_eq(ckpt_resolve(empty, "latest", out, sizeof out), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "no checkpoint"), "%s", error_message());
    tu_rm_tree(empty);
    model_layout_free(&l);
}

static int count_checkpoints(const char *root, char *names, size_t cap)
{
    DIR *d = opendir(root);
    cr_assert_not_null(d);
    struct dirent *e;
    int n = 0;
    names[0] = '\0';
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "fsdp_", 5) == 0) {
            n++;
            strncat(names, e->d_name, cap - strlen(names) - 2);
            strcat(names, " ");
        }
    closedir(d);
    return n;
}

Test(ckpt, keep_last_prunes_oldest_after_commit)
{
    struct model_layout l;
    ct_layout(&l, 77);
    char names[512];
    for (int s = 1; s <= 4; s++) {
        ct_save_sharded(dir, &l, s * 10, 2, 2, (uint32_t)s, 2);
        cr_assert_eq(count_checkpoints(dir, names, sizeof names), s < 2 ? s : 2, "%s", names);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt30", dir);
    cr_assert(tu_exists(path), "%s", names);
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt40", dir);
    cr_assert(tu_exists(path), "%s", names);
    /* keep_last 0 keeps everything. */
    ct_save_full(dir, &l, 50, 5, 0);
    cr_assert_eq(count_checkpoints(dir, names, sizeof names), 3, "%s", names);
    model_layout_free(&l);
}

Test(ckpt, unfinished_save_is_invisible_and_failed_commit_cleans_up)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 1);
    /* Step 20: only rank 0 of 2 wrote (rank 1 crashed). */
    struct ct_pieces ps = {0};
    ct_rank_pieces(&ps, &l, 2, 0, 2, 2);
    cr_assert_eq(ckpt_sharded_write_rank(dir, 20, 0, &l, ps.v, ps.n), 0, "%s", error_message());
    ct_free(&ps);
    char out[4096], path[256];
    cr_assert_eq(ckpt_resolve(dir, "latest", out, sizeof out), 0);
    cr_assert(strstr(out, "fsdp_sharded_cpt10"), "%s", out);
    cr_assert_neq(ckpt_resolve(dir, "fsdp_sharded_cpt20", out, sizeof out), 0, "unfinished save visible");
    struct ckpt_reader *r;
    cr_assert_neq(ckpt_open(dir, "fsdp_sharded_cpt20", &l, &r), 0);
    struct ckpt_state s;
    ct_state(&s, &l, 20, 2, 2);
    cr_assert_eq(ckpt_sharded_commit(dir, 20, 2, &l, &s, 1), FSDP_ENOTFOUND);
    cr_assert(strstr(error_message(), "fsdp_sharded_cpt20_rank1") && strstr(error_message(), "rank 1"), "%s",
              error_message());
    snprintf(path, sizeof path, "%s/.tmp_fsdp_sharded_cpt20", dir);
    cr_assert(!tu_exists(path), "temporary directory left after a failed commit");
    /* keep_last 1 must not have removed the previous checkpoint for a save that failed. */
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    ct_check_read(r, &l, 2, 1);
    ckpt_close(r);
    model_layout_free(&l);
}

/* A committed checkpoint is never replaced: a second save of its step fails naming it, cleans up after
 * itself, and the first one reads back unchanged. */
Test(ckpt, same_step_saved_again_is_refused_and_the_first_kept)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    for (int r = 0; r < 3; r++) {
        struct ct_pieces ps = {0};
        ct_rank_pieces(&ps, &l, 1, r, 3, 2);
        cr_assert_eq(ckpt_sharded_write_rank(dir, 10, r, &l, ps.v, ps.n), 0, "%s", error_message());
        ct_free(&ps);
    }
    struct ckpt_state s;
    ct_state(&s, &l, 10, 3, 1);
    cr_assert_eq(ckpt_sharded_commit(dir, 10, 3, &l, &s, 0), FSDP_EEXIST);
    cr_assert(strstr(error_message(), "fsdp_sharded_cpt10") && strstr(error_message(), "never replaced"), "%s",
              error_message());
    char path[256];
    snprintf(path, sizeof path, "%s/.tmp_fsdp_sharded_cpt10", dir);
    cr_assert(!tu_exists(path), "the refused save left its temporary directory");
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_eq(ckpt_reader_state(r)->world_size, 2);
    ct_check_read(r, &l, 2, 1);
    ckpt_close(r);
    /* The same for a full checkpoint. */
    ct_save_full(dir, &l, 20, 3, 0);
    struct ckpt_full_writer *w;
    cr_assert_eq(ckpt_full_open(dir, 20, &l, &w), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (int k = 0; k < CKPT_KINDS; k++) {
            float *t = calloc(l.params[p].numel, sizeof *t);
            cr_assert_eq(ckpt_full_put(w, k, p, t), 0, "%s", error_message());
            free(t);
        }
    ct_state(&s, &l, 20, 1, 2);
    cr_assert_eq(ckpt_full_commit(w, &s, 0), FSDP_EEXIST, "%s", error_message());
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_str_eq(ckpt_reader_format(r), "full");
    ct_check_read(r, &l, 2, 3);
    ckpt_close(r);
    model_layout_free(&l);
}

static void put_latest(const char *root, const char *text, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/latest", root);
    unlink(path);
    if (!text)
        return;
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    fclose(f);
}

/* `latest` is the newest checkpoint in the directory whatever state the pointer is in: missing, garbage,
 * a 100 KB line, a deleted checkpoint's name, an older checkpoint's name, a directory. The note names the
 * pointer's problem and the checkpoint chosen; a directory without checkpoints has none. */
Test(ckpt, damaged_latest_pointer_resolves_to_the_newest_checkpoint)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 0);
    ct_save_sharded(dir, &l, 20, 2, 2, 2, 0);
    char *big = malloc(100 * 1024 + 1);
    memset(big, 'x', 100 * 1024);
    big[100 * 1024] = '\n';
    static const struct {
        const char *text, *why;
    } cases[] = {
        {NULL, "is missing"},
        {"\x01\xff garbage\n", "does not hold a checkpoint name"},
        {"", "does not hold a checkpoint name"},
        {"fsdp_sharded_cpt30\n", "fsdp_sharded_cpt30, which does not exist"},
        {"fsdp_sharded_cpt10\n", "an older checkpoint"},
        {"../fsdp_sharded_cpt20\n", "does not hold a checkpoint name"},
        {"big", "does not hold a checkpoint name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].text && strcmp(cases[i].text, "big") == 0)
            put_latest(dir, big, 100 * 1024 + 1);
        else
            put_latest(dir, cases[i].text, cases[i].text ? strlen(cases[i].text) : 0);
        struct ckpt_latest lt;
        cr_assert_eq(ckpt_find_latest(dir, &lt), 0, "%s", error_message());
        cr_assert(strstr(lt.path, "/fsdp_sharded_cpt20") && lt.step == 20, "case %zu: %s", i, lt.path);
        cr_assert_str_eq(lt.older, "fsdp_sharded_cpt10", "case %zu", i);
        cr_assert(strstr(lt.note, cases[i].why) && strstr(lt.note, "fsdp_sharded_cpt20 (step 20)"),
                  "case %zu: note '%s'", i, lt.note);
        char out[4096];
        cr_assert_eq(ckpt_resolve(dir, "latest", out, sizeof out), 0, "%s", error_message());
        cr_assert(strstr(out, "/fsdp_sharded_cpt20"), "case %zu: %s", i, out);
    }
    free(big);
    /* A directory named latest, and a FIFO (which must not hang the resolution). */
    char path[256];
    snprintf(path, sizeof path, "%s/latest", dir);
    unlink(path);
    cr_assert_eq(mkdir(path, 0755), 0);
    struct ckpt_latest lt;
    cr_assert_eq(ckpt_find_latest(dir, &lt), 0, "%s", error_message());
    cr_assert(strstr(lt.path, "fsdp_sharded_cpt20") && strstr(lt.note, "not a regular file"), "%s", lt.note);
    rmdir(path);
    cr_assert_eq(mkfifo(path, 0644), 0);
    cr_assert_eq(ckpt_find_latest(dir, &lt), 0, "%s", error_message());
    cr_assert(strstr(lt.path, "fsdp_sharded_cpt20") && strstr(lt.note, "not a regular file"), "%s", lt.note);
    unlink(path);
    /* An intact pointer: no note. */
    put_latest(dir, "fsdp_sharded_cpt20\n", strlen("fsdp_sharded_cpt20\n"));
    cr_assert_eq(ckpt_find_latest(dir, &lt), 0, "%s", error_message());
    cr_assert_str_eq(lt.note, "");
    /* Saves in progress are not checkpoints; a dangling pointer in a directory without any: none, and the
     * note says so. */
    char empty[64];
    tu_mkdtemp(empty, sizeof empty, "ckpt_test");
    struct ct_pieces ps = {0};
    ct_rank_pieces(&ps, &l, 2, 0, 2, 1);
    cr_assert_eq(ckpt_sharded_write_rank(empty, 40, 0, &l, ps.v, ps.n), 0, "%s", error_message());
    ct_free(&ps);
    put_latest(empty, "fsdp_cpt40\n", strlen("fsdp_cpt40\n"));
    cr_assert_eq(ckpt_find_latest(empty, &lt), 0, "%s", error_message());
    cr_assert_str_eq(lt.path, "");
    cr_assert_eq(lt.step, -1);
    cr_assert(strstr(lt.note, "which does not exist") && strstr(lt.note, "holds no checkpoint"), "%s", lt.note);
    tu_rm_tree(empty);
    /* A root that does not exist holds nothing (not an error). */
    cr_assert_eq(ckpt_find_latest("/nonexistent/fsdpc/ckpt", &lt), 0, "%s", error_message());
    cr_assert_str_eq(lt.path, "");
    model_layout_free(&l);
}

Test(ckpt, list_after_names_the_newer_checkpoints)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 5, 1, 2, 1, 0);
    ct_save_full(dir, &l, 15, 1, 0);
    ct_save_sharded(dir, &l, 10, 1, 2, 1, 0);
    char names[256];
    cr_assert_eq(ckpt_list_after(dir, 0, names, sizeof names), 3);
    cr_assert_str_eq(names, "fsdp_sharded_cpt5, fsdp_sharded_cpt10, fsdp_cpt15");
    cr_assert_eq(ckpt_list_after(dir, 10, names, sizeof names), 1);
    cr_assert_str_eq(names, "fsdp_cpt15");
    cr_assert_eq(ckpt_list_after(dir, 15, names, sizeof names), 0);
    cr_assert_str_eq(names, "");
    model_layout_free(&l);
}

/* The directory lock: a second holder is refused with the first one's description, which the kernel
 * releases when the holder dies (here by SIGKILL). */
Test(ckpt, lock_refuses_a_second_job_naming_the_holder)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd;
        char c = ckpt_lock(dir, "host h1, pid 4242, run id job7", 0, &fd) == 0 ? 'y' : 'n';
        if (write(pfd[1], &c, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char c = 0;
    cr_assert_eq(read(pfd[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the first lock failed");
    int fd = -1;
    cr_assert_eq(ckpt_lock(dir, "host h2, pid 1, run id job7", 0, &fd), FSDP_EEXIST);
    cr_assert(strstr(error_message(), "in use by another job") && strstr(error_message(), "host h1, pid 4242, run id job7"),
              "%s", error_message());
    cr_assert_eq(fd, -1);
    /* A waiting taker gets it once the holder is gone. */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(ckpt_lock(dir, "host h2, pid 1, run id job7", 5, &fd), 0, "%s", error_message());
    char path[256], text[128] = "";
    snprintf(path, sizeof path, "%s/.lock", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(text, sizeof text, f));
    fclose(f);
    cr_assert_str_eq(text, "host h2, pid 1, run id job7\n");
    ckpt_unlock(fd);
    close(pfd[0]);
    close(pfd[1]);
}

Test(ckpt, write_rank_rejects_overlap_and_out_of_range)
{
    struct model_layout l;
    ct_layout(&l, 77);
    struct ct_pieces ps = {0};
    ct_add(&ps, &l, CKPT_PARAM, 3, 0, 10, 1);
    ct_add(&ps, &l, CKPT_PARAM, 3, 5, 10, 1);
    cr_assert_eq(ckpt_sharded_write_rank(dir, 1, 0, &l, ps.v, ps.n), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "overlap"), "%s", error_message());
    ct_free(&ps);
    ct_add(&ps, &l, CKPT_PARAM, 3, l.params[3].numel - 2, 2, 1);
    ps.v[0].count = 3;
    cr_assert_eq(ckpt_sharded_write_rank(dir, 1, 0, &l, ps.v, ps.n), FSDP_EINVAL);
    ps.v[0].count = 2;
    ps.v[0].kind = 7;
    cr_assert_eq(ckpt_sharded_write_rank(dir, 1, 0, &l, ps.v, ps.n), FSDP_EINVAL);
    ct_free(&ps);
    model_layout_free(&l);
}

Test(ckpt, commit_refuses_gap_between_ranks)
{
    struct model_layout l;
    ct_layout(&l, 77);
    /* Both ranks write rank 0's part (as if a plan disagreed): the second half of each tensor is missing. */
    for (int r = 0; r < 2; r++) {
        struct ct_pieces ps = {0};
        ct_rank_pieces(&ps, &l, 2, r == 1 ? 0 : 0, 2, 1);
        cr_assert_eq(ckpt_sharded_write_rank(dir, 7, r, &l, ps.v, ps.n), 0, "%s", error_message());
        ct_free(&ps);
    }
    struct ckpt_state s;
    ct_state(&s, &l, 7, 2, 2);
    cr_assert_eq(ckpt_sharded_commit(dir, 7, 2, &l, &s, 0), FSDP_EINVAL);
    cr_assert(strstr(error_message(), "overlap") || strstr(error_message(), "cover"), "%s", error_message());
    char out[4096];
    cr_assert_eq(ckpt_resolve(dir, "latest", out, sizeof out), FSDP_ENOTFOUND);
    model_layout_free(&l);
}

/* A process killed in the middle of a save (after writing data, before the commit) leaves nothing a
 * reader sees, and the next save of the same step (here at a smaller world) succeeds over its leftovers. */
Test(ckpt, killed_mid_save_leaves_previous_latest_and_resave_works)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_sharded(dir, &l, 10, 2, 2, 1, 1);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* rank 0 and rank 1 of a world-3 save of step 20, and half of a full save of step 20, then death */
        for (int r = 0; r < 2; r++) {
            struct ct_pieces ps = {0};
            ct_rank_pieces(&ps, &l, 2, r, 3, 2);
            if (ckpt_sharded_write_rank(dir, 20, r, &l, ps.v, ps.n) != 0)
                _exit(1);
        }
        struct ckpt_full_writer *w;
        if (ckpt_full_open(dir, 20, &l, &w) != 0)
            _exit(1);
        float *t = calloc(l.params[0].numel, sizeof *t);
        if (ckpt_full_put(w, CKPT_PARAM, 0, t) != 0)
            _exit(1);
        raise(SIGKILL);
        _exit(1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child status %d", st);
    char out[4096], path[256];
    cr_assert_eq(ckpt_resolve(dir, "latest", out, sizeof out), 0, "%s", error_message());
    cr_assert(strstr(out, "fsdp_sharded_cpt10"), "%s", out);
    snprintf(path, sizeof path, "%s/.tmp_fsdp_sharded_cpt20", dir);
    cr_assert(tu_exists(path), "the crashed save should have left its temporary directory");
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    ct_check_read(r, &l, 3, 1);
    ckpt_close(r);
    /* Re-save step 20 at world 1 (sharded) and as full: both replace the leftovers. */
    ct_save_sharded(dir, &l, 20, 1, 2, 3, 0);
    snprintf(path, sizeof path, "%s/fsdp_sharded_cpt20/fsdp_sharded_cpt20_rank1", dir);
    cr_assert(!tu_exists(path), "a crashed attempt's rank file rode along into the checkpoint");
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    ct_check_read(r, &l, 2, 3);
    ckpt_close(r);
    ct_save_full(dir, &l, 20, 4, 0);
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_str_eq(ckpt_reader_format(r), "full");
    ct_check_read(r, &l, 2, 4);
    ckpt_close(r);
    model_layout_free(&l);
}

/* HYBRID_SHARD: a world of 4 with shard groups of 2 has 2 writers; the state keeps the job's world. */
Test(ckpt, writers_fewer_than_world_size)
{
    struct model_layout l;
    ct_layout(&l, 77);
    for (int r = 0; r < 2; r++) {
        struct ct_pieces ps = {0};
        ct_rank_pieces(&ps, &l, 2, r, 2, 5);
        cr_assert_eq(ckpt_sharded_write_rank(dir, 4, r, &l, ps.v, ps.n), 0, "%s", error_message());
        ct_free(&ps);
    }
    struct ckpt_state s;
    ct_state(&s, &l, 4, 4, 2);
    snprintf(s.strategy, sizeof s.strategy, "HYBRID_SHARD");
    cr_assert_eq(ckpt_sharded_commit(dir, 4, 2, &l, &s, 0), 0, "%s", error_message());
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    cr_assert_eq(ckpt_reader_state(r)->world_size, 4);
    cr_assert_str_eq(ckpt_reader_state(r)->strategy, "HYBRID_SHARD");
    ct_check_read(r, &l, 4, 5);
    ckpt_close(r);
    model_layout_free(&l);
}

/* A FULL_STATE_DICT directory is a Hugging Face model directory: config.json with the layout's shape,
 * model.safetensors under GPT2LMHeadModel's names; init_from takes the directory itself. The run's
 * tokenizer is copied in and gives config.json its special ids. */
Test(ckpt, full_checkpoint_is_a_hugging_face_directory)
{
    struct model_layout l;
    ct_layout(&l, 77);
    char tokdir[300], tok[400], tokcfg[400];
    snprintf(tokdir, sizeof tokdir, "%s/data", dir);
    mkdir(tokdir, 0755);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", tokdir);
    snprintf(tokcfg, sizeof tokcfg, "%s/tokenizer_config.json", tokdir);
    FILE *f = fopen(tok, "w");
    fputs("{\"added_tokens\":[{\"id\":70,\"content\":\"<|endoftext|>\",\"special\":true}],\"model\":{}}", f);
    fclose(f);
    f = fopen(tokcfg, "w");
    fputs("{\"model_max_length\": 16}", f);
    fclose(f);
    struct ckpt_full_writer *w;
    cr_assert_eq(ckpt_full_open(dir, 6, &l, &w), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (int k = 0; k < CKPT_KINDS; k++) {
            float *t = malloc(l.params[p].numel * sizeof *t);
            ct_fill(&l, k, p, 0, l.params[p].numel, t, 6);
            cr_assert_eq(ckpt_full_put(w, k, p, t), 0, "%s", error_message());
            free(t);
        }
    struct ckpt_state s;
    ct_state(&s, &l, 6, 1, 2);
    s.tokenizer = tok;
    cr_assert_eq(ckpt_full_commit(w, &s, 0), 0, "%s", error_message());

    char ck[300], path[500];
    snprintf(ck, sizeof ck, "%s/fsdp_cpt6", dir);
    cr_assert(model_hf_is_dir(ck));
    struct model_hf_config hc;
    cr_assert_eq(model_hf_config_read(ck, &hc), 0, "%s", error_message());
    cr_assert(hc.config.n_layer == 2 && hc.config.n_head == 3 && hc.config.n_embd == 36 &&
              hc.config.vocab_size == 77 && hc.config.block_size == 16);
    snprintf(path, sizeof path, "%s/config.json", ck);
    char text[4096] = "";
    f = fopen(path, "r");
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cr_assert(strstr(text, "\"eos_token_id\":\t70"), "%s", text);
    snprintf(path, sizeof path, "%s/tokenizer.json", ck);
    cr_assert(tu_exists(path));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", ck);
    cr_assert(tu_exists(path));
    struct safetensors_file *sf;
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    cr_assert_eq(safetensors_open(&sf, path), 0, "%s", error_message());
    cr_assert_not_null(safetensors_find(sf, "transformer.h.1.mlp.c_proj.weight"));
    cr_assert_null(safetensors_find(sf, "h.1.mlp.c_proj.weight"));
    safetensors_close(sf);
    float *got = malloc(l.numel * sizeof *got);
    cr_assert_eq(model_weights_load(&l, ck, got), 0, "%s", error_message());
    for (int p = 0; p < l.n_params; p++)
        for (size_t i = 0; i < l.params[p].numel; i++)
            cr_assert_eq(got[l.params[p].offset + i], ct_value(&l, CKPT_PARAM, p, i, 6), "%s[%zu]", l.params[p].name, i);
    free(got);
    /* and it still resumes as a checkpoint */
    struct ckpt_reader *r;
    cr_assert_eq(ckpt_open(dir, "latest", &l, &r), 0, "%s", error_message());
    ct_check_read(r, &l, 2, 6);
    ckpt_close(r);
    model_layout_free(&l);
}

/* resume_from as PyTorch scripts write it: each habit gets a message that says what to pass. */
Test(ckpt, resume_from_a_file_says_which_directory_to_pass)
{
    struct model_layout l;
    ct_layout(&l, 77);
    ct_save_full(dir, &l, 40, 1, 0);
    char p[400], want[400];
    struct {
        const char *which, *frag;
    } cases[] = {
        {"fsdp_cpt40.pth", "pass the directory: resume_from = "},
        {"fsdp_cpt4000.pth", "does not resume from PyTorch .pth files"},
        {"model.bin", "does not resume from PyTorch .bin files"},
        {"fsdp_cpt40/model.safetensors", "is a file inside the checkpoint"},
        {"elsewhere.safetensors", "set model.init_from = "},
        {"hfdir", "Hugging Face model directory"},
    };
    snprintf(p, sizeof p, "%s/hfdir", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/hfdir/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{}", f);
    fclose(f);
    snprintf(want, sizeof want, "%s/fsdp_cpt40", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* as a name under the checkpoint root, and as a path */
        for (int as_path = 0; as_path < 2; as_path++) {
            snprintf(p, sizeof p, "%s/%s", dir, cases[i].which);
            const char *which = as_path ? p : cases[i].which;
            struct ckpt_reader *r;
            cr_assert_eq(ckpt_open(dir, which, &l, &r), FSDP_EINVAL, "%s accepted", which);
            const char *m = error_message();
            cr_assert(strstr(m, "checkpoint.resume_from = ") && strstr(m, cases[i].frag), "%s: %s", which, m);
            if (i == 0 || i == 3)
                cr_assert(strstr(m, want), "%s: %s does not name %s", which, m, want);
            cr_assert_eq(ckpt_check_resume_target(as_path ? NULL : dir, which), FSDP_EINVAL, "%s", which);
        }
    }
    cr_assert_eq(ckpt_check_resume_target(dir, "latest"), 0);
    cr_assert_eq(ckpt_check_resume_target(dir, "fsdp_cpt40"), 0);
    cr_assert_eq(ckpt_check_resume_target(NULL, "/does/not/exist"), 0, "missing paths are ckpt_resolve's to report");
    model_layout_free(&l);
}
