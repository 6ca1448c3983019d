/* Engine memory: persistent shards allocated once, and transient buffers (gathered units, unsharded
 * gradients, staging) from a free list. Blocks of a transformer have equal sizes, so after the first
 * step every request is met by a buffer of exactly that size and the steady state allocates nothing
 * (page faults of fresh allocations would otherwise cost as much as the copies). Every byte is counted
 * in a category, for the plan, the progress line and the end-of-run report. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "worker/fsdp/fsdp_internal.h"

static const char *const mem_names[FSDP_MEM_COUNT] = {"params", "grads", "optimizer", "gathered params",
                                                      "unsharded grads", "comm buffers", "activations"};

const char *fsdp_mem_name(enum fsdp_mem m)
{
    return (unsigned)m < FSDP_MEM_COUNT ? mem_names[m] : "?";
}

void fsdp_mem_add(struct fsdp *f, enum fsdp_mem cat, ptrdiff_t bytes)
{
    f->mem.now[cat] = (size_t)((ptrdiff_t)f->mem.now[cat] + bytes);
    if (f->mem.now[cat] > f->mem.peak[cat])
        f->mem.peak[cat] = f->mem.now[cat];
    size_t total = 0;
    for (int i = 0; i < FSDP_MEM_COUNT; i++)
        total += f->mem.now[i];
    if (total > f->mem.peak_total)
        f->mem.peak_total = total;
}

void *fsdp_raw_alloc(struct fsdp *f, size_t bytes)
{
    void *p = f->reg ? comm_mem_alloc(f->reg, bytes ? bytes : 64) : f->k->mem_alloc(bytes ? bytes : 64);
    if (!p)
        error_set(FSDP_ENOMEM, "fsdp: cannot allocate %zu bytes: %s", bytes, error_message());
    return p;
}

void fsdp_raw_free(struct fsdp *f, void *p)
{
    if (f->reg)
        comm_mem_free(f->reg, p);
    else
        f->k->mem_free(p);
}

void *fsdp_buf_get(struct fsdp *f, size_t bytes, enum fsdp_mem cat)
{
    if (bytes == 0)
        bytes = 64;
    /* The smallest free buffer that fits with at most a quarter to spare: a unit's gathered, packed and
     * padded buffers differ by a few rows of padding, and an exact-size match kept one of each resident
     * (a 144-layer model held 29 MiB more in the pool than it ever had in use). */
    int best = -1;
    for (int i = 0; i < f->n_pool; i++)
        if (!f->pool[i].used && f->pool[i].bytes >= bytes && f->pool[i].bytes - bytes <= bytes / 4 &&
            (best < 0 || f->pool[i].bytes < f->pool[best].bytes))
            best = i;
    if (best < 0) {
        if (f->n_pool == f->cap_pool) {
            int cap = f->cap_pool ? 2 * f->cap_pool : 16;
            struct fsdp_pool_buf *np = realloc(f->pool, (size_t)cap * sizeof *np);
            if (!np) {
                error_set(FSDP_ENOMEM, "fsdp: out of memory");
                return NULL;
            }
            f->pool = np;
            f->cap_pool = cap;
        }
        void *p = fsdp_raw_alloc(f, bytes);
        if (!p)
            return NULL;
        best = f->n_pool++;
        f->pool[best] = (struct fsdp_pool_buf){.ptr = p, .bytes = bytes};
        f->mem.pool_held += bytes;
    }
    f->pool[best].used = true;
    f->pool[best].cat = cat;
    fsdp_mem_add(f, cat, (ptrdiff_t)f->pool[best].bytes);
    return f->pool[best].ptr;
}

void fsdp_buf_put(struct fsdp *f, void *ptr)
{
    if (!ptr)
        return;
    for (int i = 0; i < f->n_pool; i++)
        if (f->pool[i].ptr == ptr && f->pool[i].used) {
            f->pool[i].used = false;
            fsdp_mem_add(f, f->pool[i].cat, -(ptrdiff_t)f->pool[i].bytes);
            return;
        }
}

int fsdp_state_to_dev(struct fsdp *f, void *dev, const void *state, size_t bytes)
{
    return f->k->mem_copy(dev, state, bytes, f->offload ? KERNELS_COPY_H2D : KERNELS_COPY_D2D);
}

int fsdp_dev_to_state(struct fsdp *f, void *state, const void *dev, size_t bytes)
{
    return f->k->mem_copy(state, dev, bytes, f->offload ? KERNELS_COPY_D2H : KERNELS_COPY_D2D);
}

int fsdp_state_accumulate(struct fsdp *f, float *state, const float *dev, size_t n)
{
    if (!f->offload)
        return f->k->axpy(state, 1.0f, dev, n);
    /* Through the pinned buffer made with the state: the copy runs at bus speed, straight into it. */
    FSDP_TRY(f->k->mem_copy(f->host_stage, dev, n * sizeof(float), KERNELS_COPY_D2H));
    return f->sk->axpy(state, 1.0f, f->host_stage, n);
}

void fsdp_pool_free(struct fsdp *f)
{
    for (int i = 0; i < f->n_pool; i++)
        fsdp_raw_free(f, f->pool[i].ptr);
    free(f->pool);
    f->pool = NULL;
    f->n_pool = f->cap_pool = 0;
}
