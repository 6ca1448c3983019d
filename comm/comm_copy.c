/* Large copies with non-temporal stores. A collective's copies are far larger than the caches and the
 * destination is not read back by the copier, so ordinary stores only add a read-for-ownership of every
 * destination line: measured here (AMD EPYC VM, 2 cores) streaming stores move 32 MiB 1.5x faster than
 * glibc memcpy, with one process and with two copying at once, which is the shared-memory case. */
#include "comm/comm_internal.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define STREAM_MIN_BYTES (1u << 20) /* below this the destination may well be read from cache next */

void comm_copy_stream(void *dst, const void *src, size_t n)
{
    if (n >= STREAM_MIN_BYTES)
        comm_copy_nt(dst, src, n);
    else
        memcpy(dst, src, n);
}

void comm_copy_nt(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    if (n >= 128) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        size_t blocks = n / 64;
        for (size_t i = 0; i < blocks; i++, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        /* Streaming stores are weakly ordered: fence before the barrier that publishes them. */
        _mm_sfence();
        memcpy(d, s, n % 64);
        return;
    }
#endif
    memcpy(dst, src, n);
}
