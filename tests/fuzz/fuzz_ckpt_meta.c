/* libFuzzer target: the parser of a checkpoint's metadata.json (ckpt_meta_parse), which every resume and
 * fsdp-ckpt runs on a file that may be damaged. The first byte is a flag: below 0x80 the metadata_crc32c
 * field of the rest (when it has one) is set to the text's CRC, so the fuzzer reaches the JSON parser
 * behind the checksum; from 0x80 the text is taken as it is, for the checksum gate itself. Any outcome is fine except a crash, a sanitizer report or
 * a leak; a successful parse must also hold together (every piece names a listed file and tensor). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "worker/ckpt/ckpt_internal.h"

static void fix_crc(char *text, size_t len)
{
    static const char key[] = "\"metadata_crc32c\":";
    char *at = memmem(text, len, key, sizeof key - 1);
    if (!at)
        return;
    char *q = memchr(at + sizeof key - 1, '"', len - (size_t)(at + sizeof key - 1 - text));
    if (!q || (size_t)(q - text) + 9 > len)
        return;
    memset(q + 1, '0', 8);
    size_t body = len && text[len - 1] == '\n' ? len - 1 : len;
    char crc[9];
    snprintf(crc, sizeof crc, "%08x", crc32c(text, body));
    memcpy(q + 1, crc, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t len = size - 1;
    char *text = malloc(len + 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, len);
    text[len] = '\0';
    if (data[0] < 0x80)
        fix_crc(text, len);
    struct ckpt_meta m;
    char **names = NULL;
    int n = 0;
    int rc = ckpt_meta_parse("fuzz/metadata.json", text, len, &m, &names, &n);
    if (rc == 0)
        for (size_t i = 0; i < m.n_pieces; i++)
            if (m.pieces[i].file < 0 || m.pieces[i].file >= m.n_files || m.pieces[i].param < 0 ||
                m.pieces[i].param >= n)
                abort();
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    ckpt_meta_free(&m);
    free(text);
    return 0;
}
