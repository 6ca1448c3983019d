/* Generic module-tree / parameter / unit bookkeeping that every family's layout builder uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model_internal.h"

/* Capacities 8, 16, 32, ...: reallocate exactly when n reaches the current capacity. */
static int reserve(void **arr, int n, size_t elem)
{
    if (n != 0 && (n < 8 || (n & (n - 1)) != 0))
        return 0;
    size_t cap = n ? (size_t)n * 2 : 8;
    void *p = realloc(*arr, cap * elem);
    if (!p)
        return error_set(FSDP_ENOMEM, "out of memory building the model layout");
    *arr = p;
    return 0;
}

int model_layout_add_module(struct model_layout *l, int parent, const char *name, const char *class_name)
{
    if (reserve((void **)&l->modules, l->n_modules, sizeof *l->modules) != 0)
        return FSDP_ENOMEM;
    struct model_module *m = &l->modules[l->n_modules];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->class_name = class_name;
    m->parent = parent;
    m->first_param = -1;
    return l->n_modules++;
}

int model_layout_add_unit(struct model_layout *l, const char *name, int module)
{
    if (reserve((void **)&l->units, l->n_units, sizeof *l->units) != 0)
        return FSDP_ENOMEM;
    struct model_unit *u = &l->units[l->n_units];
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->module = module;
    u->offset = l->numel;
    u->first_param = l->n_params;
    return l->n_units++;
}

int model_layout_add_param(struct model_layout *l, int mod, int unit, const char *name, int ndim, int d0,
                           int d1, bool decay, float init_std, float init_value)
{
    if (unit != l->n_units - 1)
        return error_set(FSDP_EINVAL, "layout: parameter %s added to unit %d, not the last unit", name, unit);
    struct model_module *m = &l->modules[mod];
    if (m->n_params && m->first_param + m->n_params != l->n_params)
        return error_set(FSDP_EINVAL, "layout: parameters of module %s are not consecutive", m->name);
    if (reserve((void **)&l->params, l->n_params, sizeof *l->params) != 0)
        return FSDP_ENOMEM;
    struct model_param *p = &l->params[l->n_params];
    memset(p, 0, sizeof *p);
    int w = snprintf(p->name, sizeof p->name, "%s%s%s", m->name, m->name[0] ? "." : "", name);
    if (w < 0 || (size_t)w >= sizeof p->name)
        return error_set(FSDP_EINVAL, "layout: parameter name %s.%s too long", m->name, name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)p->shape[1];
    p->offset = l->numel;
    p->unit_offset = l->numel - l->units[unit].offset;
    p->unit = unit;
    p->module = mod;
    p->weight_decay = decay;
    p->init_std = init_std;
    p->init_value = init_value;
    p->init_rows = d0;
    if (!m->n_params)
        m->first_param = l->n_params;
    m->n_params++;
    l->units[unit].numel += p->numel;
    l->units[unit].n_params++;
    l->numel += p->numel;
    return l->n_params++;
}

void model_layout_free(struct model_layout *l)
{
    if (!l)
        return;
    free(l->params);
    free(l->modules);
    free(l->units);
    memset(l, 0, sizeof *l);
}

int model_layout_find(const struct model_layout *l, const char *name)
{
    for (int i = 0; i < l->n_params; i++)
        if (strcmp(l->params[i].name, name) == 0)
            return i;
    return -1;
}

static bool module_in_class(const struct model_layout *l, int mod, const char *class_name)
{
    for (; mod >= 0; mod = l->modules[mod].parent)
        if (strcmp(l->modules[mod].class_name, class_name) == 0)
            return true;
    return false;
}

size_t model_layout_class_numel(const struct model_layout *l, const char *class_name)
{
    size_t n = 0;
    for (int i = 0; i < l->n_params; i++)
        if (module_in_class(l, l->params[i].module, class_name))
            n += (size_t)l->params[i].init_rows * l->params[i].shape[1];
    return n;
}
