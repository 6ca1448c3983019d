/* What the tests of a kernels table share: the backend under test, device buffers filled from host arrays and
 * read back, a deterministic random source, tolerance checks that name the first bad element, and the
 * cross-entropy's loss sum, which the table adds to an accumulator in device memory (kernels.h), read back
 * here through a fresh zeroed one. Header-only, as Criterion's asserts must run in the test's own process;
 * include after <criterion/criterion.h>. */
#ifndef FSDP_TESTS_UTIL_TU_KERNELS_H
#define FSDP_TESTS_UTIL_TU_KERNELS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"

/* The kernels table under test: FSDP_KERNELS_BACKEND (default "cpu"); the test skips where that backend is
 * not usable here ("cuda" without a GPU: tu_gpu.h decides between a skip and a failure). */
static inline const struct kernels *tu_backend(void)
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
static inline double tu_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0; /* [0, 1) */
}

/* n floats uniform in [lo, hi), the same for a seed everywhere. */
static inline float *tu_host_rand(size_t n, uint64_t seed, float lo, float hi)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert(h);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * (float)tu_rand(&s);
    return h;
}

/* A buffer on the device of k filled from host (zeroed when host is NULL). */
static inline void *tu_dev_from(const struct kernels *k, const void *host, size_t bytes)
{
    void *d = k->mem_alloc(bytes);
    cr_assert(d, "%s mem_alloc(%zu): %s", k->name, bytes, error_message());
    if (host)
        cr_assert_eq(k->mem_copy(d, host, bytes, KERNELS_COPY_H2D), 0, "%s", error_message());
    else
        cr_assert_eq(k->mem_set(d, 0, bytes), 0, "%s", error_message());
    return d;
}

static inline float *tu_devf(const struct kernels *k, const float *host, size_t n)
{
    return tu_dev_from(k, host, n * sizeof(float));
}

/* Downloads bytes into a fresh host buffer (after a synchronize, so a kernel's error shows here). */
static inline void *tu_down(const struct kernels *k, const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    cr_assert(h);
    cr_assert_eq(k->synchronize(), 0, "%s synchronize: %s", k->name, error_message());
    cr_assert_eq(k->mem_copy(h, dev, bytes, KERNELS_COPY_D2H), 0, "%s", error_message());
    return h;
}

/* Downloads n floats into a fresh host array. */
static inline float *tu_downf(const struct kernels *k, const float *dev, size_t n)
{
    return tu_down(k, dev, n * sizeof(float));
}

/* |got - want| <= atol + rtol |want| for every element, else fail naming the element. */
static inline void tu_check_near(const char *what, const float *got, const double *want, size_t n, double atol,
                            double rtol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i])))
            cr_assert_fail("%s[%zu]: got %.9g, want %.9g (err %.3g > %.3g)", what, i, (double)got[i], want[i], err,
                    atol + rtol * fabs(want[i]));
    }
}

/* n zeroed doubles (a reference's accumulators). */
static inline double *tu_dzeros(size_t n)
{
    double *d = calloc(n ? n : 1, sizeof *d);
    cr_assert(d);
    return d;
}

/* crossentropy_forward_backward with *sum (host, may be NULL) = the loss sum of this call. The read back
 * synchronises, so a bad target the device found is returned here too. */
static inline int tu_xent(const struct kernels *k, float *losses, double *sum, float *dlogits, const float *logits,
                          const int32_t *targets, int n, int v, int vp, float dloss)
{
    double *acc = sum ? k->mem_alloc(sizeof *acc) : NULL;
    if (sum && !acc)
        return -1;
    int rc = acc ? k->mem_set(acc, 0, sizeof *acc) : 0;
    if (rc == 0)
        rc = k->crossentropy_forward_backward(losses, acc, dlogits, logits, targets, n, v, vp, dloss);
    if (rc == 0 && acc)
        rc = k->mem_copy(sum, acc, sizeof *sum, KERNELS_COPY_D2H);
    k->mem_free(acc);
    return rc;
}

#endif
