/*
 * attention.h -- the attention frame's own pieces, shared by the two ops,
 * attention.c (the forward: tasks, threads) and attn_backward.c (the
 * backward), and what they call, below them: attn_args.c (one head's
 * pa_attn_args), attn_flash.c (the tiled forward and backward on a
 * family's kernels) and attention_ref.c (the exact portable path). Calls
 * go down only: ops -> attn_args.c, attn_flash.c -> attention_ref.c. Not
 * seen by kernels.
 *
 * Shapes per head (one flattened batch index): q (L, E), k (S, E),
 * v (S, Ev), mask (L, S), out (L, Ev), w (L, S); strides in elements.
 */
#ifndef PYATTN_OPS_ATTENTION_H
#define PYATTN_OPS_ATTENTION_H

#include "ops.h"
#include "blockmask.h"

/* decode shapes (few queries, many keys): keys split into fixed chunks, one
 * task each, merged in chunk order -- a partition that depends on the shape
 * only, never on the thread count */
#define PA_SPLIT_MAXL 8
#define PA_SPLIT_MINS 4096
#define PA_SPLIT_CHUNK 2048
/* precision "bf16" on few query rows (decode): the rows path on bfloat16
 * values (attn_flash.c, pa_bf16_rows_*) where L <= PA_SPLIT_MAXL, or the
 * query heads of a key/value head stacked as rows (div > 1) up to
 * PA_BF16_ROWS_MAXL rows; its split's chunks lie on the key tiles' grid
 * (a multiple of PA_FLASH_BK): no key tile crosses two chunks */
#define PA_BF16_ROWS_MAXL 32
#define PA_BF16_SPLIT_CHUNK (34 * PA_FLASH_BK)
static inline int pa_bf16_rows_shape(pa_ssize L, pa_ssize div, pa_ssize E, pa_ssize Ev)
{
    return (L <= PA_SPLIT_MAXL || (div > 1 && L <= PA_BF16_ROWS_MAXL)) && E <= PA_FLASH_MAXD && Ev <= PA_FLASH_MAXD;
}
/* head dims the rows path (decode: few query rows, or a GQA group's stacked
 * as rows) runs on the family's row kernels; larger ones, and the tiled
 * path's past PA_FLASH_MAXD, take the exact (reference) path. Its workspace
 * grows with them: (PA_FLASH_BK + the query block) x (E + Ev) values. */
#define PA_ROWS_MAXD 4096
static inline int pa_rows_dims(pa_ssize E, pa_ssize Ev)
{
    return E <= PA_ROWS_MAXD && Ev <= PA_ROWS_MAXD;
}
/* query rows and keys per block of the reference path (its workspace) */
#define PA_REF_BQ 16
#define PA_REF_BK 64

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
    const uint16_t *kvp;                    /* bf16: K, V packed per key tile (pa_bf16_pack_kv), */
    pa_ssize kvp_tile;                      /* tile t at kvp + t * kvp_tile; or NULL */
    const int64_t *bt_row;                  /* a paged cache (ops/paged.h): key j in row j % bsz */
    pa_ssize bsz, k_blk, v_blk;             /* of block bt_row[j / bsz] (block strides k_blk, v_blk;
                                               k_rs, v_rs within a block); NULL: rows j * k_rs */
    /* a quantized K / V (k_dt, v_dt PA_I8 or PA_I4, float32 compute; their
     * element and strides are bytes, rows contiguous): float32 scales, row j's
     * at ks + j * ks_rs, one per group of kG values (V: vs, vs_rs, vG); NULL
     * when not quantized */
    const float *ks, *vs;
    pa_ssize ks_rs, vs_rs, kG, vG;
    pa_bm_head bm;                          /* block mask (bm.state NULL: none) */
    pa_ssize ks_blk, vs_blk;                /* a paged quantized cache: the scale pools'
                                               block strides (ks_rs, vs_rs within a block) */
} pa_attn_args;

/* THE element offsets of key row j in k and v (from a->k, a->v): through
 * the block table of a paged cache, else j rows down. Every frame reads K
 * and V rows through these (or, in the tiled paths, per run of rows that
 * lie in one block: pa_attn_run). */
static inline pa_ssize pa_attn_krow(const pa_attn_args *a, pa_ssize j)
{
    if (!a->bt_row) return j * a->k_rs;
    return (pa_ssize)a->bt_row[j / a->bsz] * a->k_blk + (j % a->bsz) * a->k_rs;
}
static inline pa_ssize pa_attn_vrow(const pa_attn_args *a, pa_ssize j)
{
    if (!a->bt_row) return j * a->v_rs;
    return (pa_ssize)a->bt_row[j / a->bsz] * a->v_blk + (j % a->bsz) * a->v_rs;
}
/* THE element offsets of key row j's scales in ks and vs (a quantized
 * K / V): through the block table as the rows are */
static inline pa_ssize pa_attn_ksrow(const pa_attn_args *a, pa_ssize j)
{
    if (!a->bt_row) return j * a->ks_rs;
    return (pa_ssize)a->bt_row[j / a->bsz] * a->ks_blk + (j % a->bsz) * a->ks_rs;
}
static inline pa_ssize pa_attn_vsrow(const pa_attn_args *a, pa_ssize j)
{
    if (!a->bt_row) return j * a->vs_rs;
    return (pa_ssize)a->bt_row[j / a->bsz] * a->vs_blk + (j % a->bsz) * a->vs_rs;
}
/* a read prefetch hint (the paged rows path's next block), where the compiler has one */
static inline void pa_prefetch(const void *p)
{
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p, 0, 1);
#else
    (void)p;
#endif
}
/* the end of the run of rows from j that lie in one block (at most j1) */
static inline pa_ssize pa_attn_run(const pa_attn_args *a, pa_ssize j, pa_ssize j1)
{
    return a->bt_row ? pa_min(j1, (j / a->bsz + 1) * a->bsz) : j1;
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

/* The tiled forward (attn_flash.c) for query rows [i0, i1) of one head, on
 * family f's kernels; ws: a workspace of pa_flash_ws bytes, aligned to 64
 * (0: the size overflows). pa_flash_merge combines query row i of one head
 * from the partials of nchunks key chunks (chunk c at partials + c *
 * chunk_stride elements, row i at i * (2 + Ev) within it), in chunk order. */
size_t pa_flash_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev);
void pa_flash_run(const pa_family *f, int dtype, const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                  void *ws);
void pa_flash_merge(int dtype, const pa_attn_args *a, pa_ssize i, const void *partials,
                    pa_ssize nchunks, pa_ssize chunk_stride, void *ws);

/* Shared-prefix (cascade) reads (attention.c groups the heads): the rows
 * path of the decode split for n >= 2 heads grp[0, n) of one call (L <=
 * PA_SPLIT_MAXL rows, or a GQA group's; the same [key_begin, key_end))
 * whose keys [key_begin, kshared) -- kshared on the key tiles' grid, within
 * every member's filled keys -- are the same rows of the same paged pool
 * (the same blocks of the same head; scales too): each key tile there read
 * once for all, then each member's other tiles alone; every member's
 * partial written as its own pa_flash_run would (the same bits). ws:
 * pa_flash_shared_ws for n * L rows (0: the size overflows), aligned to 64. */
size_t pa_flash_shared_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev, pa_ssize R);
void pa_flash_shared(const pa_family *f, int dtype, const pa_attn_args *const *grp, pa_ssize n,
                     pa_ssize kshared, void *ws);

/* The pa_attn_args of flat batch index b of attention call c (attn_args.c):
 * operands, the key rule, per-head options. */
void pa_attn_setup(pa_attn_args *a, const pa_family *fam, const pa_attn_call *c, pa_ssize b);

/* The backward's own operands of one head (strides in elements): the
 * forward's output o and lse, the incoming gradient go, and the gradients
 * it adds into: dq (L, E), dk (S, E), dv (S, Ev); dsink receives the sink's
 * gradient (or NULL). */
typedef struct {
    const void *o; pa_ssize o_rs, o_cs;
    const void *go; pa_ssize go_rs, go_cs;
    const void *lse; pa_ssize lse_s;
    void *dq; pa_ssize dq_rs, dq_cs;
    void *dk; pa_ssize dk_rs, dk_cs;
    void *dv; pa_ssize dv_rs, dv_cs;
    double *dsink;
} pa_bwd_io;

/* The tiled backward of one head (attn_backward.inc) on family f's kernels;
 * ws: pa_bwd_ws bytes, aligned to 64 (0: the size overflows). */
size_t pa_bwd_ws(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev);
void pa_bwd_head(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *ws);
/* pa_bwd_head in two steps (the key-split, attn_backward.c): the packed
 * query side into qs (pa_bwd_ws_qside bytes, aligned to 64), then the key
 * tiles [a->key_begin, a->key_end) on it (read only) with tiles (the rest
 * of pa_bwd_ws, aligned to 64) */
size_t pa_bwd_ws_qside(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev);
void pa_bwd_pack(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs);
/* pa_bwd_pack of the query blocks [t0, t1) (of attn_bq rows) only: slices
 * of one head packed in parallel */
void pa_bwd_pack_blocks(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *qs,
                        pa_ssize t0, pa_ssize t1);
void pa_bwd_keys(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, const void *qs,
                 void *tiles);
/* pa_bwd_head with the key-split the dense call (call: one sequence's,
 * nouter key/value heads) would run, its chunks in turn: the same bits
 * (attn_backward.c) */
void pa_bwd_head_chunked(const pa_family *fam, const pa_attn_call *call, pa_ssize nouter, const pa_attn_args *a,
                         const pa_bwd_io *io, void *ws);
/* the dense backward (attn_backward.c); pa_attention_backward (attention.c)
 * routes every call without cu_seqlens_q to it */
int pa_attention_backward_dense(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                                int nthreads);

/* precision "bf16": keys [j0, j0 + nj) of K and V packed for the family's
 * gemm_bf16 (attn_flash.c); pa_bf16_kv_tile: the elements of one tile. */
void pa_bf16_pack_kv(const pa_family *f, const pa_attn_args *a, pa_ssize j0, pa_ssize nj,
                     uint16_t *Kp, uint16_t *Vp);
pa_ssize pa_bf16_kv_tile(const pa_family *f, pa_ssize E, pa_ssize Ev);
/* precision "bf16", the rows path's split (pa_bf16_rows_shape, S >=
 * PA_SPLIT_MINS; attention.c): pass 1, pa_bf16_rows_scores, per key chunk
 * of PA_BF16_SPLIT_CHUNK keys (a->key_begin, a->key_end), the scores of
 * every row into sc (row r at sc + r * ld, ld >= the chunk); pass 2,
 * pa_bf16_rows_finish, per head over all its keys: the rows path on those
 * scores (chunk c's at sc + c * cs), the output rows. The scores are the
 * values the rows path computes itself, and pass 2 runs its steps in its
 * order: the bits of the call without the split (so varlen and paged
 * calls, which do not split these, give the same). The workspace is
 * pa_flash_ws's. */
void pa_bf16_rows_scores(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, void *ws);
void pa_bf16_rows_finish(const pa_family *f, const pa_attn_args *a, float *sc, pa_ssize ld, pa_ssize cs,
                         void *ws);

/* The exact path (attention_ref.c), rows [i0, i1), at most PA_REF_BQ. */
size_t pa_attn_ref_ws(int dtype, pa_ssize E, pa_ssize Ev);
void pa_attn_ref_f32(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);
void pa_attn_ref_f64(const pa_attn_args *a, pa_ssize i0, pa_ssize i1, void *ws);


/* A task of a packed call (attn_varlen.c, paged_packed.c): query rows
 * [i0, i1) of head b of sequence seq (chunk -1), or key chunk `chunk` of
 * all its rows into the partials at element poff (chunk >= 0), or the merge
 * of its nchunks partials (chunk -2); cost orders the list. */
typedef struct {
    pa_ssize seq, b, i0, i1, chunk, nchunks;
    size_t poff;
    double cost;
} pa_seq_task;

/* qsort order of seq tasks: most work first; then by sequence, head, chunk,
 * and a head's query blocks last-first (as the dense op: the long rows of a
 * causal head start early, its K and V stay in cache across its blocks) */
int pa_seq_task_cmp(const void *x, const void *y);

/* Run task k on a (set up for its sequence s and head): a key chunk into
 * the partials, the merge of a split sequence's partials, or query rows. */
void pa_seq_task_run(const pa_family *fam, pa_attn_args *a, const pa_attn_call *s, const pa_seq_task *k,
                     char *partials, void *ws);

#endif
