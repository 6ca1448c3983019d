/* The PyPI peers' venv (PyTorch 2.x, transformers, tokenizers, ...): FSDP_TORCH_VENV when set (.ci/run sets
 * it), else ~/.cache/fsdpc-venv, the path docs/ and .ci/run use. */
#ifndef FSDP_TESTS_UTIL_TU_VENV_H
#define FSDP_TESTS_UTIL_TU_VENV_H

#include <stdbool.h>
#include <stddef.h>

/* out = the venv's bin/PROG; false (out still set, for messages) when it is not an executable there. */
bool tu_venv_bin(const char *prog, char *out, size_t cap);

#endif
