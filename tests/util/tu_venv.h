/* The Python venv with PyPI's torch, transformers and tokenizers that peer tests and benchmarks run:
 * $FSDP_TORCH_VENV, else ~/.cache/fsdpc-venv (.ci/run makes it; docs/environment.md). */
#ifndef FSDP_TESTS_UTIL_TU_VENV_H
#define FSDP_TESTS_UTIL_TU_VENV_H

#include <stddef.h>

/* The venv's bin/python in python[] when it exists and imports `modules` (as written after `import`,
 * e.g. "tokenizers" or "torch, transformers"): 0. Otherwise -1 with why[] naming what is missing and how to
 * make it, for a skip message. */
int tu_venv_python(const char *modules, char *python, size_t cap, char *why, size_t why_cap);

#endif
