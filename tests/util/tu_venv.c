#include "tests/util/tu_venv.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int tu_venv_python(const char *modules, char *python, size_t cap, char *why, size_t why_cap)
{
    const char *venv = getenv("FSDP_TORCH_VENV"), *home = getenv("HOME");
    char dir[1024];
    if (venv && *venv)
        snprintf(dir, sizeof dir, "%s", venv);
    else
        snprintf(dir, sizeof dir, "%s/.cache/fsdpc-venv", home ? home : "");
    snprintf(python, cap, "%s/bin/python", dir);
    if (access(python, X_OK) != 0) {
        snprintf(why, why_cap, "no Python venv at %s (FSDP_TORCH_VENV; make it with python3 -m venv %s && %s/bin/pip "
                 "install %s)", dir, dir, dir, modules);
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
