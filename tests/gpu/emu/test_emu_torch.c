/* PyTorch's losses, matched on train.device = cuda under the CUDA host emulator: a world-2 FULL_SHARD and a
 * world-4 HYBRID_SHARD job against tests/train/torch_gpt_ref.py in fp32 from the same initial weights, within 1e-5
 * relative (the bound the CPU backend is held to against the same oracle, tests/train/test_train_bf16.c). Needs
 * the PyPI venv (a reported skip without it); its own binary, so the no-venv check reruns only this. */
#include "tests/gpu/emu/emu_train.h"
#include "tests/util/tu_venv.h"

/* PyTorch's fp32 losses (torch_gpt_ref.py from the same initial weights), matched by a world-2 FULL_SHARD and a
 * world-4 HYBRID_SHARD job on the emulated device. */
Test(emu_train, matches_pytorch_world2_full_and_world4_hybrid, .timeout = 600)
{
    char python[1024];
    if (!tu_venv_bin("python", python, sizeof python))
        cr_skip_test("no PyPI venv with torch at %s (.ci/run makes it; FSDP_TORCH_VENV names another)", python);
    struct tt_ctx c;
    tt_setup(&c);
    const char *src = getenv("FSDP_SOURCE_ROOT");
    cr_assert(src, "FSDP_SOURCE_ROOT not set: run through meson test");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && OMP_NUM_THREADS=1 '%s' '%s/tests/train/torch_gpt_ref.py' init --out init.safetensors "
             "--n_layer 2 --n_head 2 --n_embd 32 --vocab 256 --block_size 16 > init.json 2> init.err && "
             "OMP_NUM_THREADS=1 '%s' '%s/tests/train/torch_gpt_ref.py' train --init init.safetensors "
             "--data '%s/train.bin' --steps %d --batch 8 "
             "--lr 0.0006 --min_lr 0.00006 --warmup_steps 10 --weight_decay 0.1 --grad_clip 1.0 --n_head 2 "
             "--block_size 16 > torch.json 2> torch.err",
             c.dir, python, src, python, src, c.data, TT_STEPS);
    int rc = tu_sh(cmd);
    cr_assert_eq(rc, 0, "torch_gpt_ref.py failed (%d): see %s/torch.err", rc, c.dir);
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/torch.json", c.dir);
    char *text = tu_slurp(path);
    cJSON *o = cJSON_Parse(text);
    const cJSON *a = o ? cJSON_GetObjectItemCaseSensitive(o, "losses") : NULL;
    cr_assert(cJSON_IsArray(a) && cJSON_GetArraySize(a) == TT_STEPS, "torch.json: %s", text);
    double want[TT_STEPS], got[TT_STEPS];
    for (int i = 0; i < TT_STEPS; i++)
        want[i] = cJSON_GetArrayItem(a, i)->valuedouble;
    cJSON_Delete(o);
    free(text);
    char init[FSDP_PATH_MAX];
    snprintf(init, sizeof init, "--model.init_from=%s/init.safetensors", c.dir);
    const char *base[] = {cuda_dev, init, "--train.train_batch=8", "--train.micro_batch=1", "--optim.lr=0.0006",
                          "--optim.min_lr=0.00006", "--optim.warmup_steps=10", "--data.order=sequential",
                          fp32, NULL, NULL, NULL};
    base[9] = "--fsdp.sharding_strategy=FULL_SHARD";
    emu_losses(&c, 2, "full-w2", base, got);
    assert_close(got, want, EMU_REL, "world 2 FULL_SHARD on emulated cuda vs PyTorch fp32");
    base[9] = "--fsdp.sharding_strategy=HYBRID_SHARD";
    base[10] = "--fsdp.hybrid_shard_size=2";
    emu_losses(&c, 4, "hybrid-w4", base, got);
    assert_close(got, want, EMU_REL, "world 4 HYBRID_SHARD on emulated cuda vs PyTorch fp32");
    tt_teardown(&c);
}
