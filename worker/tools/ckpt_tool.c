/* fsdp-ckpt: look into, convert and sample from checkpoints (docs/checkpoints.md). Everything goes through
 * the same reader the training resume uses, so what the tool accepts is exactly what resume accepts. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"
#include "worker/tools/ckpt_tool_args.h"

static void print_shape(const struct model_param *p)
{
    if (p->ndim == 2)
        printf("(%d, %d)", p->shape[0], p->shape[1]);
    else
        printf("(%d)", p->shape[0]);
}

struct inspect_opts {
    const char *target;
};

static int inspect_run(const void *opts)
{
    const struct inspect_opts *o = opts;
    struct ckpt_reader *r;
    if (ckpt_tool_open(o->target, &r) != 0) {
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

static const struct inspect_opts inspect_defaults = {0};
static const struct ckpt_arg inspect_args[] = {
    {"CKPT", offsetof(struct inspect_opts, target),
     "a checkpoint directory, a root holding latest, or ROOT:latest"},
};
static const struct ckpt_tool_cmd inspect_cmd = {
    .name = "inspect",
    .about = "prints step, world size, strategy, model and tensors; reads every file and verifies every checksum",
    .args = inspect_args,
    .n_args = 1,
    .defaults = &inspect_defaults,
    .opts_size = sizeof(struct inspect_opts),
    .run = inspect_run,
};

static const struct ckpt_tool_cmd *const commands[] = {&inspect_cmd, &ckpt_tool_export_cmd, &ckpt_tool_merge_cmd,
                                                       &ckpt_tool_eval_cmd, &ckpt_tool_sample_cmd};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: fsdp-ckpt COMMAND ...\n");
    ckpt_tool_args_commands(commands, N_COMMANDS, out);
    fprintf(out, "CKPT is a checkpoint directory, a checkpoint root (its `latest` is used) or ROOT:latest; MODEL is\n"
                 "a CKPT or a Hugging Face model directory (config.json + model.safetensors).\n"
                 "fsdp-ckpt COMMAND --help lists a command's flags, what each allows and its default.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const struct ckpt_tool_cmd *cmd = NULL;
    char names[256] = "";
    for (int i = 0; i < N_COMMANDS; i++) {
        const struct ckpt_tool_cmd *c = commands[i];
        if (strcmp(argv[1], c->name) == 0 || (c->alias && strcmp(argv[1], c->alias) == 0))
            cmd = c;
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", i == 0 ? "" : i == N_COMMANDS - 1 ? " and " : ", ", c->name);
    }
    if (!cmd) {
        fprintf(stderr, "fsdp-ckpt: unknown command '%s'; the commands are %s (fsdp-ckpt --help)\n", argv[1], names);
        return 2;
    }
    void *opts = malloc(cmd->opts_size);
    if (!opts) {
        fprintf(stderr, "fsdp-ckpt: out of memory\n");
        return 1;
    }
    int rc = ckpt_tool_args_parse(cmd, argc - 2, argv + 2, opts);
    if (rc < 0)
        fprintf(stderr, "fsdp-ckpt %s: %s\n", cmd->name, error_message());
    int status = rc < 0 ? 2 : rc == 1 ? 0 : cmd->run(opts);
    free(opts);
    return status;
}
