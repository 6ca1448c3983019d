/* Helpers shared by the kernels tests: the backend under test (FSDP_KERNELS_BACKEND, default "cpu"; the
 * test skips when that backend is not usable here, e.g. "cuda" without a GPU), device buffers filled from
 * host arrays, a deterministic random source, and tolerance checks that name the first bad element. */
#ifndef FSDP_TESTS_KERNELS_KTEST_H
#define FSDP_TESTS_KERNELS_KTEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"

static inline const struct kernels *kt_backend(void)
{
    const char *name = getenv("FSDP_KERNELS_BACKEND");
    if (!name || !*name)
        name = "cpu";
    const struct kernels *k = kernels_get(name);
    if (!k && strcmp(name, "cuda") == 0)
        TU_GPU_UNAVAILABLE("kernels backend \"cuda\" is not available here: %s", error_message());
    if (!k)
        cr_skip_test("kernels backend \"%s\" is not available here: %s", name, error_message());
    return k;
}

/* xorshift64*: reproducible across runs and platforms, unlike rand(). */
static inline double kt_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0; /* [0, 1) */
}

static inline float *kt_host_rand(size_t n, uint64_t seed, float lo, float hi)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * (float)kt_rand(&s);
    return h;
}

static inline void *kt_dev_from(const struct kernels *k, const void *host, size_t bytes)
{
    void *d = k->mem_alloc(bytes);
    cr_assert(d, "mem_alloc(%zu): %s", bytes, error_message());
    if (host)
        cr_assert_eq(k->mem_copy(d, host, bytes, KERNELS_COPY_H2D), 0, "%s", error_message());
    else
        cr_assert_eq(k->mem_set(d, 0, bytes), 0, "%s", error_message());
    return d;
}

static inline float *kt_devf(const struct kernels *k, const float *host, size_t n)
{
    return kt_dev_from(k, host, n * sizeof(float));
}

/* Downloads n floats into a fresh host array. */
static inline float *kt_down(const struct kernels *k, const float *dev, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h);
    cr_assert_eq(k->synchronize(), 0);
    cr_assert_eq(k->mem_copy(h, dev, n * sizeof *h, KERNELS_COPY_D2H), 0, "%s", error_message());
    return h;
}

/* |got - want| <= atol + rtol |want| for every element, else fail naming the element. */
static inline void kt_check(const char *what, const float *got, const double *want, size_t n, double atol,
                            double rtol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i])))
            cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g > %.3g)", what, i, (double)got[i], want[i], err,
                    atol + rtol * fabs(want[i]));
    }
}

static inline double *kt_dzeros(size_t n)
{
    double *d = calloc(n ? n : 1, sizeof *d);
    cr_assert(d);
    return d;
}

#endif
