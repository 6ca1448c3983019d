#include "rendezvous/store_protocol.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *store_op_name(int op)
{
    switch (op) {
    case STORE_OP_VALIDATE: return "VALIDATE";
    case STORE_OP_SET: return "SET";
    case STORE_OP_COMPARE_SET: return "COMPARE_SET";
    case STORE_OP_GET: return "GET";
    case STORE_OP_ADD: return "ADD";
    case STORE_OP_CHECK: return "CHECK";
    case STORE_OP_WAIT: return "WAIT";
    case STORE_OP_GETNUMKEYS: return "GETNUMKEYS";
    case STORE_OP_DELETE_KEY: return "DELETE_KEY";
    case STORE_OP_APPEND: return "APPEND";
    case STORE_OP_MULTI_GET: return "MULTI_GET";
    case STORE_OP_MULTI_SET: return "MULTI_SET";
    case STORE_OP_CANCEL_WAIT: return "CANCEL_WAIT";
    case STORE_OP_PING: return "PING";
    case STORE_OP_QUEUE_PUSH: return "QUEUE_PUSH";
    case STORE_OP_QUEUE_POP: return "QUEUE_POP";
    case STORE_OP_QUEUE_LEN: return "QUEUE_LEN";
    case STORE_OP_LIST_KEYS: return "LIST_KEYS";
    case STORE_OP_BARRIER: return "BARRIER";
    case STORE_OP_HELLO: return "HELLO";
    case STORE_OP_AUTH: return "AUTH";
    case STORE_OP_RESET_TORCH: return "RESET_TORCH";
    default: return "unknown";
    }
}

/* ---- store_buf ---- */

void store_buf_init(struct store_buf *b) { memset(b, 0, sizeof *b); }

void store_buf_free(struct store_buf *b)
{
    free(b->data);
    store_buf_init(b);
}

void store_buf_reset(struct store_buf *b)
{
    b->len = 0;
    b->failed = false;
}

static bool buf_reserve(struct store_buf *b, size_t more)
{
    if (b->failed)
        return false;
    if (more > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return false;
    }
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
    store_buf_put_u64(b, (uint64_t)n);
    store_buf_put_raw(b, p, n);
}

void store_buf_put_str(struct store_buf *b, const char *s)
{
    store_buf_put_bytes(b, s ? s : "", s ? strlen(s) : 0);
}

uint16_t store_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

uint32_t store_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t store_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- the request parser ---- */

const struct store_parse_limits store_limits_handshake = {
    .max_key = 1024, .max_value = STORE_NONCE_MAX_BYTES, .max_keys = 0, .max_request = STORE_HANDSHAKE_MAX_BYTES};
const struct store_parse_limits store_limits_torch = {
    .max_key = STORE_MAX_KEY_BYTES, .max_value = STORE_TORCH_MAX_VALUE_BYTES, .max_keys = STORE_MAX_KEYS,
    .max_request = STORE_TORCH_MAX_REQUEST_BYTES};
const struct store_parse_limits store_limits_fsdp = {
    .max_key = STORE_MAX_KEY_BYTES, .max_value = STORE_MAX_VALUE_BYTES, .max_keys = STORE_MAX_KEYS,
    .max_request = STORE_MAX_REQUEST_BYTES};

/* A cursor over the bytes received so far. Every length is checked against its limit and against the
 * request limit before anything is taken, so no arithmetic below can overflow. */
struct parse {
    const uint8_t *p;
    uint64_t len, off;
    const struct store_parse_limits *lim;
    struct store_request *r;
    enum store_parse_status st; /* OK while parsing; NEED_MORE or BAD stops it */
};

static void parse_bad(struct parse *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void parse_bad(struct parse *ps, const char *fmt, ...)
{
    if (ps->st != STORE_PARSE_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->r->error, sizeof ps->r->error, fmt, ap);
    va_end(ap);
    ps->st = STORE_PARSE_BAD;
}

/* n more bytes at the cursor: NULL (and a status) when they are not all there or not allowed. */
static const uint8_t *take(struct parse *ps, uint64_t n)
{
    if (ps->st != STORE_PARSE_OK)
        return NULL;
    if (n > ps->lim->max_request || ps->off > ps->lim->max_request - n) {
        parse_bad(ps, "%s request larger than %llu bytes", store_op_name(ps->r->op),
                  (unsigned long long)ps->lim->max_request);
        return NULL;
    }
    if (ps->len - ps->off < n) {
        ps->st = STORE_PARSE_NEED_MORE;
        ps->r->size = ps->off + n;
        return NULL;
    }
    const uint8_t *q = ps->p + ps->off;
    ps->off += n;
    return q;
}

static uint32_t take_u32(struct parse *ps)
{
    const uint8_t *q = take(ps, 4);
    return q ? store_le32(q) : 0;
}

static uint64_t take_u64(struct parse *ps)
{
    const uint8_t *q = take(ps, 8);
    return q ? store_le64(q) : 0;
}

/* u64 length + bytes, the length at most max. */
static const uint8_t *take_field(struct parse *ps, uint64_t max, const char *what, uint64_t *n)
{
    uint64_t len = take_u64(ps);
    *n = 0;
    if (ps->st != STORE_PARSE_OK)
        return NULL;
    if (len > max) {
        parse_bad(ps, "%s of %llu bytes in %s exceeds the limit of %llu", what, (unsigned long long)len,
                  store_op_name(ps->r->op), (unsigned long long)max);
        return NULL;
    }
    const uint8_t *q = take(ps, len);
    if (q)
        *n = len;
    return q;
}

static void take_key(struct parse *ps)
{
    ps->r->key = take_field(ps, ps->lim->max_key, "key", &ps->r->key_len);
}

static void take_value(struct parse *ps)
{
    ps->r->value = take_field(ps, ps->lim->max_value, "value", &ps->r->value_len);
}

/* CHECK, WAIT, MULTI_GET: u64 n, n keys; MULTI_SET: u64 n, n (key, value) pairs. */
static void take_list(struct parse *ps, bool pairs)
{
    uint64_t n = take_u64(ps);
    if (ps->st != STORE_PARSE_OK)
        return;
    if (n > ps->lim->max_keys) {
        parse_bad(ps, "%llu keys in one %s exceed the limit of %llu", (unsigned long long)n,
                  store_op_name(ps->r->op), (unsigned long long)ps->lim->max_keys);
        return;
    }
    ps->r->count = n;
    ps->r->list = ps->p + ps->off;
    for (uint64_t i = 0; i < n && ps->st == STORE_PARSE_OK; i++) {
        uint64_t dummy;
        take_field(ps, ps->lim->max_key, "key", &dummy);
        if (pairs)
            take_field(ps, ps->lim->max_value, "value", &dummy);
    }
}

enum store_parse_status store_request_parse(const void *buf, size_t len, const struct store_parse_limits *lim,
                                            struct store_request *req)
{
    memset(req, 0, sizeof *req);
    struct parse ps = {.p = buf, .len = len, .lim = lim, .r = req, .st = STORE_PARSE_OK};
    const uint8_t *op = take(&ps, 1);
    if (!op) {
        req->size = 1;
        return STORE_PARSE_NEED_MORE;
    }
    req->op = *op;
    switch (req->op) {
    case STORE_OP_VALIDATE:
    case STORE_OP_PING:
        req->u32 = take_u32(&ps);
        break;
    case STORE_OP_SET:
    case STORE_OP_APPEND:
    case STORE_OP_QUEUE_PUSH:
        take_key(&ps);
        take_value(&ps);
        break;
    case STORE_OP_COMPARE_SET:
        take_key(&ps);
        req->expected = take_field(&ps, lim->max_value, "expected value", &req->expected_len);
        take_value(&ps);
        break;
    case STORE_OP_GET:
    case STORE_OP_DELETE_KEY:
    case STORE_OP_QUEUE_POP:
    case STORE_OP_QUEUE_LEN:
        take_key(&ps);
        break;
    case STORE_OP_ADD:
    case STORE_OP_BARRIER:
        take_key(&ps);
        req->number = (int64_t)take_u64(&ps);
        break;
    case STORE_OP_CHECK:
    case STORE_OP_WAIT:
    case STORE_OP_MULTI_GET:
        take_list(&ps, false);
        break;
    case STORE_OP_MULTI_SET:
        take_list(&ps, true);
        break;
    case STORE_OP_GETNUMKEYS:
    case STORE_OP_CANCEL_WAIT:
    case STORE_OP_LIST_KEYS:
    case STORE_OP_RESET_TORCH:
        break;
    case STORE_OP_HELLO: {
        req->u32 = take_u32(&ps);
        const uint8_t *v = take(&ps, 2);
        req->version = v ? store_le16(v) : 0;
        take_key(&ps);
        req->value = take_field(&ps, STORE_NONCE_MAX_BYTES, "nonce", &req->value_len);
        break;
    }
    case STORE_OP_AUTH:
        req->value = take_field(&ps, STORE_NONCE_MAX_BYTES, "mac", &req->value_len);
        break;
    default:
        parse_bad(&ps, "unknown op 0x%02x", req->op);
        break;
    }
    if (ps.st == STORE_PARSE_OK)
        req->size = ps.off;
    return ps.st;
}

bool store_request_item(const struct store_request *req, struct store_item_iter *it, const uint8_t **key,
                        uint64_t *key_len, const uint8_t **value, uint64_t *value_len)
{
    /* The request parsed OK, so every length read here is in bounds. */
    if (!req->list || it->index >= req->count)
        return false;
    const uint8_t *p = req->list + it->offset;
    *key_len = store_le64(p);
    *key = p + 8;
    p += 8 + *key_len;
    if (req->op == STORE_OP_MULTI_SET) {
        uint64_t vl = store_le64(p);
        if (value)
            *value = p + 8;
        if (value_len)
            *value_len = vl;
        p += 8 + vl;
    }
    it->offset = (uint64_t)(p - req->list);
    it->index++;
    return true;
}

bool store_parse_i64(const void *text, size_t len, int64_t *out)
{
    const uint8_t *s = text;
    size_t i = 0;
    bool neg = false;
    if (len > 0 && s[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len || len > 20)
        return false;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (limit - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}
