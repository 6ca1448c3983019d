/* fsdp-ckpt's commands as tables: each command's arguments, its options (name, kind, what is allowed, the
 * field it sets, help), and its entry. One parser walks a command's table and one printer makes its --help
 * (ckpt_tool_args.c), so a flag, its check and its help text are written once, in the command's file. */
#ifndef FSDP_WORKER_CKPT_TOOL_ARGS_H
#define FSDP_WORKER_CKPT_TOOL_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum ckpt_opt_kind {
    CKPT_OPT_TEXT,   /* const char *: the argument itself */
    CKPT_OPT_INT,    /* long long: an integer (written 200, 2e2 or 200.0) in [lo, hi] */
    CKPT_OPT_NUMBER, /* double: a finite number in [lo, hi] */
    CKPT_OPT_CHOICE, /* int: the value of the spelling in choices */
    CKPT_OPT_PARSE,  /* whatever parse writes */
};

/* A spelling of a CHOICE option; `alias` spellings are accepted but not listed in help and messages. */
struct ckpt_choice {
    const char *name;
    int value;
    bool alias;
};

struct ckpt_opt {
    const char *name;    /* "--top_k": given as --top_k V or --top_k=V */
    const char *metavar; /* "K", in the usage line and --help */
    enum ckpt_opt_kind kind;
    size_t field;        /* offsetof the field it sets in the command's options struct */
    double lo, hi;       /* INT, NUMBER: what is allowed */
    bool clamp;          /* INT: a value above hi means hi (a count where more than hi changes nothing) */
    const struct ckpt_choice *choices; /* CHOICE: ends with {NULL} */
    int (*parse)(const char *v, void *field); /* PARSE: 0, or -1 when v is not `allowed` */
    const char *allowed; /* TEXT, PARSE: what a value is, for --help and messages (others: from the kind) */
    const char *def;     /* the default, as --help shows it (NULL: none) */
    bool required;
    const char *help;
};

/* A positional argument: every one of a command's is required, in order. */
struct ckpt_arg {
    const char *name; /* "MODEL" */
    size_t field;     /* offsetof its const char * */
    const char *help;
};

struct ckpt_tool_cmd {
    const char *name, *alias; /* alias: another name of the same command (NULL: none) */
    const char *about;        /* what it does, for fsdp-ckpt --help and its own --help */
    const struct ckpt_arg *args;
    int n_args;
    const struct ckpt_opt *opts;
    int n_opts;
    const void *defaults; /* the options struct before the command line: copied, then parsed into */
    size_t opts_size;
    int (*run)(const void *opts); /* the exit status; prints its own messages */
};

/* Parses argv (after the command name) into opts, a copy of cmd->defaults. 0 when parsed; 1 when --help
 * (or -h) was printed to stdout; a negative error (FSDP_EINVAL) naming the argument and what is allowed. */
int ckpt_tool_args_parse(const struct ckpt_tool_cmd *cmd, int argc, char **argv, void *opts);
/* Each command's synopsis ("sample MODEL [--prompt TEXT] ...") and what it does: fsdp-ckpt --help's list. */
void ckpt_tool_args_commands(const struct ckpt_tool_cmd *const *cmds, int n, FILE *out);
/* The command's --help: usage line, what it does, its arguments and every option with what it allows. */
void ckpt_tool_args_help(const struct ckpt_tool_cmd *cmd, FILE *out);

#endif
