/*
 * attn_backward.c -- the attention backward over a batch of heads (API.md
 * "Gradients"; the per-head tiles: attn_backward.inc).
 *
 * Shapes per flat batch index b: q (L, E), k (S, E), v (S, Ev), o and go
 * (L, Ev), lse (L,); gradients dq (L, E), dk (S, E), dv (S, Ev).
 * Several b may share one key/value head (grouped-query attention, or
 * key/value broadcast over a batch axis): the binding flags those batch
 * axes (reduce) and gives dk, dv stride 0 there. A task is one key/value
 * head: every b that maps to it, in increasing order, so each gradient
 * element is summed by one task in a fixed order -- no atomics, and the
 * result does not depend on the thread count, nor on which other heads
 * came in the call.
 */
#include <string.h>
#include "ops.h"
#include "attention.h"
#include "threads.h"

typedef struct {
    const pa_family *fam;
    int dtype;
    const pa_batch *bt;
    const int *reduce;
    pa_ssize ninner;
    pa_ssize L, S, E, Ev;
    const pa_operand *q, *k, *v, *mask, *o, *lse, *go, *dq, *dk, *dv;
    int mask_kind;
    const pa_attn_opts *opts;
    double scale, dropout_p;
    uint64_t key;
    double *dsinks;
    void **ws;
} bwd_ctx;

/* flat batch index of (outer, inner): outer runs over the axes not
 * reduced, inner over the reduced ones, each in C order */
static pa_ssize flat_index(const bwd_ctx *c, pa_ssize outer, pa_ssize inner)
{
    pa_ssize idx[PA_MAXDIMS];
    for (int d = c->bt->nb - 1; d >= 0; d--) {
        const pa_ssize n = c->bt->shape[d];
        if (c->reduce[d]) { idx[d] = inner % n; inner /= n; }
        else { idx[d] = outer % n; outer /= n; }
    }
    pa_ssize b = 0;
    for (int d = 0; d < c->bt->nb; d++) b = b * c->bt->shape[d] + idx[d];
    return b;
}

static void bwd_task(void *ctx_, pa_ssize outer, int tid)
{
    const bwd_ctx *c = (const bwd_ctx *)ctx_;
    const pa_ssize es = (pa_ssize)pa_elsize(c->dtype);
    for (pa_ssize inner = 0; inner < c->ninner; inner++) {
        const pa_ssize b = flat_index(c, outer, inner);
        pa_attn_args a;
        pa_attn_setup(&a, c->fam, c->dtype, c->bt, b, c->L, c->S, c->E, c->Ev, c->q, c->k, c->v,
                      c->mask, c->mask_kind, c->opts, c->scale, c->dropout_p, c->key, NULL, NULL);
        pa_bwd_io io;
        io.o = (const char *)c->o->p + pa_batch_offset(c->bt, c->o->bs, b) * es;
        io.o_rs = c->o->rs; io.o_cs = c->o->cs;
        io.go = (const char *)c->go->p + pa_batch_offset(c->bt, c->go->bs, b) * es;
        io.go_rs = c->go->rs; io.go_cs = c->go->cs;
        io.lse = (const char *)c->lse->p + pa_batch_offset(c->bt, c->lse->bs, b) * es;
        io.lse_s = c->lse->cs;
        io.dq = (char *)c->dq->p + pa_batch_offset(c->bt, c->dq->bs, b) * es;
        io.dq_rs = c->dq->rs; io.dq_cs = c->dq->cs;
        io.dk = (char *)c->dk->p + pa_batch_offset(c->bt, c->dk->bs, b) * es;
        io.dk_rs = c->dk->rs; io.dk_cs = c->dk->cs;
        io.dv = (char *)c->dv->p + pa_batch_offset(c->bt, c->dv->bs, b) * es;
        io.dv_rs = c->dv->rs; io.dv_cs = c->dv->cs;
        io.dsink = c->dsinks ? c->dsinks + b : NULL;
        pa_bwd_head(c->fam, c->dtype, &a, &io, c->ws[tid]);
    }
}

int pa_attention_backward(const pa_family *fam, int dtype, const pa_batch *bt, const int *reduce,
                          pa_ssize L, pa_ssize S, pa_ssize E, pa_ssize Ev,
                          const pa_operand *q, const pa_operand *k, const pa_operand *v,
                          const pa_operand *mask, int mask_kind, const pa_attn_opts *opts,
                          double scale, double dropout_p, uint64_t dropout_key,
                          const pa_operand *o, const pa_operand *lse, const pa_operand *go,
                          const pa_operand *dq, const pa_operand *dk, const pa_operand *dv,
                          double *dsinks, int nthreads)
{
    if (dsinks)
        for (pa_ssize b = 0; b < bt->count; b++) dsinks[b] = 0;
    if (bt->count == 0 || L == 0 || S == 0) return 0;
    bwd_ctx c;
    c.fam = fam; c.dtype = dtype; c.bt = bt; c.reduce = reduce;
    c.L = L; c.S = S; c.E = E; c.Ev = Ev;
    c.q = q; c.k = k; c.v = v; c.mask = mask; c.o = o; c.lse = lse; c.go = go;
    c.dq = dq; c.dk = dk; c.dv = dv;
    c.mask_kind = mask_kind; c.opts = opts; c.scale = scale; c.dropout_p = dropout_p;
    c.key = dropout_key; c.dsinks = dsinks;
    c.ninner = 1;
    for (int d = 0; d < bt->nb; d++)
        if (reduce[d]) c.ninner *= bt->shape[d];
    const pa_ssize nouter = bt->count / c.ninner;
    const size_t bytes = pa_bwd_ws(fam, dtype, L, E, Ev);
    if (bytes == 0) return -1;
    int nt = nthreads < 1 ? 1 : nthreads;
    if (nt > nouter) nt = (int)nouter;
    void *wsv[PA_MAX_THREADS];
    int ok = 1;
    for (int i = 0; i < nt; i++) {
        wsv[i] = pa_alloc64(bytes);
        ok &= wsv[i] != NULL;
        if (wsv[i]) memset(wsv[i], 0, bytes);
    }
    if (ok) {
        c.ws = wsv;
        pa_parallel_for(nouter, bwd_task, &c, nt);
    }
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    return ok ? 0 : -1;
}
