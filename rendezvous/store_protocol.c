#include "rendezvous/store_protocol.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

const char *store_op_name(int op)
{
    switch (op) {
    case STORE_OP_HELLO: return "HELLO";
    case STORE_OP_SET: return "SET";
    case STORE_OP_GET: return "GET";
    case STORE_OP_ADD: return "ADD";
    case STORE_OP_COMPARE_SET: return "COMPARE_SET";
    case STORE_OP_CHECK: return "CHECK";
    case STORE_OP_WAIT: return "WAIT";
    case STORE_OP_DELETE: return "DELETE";
    case STORE_OP_NUM_KEYS: return "NUM_KEYS";
    case STORE_OP_APPEND: return "APPEND";
    case STORE_OP_PING: return "PING";
    default: return "unknown";
    }
}

void store_buf_init(struct store_buf *b) { memset(b, 0, sizeof *b); }

void store_buf_free(struct store_buf *b)
{
    free(b->data);
    store_buf_init(b);
}

static bool buf_reserve(struct store_buf *b, size_t more)
{
    if (b->failed)
        return false;
    if (b->len + more <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void store_buf_put_raw(struct store_buf *b, const void *p, size_t n)
{
    if (!buf_reserve(b, n))
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

void store_buf_put_u8(struct store_buf *b, uint8_t v) { store_buf_put_raw(b, &v, 1); }

void store_buf_put_u16(struct store_buf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    store_buf_put_raw(b, x, 2);
}

void store_buf_put_u32(struct store_buf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    store_buf_put_raw(b, x, 4);
}

void store_buf_put_u64(struct store_buf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    store_buf_put_raw(b, x, 8);
}

void store_buf_put_bytes(struct store_buf *b, const void *p, size_t n)
{
    if (n > UINT32_MAX) {
        b->failed = true;
        return;
    }
    store_buf_put_u32(b, (uint32_t)n);
    store_buf_put_raw(b, p, n);
}

void store_buf_put_str(struct store_buf *b, const char *s)
{
    store_buf_put_bytes(b, s ? s : "", s ? strlen(s) : 0);
}

void store_buf_begin(struct store_buf *b, uint8_t first)
{
    b->len = 0;
    b->failed = false;
    store_buf_put_u32(b, 0);
    store_buf_put_u8(b, first);
}

int store_buf_end(struct store_buf *b)
{
    if (b->failed)
        return error_set(FSDP_ENOMEM, "out of memory building a store frame");
    size_t n = b->len - STORE_FRAME_HEADER_BYTES;
    if (n > STORE_MAX_FRAME_BYTES)
        return error_set(FSDP_ERANGE, "store frame of %zu bytes exceeds the %u-byte limit", n,
                         (unsigned)STORE_MAX_FRAME_BYTES);
    for (int i = 0; i < 4; i++)
        b->data[i] = (uint8_t)(n >> (8 * i));
    return 0;
}

void store_reader_init(struct store_reader *r, const void *p, size_t n)
{
    r->p = p;
    r->left = n;
    r->bad = false;
}

static const uint8_t *reader_take(struct store_reader *r, size_t n)
{
    if (r->bad || r->left < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

uint8_t store_reader_u8(struct store_reader *r)
{
    const uint8_t *p = reader_take(r, 1);
    return p ? p[0] : 0;
}

uint16_t store_reader_u16(struct store_reader *r)
{
    const uint8_t *p = reader_take(r, 2);
    return p ? (uint16_t)(p[0] | (p[1] << 8)) : 0;
}

uint32_t store_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint32_t store_reader_u32(struct store_reader *r)
{
    const uint8_t *p = reader_take(r, 4);
    return p ? store_le32(p) : 0;
}

uint64_t store_reader_u64(struct store_reader *r)
{
    const uint8_t *p = reader_take(r, 8);
    if (!p)
        return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

const uint8_t *store_reader_bytes(struct store_reader *r, size_t *n)
{
    uint32_t len = store_reader_u32(r);
    const uint8_t *p = reader_take(r, len);
    *n = p ? len : 0;
    return p ? p : (const uint8_t *)"";
}

bool store_reader_done(const struct store_reader *r) { return !r->bad && r->left == 0; }
