/*
 * rules.h -- the attention frame's rules: what every path of one head
 * (attn_flash.c's tiled forward and backward, the rows path, attention_ref.c's
 * exact path) reads and applies the same way, so each rule exists once:
 * one head's arguments (pa_attn_args), the rows of K and V (and their
 * scales) through the cache accessor (cache.h), the score rule, the key
 * tiles, the sub-tile cut, the dropout test and the end of a row
 * (pa_attn_finish). Static inline only: no declarations of functions that
 * live elsewhere (those are attention.h's, the drivers' shared
 * declarations, which include this). Not seen by kernels.
 *
 * Shapes per head (one flattened batch index): q (L, E), k (S, E),
 * v (S, Ev), mask (L, S), out (L, Ev), w (L, S); strides in elements.
 */
#ifndef PYATTN_OPS_RULES_H
#define PYATTN_OPS_RULES_H

#include "ops.h"
#include "blockmask.h"

/* One head's KV cache (from the call's pa_cache, attn_args.c): the rows
 * of K, V and their scales (pools PA_KV_K, PA_KV_V, PA_KV_KS, PA_KV_VS)
 * through the block table row bt of a paged cache, else rs[x] apart. */
enum { PA_KV_K, PA_KV_V, PA_KV_KS, PA_KV_VS, PA_KV_NPOOL };
typedef struct {
    const int64_t *bt;                      /* the head's block table row, or NULL: contiguous */
    pa_ssize bsz;                           /* block size (paged) */
    pa_ssize blk[PA_KV_NPOOL];              /* each pool's block stride (paged; elements) */
    pa_ssize rs[PA_KV_NPOOL];               /* each pool's row stride (within a block when paged) */
    const float *ks, *vs;                   /* a quantized K / V (k_dt, v_dt PA_I8 or PA_I4,
                                               float32 compute; their element and strides
                                               are bytes, rows contiguous): float32 scales,
                                               one per group of kG (vG) values; NULL when
                                               not quantized */
    pa_ssize kG, vG;
} pa_kv_head;

/* THE accessor: the element offset of key row j in pool x (from a->k,
 * a->v, kv.ks, kv.vs): through the block table of a paged cache, else j
 * rows down. Every frame reads K and V rows and their scales through it
 * (or, in the tiled paths, per run of rows that lie in one block:
 * pa_kv_run). */
static inline pa_ssize pa_kv_row(const pa_kv_head *h, int x, pa_ssize j)
{
    if (!h->bt) return j * h->rs[x];
    return (pa_ssize)h->bt[j / h->bsz] * h->blk[x] + (j % h->bsz) * h->rs[x];
}
/* the end of the run of rows from j that lie in one block (at most j1) */
static inline pa_ssize pa_kv_run(const pa_kv_head *h, pa_ssize j, pa_ssize j1)
{
    return h->bt ? pa_min(j1, (j / h->bsz + 1) * h->bsz) : j1;
}

typedef struct {
    const pa_family *fam;                   /* the call's kernels (softcap) */
    pa_ssize L, S, E, Ev;
    const void *q; pa_ssize q_rs, q_cs;     /* (L, E)  */
    const void *k; pa_ssize k_rs, k_cs;     /* (S, E)  */
    const void *v; pa_ssize v_rs, v_cs;     /* (S, Ev) */
    int q_dt, k_dt, v_dt;                   /* storage dtypes: the compute dtype, or a
                                               16-bit one (PA_F16, PA_BF16) with PA_F32 */
    pa_mask mask;                           /* (L, S), or kind PA_MASK_NONE */
    pa_keyrule rule;                        /* causal rule, window, filled keys */
    double scale;
    double softcap;                         /* > 0: s = softcap * tanh(s / softcap); 0: none */
    double slope;                           /* ALiBi: s -= slope * |d(i) - j|; 0: none */
    int has_sink;
    double sink;                            /* one more logit in each row's denominator */
    double dropout_p;                       /* 0 <= p < 1 */
    uint64_t dropout_key;
    uint64_t ctr_base;                      /* b * L * S: counter of element (b, 0, 0) */
    pa_ssize key_begin, key_end;            /* the keys this call covers, [0, S) unless split */
    void *partial;                          /* NULL, or per query row (2 + Ev) values of the
                                               compute dtype: running max m, sum l and the
                                               unnormalised output, for a later merge */
    void *out; pa_ssize o_rs, o_cs;         /* (L, Ev) */
    void *w; pa_ssize w_rs, w_cs;           /* (L, S) weights, or NULL */
    void *lse; pa_ssize lse_s;              /* (L,) log-sum-exp of the rows, or NULL */
    int bf16;                               /* precision "bf16": the tiled bfloat16 path */
    int q8;                                 /* precision "int8": the rows path, q8rowdot */
    int qbf16;                              /* precision "bf16", a quantized k: the rows path,
                                               qrowdot (fp8 K or V: qbf16_dot) on the query
                                               rounded to bfloat16 */
    const uint16_t *kvp;                    /* bf16: K, V packed per key tile (pa_bf16_pack_kv), */
    pa_ssize kvp_tile;                      /* tile t at kvp + t * kvp_tile; or NULL */
    pa_kv_head kv;                          /* where key j's rows of K and V and their scales
                                               lie (pa_kv_row); k_rs, v_rs above are
                                               kv.rs[PA_KV_K], kv.rs[PA_KV_V] */
    pa_bm_head bm;                          /* block mask (bm.state NULL: none) */
} pa_attn_args;

/* a read prefetch hint (the paged rows path's next block), where the compiler has one */
static inline void pa_prefetch(const void *p)
{
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0, 1);
#else
    (void)p;
#endif
}
/* A paged cache's rows [j, j1) of pool x (base: the pool's first byte, es
 * bytes an element, rb bytes a row) prefetched block by block through the
 * table: one lookup per block, the lines of rows that lie together (rows
 * rs[x] elements apart, rb bytes each) once each. */
static inline void pa_kv_prefetch(const pa_kv_head *h, int x, const void *base, pa_ssize es, pa_ssize rb,
                                  pa_ssize j, pa_ssize j1)
{
    const pa_ssize rs = h->rs[x] * es;
    for (pa_ssize je; j < j1; j = je) {
        je = pa_kv_run(h, j, j1);
        const char *p = (const char *)base + pa_kv_row(h, x, j) * es;
        if (rs == rb) {                         /* the run's rows in one piece */
            const uintptr_t a0 = (uintptr_t)p & ~(uintptr_t)63, a1 = (uintptr_t)p + (uintptr_t)((je - j) * rb);
            for (uintptr_t a = a0; a < a1; a += 64) pa_prefetch((const void *)a);
        } else {
            for (pa_ssize r = 0; r < je - j; r++)
                for (pa_ssize o = 0; o < rb; o += 64) pa_prefetch(p + r * rs + o);
        }
    }
}
/* Element idx of q, k or v (stored as sd) in the compute dtype: the reads
 * of the exact path; the tiled paths widen whole tiles instead. */
static inline float pa_ld_f32(const void *p, pa_ssize idx, int sd) { return pa_load_f32(p, idx, sd); }
static inline double pa_ld_f64(const void *p, pa_ssize idx, int sd)
{
    (void)sd;
    return ((const double *)p)[idx];
}

/* THE score rule of attention, after s = scale * q_i . k_j (API.md, in this
 * order): softcap, the additive mask, ALiBi, then admissibility (the key
 * range of pa_key_range and a bool mask; pa_admit_*). Applied to the n
 * scores s[t*ss] of keys j0 + t of query row i; every frame and path of the
 * forward calls it, so the rule exists once. */
#define PA_DEFINE_SCORES(T, DT, DTYPE)                                              \
    /* admissibility alone: the key range and a bool mask (frames that ran the  \
     * transforms themselves; no float mask then) */                            \
    static inline void pa_attn_admit_##DT(const pa_attn_args *a, pa_ssize i,        \
                                          pa_ssize j0, T *s, pa_ssize ss,           \
                                          pa_ssize n)                               \
    {                                                                               \
        pa_ssize lo, hi;                                                            \
        pa_key_range(&a->rule, i, &lo, &hi);                                        \
        pa_admit_##DT(&a->mask, i, j0, s, ss, n, lo - j0, hi - j0);                 \
        if (a->bm.state) pa_bm_admit_##DT(&a->bm, i, j0, s, ss, n);                 \
    }                                                                               \
    static inline void pa_attn_scores_##DT(const pa_attn_args *a, pa_ssize i,       \
                                           pa_ssize j0, T *s, pa_ssize ss,          \
                                           pa_ssize n)                              \
    {                                                                               \
        pa_ssize lo, hi;                                                            \
        pa_key_range(&a->rule, i, &lo, &hi);                                        \
        lo -= j0; hi -= j0;                                                         \
        if (lo < 0) lo = 0;                                                         \
        if (lo > n) lo = n;                                                         \
        if (hi > n) hi = n;                                                         \
        if (a->softcap > 0) {               /* the family's softcap, element by     \
                                               element where s is strided */        \
            const pa_softcap_fn cap = a->fam->softcap[DTYPE].fn;                    \
            if (ss == 1) cap(s + lo, hi - lo, a->softcap);                          \
            else for (pa_ssize t = lo; t < hi; t++) cap(s + t * ss, 1, a->softcap); \
        }                                                                           \
        pa_admit_##DT(&a->mask, i, j0, s, ss, n, lo, hi);                           \
        if (a->bm.state) pa_bm_admit_##DT(&a->bm, i, j0, s, ss, n);                 \
        if (a->slope != 0) {                                                        \
            const T sl = (T)a->slope;                                               \
            const pa_ssize d = i / a->rule.div + a->rule.qoff - j0;                 \
            for (pa_ssize t = lo; t < hi; t++)                                      \
                s[t * ss] -= sl * (T)(d > t ? d - t : t - d);                       \
        }                                                                           \
    }
PA_DEFINE_SCORES(float, f32, PA_F32)
PA_DEFINE_SCORES(double, f64, PA_F64)
#undef PA_DEFINE_SCORES

/* inside: rows [i0, i1) all admit keys [j0, j1) (no mask; the key range's
 * ends grow with i: pa_keyrule), so no score of the tile is excluded. plain:
 * and nothing changes the scores (no softcap or ALiBi): the frame may leave
 * such a tile as the GEMM wrote it. */
static inline int pa_attn_tile_inside(const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                                      pa_ssize j0, pa_ssize j1)
{
    if (a->mask.kind != PA_MASK_NONE) return 0;
    if (a->bm.state && pa_bm_tile(&a->bm, i0, i1, j0, j1) != PA_BM_FULL) return 0;
    pa_ssize lo0, hi0, lo1, hi1;
    pa_key_range(&a->rule, i0, &lo0, &hi0);
    pa_key_range(&a->rule, i1 - 1, &lo1, &hi1);
    return lo1 <= j0 && j1 <= hi0;
}
static inline int pa_attn_tile_plain(const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                                     pa_ssize j0, pa_ssize j1)
{
    return a->softcap == 0 && a->slope == 0 && pa_attn_tile_inside(a, i0, i1, j0, j1);
}

/* the block mask excludes every score of rows [i0, i1) x keys [j0, j1): the
 * frames skip the tile (its weights would all be 0: no sum changes) */
static inline int pa_attn_tile_empty(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, pa_ssize j0,
                                     pa_ssize j1)
{
    return a->bm.state && pa_bm_tile(&a->bm, i0, i1, j0, j1) == PA_BM_EMPTY;
}

/* query columns of a tile, padded so that both MR and NR tile them */
static inline pa_ssize pa_attn_lcm(int mr, int nr)
{
    pa_ssize lcm = mr;
    while (lcm % nr) lcm += mr;
    return lcm;
}

/* THE dropout test: score (i, j) of the head is dropped when the uniform of
 * its counter ctr_base + i*S + j is below p (pyattn/_reference.py draws the
 * same); callers test p > 0 first. */
static inline int pa_attn_dropped(const pa_attn_args *a, pa_ssize i, pa_ssize j)
{
    return pa_uniform(a->dropout_key, a->ctr_base + (uint64_t)(i * a->S + j)) < a->dropout_p;
}

/* The key tiles the tiled paths visit for query rows [i0, i1): those that
 * meet the block's key range (pa_block_keys) within [key_begin, key_end),
 * on the fixed grid key_begin + a multiple of PA_FLASH_BK -- so a row's tiles
 * (and its bits) do not depend on the block it is in. Tiles start at *j0,
 * keys end at *j1; none when *j0 >= *j1. */
static inline void pa_attn_key_tiles(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, pa_ssize *j0,
                                     pa_ssize *j1)
{
    pa_ssize lo, hi;
    pa_block_keys(&a->rule, i0, i1, &lo, &hi);
    lo = pa_max(lo, a->key_begin);
    hi = pa_min(hi, a->key_end);
    *j0 = lo < hi ? a->key_begin + (lo - a->key_begin) / PA_FLASH_BK * PA_FLASH_BK : hi;
    *j1 = hi;
}

/* THE sub-tile cut, for a tile some of whose keys lie outside some rows'
 * key ranges (the causal diagonal, a window's edge): per group u of NR
 * query columns of the block [i0, i0 + nq) (qc columns; padding columns
 * take row nq - 1's range), the keys [lo[u], hi[u]) some of its rows see.
 * A sub-tile of keys [ka, kb) outside them (pa_attn_cut_out) is left out:
 * its scores are -inf, as the score rule would make them. */
static inline void pa_attn_cut(const pa_attn_args *a, pa_ssize i0, pa_ssize nq, pa_ssize qc, int NR,
                               pa_ssize *lo, pa_ssize *hi)
{
    for (pa_ssize c0 = 0, u = 0; c0 < qc; c0 += NR, u++)
        pa_block_keys(&a->rule, i0 + pa_min(c0, nq - 1), i0 + pa_min(c0 + NR, nq), lo + u, hi + u);
}
static inline int pa_attn_cut_out(pa_ssize ka, pa_ssize kb, pa_ssize lo, pa_ssize hi)
{
    return ka >= hi || kb <= lo;
}

/* The end of a row: from its running max m and sum l (of exp(s - m) over the
 * admissible keys), the factor that turns the unnormalised output into the
 * result (keep = 1/(1-p) under dropout; a sink adds exp(sink) to the
 * denominator) and the row's log-sum-exp. A row with nothing admissible (l =
 * 0) and no sink gives factor 0 and lse -inf; NaN in l spreads. In double
 * for both dtypes. */
static inline double pa_attn_finish(const pa_attn_args *a, double m, double l, double keep,
                                    double *lse)
{
    if (!a->has_sink) {
        if (l == 0) { *lse = -INFINITY; return 0; }
        *lse = m + log(l);
        return keep / l;
    }
    const double M = m > a->sink ? m : a->sink;
    if (M == -INFINITY) { *lse = -INFINITY; return 0; }
    const double em = (m == -INFINITY) ? 0.0 : exp(m - M);
    const double den = l * em + exp(a->sink - M);
    *lse = M + log(den);
    return keep * em / den;
}

#endif
