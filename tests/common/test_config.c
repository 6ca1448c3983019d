/* The config library against a small schema of its own: value types, ranges, enums and aliases, name
 * normalisation, INI errors with file:line and suggestions, command-line overrides, and the print ->
 * reload -> print round trip. */
#include <criterion/criterion.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

static const struct config_section t_sections[] = {
    {"train", "training"},
    {"fsdp", "sharding"},
    {"data", "files"},
};

static const struct config_key t_keys[] = {
    {.section = "train", .name = "micro_batch", .type = CONFIG_INT, .def = "4", .min = 1, .max = 64,
     .flags = LIST("train_batch_size"), .help = "per rank"},
    {.section = "train", .name = "lr", .type = CONFIG_FLOAT, .def = "0.001", .min = 0, .max = 1, .help = "lr"},
    {.section = "train", .name = "seed", .type = CONFIG_INT, .def = "1", .help = "unbounded"},
    {.section = "fsdp", .name = "seed", .type = CONFIG_INT, .def = "2", .help = "same name, other section"},
    {.section = "fsdp", .name = "offload_params", .type = CONFIG_BOOL, .def = "false",
     .flags = LIST("fsdp_offload_params"), .bare = "true", .help = "bool"},
    {.section = "fsdp", .name = "sharding_strategy", .type = CONFIG_ENUM, .def = "FULL_SHARD",
     .values = LIST("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"),
     .value_aliases = (const struct config_alias[]){{"1", "FULL_SHARD"}, {"2", "SHARD_GRAD_OP"}, {"zero3", "FULL_SHARD"},
                                                    {NULL, NULL}},
     .flags = LIST("fsdp_sharding_strategy"), .help = "enum"},
    {.section = "fsdp", .name = "backward_prefetch", .type = CONFIG_ENUM, .def = "NO_PREFETCH",
     .values = LIST("BACKWARD_PRE", "NO_PREFETCH"), .flags = LIST("fsdp_backward_prefetch"), .bare = "BACKWARD_PRE",
     .help = "enum with a bare meaning"},
    {.section = "data", .name = "train_file", .type = CONFIG_PATH, .def = "", .help = "path"},
    {.section = "data", .name = "tag", .type = CONFIG_STRING, .def = "run a", .help = "text"},
};

static const struct config_schema t_schema = {
    .program = "test-prog",
    .sections = t_sections,
    .n_sections = 3,
    .keys = t_keys,
    .n_keys = sizeof t_keys / sizeof t_keys[0],
};

static struct config *make(void)
{
    struct config *cfg = NULL;
    cr_assert_eq(config_create(&t_schema, &cfg), 0, "%s", error_message());
    return cfg;
}

static int load(struct config *cfg, const char *text) { return config_load_string(cfg, text, "t.ini"); }

static void assert_msg_has(const char *needle)
{
    cr_assert(strstr(error_message(), needle) != NULL, "message lacks \"%s\": %s", needle, error_message());
}

Test(config, defaults)
{
    struct config *cfg = make();
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 4);
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 0.001, 1e-15);
    cr_assert_eq(config_get_bool(cfg, "fsdp", "offload_params"), false);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 0);
    cr_assert_str_eq(config_get_string(cfg, "data", "train_file"), "");
    cr_assert(!config_is_set(cfg, "data", "train_file"));
    cr_assert_str_eq(config_get_string(cfg, "data", "tag"), "run a");
    config_destroy(cfg);
}

Test(config, int_and_range)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "train.micro_batch", " 64 "), 0);
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 64);
    cr_assert_eq(config_set(cfg, "train.micro_batch", "65"), FSDP_EINVAL);
    assert_msg_has("an integer in [1, 64]");
    assert_msg_has("train.micro_batch");
    cr_assert_eq(config_set(cfg, "train.micro_batch", "0"), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.micro_batch", "4.5"), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.micro_batch", "four"), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.micro_batch", ""), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.seed", "99999999999999999999"), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.seed", "-7"), 0);
    cr_assert_eq(config_get_int(cfg, "train", "seed"), -7);
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 64, "a rejected value must not change the config");
    config_destroy(cfg);
}

Test(config, float_and_range)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "train.lr", "3e-4"), 0);
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 3e-4, 1e-18);
    cr_assert_eq(config_set(cfg, "train.lr", "1.5"), FSDP_EINVAL);
    assert_msg_has("a number in [0, 1]");
    cr_assert_eq(config_set(cfg, "train.lr", "nan"), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "train.lr", "0.1x"), FSDP_EINVAL);
    config_destroy(cfg);
}

Test(config, bool_spellings)
{
    struct config *cfg = make();
    const char *yes[] = {"true", "TRUE", "1", "yes", "On"}, *no[] = {"false", "0", "No", "off"};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(config_set(cfg, "fsdp.offload_params", yes[i]), 0, "%s", yes[i]);
        cr_assert(config_get_bool(cfg, "fsdp", "offload_params"), "%s", yes[i]);
    }
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(config_set(cfg, "fsdp.offload_params", no[i]), 0, "%s", no[i]);
        cr_assert(!config_get_bool(cfg, "fsdp", "offload_params"), "%s", no[i]);
    }
    cr_assert_eq(config_set(cfg, "fsdp.offload_params", "maybe"), FSDP_EINVAL);
    assert_msg_has("true/false, 1/0, yes/no, on/off");
    config_destroy(cfg);
}

Test(config, enum_values_aliases_and_normalisation)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "fsdp.sharding_strategy", "shard-grad-op"), 0);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 1);
    cr_assert_str_eq(config_get_string(cfg, "fsdp", "sharding_strategy"), "SHARD_GRAD_OP");
    cr_assert_eq(config_set(cfg, "fsdp.sharding_strategy", "1"), 0);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 0);
    cr_assert_eq(config_set(cfg, "fsdp.sharding_strategy", "ZeRO3"), 0);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 0);
    cr_assert_eq(config_set(cfg, "fsdp.sharding_strategy", "no_shard"), 0);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 2);
    cr_assert_eq(config_set(cfg, "fsdp.sharding_strategy", "7"), FSDP_EINVAL);
    assert_msg_has("one of: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD (also 1 = FULL_SHARD, 2 = SHARD_GRAD_OP");
    config_destroy(cfg);
}

Test(config, text_values)
{
    struct config *cfg = make();
    cr_assert_eq(config_set(cfg, "data.train_file", "/data/x.bin"), 0);
    cr_assert_str_eq(config_get_string(cfg, "data", "train_file"), "/data/x.bin");
    cr_assert_eq(config_set(cfg, "data.train_file", "a ;b"), FSDP_EINVAL, "would be cut as a comment on reload");
    cr_assert_eq(config_set(cfg, "data.train_file", "a\nb"), FSDP_EINVAL);
    char big[CONFIG_MAX_VALUE + 2];
    memset(big, 'p', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(config_set(cfg, "data.train_file", big), FSDP_EINVAL);
    cr_assert_eq(config_set(cfg, "data.train_file", ""), 0);
    cr_assert(!config_is_set(cfg, "data", "train_file"));
    config_destroy(cfg);
}

Test(config, key_lookup_normalises_and_resolves_flags)
{
    cr_assert_eq(config_find_key(&t_schema, "TRAIN.Micro-Batch"), 0);
    cr_assert_eq(config_find_key(&t_schema, "train_batch_size"), 0);
    cr_assert_eq(config_find_key(&t_schema, "micro_batch"), 0, "unique bare key name");
    cr_assert_eq(config_find_key(&t_schema, "seed"), -1, "ambiguous bare key name");
    cr_assert_eq(config_find_key(&t_schema, "fsdp.seed"), 3);
    cr_assert_eq(config_find_key(&t_schema, "Fsdp-Offload-Params"), 4);
    cr_assert_eq(config_find_key(&t_schema, "train.nope"), -1);
}

Test(config, edit_distance_and_suggestions)
{
    cr_assert_eq(config_edit_distance("kitten", "sitting"), 3);
    cr_assert_eq(config_edit_distance("", "abc"), 3);
    cr_assert_eq(config_edit_distance("same", "same"), 0);
    char buf[128];
    cr_assert_str_eq(config_suggest_key(&t_schema, "train.micro_bach", buf, sizeof buf), "train.micro_batch");
    cr_assert_str_eq(config_suggest_key(&t_schema, "micro_bacth", buf, sizeof buf), "train.micro_batch");
    cr_assert_str_eq(config_suggest_key(&t_schema, "fsdp.micro_batch", buf, sizeof buf), "train.micro_batch");
    cr_assert_str_eq(config_suggest_key(&t_schema, "fsdp_ofload_params", buf, sizeof buf), "fsdp_offload_params");
    cr_assert_null(config_suggest_key(&t_schema, "completely_unrelated_words", buf, sizeof buf));
    cr_assert_str_eq(config_suggest_section(&t_schema, "trian"), "train");
}

Test(config, ini_values_and_normalised_names)
{
    struct config *cfg = make();
    int rc = load(cfg, "; comment\n# comment\n[Train]\nMicro-Batch = 8\n  lr: 0.5 ; inline comment\n"
                       "[fsdp]\nsharding_strategy = 2\noffload_params = yes\n[data]\ntrain_file = /x y/z.bin\n");
    cr_assert_eq(rc, 0, "%s", error_message());
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 8);
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 0.5, 1e-15);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 1);
    cr_assert(config_get_bool(cfg, "fsdp", "offload_params"));
    cr_assert_str_eq(config_get_string(cfg, "data", "train_file"), "/x y/z.bin");
    config_destroy(cfg);
}

/* "key =; note" (no space before ';') is a comment too, as --print-config writes "key = ; note" back: the
 * value is empty and prints and loads back the same (found by fuzz_config). */
Test(config, ini_value_starting_with_semicolon_is_a_comment)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[data]\ntag =; a note\ntrain_file =;x\n"), 0, "%s", error_message());
    cr_assert_str_eq(config_get_string(cfg, "data", "tag"), "");
    cr_assert_str_eq(config_get_string(cfg, "data", "train_file"), "");
    config_destroy(cfg);
}

Test(config, ini_flat_names_before_any_section)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "fsdp_sharding_strategy = 2\ntrain.micro_batch = 2\n[data]\ntag = x\n"), 0, "%s",
                 error_message());
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 1);
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 2);
    config_destroy(cfg);
}

Test(config, ini_unknown_key_suggests_nearest)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\n\nmicro_bach = 3\n"), FSDP_EINVAL);
    cr_assert_str_eq(error_message(), "t.ini:4: unknown key 'micro_bach' in [train]; did you mean 'train.micro_batch'?");
    config_destroy(cfg);
}

Test(config, ini_bad_value_names_file_line_key_and_allowed)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[fsdp]\n\nsharding_strategy = HALF_SHARD\n"), FSDP_EINVAL);
    assert_msg_has("t.ini:3: bad value for fsdp.sharding_strategy: 'HALF_SHARD' is not valid; expected one of: "
                   "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD");
    config_destroy(cfg);
    cfg = make();
    cr_assert_eq(load(cfg, "[train]\nmicro_batch = 100\n"), FSDP_EINVAL);
    assert_msg_has("t.ini:2: bad value for train.micro_batch: '100' is not valid; expected an integer in [1, 64]");
    config_destroy(cfg);
}

Test(config, ini_unknown_section_lists_known)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\n[trian]\nmicro_batch = 3\n"), FSDP_EINVAL);
    assert_msg_has("t.ini:3: unknown section [trian]; did you mean [train]?");
    assert_msg_has("[train], [fsdp], [data]");
    config_destroy(cfg);
    cfg = make();
    cr_assert_eq(load(cfg, "[nothing_like_it]\n"), FSDP_EINVAL, "an empty unknown section is still an error");
    assert_msg_has("known sections: [train], [fsdp], [data]");
    config_destroy(cfg);
}

Test(config, ini_duplicate_key_names_both_lines)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\nmicro_batch = 2\n[fsdp]\n[train]\nLR = 0.2\n"), FSDP_EINVAL);
    cr_assert_str_eq(error_message(), "t.ini:6: duplicate key train.lr: set on line 2 and again on line 6");
    config_destroy(cfg);
}

Test(config, ini_indented_line_is_a_key_not_a_continuation)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\n    micro_batch = 9\n"), 0, "%s", error_message());
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 0.1, 1e-15);
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 9);
    config_destroy(cfg);
}

Test(config, ini_long_line_rejected)
{
    struct config *cfg = make();
    char text[400];
    int n = snprintf(text, sizeof text, "[data]\ntag = ");
    memset(text + n, 'v', 250);
    strcpy(text + n + 250, "\n");
    cr_assert_eq(load(cfg, text), FSDP_EINVAL);
    assert_msg_has("t.ini:2: line is 256 characters long; the limit is 190");
    cr_assert_str_eq(config_get_string(cfg, "data", "tag"), "run a", "nothing applied from a rejected file");
    config_destroy(cfg);
    /* A line of exactly the limit is fine, whatever it holds. */
    cfg = make();
    n = snprintf(text, sizeof text, "[data]\n; ");
    memset(text + n, 'c', CONFIG_MAX_LINE - 2);
    strcpy(text + n + CONFIG_MAX_LINE - 2, "\r\n");
    cr_assert_eq(load(cfg, text), 0, "%s", error_message());
    config_destroy(cfg);
}

Test(config, ini_syntax_error_names_line)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\nthis is not ini\n"), FSDP_EINVAL);
    assert_msg_has("t.ini:3: cannot parse 'this is not ini'");
    config_destroy(cfg);
}

Test(config, file_errors_name_the_file)
{
    char dir[] = "/tmp/cfgtestXXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/run.ini", dir);
    FILE *f = fopen(path, "w");
    fputs("[train]\nmicro_batch = 2\nbogus_key = 1\n", f);
    fclose(f);
    struct config *cfg = make();
    cr_assert_eq(config_load_file(cfg, path), FSDP_EINVAL);
    char want[300];
    snprintf(want, sizeof want, "%s:3: unknown key 'bogus_key' in [train]", path);
    assert_msg_has(want);
    unlink(path);
    cr_assert_eq(config_load_file(cfg, path), FSDP_ENOTFOUND);
    assert_msg_has("cannot open config file");
    config_destroy(cfg);
    rmdir(dir);
}

/* /dev/zero reads forever and a FIFO waits for a writer: a config file must be a regular file of at most
 * CONFIG_MAX_FILE_BYTES, refused at once otherwise, naming the file. */
Test(config, file_must_be_a_regular_file_under_the_cap, .timeout = 20)
{
    struct config *cfg = make();
    cr_assert_eq(config_load_file(cfg, "/dev/zero"), FSDP_EINVAL);
    assert_msg_has("'/dev/zero' is not a regular file");
    char dir[] = "/tmp/cfgtestXXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/fifo.ini", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_eq(config_load_file(cfg, path), FSDP_EINVAL);
    assert_msg_has("is not a regular file");
    unlink(path);
    cr_assert_eq(config_load_file(cfg, dir), FSDP_EINVAL);
    assert_msg_has("is not a regular file");
    snprintf(path, sizeof path, "%s/big.ini", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < CONFIG_MAX_FILE_BYTES / 8 + 1; i++)
        fputs(";commen\n", f);
    fclose(f);
    cr_assert_eq(config_load_file(cfg, path), FSDP_EINVAL);
    assert_msg_has("bytes; the limit is");
    /* Just under the cap loads. */
    cr_assert_eq(truncate(path, CONFIG_MAX_FILE_BYTES - 1), 0);
    cr_assert_eq(config_load_file(cfg, path), 0, "%s", error_message());
    unlink(path);
    config_destroy(cfg);
    rmdir(dir);
}

static int cli(struct config_cli *c, const char *const *args)
{
    int argc = 0;
    static char *argv[32];
    argv[argc++] = "prog";
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    return config_cli_parse(&t_schema, argc, argv, c);
}

Test(config, cli_forms_and_flat_flags)
{
    struct config_cli c;
    const char *args[] = {"run.ini", "--train.micro_batch=8", "--TRAIN.LR", "0.25", "--fsdp_sharding_strategy=2",
                          "--fsdp-offload-params", "--fsdp_backward_prefetch", "--data.tag", "x", "--print-config",
                          NULL};
    cr_assert_eq(cli(&c, args), 0, "%s", error_message());
    cr_assert_eq(c.n_positional, 1);
    cr_assert_str_eq(c.positional[0], "run.ini");
    cr_assert(c.print_config);
    struct config *cfg = make();
    cr_assert_eq(config_cli_apply(&c, cfg), 0, "%s", error_message());
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 8);
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 0.25, 1e-15);
    cr_assert_eq(config_get_enum(cfg, "fsdp", "sharding_strategy"), 1);
    cr_assert(config_get_bool(cfg, "fsdp", "offload_params"));
    cr_assert_str_eq(config_get_string(cfg, "fsdp", "backward_prefetch"), "BACKWARD_PRE");
    cr_assert_str_eq(config_get_string(cfg, "data", "tag"), "x");
    config_destroy(cfg);
    config_cli_free(&c);
}

Test(config, cli_bare_bool_takes_only_a_boolean_next)
{
    struct config_cli c;
    const char *args[] = {"--fsdp_offload_params", "run.ini", NULL};
    cr_assert_eq(cli(&c, args), 0, "%s", error_message());
    cr_assert_eq(c.n_positional, 1, "run.ini is the config file, not the flag's value");
    struct config *cfg = make();
    cr_assert_eq(config_cli_apply(&c, cfg), 0);
    cr_assert(config_get_bool(cfg, "fsdp", "offload_params"));
    config_cli_free(&c);
    const char *args2[] = {"--fsdp_offload_params", "off", "run.ini", NULL};
    cr_assert_eq(cli(&c, args2), 0, "%s", error_message());
    cr_assert_eq(c.n_positional, 1);
    cr_assert_eq(config_cli_apply(&c, cfg), 0);
    cr_assert(!config_get_bool(cfg, "fsdp", "offload_params"));
    config_cli_free(&c);
    config_destroy(cfg);
}

Test(config, cli_overrides_beat_the_file_and_later_wins)
{
    struct config_cli c;
    const char *args[] = {"--train.micro_batch=8", "--micro_batch", "16", NULL};
    cr_assert_eq(cli(&c, args), 0, "%s", error_message());
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nmicro_batch = 2\nlr = 0.5\n"), 0);
    cr_assert_eq(config_cli_apply(&c, cfg), 0);
    cr_assert_eq(config_get_int(cfg, "train", "micro_batch"), 16);
    cr_assert_float_eq(config_get_float(cfg, "train", "lr"), 0.5, 1e-15, "the file still sets what the CLI does not");
    config_cli_free(&c);
    config_destroy(cfg);
}

Test(config, cli_errors)
{
    struct config_cli c;
    const char *unknown[] = {"--train.micro_bach=3", NULL};
    cr_assert_eq(cli(&c, unknown), FSDP_EINVAL);
    cr_assert_str_eq(error_message(), "unknown option '--train.micro_bach'; did you mean '--train.micro_batch'?");
    config_cli_free(&c);
    const char *novalue[] = {"--train.lr", NULL};
    cr_assert_eq(cli(&c, novalue), FSDP_EINVAL);
    assert_msg_has("needs a value");
    config_cli_free(&c);
    const char *bad[] = {"--train.micro_batch=0", NULL};
    cr_assert_eq(cli(&c, bad), 0, "values are checked when applied");
    struct config *cfg = make();
    cr_assert_eq(config_cli_apply(&c, cfg), FSDP_EINVAL);
    assert_msg_has("command line: bad value for train.micro_batch: '0' is not valid; expected an integer in [1, 64]");
    config_cli_free(&c);
    config_destroy(cfg);
}

Test(config, cli_log_level_and_program_flags)
{
    struct config_cli c;
    const char *args[] = {"--log_level=error", "--help", "--help-config", NULL};
    cr_assert_eq(cli(&c, args), 0, "%s", error_message());
    cr_assert_eq(log_get_level(), LOG_ERROR);
    cr_assert(c.help);
    cr_assert_str_eq(c.help_config, "markdown");
    config_cli_free(&c);
    const char *args2[] = {"--log-level", "debug", NULL};
    cr_assert_eq(cli(&c, args2), 0, "%s", error_message());
    cr_assert_eq(log_get_level(), LOG_DEBUG);
    config_cli_free(&c);
    const char *bad[] = {"--log_level=loud", NULL};
    cr_assert_eq(cli(&c, bad), FSDP_EINVAL);
    assert_msg_has("debug, info, warn or error");
    config_cli_free(&c);
}

static char *print_to_string(const struct config *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(config_print_ini(cfg, f), 0);
    fclose(f);
    return buf;
}

Test(config, print_reload_print_is_byte_equal)
{
    struct config *cfg = make();
    cr_assert_eq(load(cfg, "[train]\nlr = 0.1\nseed = -3\n[fsdp]\nsharding_strategy = zero3\noffload_params = ON\n"
                           "[data]\ntrain_file = /tmp/a b.bin\n"),
                 0, "%s", error_message());
    cr_assert_eq(config_set(cfg, "data.tag", ""), 0);
    char *first = print_to_string(cfg);
    struct config *again = make();
    cr_assert_eq(load(again, first), 0, "%s\n%s", error_message(), first);
    char *second = print_to_string(again);
    cr_assert_str_eq(first, second);
    cr_assert(strstr(first, "lr = 0.1\n"), "shortest float text: %s", first);
    cr_assert(strstr(first, "sharding_strategy = FULL_SHARD\n"), "canonical enum: %s", first);
    cr_assert(strstr(first, "offload_params = true\n"), "canonical bool: %s", first);
    cr_assert(strstr(first, "tag =\n"), "unset text: %s", first);
    cr_assert_eq(config_get_float(again, "train", "lr"), config_get_float(cfg, "train", "lr"), "exact double");
    free(first);
    free(second);
    config_destroy(cfg);
    config_destroy(again);
}

Test(config, float_text_round_trips_exactly)
{
    const double xs[] = {0.1, 1.0 / 3.0, 6e-4, 1e-8, 0.95, 1.0, 0.0, 0.7000000000000001};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        struct config *cfg = make();
        char text[64];
        snprintf(text, sizeof text, "%.17g", xs[i]);
        cr_assert_eq(config_set(cfg, "train.lr", text), 0, "%s", text);
        char *ini = print_to_string(cfg);
        struct config *again = make();
        cr_assert_eq(load(again, ini), 0);
        cr_assert_eq(config_get_float(again, "train", "lr"), xs[i], "%s", text);
        free(ini);
        config_destroy(cfg);
        config_destroy(again);
    }
}

Test(config, markdown_lists_every_key)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(config_print_markdown(&t_schema, f), 0);
    fclose(f);
    cr_assert(strstr(buf, "## [fsdp]"));
    cr_assert(strstr(buf, "| `micro_batch` | int | `4` | 1 to 64 | `--train_batch_size` | per rank |"), "%s", buf);
    cr_assert(strstr(buf, "`FULL_SHARD`, `SHARD_GRAD_OP`, `NO_SHARD` (also `1` = `FULL_SHARD`"), "%s", buf);
    free(buf);
}

static const struct config_key bad_keys[] = {
    {.section = "train", .name = "n", .type = CONFIG_INT, .def = "0", .min = 1, .max = 2, .help = "bad default"},
};
static const struct config_schema bad_schema = {"bad", t_sections, 3, bad_keys, 1};

Test(config, schema_with_bad_default_is_refused)
{
    struct config *cfg = NULL;
    cr_assert_eq(config_create(&bad_schema, &cfg), FSDP_EINVAL);
    assert_msg_has("schema bug: default of train.n");
    cr_assert_null(cfg);
}

/* A number or boolean without a default is optional: unset until given, empty text unsets it again,
 * --print-config writes "key =" for it and that loads back; keys with a default refuse empty text. */
Test(config, optional_numbers_and_booleans)
{
    static const struct config_section sec[] = {{"model", "m"}};
    static const struct config_key keys[] = {
        {.section = "model", .name = "heads", .type = CONFIG_INT, .min = 1, .max = 8, .help = "optional int"},
        {.section = "model", .name = "theta", .type = CONFIG_FLOAT, .def = "", .help = "optional float"},
        {.section = "model", .name = "tie", .type = CONFIG_BOOL, .bare = "true", .help = "optional bool"},
        {.section = "model", .name = "layers", .type = CONFIG_INT, .def = "2", .help = "has a default"},
    };
    static const struct config_schema schema = {.program = "opt", .sections = sec, .n_sections = 1, .keys = keys,
                                                .n_keys = 4};
    struct config *cfg = NULL;
    cr_assert_eq(config_create(&schema, &cfg), 0, "%s", error_message());
    cr_assert(!config_is_set(cfg, "model", "heads") && !config_is_set(cfg, "model", "theta") &&
              !config_is_set(cfg, "model", "tie"));
    cr_assert_eq(config_get_int(cfg, "model", "heads"), 0);
    cr_assert_eq(config_load_string(cfg, "[model]\nheads = 4\ntheta = 2.5\ntie = yes\n", "o.ini"), 0, "%s",
                 error_message());
    cr_assert_eq(config_get_int(cfg, "model", "heads"), 4);
    cr_assert(config_get_bool(cfg, "model", "tie"));
    cr_assert_eq(config_set(cfg, "model.heads", "9"), FSDP_EINVAL); /* the range still holds */
    cr_assert(strstr(error_message(), "(empty = unset)"), "%s", error_message());
    cr_assert_eq(config_set(cfg, "model.theta", "  "), 0, "%s", error_message());
    cr_assert(!config_is_set(cfg, "model", "theta"));
    cr_assert_eq(config_set(cfg, "model.layers", ""), FSDP_EINVAL);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    cr_assert_eq(config_print_ini(cfg, f), 0);
    fclose(f);
    cr_assert(strstr(out, "\ntheta =\n") && strstr(out, "\nheads = 4\n"), "%s", out);
    struct config *back = NULL;
    cr_assert_eq(config_create(&schema, &back), 0);
    cr_assert_eq(config_load_string(back, out, "printed.ini"), 0, "%s", error_message());
    cr_assert(!config_is_set(back, "model", "theta"));
    cr_assert_eq(config_get_int(back, "model", "heads"), 4);
    free(out);
    config_destroy(cfg);
    config_destroy(back);
}
