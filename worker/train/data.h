/* Token data for training and evaluation: a memory-mapped token file (nanoGPT's headerless uint16, llm.c's
 * 1 KiB header with uint16 tokens, or its Llama 3 variant with uint32 tokens: worker/data/data_format.h,
 * told apart by the first bytes) and the rule that maps (step, row) of
 * the global batch to a token offset. The rule depends only on the step, the row and the options, never
 * on the world size or on earlier calls, so every rank reads exactly its rows of the same global batch and
 * a resumed run continues with the rows it would have seen. See docs/data.md. */
#ifndef FSDP_WORKER_DATA_H
#define FSDP_WORKER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "worker/data/data_format.h"

/* Same order as the worker config's order values, so a config index converts by a cast. */
enum data_order { DATA_ORDER_SHUFFLED = 0, DATA_ORDER_SEQUENTIAL };
/* Separate random streams for the training file and the evaluation file, so the same seed does not make
 * validation rows mirror training rows when both files are the same. */
enum data_stream { DATA_STREAM_TRAIN = 0, DATA_STREAM_VAL = 1 };

struct data_options {
    int64_t block_size;  /* tokens per row (the model's context length) */
    int64_t vocab_size;  /* every token must be < vocab_size */
    int64_t batch_rows;  /* rows per global batch (train_batch; eval batch size for validation) */
    enum data_order order;
    uint64_t seed;
    enum data_stream stream;
};

struct data_file;

/* Maps and checks a token file: every token is scanned once against vocab_size here (a sequential pass
 * over a mapped file runs at memory bandwidth and leaves the pages cached), so a bad file fails before
 * any training work rather than at some later step. All errors name the file. */
int data_open(const char *path, const struct data_options *opt, struct data_file **out);
void data_close(struct data_file *d);

const char *data_path(const struct data_file *d);
enum data_format data_format_of(const struct data_file *d);
/* Number of tokens N in the file. */
int64_t data_num_tokens(const struct data_file *d);

/* Token offset of row `row` (0-based, < batch_rows) of the global batch of `step` (0-based):
 *   sequential: ((step * batch_rows + row) * block_size) mod (N - block_size)
 *   shuffled:   uniform in [0, N - block_size) from a hash of (seed, stream, step, row). */
int64_t data_row_offset(const struct data_file *d, int64_t step, int64_t row);

/* Fills rows [row_begin, row_begin + row_count) of the global batch of `step`: inputs[r * block_size + t] =
 * tokens[off + t], targets[...] = tokens[off + t + 1]. Rows outside [0, batch_rows) are an error. For
 * evaluation, pass the eval batch index k (0, 1, ...) as the step: evaluation k reads the same rows at
 * every evaluation, so val losses of different steps compare the model, not the sample. */
int data_get_rows(const struct data_file *d, int64_t step, int64_t row_begin, int64_t row_count,
                  int32_t *inputs, int32_t *targets);

#endif
