/* Shared by the emulated-GPU training tests (test_emu_train.c, test_emu_torch.c): runs on train.device = cuda
 * under the CUDA host emulator, checked to have run there, and the loss comparison. Header-only, as ttest.h. */
#ifndef FSDP_TESTS_GPU_EMU_EMU_TRAIN_H
#define FSDP_TESTS_GPU_EMU_EMU_TRAIN_H

#include "tests/train/ttest.h"

#define EMU_REL 1e-5
#define EMU_BF16_REL 2e-3

static const char *const cuda_dev = "--train.device=cuda";
/* mixed_precision = auto means bf16 on a GPU (and on a CPU with bf16 instructions): fp32 comparisons say fp32 */
static const char *const fp32 = "--fsdp.mixed_precision=fp32";

/* The run's losses with extra arguments (device, strategy, ...), asserting it succeeded and ran on the emulator. */
static inline void emu_losses(const struct tt_ctx *c, int world, const char *tag, const char *const *extra,
                              double *loss)
{
    struct tt_result r;
    tt_run_ok(c, world, tag, extra, &r);
    tt_losses(&r, loss);
    bool on_cuda = false;
    for (int i = 0; extra && extra[i]; i++)
        on_cuda |= strcmp(extra[i], cuda_dev) == 0;
    if (on_cuda)
        cr_assert(tt_summary_matches(&r, 0, "{\"device\":\"cuda\"}") &&
                      strstr(r.err, "runs on the CUDA host emulator") != NULL,
                  "run %s did not say it ran on the emulated CUDA device:\n%s", tag, r.err);
    tt_result_free(&r);
}

static inline void assert_close(const double *got, const double *want, double rel, const char *what)
{
    double d = tt_max_rel(got, want, TT_STEPS);
    fprintf(stderr, "%s: largest relative loss difference %.3g (bound %.3g)\n", what, d, rel);
    cr_assert(d <= rel, "%s: losses differ by %.3g relative (bound %.3g)", what, d, rel);
}

#endif
