#include "tests/util/tu_venv.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

bool tu_venv_bin(const char *prog, char *out, size_t cap)
{
    const char *venv = getenv("FSDP_TORCH_VENV"), *home = getenv("HOME");
    if (venv && *venv)
        snprintf(out, cap, "%s/bin/%s", venv, prog);
    else
        snprintf(out, cap, "%s/.cache/fsdpc-venv/bin/%s", home ? home : "", prog);
    return access(out, X_OK) == 0;
}
