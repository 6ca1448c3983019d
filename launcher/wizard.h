/* `fsdp-launch config`: the questions `accelerate config` asks (machines, processes, FSDP version,
 * strategy, wrap policy with the model's blocks detected, state dict type, offload, mixed precision, ...),
 * answered on stdin (a terminal or a pipe), then an accelerate YAML that `fsdp-launch --config_file` and
 * `accelerate launch --config_file` both read, or with --ini the fsdp-worker settings as INI. */
#ifndef FSDP_LAUNCHER_WIZARD_H
#define FSDP_LAUNCHER_WIZARD_H

/* argv[0] is "config". Returns the exit code: 0, 2 for bad flags or unanswerable input, 1 for I/O. */
int wizard_main(int argc, char **argv);

#endif
