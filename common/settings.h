/* The FSDP_* environment settings, declared in one table (common/settings_table.c): name, type, default,
 * what is allowed, which programs read it, whether it is a test hook, and one line of documentation.
 * Code reads a setting only through the accessors below, which parse and check the value against its
 * entry; docs/environment.md is the table's Markdown (`fsdp-worker --help-env=markdown`), and
 * tests/common/test_settings.c fails when the docs, the table and the sources disagree. */
#ifndef FSDP_COMMON_SETTINGS_H
#define FSDP_COMMON_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* One per table entry, in table order; each is SETTING_ + the variable's name without FSDP_. */
enum setting_id {
    SETTING_LOG_LEVEL,
    SETTING_RDZV_TOKEN,
    SETTING_RDZV_TOKEN_FILE,
    SETTING_STORE_PREFIX,
    SETTING_STORE_PORT,
    SETTING_HEARTBEAT_TIMEOUT,
    SETTING_GPU_MODULE,
    SETTING_CUDA_TF32,
    SETTING_GPU_EMU_DEVICES,
    SETTING_GPU_EMU_SMS,
    SETTING_GPU_EMU_MEMORY_GIB,
    SETTING_GPU_EMU_DELAY_US,
    SETTING_GPU_EMU_SEED,
    SETTING_GPU_EMU_TRACE_DIR,
    SETTING_PEAK_TFLOPS,
    SETTING_REGISTERED_BUFFERS,
    SETTING_CPU_MATMUL,
    SETTING_COMM_TIMEOUT_S,
    SETTING_COMM_BACKEND,
    SETTING_RDZV_GENERATION,
    SETTING_RUN_ID,
    SETTING_COMM_SHM_SLOT_KIB,
    SETTING_COMM_SHM_DIRECT,
    SETTING_COMM_SHM_KEEP_PEER_PAGES,
    SETTING_COMM_FORCE_TCP,
    SETTING_DEMO_QUIET,
    SETTING_FAULT_KILL,
    SETTING_TEST_OFFLOAD,
    SETTING_COMM_HOST_ID,
    SETTING_TEST_GPU_HOST,
    SETTING_TEST_GPU_COUNT,
    SETTING_TEST_COMM_SERIAL,
    SETTING_TEST_CPU_NO_BF16,
    SETTING_BUILD_ROOT,
    SETTING_SOURCE_ROOT,
    SETTING_KERNELS_BACKEND,
    SETTING_TORCHRUN,
    SETTING_TORCH_VENV,
    SETTING_TEST_NCCL_WORLD,
    SETTING_TEST_GROW_MODULE,
    SETTING_TEST_GROW_FILE,
    SETTING_TEST_GROW_WITH,
    SETTING_LAUNCH_CONFIG,
    SETTING_HEARTBEAT_FD,
    SETTING_COUNT
};

enum setting_type {
    SETTING_BOOL,   /* 1/0, true/false, yes/no, on/off, any case */
    SETTING_INT,    /* decimal, within [min, max] */
    SETTING_DOUBLE, /* finite, within [min, max]; above min only when min_exclusive */
    SETTING_STRING, /* any text; `format` describes it */
    SETTING_ENUM,   /* one of `values` (or an alias), any case */
};

/* Who reads a setting (a bit set): the programs, the comm library for callers that leave the matching
 * comm_options field unset, and the test suite's own harness. */
enum setting_reader {
    SETTING_BY_LAUNCH = 1 << 0,       /* fsdp-launch */
    SETTING_BY_WORKER = 1 << 1,       /* fsdp-worker */
    SETTING_BY_PREPARE_DATA = 1 << 2, /* fsdp-prepare-data */
    SETTING_BY_DEMO = 1 << 3,         /* fsdp-rdzv-demo (examples/) */
    SETTING_BY_COMM = 1 << 4,         /* comm_create's callers that leave the option unset */
    SETTING_BY_TESTS = 1 << 5,        /* the test suite and benchmarks */
};

struct setting_value {
    const char *name; /* as the variable spells it */
    const char *doc;  /* what it means; NULL when the name says it */
};

struct setting_alias {
    const char *from, *to; /* `from` means the value `to` */
};

struct setting {
    enum setting_id id;
    const char *name; /* "FSDP_..." */
    enum setting_type type;
    const char *def;     /* the default, spelled as the variable would be; NULL: the reader works it out */
    const char *def_doc; /* the default in words, when def is NULL or needs saying more */
    double min, max;     /* SETTING_INT and SETTING_DOUBLE; max = 0: no upper bound */
    bool min_exclusive;  /* SETTING_DOUBLE: the value must be above min */
    const struct setting_value *values; /* SETTING_ENUM: ends with {NULL} */
    const struct setting_alias *aliases; /* SETTING_ENUM, may be NULL: ends with {NULL} */
    const char *format;  /* SETTING_STRING: what the text is ("a path", "STEP:RANK") */
    unsigned readers;    /* enum setting_reader bits */
    bool launcher_sets;  /* fsdp-launch sets it in every worker's environment */
    bool empty_is_value; /* an empty value is a value, not "unset" */
    bool test_only;      /* a hook for tests (and rehearsals), not a knob for runs */
    const char *doc;     /* one line */
};

/* --- settings_table.c: the table ----------------------------------------------------------------- */

const struct setting *settings_entry(enum setting_id id);
/* The entry whose name is `name`, or NULL when no setting has that name. */
const struct setting *settings_find(const char *name);

/* --- settings.c: typed reads ---------------------------------------------------------------------- */

/* The variable's text: NULL when unset, or empty and the entry does not keep empty values. */
const char *settings_get_raw(enum setting_id id);
/* A string setting's value, or its default (NULL when the entry has none) when unset. */
const char *settings_get_string(enum setting_id id);
/* Typed reads. Unset: *out = the entry's default, or stays as the caller set it when the entry has none
 * (a default the reader works out, such as MASTER_PORT + 1). A value the entry does not allow: *out is
 * set as when unset and FSDP_EINVAL is returned with a message naming the variable, its value and what is
 * allowed. settings_get_enum gives the index of the value in the entry's `values`. */
int settings_get_bool(enum setting_id id, bool *out);
int settings_get_int(enum setting_id id, long *out);
int settings_get_double(enum setting_id id, double *out);
int settings_get_enum(enum setting_id id, int *out);

/* --- settings_warn.c: reads that cannot fail ---------------------------------------------------- */

/* The value, or, for a value the entry does not allow, the default after one warning per process and
 * setting that names the variable and what is allowed. Without a default in the table: false, 0, 0.0 or
 * index 0. */
bool settings_bool(enum setting_id id);
long settings_int(enum setting_id id);
double settings_double(enum setting_id id);
int settings_enum(enum setting_id id);

/* --- settings_doc.c: the reference ---------------------------------------------------------------- */

/* Writes the Markdown reference of every setting (the text of docs/environment.md). */
int settings_print_markdown(FILE *out);

#endif
