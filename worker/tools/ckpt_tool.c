/* fsdp-ckpt: look into, convert and sample from checkpoints (docs/checkpoints.md). Everything goes through
 * the same reader the training resume uses, so what the tool accepts is exactly what resume accepts. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "kernels/kernels.h"
#include "worker/ckpt/ckpt.h"
#include "worker/tools/ckpt_tool.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fsdp-ckpt COMMAND ...\n"
            "  inspect CKPT                       step, world size, strategy, tensors; verifies every checksum\n"
            "  merge CKPT OUT.safetensors         sharded (or full) checkpoint -> model safetensors, HF GPT-2 names\n"
            "  export CKPT OUT.safetensors [--dtype f32|bf16|f16]   model only, in the chosen dtype\n"
            "  sample CKPT [--prompt TEXT] [--temperature T] [--top_k K] [--length N] [--seed S]\n"
            "         [--tokenizer FILE]           decodes with the run's tokenizer (docs/data.md) when it has one\n"
            "CKPT is a checkpoint directory, a checkpoint root (its `latest` is used) or ROOT:latest.\n");
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

struct export_ctx {
    struct ckpt_reader *r;
    enum safetensors_dtype dtype;
    float *tmp;
    size_t tmp_cap;
    int rc;
};

/* Streams one tensor range by range (the writer asks for 4 MiB at a time), so memory stays bounded
 * whatever the model size. */
static int export_fill(void *vctx, size_t index, uint64_t offset, void *buf, size_t bytes)
{
    struct export_ctx *c = vctx;
    size_t es = safetensors_dtype_size(c->dtype);
    size_t begin = (size_t)(offset / es), count = bytes / es;
    float *dst = c->dtype == SAFETENSORS_F32 ? buf : NULL;
    if (!dst) {
        if (count > c->tmp_cap) {
            free(c->tmp);
            if (!(c->tmp = malloc(count * sizeof *c->tmp)))
                return error_set(FSDP_ENOMEM, "out of memory");
            c->tmp_cap = count;
        }
        dst = c->tmp;
    }
    FSDP_TRY(ckpt_read(c->r, CKPT_PARAM, (int)index, begin, count, dst));
    uint16_t *h = buf;
    if (c->dtype == SAFETENSORS_BF16)
        for (size_t i = 0; i < count; i++)
            h[i] = kernels_f32_to_bf16(dst[i]);
    else if (c->dtype == SAFETENSORS_F16)
        for (size_t i = 0; i < count; i++)
            h[i] = kernels_f32_to_f16(dst[i]);
    return 0;
}

static int export_model(struct ckpt_reader *r, const char *out, enum safetensors_dtype dtype)
{
    const struct model_layout *l = ckpt_reader_layout(r);
    struct safetensors_entry *e = calloc((size_t)l->n_params, sizeof *e);
    if (!e)
        return error_set(FSDP_ENOMEM, "out of memory");
    for (int p = 0; p < l->n_params; p++) {
        const struct model_param *mp = &l->params[p];
        /* Real rows only (wte without vocabulary padding), as Hugging Face GPT-2 files hold. */
        e[p] = (struct safetensors_entry){.name = mp->name, .dtype = dtype, .ndim = mp->ndim,
                                          .shape = {mp->init_rows, mp->ndim == 2 ? mp->shape[1] : 0}};
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, ckpt_reader_state(r)->step);
    struct safetensors_meta meta[2] = {{.key = "format", .value = "pt"}, {.key = "fsdpc_step", .value = step}};
    struct export_ctx c = {.r = r, .dtype = dtype};
    int rc = safetensors_write(out, e, (size_t)l->n_params, meta, 2, export_fill, &c);
    free(c.tmp);
    free(e);
    return rc;
}

static int cmd_export(int argc, char **argv, bool merge)
{
    enum safetensors_dtype dtype = SAFETENSORS_F32;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 0; i < argc; i++) {
        if (!merge && strncmp(argv[i], "--dtype", 7) == 0) {
            const char *v = argv[i][7] == '=' ? argv[i] + 8 : (i + 1 < argc ? argv[++i] : "");
            if (strcmp(v, "f32") == 0 || strcmp(v, "fp32") == 0)
                dtype = SAFETENSORS_F32;
            else if (strcmp(v, "bf16") == 0)
                dtype = SAFETENSORS_BF16;
            else if (strcmp(v, "f16") == 0 || strcmp(v, "fp16") == 0)
                dtype = SAFETENSORS_F16;
            else {
                fprintf(stderr, "fsdp-ckpt: --dtype must be f32, bf16 or f16 (got \"%s\")\n", v);
                return 2;
            }
        } else if (npos < 2 && argv[i][0] != '-') {
            pos[npos++] = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    struct ckpt_reader *r;
    if (ckpt_tool_open(pos[0], &r) != 0) {
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
        return 1;
    }
    if (merge && strcmp(ckpt_reader_format(r), "sharded") != 0)
        fprintf(stderr, "fsdp-ckpt: note: %s is already a full checkpoint; writing its model anyway\n",
                ckpt_reader_path(r));
    int rc = export_model(r, pos[1], dtype);
    if (rc != 0)
        fprintf(stderr, "fsdp-ckpt: %s\n", error_message());
    else
        printf("wrote %s (%s, step %" PRId64 ", %d tensors, %s)\n", pos[1], ckpt_reader_format(r),
               ckpt_reader_state(r)->step, ckpt_reader_layout(r)->n_params, safetensors_dtype_name(dtype));
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
        return cmd_export(argc - 2, argv + 2, true);
    if (strcmp(argv[1], "export") == 0)
        return cmd_export(argc - 2, argv + 2, false);
    if (strcmp(argv[1], "sample") == 0)
        return ckpt_tool_sample(argc - 2, argv + 2);
    fprintf(stderr, "fsdp-ckpt: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
