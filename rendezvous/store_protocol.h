/* The store's wire format, shared by server and client (and by tests that forge frames): a frame is a u32
 * little-endian payload length followed by the payload; a request payload starts with an op byte, a reply
 * payload with a status byte. Layouts of every op: docs/store.md. Integers are little-endian so the format
 * does not depend on the host. */
#ifndef FSDP_RENDEZVOUS_STORE_PROTOCOL_H
#define FSDP_RENDEZVOUS_STORE_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/store.h"

#define STORE_MAGIC 0x50445346u /* the bytes "FSDP" read as a little-endian u32 */
#define STORE_FRAME_HEADER_BYTES 4u
/* COMPARE_SET carries two values; anything larger than this cannot be a legal frame. */
#define STORE_MAX_FRAME_BYTES (2u * STORE_MAX_VALUE_BYTES + 64u * 1024u)
#define STORE_MAX_WAIT_KEYS 4096u

enum store_op {
    STORE_OP_HELLO = 0x01,
    STORE_OP_SET = 0x10,
    STORE_OP_GET = 0x11,
    STORE_OP_ADD = 0x12,
    STORE_OP_COMPARE_SET = 0x13,
    STORE_OP_CHECK = 0x14,
    STORE_OP_WAIT = 0x15,
    STORE_OP_DELETE = 0x16,
    STORE_OP_NUM_KEYS = 0x17,
    STORE_OP_APPEND = 0x18,
    STORE_OP_PING = 0x19,
};

enum store_status {
    STORE_ST_OK = 0,
    STORE_ST_TIMEOUT = 1,   /* body: u32 n + n missing keys */
    STORE_ST_REFUSED = 2,   /* body: message; the server closes the connection */
    STORE_ST_INVALID = 3,   /* body: message (e.g. ADD on a value that is not a number) */
    STORE_ST_TOO_LARGE = 4, /* body: message (key/value/result over the limits) */
    STORE_ST_PROTO = 5,     /* body: message; the server closes the connection */
};

const char *store_op_name(int op);

/* A growable byte buffer that builds one frame at a time. Allocation failure is sticky (`failed`) so a
 * sequence of puts needs one check at the end. */
struct store_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
};

void store_buf_init(struct store_buf *b);
void store_buf_free(struct store_buf *b);
/* Starts a frame (reserves the length field) with its first byte (op or status). */
void store_buf_begin(struct store_buf *b, uint8_t first);
/* Patches the length field; returns 0, or FSDP_ENOMEM/FSDP_ERANGE. */
int store_buf_end(struct store_buf *b);
void store_buf_put_u8(struct store_buf *b, uint8_t v);
void store_buf_put_u16(struct store_buf *b, uint16_t v);
void store_buf_put_u32(struct store_buf *b, uint32_t v);
void store_buf_put_u64(struct store_buf *b, uint64_t v);
void store_buf_put_raw(struct store_buf *b, const void *p, size_t n);
/* u32 length + bytes */
void store_buf_put_bytes(struct store_buf *b, const void *p, size_t n);
void store_buf_put_str(struct store_buf *b, const char *s); /* NULL is written as "" */

/* Bounds-checked cursor over a received payload; any overrun sets `bad` and yields zeros. */
struct store_reader {
    const uint8_t *p;
    size_t left;
    bool bad;
};

void store_reader_init(struct store_reader *r, const void *p, size_t n);
uint8_t store_reader_u8(struct store_reader *r);
uint16_t store_reader_u16(struct store_reader *r);
uint32_t store_reader_u32(struct store_reader *r);
uint64_t store_reader_u64(struct store_reader *r);
/* u32 length + bytes; returns a pointer into the payload (not NUL-terminated). */
const uint8_t *store_reader_bytes(struct store_reader *r, size_t *n);
/* True when the payload was consumed exactly (no overrun, no trailing bytes). */
bool store_reader_done(const struct store_reader *r);

uint32_t store_le32(const uint8_t *p);

#endif
