/* The files a run starts from, checked before any work: model.init_from (a Hugging Face directory's
 * config.json then sets the [model] shape) and checkpoint.resume_from (a file where a checkpoint directory
 * belongs is refused with what to pass instead). */
#ifndef FSDP_WORKER_TRAIN_SOURCES_H
#define FSDP_WORKER_TRAIN_SOURCES_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"

/* cfg uses worker_config_schema and holds the file and command line. When model.init_from is a Hugging
 * Face directory, every [model] key its config.json implies takes the directory's value where the config
 * file and command line left it at its default; a key they set to another value is an error naming both
 * values (a context length, block_size, may be smaller than the directory's). Call before
 * worker_config_view. */
int train_sources_apply(struct config *cfg);

/* The tokenizer of a run whose training tokens are train_file, where fsdp-prepare-data leaves it: the
 * file meta.json beside train_file names (its "tokenizer": null means byte tokens), or tokenizer.json there
 * without a meta.json. out receives its path; false when there is none. */
bool train_tokenizer_find(const char *train_file, char *out, size_t cap);

#endif
