/* config.json in and out, Hugging Face parameter names and a tokenizer's special ids: the generic part of
 * Hugging Face interchange (model_hf.h); the family's registry entry supplies its keys and names. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/fs.h"
#include "worker/model/model_hf_internal.h"

/* config.json and tokenizer.json are small; a larger file is not one of them. */
#define JSON_MAX_BYTES (256u << 20)

bool model_hf_is_dir(const char *path)
{
    char p[FSDP_PATH_MAX + 32];
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    snprintf(p, sizeof p, "%s/%s", path, MODEL_HF_CONFIG);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The whole file as a NUL-terminated string. */
static int slurp(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(errno == ENOENT ? FSDP_ENOTFOUND : FSDP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > JSON_MAX_BYTES) {
        rc = error_set(FSDP_EINVAL, "%s: not a JSON file of at most %u MiB", path, JSON_MAX_BYTES >> 20);
        goto out;
    }
    if (!(buf = malloc((size_t)st.st_size + 1))) {
        rc = error_set(FSDP_ENOMEM, "out of memory reading %s", path);
        goto out;
    }
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        rc = error_set(FSDP_EIO, "%s: read failed", path);
        goto out;
    }
    buf[st.st_size] = '\0';
    *out = buf;
    buf = NULL;
out:
    fclose(f);
    free(buf);
    return rc;
}

static int parse_json(const char *path, cJSON **out)
{
    char *text;
    FSDP_TRY(slurp(path, &text));
    *out = cJSON_Parse(text);
    free(text);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return error_set(FSDP_EINVAL, "%s: not a JSON object", path);
    }
    return 0;
}

int model_hf_config_read(const char *dir, struct model_hf_config *out)
{
    memset(out, 0, sizeof *out);
    int n = snprintf(out->path, sizeof out->path, "%s/%s", dir, MODEL_HF_CONFIG);
    if (n < 0 || (size_t)n >= sizeof out->path)
        return error_set(FSDP_ERANGE, "%s: path too long", dir);
    cJSON *root;
    FSDP_TRY(parse_json(out->path, &root));
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *a = cJSON_IsArray(arch) && cJSON_IsString(cJSON_GetArrayItem(arch, 0))
                        ? cJSON_GetArrayItem(arch, 0)->valuestring
                        : NULL;
    const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
    const struct model_family *f = model_family_find_hf(a, t, out->path);
    int rc = 0;
    if (!f) {
        rc = FSDP_EUNSUPPORTED;
        goto out;
    }
    model_config_default(&out->config);
    snprintf(out->config.model_family, sizeof out->config.model_family, "%s", f->name);
    struct model_hf_json j = {.root = root, .path = out->path, .out = out};
    FSDP_TRY_GOTO(f->hf->config_read(&j, &out->config), rc, out);
out:
    cJSON_Delete(root);
    return rc;
}

int model_hf_config_write(const struct model_layout *l, const char *dir, const struct model_hf_tokens *tokens,
                          const char *torch_dtype)
{
    const struct model_family *f = model_family_find(l->config.model_family);
    if (!f)
        return FSDP_EINVAL;
    if (!f->hf)
        return error_set(FSDP_EUNSUPPORTED, "model_family %s has no Hugging Face config.json", f->name);
    struct model_hf_tokens none = {-1, -1};
    cJSON *o = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    char *text = NULL;
    int rc = 0;
    if (!o || !arch || !cJSON_AddItemToArray(arch, cJSON_CreateString(f->hf->architecture)) ||
        !cJSON_AddItemToObject(o, "architectures", arch)) {
        cJSON_Delete(arch);
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    /* "dtype" is transformers 5's key, "torch_dtype" the one 4.x reads */
    if (!cJSON_AddStringToObject(o, "model_type", f->hf->model_type) ||
        !cJSON_AddStringToObject(o, "dtype", torch_dtype) || !cJSON_AddStringToObject(o, "torch_dtype", torch_dtype)) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    FSDP_TRY_GOTO(f->hf->config_write(&l->config, tokens ? tokens : &none, o), rc, out);
    if (!(text = cJSON_Print(o))) {
        rc = error_set(FSDP_ENOMEM, "out of memory");
        goto out;
    }
    char path[FSDP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, MODEL_HF_CONFIG);
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: the file ends with a newline, the buffer is written by length */
    FSDP_TRY_GOTO(fs_write_atomic(path, text, len + 1), rc, out);
out:
    free(text);
    cJSON_Delete(o);
    return rc;
}

void model_hf_param_name(const struct model_layout *l, int p, char *out, size_t cap)
{
    const struct model_family *f = model_family_find(l->config.model_family);
    const char *prefix = f && f->hf ? f->hf->prefix : "";
    snprintf(out, cap, "%s%s", prefix, l->params[p].name);
}

static bool one_of(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0)
            return true;
    return false;
}

int model_hf_tokenizer_tokens(const char *path, struct model_hf_tokens *out)
{
    static const char *const eos_names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", NULL};
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "<|startoftext|>", NULL};
    out->bos = out->eos = -1;
    cJSON *root;
    FSDP_TRY(parse_json(path, &root));
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *t;
    cJSON_ArrayForEach(t, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(t, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valueint < 0)
            continue;
        if (out->eos < 0 && one_of(content->valuestring, eos_names))
            out->eos = id->valueint;
        if (out->bos < 0 && one_of(content->valuestring, bos_names))
            out->bos = id->valueint;
    }
    if (out->bos < 0)
        out->bos = out->eos;
    cJSON_Delete(root);
    return 0;
}
