#include "common/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC32C_X86 1
#include <nmmintrin.h>
#endif

/* Slicing-by-8: eight bytes per step with eight tables, several times faster than one table when the
 * instruction is missing (or under valgrind, which does not model it). */
static uint32_t crc_tables[8][256];
static pthread_once_t crc_tables_once = PTHREAD_ONCE_INIT;

static void crc32c_init_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_tables[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_tables[t][n] = (crc_tables[t - 1][n] >> 8) ^ crc_tables[0][crc_tables[t - 1][n] & 0xff];
}

uint32_t crc32c_update_table(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_tables_once, crc32c_init_tables);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); /* little-endian load; the project targets little-endian hosts only */
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc_tables[7][lo & 0xff] ^ crc_tables[6][(lo >> 8) & 0xff] ^ crc_tables[5][(lo >> 16) & 0xff] ^
            crc_tables[4][lo >> 24] ^ crc_tables[3][hi & 0xff] ^ crc_tables[2][(hi >> 8) & 0xff] ^
            crc_tables[1][(hi >> 16) & 0xff] ^ crc_tables[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ crc_tables[0][(c ^ *p++) & 0xff];
    return ~c;
}

#ifdef CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t crc32c_update_hw(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}

int crc32c_have_hw(void) { return __builtin_cpu_supports("sse4.2"); }
#else
uint32_t crc32c_update_hw(uint32_t crc, const void *buf, size_t len)
{
    return crc32c_update_table(crc, buf, len);
}

int crc32c_have_hw(void) { return 0; }
#endif

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
    /* Concurrent first calls all compute the same answer, so a relaxed atomic is enough. */
    static int have_hw = -1;
    int hw = __atomic_load_n(&have_hw, __ATOMIC_RELAXED);
    if (hw < 0) {
        hw = crc32c_have_hw();
        __atomic_store_n(&have_hw, hw, __ATOMIC_RELAXED);
    }
    return hw ? crc32c_update_hw(crc, buf, len) : crc32c_update_table(crc, buf, len);
}
