/* The registry of comm backends: a backend's name -> the function that returns its table. The only place
 * where a backend's name chooses anything; what a backend can do is in its table. */
#include "comm/comm_internal.h"
#include "common/error.h"
#include "common/gpu_module.h"

#include <stdio.h>
#include <string.h>

/* The NCCL backend lives in the GPU module, loaded now (see common/gpu_module.h). */
static const struct comm_backend *nccl_from_gpu_module(void)
{
    const struct comm_backend *(*get)(void) =
        (const struct comm_backend *(*)(void))gpu_module_symbol("fsdp_gpu_comm_backend");
    if (!get) {
        error_set(FSDP_EUNSUPPORTED, "no NCCL backend: %s; use backend \"cpu\"", error_message());
        return NULL;
    }
    return get();
}

static const struct {
    const char *name;
    const struct comm_backend *(*table)(void); /* NULL with error_set when not available here */
} backends[] = {
    {"cpu", comm_backend_cpu},
    {"nccl", nccl_from_gpu_module},
};

enum { NBACKENDS = sizeof(backends) / sizeof(backends[0]) };

int comm_backend_find(const char *name, const struct comm_backend **out)
{
    *out = NULL;
    for (int i = 0; i < NBACKENDS; i++) {
        if (strcmp(name, backends[i].name) != 0)
            continue;
        if (!(*out = backends[i].table()))
            return FSDP_EUNSUPPORTED;
        return 0;
    }
    char names[128] = "";
    for (int i = 0; i < NBACKENDS; i++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof(names) - used, "%s\"%s\"", i ? " or " : "", backends[i].name);
    }
    return error_set(FSDP_EINVAL, "unknown backend '%s' (use %s)", name, names);
}
