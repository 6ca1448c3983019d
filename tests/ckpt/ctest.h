/* Shared by the checkpoint tests: a small GPT-2 layout, a deterministic fake training state, and the two
 * ways the FSDP engine cuts it into pieces (version 2: dim-0 row ranges per parameter; version 1: ranges
 * of a flat per-unit buffer). Header-only so each test binary stays one file. */
#ifndef FSDP_TESTS_CKPT_CTEST_H
#define FSDP_TESTS_CKPT_CTEST_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "tests/util/tu_check.h"
#include "worker/ckpt/ckpt.h"
#include "worker/model/model.h"

static inline void ct_config(struct model_config *c, int vocab)
{
    model_config_default(c);
    c->n_layer = 2;
    c->n_head = 3;
    c->n_embd = 36;
    c->vocab_size = vocab;
    c->block_size = 16;
}

static inline void ct_layout(struct model_layout *l, int vocab)
{
    struct model_config c;
    ct_config(&c, vocab);
    cr_assert_eq(model_layout_build(l, &c), 0, "%s", error_message());
}

/* Element i of (kind, param) in the fake state, a function of its coordinates and a salt (so two saves
 * differ); vocabulary padding rows are zero, as training keeps them. */
static inline float ct_value(const struct model_layout *l, int kind, int p, size_t i, uint32_t salt)
{
    const struct model_param *mp = &l->params[p];
    size_t real = (size_t)mp->init_rows * (mp->ndim == 2 ? (size_t)mp->shape[1] : 1);
    if (i >= real)
        return 0.0f;
    uint64_t z = ((uint64_t)salt << 40) ^ ((uint64_t)kind << 32) ^ ((uint64_t)p << 24) ^ i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1u << 24) - 0.5) * (kind == CKPT_EXP_AVG_SQ ? 1e-3f : 1.0f);
}

static inline void ct_fill(const struct model_layout *l, int kind, int p, size_t begin, size_t count, float *dst,
                           uint32_t salt)
{
    for (size_t i = 0; i < count; i++)
        dst[i] = ct_value(l, kind, p, begin + i, salt);
}

struct ct_pieces {
    struct ckpt_piece *v;
    size_t n, cap;
};

static inline void ct_add(struct ct_pieces *ps, const struct model_layout *l, int kind, int p, size_t begin,
                          size_t count, uint32_t salt)
{
    if (count == 0)
        return;
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 64;
        ps->v = realloc(ps->v, ps->cap * sizeof *ps->v);
        cr_assert_not_null(ps->v);
    }
    float *d = malloc(count * sizeof *d);
    cr_assert_not_null(d);
    ct_fill(l, kind, p, begin, count, d, salt);
    ps->v[ps->n++] = (struct ckpt_piece){.kind = kind, .param = p, .begin = begin, .count = count, .data = d};
}

static inline void ct_free(struct ct_pieces *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free((void *)ps->v[i].data);
    free(ps->v);
    memset(ps, 0, sizeof *ps);
}

/* Element range [*b, *e) that rank r of world w owns of parameter p under fsdp_version 2 (dim 0 padded
 * to a multiple of w, as the engine does). */
static inline void ct_v2_range(const struct model_layout *l, int p, int r, int w, size_t *b, size_t *e)
{
    const struct model_param *mp = &l->params[p];
    size_t rows = (size_t)mp->shape[0], row = mp->numel / rows, per = (rows + w - 1) / w;
    size_t r0 = per * r < rows ? per * r : rows, r1 = per * (r + 1) < rows ? per * (r + 1) : rows;
    *b = r0 * row;
    *e = r1 * row;
}

/* Pieces of rank r of world w: version 2 = one row range per parameter, version 1 = the intersection of
 * the rank's range of each unit's flat buffer with each parameter of that unit. */
static inline void ct_rank_pieces(struct ct_pieces *ps, const struct model_layout *l, int version, int r, int w,
                                  uint32_t salt)
{
    for (int k = 0; k < CKPT_KINDS; k++) {
        if (version == 2) {
            for (int p = 0; p < l->n_params; p++) {
                size_t b, e;
                ct_v2_range(l, p, r, w, &b, &e);
                ct_add(ps, l, k, p, b, e - b, salt);
            }
            continue;
        }
        for (int u = 0; u < l->n_units; u++) {
            const struct model_unit *un = &l->units[u];
            size_t per = (un->numel + w - 1) / w;
            size_t a = per * r < un->numel ? per * r : un->numel;
            size_t z = per * (r + 1) < un->numel ? per * (r + 1) : un->numel;
            for (int p = un->first_param; p < un->first_param + un->n_params; p++) {
                size_t pb = l->params[p].unit_offset, pe = pb + l->params[p].numel;
                size_t b = a > pb ? a : pb, e = z < pe ? z : pe;
                if (b < e)
                    ct_add(ps, l, k, p, b - pb, e - b, salt);
            }
        }
    }
}

static inline void ct_state(struct ckpt_state *s, const struct model_layout *l, int64_t step, int world,
                            int version)
{
    memset(s, 0, sizeof *s);
    s->step = step;
    s->loss_scale = 32768.0;
    s->scaler_good_steps = 17;
    s->world_size = world;
    snprintf(s->strategy, sizeof s->strategy, "%s", "FULL_SHARD");
    s->fsdp_version = version;
    s->config_text = "[model]\nn_layer = 2\n\n[checkpoint]\ndir = \"x y\"\n";
    s->model = l->config;
}

/* A complete sharded save of the fake state at world w. */
static inline void ct_save_sharded(const char *root, const struct model_layout *l, int64_t step, int w,
                                   int version, uint32_t salt, int keep_last)
{
    for (int r = 0; r < w; r++) {
        struct ct_pieces ps = {0};
        ct_rank_pieces(&ps, l, version, r, w, salt);
        cr_assert_eq(ckpt_sharded_write_rank(root, step, r, l, ps.v, ps.n), 0, "%s", error_message());
        ct_free(&ps);
    }
    struct ckpt_state s;
    ct_state(&s, l, step, w, version);
    cr_assert_eq(ckpt_sharded_commit(root, step, w, l, &s, keep_last), 0, "%s", error_message());
}

/* A complete full save, tensors put in reverse order (the writer must not depend on the order). */
static inline void ct_save_full(const char *root, const struct model_layout *l, int64_t step, uint32_t salt,
                                int keep_last)
{
    struct ckpt_full_writer *w;
    cr_assert_eq(ckpt_full_open(root, step, l, &w), 0, "%s", error_message());
    for (int p = l->n_params - 1; p >= 0; p--)
        for (int k = CKPT_KINDS - 1; k >= 0; k--) {
            float *t = malloc(l->params[p].numel * sizeof *t);
            ct_fill(l, k, p, 0, l->params[p].numel, t, salt);
            cr_assert_eq(ckpt_full_put(w, k, p, t), 0, "%s", error_message());
            free(t);
        }
    struct ckpt_state s;
    ct_state(&s, l, step, 1, 2);
    cr_assert_eq(ckpt_full_commit(w, &s, keep_last), 0, "%s", error_message());
}

/* Reads every tensor of every kind as world w (version-2 ranges) and compares bit for bit. */
static inline void ct_check_read(struct ckpt_reader *r, const struct model_layout *l, int w, uint32_t salt)
{
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int p = 0; p < l->n_params; p++)
            for (int rank = 0; rank < w; rank++) {
                size_t b, e;
                ct_v2_range(l, p, rank, w, &b, &e);
                size_t n = e - b;
                float *got = malloc((n ? n : 1) * sizeof *got), *want = malloc((n ? n : 1) * sizeof *want);
                ct_fill(l, k, p, b, n, want, salt);
                memset(got, 0xff, (n ? n : 1) * sizeof *got);
                cr_assert_eq(ckpt_read(r, k, p, b, n, got), 0, "%s", error_message());
                cr_assert(memcmp(got, want, n * sizeof *got) == 0, "%s of %s [%zu, %zu) at world %d differs",
                          ckpt_kind_name(k), l->params[p].name, b, e, w);
                free(got);
                free(want);
            }
}

#endif
