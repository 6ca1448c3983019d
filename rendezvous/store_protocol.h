/* The store's wire format: c10d TCPStore's (PyTorch 2.x), shared by server and client and by tests that
 * forge requests. A request is a u8 op followed by its fields, with no length prefix of its own; integers
 * are little-endian; a string or byte field is a u64 length then the bytes. fsdpc's own handshake (HELLO,
 * AUTH) and its one extra op are op codes PyTorch never sends. Layouts of every op and reply: docs/store.md.
 *
 * store_request_parse is the whole request parser: bytes in, a parsed request, "need more bytes" or an
 * error out, with no socket involved (the server and the fuzz target call it the same way). */
#ifndef FSDP_RENDEZVOUS_STORE_PROTOCOL_H
#define FSDP_RENDEZVOUS_STORE_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/store.h"

/* VALIDATE's magic (c10d's validationMagicNumber): the first request of every connection. */
#define STORE_VALIDATE_MAGIC 0x3C85F7CEu
/* HELLO's magic: the bytes "FSDP" read as a little-endian u32. */
#define STORE_HELLO_MAGIC 0x50445346u
#define STORE_NONCE_BYTES 32u
#define STORE_MAC_BYTES 32u
#define STORE_NONCE_MAX_BYTES 64u

/* Requests of a connection that has not finished a handshake, and of fsdpc's handshake itself. */
#define STORE_HANDSHAKE_MAX_BYTES 4096u
/* PyTorch's own server refuses values over 8 MiB (MAX_PAYLOAD_LEN); its clients get the same. */
#define STORE_TORCH_MAX_VALUE_BYTES (8u << 20)
/* The largest request of each kind of client: COMPARE_SET carries two values, MULTI_SET many. */
#define STORE_TORCH_MAX_REQUEST_BYTES (2u * STORE_TORCH_MAX_VALUE_BYTES + (1u << 20))
#define STORE_MAX_REQUEST_BYTES (2u * STORE_MAX_VALUE_BYTES + (1u << 20))
/* MULTI_GET and LIST_KEYS replies larger than this are refused instead of built. */
#define STORE_MAX_REPLY_BYTES (64u << 20)

enum store_op {
    STORE_OP_VALIDATE = 0,
    STORE_OP_SET = 1,
    STORE_OP_COMPARE_SET = 2,
    STORE_OP_GET = 3,
    STORE_OP_ADD = 4,
    STORE_OP_CHECK = 5,
    STORE_OP_WAIT = 6,
    STORE_OP_GETNUMKEYS = 7,
    STORE_OP_DELETE_KEY = 8,
    STORE_OP_APPEND = 9,
    STORE_OP_MULTI_GET = 10,
    STORE_OP_MULTI_SET = 11,
    STORE_OP_CANCEL_WAIT = 12,
    STORE_OP_PING = 13,
    STORE_OP_QUEUE_PUSH = 14,
    STORE_OP_QUEUE_POP = 15,
    STORE_OP_QUEUE_LEN = 16,
    STORE_OP_LIST_KEYS = 17,
    STORE_OP_BARRIER = 18,
    /* fsdpc's extension: never sent by a PyTorch client */
    STORE_OP_HELLO = 0xF0,
    STORE_OP_AUTH = 0xF1,
    STORE_OP_RESET_TORCH = 0xF2,
};

/* c10d's CheckResponseType and WaitResponseType */
enum { STORE_CHECK_READY = 0, STORE_CHECK_NOT_READY = 1 };
enum { STORE_WAIT_STOP = 0, STORE_WAIT_CANCELED = 1 };

/* The status byte that starts every reply of an fsdpc client (and the replies to HELLO and AUTH).
 * PyTorch clients get c10d's replies as they are, without it. */
enum store_status {
    STORE_ST_OK = 0,
    STORE_ST_NOT_FOUND = 1, /* GET / MULTI_GET of a missing key; COMPARE_SET that left a key missing */
    STORE_ST_REFUSED = 2,   /* handshake refused; the server closes the connection */
    STORE_ST_INVALID = 3,   /* e.g. ADD on a value that is not a decimal integer, out of memory */
    STORE_ST_TOO_LARGE = 4, /* a value, result or reply over the limits */
    STORE_ST_PROTO = 5,     /* malformed or out-of-place request; the server closes the connection */
};

const char *store_op_name(int op);

/* ---- building requests and replies ---- */

/* A growable byte buffer. Allocation failure is sticky (`failed`) so a sequence of puts needs one check. */
struct store_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;
};

void store_buf_init(struct store_buf *b);
void store_buf_free(struct store_buf *b);
void store_buf_reset(struct store_buf *b);
void store_buf_put_u8(struct store_buf *b, uint8_t v);
void store_buf_put_u16(struct store_buf *b, uint16_t v);
void store_buf_put_u32(struct store_buf *b, uint32_t v);
void store_buf_put_u64(struct store_buf *b, uint64_t v);
void store_buf_put_raw(struct store_buf *b, const void *p, size_t n);
/* u64 length + bytes */
void store_buf_put_bytes(struct store_buf *b, const void *p, size_t n);
void store_buf_put_str(struct store_buf *b, const char *s); /* NULL is written as "" */

uint16_t store_le16(const uint8_t *p);
uint32_t store_le32(const uint8_t *p);
uint64_t store_le64(const uint8_t *p);

/* ---- parsing requests ---- */

struct store_parse_limits {
    uint64_t max_key;     /* bytes of one key (HELLO: of the run id) */
    uint64_t max_value;   /* bytes of one value (HELLO/AUTH: of the nonce/mac) */
    uint64_t max_keys;    /* keys of CHECK/WAIT/MULTI_GET, pairs of MULTI_SET */
    uint64_t max_request; /* bytes of the whole request */
};

/* The server's limits in each state of a connection: before a handshake (and during fsdpc's), for a
 * PyTorch client, for an authenticated fsdpc client. */
extern const struct store_parse_limits store_limits_handshake, store_limits_torch, store_limits_fsdp;

enum store_parse_status {
    STORE_PARSE_OK,        /* one whole request at the start of the buffer */
    STORE_PARSE_NEED_MORE, /* a prefix of a legal request: read more */
    STORE_PARSE_BAD,       /* cannot become a legal request: drop the connection */
};

struct store_request {
    uint8_t op;
    /* OK: bytes the request occupies; NEED_MORE: at least this many bytes are needed (known so far) */
    uint64_t size;
    const uint8_t *key; /* single-key ops; HELLO: the run id */
    uint64_t key_len;
    const uint8_t *value; /* SET, APPEND, QUEUE_PUSH, COMPARE_SET (desired); HELLO: nonce; AUTH: mac */
    uint64_t value_len;
    const uint8_t *expected; /* COMPARE_SET */
    uint64_t expected_len;
    int64_t number;   /* ADD delta, BARRIER world size */
    uint32_t u32;     /* VALIDATE and HELLO magic, PING nonce */
    uint16_t version; /* HELLO */
    uint64_t count;   /* keys of CHECK / WAIT / MULTI_GET, pairs of MULTI_SET */
    const uint8_t *list; /* where those keys (or pairs) start, for store_request_item */
    char error[160];     /* BAD: why */
};

/* Parses the request at the start of buf[0..len). Pointers in *req point into buf. A length over a limit
 * is BAD as soon as it is read, before its bytes arrive. */
enum store_parse_status store_request_parse(const void *buf, size_t len, const struct store_parse_limits *lim,
                                            struct store_request *req);

/* Walks the keys (or key/value pairs of MULTI_SET) of a request that parsed OK, starting from a zeroed
 * iterator; false after the last one. value/value_len are set for MULTI_SET only (and may be NULL). */
struct store_item_iter {
    uint64_t index, offset;
};
bool store_request_item(const struct store_request *req, struct store_item_iter *it, const uint8_t **key,
                        uint64_t *key_len, const uint8_t **value, uint64_t *value_len);

/* ---- integers stored as text ---- */

/* A decimal int64 and nothing else: optional '-', digits only (no spaces, '+', or trailing bytes), no
 * overflow. ADD and BARRIER read counters with it. */
bool store_parse_i64(const void *text, size_t len, int64_t *out);

#endif
