/* Checkpoints from the training loop: when to save, who writes what, and resuming.
 *
 * Saving is a collective. SHARDED_STATE_DICT: the ranks of the first replica (every rank unless HYBRID or
 * NO_SHARD replicate the shards) each write their own pieces; all ranks agree that every write succeeded
 * before rank 0 commits, so a failed write on any rank (disk full) fails the save everywhere and leaves
 * the earlier checkpoints as they were. FULL_STATE_DICT: units are gathered one at a time and rank 0
 * streams each tensor into the files, so it never holds more than one unsharded unit.
 *
 * Resuming: every rank reads only the ranges of its own pieces, whatever world size, strategy or version
 * wrote the checkpoint (the reader reshards). `latest` is the newest checkpoint in the directory, whatever
 * state the `latest` pointer is in (worker/ckpt/ckpt_latest.c). After a restart by the launcher
 * (TORCHELASTIC_RESTART_COUNT > 0) a run resumes from its own newest checkpoint.
 *
 * Safety: a saving run holds checkpoint.dir's lock (rank 0, the whole run), and refuses to start when the
 * directory holds checkpoints newer than its starting step, which it would otherwise overwrite: a committed
 * checkpoint is never replaced. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/rss.h"
#include "worker/ckpt/ckpt.h"
#include "worker/train/train_ckpt.h"
#include "worker/train/train_sources.h"

/* A checkpoint kind is used as the engine's state kind: it indexes fsdp_piece.data[] and is cast to
 * enum fsdp_state_kind for fsdp_gather_unit_state. */
_Static_assert((int)CKPT_PARAM == (int)FSDP_STATE_PARAM && (int)CKPT_EXP_AVG == (int)FSDP_STATE_EXP_AVG &&
                   (int)CKPT_EXP_AVG_SQ == (int)FSDP_STATE_EXP_AVG_SQ && CKPT_KINDS == 3,
               "enum ckpt_kind and enum fsdp_state_kind list the same kinds in the same order");

static void fill_state(struct ckpt_state *st, const struct train_ckpt *c, struct fsdp *f,
                       const struct worker_config *wc, int64_t step, int writers)
{
    memset(st, 0, sizeof *st);
    st->step = step;
    st->loss_scale = fsdp_loss_scale(f);
    st->scaler_good_steps = fsdp_scaler_good_steps(f);
    st->world_size = writers;
    snprintf(st->strategy, sizeof st->strategy, "%s", fsdp_strategy_name(f));
    st->fsdp_version = wc->fsdp.version;
    st->config_text = c->config_text ? c->config_text : "";
    /* the model's own (family defaults resolved) config; where it started from is not its shape */
    st->model = fsdp_layout(f)->config;
    st->model.init_from[0] = '\0';
    st->model.activation_checkpointing = false;
    st->tokenizer = c->tokenizer[0] ? c->tokenizer : NULL;
}

/* Every rank's rc -> the same verdict everywhere (a sum over ranks of the failures). */
static int agree(struct fsdp *f, int rc, const char *what)
{
    double bad = 0;
    int rc2 = fsdp_sum_world(f, rc ? 1.0 : 0.0, &bad);
    if (rc)
        return rc;
    if (rc2)
        return rc2;
    if (bad > 0)
        return error_set(FSDP_EABORTED, "%s failed on %d other rank(s); their logs say why", what, (int)bad);
    return 0;
}

static int save_sharded(const struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc, struct train_env *env, const char *root,
                        int64_t step)
{
    const struct model_layout *l = fsdp_layout(f);
    const struct kernels *k = fsdp_state_kernels(f);
    size_t n = 0;
    const struct fsdp_piece *pieces = fsdp_pieces(f, &n);
    bool writer = fsdp_replica_index(f) == 0;
    int rc = 0;
    struct ckpt_piece *cp = NULL;
    float *host = NULL;
    if (writer) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += pieces[i].count;
        cp = calloc(3 * n + 1, sizeof *cp);
        /* Device memory is staged to the host; on the CPU backend the shards are host memory already and are
         * written from where they are. */
        bool staged = !k->host_visible;
        host = staged ? malloc((3 * total + 1) * sizeof(float)) : NULL;
        if (!cp || (staged && !host)) {
            rc = error_set(FSDP_ENOMEM, "checkpoint: no memory to stage %zu elements", 3 * total);
            goto written;
        }
        size_t at = 0, m = 0;
        for (int kind = 0; kind < 3; kind++)
            for (size_t i = 0; i < n; i++) {
                const float *data = pieces[i].data[kind];
                if (staged) {
                    FSDP_TRY_GOTO(k->mem_copy(host + at, data, pieces[i].count * sizeof(float), KERNELS_COPY_D2H),
                                  rc, written);
                    data = host + at;
                }
                cp[m++] = (struct ckpt_piece){.kind = kind, .param = pieces[i].param, .begin = pieces[i].begin,
                                              .count = pieces[i].count, .data = data};
                at += pieces[i].count;
            }
        FSDP_TRY_GOTO(ckpt_sharded_write_rank(root, step, fsdp_shard_rank(f), l, cp, m), rc, written);
    }
    /* every rank enters the agreement, a writer also after its own failure */
written:
    free(cp);
    free(host);
    rc = agree(f, rc, "writing this rank's checkpoint shard");
    if (rc == 0 && env->rank == 0) {
        struct ckpt_state st;
        fill_state(&st, c, f, wc, step, fsdp_shard_size(f));
        rc = ckpt_sharded_commit(root, step, fsdp_shard_size(f), l, &st, (int)wc->checkpoint.keep_last);
    }
    if (rc && env->rank == 0)
        ckpt_sharded_abort(root, step);
    return agree(f, rc, "committing the checkpoint");
}

static int save_full(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc, struct train_env *env, const char *root,
                     int64_t step)
{
    const struct model_layout *l = fsdp_layout(f);
    struct ckpt_full_writer *w = NULL;
    int rc = 0;
    if (env->rank == 0)
        rc = ckpt_full_open(root, step, l, &w);
    rc = agree(f, rc, "opening the full checkpoint");
    size_t most = 0, largest = 0;
    for (int u = 0; u < fsdp_n_units(f); u++) {
        int fp, np;
        size_t off, numel;
        fsdp_unit_params(f, u, &fp, &np, &off, &numel);
        size_t cap = fsdp_unit_gather_capacity(f, u);
        most = cap > most ? cap : most;
        largest = numel > largest ? numel : largest;
    }
    size_t rss_before = rss_peak_reset();
    float *unit = NULL;
    if (rc)
        goto out;
    if (!(unit = malloc((most ? most : 1) * sizeof(float)))) {
        rc = error_set(FSDP_ENOMEM, "checkpoint: no memory for one unit (%zu parameters)", most);
        goto out;
    }
    for (int u = 0; u < fsdp_n_units(f); u++)
        for (int kind = 0; kind < 3; kind++) {
            int fp, np;
            size_t off, numel;
            fsdp_unit_params(f, u, &fp, &np, &off, &numel);
            /* a collective of the shard group: every rank takes part, rank 0 writes */
            FSDP_TRY_GOTO(fsdp_gather_unit_state(f, u, (enum fsdp_state_kind)kind, unit), rc, out);
            for (int p = fp; p < fp + np && w; p++)
                FSDP_TRY_GOTO(ckpt_full_put(w, kind, p, unit + (l->params[p].offset - off)), rc, out);
        }
    /* rank 0 commits or aborts, and every rank enters the agreement, also after its own failure */
out:
    free(unit);
    if (env->rank == 0 && w) {
        if (rc) {
            ckpt_full_abort(w);
        } else {
            struct ckpt_state st;
            fill_state(&st, c, f, wc, step, env->world_size);
            rc = ckpt_full_commit(w, &st, (int)wc->checkpoint.keep_last);
        }
    }
    if (env->rank == 0 && rc == 0) {
        size_t hwm = rss_peak();
        log_info("full save: peak RSS %.1f MiB, %.1f MiB above the %.1f MiB resident before the save (largest unit "
                 "%.1f MiB)",
                 (double)hwm / 1048576.0, hwm > rss_before ? (double)(hwm - rss_before) / 1048576.0 : 0.0,
                 (double)rss_before / 1048576.0, (double)largest * 4 / 1048576.0);
        c->stats.full_peak_rss = (double)hwm;
        c->stats.full_rss_before = (double)rss_before;
        c->stats.full_largest_unit = (double)largest * 4;
    }
    return agree(f, rc, "writing the full checkpoint");
}

int train_ckpt_maybe_save(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc,
                          struct train_env *env, int64_t step, bool final)
{
    /* interval -1: the user asked for no checkpoints at all (benchmarks, throwaway experiments). */
    bool due = wc->checkpoint.interval < 0 ? false
               : final                     ? step != c->last_saved_step && step > 0
                                           : wc->checkpoint.interval > 0 && step % wc->checkpoint.interval == 0;
    if (!due)
        return 0;
    char root[FSDP_PATH_MAX];
    /* every rank expands the same pattern: all return here alike, before any collective */
    FSDP_TRY(train_expand_run_id(root, sizeof root, wc->checkpoint.dir, env->run_id, "checkpoint.dir"));
    int rc = env->rank == 0 ? fs_mkdir_p(root, "checkpoint.dir") : 0;
    FSDP_TRY(agree(f, rc, "creating checkpoint.dir"));
    bool sharded = wc->checkpoint.state_dict_type == WORKER_SHARDED_STATE_DICT;
    double t0 = clock_now_s();
    rc = sharded ? save_sharded(c, f, wc, env, root, step) : save_full(c, f, wc, env, root, step);
    if (rc)
        return error_set(rc, "checkpoint at step %lld in %s failed; earlier checkpoints are intact: %s",
                         (long long)step, root, error_message());
    c->last_saved_step = step;
    double secs = clock_now_s() - t0;
    double mb = 3.0 * (double)fsdp_layout(f)->numel_real * 4 / 1e6; /* params + two moments, fp32 */
    c->stats.saves++;
    c->stats.save_step = step;
    c->stats.save_mb = mb;
    c->stats.save_s = secs;
    if (env->rank == 0)
        log_info("checkpoint: step %lld saved (%s) under %s: %.1f MB in %.3f s, %.0f MB/s", (long long)step,
                 sharded ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT", root, mb, secs, mb / secs);
    return 0;
}

void train_ckpt_close(struct train_ckpt *c)
{
    free(c->config_text);
    c->config_text = NULL;
    if (c->locked)
        ckpt_unlock(c->lock_fd);
    c->locked = false;
}

/* rank 0: the checkpoint directory is this job's for the whole run (ckpt_lock). A restarted attempt waits a
 * little for its predecessor, whose rank 0 may still be exiting; a fresh job is refused at once. */
static int take_lock(struct train_ckpt *c, const struct train_env *env, const char *root)
{
    FSDP_TRY(fs_mkdir_p(root, "checkpoint.dir"));
    char host[256] = "?", owner[768];
    gethostname(host, sizeof host - 1);
    snprintf(owner, sizeof owner, "host %s, pid %d, run id %s", host, (int)getpid(), env->run_id);
    FSDP_TRY(ckpt_lock(root, owner, env->restart_count > 0 ? 30.0 : 0.0, &c->lock_fd));
    c->locked = true;
    return 0;
}

/* What this run loads: checkpoint.resume_from on the first attempt; after a restart by the launcher, this
 * run's own newest checkpoint when it has one (resume_from only says where the job started), else
 * resume_from, else `latest` (which may hold nothing yet). */
static const char *what_to_load(const struct worker_config *wc, const struct train_env *env, const char *root,
                                bool *implicit)
{
    const char *which = wc->checkpoint.resume_from;
    *implicit = false;
    if (env->restart_count == 0)
        return which;
    struct ckpt_latest l;
    bool own = ckpt_find_latest(root, &l) == 0 && l.path[0];
    if (own || !which[0]) {
        if (own && which[0] && strcmp(which, CKPT_LATEST) != 0 && env->rank == 0)
            log_info("restart: resuming from this run's newest checkpoint in %s, not checkpoint.resume_from = %s "
                     "(where the first attempt started)", root, which);
        *implicit = strcmp(which, CKPT_LATEST) != 0;
        return CKPT_LATEST;
    }
    return which;
}

/* Saving steps after `from` must not meet a committed checkpoint (those are never replaced): a directory
 * holding newer checkpoints belongs to a run this one would overwrite. */
static int check_no_newer(const char *root, int64_t from)
{
    char names[512];
    int n = ckpt_list_after(root, from, names, sizeof names);
    if (n == 0)
        return 0;
    return error_set(FSDP_EEXIST, "checkpoint.dir %s already holds %d checkpoint(s) after step %lld (%s) that this "
                     "run would overwrite: resume from them (checkpoint.resume_from = latest), or give this run "
                     "another [checkpoint] dir (or run id), or move them away",
                     root, n, (long long)from, names);
}

/* ckpt_read's kinds (CKPT_PARAM, the Adam moments) for fsdp_check_finite's message. */
static const char *const KIND_NAME[3] = {"", " (Adam exp_avg)", " (Adam exp_avg_sq)"};

/* Reads the checkpoint (`path`, else `which` under root) into the engine; *first_step = its step. */
static int load_from(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc, struct train_env *env,
                     const char *root, const char *which, const char *path, int64_t *first_step)
{
    double t0 = clock_now_s();
    struct ckpt_reader *r = NULL;
    float *tmp = NULL;
    int rc = 0;
    FSDP_TRY_GOTO(path[0] ? ckpt_open(path, NULL, fsdp_layout(f), &r) : ckpt_open(root, which, fsdp_layout(f), &r),
                  rc, out);
    size_t n = 0;
    const struct fsdp_piece *pieces = fsdp_pieces(f, &n);
    size_t most = 0;
    for (size_t i = 0; i < n; i++)
        most = pieces[i].count > most ? pieces[i].count : most;
    if (!(tmp = malloc((most ? most : 1) * sizeof(float)))) {
        rc = error_set(FSDP_ENOMEM, "resume: out of memory");
        goto out;
    }
    const struct kernels *k = fsdp_state_kernels(f);
    for (size_t i = 0; i < n; i++)
        for (int kind = 0; kind < 3; kind++) {
            FSDP_TRY_GOTO(ckpt_read(r, kind, pieces[i].param, pieces[i].begin, pieces[i].count, tmp), rc, out);
            /* a checkpoint saved after its run diverged: say so here, not as this run's divergence later */
            char src[FSDP_PATH_MAX + 64]; /* "checkpoint", its path and a kind's name */
            snprintf(src, sizeof src, "checkpoint %s%s", ckpt_reader_path(r), KIND_NAME[kind]);
            FSDP_TRY_GOTO(fsdp_check_finite(fsdp_layout(f), pieces[i].param, pieces[i].begin, tmp, pieces[i].count,
                                            src),
                          rc, out);
            FSDP_TRY_GOTO(k->mem_copy(pieces[i].data[kind], tmp, pieces[i].count * sizeof(float), KERNELS_COPY_H2D),
                          rc, out);
        }
    const struct ckpt_state *st = ckpt_reader_state(r);
    *first_step = st->step;
    c->last_saved_step = st->step;
    FSDP_TRY_GOTO(fsdp_state_loaded(f, st->step, st->loss_scale, st->scaler_good_steps), rc, out);
    double secs = clock_now_s() - t0;
    double mb = 3.0 * (double)fsdp_layout(f)->numel_real * 4 / 1e6;
    snprintf(c->stats.resumed_from, sizeof c->stats.resumed_from, "%s", ckpt_reader_path(r));
    c->stats.resumed_step = st->step;
    c->stats.load_mb = mb;
    c->stats.load_s = secs;
    if (env->rank == 0)
        log_info("resumed from %s (%s, step %lld, written by %d rank(s), %s, version %d): %.1f MB read by all "
                 "ranks in %.3f s, %.0f MB/s",
                 ckpt_reader_path(r), ckpt_reader_format(r), (long long)st->step, st->world_size, st->strategy,
                 st->fsdp_version, mb, secs, mb / secs);
    if (st->step > wc->train.max_steps)
        rc = error_set(FSDP_EINVAL, "the checkpoint is at step %lld, beyond train.max_steps = %lld",
                       (long long)st->step, (long long)wc->train.max_steps);
out:
    free(tmp);
    ckpt_close(r);
    return rc;
}

int train_ckpt_maybe_load(struct train_ckpt *c, struct fsdp *f, const struct worker_config *wc,
                          struct train_env *env, const char *config_text, int64_t *first_step)
{
    free(c->config_text);
    c->config_text = config_text ? strdup(config_text) : NULL;
    if (config_text && !c->config_text)
        return error_set(FSDP_ENOMEM, "resume: out of memory");
    c->last_saved_step = -1;
    *first_step = 0;
    /* The tokenizer travels with every checkpoint, so an export or a sample needs nothing else. */
    if (!train_tokenizer_find(wc->data.train_file, c->tokenizer, sizeof c->tokenizer))
        c->tokenizer[0] = '\0';
    bool saves = wc->checkpoint.interval >= 0;
    char root[FSDP_PATH_MAX];
    /* every rank expands the same pattern: all return here alike, before any collective */
    FSDP_TRY(train_expand_run_id(root, sizeof root, wc->checkpoint.dir, env->run_id, "checkpoint.dir"));
    FSDP_TRY(agree(f, saves && env->rank == 0 ? take_lock(c, env, root) : 0, "locking checkpoint.dir"));
    bool implicit;
    const char *which = what_to_load(wc, env, root, &implicit);
    char latest_path[FSDP_PATH_MAX] = "", older[256] = "";
    if (strcmp(which, CKPT_LATEST) == 0) {
        struct ckpt_latest l;
        int lrc = ckpt_find_latest(root, &l);
        if (lrc)
            return agree(f, lrc, "finding the latest checkpoint");
        const char *who = implicit ? "restart" : "checkpoint.resume_from = latest";
        if (!l.path[0]) {
            /* Only a directory without any checkpoint starts from zero (a first start and every later one can
             * share one job script). */
            if (env->rank == 0)
                log_warn("%s: no checkpoint under %s yet; starting from step 0%s%s", who, root, l.note[0] ? "; " : "",
                         l.note);
            which = "";
        } else {
            if (l.note[0] && env->rank == 0)
                log_warn("%s: %s; resuming from it", who, l.note);
            snprintf(latest_path, sizeof latest_path, "%s", l.path);
            snprintf(older, sizeof older, "%s", l.older);
        }
    }
    if (!which[0])
        return agree(f, saves ? check_no_newer(root, 0) : 0, "checking checkpoint.dir");
    int rc = load_from(c, f, wc, env, root, which, latest_path, first_step);
    if (rc && older[0])
        rc = error_set(rc, "resume from %s (%s): %s. To resume from the next older checkpoint, %s, move %s out of "
                       "%s", which, root, error_message(), older, latest_path, root);
    else if (rc)
        rc = error_set(rc, "resume from %s (%s): %s", which, root, error_message());
    else if (saves)
        rc = check_no_newer(root, *first_step);
    /* every rank enters the agreement, also after its own failure */
    return agree(f, rc, "resuming");
}
