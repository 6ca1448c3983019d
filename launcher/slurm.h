/* SLURM allocation facts for the launcher: torchrun has no SLURM support, so users would otherwise copy
 * the same shell snippet (scontrol show hostnames | head -1) into every sbatch script. */
#ifndef FSDP_LAUNCHER_SLURM_H
#define FSDP_LAUNCHER_SLURM_H

#include <stddef.h>

/* Expands a SLURM hostlist ("gpu[01-03,07],login1", several bracket groups per name allowed, zero
 * padding kept) into a malloc'd array of malloc'd names. Returns 0 or FSDP_EINVAL with a message naming
 * the bad part. Free with slurm_free_hosts. */
int slurm_expand_nodelist(const char *list, char ***hosts, size_t *nhosts);
void slurm_free_hosts(char **hosts, size_t nhosts);

#endif
