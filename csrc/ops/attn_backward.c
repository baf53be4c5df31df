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
    const pa_attn_call *call;
    const pa_attn_grads *g;
    pa_ssize ninner;
    void **ws;
} bwd_ctx;

/* flat batch index of (outer, inner): outer runs over the axes not
 * reduced, inner over the reduced ones, each in C order */
static pa_ssize flat_index(const bwd_ctx *c, pa_ssize outer, pa_ssize inner)
{
    const pa_batch *bt = &c->call->bt;
    pa_ssize idx[PA_MAXDIMS];
    for (int d = bt->nb - 1; d >= 0; d--) {
        const pa_ssize n = bt->shape[d];
        if (c->g->reduce[d]) { idx[d] = inner % n; inner /= n; }
        else { idx[d] = outer % n; outer /= n; }
    }
    pa_ssize b = 0;
    for (int d = 0; d < bt->nb; d++) b = b * bt->shape[d] + idx[d];
    return b;
}

/* element pointer of flat batch index b in operand o of the compute dtype */
static char *at(const pa_attn_call *c, const pa_operand *o, pa_ssize b)
{
    return (char *)o->p + pa_batch_offset(&c->bt, o->bs, b) * (pa_ssize)pa_elsize(c->dtype);
}

static void bwd_task(void *ctx_, pa_ssize outer, int tid)
{
    const bwd_ctx *c = (const bwd_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_attn_grads *g = c->g;
    for (pa_ssize inner = 0; inner < c->ninner; inner++) {
        const pa_ssize b = flat_index(c, outer, inner);
        pa_attn_args a;
        pa_attn_setup(&a, c->fam, k, b);
        pa_bwd_io io;
        io.o = at(k, &k->out, b);
        io.o_rs = k->out.rs; io.o_cs = k->out.cs;
        io.go = at(k, &g->go, b);
        io.go_rs = g->go.rs; io.go_cs = g->go.cs;
        io.lse = at(k, &k->lse, b);
        io.lse_s = k->lse.cs;
        io.dq = at(k, &g->dq, b);
        io.dq_rs = g->dq.rs; io.dq_cs = g->dq.cs;
        io.dk = at(k, &g->dk, b);
        io.dk_rs = g->dk.rs; io.dk_cs = g->dk.cs;
        io.dv = at(k, &g->dv, b);
        io.dv_rs = g->dv.rs; io.dv_cs = g->dv.cs;
        io.dsink = g->dsinks ? g->dsinks + b : NULL;
        pa_bwd_head(c->fam, k->dtype, &a, &io, c->ws[tid]);
    }
}

int pa_attention_backward(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                          int nthreads)
{
    if (call->cu_seqlens_q) return pa_attention_varlen_backward(fam, call, g, nthreads);
    const pa_batch *bt = &call->bt;
    if (g->dsinks)
        for (pa_ssize b = 0; b < bt->count; b++) g->dsinks[b] = 0;
    if (bt->count == 0 || call->L == 0 || call->S == 0) return 0;
    bwd_ctx c;
    c.fam = fam; c.call = call; c.g = g;
    c.ninner = 1;
    for (int d = 0; d < bt->nb; d++)
        if (g->reduce[d]) c.ninner *= bt->shape[d];
    const pa_ssize nouter = bt->count / c.ninner;
    const size_t bytes = pa_bwd_ws(fam, call->dtype, call->L, call->E, call->Ev);
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
