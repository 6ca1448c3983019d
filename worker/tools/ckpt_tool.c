/* fsdp-ckpt: look into, convert and sample from checkpoints (docs/checkpoints.md). Everything goes through
 * the same reader the training resume uses, so what the tool accepts is exactly what resume accepts. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fsdp-ckpt COMMAND ...\n"
            "  inspect CKPT                  step, world size, strategy, tensors; verifies every checksum\n"
            "  export MODEL OUT_DIR [--dtype f32|bf16|f16] [--max_shard_size SIZE] [--tokenizer FILE]\n"
            "                                a Hugging Face directory from_pretrained opens (config.json,\n"
            "                                model.safetensors or shards + index, tokenizer files);\n"
            "                                OUT.safetensors instead: one bare weights file\n"
            "  merge CKPT OUT_DIR|OUT.safetensors   export in f32\n"
            "  eval MODEL --data TOKENS.bin [--steps N] [--batch B] [--block_size T] [--json OUT.json]\n"
            "                                mean loss on a token file\n"
            "  sample MODEL [--prompt TEXT] [--temperature T] [--top_k K] [--length N] [--seed S]\n"
            "         [--tokenizer FILE]     decodes with the run's tokenizer (docs/data.md) when it has one\n"
            "CKPT is a checkpoint directory, a checkpoint root (its `latest` is used) or ROOT:latest; MODEL is\n"
            "a CKPT or a Hugging Face model directory (config.json + model.safetensors).\n");
}

static void print_shape(const struct model_param *p)
{
    if (p->ndim == 2)
        printf("(%d, %d)", p->shape[0], p->shape[1]);
    else
        printf("(%d)", p->shape[0]);
}

static int cmd_inspect(int argc, char **argv)
{
    if (argc != 1) {
        usage(stderr);
        return 2;
    }
    struct ckpt_reader *r;
    if (ckpt_tool_open(argv[0], &r) != 0) {
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
        return 1;
    }
    const struct ckpt_state *s = ckpt_reader_state(r);
    const struct model_layout *l = ckpt_reader_layout(r);
    printf("checkpoint: %s\n", ckpt_reader_path(r));
    printf("format: %s\n", ckpt_reader_format(r));
    printf("step: %" PRId64 "\n", s->step);
    printf("world_size: %d\nstrategy: %s\nfsdp_version: %d\n", s->world_size, s->strategy, s->fsdp_version);
    printf("loss_scale: %g\nscaler_good_steps: %" PRId64 "\n", s->loss_scale, s->scaler_good_steps);
    printf("model: %s n_layer=%d n_head=%d n_embd=%d vocab_size=%d block_size=%d (%zu parameters)\n",
           s->model.model_family, s->model.n_layer, s->model.n_head, s->model.n_embd, s->model.vocab_size,
           s->model.block_size, l->numel_real);
    printf("tensors: %d\n", l->n_params);
    for (int p = 0; p < l->n_params; p++) {
        printf("  %-32s ", l->params[p].name);
        print_shape(&l->params[p]);
        printf("\n");
    }
    uint64_t bytes = 0;
    int rc = ckpt_verify(r, &bytes);
    if (rc != 0)
        fprintf(stderr, "fsdp-ckpt: checksums: FAILED: %s\n", error_message());
    else
        printf("checksums: OK (%" PRIu64 " bytes verified)\n", bytes);
    ckpt_close(r);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "inspect") == 0)
        return cmd_inspect(argc - 2, argv + 2);
    if (strcmp(argv[1], "merge") == 0)
        return ckpt_tool_export(argc - 2, argv + 2, true);
    if (strcmp(argv[1], "export") == 0)
        return ckpt_tool_export(argc - 2, argv + 2, false);
    if (strcmp(argv[1], "eval") == 0 || strcmp(argv[1], "score") == 0)
        return ckpt_tool_eval(argc - 2, argv + 2);
    if (strcmp(argv[1], "sample") == 0)
        return ckpt_tool_sample(argc - 2, argv + 2);
    fprintf(stderr, "fsdp-ckpt: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
