/* What a run leaves for its user: metrics.jsonl (one row per step: step, loss with 9 significant digits,
 * lr, grad_norm, tokens_per_s, and val_loss when evaluated), a TensorBoard event file that an independent
 * reader (tests/common/read_tfevents.py) parses with the same values, rank 0's progress line, the plan,
 * every rank's end-of-run "peak memory" line, and every rank's run summary with the same run's figures.
 * And on a learnable corpus the val loss falls. */
#include "ttest.h"

#include <dirent.h>
#include <stdint.h>

/* The text of the number after "key": in a metrics row. */
static void raw_number(const char *row, const char *key, char *out, size_t cap)
{
    size_t n = 0;
    const char *p = tu_json_raw(row, key, &n);
    cr_assert_not_null(p, "no %s in %s", key, row);
    cr_assert(n > 0 && n < cap && strspn(p, "0123456789.eE+-") == n, "bad number for %s in %s", key, row);
    memcpy(out, p, n);
    out[n] = 0;
}

static int significant_digits(const char *num)
{
    int n = 0;
    bool leading = true;
    for (const char *p = num; *p && *p != 'e' && *p != 'E'; p++) {
        if (*p < '0' || *p > '9')
            continue;
        if (leading && *p == '0')
            continue;
        leading = false;
        n++;
    }
    return n;
}

Test(outputs, metrics_events_progress_memory, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--train.eval_interval=10", "--train.eval_steps=2", "--log.interval=5", NULL};
    struct tt_result r;
    tt_run_ok(&c, 2, "out", extra, &r);

    /* metrics.jsonl */
    double step[TT_STEPS + 1], loss[TT_STEPS + 1], lr[TT_STEPS + 1], gn[TT_STEPS + 1], tps[TT_STEPS + 1],
        val[TT_STEPS + 1];
    cr_assert_eq(tt_metric(&r, "step", step, TT_STEPS + 1), TT_STEPS);
    tt_metric(&r, "loss", loss, TT_STEPS + 1);
    tt_metric(&r, "lr", lr, TT_STEPS + 1);
    tt_metric(&r, "grad_norm", gn, TT_STEPS + 1);
    tt_metric(&r, "tokens_per_s", tps, TT_STEPS + 1);
    tt_metric(&r, "val_loss", val, TT_STEPS + 1);
    for (int s = 0; s < TT_STEPS; s++) {
        cr_assert_eq(step[s], (double)s, "row %d has step %g", s, step[s]);
        cr_assert(loss[s] > 0 && loss[s] < 10, "row %d: loss %g", s, loss[s]);
        cr_assert(lr[s] > 0 && lr[s] <= 0.003 + 1e-12, "row %d: lr %g", s, lr[s]);
        cr_assert(gn[s] > 0 && isfinite(gn[s]), "row %d: grad_norm %g", s, gn[s]);
        cr_assert(tps[s] > 0 && isfinite(tps[s]), "row %d: tokens_per_s %g", s, tps[s]);
        bool evaluated = s == 9 || s == 19;
        cr_assert(evaluated ? isfinite(val[s]) && val[s] > 0 : isnan(val[s]),
                  "row %d: val_loss %g (evaluated every 10 steps)", s, val[s]);
    }
    cr_assert_float_eq(lr[2], 0.003, 1e-9, "warmup_steps 2 reaches lr at step 2: %g", lr[2]);
    char path[2400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r.logdir);
    char *text = tu_slurp(path);
    int rows = 0;
    for (char *row = strtok(text, "\n"); row; row = strtok(NULL, "\n"), rows++) {
        char num[64], again[64];
        raw_number(row, "loss", num, sizeof num);
        int d = significant_digits(num);
        cr_assert(d <= 9, "loss printed with %d significant digits: %s", d, num);
        /* a float32 (TensorBoard's type) in the fewest digits that read back to it */
        float f = (float)strtod(num, NULL);
        for (int digits = 1; digits <= 9; digits++) {
            snprintf(again, sizeof again, "%.*g", digits, (double)f);
            if ((float)strtod(again, NULL) == f)
                break;
        }
        cr_assert_str_eq(num, again, "loss %s is not the shortest text of its float32 (%s)", num, again);
    }
    free(text);
    cr_assert_eq(rows, TT_STEPS, "metrics.jsonl has %d rows", rows);

    /* The TensorBoard event file, read by an independent parser that checks every CRC. */
    DIR *d = opendir(r.logdir);
    cr_assert_not_null(d);
    char events[2560] = "";
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
            snprintf(events, sizeof events, "%s/%s", r.logdir, e->d_name);
    closedir(d);
    cr_assert(events[0], "no events.out.tfevents.* in %s", r.logdir);
    char reader[2048];
    snprintf(reader, sizeof reader, "%s/tests/common/read_tfevents.py", getenv("FSDP_SOURCE_ROOT"));
    const char *argv[] = {"/usr/bin/python3", reader, events, NULL};
    int code = lu_exit_code(lu_wait(lu_spawn(argv, c.dir, "tfevents", NULL), 120));
    char *out = lu_slurp_tag(c.dir, "tfevents", "out"), *err = lu_slurp_tag(c.dir, "tfevents", "err");
    cr_assert_eq(code, 0, "read_tfevents.py rejected %s: %s", events, err);
    cr_assert(strncmp(out, "version ", 8) == 0 && strstr(out, "brain.Event:2"), "no version record first:\n%s", out);
    int seen_loss = 0, seen_val = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        long long s;
        char tag[64];
        double v;
        if (sscanf(line, "scalar %lld %63s %lf", &s, tag, &v) != 3)
            continue;
        cr_assert(s >= 0 && s < TT_STEPS, "event step %lld", s);
        /* bit for bit: the event's float32 is the float32 of metrics.jsonl's number */
        const struct {
            const char *tag;
            const double *col;
        } cols[] = {{"train/loss", loss}, {"val/loss", val}, {"train/lr", lr}, {"train/grad_norm", gn},
                    {"train/tokens_per_s", tps}};
        for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++)
            if (strcmp(tag, cols[k].tag) == 0)
                cr_assert((float)v == (float)cols[k].col[s], "step %lld: event %s %.9g, metrics.jsonl %.9g", s, tag, v,
                          cols[k].col[s]);
        seen_loss += strcmp(tag, "train/loss") == 0;
        seen_val += strcmp(tag, "val/loss") == 0;
    }
    cr_assert_eq(seen_loss, TT_STEPS, "%d train/loss scalars in the event file", seen_loss);
    cr_assert_eq(seen_val, 2, "%d val/loss scalars in the event file", seen_val);
    free(out);
    free(err);

    /* rank 0's progress line, one per log.interval when not on a terminal */
    for (int s = 5; s <= TT_STEPS; s += 5) {
        char want[64];
        snprintf(want, sizeof want, "step %d/%d | loss ", s, TT_STEPS);
        char *line = tt_rank_line(r.out, -1, want);
        cr_assert_not_null(line, "no progress line for step %d:\n%s", s, r.out);
        const char *fields[] = {"| lr ", "| grad norm ", " tok/s", "| mfu ", "| mem ", "| eta ", NULL};
        for (int i = 0; fields[i]; i++)
            cr_assert(strstr(line, fields[i]), "progress line lacks \"%s\": %s", fields[i], line);
        free(line);
    }
    cr_assert_eq(tt_count_lines(r.out, "step ", "| loss "), 4, "progress lines:\n%s", r.out);

    /* The plan from rank 0, and every rank's peak memory at the end. */
    cr_assert_eq(tt_count_lines(r.err, "fsdp plan: FULL_SHARD, version 2, world 2", NULL), 1, "%s", r.err);
    cr_assert_eq(tt_count_lines(r.err, "per rank: params ", "largest unsharded unit"), 1, "%s", r.err);
    for (int rank = 0; rank < 2; rank++) {
        char *line = tt_rank_line(r.err, rank, "peak memory: ");
        cr_assert_not_null(line, "rank %d reported no peak memory:\n%s", rank, r.err);
        const char *cats[] = {"params ", "grads ", "optimizer ", "activations ", "; total ", "peak RSS ", NULL};
        for (int i = 0; cats[i]; i++)
            cr_assert(strstr(line, cats[i]), "rank %d's peak memory lacks \"%s\": %s", rank, cats[i], line);
        free(line);
    }
    cr_assert(strstr(r.err, "val loss "), "no val loss in the log:\n%s", r.err);

    /* Every rank's run summary: who wrote it, the plan, the batch, the final losses of metrics.jsonl, each
     * memory category, and counters that a FULL_SHARD run must have moved. */
    for (int rank = 0; rank < 2; rank++) {
        cJSON *s = tt_summary(&r, rank);
        cr_assert(tu_json_matches(s, "{\"version\":1,\"world_size\":2,\"device\":\"cpu\","
                                     "\"plan\":{\"strategy\":\"FULL_SHARD\",\"version\":2,\"world_size\":2,"
                                     "\"units\":[{\"name\":\"root\"},{\"name\":\"h.0\"},{\"name\":\"h.1\"}]},"
                                     "\"batch\":{\"micro_batches_per_step\":6},"
                                     "\"steps\":{\"first\":0,\"run\":20}}"),
                  "rank %d's run summary does not describe this run", rank);
        cr_assert_eq(tt_num(s, "rank"), rank);
        double fl = tt_num(s, "final_loss"), fv = tt_num(s, "final_val_loss");
        cr_assert(fabs(fl - loss[TT_STEPS - 1]) <= 1e-6 * loss[TT_STEPS - 1], "rank %d: final_loss %.9g, metrics %.9g",
                  rank, fl, loss[TT_STEPS - 1]);
        cr_assert(fabs(fv - val[TT_STEPS - 1]) <= 1e-6 * val[TT_STEPS - 1],
                  "rank %d: final_val_loss %.9g, metrics %.9g", rank, fv, val[TT_STEPS - 1]);
        const char *cats[] = {"params", "grads", "optimizer", "gathered_params", "unsharded_grads", "comm_buffers",
                              "activations", NULL};
        double sum = 0;
        for (int i = 0; cats[i]; i++) {
            char path[64];
            snprintf(path, sizeof path, "memory.peak_bytes.%s", cats[i]);
            double v = tt_num(s, path);
            cr_assert(v >= 0, "rank %d: %s = %g", rank, path, v);
            sum += v;
        }
        double total = tt_num(s, "memory.peak_total_bytes");
        cr_assert(total > 0 && total <= sum, "rank %d: peak total %.0f, the categories' peaks add to %.0f", rank,
                  total, sum);
        cr_assert(tt_num(s, "memory.peak_rss_bytes") > tt_num(s, "memory.rss_at_start_bytes"), "rank %d", rank);
        cr_assert(tt_num(s, "persistent.bytes") > 0 && tt_num(s, "collectives.all_gathers") > 0, "rank %d", rank);
        cJSON_Delete(s);
    }
    tt_result_free(&r);
    tt_teardown(&c);
}

/* Byte-level text of the project's docs is learnable: over 60 steps at world 2 the val loss, measured
 * every 10 steps, ends well below where it started and far below a uniform guess (ln 256 = 5.55). */
Test(outputs, val_loss_falls, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *extra[] = {"--train.max_steps=60", "--train.eval_interval=10", "--train.eval_steps=4", NULL};
    struct tt_result r;
    tt_run_ok(&c, 2, "learn", extra, &r);
    double val[61];
    int n = tt_metric(&r, "val_loss", val, 61);
    cr_assert_eq(n, 60);
    double first = val[9], last = val[59];
    fprintf(stderr, "val loss: step 10 %.4f, 20 %.4f, 30 %.4f, 60 %.4f\n", val[9], val[19], val[29], val[59]);
    cr_assert(isfinite(first) && isfinite(last), "val_loss missing at steps 10 and 60");
    cr_assert(last < first - 0.3, "val loss did not fall: %.4f at step 10, %.4f at step 60", first, last);
    cr_assert(last < log(256.0) - 1.5, "val loss %.4f is near a uniform guess", last);
    for (int s = 19; s < 60; s += 10)
        cr_assert(val[s] < first, "val loss at step %d (%.4f) is not below step 10's (%.4f)", s + 1, val[s], first);
    tt_result_free(&r);
    tt_teardown(&c);
}

/* Overwrites element 0 of tensor `name` in the safetensors file path (f32) with the bits of value. */
static void poke_tensor(const char *path, const char *name, float value)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    uint64_t hlen = 0;
    cr_assert_eq(fread(&hlen, 8, 1, f), 1);
    cr_assert(hlen > 0 && hlen < (1u << 24), "%s: header length %llu", path, (unsigned long long)hlen);
    char *h = calloc(1, hlen + 1);
    cr_assert_eq(fread(h, 1, hlen, f), hlen);
    cJSON *o = cJSON_Parse(h);
    cr_assert_not_null(o, "%s: header is not JSON", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, name);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    cr_assert(cJSON_IsArray(off), "%s has no tensor %s: %s", path, name, h);
    long at = (long)(8 + hlen + (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble);
    cr_assert_eq(fseek(f, at, SEEK_SET), 0);
    cr_assert_eq(fwrite(&value, 4, 1, f), 1);
    cr_assert_eq(fclose(f), 0);
    cJSON_Delete(o);
    free(h);
}

/* model.init_from weights holding NaN or an infinity: the run stops before its first step with a message
 * naming the tensor and saying the weights were not finite when loaded, not "the loss diverged; lower
 * optim.lr" (which sent users after the learning rate), on one rank and on two (each rank reads its own
 * shards, or rank 0 reads and broadcasts with cpu_ram_efficient_loading). */
Test(outputs, non_finite_init_weights_are_named, .timeout = 300)
{
    struct tt_ctx c;
    tt_setup(&c);
    const char *save[] = {"--train.max_steps=2", "--checkpoint.interval=2",
                          "--checkpoint.state_dict_type=FULL_STATE_DICT", NULL};
    struct tt_result saved;
    tt_run_ok(&c, 0, "save", save, &saved);
    tt_result_free(&saved);
    char hf[2200], cmd[8192], init_arg[2300];
    snprintf(hf, sizeof hf, "%s/hf", c.dir);
    snprintf(cmd, sizeof cmd,
             "mkdir '%s' && cp '%s/save/ckpt/fsdp_cpt2/config.json' '%s/save/ckpt/fsdp_cpt2/model.safetensors' '%s'/", hf,
             c.dir, c.dir, hf);
    cr_assert_eq(tu_sh(cmd), 0, "%s", cmd);
    char st[2300];
    snprintf(st, sizeof st, "%s/model.safetensors", hf);
    snprintf(init_arg, sizeof init_arg, "--model.init_from=%s", hf);
    const float bad[2] = {NAN, INFINITY};
    const char *says[2] = {"holds NaN at element 0", "holds an infinity at element 0"};
    for (int i = 0; i < 2; i++) {
        poke_tensor(st, "transformer.h.1.mlp.c_fc.weight", bad[i]);
        const char *extra[] = {init_arg, i ? "--checkpoint.cpu_ram_efficient_loading=true" : "--train.max_steps=3",
                               NULL};
        struct tt_result r;
        char tag[32];
        snprintf(tag, sizeof tag, "bad%d", i);
        tt_run(&c, i + 1, tag, extra, &r);
        cr_assert_eq(r.code, 2, "%s: exit %d:\n%s", tag, r.code, r.err);
        cr_assert(strstr(r.err, "tensor 'h.1.mlp.c_fc.weight'") && strstr(r.err, says[i]) &&
                      strstr(r.err, "not finite before training started") && !strstr(r.err, "the loss diverged"),
                  "%s:\n%s", tag, r.err);
        tt_result_free(&r);
    }
    tt_teardown(&c);
}
