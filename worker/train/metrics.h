/* Rank 0's training record: metrics.jsonl (one JSON object per logged step, for scripts and tests) and a
 * TensorBoard event file with the same numbers as scalars (train/loss, train/lr, train/grad_norm,
 * train/tokens_per_s, val/loss). Every line and record is written with one write(2) as it is logged, so a
 * crash loses nothing already logged. */
#ifndef FSDP_WORKER_METRICS_H
#define FSDP_WORKER_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct metrics_row {
    int64_t step;
    double loss, lr, grad_norm, tokens_per_s;
    int has_val; /* val_loss is written only when this step ran an evaluation */
    double val_loss;
};

struct metrics;

/* Creates `dir` if missing (one level), opens dir/metrics.jsonl (appending when first_step > 0, so a
 * resumed run extends the history; truncating otherwise) and a new event file in dir that starts with a
 * SessionLog START at first_step, so TensorBoard shows each step once after a resume. */
int metrics_open(const char *dir, int64_t first_step, struct metrics **out);
int metrics_log(struct metrics *m, const struct metrics_row *row);
/* Path of the event file (owned by m). */
const char *metrics_events_path(const struct metrics *m);
void metrics_close(struct metrics *m);

/* Formats one metrics.jsonl line (with its '\n') into buf; returns its length or a negative fsdp_error.
 * Values are rounded to float32, TensorBoard's scalar type, and written with %.9g: 9 significant digits are
 * enough for a float to read back exactly, so both files hold the same bits. Non-finite values (a diverged
 * loss) are written as null, since JSON has no NaN. */
int metrics_format_line(char *buf, size_t cap, const struct metrics_row *row);

#endif
