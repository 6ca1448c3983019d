#include "worker/tools/run_tokenizer.h"

#include "common/error.h"
#include "common/fs.h"
#include "worker/tools/prepare_meta.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdbool.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    if (n >= 2 && ((s[0] == '"' && s[n - 1] == '"') || (s[0] == '\'' && s[n - 1] == '\''))) {
        s[n - 1] = '\0';
        s++;
    }
    return s;
}

int run_config_value(const char *config_text, const char *section, const char *key, char *out, size_t cap)
{
    if (!config_text)
        return FSDP_ENOTFOUND;
    bool in = false;
    int rc = FSDP_ENOTFOUND;
    for (const char *p = config_text; *p && rc == FSDP_ENOTFOUND;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, n);
        if (!line)
            return error_set(FSDP_ENOMEM, "out of memory");
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (e) {
                *e = '\0';
                in = strcmp(trim(s + 1), section) == 0;
            }
        } else if (in && *s != '#' && *s != ';') {
            char *eq = strchr(s, '=');
            if (eq) {
                *eq = '\0';
                const char *v = trim(eq + 1);
                if (strcmp(trim(s), key) == 0 && *v) {
                    snprintf(out, cap, "%s", v);
                    rc = 0;
                }
            }
        }
        free(line);
        p += n + (nl != NULL);
    }
    return rc;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* What DATA_DIR/meta.json says: 1 with the tokenizer path, 0 for byte-level tokens, -1 with no usable
 * meta.json. */
static int from_meta(const char *data_dir, char *out, size_t cap)
{
    char path[FSDP_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", data_dir, PREPARE_META_FILE);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    const cJSON *tok = root ? cJSON_GetObjectItemCaseSensitive(root, "tokenizer") : NULL;
    int rc = -1;
    if (cJSON_IsNull(tok)) {
        rc = 0;
    } else if (cJSON_IsString(tok)) {
        snprintf(out, cap, "%s/%s", data_dir, tok->valuestring);
        rc = 1;
    }
    cJSON_Delete(root);
    return rc;
}

int run_tokenizer_find(const char *ckpt_dir, const char *config_text, char *out, size_t cap)
{
    char path[FSDP_PATH_MAX];
    if (ckpt_dir) {
        snprintf(path, sizeof path, "%s/tokenizer.json", ckpt_dir);
        if (is_file(path)) {
            snprintf(out, cap, "%s", path);
            return 0;
        }
    }
    char train[FSDP_PATH_MAX];
    int rc = run_config_value(config_text, "data", "train_file", train, sizeof train);
    if (rc == FSDP_ENOTFOUND)
        return error_set(FSDP_ENOTFOUND, "no tokenizer.json in %s and no [data] train_file in its config",
                         ckpt_dir ? ckpt_dir : "the checkpoint");
    if (rc < 0)
        return rc;
    char *dir = dirname(train);
    int m = from_meta(dir, path, sizeof path);
    if (m == 0)
        return error_set(FSDP_ENOTFOUND, "%s/%s says the run's tokens are bytes (no tokenizer)", dir,
                         PREPARE_META_FILE);
    if (m < 0)
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!is_file(path))
        return error_set(FSDP_ENOTFOUND, "no tokenizer at %s (beside the run's train_file)", path);
    snprintf(out, cap, "%s", path);
    return 0;
}
