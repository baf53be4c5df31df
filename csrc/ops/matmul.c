/*
 * matmul.c -- batched GEMM, GotoBLAS/BLIS structure.
 *
 * Shapes: A (B, M, K), B (B, K, N), C (B, M, N), bias (N,).
 *
 * A task is (batch b, a chunk of rows -- whole MC blocks --, a block of NC
 * columns) of C. Inside a task: for each KC panel, in order: pack B
 * (KC x NC) once, then for each MC block of the chunk pack A (MC x KC) and
 * run the micro-kernel over MR x NR tiles (the call's family's). The
 * chunk size only spreads the work over threads (a few chunks per thread,
 * so B is packed a few times, not once per MC block); the reduction over K
 * never leaves a task and always runs in the same KC panels, so an element's
 * arithmetic does not depend on the thread count or on its batch.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "cpu.h"
#include "ops.h"
#include "threads.h"

#define PA_TEMPLATE "ops/pack.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE

typedef struct {
    int dtype;               /* compute dtype: C, bias, the packed panels */
    int a_dt, b_dt;          /* storage of A and B: dtype, or PA_F16 / PA_BF16 (float32) */
    pa_ssize esa, esb;       /* their element sizes */
    const pa_batch *bt;
    pa_ssize M, N, K;
    const pa_operand *A, *B, *C;
    const void *bias; pa_ssize bias_s;
    pa_gemm_kernel g;        /* fam->gemm[dtype], or fam->gemm_bf16 */
    int bf16;                /* precision "bf16": operands rounded to bfloat16 as they are packed */
    size_t pes;              /* bytes of a packed element (2 for bfloat16) */
    pa_ssize mb, panels;     /* MC blocks along M, MR panels along M (m_row) */
    pa_ssize mchunk, mchunks, nblocks;   /* MC blocks per task, tasks along M, along N */
    void **ws;               /* per thread: packed A then packed B */
    size_t a_elems;
} gemm_ctx;

/* Packing from 16-bit storage: as pack_a_f32 / pack_b_f32 (pack.inc),
 * widening each element as it is copied -- the operand is read in place,
 * never converted whole. */
static void pack_a_w16(const void *A, pa_ssize rs, pa_ssize cs, pa_ssize mc, pa_ssize kc, int MR,
                       float *dst, int sd)
{
    for (pa_ssize i0 = 0; i0 < mc; i0 += MR) {
        const pa_ssize m = pa_min(mc - i0, MR);
        for (pa_ssize p = 0; p < kc; p++) {
            const pa_ssize base = i0 * rs + p * cs;
            pa_ssize i = 0;
            for (; i < m; i++) dst[i] = pa_load_f32(A, base + i * rs, sd);
            for (; i < MR; i++) dst[i] = 0;
            dst += MR;
        }
    }
}

static void pack_b_w16(const void *B, pa_ssize rs, pa_ssize cs, pa_ssize kc, pa_ssize nc, int NR,
                       float *dst, int sd)
{
    for (pa_ssize j0 = 0; j0 < nc; j0 += NR) {
        const pa_ssize n = pa_min(nc - j0, NR);
        for (pa_ssize p = 0; p < kc; p++) {
            const pa_ssize base = p * rs + j0 * cs;
            pa_ssize j = 0;
            for (; j < n; j++) dst[j] = pa_load_f32(B, base + j * cs, sd);
            for (; j < NR; j++) dst[j] = 0;
            dst += NR;
        }
    }
}

/* Packing for bfloat16 products (precision "bf16"): pair panels
 * (family.h, gemm_bf16), each element rounded to bfloat16 (nearest even) as
 * it is copied; K is padded to even with zeros. */
static void pack_a_pairs(const void *A, pa_ssize rs, pa_ssize cs, pa_ssize mc, pa_ssize kc, int MR,
                         uint16_t *dst, int sd)
{
    const pa_ssize nq = (kc + 1) / 2;
    for (pa_ssize i0 = 0; i0 < mc; i0 += MR) {
        const pa_ssize m = pa_min(mc - i0, MR);
        if (sd == PA_F32 && m == MR) {            /* float32, a whole panel: the same words, branch-free */
            const float *a = (const float *)A + i0 * rs;
            uint32_t *w = (uint32_t *)(void *)dst;
            const pa_ssize nf = kc / 2;          /* pairs with both elements */
            for (pa_ssize q = 0; q < nf; q++)
                for (int i = 0; i < MR; i++) w[q * MR + i] = pa_bf16_pair(a[i * rs + 2 * q * cs], a[i * rs + (2 * q + 1) * cs]);
            if (nf < nq)
                for (int i = 0; i < MR; i++) w[nf * MR + i] = pa_bf16_round(pa_f32_bits(a[i * rs + 2 * nf * cs])) >> 16;
            dst += nq * MR * 2;
            continue;
        }
        for (pa_ssize q = 0; q < nq; q++)
            for (int i = 0; i < MR; i++)
                for (int t = 0; t < 2; t++) {
                    const pa_ssize p = 2 * q + t;
                    *dst++ = (i < m && p < kc) ? pa_f32_to_bf16(pa_load_f32(A, (i0 + i) * rs + p * cs, sd)) : 0;
                }
    }
}

/* Whole pair panels of C columns (C a constant where it is called) from
 * unit-stride float32 rows: blocks of 8 pairs (16 rows), panel by panel, as
 * pack_b_rows_ walks float32 rows -- reads walk 16 rows in step, writes
 * fill 8 pair rows of a panel at a time (both stay on few pages; the
 * panel-at-a-time walk down all kc rows missed the cache and the TLB). */
static inline __attribute__((always_inline)) void pack_b_pair_rows(const float *B, pa_ssize rs, pa_ssize kc,
                                                                   pa_ssize npan, const int C, uint32_t *dst)
{
    const pa_ssize nq = (kc + 1) / 2, nf = kc / 2;
    for (pa_ssize q0 = 0; q0 < nq; q0 += 8) {
        const pa_ssize qn = pa_min(nf - q0, 8);          /* whole pairs of this block (may be < 0: none) */
        for (pa_ssize c = 0; c < npan; c++) {
            uint32_t *d = dst + (c * nq + q0) * C;
            const float *src = B + 2 * q0 * rs + c * C;
            for (pa_ssize q = 0; q < qn; q++)
                for (int j = 0; j < C; j++) d[q * C + j] = pa_bf16_pair(src[2 * q * rs + j], src[(2 * q + 1) * rs + j]);
            if (q0 + 8 >= nq && nf < nq)                  /* K odd: the last pair holds one element */
                for (int j = 0; j < C; j++)
                    d[(nf - q0) * C + j] = pa_bf16_round(pa_f32_bits(src[2 * (nf - q0) * rs + j])) >> 16;
        }
    }
}

static void pack_b_pairs(const void *B, pa_ssize rs, pa_ssize cs, pa_ssize kc, pa_ssize nc, int NR,
                         uint16_t *dst, int sd)
{
    const pa_ssize nq = (kc + 1) / 2;
    for (pa_ssize j0 = 0; j0 < nc; j0 += NR) {
        const pa_ssize n = pa_min(nc - j0, NR);
        if (sd == PA_F32 && cs == 1 && j0 == 0 && (NR == 32 || NR == 16 || NR == 8) && nc >= NR) {
            const pa_ssize full = nc / NR;          /* the whole panels, as pack_b_rows_ (pack.inc) */
            if (NR == 32) pack_b_pair_rows((const float *)B, rs, kc, full, 32, (uint32_t *)(void *)dst);
            else if (NR == 16) pack_b_pair_rows((const float *)B, rs, kc, full, 16, (uint32_t *)(void *)dst);
            else pack_b_pair_rows((const float *)B, rs, kc, full, 8, (uint32_t *)(void *)dst);
            dst += full * nq * NR * 2;
            j0 += (full - 1) * NR;
            continue;
        }
        if (sd == PA_F32 && n == NR) {            /* float32, a whole panel: the same words, branch-free */
            const float *b = (const float *)B + j0 * cs;
            uint32_t *w = (uint32_t *)(void *)dst;
            const pa_ssize nf = kc / 2;
            for (pa_ssize q = 0; q < nf; q++)
                for (int j = 0; j < NR; j++) w[q * NR + j] = pa_bf16_pair(b[2 * q * rs + j * cs], b[(2 * q + 1) * rs + j * cs]);
            if (nf < nq)
                for (int j = 0; j < NR; j++) w[nf * NR + j] = pa_bf16_round(pa_f32_bits(b[2 * nf * rs + j * cs])) >> 16;
            dst += nq * NR * 2;
            continue;
        }
        for (pa_ssize q = 0; q < nq; q++)
            for (int j = 0; j < NR; j++)
                for (int t = 0; t < 2; t++) {
                    const pa_ssize p = 2 * q + t;
                    *dst++ = (j < n && p < kc) ? pa_f32_to_bf16(pa_load_f32(B, p * rs + (j0 + j) * cs, sd)) : 0;
                }
    }
}

/* First row of MC block i (i <= mb): the M panels of MR rows dealt out to the
 * mb blocks as evenly as whole panels allow (heights differ by at most MR,
 * each a multiple of MR but the last, which holds M's edge), so the row
 * blocks -- the tasks of the threads -- take equal time: M = 2048 with MR 12
 * is 171 panels, 18 blocks of 9 or 10 panels, not 17 of 120 rows and one of
 * 8. Blocks start on panel boundaries, so no element's arithmetic moves. */
static inline pa_ssize m_row(const gemm_ctx *c, pa_ssize i)
{
    if (i >= c->mb) return c->M;
    const pa_ssize q = c->panels / c->mb, r = c->panels % c->mb;
#if defined(__SIZEOF_INT128__)
    const pa_ssize extra = (pa_ssize)((__int128)i * r / c->mb);
#else
    const pa_ssize extra = (pa_ssize)((double)i * (double)r / (double)c->mb);
#endif
    return pa_min(c->M, (i * q + extra) * c->g.mr);
}

/* K elements of a packed panel: kc, or kc rounded up to even (bfloat16 pairs) */
static inline pa_ssize packed_k(const gemm_ctx *c, pa_ssize kc) { return c->bf16 ? pa_round_up(kc, 2) : kc; }

/* The packers of an operand, by the dtype code it is stored in (as ggml's
 * type_traits): the compute dtypes copy (pack.inc), the 16-bit ones widen
 * to float32 as they copy. A storage type (int8, int4 + scales) is one
 * more row. pack_a: A block (mc, kc) -> MR-row panels; pack_b: B block
 * (kc, nc) -> NR-column panels. */
typedef void (*pa_pack_fn)(const void *src, pa_ssize rs, pa_ssize cs, pa_ssize m, pa_ssize n, int R,
                           void *dst);
#define PA_PACKERS(dt, a, b)                                                                      \
    static void pack_a_##dt(const void *A, pa_ssize rs, pa_ssize cs, pa_ssize mc, pa_ssize kc,   \
                            int MR, void *dst)                                                    \
    {                                                                                             \
        a;                                                                                        \
    }                                                                                             \
    static void pack_b_##dt(const void *B, pa_ssize rs, pa_ssize cs, pa_ssize kc, pa_ssize nc,   \
                            int NR, void *dst)                                                    \
    {                                                                                             \
        b;                                                                                        \
    }
PA_PACKERS(as_f32, pack_a_f32((const float *)A, rs, cs, mc, kc, MR, (float *)dst),
           pack_b_f32((const float *)B, rs, cs, kc, nc, NR, (float *)dst))
PA_PACKERS(as_f64, pack_a_f64((const double *)A, rs, cs, mc, kc, MR, (double *)dst),
           pack_b_f64((const double *)B, rs, cs, kc, nc, NR, (double *)dst))
PA_PACKERS(f16, pack_a_w16(A, rs, cs, mc, kc, MR, (float *)dst, PA_F16),
           pack_b_w16(B, rs, cs, kc, nc, NR, (float *)dst, PA_F16))
PA_PACKERS(bf16, pack_a_w16(A, rs, cs, mc, kc, MR, (float *)dst, PA_BF16),
           pack_b_w16(B, rs, cs, kc, nc, NR, (float *)dst, PA_BF16))
#undef PA_PACKERS
static const struct { pa_pack_fn a, b; } pa_packers[PA_NDTYPES] = {
    [PA_F32] = {pack_a_as_f32, pack_b_as_f32},
    [PA_F64] = {pack_a_as_f64, pack_b_as_f64},
    [PA_F16] = {pack_a_f16, pack_b_f16},
    [PA_BF16] = {pack_a_bf16, pack_b_bf16},
};

static void pack_a(const gemm_ctx *c, const char *Ablk, pa_ssize mc, pa_ssize kc, char *Ap)
{
    if (c->bf16)
        pack_a_pairs(Ablk, c->A->rs, c->A->cs, mc, kc, c->g.mr, (uint16_t *)Ap, c->a_dt);
    else
        pa_packers[c->a_dt].a(Ablk, c->A->rs, c->A->cs, mc, kc, c->g.mr, Ap);
}

static void pack_b(const gemm_ctx *c, const char *Bblk, pa_ssize kc, pa_ssize nc, char *Bp)
{
    if (c->bf16)
        pack_b_pairs(Bblk, c->B->rs, c->B->cs, kc, nc, c->g.nr, (uint16_t *)Bp, c->b_dt);
    else
        pa_packers[c->b_dt].b(Bblk, c->B->rs, c->B->cs, kc, nc, c->g.nr, Bp);
}

/* C block (mc x nc at Cblk) =/+= A block (mc x kc at Ablk, strided) @ the
 * packed B block Bp (kc x nc). Ap: this thread's A packing buffer. */
static void gemm_block(const gemm_ctx *c, const char *Ablk, pa_ssize mc, pa_ssize kc,
                       const char *Bp, pa_ssize nc, char *Cblk, int accumulate, char *Ap)
{
    const pa_gemm_kernel *g = &c->g;
    const size_t es = pa_elsize(c->dtype);
    const pa_ssize crs = c->C->rs, ccs = c->C->cs;
    const pa_ssize pk = packed_k(c, kc);
    pack_a(c, Ablk, mc, kc, Ap);
    for (pa_ssize jr = 0; jr < nc; jr += g->nr) {
        const int n = (int)pa_min(nc - jr, g->nr);
        const char *bpan = Bp + (size_t)(jr * pk) * c->pes;
        for (pa_ssize ir = 0; ir < mc; ir += g->mr) {
            const int m = (int)pa_min(mc - ir, g->mr);
            const char *apan = Ap + (size_t)(ir * pk) * c->pes;
            g->ukr(pk, apan, 1, g->mr, bpan, g->nr, Cblk + (ir * crs + jr * ccs) * (pa_ssize)es,
                   crs, ccs, m, n, accumulate);
        }
    }
}

static void gemm_task(void *ctx_, pa_ssize t, int tid)
{
    const gemm_ctx *c = (const gemm_ctx *)ctx_;
    const pa_gemm_kernel *g = &c->g;
    const pa_ssize jb = t % c->nblocks;
    const pa_ssize ib = (t / c->nblocks) % c->mchunks;
    const pa_ssize b = t / (c->nblocks * c->mchunks);
    const size_t es = pa_elsize(c->dtype);
    const pa_ssize blk0 = ib * c->mchunk, blk1 = pa_min(blk0 + c->mchunk, c->mb);
    const pa_ssize i0 = m_row(c, blk0), j0 = jb * g->nc;
    const pa_ssize mt = m_row(c, blk1) - i0;
    const pa_ssize nc = pa_min(c->N - j0, g->nc);
    const char *A = (const char *)c->A->p + (pa_batch_offset(c->bt, c->A->bs, b) + i0 * c->A->rs) * c->esa;
    const char *B = (const char *)c->B->p + (pa_batch_offset(c->bt, c->B->bs, b) + j0 * c->B->cs) * c->esb;
    char *C = (char *)c->C->p + (pa_batch_offset(c->bt, c->C->bs, b) + i0 * c->C->rs + j0 * c->C->cs) * (pa_ssize)es;
    const char *bias = c->bias ? (const char *)c->bias + j0 * c->bias_s * (pa_ssize)es : NULL;
    char *Ap = (char *)c->ws[tid];
    char *Bp = Ap + c->a_elems * c->pes;
    const pa_ssize crs = c->C->rs, ccs = c->C->cs;

    if (bias || c->K == 0) {
        if (c->dtype == PA_F32) fill_c_f32((float *)C, crs, ccs, mt, nc, (const float *)bias, c->bias_s);
        else fill_c_f64((double *)C, crs, ccs, mt, nc, (const double *)bias, c->bias_s);
    }
    pa_stop_flag *const stop = pa_stop_get();          /* Ctrl-C: between blocks */
    for (pa_ssize p0 = 0; p0 < c->K && !pa_stopping(stop); p0 += g->kc) {
        const pa_ssize kc = pa_min(c->K - p0, g->kc);
        const int accumulate = (p0 > 0) || bias != NULL;
        pack_b(c, B + p0 * c->B->rs * c->esb, kc, nc, Bp);
        for (pa_ssize blk = blk0; blk < blk1 && !pa_stopping(stop); blk++) {
            const pa_ssize ic = m_row(c, blk) - i0, mc = m_row(c, blk + 1) - i0 - ic;
            gemm_block(c, A + (ic * c->A->rs + p0 * c->A->cs) * c->esa, mc, kc, Bp, nc,
                       C + ic * crs * (pa_ssize)es, accumulate, Ap);
        }
    }
}

/* Shared-B path, for few large products on several threads: each KC x NC
 * block of B is packed once, by all threads, into one of two buffers, and
 * used by all: a "step" is one (batch item, N block, K panel) -- its B block
 * packed, then (MC block of rows, part of the NR panels) pairs shared out
 * (parts only where the MC blocks alone would not split evenly over the
 * threads -- 11 blocks on 2 threads wait for a 6th -- each part packs its A
 * block itself). The steps are pipelined: one job of the pool per step runs
 * that step's compute tasks, then the next step's B packing (and, before its
 * first K panel, its bias rows) into the other buffer, in small tasks that
 * fill the end of the job while the last compute tasks finish; so a call
 * makes steps + 1 hand-offs (was 2 per step) and the threads wait for each
 * other less at each one. The arithmetic of every element is that of
 * gemm_task (the same K panels in order, the same kernel), so results are
 * identical whichever path runs, at any thread count. */
typedef struct {
    const char *B;          /* B block origin (row p0, column j0) */
    char *Bp;               /* its packed block (one of the two buffers) */
    const char *A;          /* A at (row 0, column p0) */
    char *C;                /* C at (row 0, column j0) */
    const char *bias;       /* bias at column j0, or NULL */
    pa_ssize p0, kc, nc, npanels, per;
    pa_ssize nparts, ppart; /* compute: column parts, NR panels per part */
    pa_ssize nwhole, tparts, tppart;   /* nparts 1: blocks taken whole, then the
                                          rest in tparts parts of tppart panels */
    int accumulate;
} shared_step;

typedef struct {
    const gemm_ctx *c;
    shared_step cur, nxt;   /* this job computes cur, packs (and fills) nxt */
    pa_ssize ncomp, nfill, npack;   /* the job's tasks, in this order */
} shared_ctx;

/* Column parts for pass 2: the fewest (at most 8, at most one per panel)
 * whose tasks -- MC blocks of rows (the last one shorter) times parts of
 * whole panels (the last one narrower) -- handed out in order to whichever
 * thread is free first, keep every thread busy within 5 % of the end, else
 * the best such split. (Simulated for up to SIM threads; beyond, the tasks
 * are counted as equal.) */
static pa_ssize shared_parts(const gemm_ctx *c, pa_ssize npanels, pa_ssize nr, pa_ssize nc, int nt)
{
    enum { SIM = 16 };
    const pa_ssize mblocks = c->mb;
    if (mblocks >= 8 * (pa_ssize)nt) return 1;                 /* fine-grained enough */
    pa_ssize best = 1;
    double best_eff = 0.0;
    for (pa_ssize p = 1; p <= 8 && p <= npanels; p++) {
        const pa_ssize ppart = (npanels + p - 1) / p;
        double eff;
        if (nt > SIM) {
            const pa_ssize tasks = mblocks * ((npanels + ppart - 1) / ppart);
            eff = (double)tasks / (double)((tasks + nt - 1) / nt * nt);
        } else {
            double fin[SIM] = {0.0}, total = 0.0, end = 0.0;
            for (pa_ssize i = 0; i < mblocks; i++)
                for (pa_ssize j = 0; j < p && j * ppart < npanels; j++) {
                    const pa_ssize rows = m_row(c, i + 1) - m_row(c, i);
                    const pa_ssize c0 = j * ppart * nr, cols = pa_min(nc - c0, ppart * nr);
                    int f = 0;
                    for (int u = 1; u < nt; u++) if (fin[u] < fin[f]) f = u;
                    fin[f] += (double)rows * (double)cols;
                    total += (double)rows * (double)cols;
                    if (fin[f] > end) end = fin[f];
                }
            eff = total / (end * nt);
        }
        if (eff > best_eff + 1e-9) { best = p; best_eff = eff; }
        if (eff >= 0.95) break;
    }
    return best;
}

/* Step s of the call: s = (b * nblocks + N block) * npk + K panel */
static void shared_step_at(const gemm_ctx *c, pa_ssize s, pa_ssize npk, char *Bp, int nt, shared_step *st)
{
    const size_t es = pa_elsize(c->dtype);
    const pa_gemm_kernel *g = &c->g;
    const pa_ssize p = s % npk, jb = (s / npk) % c->nblocks, b = s / (npk * c->nblocks);
    const pa_ssize j0 = jb * g->nc;
    st->p0 = p * g->kc;
    st->kc = pa_min(c->K - st->p0, g->kc);
    st->nc = pa_min(c->N - j0, g->nc);
    st->Bp = Bp;
    st->A = (const char *)c->A->p + (pa_batch_offset(c->bt, c->A->bs, b) + st->p0 * c->A->cs) * c->esa;
    st->B = (const char *)c->B->p + (pa_batch_offset(c->bt, c->B->bs, b) + st->p0 * c->B->rs + j0 * c->B->cs) * c->esb;
    st->C = (char *)c->C->p + (pa_batch_offset(c->bt, c->C->bs, b) + j0 * c->C->cs) * (pa_ssize)es;
    st->bias = c->bias ? (const char *)c->bias + j0 * c->bias_s * (pa_ssize)es : NULL;
    st->accumulate = (st->p0 > 0) || st->bias != NULL;
    st->npanels = (st->nc + g->nr - 1) / g->nr;
    /* the packing in about 4 tasks per thread: small fillers for the job's end */
    st->per = pa_max((st->npanels + 4 * (pa_ssize)nt - 1) / (4 * (pa_ssize)nt), 1);
    st->nparts = shared_parts(c, st->npanels, g->nr, st->nc, nt);
    st->ppart = (st->npanels + st->nparts - 1) / st->nparts;
    /* The job's last MC blocks (one per thread) in 4 column parts each: the
     * threads then reach the job's end within a quarter of a block of each
     * other, where whole blocks (120 x 2048 x 256 at 2048^3, 0.5 ms) left
     * one waiting for up to a block */
    st->nwhole = c->mb;
    st->tparts = st->tppart = 1;
    if (st->nparts == 1 && st->npanels >= 4 && c->mb > (pa_ssize)nt) {
        st->nwhole = c->mb - nt;
        st->tparts = 4;
        st->tppart = (st->npanels + 3) / 4;
    }
}

/* The compute tasks of a step: (MC block, its first panel, its panel count) */
static pa_ssize shared_ncomp(const gemm_ctx *c, const shared_step *st)
{
    if (st->nparts > 1) return c->mb * st->nparts;
    return st->nwhole + (c->mb - st->nwhole) * st->tparts;
}

static pa_ssize shared_cut(const gemm_ctx *c, const shared_step *st, pa_ssize t, pa_ssize *p0, pa_ssize *np)
{
    pa_ssize blk, per, part;
    if (st->nparts > 1) {
        blk = t / st->nparts; part = t % st->nparts; per = st->ppart;
    } else if (t < st->nwhole) {
        blk = t; part = 0; per = st->npanels;
    } else {
        blk = st->nwhole + (t - st->nwhole) / st->tparts; part = (t - st->nwhole) % st->tparts; per = st->tppart;
    }
    (void)c;
    *p0 = part * per;
    *np = pa_min(st->npanels - *p0, per);
    return blk;
}

static void shared_task(void *ctx_, pa_ssize t, int tid)
{
    const shared_ctx *s = (const shared_ctx *)ctx_;
    const gemm_ctx *c = s->c;
    const size_t es = pa_elsize(c->dtype);
    if (t < s->ncomp) {                       /* compute: (MC block, column part) of cur */
        const shared_step *st = &s->cur;
        pa_ssize p0, np;
        const pa_ssize blk = shared_cut(c, st, t, &p0, &np);
        if (np <= 0) return;
        const pa_ssize i0 = m_row(c, blk);
        const pa_ssize mc = m_row(c, blk + 1) - i0;
        const pa_ssize j0 = p0 * c->g.nr;                                /* whole panels */
        const pa_ssize nc = pa_min(st->nc - j0, np * c->g.nr);
        gemm_block(c, st->A + i0 * c->A->rs * c->esa, mc, st->kc,
                   st->Bp + (size_t)(j0 * packed_k(c, st->kc)) * c->pes, nc,
                   st->C + (i0 * c->C->rs + j0 * c->C->cs) * (pa_ssize)es, st->accumulate, (char *)c->ws[tid]);
        return;
    }
    const shared_step *st = &s->nxt;
    t -= s->ncomp;
    if (t < s->nfill) {                       /* the bias in MC block t of nxt's C */
        const pa_ssize i0 = m_row(c, t), mc = m_row(c, t + 1) - i0;
        char *C = st->C + i0 * c->C->rs * (pa_ssize)es;
        if (c->dtype == PA_F32) fill_c_f32((float *)C, c->C->rs, c->C->cs, mc, st->nc, (const float *)st->bias, c->bias_s);
        else fill_c_f64((double *)C, c->C->rs, c->C->cs, mc, st->nc, (const double *)st->bias, c->bias_s);
        return;
    }
    t -= s->nfill;                            /* pack: NR panels of nxt's B block */
    const pa_ssize p0 = t * st->per, p1 = pa_min(p0 + st->per, st->npanels);
    const pa_ssize j0 = p0 * c->g.nr;
    const pa_ssize j1 = pa_min(p1 * c->g.nr, st->nc);
    pack_b(c, st->B + j0 * c->B->cs * c->esb, st->kc, j1 - j0, st->Bp + (size_t)(j0 * packed_k(c, st->kc)) * c->pes);
    (void)tid;
}

/* K > 0 (gemm_shares) */
static int gemm_shared(gemm_ctx *c, int nt)
{
    const pa_gemm_kernel *g = &c->g;
    const pa_ssize ncp = pa_round_up(pa_min(c->N, g->nc), g->nr);
    const pa_ssize kcm = packed_k(c, pa_min(c->K, g->kc));
    const size_t bytes = (size_t)(ncp * kcm) * c->pes;
    char *Bp[2] = {(char *)pa_alloc64(bytes), (char *)pa_alloc64(bytes)};
    if (!Bp[0] || !Bp[1]) {
        pa_free64(Bp[0]);
        pa_free64(Bp[1]);
        return -1;
    }
    const pa_ssize npk = (c->K + g->kc - 1) / g->kc;
    const pa_ssize nsteps = c->bt->count * c->nblocks * npk;     /* no overflow: gemm_shares */
    pa_stop_flag *const stop = pa_stop_get();
    shared_ctx s;
    s.c = c;
    for (pa_ssize k = -1; k < nsteps && !pa_stopping(stop); k++) {
        s.ncomp = s.nfill = s.npack = 0;
        if (k >= 0) {
            s.cur = s.nxt;
            s.ncomp = shared_ncomp(c, &s.cur);
        }
        if (k + 1 < nsteps) {
            shared_step_at(c, k + 1, npk, Bp[(k + 1) & 1], nt, &s.nxt);
            s.nfill = s.nxt.bias && s.nxt.p0 == 0 ? c->mb : 0;
            s.npack = (s.nxt.npanels + s.nxt.per - 1) / s.nxt.per;
        }
        pa_parallel_for(s.ncomp + s.nfill + s.npack, shared_task, &s, nt);
    }
    pa_free64(Bp[0]);
    pa_free64(Bp[1]);
    return 0;
}

/* Cache blocking from the caches the OS reports (cpu.c), read once per
 * process. KC is the family's (PA_GEMM_KC: it fixes every element's order
 * of summation, so it never moves); MC and NC only partition C, so they may
 * follow the machine without changing a bit:
 *   MC: the packed A block (MC x KC) takes at most 1/8 of the L2 -- room for
 *       the B micro-panel and the C tile streaming through, and for a
 *       sibling hyperthread -- in whole MR panels, 4 MR .. 480 rows;
 *   NC: the packed B block (KC x NC) takes at most 1/16 of the L3 (a share
 *       of a cache shared with other cores), in whole NR panels,
 *       8 NR .. 4096 columns.
 * Where the OS says nothing, the family's table values stay. On a Zen 5
 * (L2 1 MiB, L3 32 MiB), float32: MC 120 (avx512, MR 12) / 126 (avx2,
 * MR 6), NC 2048. */
static atomic_int caches_read;
static _Atomic size_t cache_l2, cache_l3;

static void gemm_caches(size_t *l2, size_t *l3)
{
    if (!atomic_load_explicit(&caches_read, memory_order_acquire)) {
        size_t a, b, c;                /* two threads may both read: the same values */
        pa_cache_sizes(&a, &b, &c);
        atomic_store_explicit(&cache_l2, b, memory_order_relaxed);
        atomic_store_explicit(&cache_l3, c, memory_order_relaxed);
        atomic_store_explicit(&caches_read, 1, memory_order_release);
    }
    *l2 = atomic_load_explicit(&cache_l2, memory_order_relaxed);
    *l3 = atomic_load_explicit(&cache_l3, memory_order_relaxed);
}

#define PA_MC_L2_SHARE 8
#define PA_NC_L3_SHARE 16
#define PA_MC_MAX 480
#define PA_NC_MAX 4096

static int blocked_dim(size_t cache, size_t share, size_t bytes_per, int r, int lo_panels, int hi, int dflt)
{
    if (cache == 0 || bytes_per == 0 || r <= 0) return dflt;
    size_t n = cache / share / bytes_per;
    n -= n % (size_t)r;
    const size_t lo = (size_t)lo_panels * (size_t)r, top = (size_t)hi - (size_t)hi % (size_t)r;
    if (n < lo) n = lo;
    if (n > top) n = top > lo ? top : lo;
    return (int)n;
}

pa_gemm_kernel pa_gemm_blocked(const pa_gemm_kernel *g, size_t pes)
{
    pa_gemm_kernel b = *g;
    size_t l2, l3;
    gemm_caches(&l2, &l3);
    const size_t panel = (size_t)g->kc * pes;          /* bytes of one A row / B column of a KC panel */
    b.mc = blocked_dim(l2, PA_MC_L2_SHARE, panel, g->mr, 4, PA_MC_MAX, g->mc);
    b.nc = blocked_dim(l3, PA_NC_L3_SHARE, panel, g->nr, 8, PA_NC_MAX, g->nc);
    return b;
}

int pa_gemm_blocking_note(char *buf, size_t n)
{
    size_t l2, l3;
    gemm_caches(&l2, &l3);
    char a[64], b[64];
    if (l2) snprintf(a, sizeof a, "MC: A block <= L2 %zu KiB / %d", l2 >> 10, PA_MC_L2_SHARE);
    else snprintf(a, sizeof a, "MC: the family's (no L2 size from the OS)");
    if (l3) snprintf(b, sizeof b, "NC: B block <= L3 %zu KiB / %d", l3 >> 10, PA_NC_L3_SHARE);
    else snprintf(b, sizeof b, "NC: the family's (no L3 size from the OS)");
    return snprintf(buf, n, "%s; %s", a, b);
}

/* The call's context: its operands and its copy of the kernel's blocking,
 * cut into blocks of equal size. N blocks of equal width (whole NR panels):
 * N = 2304 with NC = 2048 gives two blocks of 1152, not 2048 + 256, so the
 * tasks of one N block take as long as the other's; MC blocks of nearly
 * equal height (whole MR panels dealt out evenly, m_row) likewise: M = 300
 * with MC = 96 and MR = 12 gives 72, 72, 72, 84 rows, not 96, 96, 96, 12.
 * NC and MC only partition C, so no element's arithmetic changes. */
static void gemm_init(gemm_ctx *c, const pa_family *fam, const pa_matmul_call *mm)
{
    c->dtype = mm->dtype; c->bt = mm->bt; c->M = mm->M; c->N = mm->N; c->K = mm->K;
    c->a_dt = mm->a_dt; c->b_dt = mm->b_dt;
    c->esa = (pa_ssize)pa_elsize(mm->a_dt); c->esb = (pa_ssize)pa_elsize(mm->b_dt);
    c->A = mm->A; c->B = mm->B; c->C = mm->C; c->bias = mm->bias; c->bias_s = mm->bias_s;
    c->bf16 = mm->bf16;
    c->pes = mm->bf16 ? sizeof(uint16_t) : pa_elsize(mm->dtype);
    c->g = pa_gemm_blocked(mm->bf16 ? &fam->gemm_bf16 : &fam->gemm[mm->dtype], c->pes);  /* this call's copy */
    c->nblocks = (c->N + c->g.nc - 1) / c->g.nc;
    const pa_ssize w = (c->N + c->nblocks - 1) / c->nblocks;
    c->g.nc = (int)((w + c->g.nr - 1) / c->g.nr * c->g.nr);
    c->mb = (c->M + c->g.mc - 1) / c->g.mc;
    c->panels = (c->M + c->g.mr - 1) / c->g.mr;
    const pa_ssize h = (c->panels + c->mb - 1) / c->mb * c->g.mr;   /* the tallest block (m_row) */
    if (h < c->g.mc) c->g.mc = (int)h;
    c->ws = NULL;
}

/* The M chunks: about 3 tasks per thread over (batch, M chunks, N blocks),
 * for balance; one thread needs no balance, and every extra M chunk packs
 * the same B panels again (10 % of 1024^3), so it takes one chunk */
static void gemm_chunks(gemm_ctx *c, int nthreads)
{
    const pa_ssize mblocks = c->mb;
    const pa_ssize others = c->bt->count * c->nblocks;
    const pa_ssize want = nthreads <= 1 ? 1 : 3 * (pa_ssize)nthreads;
    pa_ssize per = (want + others - 1) / others;         /* chunks wanted per (b, N block) */
    if (per < 1) per = 1;
    if (per > mblocks) per = mblocks;
    const pa_ssize blocks = (mblocks + per - 1) / per;   /* MC blocks per chunk */
    c->mchunk = blocks;
    c->mchunks = (mblocks + blocks - 1) / blocks;
}

/* A thread's workspace: packed A (MC x KC), then packed B (KC x NC) */
static size_t gemm_ws_bytes(gemm_ctx *c)
{
    const pa_ssize kc = packed_k(c, pa_min(pa_max(c->K, 1), c->g.kc));
    const pa_ssize mcp = pa_round_up(pa_min(c->M, c->g.mc), c->g.mr);
    const pa_ssize ncp = pa_round_up(pa_min(c->N, c->g.nc), c->g.nr);
    c->a_elems = (size_t)(mcp * kc);
    return (c->a_elems + (size_t)(ncp * kc)) * c->pes;
}

/* Few large products on several threads (nt of them after the task count
 * capped it) share the packed B (gemm_shared) when the task split would pack
 * each B block more than once (fewer than 3 (batch, N block) pairs per
 * thread: gemm_chunks cuts M in chunks), when (MC block, column part) pairs
 * give every thread two or more, and when a step (one K panel of one
 * (batch, N block) pair, a hand-off of the pool) has 1 MFLOP or more per
 * thread */
static int gemm_shares(const gemm_ctx *c, int nt, int nthreads)
{
    const pa_ssize bpanels = (c->g.nc + c->g.nr - 1) / c->g.nr;
    const double step = 2.0 * (double)c->M * (double)pa_min(c->N, c->g.nc) * (double)pa_min(c->K, c->g.kc);
    size_t steps;
    return nthreads > 1 && c->K > 0 && c->bt->count * c->nblocks < 3 * (pa_ssize)pa_max(nt, nthreads) &&
           c->mb * pa_min(bpanels, 8) >= 2 * pa_max(nthreads, 1) && step >= 1e6 * nthreads &&
           pa_mul_ok((size_t)(c->bt->count * c->nblocks), (size_t)((c->K + c->g.kc - 1) / c->g.kc), &steps) &&
           steps < (size_t)PTRDIFF_MAX;
}

/* A batch whose B is shared (batch strides 0 wherever the batch axis is
 * longer than 1) and whose A and C rows run on from one batch item to the
 * next (batch stride M rows, outer axes nested) is one product with
 * count x M rows: a (B, T, d_in) @ w.T of torch.nn.Linear's layout, whose
 * B panels are then packed once per KC x NC block, not once per batch item.
 * Every element's arithmetic is the same (the same K panels, the same
 * kernel; an element's value does not depend on where its tile sits). */
static int rows_run_on(const pa_batch *bt, const pa_ssize *bs, pa_ssize rows)
{
    pa_ssize want = rows;
    for (int d = bt->nb - 1; d >= 0; d--) {
        if (bt->shape[d] == 1) continue;
        if (bs[d] != want) return 0;
        if (__builtin_mul_overflow(want, bt->shape[d], &want)) return 0;
    }
    return 1;
}

static int batch_folds(const pa_matmul_call *mm)
{
    if (mm->bt->count <= 1) return 0;
    for (int d = 0; d < mm->bt->nb; d++)
        if (mm->bt->shape[d] > 1 && mm->B->bs[d] != 0) return 0;
    size_t rows;
    if (!pa_mul_ok((size_t)mm->bt->count, (size_t)mm->M, &rows) || rows > (size_t)PTRDIFF_MAX / 2) return 0;
    pa_ssize ra, rc;
    return mm->A->rs != 0 && mm->C->rs != 0 && !__builtin_mul_overflow(mm->M, mm->A->rs, &ra) &&
           !__builtin_mul_overflow(mm->M, mm->C->rs, &rc) && rows_run_on(mm->bt, mm->A->bs, ra) &&
           rows_run_on(mm->bt, mm->C->bs, rc);
}

int pa_matmul(const pa_family *fam, const pa_matmul_call *mm, int nthreads)
{
    if (mm->bt->count == 0 || mm->M == 0 || mm->N == 0) return 0;
    pa_matmul_call folded;
    pa_batch one;
    if (batch_folds(mm)) {
        folded = *mm;
        one.nb = 0;
        one.count = 1;
        folded.bt = &one;
        folded.M = mm->M * mm->bt->count;
        mm = &folded;
    }
    if (mm->bf16 && mm->dtype != PA_F32) return -1;
    gemm_ctx c;
    size_t ntasks, bytes;
    void *wsv[PA_MAX_THREADS];
    int nt = 0, ok = 0, shared;
    gemm_init(&c, fam, mm);
    gemm_chunks(&c, nthreads);
    bytes = gemm_ws_bytes(&c);
    if (!pa_mul_ok((size_t)c.bt->count, (size_t)(c.mchunks * c.nblocks), &ntasks) || ntasks > (size_t)PTRDIFF_MAX)
        goto fail;
    nt = (int)pa_max(nthreads, 1);
    if ((size_t)nt > ntasks) nt = (int)ntasks;
    shared = gemm_shares(&c, nt, nthreads);
    if (shared) {
        nt = (int)pa_min(nthreads, PA_MAX_THREADS);
        bytes = c.a_elems * c.pes;       /* a thread packs only A; B is packed once, shared */
    }
    ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (!ok) goto fail;
    c.ws = wsv;
    if (shared) ok = gemm_shared(&c, nt) == 0;
    else pa_parallel_for((pa_ssize)ntasks, gemm_task, &c, nt);
fail:
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    return ok ? 0 : -1;
}
