/* What each worker executes: PROGRAM as is, or through the Python interpreter the way torchrun runs a
 * training script (PYTHON -u SCRIPT, PYTHON -u -m MODULE, runpy.run_path for --run_path). */
#ifndef FSDP_LAUNCHER_COMMAND_H
#define FSDP_LAUNCHER_COMMAND_H

#include <stdbool.h>
#include <stddef.h>

#include "common/fs.h"
#include "launcher/args.h"

struct launch_command {
    char program[FSDP_PATH_MAX]; /* resolved path given to execve */
    char **argv;            /* NULL-terminated (malloc'd array; the strings are a's or static) */
    bool python;            /* run through the interpreter */
};

/* Decides and resolves the command. Errors (FSDP_ENOTFOUND) name the program or script and where it was
 * looked for, and for Python which interpreter and how to pick another. */
int command_build(const struct launch_args *a, struct launch_command *out);
void command_free(struct launch_command *c);

/* Looks PROGRAM up (as given when it holds '/', else in PATH, then next to fsdp-launch) and stores the path
 * in out; FSDP_ENOTFOUND names every place tried. */
int command_find_program(const char *prog, char *out, size_t cap);

#endif
