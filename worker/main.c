/* fsdp-worker: one per rank. Loads and checks the configuration (file, then command-line overrides), then
 * trains: as one rank when started alone, as rank RANK of WORLD_SIZE under fsdp-launch or torchrun. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/settings.h"
#include "worker/train/heartbeat.h"
#include "worker/train/train.h"
#include "worker/train/train_sources.h"
#include "worker/config/worker_config.h"
#include "worker/tools/detect_blocks.h"

/* 3 marks a rank that stopped because another one failed (a peer died or closed its connection, or the
 * job is being torn down): fsdp-launch then looks a moment longer for the rank that failed first, whose
 * own exit may reach it later (a dead process with threads still exiting cannot be reaped yet). */
enum { EXIT_CONFIG = 1, EXIT_TRAIN = 2, EXIT_PEER_FAILED = 3 };

static void print_usage(FILE *out)
{
    fputs("usage: fsdp-worker CONFIG.ini [--section.key=value ...] [--print-config] [--log_level=L]\n"
          "       fsdp-worker --print-config            (the defaults, as a starting CONFIG.ini)\n"
          "       fsdp-worker --help-config[=markdown]  (the reference of every key: docs/config.md)\n"
          "       fsdp-worker --help-env[=markdown]     (the FSDP_* environment settings: docs/environment.md)\n"
          "       fsdp-worker --detect-blocks CONFIG.ini [--json] [--refresh] [--clear-cache]\n"
          "                                             (module classes, parameters, FSDP units, wrap suggestion)\n"
          "\n"
          "Options override the file: --train.micro_batch=8, --train.micro_batch 8, or accelerate-style\n"
          "flags such as --fsdp_version=2 --fsdp_sharding_strategy=1 --fsdp_offload_params.\n"
          "  --print-config     print the effective configuration (INI; loads back unchanged), each value\n"
          "                     not at its default under a '; from ...' line saying where it came from\n"
          "  --log_level=L      debug, info, warn or error (also FSDP_LOG_LEVEL)\n"
          "  -h, --help         this text\n",
          out);
}

static int fail(const char *what)
{
    log_error("%s: %s", what, error_message());
    return EXIT_CONFIG;
}

/* Training in this rank's environment (torchrun's variables and the store); *config_refused when the config
 * does not fit the world (train_env.config_refused). */
static int run(const struct worker_config *wc, const char *config_text, bool *config_refused)
{
    struct train_env env;
    int rc = 0;
    FSDP_TRY_GOTO(train_env_open(&env), rc, out);
    FSDP_TRY_GOTO(train_run(wc, config_text, &env), rc, out);
out:
    *config_refused = env.config_refused;
    train_env_close(&env);
    return rc;
}

int main(int argc, char **argv)
{
    log_init("fsdp-worker");
    const char *rank = getenv("RANK");
    if (rank && *rank)
        log_set_rank(atoi(rank));

    if (detect_blocks_wanted(argc, argv))
        return detect_blocks_main(argc, argv);
    /* from the start: a rank stopped while it loads its config or data is as stuck as one stopped in a step */
    heartbeat_start();
    const struct config_schema *schema = worker_config_schema();
    struct config_cli cli;
    struct config *cfg = NULL;
    char *text = NULL;
    int status = EXIT_CONFIG;
    if (config_cli_parse(schema, argc, argv, &cli) != 0) {
        status = fail("bad command line");
        goto out;
    }
    if (cli.help) {
        print_usage(stdout);
        status = 0;
        goto out;
    }
    if (cli.help_config) {
        if (strcasecmp(cli.help_config, "markdown") != 0 && strcasecmp(cli.help_config, "md") != 0) {
            log_error("--help-config=%s: the only format is markdown", cli.help_config);
            goto out;
        }
        status = config_print_markdown(schema, stdout) == 0 ? 0 : fail("writing the reference");
        goto out;
    }
    if (cli.help_env) {
        if (strcasecmp(cli.help_env, "markdown") != 0 && strcasecmp(cli.help_env, "md") != 0) {
            log_error("--help-env=%s: the only format is markdown", cli.help_env);
            goto out;
        }
        status = settings_print_markdown(stdout) == 0 ? 0 : fail("writing the reference");
        goto out;
    }
    if (cli.n_positional > 1 || (cli.n_positional == 0 && !cli.print_config)) {
        log_error("expected one config file, got %d arguments; run fsdp-worker --help", cli.n_positional);
        print_usage(stderr);
        goto out;
    }
    if (config_create(schema, &cfg) != 0) {
        status = fail("config schema");
        goto out;
    }
    /* YAML < INI < command line: fsdp-launch's accelerate YAML goes under the file, its own flags over it,
     * and this program's flags last. */
    const char *launch = settings_get_raw(SETTING_LAUNCH_CONFIG);
    if (config_apply_launch(cfg, launch, CONFIG_LAUNCH_UNDER_FILE) != 0) {
        status = fail("settings from fsdp-launch");
        goto out;
    }
    if (cli.n_positional == 1 && config_load_file(cfg, cli.positional[0]) != 0) {
        status = fail("config file");
        goto out;
    }
    if (config_apply_launch(cfg, launch, CONFIG_LAUNCH_OVER_FILE) != 0) {
        status = fail("settings from fsdp-launch");
        goto out;
    }
    if (config_cli_apply(&cli, cfg) != 0) {
        log_error("%s", error_message()); /* already says "command line: ..." */
        goto out;
    }
    /* Before the typed view: a Hugging Face init_from sets the [model] shape its config.json gives. */
    if (train_sources_apply(cfg) != 0) {
        status = fail("invalid config");
        goto out;
    }
    struct worker_config wc;
    if (worker_config_view(cfg, &wc) != 0) {
        status = fail("invalid config");
        goto out;
    }
    log_debug("config ok: %d layers, n_embd %d, fsdp version %d", wc.model.n_layer, wc.model.n_embd,
              wc.fsdp.version);
    if (cli.print_config) {
        status = config_print_ini_origins(cfg, stdout) == 0 ? 0 : fail("--print-config");
        goto out;
    }
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    if (!mem || config_print_ini(cfg, mem) != 0) {
        if (mem)
            fclose(mem);
        status = fail("config text");
        goto out;
    }
    fclose(mem);
    bool config_refused = false;
    int rc = run(&wc, text, &config_refused);
    if (rc) {
        if (!log_error_is_last(error_message())) /* a collective's failure is printed when it happens */
            log_error("%s", error_message());
        status = config_refused ? EXIT_CONFIG
                 : rc == FSDP_ECLOSED || rc == FSDP_EABORTED ? EXIT_PEER_FAILED
                                                           : EXIT_TRAIN;
    } else {
        status = 0;
    }
out:
    free(text);
    config_destroy(cfg);
    config_cli_free(&cli);
    return status;
}
