/* Parity of the whole matrix (slow): every sharding strategy x FSDP version 1 and 2 x prefetch on/off
 * (BACKWARD_PRE + forward_prefetch, or NO_PREFETCH) at world 1, 2, 3 and 4 gives the per-step losses of
 * one rank, for the tiny GPT-2 and the tiny Llama, because each step's global batch and its mean loss do
 * not depend on how ranks split them. The bound, 1e-5 relative, leaves room only for float summation order (measured: about 1e-8). */
#include "ttest.h"

#define PARITY_REL 1e-5

static void parity_matrix(const char *strategy, bool llama)
{
    struct tt_ctx c;
    tt_setup_ini(&c, llama ? tt_llama_ini : tt_tiny_ini);
    double ref[TT_STEPS], worst = 0;
    tt_reference(&c, ref);
    for (int version = 1; version <= 2; version++)
        for (int pf = 1; pf >= 0; pf--)
            for (int world = 1; world <= 4; world++) {
                double d = tt_parity_point(&c, strategy, version, pf, world, ref, PARITY_REL);
                worst = d > worst ? d : worst;
            }
    fprintf(stderr, "parity %s %s: 16 runs, largest relative loss difference %.3g\n", llama ? "llama" : "gpt2",
            strategy, worst);
    tt_teardown(&c);
}

Test(parity, full_shard, .timeout = 600) { parity_matrix("FULL_SHARD", false); }
Test(parity, shard_grad_op, .timeout = 600) { parity_matrix("SHARD_GRAD_OP", false); }
Test(parity, no_shard, .timeout = 600) { parity_matrix("NO_SHARD", false); }
Test(parity, hybrid_shard, .timeout = 600) { parity_matrix("HYBRID_SHARD", false); }
Test(parity, hybrid_shard_zero2, .timeout = 600) { parity_matrix("HYBRID_SHARD_ZERO2", false); }

/* The same matrix for the tiny Llama (grouped-query attention, untied head). */
Test(parity, llama_full_shard, .timeout = 600) { parity_matrix("FULL_SHARD", true); }
Test(parity, llama_shard_grad_op, .timeout = 600) { parity_matrix("SHARD_GRAD_OP", true); }
Test(parity, llama_no_shard, .timeout = 600) { parity_matrix("NO_SHARD", true); }
Test(parity, llama_hybrid_shard, .timeout = 600) { parity_matrix("HYBRID_SHARD", true); }
Test(parity, llama_hybrid_shard_zero2, .timeout = 600) { parity_matrix("HYBRID_SHARD_ZERO2", true); }
