/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TensorBoard event records and of
 * checkpoints. The SSE4.2 crc32 instruction is used when the CPU has it (checked once at run time), so
 * checksumming a multi-GiB checkpoint costs little next to writing it; a table covers other CPUs. */
#ifndef FSDP_COMMON_CRC32C_H
#define FSDP_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC: crc32c_update(0, buf, n) is the CRC of buf; crc32c_update(crc32c_update(0, a, n), b, m)
 * is the CRC of a followed by b. Uses the fastest code path this CPU supports. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);
static inline uint32_t crc32c(const void *buf, size_t len) { return crc32c_update(0, buf, len); }

/* The two code paths, exposed so tests can check both on any machine. crc32c_update_hw may be called only
 * when crc32c_have_hw() is true. */
uint32_t crc32c_update_table(uint32_t crc, const void *buf, size_t len);
uint32_t crc32c_update_hw(uint32_t crc, const void *buf, size_t len);
int crc32c_have_hw(void);

/* TFRecord's masking: a CRC stored next to data that itself contains CRCs would otherwise be weak. */
static inline uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

#endif
