#include "common/crc32c.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* RFC 3720 (iSCSI) appendix B.4 vectors plus the classic check value. */
static void check_vectors(uint32_t (*fn)(uint32_t, const void *, size_t))
{
    cr_assert_eq(fn(0, "123456789", 9), 0xE3069283u);
    unsigned char buf[32];
    memset(buf, 0, sizeof buf);
    cr_assert_eq(fn(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    cr_assert_eq(fn(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    cr_assert_eq(fn(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    cr_assert_eq(fn(0, buf, 32), 0x113FDB5Cu);
    cr_assert_eq(fn(0, "", 0), 0u);
}

Test(crc32c, table_vectors) { check_vectors(crc32c_update_table); }

Test(crc32c, hw_vectors)
{
#if defined(__x86_64__)
    /* Every x86-64 CPU this project runs on has SSE4.2; if detection says otherwise it is broken. */
    cr_assert(crc32c_have_hw(), "SSE4.2 not detected on x86-64");
#endif
    if (crc32c_have_hw())
        check_vectors(crc32c_update_hw);
    check_vectors(crc32c_update); /* the dispatching entry point */
}

Test(crc32c, paths_agree_all_lengths_alignments_and_chaining)
{
    unsigned char buf[600];
    unsigned s = 12345;
    for (size_t i = 0; i < sizeof buf; i++) {
        s = s * 1103515245u + 12345u;
        buf[i] = (unsigned char)(s >> 16);
    }
    for (size_t off = 0; off < 9; off++) {
        for (size_t len = 0; len + off <= sizeof buf; len += 7) {
            uint32_t t = crc32c_update_table(0, buf + off, len);
            cr_assert_eq(crc32c(buf + off, len), t, "off %zu len %zu", off, len);
            if (crc32c_have_hw())
                cr_assert_eq(crc32c_update_hw(0, buf + off, len), t, "off %zu len %zu", off, len);
            size_t half = len / 3;
            cr_assert_eq(crc32c_update(crc32c_update(0, buf + off, half), buf + off + half, len - half), t);
        }
    }
}

Test(crc32c, mask)
{
    /* From NOTES.md's golden record: masked CRC of the length bytes 1a 00 .. 00 is 12 9b d8 2d (LE). */
    unsigned char len[8] = {0x1a, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(crc32c_mask(crc32c(len, 8)), 0x2dd89b12u);
}
