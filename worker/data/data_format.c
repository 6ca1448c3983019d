#include "worker/data/data_format.h"

#include "common/error.h"

#include <stdbool.h>
#include <string.h>

const char *data_format_name(enum data_format f)
{
    return f == DATA_FORMAT_LLMC ? "llm.c" : f == DATA_FORMAT_LLMC_U32 ? "llm.c uint32" : "nanoGPT";
}

int data_format_token_bytes(enum data_format f) { return f == DATA_FORMAT_LLMC_U32 ? 4 : 2; }

int data_format_detect(const void *bytes, size_t size, const char *path, enum data_format *format,
                       size_t *header_bytes, int64_t *n_tokens)
{
    int32_t head[3] = {0, 0, 0};
    if (size >= 12)
        memcpy(head, bytes, sizeof head);
    if (size >= 12 && (head[0] == DATA_LLMC_MAGIC || head[0] == DATA_LLMC_U32_MAGIC)) {
        bool u32 = head[0] == DATA_LLMC_U32_MAGIC;
        int version = u32 ? DATA_LLMC_U32_VERSION : DATA_LLMC_VERSION;
        size_t hdr = DATA_LLMC_HEADER_INTS * sizeof(int32_t), tb = u32 ? 4 : 2;
        if (head[1] != version)
            return error_set(FSDP_EINVAL, "%s: llm.c header (magic %d) has version %d, expected %d", path,
                             head[0], head[1], version);
        if (size < hdr)
            return error_set(FSDP_EINVAL, "%s: llm.c magic found but the file (%zu bytes) is shorter than the "
                                          "%zu-byte header", path, size, hdr);
        if (head[2] < 0 || (size - hdr) != (size_t)head[2] * tb)
            return error_set(FSDP_EINVAL, "%s: llm.c header says %d tokens but the file holds %zu bytes of "
                                          "uint%zu tokens (%zu tokens): truncated or corrupt", path, head[2],
                             size - hdr, 8 * tb, (size - hdr) / tb);
        *format = u32 ? DATA_FORMAT_LLMC_U32 : DATA_FORMAT_LLMC;
        *header_bytes = hdr;
        *n_tokens = head[2];
        return 0;
    }
    if (size % 2)
        return error_set(FSDP_EINVAL, "%s: odd size (%zu bytes) for a file of uint16 tokens: truncated or "
                                      "not a token file", path, size);
    *format = DATA_FORMAT_NANOGPT;
    *header_bytes = 0;
    *n_tokens = (int64_t)(size / 2);
    return 0;
}
