/*
 * blockmask.h -- block masks (pyattn.BlockMask, issue #26): a mask given as
 * a map of tiles, each empty, full or partial, with the bits of the partial
 * tiles only. Below the ops (ops.h carries the call's pa_bmask in
 * pa_attn_call.block_mask; attention.h gives each head a pa_bm_head).
 *
 * The grid: tiles of PA_BM_QB query positions x PA_BM_KB keys from (0, 0).
 * PA_BM_KB is the flash frame's key tile (PA_FLASH_BK), so a frame tile of
 * a call over all keys is one block-mask column; PA_BM_QB = 96 is a
 * multiple of every family's query block (attn_bq: 48 or 96), and the
 * forward runs its query blocks at the family's attn_bq when a block mask
 * is given (no equal-height cut), so a frame block lies in one block-mask
 * row. Frames whose tiles lie elsewhere (the split decode's key chunks,
 * pyattn.dask's blocks, a cache's rows) still read the map correctly: a
 * frame tile's state is that of the block-mask tiles it covers.
 *
 * Partial tiles: PA_BM_QB rows of one 64-bit word each, bit c = key c of
 * the tile (bits 60..63 unused, 0). Positions outside [0, L) x [0, S) of the
 * block mask read as excluded.
 */
#ifndef PYATTN_OPS_BLOCKMASK_H
#define PYATTN_OPS_BLOCKMASK_H

#include "family.h"

#define PA_BM_QB 96
#define PA_BM_KB PA_FLASH_BK
#define PA_BM_EMPTY 0
#define PA_BM_FULL 1
#define PA_BM_PARTIAL 2

/* A call's block mask (the binding fills it; arrays C-contiguous). */
typedef struct pa_bmask {
    pa_ssize L, S;              /* the block mask's positions and keys */
    pa_ssize nqt, nkt;          /* tiles: ceil(L / QB), ceil(S / KB) */
    pa_ssize nslab;             /* (B or 1) * (H or 1) */
    const uint8_t *state;       /* (nslab, nqt, nkt): PA_BM_* */
    const int64_t *index;       /* (nslab, nqt, nkt): a partial tile's number, else -1 */
    const uint64_t *bits;       /* (npartial, QB) */
    const int64_t *slab;        /* (count,): the slab of each flat batch index;
                                   varlen: (nseq, count), sequence i's heads at i * count */
    pa_ssize q_extra, k_extra;  /* row i is position i / div + (cache offset) + q_extra,
                                   key j is key j + k_extra (pyattn.dask's blocks) */
} pa_bmask;

/* One head's view of it: state NULL when the call has none. Row i of the
 * head sits at position i / div + qoff, key j at j + koff. */
typedef struct {
    const uint8_t *state;       /* (nqt, nkt) of the head's slab */
    const int64_t *index;
    const uint64_t *bits;
    pa_ssize L, S, nqt, nkt, qoff, koff, div;
} pa_bm_head;

/* The state of the rows [i0, i1) x keys [j0, j1) (both non-empty): EMPTY
 * when every covered tile is empty, FULL when every one is full, else
 * PARTIAL. */
static inline int pa_bm_tile(const pa_bm_head *h, pa_ssize i0, pa_ssize i1, pa_ssize j0, pa_ssize j1)
{
    pa_ssize p0 = i0 / h->div + h->qoff, p1 = (i1 - 1) / h->div + h->qoff + 1;
    pa_ssize k0 = j0 + h->koff, k1 = j1 + h->koff;
    int any = 0, all = 1;
    if (p0 < 0 || p1 > h->L || k0 < 0 || k1 > h->S) all = 0;   /* outside: excluded */
    p0 = pa_max(p0, 0); p1 = pa_min(p1, h->L);
    k0 = pa_max(k0, 0); k1 = pa_min(k1, h->S);
    if (p0 >= p1 || k0 >= k1) return PA_BM_EMPTY;
    for (pa_ssize tq = p0 / PA_BM_QB; tq <= (p1 - 1) / PA_BM_QB; tq++) {
        const uint8_t *st = h->state + tq * h->nkt;
        for (pa_ssize tk = k0 / PA_BM_KB; tk <= (k1 - 1) / PA_BM_KB; tk++) {
            any |= st[tk] != PA_BM_EMPTY;
            all &= st[tk] == PA_BM_FULL;
        }
    }
    return all ? PA_BM_FULL : any ? PA_BM_PARTIAL : PA_BM_EMPTY;
}

/* The sub-tile cut narrowed by the block mask, for the frame tile of the
 * query block [i0, i0 + nq) (qc columns, padding columns taking row nq - 1)
 * and keys [j0, j0 + nj): per group u of NR columns, [lo[u], hi[u]) (the
 * key rule's, pa_attn_cut) is cut to the keys some row of the group may
 * see under the block mask (empty: lo = hi = j0). A sub-tile outside is
 * left out with scores -inf, as pa_bm_admit_* would make them: same bits. */
static inline void pa_bm_cut(const pa_bm_head *h, pa_ssize i0, pa_ssize nq, pa_ssize qc, int NR, pa_ssize j0,
                             pa_ssize nj, pa_ssize *lo, pa_ssize *hi)
{
    const pa_ssize ka = pa_max(j0 + h->koff, 0), kz = pa_min(j0 + nj + h->koff, h->S);
    for (pa_ssize c0 = 0, u = 0; c0 < qc; c0 += NR, u++) {
        pa_ssize klo = PTRDIFF_MAX, khi = PTRDIFF_MIN;
        const pa_ssize ra = i0 + pa_min(c0, nq - 1), rb = pa_max(i0 + pa_min(c0 + NR, nq), ra + 1);
        for (pa_ssize i = ra; i < rb; i++) {
            const pa_ssize p = i / h->div + h->qoff;
            if (p < 0 || p >= h->L) continue;
            const pa_ssize tq = p / PA_BM_QB, r = p % PA_BM_QB;
            for (pa_ssize k = ka; k < kz;) {
                const pa_ssize tk = k / PA_BM_KB, kb = tk * PA_BM_KB, ke = pa_min(kb + PA_BM_KB, kz);
                const pa_ssize x = tq * h->nkt + tk;
                if (h->state[x] == PA_BM_FULL) {
                    klo = pa_min(klo, k);
                    khi = pa_max(khi, ke);
                } else if (h->state[x] == PA_BM_PARTIAL) {
                    const uint64_t seg = ((((uint64_t)1 << (ke - kb)) - 1) >> (k - kb)) << (k - kb);
                    const uint64_t w = h->bits[h->index[x] * PA_BM_QB + r] & seg;
                    if (w) {
                        klo = pa_min(klo, kb + __builtin_ctzll(w));
                        khi = pa_max(khi, kb + 64 - __builtin_clzll(w));
                    }
                }
                k = ke;
            }
        }
        if (klo >= khi) {
            lo[u] = hi[u] = j0;
        } else {
            lo[u] = pa_max(lo[u], klo - h->koff);
            hi[u] = pa_min(hi[u], khi - h->koff);
            if (hi[u] < lo[u]) hi[u] = lo[u];
        }
    }
}

/* The block mask on n scores s[t*ss] of keys j0 + t of row i: an excluded
 * score becomes -inf (the admissibility rule's other half, pa_admit_*). */
#define PA_DEFINE_BM_ADMIT(T, DT)                                                   \
    static inline void pa_bm_admit_##DT(const pa_bm_head *h, pa_ssize i, pa_ssize j0, \
                                        T *s, pa_ssize ss, pa_ssize n)              \
    {                                                                               \
        const pa_ssize p = i / h->div + h->qoff;                                    \
        pa_ssize t = 0;                                                             \
        if (p < 0 || p >= h->L) {                                                   \
            for (; t < n; t++) s[t * ss] = (T)-INFINITY;                            \
            return;                                                                 \
        }                                                                           \
        const pa_ssize tq = p / PA_BM_QB, r = p % PA_BM_QB;                         \
        while (t < n) {                                                             \
            const pa_ssize k = j0 + t + h->koff;                                    \
            if (k < 0 || k >= h->S) { s[t * ss] = (T)-INFINITY; t++; continue; }    \
            const pa_ssize tk = k / PA_BM_KB, kb = tk * PA_BM_KB;                   \
            const pa_ssize e = pa_min(n, t + pa_min(kb + PA_BM_KB, h->S) - k);      \
            const pa_ssize x = tq * h->nkt + tk;                                    \
            if (h->state[x] == PA_BM_EMPTY) {                                       \
                for (; t < e; t++) s[t * ss] = (T)-INFINITY;                        \
            } else if (h->state[x] == PA_BM_FULL) {                                 \
                t = e;                                                              \
            } else {                    /* the row's word: all set, none, or bit by bit */ \
                const pa_ssize c0 = k - kb, c1 = c0 + (e - t);                      \
                const uint64_t seg = (c1 - c0 == 64 ? ~(uint64_t)0                  \
                                      : (((uint64_t)1 << (c1 - c0)) - 1)) << c0;    \
                const uint64_t w = h->bits[h->index[x] * PA_BM_QB + r] & seg;       \
                if (w == seg) t = e;                                                \
                else if (w == 0) for (; t < e; t++) s[t * ss] = (T)-INFINITY;       \
                else for (pa_ssize c = c0; t < e; t++, c++)                         \
                    if (!((w >> c) & 1u)) s[t * ss] = (T)-INFINITY;                 \
            }                                                                       \
        }                                                                           \
    }
PA_DEFINE_BM_ADMIT(float, f32)
PA_DEFINE_BM_ADMIT(double, f64)
#undef PA_DEFINE_BM_ADMIT

/* The builder's packer (blockmask.c): n tiles of bools m (n, QB, KB) (1:
 * may attend), tile k at tile row tq[k], column tk[k] of a block mask of
 * L positions x S keys; per tile its state (of the positions inside L x S
 * only) into state[k] and its rows' bits into bits[k * QB ...] (0 outside
 * L x S). */
void pa_bm_pack(const uint8_t *m, pa_ssize n, const int64_t *tq, const int64_t *tk, pa_ssize L,
                pa_ssize S, uint8_t *state, uint64_t *bits);

#endif
