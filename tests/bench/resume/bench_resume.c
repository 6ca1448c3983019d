/* Checkpoint throughput of the real training job and rank 0's memory during a full save. For world 2 and
 * 4 and both formats, a 51M-parameter GPT-2 (n_layer 8, n_embd 512, vocab 50304) takes one step and saves
 * (rank 0's run summary has the MB/s and, for a full save, its peak RSS above its resident size), then a
 * second job resumes from it (the run summary has the load MB/s). Beside them, this disk's sequential write speed with
 * fsync measured in the same run with dd (bs=1M count=256 conv=fsync).
 * Lines: bench=ckpt_disk ..., bench=ckpt_save world=W format=F mb_per_s=... disk_mb_per_s=... ratio=...,
 * bench=ckpt_load ..., bench=ckpt_full_save_rss world=W extra_mib=... largest_unit_mib=... goal_mib=... */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fs.h"
#include "tests/util/tu_proc.h"
#include "tests/util/tu_summary.h"

/* The disk's sequential write speed as the issue defines it: `dd if=/dev/zero of=F bs=1M count=256
 * conv=fsync`, timed around the whole process. */
static double disk_mb_per_s(const char *dir)
{
    char of[FSDP_PATH_MAX];
    snprintf(of, sizeof of, "of=%s/dd.bin", dir);
    double t0 = tu_now();
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execlp("dd", "dd", "if=/dev/zero", of, "bs=1M", "count=256", "conv=fsync", (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    double dt = tu_now() - t0;
    unlink(of + 3);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    return 256.0 * (1 << 20) / 1e6 / dt;
}

/* Runs the job; its stderr (all ranks, --tee) lands in out. */
static int run_job(const char *root, const char *dir, int world, const char *const *extra, char *out, size_t cap)
{
    char ini[FSDP_PATH_MAX], data[FSDP_PATH_MAX], log[FSDP_PATH_MAX], nproc[16];
    snprintf(ini, sizeof ini, "%s/big.ini", dir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/job.log", dir);
    snprintf(nproc, sizeof nproc, "%d", world);
    FILE *f = fopen(ini, "w");
    if (!f)
        return -1;
    fprintf(f, "[model]\nn_layer = 8\nn_head = 8\nn_embd = 512\nvocab_size = 50304\nblock_size = 64\n"
               "[train]\ndevice = cpu\ntrain_batch = 4\nmicro_batch = 1\nmax_steps = 1\neval_interval = 0\n"
               "[data]\ntrain_file = %s/train.bin\n[log]\ndir = %s/logs\n",
            data, dir);
    fclose(f);
    char launch[FSDP_PATH_MAX], worker[FSDP_PATH_MAX];
    snprintf(launch, sizeof launch, "%s/launcher/fsdp-launch", root);
    snprintf(worker, sizeof worker, "%s/worker/fsdp-worker", root);
    const char *argv[24] = {launch, "--standalone", "--nproc_per_node", nproc, "--tee", "3", worker, ini};
    int n = 8;
    for (int i = 0; extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    static const char *const env[] = {"OMP_NUM_THREADS=1", NULL};
    int code = tu_run(argv, log, log, env);
    f = fopen(log, "r");
    size_t got = f ? fread(out, 1, cap - 1, f) : 0;
    out[got] = 0;
    if (f)
        fclose(f);
    return code;
}

/* The number at path in rank 0's run summary of the job just run (log.dir is dir/logs), -1 if absent. */
static double summary_num(const char *dir, const char *path)
{
    char logdir[FSDP_PATH_MAX];
    snprintf(logdir, sizeof logdir, "%s/logs", dir);
    cJSON *s = tu_summary_load(logdir, 0);
    double v = tu_json_num(s, path);
    cJSON_Delete(s);
    return isnan(v) ? -1 : v;
}

int main(void)
{
    const char *root = getenv("FSDP_BUILD_ROOT"), *src = getenv("FSDP_SOURCE_ROOT");
    if (!root || !src) {
        fprintf(stderr, "run through meson test --benchmark (FSDP_BUILD_ROOT, FSDP_SOURCE_ROOT)\n");
        return 1;
    }
    char dir[] = "/tmp/fsdp-bench-resume-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "'%s/worker/fsdp-prepare-data' -o '%s/data' '%s/tests/data/corpus' >/dev/null 2>&1", root, dir, src);
    if (system(cmd) != 0)
        return 1;
    double disk = disk_mb_per_s(dir);
    printf("bench=ckpt_disk mb_per_s=%.0f method=dd_bs1M_count256_conv_fsync\n", disk);
    size_t cap = 1 << 20;
    char *out = malloc(cap);
    int status = 0;
    const char *fmts[] = {"SHARDED_STATE_DICT", "FULL_STATE_DICT"};
    for (int w = 2; w <= 4; w += 2)
        for (int fi = 0; fi < 2; fi++) {
            char ck[FSDP_PATH_MAX + 32], type[64], res[4400]; /* + 32: "--key=" and a path */
            snprintf(ck, sizeof ck, "--checkpoint.dir=%s/ck", dir);
            snprintf(type, sizeof type, "--checkpoint.state_dict_type=%s", fmts[fi]);
            const char *save[] = {ck, type, NULL};
            if (run_job(root, dir, w, save, out, cap) != 0) {
                fprintf(stderr, "save job failed:\n%s\n", out);
                status = 1;
                continue;
            }
            double mbs = summary_num(dir, "checkpoint.last_save.mb_per_s");
            const char *fmt = fi ? "full" : "sharded";
            printf("bench=ckpt_save world=%d format=%s mb_per_s=%.0f disk_mb_per_s=%.0f ratio=%.2f\n", w, fmt, mbs,
                   disk, mbs / disk);
            if (fi) {
                double peak = summary_num(dir, "checkpoint.full_save.peak_rss_bytes");
                double before = summary_num(dir, "checkpoint.full_save.rss_before_bytes");
                double extra = peak < 0 || before < 0 ? -1 : fmax(peak - before, 0) / 1048576.0;
                double lu = summary_num(dir, "checkpoint.full_save.largest_unit_bytes");
                double unit = lu < 0 ? -1 : lu / 1048576.0;
                printf("bench=ckpt_full_save_rss world=%d extra_mib=%.1f largest_unit_mib=%.1f goal_mib=%.1f met=%d\n",
                       w, extra, unit, unit + 64, extra >= 0 && extra <= unit + 64);
            }
            snprintf(res, sizeof res, "--checkpoint.resume_from=latest");
            const char *load[] = {ck, type, res, NULL};
            if (run_job(root, dir, w, load, out, cap) != 0) {
                fprintf(stderr, "resume job failed:\n%s\n", out);
                status = 1;
            } else {
                printf("bench=ckpt_load world=%d format=%s mb_per_s=%.0f\n", w, fmt, summary_num(dir, "checkpoint.resumed.mb_per_s"));
            }
            snprintf(cmd, sizeof cmd, "rm -rf '%s/ck' '%s/logs'", dir, dir);
            if (system(cmd) != 0)
                status = 1;
        }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        status = 1;
    free(out);
    return status;
}
