/* The runner bench_model and bench_llama share: a model to time is a row of a table (its family and
 * shape), and one training step of it (what a world-1 rank does: zero the gradients, model_set_batch,
 * model_forward_backward, the global gradient norm for clipping at 1.0, AdamW over every parameter through
 * the kernels table; in bf16 the engine's gather and refresh of a bf16 copy) is timed in a child process;
 * the drivers start the children and the PyTorch peers with these helpers and read their `key=value`
 * lines. What each benchmark adds (bench_model's GEMM peaks and three precisions, bench_llama's family
 * rows) stays in its own file. */
#ifndef FSDP_TESTS_BENCH_MODEL_BENCH_RUNNER_H
#define FSDP_TESTS_BENCH_MODEL_BENCH_RUNNER_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "worker/model/model.h"

/* One model to time: a registry family and its shape. 0 = the family's default (n_kv_head = n_head,
 * head_dim = n_embd / n_head, inter derived). warmup and steps: timed steps of ours and of the peer. */
struct bench_row {
    const char *name;   /* what the command line names: "S", "qwen3-S", ... */
    const char *family; /* model_family: "gpt2", "llama", "qwen2", "qwen3", "mistral" */
    int n_layer, n_embd, n_head, n_kv_head, head_dim, inter, vocab, t, b;
    /* Llama 3.1's rotary scaling with its factors (8, 1, 4) and an original context of 64 tokens, below the
     * rows' sequences, so that transformers takes it as it is (it warns at 8192 > max_position_embeddings)
     * and every band of frequencies occurs */
    bool rope_llama3;
    int window;       /* sliding window (mistral): each token sees the last `window`; 0 = full causal */
    bool tie;         /* tied LM head (gpt2 always is) */
    int warmup, steps;
};

const struct bench_row *bench_row_find(const struct bench_row *rows, int n, const char *name);
void bench_row_model(const struct bench_row *row, struct model_config *mc);

/* CPU seconds of this process: on a shared machine the time a step computed, whatever else ran. */
double bench_cpu_now(void);
/* The clock of work on k: on a host-visible table bench_cpu_now(); on a device, wall-clock (monotonic)
 * seconds read after waiting for the work queued on it (k->synchronize), so that the difference of two
 * readings around a call is the call's device time. */
double bench_op_now(const struct kernels *k);

/* ---- in the child ---- */
/* k wrapped so that every op it runs is timed (bench_op_now: CPU time on the CPU, device time on a device)
 * and counted; bench_profile_print prints one `profile op=NAME ms_per_step= share= gflops= frac_of_peak=`
 * line per op that ran and `profile op=total ...` (on a device each line ends in `timing=device_sync`, and
 * the total's step_gflops is per wall second of the step). */
const struct kernels *bench_profile_table(const struct kernels *k);
void bench_profile_print(int timed_steps, double step_ms, double step_cpu_ms, double step_flops, double peak);

struct bench_step_result {
    double tokens_per_s, best_tokens_per_s, cpu_tokens_per_s; /* median, best, median per CPU-second */
    double step_ms, step_cpu_ms;                              /* the medians */
    double model_flops_per_token;                             /* model_flops_per_token (the training loop's) */
    size_t params;                                            /* real parameters */
    double matmul_params, lookup_params;                      /* parameters in matmuls, lookup-only */
    int timed;
};
/* Builds row's model on k and runs warmup + steps training steps on random tokens (fp32, or bf16 as a
 * world-1 rank runs mixed_precision = bf16); exits the process with a message on any failure. On a table
 * that is not host-visible (CUDA) the parameters, gradients and optimizer state live in its memory (made on
 * the host, copied there), and a step's time ends when the device's work does. */
void bench_step_run(const struct bench_row *row, const struct kernels *k, bool bf16, bool profile,
                    struct bench_step_result *out);

/* The table of a child's --device NAME (kernels_get); exits the process with a message when there is none. */
const struct kernels *bench_device_table(const char *device);

/* ---- in the driver ---- */
/* Runs cmd through the shell and returns the value of `key=` in its output (the last occurrence), or NAN
 * when it failed; the output is echoed to stderr for the log, the line holding key kept in line_out and the
 * `profile ` lines in prof (each when given). */
double bench_run_and_grab(const char *cmd, const char *key, char *line_out, size_t line_cap, char *prof,
                          size_t prof_cap);
/* The value of `key=` in a line of such output, or NAN. */
double bench_grab(const char *line, const char *key);
/* One run of a PyTorch peer: base_cmd (a command taking --steps N) run for warmup + steps steps; its
 * tokens/s (the `tokens_per_s=` it prints: wall time, median step) and its tokens per CPU-second (the CPU
 * time of the run minus that of a run of the warm-up steps alone, over the timed steps' tokens). NAN each
 * when it failed. */
void bench_torch_point(const char *base_cmd, int warmup, int steps, double tokens_per_step, double *wall_tps,
                       double *cpu_tps);
/* This binary's path (for re-executing itself as a child); false with a message when unknown. */
bool bench_self(char *out, size_t cap);

/* The drivers' command line: [--rounds N] [--threads 1,2] [ROW ...], ROW a name of rows[0..n). Sets *rounds,
 * threads[0..*nthreads) (at most 4; left as given when there is no --threads) and sel[0..*nsel) (at most
 * sel_cap); 0, or 2 after a message naming prog (the exit status of a bad command line; an unknown
 * argument is for the caller's usage line, so *bad_arg is set to it). */
int bench_driver_args(int argc, char **argv, const char *prog, const struct bench_row *rows, int n, int *rounds,
                      int threads[4], int *nthreads, const struct bench_row **sel, int sel_cap, int *nsel,
                      const char **bad_arg);

#endif
