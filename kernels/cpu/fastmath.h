/* A vectorisable expf for the softmax, attention and GELU loops: libm's expf is a call the compiler cannot
 * vectorise, and these loops are otherwise memory-bound. Max relative error ~2 ulp over the clamped
 * range; inputs below -87.3 give exactly 0 (masked scores use -INFINITY and must contribute nothing). */
#ifndef FSDP_KERNELS_CPU_FASTMATH_H
#define FSDP_KERNELS_CPU_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float fastmath_expf(float x)
{
    const float lo = -87.3f, hi = 88.3f;
    int underflow = x < lo;
    float xc = x < lo ? lo : (x > hi ? hi : x);
    /* Round x/ln2 to nearest with the 1.5*2^23 trick: no floorf (not vectorisable on baseline x86-64). */
    float t = xc * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f;
    /* Cody-Waite: ln2 split in two so r = x - n ln2 stays exact-ish. */
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    y *= scale;
    return underflow ? 0.0f : y;
}

#endif
