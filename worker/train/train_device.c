/* The device choice of a run (train_device.h). Every way of ending up on the CPU when a GPU might have
 * been meant says so, and too many ranks for a node's GPUs is a config error on every rank: two ranks on
 * one GPU would otherwise fail deep inside ncclCommInitRank ("Duplicate GPU detected", NCCL 2.28). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "common/gpu_module.h"
#include "common/log.h"
#include "worker/train/train_device.h"

/* The CUDA table, once the node is known to have a GPU per local rank. */
static int open_cuda(const char *asked, const struct train_env *env, const struct kernels **out, char *why,
                     size_t cap)
{
    char reason[512];
    int n = gpu_module_device_count(reason, sizeof reason);
    if (n > 0 && env->local_world_size > n) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        char shown[256] = "";
        if (vis)
            snprintf(shown, sizeof shown, " (CUDA_VISIBLE_DEVICES=%.200s)", vis);
        return error_set(FSDP_EINVAL,
                         "train.device = %s: %d ranks on this node (LOCAL_WORLD_SIZE) but %d CUDA device%s "
                         "visible%s: each rank needs a GPU of its own (NCCL refuses two ranks on one GPU); start at "
                         "most %d ranks per node (fsdp-launch --nproc_per_node %d) or set train.device = cpu",
                         asked, env->local_world_size, n, n == 1 ? " is" : "s are", shown, n, n);
    }
    error_clear();
    *out = kernels_get("cuda");
    if (!*out)
        return error_set(FSDP_EUNSUPPORTED, "train.device = %s: %s%s%s", asked, error_message(),
                         n == 0 && reason[0] ? "; " : "", n == 0 ? reason : "");
    const char *emu = gpu_module_emulator();
    snprintf(why, cap, "train.device = %s: %d CUDA device%s visible%s%s", asked, n, n == 1 ? "" : "s",
             emu ? ", on " : "", emu ? emu : "");
    if (emu)
        log_warn("train.device = %s runs on %s, loaded from %s", asked, emu, gpu_module_path());
    return 0;
}

int train_device_open(const struct worker_config *wc, const struct train_env *env, const struct kernels **out,
                      char *why, size_t cap)
{
    *out = NULL;
    why[0] = '\0';
    if (wc->train.device == WORKER_DEVICE_CUDA)
        return open_cuda("cuda", env, out, why, cap);
    if (wc->train.device == WORKER_DEVICE_CPU) {
        snprintf(why, cap, "train.device = cpu");
        *out = kernels_get("cpu");
        return *out ? 0 : error_set(FSDP_EUNSUPPORTED, "train.device = cpu: %s", error_message());
    }
    /* auto. A host without an NVIDIA driver cannot have a usable GPU, so the GPU module is not even loaded
     * (common/gpu_module.h: it would cost the CPU run ~150 MiB of RSS). A driver without a usable device (one
     * too old for this build's CUDA, CUDA_VISIBLE_DEVICES empty, a build without CUDA) falls back with a
     * warning. A visible device means cuda: failing to use it, or too many ranks for the node's GPUs, is an
     * error, since training on the CPU instead would hide it. */
    char reason[512] = "no NVIDIA driver on this host";
    bool driver = gpu_module_driver_present();
    if (driver && gpu_module_device_count(reason, sizeof reason) > 0)
        return open_cuda("auto", env, out, why, cap);
    error_clear();
    snprintf(why, cap, "train.device = auto: training on the CPU: %s", reason);
    *out = kernels_get("cpu");
    if (!*out)
        return error_set(FSDP_EUNSUPPORTED, "train.device = auto: %s", error_message());
    if (env->local_rank == 0) {
        if (driver)
            log_warn("%s (set train.device = cpu to choose the CPU, or cuda to make this an error)", why);
        else
            log_info("%s", why);
    }
    return 0;
}
