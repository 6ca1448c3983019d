/* dtype casts: round to nearest even checked against an exact double-based reference (and against the
 * compiler's _Float16 where it has one), inf/nan, subnormals, overflow, and every f16 value through the
 * backend's cast op. */
#include "tests/util/tu_kernels.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference f32 -> bf16 without bit tricks: pick the nearer of the two bf16 neighbours in double,
 * ties to the even mantissa. */
static uint16_t ref_bf16(float f)
{
    if (isnan(f))
        return 0x7fc0 | (uint16_t)((bits_of(f) >> 16) & 0x8000);
    uint32_t u = bits_of(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = fabs((double)f - (double)float_of((uint32_t)lo << 16));
    double dhi = isinf(float_of((uint32_t)hi << 16)) ? fabs((double)f - ldexp(1.0, 128) * (f < 0 ? -1 : 1))
                                                      : fabs((double)f - (double)float_of((uint32_t)hi << 16));
    if ((u & 0xffff) == 0)
        return lo;
    if (dlo < dhi || (dlo == dhi && !(lo & 1)))
        return lo;
    return hi;
}

/* Reference f16 value of bits h, in double. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25));
    return (h & 0x8000) ? -v : v;
}

/* Reference f32 -> f16 by search: nearest finite f16 (ties to even), or inf past 65520. */
static uint16_t ref_f16(float f)
{
    if (isnan(f))
        return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint16_t best = 0;
    double bestd = INFINITY;
    /* magnitudes are monotonic in the bits: binary search for the neighbours */
    int lo = 0, hi = 0x7bff;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int c = lo; c <= lo + 1 && c <= 0x7bff; c++) {
        double d = fabs(f16_value((uint16_t)c) - a);
        if (d < bestd || (d == bestd && !(c & 1)))
            best = (uint16_t)c, bestd = d;
    }
    return sign | best;
}

Test(kernels_cast, bf16_special_values)
{
    cr_assert_eq(dtype_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(dtype_f32_to_bf16(-2.0f), 0xc000);
    cr_assert_eq(dtype_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(dtype_f32_to_bf16(-INFINITY), 0xff80);
    uint16_t qn = dtype_f32_to_bf16(float_of(0x7f800001)); /* signalling NaN with low payload only */
    cr_assert((qn & 0x7f80) == 0x7f80 && (qn & 0x7f) != 0, "NaN became %#x", qn);
    cr_assert(isnan(dtype_bf16_to_f32(qn)));
    /* ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even (1) wins; 1 + 3*2^-8 rounds up */
    cr_assert_eq(dtype_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(dtype_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* largest float rounds to inf; subnormals survive */
    cr_assert_eq(dtype_f32_to_bf16(3.4028235e38f), 0x7f80);
    cr_assert_eq(dtype_f32_to_bf16(float_of(0x00010000)), 0x0001);
    cr_assert_eq(dtype_bf16_to_f32(0x0001), float_of(0x00010000));
    cr_assert_eq(dtype_f32_to_bf16(-0.0f), 0x8000);
}

Test(kernels_cast, bf16_matches_reference_on_many_floats)
{
    uint64_t s = 77;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)(tu_rand(&s) * 4294967296.0);
        if (i & 1)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties are rare at random: make half of them ties */
        float f = float_of(u);
        if (isnan(f))
            continue;
        uint16_t got = dtype_f32_to_bf16(f), want = ref_bf16(f);
        cr_assert_eq(got, want, "f32 %#x -> bf16 %#x, want %#x", u, got, want);
    }
}

Test(kernels_cast, f16_special_values)
{
    cr_assert_eq(dtype_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(dtype_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(dtype_f32_to_f16(65519.99f), 0x7bff);
    cr_assert_eq(dtype_f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(dtype_f32_to_f16(-1e10f), 0xfc00);
    cr_assert_eq(dtype_f32_to_f16(INFINITY), 0x7c00);
    cr_assert(isnan(dtype_f16_to_f32(dtype_f32_to_f16(NAN))));
    cr_assert_eq(dtype_f32_to_f16(0x1p-24f), 0x0001);         /* smallest subnormal */
    cr_assert_eq(dtype_f32_to_f16(0x1p-25f), 0x0000);         /* tie to even: 0 */
    cr_assert_eq(dtype_f32_to_f16(0x1.8p-24f), 0x0002);       /* 1.5 ulp tie: to even 2 */
    cr_assert_eq(dtype_f32_to_f16(0x1.000002p-25f), 0x0001);  /* just above the tie */
    cr_assert_eq(dtype_f32_to_f16(0x1.ff8p-15f), 0x03ff);     /* largest subnormal, exact */
    cr_assert_eq(dtype_f32_to_f16(0x1.ffcp-15f), 0x0400);     /* tie above it: to even, the smallest normal */
    cr_assert_eq(dtype_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(dtype_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(dtype_f16_to_f32(0x03ff), 0x3ffp-24f);
    cr_assert_eq(dtype_f16_to_f32(0xfc00), -INFINITY);
}

Test(kernels_cast, f16_every_value_round_trips_and_random_floats_round_right)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dtype_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        if (isnan(want)) {
            cr_assert(isnan(f), "f16 %#x should be NaN", h);
            continue;
        }
        cr_assert_eq((double)f, want, "f16 %#x -> %g, want %g", h, (double)f, want);
        cr_assert_eq(dtype_f32_to_f16(f), h, "round trip of f16 %#x", h);
    }
    uint64_t s = 99;
    for (int i = 0; i < 300000; i++) {
        /* exponents around the f16 range, including subnormal and overflow territory */
        float f = ldexpf((float)tu_rand(&s) + 0.5f, (int)(tu_rand(&s) * 50) - 30);
        if (i & 1)
            f = -f;
        if (i % 3 == 0) /* force a tie: keep 11 bits (+ subnormal shifts) and set the next one */
            f = float_of((bits_of(f) & 0xffffe000u) | 0x1000u);
        uint16_t got = dtype_f32_to_f16(f), want = ref_f16(f);
        cr_assert_eq(got, want, "f32 %a -> f16 %#x, want %#x", (double)f, got, want);
#if defined(__FLT16_MAX__) && defined(__x86_64__)
        _Float16 hv = (_Float16)f; /* the compiler's own conversion as a second opinion */
        uint16_t hb;
        memcpy(&hb, &hv, 2);
        cr_assert_eq(got, hb, "f32 %a -> f16 %#x, compiler says %#x", (double)f, got, hb);
#endif
    }
}

Test(kernels_cast, table_cast_all_pairs)
{
    const struct kernels *k = tu_backend();
    const size_t n = 70000;
    float *src = tu_host_rand(n, 5, -70000, 70000);
    src[0] = NAN, src[1] = INFINITY, src[2] = -0.0f, src[3] = 1e-30f, src[4] = 0x1p-20f;
    enum dtype ty[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    void *hsrc[3], *hdst = malloc(n * 4);
    cr_assert(hdst);
    for (int a = 0; a < 3; a++) {
        hsrc[a] = malloc(n * 4);
        cr_assert(hsrc[a]);
        for (size_t i = 0; i < n; i++) {
            if (a == 0)
                ((float *)hsrc[a])[i] = src[i];
            else
                ((uint16_t *)hsrc[a])[i] = a == 1 ? dtype_f32_to_bf16(src[i]) : dtype_f32_to_f16(src[i]);
        }
    }
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            void *ds = tu_dev_from(k, hsrc[a], n * dtype_size(ty[a]));
            void *dd = tu_dev_from(k, NULL, n * dtype_size(ty[b]));
            cr_assert_eq(k->cast(dd, ty[b], ds, ty[a], n), 0, "%s", error_message());
            cr_assert_eq(k->mem_copy(hdst, dd, n * dtype_size(ty[b]), KERNELS_COPY_D2H), 0);
            for (size_t i = 0; i < n; i++) {
                float v = a == 0 ? ((float *)hsrc[a])[i]
                                 : (a == 1 ? dtype_bf16_to_f32(((uint16_t *)hsrc[a])[i])
                                           : dtype_f16_to_f32(((uint16_t *)hsrc[a])[i]));
                if (b == 0) {
                    float got = ((float *)hdst)[i];
                    cr_assert((isnan(v) && isnan(got)) || bits_of(got) == bits_of(v), "%d->%d [%zu]", a, b, i);
                } else {
                    uint16_t want = b == 1 ? dtype_f32_to_bf16(v) : dtype_f32_to_f16(v);
                    uint16_t got = ((uint16_t *)hdst)[i];
                    cr_assert_eq(got, want, "%d->%d [%zu]: %#x want %#x", a, b, i, got, want);
                }
            }
            k->mem_free(ds), k->mem_free(dd);
        }
    cr_assert_eq(k->cast(hdst, (enum dtype)7, hsrc[0], DTYPE_F32, 1), FSDP_EINVAL);
    for (int a = 0; a < 3; a++)
        free(hsrc[a]);
    free(hdst), free(src);
}
