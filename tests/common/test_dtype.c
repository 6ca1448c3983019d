/* One dtype home (common/dtype.h), every conversion path giving the same bits: the scalar functions, the
 * kernels table's cast op (CPU; CUDA where a GPU is usable) and the collectives' reduction, which loads
 * bf16/f16 into an f32 accumulator and rounds back. Every one of the 65,536 16-bit patterns goes to f32,
 * back, and to the other 16-bit type; four million generated floats (specials, NaN payloads, subnormals,
 * ties on both formats, the overflow edges) go to bf16 and f16. Independent checks anchor the common
 * answer: bf16 is the top half of f32, f16 values computed in double, f32 -> bf16 rounding against the
 * nearer neighbour in double, and the compiler's _Float16 conversions where the compiler has them. The
 * other forms of bf16 rounding in dtype.h (branch-free scalar, 16 AVX-512 lanes) give dtype_f32_to_bf16's
 * bits. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
/* dtype.h's 16-lane AVX-512 rounding too, where this compiler can build it (it runs only on AVX-512 CPUs) */
#if defined(__x86_64__) && defined(__GNUC__)
#define DTYPE_AVX512 1
#endif
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/kernels.h"
#include "tests/util/tu_gpu.h"

#if defined(__FLT16_MAX__) && defined(__x86_64__)
#define HAVE_COMPILER_F16 1
#endif

enum { NPAT = 65536, NRAND = 1 << 22, MAXK = 30 };

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

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float to_f32(enum dtype t, uint16_t h)
{
    return t == DTYPE_BF16 ? dtype_bf16_to_f32(h) : dtype_f16_to_f32(h);
}

static uint16_t from_f32(enum dtype t, float f)
{
    return t == DTYPE_BF16 ? dtype_f32_to_bf16(f) : dtype_f32_to_f16(f);
}

static bool is_nan16(enum dtype t, uint16_t h)
{
    return t == DTYPE_BF16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f) : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

/* The f32 bits of 16-bit pattern h, without dtype.h: bf16 is the top half of an f32; an f16 number is
 * m * 2^(e-25) (normal) or m * 2^-24 (subnormal), computed in double; an f16 NaN keeps its payload. */
static uint32_t ref_f32_bits(enum dtype t, uint16_t h)
{
    if (t == DTYPE_BF16)
        return (uint32_t)h << 16;
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31)
        return sign | 0x7f800000u | ((uint32_t)m << 13);
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return sign | bits_of((float)v);
}

/* f32 -> bf16 without bit tricks: the nearer of the two bf16 neighbours in double, ties to even. */
static uint16_t ref_bf16(float f)
{
    uint32_t u = bits_of(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (isnan(f))
        return lo | 0x40;
    if ((u & 0xffff) == 0)
        return lo;
    double hv = (hi & 0x7fff) == 0x7f80 ? copysign(0x1p128, f) : (double)float_of((uint32_t)hi << 16);
    double dlo = fabs((double)f - (double)float_of((uint32_t)lo << 16)), dhi = fabs((double)f - hv);
    return dlo < dhi || (dlo == dhi && !(lo & 1)) ? lo : hi;
}

/* The kernels table's cast of n elements, through the table's own memory. */
static void table_cast(const struct kernels *k, void *dst, enum dtype dt, const void *src, enum dtype st, size_t n)
{
    size_t sb = n * dtype_size(st), db = n * dtype_size(dt);
    void *ds = k->mem_alloc(sb), *dd = k->mem_alloc(db);
    cr_assert(ds && dd, "%s mem_alloc: %s", k->name, error_message());
    cr_assert_eq(k->mem_copy(ds, src, sb, KERNELS_COPY_H2D), 0, "%s", error_message());
    cr_assert_eq(k->cast(dd, dt, ds, st, n), 0, "%s cast %s -> %s: %s", k->name, dtype_name(st), dtype_name(dt),
                 error_message());
    cr_assert_eq(k->synchronize(), 0, "%s", error_message());
    cr_assert_eq(k->mem_copy(dst, dd, db, KERNELS_COPY_D2H), 0, "%s", error_message());
    k->mem_free(ds);
    k->mem_free(dd);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    cr_assert(p, "out of memory for %zu bytes", n);
    return p;
}

/* Every pattern h of type t: to f32, back to t (the collectives' single-source reduction too, when
 * with_comm), and to the other 16-bit type. */
static void check_patterns(const struct kernels *k, enum dtype t, bool with_comm)
{
    enum dtype o = t == DTYPE_BF16 ? DTYPE_F16 : DTYPE_BF16;
    uint16_t *h = xmalloc(NPAT * 2), *back_k = xmalloc(NPAT * 2), *cross_k = xmalloc(NPAT * 2);
    uint16_t *back_c = xmalloc(NPAT * 2), *back_cs = xmalloc(NPAT * 2);
    float *f_k = xmalloc(NPAT * 4);
    for (uint32_t i = 0; i < NPAT; i++)
        h[i] = (uint16_t)i;
    table_cast(k, f_k, DTYPE_F32, h, t, NPAT);
    table_cast(k, back_k, t, f_k, DTYPE_F32, NPAT);
    table_cast(k, cross_k, o, h, t, NPAT);
    if (with_comm) {
        const void *srcs[1] = {h};
        comm_reduce_arrays(t, COMM_SUM, srcs, 1, back_c, NPAT, 1);
        comm_reduce_arrays_stream(t, COMM_SUM, srcs, 1, back_cs, NPAT, 1);
    }
    for (uint32_t i = 0; i < NPAT; i++) {
        uint16_t p = (uint16_t)i;
        float fs = to_f32(t, p);
        uint32_t want = ref_f32_bits(t, p);
        cr_assert_eq(bits_of(fs), want, "%s %#06x -> f32 %#010x, want %#010x", dtype_name(t), i, bits_of(fs), want);
        cr_assert_eq(bits_of(f_k[i]), want, "%s cast %s %#06x -> f32 %#010x, want %#010x", k->name, dtype_name(t), i,
                     bits_of(f_k[i]), want);
        /* back: the same pattern; a NaN comes back quiet with its payload */
        uint16_t want_back = is_nan16(t, p) ? (uint16_t)(p | (t == DTYPE_BF16 ? 0x40 : 0x200)) : p;
        cr_assert_eq(from_f32(t, fs), want_back, "%s %#06x round trip %#06x", dtype_name(t), i, from_f32(t, fs));
        cr_assert_eq(back_k[i], want_back, "%s cast round trip of %s %#06x: %#06x", k->name, dtype_name(t), i,
                     back_k[i]);
        if (with_comm) {
            cr_assert_eq(back_c[i], want_back, "comm reduction of %s %#06x: %#06x", dtype_name(t), i, back_c[i]);
            cr_assert_eq(back_cs[i], want_back, "comm streaming reduction of %s %#06x: %#06x", dtype_name(t), i,
                         back_cs[i]);
        }
        uint16_t want_cross = from_f32(o, fs);
        cr_assert_eq(cross_k[i], want_cross, "%s cast %s %#06x -> %s %#06x, want %#06x", k->name, dtype_name(t), i,
                     dtype_name(o), cross_k[i], want_cross);
        if (o == DTYPE_BF16)
            cr_assert_eq(want_cross, ref_bf16(fs), "f16 %#06x -> bf16 %#06x, reference %#06x", i, want_cross,
                         ref_bf16(fs));
#ifdef HAVE_COMPILER_F16
        /* The compiler's conversions: the same f16 value and the same round trip (its f16 -> f32 sets the
         * quiet bit of a signalling NaN, which dtype.h leaves as it is). */
        if (t == DTYPE_F16) {
            _Float16 hv;
            memcpy(&hv, &p, 2);
            volatile float fc = (float)hv; /* two conversions: not folded into none */
            uint32_t quiet = is_nan16(t, p) ? 0x00400000u : 0;
            cr_assert_eq(bits_of(fc), want | quiet, "f16 %#06x: compiler gives f32 %#010x", i, bits_of(fc));
            _Float16 rt = (_Float16)fc;
            uint16_t rb;
            memcpy(&rb, &rt, 2);
            cr_assert_eq(rb, want_back, "f16 %#06x: compiler round trip %#06x", i, rb);
        }
#endif
    }
    free(h), free(back_k), free(cross_k), free(back_c), free(back_cs), free(f_k);
}

/* Floats that matter to one format or the other, from seed: any bit pattern, ties (and their neighbours)
 * of bf16, of normal f16 and of subnormal f16, f16-range values, f32 subnormals, the overflow edges, and
 * NaN/inf with every kind of payload; fixed specials first. */
static float *gen_floats(size_t n, uint64_t seed)
{
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,
        0x7fbfffff, 0x7f802000, 0x7fa00000, 0x7f801fff, 0x00000001, 0x80000001, 0x007fffff, 0x00800000,
        0x00008000, 0x00018000, 0x7f7fffff, 0xff7fffff, 0x7f7f7fff, 0x7f7f8000, 0x7f7f8001, 0x7f7effff,
        0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0xc77ff000, 0x3f800000, 0x3f808000,
        0x3f818000, 0x3f801000, 0x3f803000, 0x38800000, 0x387fe000, 0x387ff000, 0x33800000, 0x33000000,
        0x33000001, 0x32ffffff, 0x33c00000, 0x33a00000, 0x387fc000, 0x38000000, 0xb3000001, 0x3c7ff000,
    };
    float *v = xmalloc(n * 4);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = splitmix(&s);
        uint32_t lo = (uint32_t)r, hi = (uint32_t)(r >> 32), sign = hi & 0x80000000u, u;
        int adj = (int)((hi >> 8) % 3) - 1; /* -1, 0, +1 ulp around a tie */
        switch (i % 8) {
        case 0: u = lo; break;
        case 1: u = (uint32_t)((int64_t)((lo & 0xffff0000u) | 0x8000u) + adj); break;
        case 2: u = sign | ((uint32_t)(127 - 30 + (int)(hi % 48)) << 23) | (lo & 0x7fffffu); break;
        case 3: u = sign | ((uint32_t)(127 - 14 + (int)(hi % 30)) << 23) | (lo & 0x7fe000u) | 0x1000u;
                u = (uint32_t)((int64_t)u + adj); break;
        case 4: { /* exponents -25..-15: the bit of weight 2^-25 is half an f16 subnormal unit */
            int e = -25 + (int)(hi % 11), j = -2 - e; /* mantissa bit of weight 2^-25 (23 = the implicit one) */
            uint32_t m = lo & 0x7fffffu;
            if (j < 23)
                m = (m & ~((2u << j) - 1u)) | (1u << j);
            else
                m = 0;
            u = (uint32_t)((int64_t)(sign | ((uint32_t)(127 + e) << 23) | m) + adj);
            break;
        }
        case 5: u = sign | (lo & 0x7fffffu); break;
        case 6: {
            static const uint32_t base[] = {0x477fe000, 0x7f7f0000, 0x387f0000, 0x33000000, 0x337fe000};
            u = sign | (base[hi % 5] + (lo & 0x1ffffu));
            break;
        }
        default: u = sign | 0x7f800000u | ((hi & 15) == 0 ? 0 : (lo & 0x7fffffu)); break;
        }
        v[i] = float_of(i < sizeof(specials) / sizeof(specials[0]) ? specials[i] : u);
    }
    return v;
}

/* Truncations (towards zero) to a 16-bit type: the pieces the collectives' reduction sums back to a float. */
static uint16_t trunc16(enum dtype t, float f)
{
    uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, x = u & 0x7fffffffu;
    if (t == DTYPE_BF16)
        return (uint16_t)(u >> 16);
    if (x >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (x > 0x7f800000u ? (x >> 13) & 0x3ffu : 0));
    if (x >= 0x477fe000u) /* 65504 and up: the largest finite f16 */
        return (uint16_t)(sign | 0x7bffu);
    if (x >= 0x38800000u)
        return (uint16_t)(sign | ((x - 0x38000000u) >> 13));
    return (uint16_t)(sign | (uint32_t)(fabsf(f) * 0x1p24f)); /* subnormal: whole units of 2^-24 */
}

/* Three t pieces and a power-of-two divisor 2^k whose reduction ((p0 + p1) + p2) / 2^k is v exactly for
 * bf16 when |v| >= 2^-100 (or 0), and for f16 when 2^-31 <= |v| < 65536 (or 0): v scaled into
 * [0.5, 65536) for f16, then peeled into leading bits. Other v still give some float, the one the
 * reduction rounds. Returns k; *exact says whether v itself is reached. */
static int pieces(enum dtype t, float v, uint16_t p[3], bool *exact)
{
    uint16_t zero = signbit(v) ? 0x8000 : 0;
    float a = fabsf(v);
    int k = 0;
    if (t == DTYPE_F16 && isfinite(v) && v != 0 && a < 65536.0f) {
        int e = ilogbf(v);
        k = e < -1 ? -1 - e : 0;
        k = k > MAXK ? MAXK : k;
    }
    *exact = isfinite(v) && (v == 0 || (t == DTYPE_BF16 ? a >= 0x1p-100f : a >= 0x1p-31f && a < 65536.0f));
    float r = ldexpf(v, k);
    for (int j = 0; j < 3; j++) {
        if (!isfinite(r) || r == 0) {
            p[j] = j == 0 ? trunc16(t, r) : zero;
            r = 0;
            continue;
        }
        p[j] = trunc16(t, r);
        r -= to_f32(t, p[j]);
    }
    return k;
}

/* Four million floats to type t: the scalar function, the table's cast and an independent reference
 * agree; with_comm: the reduction of each float's pieces rounds to what the scalar function gives for
 * the float it sums to, which is the float itself wherever pieces() says so. */
static void check_random(const struct kernels *k, enum dtype t, bool with_comm, uint64_t seed)
{
    float *v = gen_floats(NRAND, seed);
    uint16_t *out_k = xmalloc(NRAND * 2);
    table_cast(k, out_k, t, v, DTYPE_F32, NRAND);
    for (size_t i = 0; i < NRAND; i++) {
        uint16_t s = from_f32(t, v[i]);
        cr_assert_eq(out_k[i], s, "%s cast f32 %#010x -> %s %#06x, scalar %#06x", k->name, bits_of(v[i]),
                     dtype_name(t), out_k[i], s);
        if (t == DTYPE_BF16) {
            cr_assert_eq(s, ref_bf16(v[i]), "f32 %#010x -> bf16 %#06x, reference %#06x", bits_of(v[i]), s,
                         ref_bf16(v[i]));
        } else {
#ifdef HAVE_COMPILER_F16
            _Float16 hv = (_Float16)v[i];
            uint16_t hb;
            memcpy(&hb, &hv, 2);
            cr_assert_eq(s, hb, "f32 %#010x -> f16 %#06x, compiler %#06x", bits_of(v[i]), s, hb);
#endif
        }
    }
    if (with_comm) {
        /* Group the floats by divisor: one reduction per group, sources p0, p1, p2. */
        int *kk = xmalloc(NRAND * sizeof(int));
        bool *exact = xmalloc(NRAND);
        uint16_t (*pc)[3] = xmalloc(NRAND * sizeof(*pc));
        size_t count[MAXK + 1] = {0}, covered = 0;
        for (size_t i = 0; i < NRAND; i++) {
            kk[i] = pieces(t, v[i], pc[i], &exact[i]);
            count[kk[i]]++;
        }
        uint16_t *p[3], *out = xmalloc(NRAND * 2);
        for (int j = 0; j < 3; j++)
            p[j] = xmalloc(NRAND * 2);
        size_t *idx = xmalloc(NRAND * sizeof(size_t));
        for (int g = 0; g <= MAXK; g++) {
            size_t n = 0;
            for (size_t i = 0; i < NRAND; i++)
                if (kk[i] == g) {
                    for (int j = 0; j < 3; j++)
                        p[j][n] = pc[i][j];
                    idx[n++] = i;
                }
            cr_assert_eq(n, count[g]);
            if (n == 0)
                continue;
            const void *srcs[3] = {p[0], p[1], p[2]};
            int divisor = 1 << g;
            comm_reduce_arrays(t, COMM_SUM, srcs, 3, out, n, divisor);
            for (size_t m = 0; m < n; m++) {
                size_t i = idx[m];
                float sum = to_f32(t, p[0][m]); /* the reduction's order: source 0, then 1, then 2 */
                sum += to_f32(t, p[1][m]);
                sum += to_f32(t, p[2][m]);
                if (divisor > 1)
                    sum /= (float)divisor;
                if (exact[i]) {
                    cr_assert_eq(bits_of(sum), bits_of(v[i]), "pieces of %s %#010x sum to %#010x", dtype_name(t),
                                 bits_of(v[i]), bits_of(sum));
                    covered++;
                }
                uint16_t want = from_f32(t, sum);
                cr_assert_eq(out[m], want, "comm reduction to %s of f32 %#010x (pieces %#06x %#06x %#06x / %d): "
                             "%#06x, scalar %#06x", dtype_name(t), bits_of(sum), p[0][m], p[1][m], p[2][m], divisor,
                             out[m], want);
                if (exact[i])
                    cr_assert_eq(out[m], out_k[i], "comm and %s cast differ on f32 %#010x", k->name,
                                 bits_of(v[i]));
            }
        }
        /* A third or more of the floats reach the reduction unchanged (all finite ones but the smallest
         * for bf16; for f16 those in [2^-31, 65536), which most generated floats aim at). */
        cr_assert_gt(covered, (size_t)NRAND / 3, "only %zu of %d floats reached the reduction exactly", covered,
                     NRAND);
        free(kk), free(exact), free(pc), free(out), free(idx);
        for (int j = 0; j < 3; j++)
            free(p[j]);
    }
    free(v), free(out_k);
}

Test(dtype, sizes_and_names)
{
    cr_assert_eq(dtype_size(DTYPE_F32), 4);
    cr_assert_eq(dtype_size(DTYPE_BF16), 2);
    cr_assert_eq(dtype_size(DTYPE_F16), 2);
    cr_assert_str_eq(dtype_name(DTYPE_F32), "f32");
    cr_assert_str_eq(dtype_name(DTYPE_BF16), "bf16");
    cr_assert_str_eq(dtype_name(DTYPE_F16), "f16");
    cr_assert_str_eq(dtype_name((enum dtype)9), "?");
    cr_assert(dtype_valid(DTYPE_F16) && !dtype_valid((enum dtype)3) && !dtype_valid((enum dtype)-1));
}

Test(dtype, every_bf16_pattern_on_every_path)
{
    check_patterns(kernels_cpu(), DTYPE_BF16, true);
}

Test(dtype, every_f16_pattern_on_every_path)
{
    check_patterns(kernels_cpu(), DTYPE_F16, true);
}

Test(dtype, random_floats_to_bf16_on_every_path, .timeout = 120)
{
    check_random(kernels_cpu(), DTYPE_BF16, true, 2024);
}

Test(dtype, random_floats_to_f16_on_every_path, .timeout = 120)
{
    check_random(kernels_cpu(), DTYPE_F16, true, 2025);
}

#ifdef DTYPE_AVX512
/* dtype_f32x16_to_bf16_hi over n floats (n a multiple of 16), the bf16 of each lane narrowed to 16 bits. */
__attribute__((target("avx512f"))) static void round_avx512(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __m512i hi = dtype_f32x16_to_bf16_hi(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)));
    }
}
#endif

/* The branch-free scalar form (the CPU's bulk rounding, kernels/cpu/lowp.c) and the AVX-512 form (the
 * attention tiles' operands) against dtype_f32_to_bf16: the generated floats (NaN with every kind of
 * payload, inf, subnormals, ties and their neighbours, the overflow edge) and every upper half with the
 * lower halves that decide the rounding (0, just below, at and above the tie, all ones), which covers
 * every exponent's ties and every NaN's top payload bits. */
Test(dtype, every_bf16_rounding_form_gives_the_same_bits, .timeout = 120)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    enum { NLOW = sizeof(lows) / sizeof(lows[0]), NALL = NRAND + NPAT * NLOW };
    float *v = gen_floats(NALL, 2026);
    for (size_t i = 0; i < (size_t)NPAT * NLOW; i++)
        v[NRAND + i] = float_of((uint32_t)(i / NLOW) << 16 | lows[i % NLOW]);
    uint16_t *want = xmalloc((size_t)NALL * 2), *got = xmalloc((size_t)NALL * 2);
    for (size_t i = 0; i < NALL; i++) {
        want[i] = dtype_f32_to_bf16(v[i]);
        got[i] = dtype_f32_bits_to_bf16(bits_of(v[i]));
        cr_assert_eq(got[i], want[i], "dtype_f32_bits_to_bf16(0x%08x) = 0x%04x, dtype_f32_to_bf16 gives 0x%04x",
                     bits_of(v[i]), got[i], want[i]);
    }
#ifdef DTYPE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        _Static_assert(NALL % 16 == 0, "whole vectors");
        memset(got, 0, (size_t)NALL * 2);
        round_avx512(got, v, NALL);
        for (size_t i = 0; i < NALL; i++)
            cr_assert_eq(got[i], want[i], "dtype_f32x16_to_bf16_hi(0x%08x) = 0x%04x, dtype_f32_to_bf16 gives 0x%04x",
                         bits_of(v[i]), got[i], want[i]);
    } else {
        cr_log_info("no AVX-512 on this CPU: the 16-lane form was not run");
    }
#endif
    free(v), free(want), free(got);
}

/* The CUDA table's cast, compiled by nvcc from the same header: the same bits (skips without a GPU). */
Test(dtype, cuda_cast_gives_the_same_bits, .timeout = 120)
{
    const struct kernels *k = kernels_get("cuda");
    if (!k)
        TU_GPU_UNAVAILABLE("no CUDA kernels here: %s", error_message());
    check_patterns(k, DTYPE_BF16, false);
    check_patterns(k, DTYPE_F16, false);
    check_random(k, DTYPE_BF16, false, 2024);
    check_random(k, DTYPE_F16, false, 2025);
}
