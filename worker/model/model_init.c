/* Deterministic parameter init. Every element is a pure function of (seed, parameter name, element
 * index) through a counter-based generator, so any rank can produce any slice of any parameter on its
 * own (sharded init) and get exactly the values a single process would. */
#include <math.h>
#include <string.h>

#include "common/error.h"
#include "worker/model/model.h"

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* A standard normal from one 64-bit counter value: Box-Muller on two 32-bit halves of its hash. */
static double normal_at(uint64_t key, uint64_t i)
{
    uint64_t r = splitmix64(key ^ splitmix64(i));
    double u1 = ((double)(r >> 32) + 0.5) / 4294967296.0; /* (0, 1): log never sees 0 */
    double u2 = (double)(r & 0xffffffffu) / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void model_init_param_range(const struct model_layout *l, int p, size_t begin, size_t count, float *dst)
{
    const struct model_param *pr = &l->params[p];
    uint64_t key = splitmix64(l->config.seed ^ name_hash(pr->name));
    size_t cols = (size_t)pr->shape[1], real = (size_t)pr->init_rows * cols;
    for (size_t j = 0; j < count; j++) {
        size_t i = begin + j;
        if (i >= real)
            dst[j] = 0.0f; /* vocabulary padding rows */
        else if (pr->init_std > 0)
            dst[j] = (float)(pr->init_std * normal_at(key, i));
        else
            dst[j] = pr->init_value;
    }
}

int model_init_params(const struct model_layout *l, float *host)
{
    if (l->config.init_from[0])
        return model_weights_load(l, l->config.init_from, host);
    for (int p = 0; p < l->n_params; p++)
        model_init_param_range(l, p, 0, l->params[p].numel, host + l->params[p].offset);
    return 0;
}
