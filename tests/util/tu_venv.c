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

int tu_venv_python(const char *modules, char *python, size_t cap, char *why, size_t why_cap)
{
    if (!tu_venv_bin("python", python, cap)) {
        snprintf(why, why_cap, "no PyPI venv python at %s (FSDP_TORCH_VENV; .ci/run makes it: python3 -m venv DIR "
                 "&& DIR/bin/pip install %s)", python, modules);
        return -1;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import %s' >/dev/null 2>&1", python, modules);
    if (system(cmd) != 0) {
        snprintf(why, why_cap, "%s cannot import %s (pip install it into that venv)", python, modules);
        return -1;
    }
    return 0;
}
