/* fsdp-worker --detect-blocks CONFIG: SimpleTuner's block detection for fsdpc's models. For the configured
 * model (or the model of model.init_from: an fsdpc checkpoint, a Hugging Face directory, a safetensors
 * file), a table of module classes: how many, parameters each and in total, share of the model, whether the
 * class can be an FSDP unit, and the suggested transformer_layer_cls_to_wrap, with Hugging Face's class
 * names beside ours. Results are cached as JSON in $XDG_CACHE_HOME/fsdpc/fsdp_block_cache.json (default
 * ~/.cache/fsdpc/...), keyed by family, shape and checkpoint identity; --refresh recomputes, --clear-cache
 * removes the file, and a corrupt cache is replaced. docs/fsdp.md describes the output. */
#ifndef FSDP_WORKER_TOOLS_DETECT_BLOCKS_H
#define FSDP_WORKER_TOOLS_DETECT_BLOCKS_H

#include <stdbool.h>

/* Is this command line a block detection (--detect-blocks or --clear-cache among the arguments)? */
bool detect_blocks_wanted(int argc, char **argv);
/* Runs it; returns the exit code (0; 1 for a bad config or unreadable checkpoint). */
int detect_blocks_main(int argc, char **argv);

#endif
