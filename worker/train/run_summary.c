/* The run summary's record and its atomic write (run_summary.h). */
#include "worker/train/run_summary.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/error.h"
#include "common/fs.h"

/* The format's version: a reader checks it; a new field keeps it, a changed meaning bumps it. */
#define RUN_SUMMARY_VERSION 1

void run_summary_note_step(struct run_summary *s, int64_t step, double scale_before,
                           const struct fsdp_step_result *res)
{
    if (!res->skipped && !(res->loss_scale > scale_before))
        return;
    if (s->n_changes == s->cap_changes) {
        size_t cap = s->cap_changes ? 2 * s->cap_changes : 16;
        struct run_summary_scale_change *c = realloc(s->changes, cap * sizeof *c);
        if (!c) {
            s->out_of_memory = true;
            return;
        }
        s->changes = c;
        s->cap_changes = cap;
    }
    s->changes[s->n_changes++] = (struct run_summary_scale_change){step, scale_before, res->loss_scale, res->skipped};
}

void run_summary_free(struct run_summary *s)
{
    free(s->changes);
    *s = (struct run_summary){0};
}

/* cJSON's adders return NULL when out of memory; one flag collects that for the whole record. */
struct builder {
    bool bad;
};

static cJSON *obj(struct builder *b, cJSON *parent, const char *key)
{
    cJSON *o = cJSON_AddObjectToObject(parent, key);
    b->bad |= !o;
    return o;
}

static cJSON *arr(struct builder *b, cJSON *parent, const char *key)
{
    cJSON *a = cJSON_AddArrayToObject(parent, key);
    b->bad |= !a;
    return a;
}

/* A number, or null where it is not finite (JSON has no NaN) */
static void num(struct builder *b, cJSON *o, const char *key, double v)
{
    b->bad |= !(isfinite(v) ? cJSON_AddNumberToObject(o, key, v) : cJSON_AddNullToObject(o, key));
}

static void str(struct builder *b, cJSON *o, const char *key, const char *v)
{
    b->bad |= !(v ? cJSON_AddStringToObject(o, key, v) : cJSON_AddNullToObject(o, key));
}

static void flag(struct builder *b, cJSON *o, const char *key, bool v)
{
    b->bad |= !cJSON_AddBoolToObject(o, key, v);
}

static cJSON *item(struct builder *b, cJSON *array)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemToArray(array, o)) {
        cJSON_Delete(o);
        b->bad = true;
        return NULL;
    }
    return o;
}

static void add_model(struct builder *b, cJSON *root, const struct run_summary_facts *f)
{
    const struct worker_config *wc = f->wc;
    const struct model_layout *l = model_get_layout(f->model);
    cJSON *m = obj(b, root, "model");
    str(b, m, "family", l->config.model_family);
    num(b, m, "n_layer", wc->model.n_layer);
    num(b, m, "n_head", wc->model.n_head);
    num(b, m, "n_embd", wc->model.n_embd);
    num(b, m, "head_dim", l->config.head_dim); /* in effect: n_embd / n_head unless set */
    num(b, m, "vocab_size", wc->model.vocab_size);
    num(b, m, "block_size", wc->model.block_size);
    /* the family's own values in effect, defaults resolved */
    struct model_field fields[16];
    int nf = model_summary_fields(l, fields, 16);
    for (int i = 0; i < nf && i < 16; i++) {
        if (fields[i].str)
            str(b, m, fields[i].name, fields[i].str);
        else if (fields[i].is_bool)
            flag(b, m, fields[i].name, fields[i].num != 0);
        else
            num(b, m, fields[i].name, fields[i].num);
    }
    num(b, m, "parameters", (double)l->numel_real);
    flag(b, m, "activation_checkpointing", wc->model.activation_checkpointing);
    num(b, m, "activation_bytes", (double)model_get_arena_bytes(f->model));
    /* where the initial weights came from and how many of their bytes this rank read */
    str(b, m, "init_from", wc->model.init_from[0] ? wc->model.init_from : NULL);
    num(b, m, "init_bytes_read", (double)fsdp_init_bytes_read(f->fsdp));
    cJSON *t = obj(b, root, "batch");
    num(b, t, "train_batch", wc->train.train_batch);
    num(b, t, "micro_batch", wc->train.micro_batch);
    int cp = wc->fsdp.context_parallel_size > 0 ? wc->fsdp.context_parallel_size : 1;
    num(b, t, "rows_per_rank", wc->train.train_batch / (f->env->world_size / cp)); /* per context group */
    num(b, t, "micro_batches_per_step", f->micro_batches);
    num(b, t, "tokens_per_step", (double)wc->train.train_batch * wc->model.block_size);
}

static void add_plan(struct builder *b, cJSON *root, const struct fsdp *fs)
{
    struct fsdp_plan_info pi;
    fsdp_plan_info(fs, &pi);
    cJSON *p = obj(b, root, "plan");
    str(b, p, "strategy", pi.strategy);
    flag(b, p, "enabled", pi.enabled);
    num(b, p, "version", pi.version);
    num(b, p, "world_size", pi.world_size);
    num(b, p, "shard_groups", pi.shard_groups);
    num(b, p, "shard_group_size", pi.shard_group_size);
    num(b, p, "data_parallel_size", pi.data_parallel_size);
    num(b, p, "context_parallel_size", pi.context_parallel_size);
    str(b, p, "param_dtype", pi.param_dtype);
    str(b, p, "reduce_dtype", pi.reduce_dtype);
    str(b, p, "compute_dtype", pi.compute_dtype);
    str(b, p, "backward_prefetch", pi.backward_prefetch);
    flag(b, p, "forward_prefetch", pi.forward_prefetch);
    flag(b, p, "offload", pi.offload);
    cJSON *units = arr(b, p, "units");
    for (int u = 0; u < pi.n_units && units; u++) {
        struct fsdp_unit_info ui;
        fsdp_unit_info(fs, u, &ui);
        cJSON *o = item(b, units);
        if (!o)
            break;
        str(b, o, "name", ui.name);
        num(b, o, "parameters", (double)ui.numel);
        num(b, o, "shard_elements", (double)ui.shard);
        flag(b, o, "resharded", ui.resharded_after != NULL);
        str(b, o, "resharded_after", ui.resharded_after);
    }
}

static void add_memory(struct builder *b, cJSON *root, const struct run_summary_facts *f)
{
    const struct fsdp_mem_stats *m = fsdp_get_mem(f->fsdp);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cJSON *p = obj(b, root, "persistent");
    num(b, p, "bytes", (double)fsdp_persistent_bytes(f->fsdp));
    num(b, p, "rss_growth_bytes", (double)f->persistent_rss_growth);
    cJSON *mem = obj(b, root, "memory");
    cJSON *peak = obj(b, mem, "peak_bytes");
    for (int i = 0; i < FSDP_MEM_COUNT; i++) {
        /* the log's category names with '_' for ' ': "gathered params" is the key gathered_params */
        char key[64];
        snprintf(key, sizeof key, "%s", fsdp_mem_name((enum fsdp_mem)i));
        for (char *c = key; *c; c++)
            *c = *c == ' ' ? '_' : *c;
        num(b, peak, key, (double)m->peak[i]);
    }
    num(b, mem, "peak_total_bytes", (double)m->peak_total);
    num(b, mem, "pool_held_bytes", (double)m->pool_held);
    num(b, mem, "peak_rss_bytes", (double)ru.ru_maxrss * 1024.0);
    num(b, mem, "rss_at_start_bytes", (double)f->rss_at_start);
    const struct fsdp_timing *tm = fsdp_get_timing(f->fsdp);
    cJSON *c = obj(b, root, "collectives");
    num(b, c, "all_gathers", (double)tm->gathers);
    num(b, c, "prefetched", (double)tm->prefetched);
    num(b, c, "gather_wait_s", tm->gather_wait_s);
    num(b, c, "reduce_wait_s", tm->reduce_wait_s);
    num(b, c, "context_parallel_calls", (double)f->cp_calls);
    num(b, c, "context_parallel_s", f->cp_seconds);
}

static void add_loss_scale(struct builder *b, cJSON *root, const struct run_summary *s, const struct fsdp *fs)
{
    cJSON *ls = obj(b, root, "loss_scale");
    num(b, ls, "final", fsdp_loss_scale(fs));
    cJSON *skipped = arr(b, ls, "skipped"), *grown = arr(b, ls, "grown");
    for (size_t i = 0; i < s->n_changes && skipped && grown; i++) {
        cJSON *o = item(b, s->changes[i].skipped ? skipped : grown);
        if (!o)
            break;
        num(b, o, "step", (double)s->changes[i].step);
        num(b, o, "from", s->changes[i].from);
        num(b, o, "to", s->changes[i].to);
    }
}

/* A save or a load: its step, size and time; null under key when there was none. */
static void add_transfer(struct builder *b, cJSON *parent, const char *key, bool happened, const char *path,
                         int64_t step, double mb, double secs)
{
    if (!happened) {
        b->bad |= !cJSON_AddNullToObject(parent, key);
        return;
    }
    cJSON *s = obj(b, parent, key);
    if (path)
        str(b, s, "path", path);
    num(b, s, "step", (double)step);
    num(b, s, "mb", mb);
    num(b, s, "seconds", secs);
    num(b, s, "mb_per_s", secs > 0 ? mb / secs : NAN);
}

static void add_checkpoint(struct builder *b, cJSON *root, const struct train_ckpt_stats *st)
{
    cJSON *c = obj(b, root, "checkpoint");
    num(b, c, "saves", st->saves);
    add_transfer(b, c, "last_save", st->saves > 0, NULL, st->save_step, st->save_mb, st->save_s);
    if (st->full_peak_rss > 0) {
        cJSON *s = obj(b, c, "full_save");
        num(b, s, "peak_rss_bytes", st->full_peak_rss);
        num(b, s, "rss_before_bytes", st->full_rss_before);
        num(b, s, "largest_unit_bytes", st->full_largest_unit);
    } else {
        b->bad |= !cJSON_AddNullToObject(c, "full_save");
    }
    add_transfer(b, c, "resumed", st->resumed_from[0] != 0, st->resumed_from, st->resumed_step, st->load_mb,
                 st->load_s);
}

static cJSON *build(const struct run_summary *s, const struct run_summary_facts *f, struct builder *b)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    const struct train_env *env = f->env;
    num(b, root, "version", RUN_SUMMARY_VERSION);
    num(b, root, "rank", env->rank);
    num(b, root, "world_size", env->world_size);
    num(b, root, "local_rank", env->local_rank);
    num(b, root, "local_world_size", env->local_world_size);
    num(b, root, "restart_count", env->restart_count);
    str(b, root, "run_id", env->run_id);
    str(b, root, "device", f->device);
    str(b, root, "device_reason", f->device_reason ? f->device_reason : "");
    add_model(b, root, f);
    add_plan(b, root, f->fsdp);
    cJSON *st = obj(b, root, "steps");
    num(b, st, "first", (double)f->first_step);
    num(b, st, "max_steps", (double)f->wc->train.max_steps);
    num(b, st, "run", (double)(f->wc->train.max_steps - f->first_step));
    num(b, root, "final_loss", f->final_loss);
    num(b, root, "final_val_loss", f->final_val_loss);
    add_memory(b, root, f);
    add_loss_scale(b, root, s, f->fsdp);
    add_checkpoint(b, root, f->ckpt);
    cJSON *mfu = obj(b, root, "mfu_terms");
    num(b, mfu, "peak_flops", f->peak_flops > 0 ? f->peak_flops : NAN);
    num(b, mfu, "flops_per_token", f->flops_per_token);
    return root;
}

int run_summary_write(const struct run_summary *s, const struct run_summary_facts *f)
{
    if (s->out_of_memory)
        return error_set(FSDP_ENOMEM, "run summary: out of memory recording the loss-scale changes");
    int rc = fs_mkdir_p(f->logdir, "log.dir");
    if (rc)
        return rc;
    struct builder b = {0};
    cJSON *root = build(s, f, &b);
    char *text = root && !b.bad ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return error_set(FSDP_ENOMEM, "run summary: out of memory");
    char path[FSDP_PATH_MAX], tmp[FSDP_PATH_MAX];
    if (fs_path_format(path, sizeof path, "log.dir", "%s/run_summary.rank%d.json", f->logdir, f->env->rank) ||
        fs_path_format(tmp, sizeof tmp, "log.dir", "%s/.run_summary.rank%d.json.tmp", f->logdir, f->env->rank)) {
        free(text);
        return FSDP_ERANGE;
    }
    FILE *out = fopen(tmp, "w");
    if (!out) {
        free(text);
        return error_set(FSDP_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    bool bad = fputs(text, out) < 0 || fputc('\n', out) == EOF;
    free(text);
    bad |= fflush(out) != 0 || fsync(fileno(out)) != 0;
    bad |= fclose(out) != 0;
    if (bad || rename(tmp, path) != 0) {
        rc = error_set(FSDP_EIO, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    return rc;
}
