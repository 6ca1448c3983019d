/* A model's module classes as users name them (ours, Hugging Face's), which of them can be FSDP units,
 * and the per-class parameter table that `fsdp-worker --detect-blocks` prints. Everything comes from the
 * layout and the family's registry entry, so a new family needs no code here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

static const struct model_class_names *names_of(const struct model_layout *l, const char *class_name)
{
    const struct model_family *f = model_family_find(l->config.model_family);
    for (const struct model_class_names *n = f ? f->class_names : NULL; n && n->ours; n++)
        if (strcmp(n->ours, class_name) == 0)
            return n;
    return NULL;
}

const char *model_class_hf_name(const struct model_layout *l, const char *class_name)
{
    const struct model_class_names *n = names_of(l, class_name);
    return n && n->hf ? n->hf : class_name;
}

const char *model_class_resolve(const struct model_layout *l, const char *name)
{
    for (int m = 0; m < l->n_modules; m++) {
        const char *c = l->modules[m].class_name;
        const struct model_class_names *n = names_of(l, c);
        if (!strcasecmp(c, name) || (n && n->hf && !strcasecmp(n->hf, name)) ||
            (n && n->other && !strcasecmp(n->other, name)))
            return c;
    }
    return NULL;
}

static bool is_unit_module(const struct model_layout *l, int m)
{
    for (int u = 1; u < l->n_units; u++)
        if (l->units[u].module == m)
            return true;
    return false;
}

bool model_class_can_be_unit(const struct model_layout *l, const char *class_name)
{
    bool any = false;
    for (int m = 0; m < l->n_modules; m++) {
        if (strcmp(l->modules[m].class_name, class_name) != 0)
            continue;
        if (!is_unit_module(l, m))
            return false;
        any = true;
    }
    return any;
}

/* "DecoderBlock (Hugging Face: GPT2Block)" for each class that can be a unit, into buf. */
static void unit_classes(const struct model_layout *l, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int m = 0; m < l->n_modules && n < cap; m++) {
        const char *c = l->modules[m].class_name;
        if (!model_class_can_be_unit(l, c) || strstr(buf, c))
            continue;
        const char *hf = model_class_hf_name(l, c);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s%s%s%s", n ? ", " : "", c, strcmp(hf, c) ? " (Hugging Face: " : "",
                              strcmp(hf, c) ? hf : "", strcmp(hf, c) ? ")" : "");
    }
}

static void all_classes(const struct model_layout *l, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int m = 0; m < l->n_modules && n < cap; m++) {
        const char *c = l->modules[m].class_name;
        bool seen = false;
        for (int k = 0; k < m && !seen; k++)
            seen = strcmp(l->modules[k].class_name, c) == 0;
        if (!seen)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", c);
    }
}

int model_wrap_classes_check(const struct model_layout *l, const char *list)
{
    char units[512], classes[1024];
    unit_classes(l, units, sizeof units);
    all_classes(l, classes, sizeof classes);
    if (!list || !*list)
        return error_set(FSDP_EINVAL, "fsdp.transformer_layer_cls_to_wrap is empty; this model's unit class is %s",
                         units);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        while (*name == ' ' || *name == '\t')
            name++;
        size_t len = strlen(name);
        while (len && (name[len - 1] == ' ' || name[len - 1] == '\t'))
            name[--len] = 0;
        if (!len)
            return error_set(FSDP_EINVAL, "fsdp.transformer_layer_cls_to_wrap = %s: an empty name in the list", list);
        const char *cls = model_class_resolve(l, name);
        if (!cls)
            return error_set(FSDP_EINVAL,
                             "fsdp.transformer_layer_cls_to_wrap = %s: this %s model has no class '%s'; its classes "
                             "are %s, and the one that becomes a unit is %s",
                             list, l->config.model_family, name, classes, units);
        if (!model_class_can_be_unit(l, cls))
            return error_set(FSDP_EINVAL,
                             "fsdp.transformer_layer_cls_to_wrap = %s: %s cannot be an FSDP unit here: the units are "
                             "the root and one per block, so the class to wrap is %s",
                             list, cls, units);
    }
    return 0;
}

static size_t real_numel(const struct model_param *p) { return (size_t)p->init_rows * (size_t)p->shape[1]; }

static int cmp_rows(const void *x, const void *y)
{
    const struct model_class_row *a = x, *b = y;
    if (a->params_total != b->params_total)
        return a->params_total > b->params_total ? -1 : 1;
    return strcmp(a->class_name, b->class_name);
}

int model_class_table(const struct model_layout *l, struct model_class_row **rows, int *n)
{
    *rows = NULL;
    *n = 0;
    size_t *sub = calloc((size_t)(l->n_modules > 0 ? l->n_modules : 1), sizeof *sub);
    struct model_class_row *r = calloc((size_t)(l->n_modules > 0 ? l->n_modules : 1), sizeof *r);
    if (!sub || !r) {
        free(sub);
        free(r);
        return error_set(FSDP_ENOMEM, "out of memory building the class table");
    }
    for (int p = 0; p < l->n_params; p++)
        for (int m = l->params[p].module; m >= 0; m = l->modules[m].parent)
            sub[m] += real_numel(&l->params[p]);
    int k = 0;
    for (int m = 0; m < l->n_modules; m++) {
        const struct model_module *mod = &l->modules[m];
        if (!sub[m])
            continue;
        int i = 0;
        while (i < k && strcmp(r[i].class_name, mod->class_name) != 0)
            i++;
        if (i == k) {
            r[k].class_name = mod->class_name;
            r[k].hf_name = model_class_hf_name(l, mod->class_name);
            r[k].params_min = sub[m];
            r[k].is_root = mod->parent < 0;
            r[k].can_be_unit = model_class_can_be_unit(l, mod->class_name);
            snprintf(r[k].example, sizeof r[k].example, "%s", mod->name[0] ? mod->name : "(root)");
            k++;
        }
        r[i].count++;
        if (sub[m] < r[i].params_min)
            r[i].params_min = sub[m];
        if (sub[m] > r[i].params_max)
            r[i].params_max = sub[m];
        bool nested = false;
        for (int a = mod->parent; a >= 0 && !nested; a = l->modules[a].parent)
            nested = strcmp(l->modules[a].class_name, mod->class_name) == 0;
        if (!nested)
            r[i].params_total += sub[m];
    }
    free(sub);
    qsort(r, (size_t)k, sizeof *r, cmp_rows);
    *rows = r;
    *n = k;
    return 0;
}
