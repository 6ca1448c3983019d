/* What this node has, as the launcher can see it without linking CUDA: usable cores and visible GPUs. */
#ifndef FSDP_LAUNCHER_DEVICES_H
#define FSDP_LAUNCHER_DEVICES_H

/* Cores in this process's affinity mask (at least 1). */
int devices_count_cpus(void);
/* GPUs: the entries of CUDA_VISIBLE_DEVICES when set, else /dev/nvidiaN nodes. */
int devices_count_gpus(void);
/* The index-th entry of CUDA_VISIBLE_DEVICES (or "index" when it is unset) into out; -1 past the end. */
int devices_gpu_id(int index, char *out, unsigned cap);

#endif
