/* The PyPI peers' venv (PyTorch 2.x, transformers, tokenizers, ...): FSDP_TORCH_VENV when set (.ci/run sets
 * it), else ~/.cache/fsdpc-venv, the path docs/ and .ci/run use. */
#ifndef FSDP_TESTS_UTIL_TU_VENV_H
#define FSDP_TESTS_UTIL_TU_VENV_H

#include <stdbool.h>
#include <stddef.h>

/* out = the venv's bin/PROG; false (out still set, for messages) when it is not an executable there. */
bool tu_venv_bin(const char *prog, char *out, size_t cap);

/* The venv's python in python[] when it imports `modules` (as written after `import`, e.g. "tokenizers" or
 * "tokenizers, transformers"): 0. Otherwise -1 with why[] naming what is missing and how to make it, for a
 * skip message. */
int tu_venv_python(const char *modules, char *python, size_t cap, char *why, size_t why_cap);

#endif
