/* The request parser on bytes alone (no sockets): every op of c10d's protocol and fsdpc's handshake, every
 * prefix of each (need more), lengths over their limits refused as soon as they are read, the key lists,
 * and strict decimal counters. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous/store_protocol.h"

static const struct store_parse_limits lim = {
    .max_key = 64, .max_value = 1000, .max_keys = 8, .max_request = 4096};

struct sample {
    const char *name;
    struct store_buf b;
};

static void key(struct store_buf *b, const char *k) { store_buf_put_str(b, k); }

/* One encoding of every op, as PyTorch's client and fsdpc's client write them. */
static int samples(struct sample *s)
{
    int n = 0;
#define NEW(op) (store_buf_init(&s[n].b), s[n].name = store_op_name(op), store_buf_put_u8(&s[n].b, op), &s[n++].b)
    struct store_buf *b;
    b = NEW(STORE_OP_VALIDATE);
    store_buf_put_u32(b, STORE_VALIDATE_MAGIC);
    b = NEW(STORE_OP_SET);
    key(b, "/k");
    store_buf_put_bytes(b, "value", 5);
    b = NEW(STORE_OP_COMPARE_SET);
    key(b, "/k");
    store_buf_put_bytes(b, "old", 3);
    store_buf_put_bytes(b, "new!", 4);
    b = NEW(STORE_OP_GET);
    key(b, "/k");
    b = NEW(STORE_OP_ADD);
    key(b, "init/");
    store_buf_put_u64(b, (uint64_t)-5);
    b = NEW(STORE_OP_CHECK);
    store_buf_put_u64(b, 2);
    key(b, "/a");
    key(b, "/bb");
    b = NEW(STORE_OP_WAIT);
    store_buf_put_u64(b, 1);
    key(b, "/w");
    NEW(STORE_OP_GETNUMKEYS);
    b = NEW(STORE_OP_DELETE_KEY);
    key(b, "/k");
    b = NEW(STORE_OP_APPEND);
    key(b, "/k");
    store_buf_put_bytes(b, "", 0);
    b = NEW(STORE_OP_MULTI_GET);
    store_buf_put_u64(b, 3);
    key(b, "/x");
    key(b, "");
    key(b, "/zzz");
    b = NEW(STORE_OP_MULTI_SET);
    store_buf_put_u64(b, 2);
    key(b, "/x");
    store_buf_put_bytes(b, "1", 1);
    key(b, "/y");
    store_buf_put_bytes(b, "22", 2);
    NEW(STORE_OP_CANCEL_WAIT);
    b = NEW(STORE_OP_PING);
    store_buf_put_u32(b, 4242);
    b = NEW(STORE_OP_QUEUE_PUSH);
    key(b, "/q");
    store_buf_put_bytes(b, "item", 4);
    b = NEW(STORE_OP_QUEUE_POP);
    key(b, "/q");
    b = NEW(STORE_OP_QUEUE_LEN);
    key(b, "/q");
    NEW(STORE_OP_LIST_KEYS);
    b = NEW(STORE_OP_BARRIER);
    key(b, "/bar");
    store_buf_put_u64(b, 4);
    b = NEW(STORE_OP_HELLO);
    store_buf_put_u32(b, STORE_HELLO_MAGIC);
    store_buf_put_u16(b, STORE_PROTOCOL_VERSION);
    key(b, "run-7");
    store_buf_put_bytes(b, "0123456789abcdef0123456789abcdef", 32);
    b = NEW(STORE_OP_AUTH);
    store_buf_put_bytes(b, "0123456789abcdef0123456789abcdef", 32);
    NEW(STORE_OP_RESET_TORCH);
#undef NEW
    return n;
}

Test(store_protocol, every_op_parses_and_every_prefix_needs_more)
{
    struct sample s[32];
    int n = samples(s);
    cr_assert_eq(n, 22, "a sample per op");
    for (int i = 0; i < n; i++) {
        struct store_buf *b = &s[i].b;
        struct store_request r;
        cr_assert_eq(store_request_parse(b->data, b->len, &lim, &r), STORE_PARSE_OK, "%s: %s", s[i].name, r.error);
        cr_assert_eq(r.size, b->len, "%s: size %llu of %zu", s[i].name, (unsigned long long)r.size, b->len);
        cr_assert_eq(r.op, b->data[0]);
        for (size_t k = 0; k < b->len; k++) {
            cr_assert_eq(store_request_parse(b->data, k, &lim, &r), STORE_PARSE_NEED_MORE, "%s prefix %zu", s[i].name,
                         k);
            cr_assert(r.size > k && r.size <= b->len, "%s prefix %zu: need %llu", s[i].name, k,
                      (unsigned long long)r.size);
        }
        /* with the next request behind it, only its own bytes are taken */
        struct store_buf two;
        store_buf_init(&two);
        store_buf_put_raw(&two, b->data, b->len);
        store_buf_put_raw(&two, s[(i + 1) % n].b.data, s[(i + 1) % n].b.len);
        cr_assert_eq(store_request_parse(two.data, two.len, &lim, &r), STORE_PARSE_OK);
        cr_assert_eq(r.size, b->len);
        store_buf_free(&two);
        store_buf_free(b);
    }
}

Test(store_protocol, fields)
{
    struct store_buf b;
    store_buf_init(&b);
    struct store_request r;
    store_buf_put_u8(&b, STORE_OP_COMPARE_SET);
    key(&b, "/k");
    store_buf_put_bytes(&b, "old", 3);
    store_buf_put_bytes(&b, "new!", 4);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_OK);
    cr_assert_eq(r.key_len, 2);
    cr_assert_eq(memcmp(r.key, "/k", 2), 0);
    cr_assert_eq(r.expected_len, 3);
    cr_assert_eq(memcmp(r.expected, "old", 3), 0);
    cr_assert_eq(r.value_len, 4);
    cr_assert_eq(memcmp(r.value, "new!", 4), 0);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_ADD);
    key(&b, "c");
    store_buf_put_u64(&b, (uint64_t)INT64_MIN);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_OK);
    cr_assert_eq(r.number, INT64_MIN);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, 0x1234);
    key(&b, "run");
    store_buf_put_bytes(&b, "nonce", 5);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_OK);
    cr_assert_eq(r.u32, STORE_HELLO_MAGIC);
    cr_assert_eq(r.version, 0x1234);
    cr_assert_eq(r.key_len, 3);
    cr_assert_eq(r.value_len, 5);
    store_buf_free(&b);
}

Test(store_protocol, key_lists_and_pairs)
{
    struct store_buf b;
    store_buf_init(&b);
    struct store_request r;
    store_buf_put_u8(&b, STORE_OP_MULTI_SET);
    store_buf_put_u64(&b, 3);
    const char *k[] = {"/a", "", "/ccc"}, *v[] = {"1", "22", ""};
    for (int i = 0; i < 3; i++) {
        key(&b, k[i]);
        store_buf_put_bytes(&b, v[i], strlen(v[i]));
    }
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_OK);
    cr_assert_eq(r.count, 3);
    struct store_item_iter it = {0};
    const uint8_t *kp, *vp;
    uint64_t kl, vl;
    for (int i = 0; i < 3; i++) {
        cr_assert(store_request_item(&r, &it, &kp, &kl, &vp, &vl));
        cr_assert_eq(kl, strlen(k[i]));
        cr_assert_eq(memcmp(kp, k[i], kl), 0);
        cr_assert_eq(vl, strlen(v[i]));
        cr_assert_eq(memcmp(vp, v[i], vl), 0);
    }
    cr_assert_not(store_request_item(&r, &it, &kp, &kl, &vp, &vl));
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_WAIT);
    store_buf_put_u64(&b, 0);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_OK);
    it = (struct store_item_iter){0};
    cr_assert_not(store_request_item(&r, &it, &kp, &kl, NULL, NULL));
    store_buf_free(&b);
}

/* A length over its limit is refused with only the length in hand: nothing waits for its bytes. */
Test(store_protocol, limits_refused_on_the_length)
{
    struct store_buf b;
    store_buf_init(&b);
    struct store_request r;
    store_buf_put_u8(&b, STORE_OP_SET);
    store_buf_put_u64(&b, lim.max_key + 1);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    cr_assert(strstr(r.error, "key of 65 bytes"), "%s", r.error);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_SET);
    key(&b, "k");
    store_buf_put_u64(&b, lim.max_value + 1);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    cr_assert(strstr(r.error, "value of 1001 bytes"), "%s", r.error);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_GET);
    store_buf_put_u64(&b, UINT64_MAX);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_CHECK);
    store_buf_put_u64(&b, lim.max_keys + 1);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    cr_assert(strstr(r.error, "9 keys"), "%s", r.error);
    /* each value fits, the whole request does not: refused when the sum passes max_request */
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_MULTI_SET);
    store_buf_put_u64(&b, 8);
    for (int i = 0; i < 5; i++) {
        key(&b, "k");
        store_buf_put_u64(&b, 1000);
        for (int j = 0; j < 1000; j++)
            store_buf_put_u8(&b, 'v');
    }
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    cr_assert(strstr(r.error, "larger than 4096"), "%s", r.error);
    store_buf_reset(&b);
    store_buf_put_u8(&b, 0x42);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    cr_assert(strstr(r.error, "unknown op 0x42"), "%s", r.error);
    store_buf_reset(&b);
    store_buf_put_u8(&b, STORE_OP_HELLO);
    store_buf_put_u32(&b, STORE_HELLO_MAGIC);
    store_buf_put_u16(&b, 2);
    key(&b, "r");
    store_buf_put_u64(&b, STORE_NONCE_MAX_BYTES + 1);
    cr_assert_eq(store_request_parse(b.data, b.len, &lim, &r), STORE_PARSE_BAD);
    store_buf_free(&b);
    /* nothing at all: one byte needed */
    cr_assert_eq(store_request_parse("", 0, &lim, &r), STORE_PARSE_NEED_MORE);
    cr_assert_eq(r.size, 1);
}

/* Random bytes never crash the parser, and what it accepts has a size within the buffer. */
Test(store_protocol, random_bytes)
{
    uint8_t buf[256];
    unsigned seed = 12345;
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = (size_t)(rand_r(&seed) % sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)rand_r(&seed);
        if (n)
            buf[0] %= 24; /* mostly real ops */
        if (n > 1 && rand_r(&seed) % 2)
            memset(buf + 2, 0, n > 8 ? 6 : n - 2); /* small lengths */
        struct store_request r;
        enum store_parse_status st = store_request_parse(buf, n, &lim, &r);
        if (st == STORE_PARSE_OK) {
            cr_assert_leq(r.size, n);
            struct store_item_iter it = {0};
            const uint8_t *k, *v;
            uint64_t kl, vl;
            while (store_request_item(&r, &it, &k, &kl, &v, &vl))
                cr_assert_leq((size_t)(k - buf) + kl, n);
        } else if (st == STORE_PARSE_NEED_MORE) {
            cr_assert_gt(r.size, n);
        }
    }
}

Test(store_protocol, strict_decimal_counters)
{
    int64_t v;
    const char *good[] = {"0", "12", "-12", "007", "-0", "9223372036854775807", "-9223372036854775808"};
    const int64_t want[] = {0, 12, -12, 7, 0, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cr_assert(store_parse_i64(good[i], strlen(good[i]), &v), "'%s' refused", good[i]);
        cr_assert_eq(v, want[i], "'%s'", good[i]);
    }
    const char *bad[] = {"", "-", " 12", "12 ", "+12", "1 2", "0x10", "1e3", "12\n", "\t1", "9223372036854775808",
                         "-9223372036854775809", "123456789012345678901", "--1", "1-"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_not(store_parse_i64(bad[i], strlen(bad[i]), &v), "'%s' accepted", bad[i]);
    cr_assert_not(store_parse_i64("1\0002", 3, &v), "an embedded NUL accepted");
}
