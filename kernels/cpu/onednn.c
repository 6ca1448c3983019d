/* oneDNN in the CPU backend: what oneDNN can run on this CPU (asked once, of oneDNN itself), its engine and
 * stream, and matmul primitives cached per shape.
 *
 * A primitive is made for one exact problem (dtypes, shapes, strides, alpha, beta, bias): creating one
 * costs from tens of microseconds to milliseconds (oneDNN picks an implementation and JIT-compiles its
 * kernels), executing one of the shapes here costs a few. A training step calls the same dozen shapes
 * every step, so each is made once and found again by its key; the cache holds CPU_MM_CACHE of them and
 * drops the least recently used beyond that.
 *
 * oneDNN runs on the OpenMP runtime the backend already uses (Debian's build links libgomp): its threads
 * are OpenMP's, so OMP_NUM_THREADS bounds it like every other op, and a call from inside a parallel
 * region runs on the calling thread. */
#include <dnnl.h>
#include <pthread.h>
#include <string.h>

#include "common/error.h"
#include "common/settings.h"
#include "kernels/cpu/cpu.h"

#define CPU_MM_CACHE 256

struct mm_key {
    int dt; /* enum dtype of a and b */
    int ta, tb, has_bias;
    int m, n, k, lda, ldb, ldc;
    uint32_t alpha_bits, beta_bits;
};

struct mm_entry {
    struct mm_key key;
    bool used;
    uint64_t last_use;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias;
};

static struct {
    pthread_once_t once;
    int status; /* 0 = usable, else the enum fsdp_error the engine's creation failed with */
    char why[256];
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct cpu_isa isa;
    pthread_mutex_t lock;
    struct mm_entry cache[CPU_MM_CACHE];
    uint64_t clock;
    struct cpu_onednn_stats stats;
} g = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    /* most capable first: each value's bits include those of the ones it extends */
    static const struct {
        dnnl_cpu_isa_t isa;
        const char *name;
    } names[] = {
        {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},   {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
        {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"}, {dnnl_cpu_isa_avx512_core, "avx512_core"},
        {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},               {dnnl_cpu_isa_avx2, "avx2"},
        {dnnl_cpu_isa_avx, "avx"},                           {dnnl_cpu_isa_sse41, "sse41"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((isa & names[i].isa) == names[i].isa)
            return names[i].name;
    return "baseline";
}

static void onednn_init(void)
{
    /* The test hook caps oneDNN before anything else uses it (the cap only takes before the first JIT
     * kernel), so the fallback runs exactly what a CPU without bf16 instructions would. */
    if (settings_bool(SETTING_TEST_CPU_NO_BF16))
        g.isa.capped = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core) == dnnl_success;
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    snprintf(g.isa.name, sizeof g.isa.name, "%s", isa_name(isa));
    g.isa.avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    /* AVX512_BF16's dot products (and AMX's tiles, whose ISA value includes these bits) run bf16 matmuls
     * at twice the fp32 rate; without them oneDNN would emulate bf16 more slowly than fp32 runs. */
    g.isa.bf16 = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    dnnl_status_t st = dnnl_engine_create(&g.engine, dnnl_cpu, 0);
    if (st == dnnl_success)
        st = dnnl_stream_create(&g.stream, g.engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        g.status = FSDP_EUNSUPPORTED;
        snprintf(g.why, sizeof g.why, "oneDNN could not create its CPU engine (status %d)", (int)st);
        g.isa.avx512 = g.isa.bf16 = false;
        return;
    }
    g.isa.usable = true;
}

const struct cpu_isa *cpu_isa_get(void)
{
    pthread_once(&g.once, onednn_init);
    return &g.isa;
}

struct cpu_onednn_stats cpu_onednn_stats_get(void)
{
    pthread_mutex_lock(&g.lock);
    struct cpu_onednn_stats s = g.stats;
    pthread_mutex_unlock(&g.lock);
    return s;
}

static dnnl_data_type_t dnnl_dt(int dt)
{
    return dt == DTYPE_BF16 ? dnnl_bf16 : dt == DTYPE_F16 ? dnnl_f16 : dnnl_f32;
}

static void entry_drop(struct mm_entry *e)
{
    if (!e->used)
        return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    if (e->bias)
        dnnl_memory_destroy(e->bias);
    memset(e, 0, sizeof *e);
}

/* Makes the primitive of key into e; 0 or an error naming the shape. */
static int entry_make(struct mm_entry *e, const struct mm_key *key, float alpha, float beta)
{
    dnnl_memory_desc_t ad, bd, cd, biasd;
    dnnl_dims_t adims = {key->m, key->k}, bdims = {key->k, key->n}, cdims = {key->m, key->n}, bias_dims = {1, key->n};
    /* a transposed operand is the same matrix read with its strides swapped */
    dnnl_dims_t as = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    dnnl_dims_t bs = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1};
    dnnl_dims_t cs = {key->ldc, 1}, bias_s = {key->n, 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&ad, 2, adims, dnnl_dt(key->dt), as);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&bd, 2, bdims, dnnl_dt(key->dt), bs);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&cd, 2, cdims, dnnl_f32, cs);
    if (st == dnnl_success && key->has_bias)
        st = dnnl_memory_desc_init_by_strides(&biasd, 2, bias_dims, dnnl_f32, bias_s);
    if (st == dnnl_success)
        st = dnnl_matmul_desc_init(&md, &ad, &bd, key->has_bias ? &biasd : NULL, &cd);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success && alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    if (st == dnnl_success && beta != 0.0f) {
        /* C = alpha op(A) op(B) + beta C: the accumulation is a sum post-op over the old C */
        st = dnnl_post_ops_create(&po);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_sum(po, beta);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &md, attr, g.engine, NULL);
    if (st == dnnl_success)
        st = dnnl_primitive_create(&e->prim, pd);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->a, &ad, g.engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->b, &bd, g.engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->c, &cd, g.engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && key->has_bias)
        st = dnnl_memory_create(&e->bias, &biasd, g.engine, DNNL_MEMORY_NONE);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    e->used = true;
    e->key = *key;
    if (st != dnnl_success) {
        entry_drop(e);
        return error_set(FSDP_EUNSUPPORTED,
                         "kernels cpu: oneDNN has no %s matmul for m=%d n=%d k=%d (transposed a %d, b %d; lda %d ldb "
                         "%d ldc %d): status %d",
                         dtype_name((enum dtype)key->dt), key->m, key->n, key->k, key->ta, key->tb, key->lda, key->ldb,
                         key->ldc, (int)st);
    }
    return 0;
}

/* The cached entry of key, made now when missing (evicting the least recently used when full); called with
 * the lock held. */
static int entry_find(const struct mm_key *key, float alpha, float beta, struct mm_entry **out)
{
    struct mm_entry *free_slot = NULL, *oldest = NULL;
    for (int i = 0; i < CPU_MM_CACHE; i++) {
        struct mm_entry *e = &g.cache[i];
        if (!e->used) {
            if (!free_slot)
                free_slot = e;
            continue;
        }
        if (memcmp(&e->key, key, sizeof *key) == 0) {
            e->last_use = ++g.clock;
            g.stats.hits++;
            *out = e;
            return 0;
        }
        if (!oldest || e->last_use < oldest->last_use)
            oldest = e;
    }
    struct mm_entry *e = free_slot;
    if (!e) {
        e = oldest;
        entry_drop(e);
        g.stats.evicted++;
    }
    FSDP_TRY(entry_make(e, key, alpha, beta));
    e->last_use = ++g.clock;
    g.stats.created++;
    *out = e;
    return 0;
}

int cpu_onednn_matmul(enum dtype dt, int ta, int tb, int m, int n, int k, float alpha, const void *a, int lda,
                      const void *b, int ldb, float beta, float *c, int ldc, const float *bias)
{
    const struct cpu_isa *isa = cpu_isa_get();
    if (!isa->usable)
        return error_set(FSDP_EUNSUPPORTED, "kernels cpu: %s", g.why);
    struct mm_key key;
    memset(&key, 0, sizeof key); /* the key is compared with memcmp: no stray padding bytes */
    key.dt = (int)dt;
    key.ta = !!ta;
    key.tb = !!tb;
    key.has_bias = bias != NULL;
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    memcpy(&key.alpha_bits, &alpha, sizeof alpha);
    memcpy(&key.beta_bits, &beta, sizeof beta);
    pthread_mutex_lock(&g.lock);
    struct mm_entry *e;
    int rc = 0;
    FSDP_TRY_GOTO(entry_find(&key, alpha, beta, &e), rc, out);
    /* The memory objects of an entry are re-pointed at this call's buffers, so executions of one entry are
     * serialised by the lock (a training step calls from one thread anyway). */
    dnnl_memory_set_data_handle(e->a, (void *)a);
    dnnl_memory_set_data_handle(e->b, (void *)b);
    dnnl_memory_set_data_handle(e->c, c);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int nargs = 3;
    if (bias) {
        dnnl_memory_set_data_handle(e->bias, (void *)bias);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->bias};
    }
    dnnl_status_t st = dnnl_primitive_execute(e->prim, g.stream, nargs, args);
    if (st == dnnl_success)
        st = dnnl_stream_wait(g.stream);
    g.stats.executed++;
    if (st != dnnl_success)
        rc = error_set(FSDP_EIO, "kernels cpu: oneDNN %s matmul m=%d n=%d k=%d failed: status %d", dtype_name(dt), m,
                       n, k, (int)st);
out:
    pthread_mutex_unlock(&g.lock);
    return rc;
}

void cpu_onednn_cache_clear(void)
{
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < CPU_MM_CACHE; i++)
        entry_drop(&g.cache[i]);
    pthread_mutex_unlock(&g.lock);
}
