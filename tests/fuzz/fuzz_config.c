/* libFuzzer target: the INI loader with the worker's schema (config_load_string, then worker_config_view),
 * which every fsdp-worker runs on a user's file. Beyond not crashing, a text that loads must survive a
 * round trip: its effective configuration printed (--print-config), loaded into a fresh config and printed
 * again gives the same text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "worker/config/worker_config.h"

static char *print(struct config *cfg)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f)
        return NULL;
    int rc = config_print_ini(cfg, f);
    fclose(f);
    if (rc != 0) {
        free(out);
        return NULL;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0'; /* a NUL inside is where the loader's text ends, as config_load_file refuses it */
    struct config *cfg = NULL;
    if (config_create(worker_config_schema(), &cfg) != 0)
        abort();
    if (config_load_string(cfg, text, "fuzz.ini") == 0) {
        struct worker_config wc;
        worker_config_view(cfg, &wc);
        char *once = print(cfg);
        struct config *again = NULL;
        if (!once || config_create(worker_config_schema(), &again) != 0)
            abort();
        if (config_load_string(again, once, "printed.ini") != 0) {
            fprintf(stderr, "printed config does not load back:\n%s\n", once);
            abort();
        }
        char *twice = print(again);
        if (!twice || strcmp(once, twice) != 0) {
            fprintf(stderr, "print/load/print differs:\n%s\n---\n%s\n", once, twice ? twice : "(null)");
            abort();
        }
        free(twice);
        free(once);
        config_destroy(again);
    }
    config_destroy(cfg);
    free(text);
    return 0;
}
