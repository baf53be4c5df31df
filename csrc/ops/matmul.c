/*
 * matmul.c -- batched GEMM, GotoBLAS/BLIS structure.
 *
 * Shapes: A (B, M, K), B (B, K, N), C (B, M, N), bias (N,).
 *
 * A task is (batch b, a chunk of rows -- whole MC blocks --, a block of NC
 * columns) of C. Inside a task: for each KC panel, in order: pack B
 * (KC x NC) once, then for each MC block of the chunk pack A (MC x KC) and
 * run the micro-kernel over MR x NR tiles (from the dispatch table). The
 * chunk size only spreads the work over threads (a few chunks per thread,
 * so B is packed a few times, not once per MC block); the reduction over K
 * never leaves a task and always runs in the same KC panels, so an element's
 * arithmetic does not depend on the thread count or on its batch.
 */
#include "ops.h"
#include "dispatch.h"
#include "threads.h"

#define PA_CAT2(a, b) a##b
#define PA_CAT(a, b) PA_CAT2(a, b)

#define T float
#define SFX f32
#include "pack.inc"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "pack.inc"
#undef T
#undef SFX

typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize M, N, K;
    const pa_operand *A, *B, *C;
    const void *bias; pa_ssize bias_s;
    pa_gemm_kernel g;
    pa_ssize mchunk, mchunks, nblocks;   /* rows per task (a multiple of mc), tasks along M, along N */
    void **ws;               /* per thread: packed A then packed B */
    size_t a_elems;
} gemm_ctx;

static void gemm_task(void *ctx_, pa_ssize t, int tid)
{
    const gemm_ctx *c = (const gemm_ctx *)ctx_;
    const pa_gemm_kernel *g = &c->g;
    const pa_ssize jb = t % c->nblocks;
    const pa_ssize ib = (t / c->nblocks) % c->mchunks;
    const pa_ssize b = t / (c->nblocks * c->mchunks);
    const size_t es = c->dtype == PA_F32 ? sizeof(float) : sizeof(double);
    const pa_ssize i0 = ib * c->mchunk, j0 = jb * g->nc;
    const pa_ssize mt = c->M - i0 < c->mchunk ? c->M - i0 : c->mchunk;
    const pa_ssize nc = c->N - j0 < g->nc ? c->N - j0 : g->nc;
    const char *A = (const char *)c->A->p + (pa_batch_offset(c->bt, c->A->bs, b) + i0 * c->A->rs) * (pa_ssize)es;
    const char *B = (const char *)c->B->p + (pa_batch_offset(c->bt, c->B->bs, b) + j0 * c->B->cs) * (pa_ssize)es;
    char *C = (char *)c->C->p + (pa_batch_offset(c->bt, c->C->bs, b) + i0 * c->C->rs + j0 * c->C->cs) * (pa_ssize)es;
    const char *bias = c->bias ? (const char *)c->bias + j0 * c->bias_s * (pa_ssize)es : NULL;
    char *Ap = (char *)c->ws[tid];
    char *Bp = Ap + c->a_elems * es;
    const pa_ssize crs = c->C->rs, ccs = c->C->cs;

    if (bias || c->K == 0) {
        if (c->dtype == PA_F32) fill_c_f32((float *)C, crs, ccs, mt, nc, (const float *)bias, c->bias_s);
        else fill_c_f64((double *)C, crs, ccs, mt, nc, (const double *)bias, c->bias_s);
    }
    for (pa_ssize p0 = 0; p0 < c->K; p0 += g->kc) {
        const pa_ssize kc = c->K - p0 < g->kc ? c->K - p0 : g->kc;
        const int accumulate = (p0 > 0) || bias != NULL;
        const char *Bblk = B + p0 * c->B->rs * (pa_ssize)es;
        if (c->dtype == PA_F32)
            pack_b_f32((const float *)Bblk, c->B->rs, c->B->cs, kc, nc, g->nr, (float *)Bp);
        else
            pack_b_f64((const double *)Bblk, c->B->rs, c->B->cs, kc, nc, g->nr, (double *)Bp);
        for (pa_ssize ic = 0; ic < mt; ic += g->mc) {
            const pa_ssize mc = mt - ic < g->mc ? mt - ic : g->mc;
            const char *Ablk = A + (ic * c->A->rs + p0 * c->A->cs) * (pa_ssize)es;
            char *Cblk = C + ic * crs * (pa_ssize)es;
            if (c->dtype == PA_F32)
                pack_a_f32((const float *)Ablk, c->A->rs, c->A->cs, mc, kc, g->mr, (float *)Ap);
            else
                pack_a_f64((const double *)Ablk, c->A->rs, c->A->cs, mc, kc, g->mr, (double *)Ap);
            for (pa_ssize jr = 0; jr < nc; jr += g->nr) {
                const int n = (int)(nc - jr < g->nr ? nc - jr : g->nr);
                const char *bpan = Bp + (size_t)(jr * kc) * es;
                for (pa_ssize ir = 0; ir < mc; ir += g->mr) {
                    const int m = (int)(mc - ir < g->mr ? mc - ir : g->mr);
                    const char *apan = Ap + (size_t)(ir * kc) * es;
                    g->ukr(kc, apan, 1, g->mr, bpan, g->nr, Cblk + (ir * crs + jr * ccs) * (pa_ssize)es,
                           crs, ccs, m, n, accumulate);
                }
            }
        }
    }
}

int pa_matmul(int dtype, const pa_batch *bt, pa_ssize M, pa_ssize N, pa_ssize K,
              const pa_operand *A, const pa_operand *B, const pa_operand *C,
              const void *bias, pa_ssize bias_s, int nthreads)
{
    if (bt->count == 0 || M == 0 || N == 0) return 0;
    gemm_ctx c;
    c.dtype = dtype; c.bt = bt; c.M = M; c.N = N; c.K = K;
    c.A = A; c.B = B; c.C = C; c.bias = bias; c.bias_s = bias_s;
    c.g = pa_kernels.gemm[dtype];
    c.nblocks = (N + c.g.nc - 1) / c.g.nc;
    {   /* about 3 tasks per thread over (batch, M chunks, N blocks) */
        const pa_ssize mblocks = (M + c.g.mc - 1) / c.g.mc;
        const pa_ssize others = bt->count * c.nblocks;
        const pa_ssize want = 3 * (pa_ssize)(nthreads < 1 ? 1 : nthreads);
        pa_ssize per = (want + others - 1) / others;         /* chunks wanted per (b, N block) */
        if (per < 1) per = 1;
        if (per > mblocks) per = mblocks;
        const pa_ssize blocks = (mblocks + per - 1) / per;   /* MC blocks per chunk */
        c.mchunk = blocks * c.g.mc;
        c.mchunks = (M + c.mchunk - 1) / c.mchunk;
    }
    const size_t es = dtype == PA_F32 ? sizeof(float) : sizeof(double);
    const pa_ssize kc = K < c.g.kc ? (K > 0 ? K : 1) : c.g.kc;
    const pa_ssize mcp = ((M < c.g.mc ? M : c.g.mc) + c.g.mr - 1) / c.g.mr * c.g.mr;
    const pa_ssize ncp = ((N < c.g.nc ? N : c.g.nc) + c.g.nr - 1) / c.g.nr * c.g.nr;
    c.a_elems = (size_t)(mcp * kc);
    const size_t bytes = (c.a_elems + (size_t)(ncp * kc)) * es;

    size_t ntasks;
    if (!pa_mul_ok((size_t)bt->count, (size_t)(c.mchunks * c.nblocks), &ntasks) || ntasks > (size_t)PTRDIFF_MAX)
        return -1;
    int nt = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nt > ntasks) nt = (int)ntasks;
    void *wsv[PA_MAX_THREADS];
    int ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (ok) {
        c.ws = wsv;
        pa_parallel_for((pa_ssize)ntasks, gemm_task, &c, nt);
    }
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    return ok ? 0 : -1;
}
