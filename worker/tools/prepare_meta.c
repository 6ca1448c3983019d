#include "worker/tools/prepare_meta.h"

#include "common/error.h"
#include "worker/data/token_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole small file; ENOTFOUND (no message) when it does not exist. */
static int slurp(const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? FSDP_ENOTFOUND : error_set(FSDP_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *p = realloc(*data, cap + 1);
            if (!p) {
                rc = error_set(FSDP_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            *data = p;
        }
        size_t k = fread(*data + *len, 1, cap - *len, f);
        *len += k;
        if (k == 0)
            break;
    }
    if (ferror(f)) {
        rc = error_set(FSDP_EIO, "%s: read error", path);
        goto out;
    }
    (*data)[*len] = '\0';
out:
    fclose(f);
    return rc;
}

/* DIR(tokenizer_json)/name */
static char *beside(const char *tokenizer_json, const char *name)
{
    char *copy = strdup(tokenizer_json), *out = NULL;
    if (copy && asprintf(&out, "%s/%s", dirname(copy), name) < 0)
        out = NULL;
    free(copy);
    return out;
}

int prepare_meta_config_eos(const char *tokenizer_json, char **eos)
{
    *eos = NULL;
    char *path = beside(tokenizer_json, "tokenizer_config.json"), *data;
    size_t len;
    if (!path)
        return error_set(FSDP_ENOMEM, "out of memory");
    cJSON *root = NULL;
    int rc = slurp(path, &data, &len);
    if (rc == FSDP_ENOTFOUND) {
        rc = 0;
        goto out;
    }
    if (rc < 0)
        goto out;
    root = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(root)) {
        rc = error_set(FSDP_EINVAL, "%s: not a JSON object", path);
        goto out;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token");
    if (cJSON_IsObject(e))
        e = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (cJSON_IsString(e) && !(*eos = strdup(e->valuestring)))
        rc = error_set(FSDP_ENOMEM, "out of memory");
out:
    cJSON_Delete(root);
    free(data);
    free(path);
    return rc;
}

/* Copies the file `name` from beside the tokenizer into out_dir; 1 when there is none. */
static int copy_beside(const char *tokenizer_json, const char *src_name, const char *out_dir, const char *dst_name)
{
    char *path = strcmp(src_name, "tokenizer.json") == 0 ? strdup(tokenizer_json) : beside(tokenizer_json, src_name);
    char *data;
    size_t len;
    if (!path)
        return error_set(FSDP_ENOMEM, "out of memory");
    int rc = slurp(path, &data, &len);
    free(path);
    if (rc == 0)
        rc = token_file_write_small(out_dir, dst_name, data, len);
    free(data);
    return rc == FSDP_ENOTFOUND ? 1 : rc;
}

static int write_json(const char *dir, const char *name, cJSON *obj)
{
    char *text = obj ? cJSON_Print(obj) : NULL;
    if (!text)
        return error_set(FSDP_ENOMEM, "out of memory");
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return error_set(FSDP_ENOMEM, "out of memory");
    }
    line[n] = '\n';
    int rc = token_file_write_small(dir, name, line, n + 1);
    free(line);
    return rc;
}

static cJSON *token_obj(int64_t id, const char *text)
{
    if (id < 0)
        return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "id", (double)id);
    return o;
}

static int write_tokenizer_files(const struct prepare_meta *m)
{
    int rc = copy_beside(m->tokenizer_path, "tokenizer.json", m->out_dir, "tokenizer.json");
    if (rc != 0)
        return rc < 0 ? rc : error_set(FSDP_ENOTFOUND, "%s: vanished while preparing", m->tokenizer_path);
    rc = copy_beside(m->tokenizer_path, "special_tokens_map.json", m->out_dir, "special_tokens_map.json");
    if (rc < 0)
        return rc;
    rc = copy_beside(m->tokenizer_path, "tokenizer_config.json", m->out_dir, "tokenizer_config.json");
    if (rc <= 0)
        return rc;
    /* none to copy: one that transformers' AutoTokenizer reads, naming the separator the data uses */
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    if (m->eot >= 0)
        cJSON_AddStringToObject(cfg, "eos_token", m->eot_text);
    if (m->bos >= 0)
        cJSON_AddStringToObject(cfg, "bos_token", m->bos_text);
    cJSON_AddFalseToObject(cfg, "clean_up_tokenization_spaces");
    rc = write_json(m->out_dir, "tokenizer_config.json", cfg);
    cJSON_Delete(cfg);
    return rc;
}

int prepare_meta_write(const struct prepare_meta *m)
{
    if (m->tokenizer_path)
        FSDP_TRY(write_tokenizer_files(m));
    const struct prepare_stats *s = m->stats;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", PREPARE_META_VERSION);
    if (m->tokenizer_path) {
        cJSON_AddStringToObject(o, "tokenizer", "tokenizer.json");
        cJSON_AddStringToObject(o, "tokenizer_source", m->tokenizer_path);
        cJSON_AddStringToObject(o, "tokenizer_style", tokenizer_style(m->tok));
    } else {
        cJSON_AddNullToObject(o, "tokenizer");
        cJSON_AddNullToObject(o, "tokenizer_source");
        cJSON_AddStringToObject(o, "tokenizer_style", "bytes");
    }
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddItemToObject(o, "eot", token_obj(m->eot, m->eot_text));
    cJSON_AddItemToObject(o, "bos", token_obj(m->bos, m->bos_text));
    cJSON_AddStringToObject(o, "token_format", m->format == DATA_FORMAT_NANOGPT ? "nanogpt"
                                               : m->format == DATA_FORMAT_LLMC ? "llmc" : "llmc_u32");
    cJSON_AddNumberToObject(o, "token_bytes", data_format_token_bytes(m->format));
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    cJSON *t = cJSON_AddObjectToObject(files, "train.bin"), *v = cJSON_AddObjectToObject(files, "val.bin");
    cJSON_AddNumberToObject(t, "tokens", (double)s->train_tokens);
    cJSON_AddNumberToObject(t, "text_bytes", (double)s->train_bytes);
    cJSON_AddNumberToObject(v, "tokens", (double)s->val_tokens);
    cJSON_AddNumberToObject(v, "text_bytes", (double)s->val_bytes);
    cJSON *in = cJSON_AddObjectToObject(o, "inputs");
    cJSON_AddNumberToObject(in, "text_files", (double)s->text_files);
    cJSON_AddNumberToObject(in, "documents", (double)s->documents);
    cJSON_AddNumberToObject(in, "bad_lines_skipped", (double)s->bad_lines);
    cJSON_AddNumberToObject(in, "binary_skipped", (double)s->binary_skipped);
    cJSON_AddNumberToObject(in, "utf8_skipped", (double)s->utf8_skipped);
    cJSON_AddNumberToObject(in, "utf8_replaced", (double)s->utf8_replaced);
    cJSON_AddNumberToObject(in, "bytes", (double)s->input_bytes);
    cJSON_AddNumberToObject(in, "seconds", s->seconds);
    int rc = write_json(m->out_dir, PREPARE_META_FILE, o);
    cJSON_Delete(o);
    return rc;
}
