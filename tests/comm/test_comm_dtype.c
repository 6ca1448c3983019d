/* dtype conversions and the reduction kernel every CPU path uses. */
#include "comm/comm_internal.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

Test(comm_dtype, sizes_and_names)
{
    cr_assert_eq(dtype_size(DTYPE_F32), 4);
    cr_assert_eq(dtype_size(DTYPE_BF16), 2);
    cr_assert_eq(dtype_size(DTYPE_F16), 2);
    cr_assert_str_eq(dtype_name(DTYPE_BF16), "bf16");
}

Test(comm_dtype, bf16_round_to_nearest_even)
{
    cr_assert_eq(dtype_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(dtype_bf16_to_f32(0x3f80), 1.0f);
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0) */
    cr_assert_eq(dtype_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1.0078125 + 2^-8 is halfway to 1.015625: ties to even (0x3f82) */
    cr_assert_eq(dtype_f32_to_bf16(1.0078125f + 0x1p-8f), 0x3f82);
    cr_assert_eq(dtype_f32_to_bf16(-2.0f), 0xc000);
    cr_assert(isnan(dtype_bf16_to_f32(dtype_f32_to_bf16(NAN))));
    cr_assert(isinf(dtype_bf16_to_f32(dtype_f32_to_bf16(INFINITY))));
}

Test(comm_dtype, f16_conversions)
{
    cr_assert_eq(dtype_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(dtype_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(dtype_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(dtype_f32_to_f16(1e6f), 0x7c00); /* overflow to inf */
    cr_assert_eq(dtype_f16_to_f32(0x0001), 0x1p-24f); /* smallest subnormal */
    cr_assert_eq(dtype_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
}

Test(comm_dtype, f32_sum_order_is_source_order)
{
    /* Values where the order shows: (1e8 + -1e8) + 1 = 1 but 1e8 + (-1e8 + 1) = 0 in f32; the kernel must
     * add source 0, then 1, then 2. */
    float a[3] = {1e8f, 1.0f, 1e8f}, b[3] = {-1e8f, 1e8f, 1.0f}, c[3] = {1.0f, -1e8f, -1e8f}, out[3];
    const void *srcs[3] = {a, b, c};
    comm_reduce_arrays(DTYPE_F32, COMM_SUM, srcs, 3, out, 3, 1);
    for (int i = 0; i < 3; i++) {
        float ref = (a[i] + b[i]) + c[i];
        cr_assert_eq(memcmp(&ref, &out[i], 4), 0, "elem %d: %g vs %g", i, (double)out[i], (double)ref);
    }
    cr_assert_eq(out[0], 1.0f);
    cr_assert_eq(out[1], 0.0f);
}

Test(comm_dtype, bf16_accumulates_in_f32_and_rounds_once)
{
    /* 256 + 1 + 1 in bf16 arithmetic would stay 256 (1 is below half an ulp twice); in f32 it is 258. */
    uint16_t x[3] = {dtype_f32_to_bf16(256.0f), dtype_f32_to_bf16(256.0f), dtype_f32_to_bf16(256.0f)};
    uint16_t y[3] = {dtype_f32_to_bf16(1.0f), dtype_f32_to_bf16(2.0f), dtype_f32_to_bf16(-1.0f)};
    uint16_t z[3] = {dtype_f32_to_bf16(1.0f), dtype_f32_to_bf16(3.0f), dtype_f32_to_bf16(5.0f)};
    uint16_t out[3];
    const void *srcs[3] = {x, y, z};
    comm_reduce_arrays(DTYPE_BF16, COMM_SUM, srcs, 3, out, 3, 1);
    cr_assert_eq(dtype_bf16_to_f32(out[0]), 258.0f);
    cr_assert_eq(dtype_bf16_to_f32(out[1]), 260.0f); /* 261 rounds to even 260 */
    cr_assert_eq(dtype_bf16_to_f32(out[2]), 260.0f);
    comm_reduce_arrays(DTYPE_BF16, COMM_SUM, srcs, 3, out, 3, 3); /* AVG: one division then one rounding */
    cr_assert_eq(dtype_bf16_to_f32(out[0]), dtype_bf16_to_f32(dtype_f32_to_bf16(258.0f / 3.0f)));
    comm_reduce_arrays(DTYPE_BF16, COMM_MAX, srcs, 3, out, 3, 1);
    cr_assert_eq(dtype_bf16_to_f32(out[1]), 256.0f);
}

Test(comm_dtype, f16_avg_and_aliasing)
{
    enum { N = 5000 }; /* more than one internal block */
    uint16_t a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = dtype_f32_to_f16((float)(i % 100));
        b[i] = dtype_f32_to_f16((float)(i % 7) * 0.5f);
    }
    const void *srcs[2] = {a, b};
    comm_reduce_arrays(DTYPE_F16, COMM_SUM, srcs, 2, a, N, 2); /* dst aliases a */
    for (int i = 0; i < N; i++) {
        float ref = ((float)(i % 100) + (float)(i % 7) * 0.5f) / 2.0f;
        cr_assert_eq(dtype_f16_to_f32(a[i]), dtype_f16_to_f32(dtype_f32_to_f16(ref)), "elem %d", i);
    }
}
