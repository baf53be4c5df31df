/*
 * attention.c -- fused scaled-dot-product attention over a batch of heads.
 *
 * Shapes (per flat batch index b, which covers batch and head axes):
 *   q (L, E), k (S, E), v (S, Ev), mask (L, S) or none, out (L, Ev),
 *   w (L, S) only when the weights are asked for.
 * A task is (b, block of BQ query rows); the kernel streams all key tiles for
 * that block, so each output row is computed by exactly one task with a fixed
 * order of arithmetic: results do not depend on the thread count, nor on the
 * batch a row came in. Within each b, blocks are handed out last-first so
 * that with causal masking the long rows start early (better balance).
 */
#include "ops.h"
#include "dispatch.h"
#include "threads.h"

typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize L, S, E, Ev, nblk;
    const pa_operand *q, *k, *v, *mask, *out, *w;
    int mask_kind, causal;
    double scale, dropout_p;
    uint64_t key;
    pa_attn_kernel kern;
    void **ws;
} attn_ctx;

static void attn_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_ssize es = c->dtype == PA_F32 ? (pa_ssize)sizeof(float) : (pa_ssize)sizeof(double);
    const pa_ssize b = t / c->nblk;
    const pa_ssize blk = c->nblk - 1 - t % c->nblk;
    const pa_ssize i0 = blk * c->kern.bq;
    const pa_ssize i1 = i0 + c->kern.bq < c->L ? i0 + c->kern.bq : c->L;
    pa_attn_args a;
    a.L = c->L; a.S = c->S; a.E = c->E; a.Ev = c->Ev;
    a.q = (const char *)c->q->p + pa_batch_offset(c->bt, c->q->bs, b) * es;
    a.q_rs = c->q->rs; a.q_cs = c->q->cs;
    a.k = (const char *)c->k->p + pa_batch_offset(c->bt, c->k->bs, b) * es;
    a.k_rs = c->k->rs; a.k_cs = c->k->cs;
    a.v = (const char *)c->v->p + pa_batch_offset(c->bt, c->v->bs, b) * es;
    a.v_rs = c->v->rs; a.v_cs = c->v->cs;
    a.mask_kind = c->mask_kind;
    if (c->mask_kind != PA_MASK_NONE) {
        const pa_ssize ms = c->mask_kind == PA_MASK_BOOL ? 1 : es;
        a.mask = (const char *)c->mask->p + pa_batch_offset(c->bt, c->mask->bs, b) * ms;
        a.m_rs = c->mask->rs; a.m_cs = c->mask->cs;
    } else {
        a.mask = NULL; a.m_rs = a.m_cs = 0;
    }
    a.causal = c->causal;
    a.scale = c->scale;
    a.dropout_p = c->dropout_p;
    a.dropout_key = c->key;
    a.ctr_base = (uint64_t)b * (uint64_t)c->L * (uint64_t)c->S;
    a.out = (char *)c->out->p + pa_batch_offset(c->bt, c->out->bs, b) * es;
    a.o_rs = c->out->rs; a.o_cs = c->out->cs;
    if (c->w) {
        a.w = (char *)c->w->p + pa_batch_offset(c->bt, c->w->bs, b) * es;
        a.w_rs = c->w->rs; a.w_cs = c->w->cs;
    } else {
        a.w = NULL; a.w_rs = a.w_cs = 0;
    }
    c->kern.run(&a, i0, i1, c->ws[tid]);
}

int pa_attention(int dtype, const pa_batch *bt, pa_ssize L, pa_ssize S, pa_ssize E, pa_ssize Ev,
                 const pa_operand *q, const pa_operand *k, const pa_operand *v,
                 const pa_operand *mask, int mask_kind, int causal, double scale,
                 double dropout_p, uint64_t dropout_key,
                 const pa_operand *out, const pa_operand *w, int nthreads)
{
    if (bt->count == 0 || L == 0 || (Ev == 0 && w == NULL)) return 0;
    attn_ctx c;
    c.dtype = dtype; c.bt = bt; c.L = L; c.S = S; c.E = E; c.Ev = Ev;
    c.q = q; c.k = k; c.v = v; c.mask = mask; c.out = out; c.w = w;
    c.mask_kind = mask_kind; c.causal = causal; c.scale = scale;
    c.dropout_p = dropout_p; c.key = dropout_key;
    c.kern = pa_kernels.attn[dtype];
    c.nblk = (L + c.kern.bq - 1) / c.kern.bq;
    size_t ntasks;
    if (!pa_mul_ok((size_t)bt->count, (size_t)c.nblk, &ntasks) || ntasks > (size_t)PTRDIFF_MAX)
        return -1;
    const size_t bytes = c.kern.ws(E, Ev);
    if (bytes == 0) return -1;
    int nt = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nt > ntasks) nt = (int)ntasks;
    void *wsv[PA_MAX_THREADS];
    int ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (ok) {
        c.ws = wsv;
        pa_parallel_for((pa_ssize)ntasks, attn_task, &c, nt);
    }
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    return ok ? 0 : -1;
}
