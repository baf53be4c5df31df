/*
 * attn_varlen.c -- attention over packed sequences of different lengths
 * (API.md "Packed sequences of different lengths (varlen)"): the forward
 * and the backward of a pa_attn_call whose cu_seqlens_q / cu_seqlens_k are
 * set (pa_attention and pa_attention_backward hand such calls here).
 *
 * The call's L and S are the packed totals; sequence i is rows
 * [cu_q[i], cu_q[i+1]) of q, out, lse and keys [cu_k[i], cu_k[i+1]) of k,
 * v. vl_seq makes sequence i a dense call of its own (the operands' base
 * pointers moved to its first row, L and S its lengths, its row of ALiBi
 * slopes; with seq_align its qoff S_i - L_i, as align="bottom_right"
 * gives the dense call), which goes through pa_attn_setup exactly as the dense call on
 * that sequence alone does: the same key rule (both causal alignments,
 * window, positions per sequence), the same tiles, hence the same bits.
 *
 * Forward tasks: (sequence, head, query block), with the dense op's block
 * heights per sequence, and (sequence, head, key chunk) + a merge for the
 * decode-shaped sequences that the dense op splits (L <= PA_SPLIT_MAXL,
 * S >= PA_SPLIT_MINS) -- so each sequence's rows come out bit-identical to
 * the dense call on it. Never padded: a task covers one sequence's rows and
 * keys. Sequences are handed out most work first (the keys their rows
 * visit), so one long sequence among short ones starts early and the short
 * ones fill the end; within a sequence, each head's blocks run as in the
 * dense op (last-first), so K and V stay in cache across them.
 *
 * Backward tasks: (sequence, key/value head), every query head of the group
 * in order within one task (as the dense backward), so dK, dV are summed by
 * one task in a fixed order; a sink's gradient is summed over the sequences
 * in sequence order after the tasks.
 *
 * Block masks: sequence i's head b reads the block mask's slab at slab[i *
 * count + b], at positions and keys counted from the sequence's start (its
 * rows are the dense call's rows 0.., as pa_attn_setup gives them), and its
 * query blocks are the family's height (on the map's grid, as the dense op).
 *
 * Dropout: sequence i's head b uses the counters of flat batch index
 * i * count + b of a dense call with its lengths (ctr_base = (i * count +
 * b) * L_i * S_i), i.e. the dense call's batch entry i.
 */
#include <stdlib.h>
#include <string.h>
#include "ops.h"
#include "attention.h"
#include "threads.h"

/* A unit of work: rows [i0, i1) of (seq, b); chunk >= 0: key chunk of a
 * split sequence (rows all), its partials at element poff; merge tasks
 * (chunk = -2) merge nchunks partials at poff. */
typedef pa_seq_task vl_task;

typedef struct {
    const pa_family *fam;
    const pa_attn_call *call;
    const pa_attn_grads *g;
    vl_task *tasks;
    char *partials;
    double *dsinks;         /* backward: (nseq, count) per-sequence sink gradients */
    pa_ssize ninner;        /* backward: query heads per task */
    void **ws;
} vl_ctx;

static pa_ssize vl_nseq(const pa_attn_call *c) { return c->nseq; }

static void vl_shift(pa_operand *o, pa_ssize rows, pa_ssize rs, int dt)
{
    o->p = (const char *)o->p + rows * rs * (pa_ssize)pa_elsize(dt);
}

/* sequence i of the packed call c as a dense call of its own, into *s */
static void vl_seq(const pa_attn_call *c, pa_ssize i, pa_attn_call *s)
{
    const pa_ssize q0 = (pa_ssize)c->cu_seqlens_q[i], k0 = (pa_ssize)c->cu_seqlens_k[i];
    *s = *c;
    s->L = (pa_ssize)c->cu_seqlens_q[i + 1] - q0;
    s->S = (pa_ssize)c->cu_seqlens_k[i + 1] - k0;
    vl_shift(&s->q, q0, c->q.rs, c->q_dt);
    vl_shift(&s->k, k0, c->k.rs, c->k_dt);
    vl_shift(&s->v, k0, c->v.rs, c->v_dt);
    vl_shift(&s->out, q0, c->out.rs, c->dtype);
    if (c->has_lse) vl_shift(&s->lse, q0, c->lse.cs, c->dtype);
    if (c->slopes) s->slopes = c->slopes + i * c->bt.count;
    if (c->seq_align) {                 /* align="bottom_right", as the dense call's qoff */
        s->has_qoff = 1;
        s->qoff = s->S - s->L;
    }
    s->cu_seqlens_q = s->cu_seqlens_k = NULL;
    s->seq_align = 0;
}

/* one head's arguments: head b of sequence i (dropout: batch entry i) */
static void vl_args(const vl_ctx *c, pa_ssize i, pa_ssize b, pa_attn_call *s, pa_attn_args *a)
{
    vl_seq(c->call, i, s);
    pa_attn_setup(a, c->fam, s, b);
    if (a->bm.state) {                  /* the block mask's slab of (sequence i, head b) */
        const pa_bmask *m = c->call->block_mask;
        const pa_ssize x = (pa_ssize)m->slab[i * c->call->bt.count + b] * m->nqt * m->nkt;
        a->bm.state = m->state + x;
        a->bm.index = m->index + x;
    }
    a->ctr_base = ((uint64_t)i * (uint64_t)c->call->bt.count + (uint64_t)b) * (uint64_t)s->L *
                  (uint64_t)s->S;
}

static void vl_fwd_task(void *ctx_, pa_ssize t, int tid)
{
    const vl_ctx *c = (const vl_ctx *)ctx_;
    const vl_task *k = &c->tasks[t];
    pa_attn_call s;
    pa_attn_args a;
    vl_args(c, k->seq, k->b, &s, &a);
    pa_seq_task_run(c->fam, &a, &s, k, c->partials, c->ws[tid]);
}

void pa_seq_task_run(const pa_family *fam, pa_attn_args *a, const pa_attn_call *s, const pa_seq_task *k,
                     char *partials, void *ws)
{
    const int dt = s->dtype;
    if (k->chunk >= 0) {
        a->key_begin = k->chunk * PA_SPLIT_CHUNK;
        a->key_end = pa_min(a->key_begin + PA_SPLIT_CHUNK, s->S);
        a->partial = partials + k->poff * pa_elsize(dt);
        pa_flash_run(fam, dt, a, 0, s->L, ws);
    } else if (k->chunk == -2) {
        const char *P = partials + k->poff * pa_elsize(dt);
        for (pa_ssize r = 0; r < s->L; r++)
            pa_flash_merge(dt, a, r, P, k->nchunks, s->L * (2 + s->Ev), ws);
    } else {
        pa_flash_run(fam, dt, a, k->i0, k->i1, ws);
    }
}

int pa_seq_task_cmp(const void *x, const void *y)
{
    const pa_seq_task *a = (const pa_seq_task *)x, *b = (const pa_seq_task *)y;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->chunk != b->chunk) return a->chunk < b->chunk ? -1 : 1;
    return a->i0 > b->i0 ? -1 : (a->i0 < b->i0);
}

/* the dense op's split rule (attention.c, attn_splits) for one sequence */
static int vl_splits(const pa_attn_call *s)
{
    return !s->has_w && !s->bf16 && s->L <= PA_SPLIT_MAXL && s->S >= PA_SPLIT_MINS && pa_rows_dims(s->E, s->Ev);
}

/* the dense op's query block height for L rows (attention.c, attn_init;
 * a block mask: the family's height, blocks on its grid) */
static pa_ssize vl_bq(const pa_family *fam, int dtype, pa_ssize L, int bm)
{
    pa_ssize bq = fam->attn_bq[dtype];
    const pa_ssize nblk = (L + bq - 1) / bq;
    const pa_ssize h = ((L + nblk - 1) / nblk + 15) / 16 * 16;
    return h < bq && !bm ? h : bq;
}

static void vl_set(vl_task *t, pa_ssize seq, pa_ssize b, pa_ssize i0, pa_ssize i1, pa_ssize chunk,
                   pa_ssize nchunks, size_t poff, double cost)
{
    t->seq = seq; t->b = b; t->i0 = i0; t->i1 = i1; t->chunk = chunk; t->nchunks = nchunks;
    t->poff = poff; t->cost = cost;
}

/* A split sequence s (number i): per head its key-chunk tasks (at out + *nt)
 * and its merge task (at merges + *nm), partials from element *np on. -1: a
 * size overflows. */
static int vl_plan_split(const pa_attn_call *s, pa_ssize i, pa_ssize count, vl_task *out, vl_task *merges,
                         size_t *nt, size_t *nm, size_t *np)
{
    const pa_ssize nch = (s->S + PA_SPLIT_CHUNK - 1) / PA_SPLIT_CHUNK;
    const size_t per = (size_t)s->L * (size_t)(2 + s->Ev);
    const double cost = (double)s->L * (double)s->S;
    for (pa_ssize b = 0; b < count; b++) {
        for (pa_ssize ch = 0; ch < nch; ch++, (*nt)++)
            if (out) vl_set(&out[*nt], i, b, 0, s->L, ch, nch, *np + (size_t)ch * per, cost);
        if (out) vl_set(&merges[*nm], i, b, 0, s->L, -2, nch, *np, 0);
        (*nm)++;
        size_t add;
        if (!pa_mul_ok(per, (size_t)nch, &add) || *np + add < *np) return -1;
        *np += add;
    }
    return 0;
}

/* Count (out = NULL) or make the forward's tasks: *ntasks block and chunk
 * tasks, then *nmerge merge tasks after them, *nparts partial elements
 * (on the fill, the counts of the first pass come in). -1: a size
 * overflows. */
static int vl_fwd_plan(const vl_ctx *c, vl_task *out, size_t *ntasks, size_t *nmerge, size_t *nparts)
{
    const pa_attn_call *k = c->call;
    const pa_ssize count = k->bt.count;
    size_t nt = 0, nm = 0, np = 0;
    for (pa_ssize i = 0; i < vl_nseq(k); i++) {
        pa_attn_call s;
        vl_seq(k, i, &s);
        if (s.L == 0) continue;
        if (vl_splits(&s)) {
            if (vl_plan_split(&s, i, count, out, out ? out + *ntasks : NULL, &nt, &nm, &np) != 0) return -1;
            continue;
        }
        pa_attn_args a;
        pa_attn_setup(&a, c->fam, &s, 0);
        const pa_ssize bq = vl_bq(c->fam, k->dtype, s.L, k->block_mask != NULL);
        double cost = 0;                /* the keys its rows visit, all blocks */
        for (pa_ssize i0 = 0; i0 < s.L; i0 += bq) {
            pa_ssize lo, hi;
            pa_block_keys(&a.rule, i0, pa_min(i0 + bq, s.L), &lo, &hi);
            cost += (double)(pa_min(i0 + bq, s.L) - i0) * (double)(hi > lo ? hi - lo + 16 : 16);
        }
        for (pa_ssize i0 = 0; i0 < s.L; i0 += bq)
            for (pa_ssize b = 0; b < count; b++, nt++)
                if (out) vl_set(&out[nt], i, b, i0, pa_min(i0 + bq, s.L), -1, 0, 0, cost);
        if (nt > (size_t)PTRDIFF_MAX / 2) return -1;
    }
    *ntasks = nt;
    *nmerge = nm;
    *nparts = np;
    return 0;
}

static void vl_free_ws(void **ws, int nt)
{
    for (int i = 0; i < nt; i++) pa_free64(ws[i]);
}

/* nt workspaces of bytes each (zeroed: zero), into ws; 0, or -1 when one
 * cannot be allocated (the caller frees them all) */
static int vl_alloc_ws(void **ws, int nt, size_t bytes, int zero)
{
    int ok = 1;
    for (int i = 0; i < nt; i++) {
        ws[i] = pa_alloc64(bytes);
        ok &= ws[i] != NULL;
        if (zero && ws[i]) memset(ws[i], 0, bytes);
    }
    return ok ? 0 : -1;
}

int pa_attention_varlen(const pa_family *fam, const pa_attn_call *call, int nthreads)
{
    vl_ctx c;
    memset(&c, 0, sizeof c);
    c.fam = fam;
    c.call = call;
    size_t nt = 0, nm = 0, np = 0, bytes;
    void *wsv[PA_MAX_THREADS];
    int nth = 0, ok = 0;
    if (call->bt.count == 0 || call->L == 0 || (call->Ev == 0 && !call->has_lse)) return 0;
    if (vl_fwd_plan(&c, NULL, &nt, &nm, &np) != 0 || !pa_mul_ok(nt + nm, sizeof(vl_task), &bytes))
        goto fail;
    c.tasks = (vl_task *)pa_alloc64(bytes > 0 ? bytes : 1);
    if (!c.tasks || !pa_mul_ok(np, pa_elsize(call->dtype), &bytes)) goto fail;
    if (np) {
        c.partials = (char *)pa_alloc64(bytes);
        if (!c.partials) goto fail;
    }
    if (vl_fwd_plan(&c, c.tasks, &nt, &nm, &np) != 0) goto fail;
    qsort(c.tasks, nt, sizeof(vl_task), pa_seq_task_cmp);
    bytes = pa_flash_ws(fam, call->dtype, call->E, call->Ev);
    if (bytes == 0) goto fail;
    nth = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nth > nt) nth = (int)(nt > 0 ? nt : 1);
    ok = vl_alloc_ws(wsv, nth, bytes, 0) == 0;
    if (!ok) goto fail;
    c.ws = wsv;
    pa_parallel_for((pa_ssize)nt, vl_fwd_task, &c, nth);
    if (nm) {
        vl_ctx m = c;
        m.tasks = c.tasks + nt;
        pa_parallel_for((pa_ssize)nm, vl_fwd_task, &m, nth);
    }
fail:
    vl_free_ws(wsv, nth);
    pa_free64(c.partials);
    pa_free64(c.tasks);
    return ok ? 0 : -1;
}

/* ---- the backward ---------------------------------------------------- */

/* flat batch index of (outer, inner) (attn_backward.c's rule) */
static pa_ssize vl_flat(const vl_ctx *c, pa_ssize outer, pa_ssize inner)
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

static char *vl_at(const pa_attn_call *c, const pa_operand *o, pa_ssize b, pa_ssize row, pa_ssize rs)
{
    return (char *)o->p + (pa_batch_offset(&c->bt, o->bs, b) + row * rs) * (pa_ssize)pa_elsize(c->dtype);
}

static void vl_bwd_task(void *ctx_, pa_ssize t, int tid)
{
    const vl_ctx *c = (const vl_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_attn_grads *g = c->g;
    const vl_task *task = &c->tasks[t];
    const pa_ssize i = task->seq, count = k->bt.count;
    const pa_ssize q0 = (pa_ssize)k->cu_seqlens_q[i], k0 = (pa_ssize)k->cu_seqlens_k[i];
    for (pa_ssize inner = 0; inner < c->ninner; inner++) {
        const pa_ssize b = vl_flat(c, task->b, inner);
        pa_attn_call s;
        pa_attn_args a;
        vl_args(c, i, b, &s, &a);
        pa_bwd_io io;
        io.o = vl_at(k, &k->out, b, q0, k->out.rs);
        io.o_rs = k->out.rs; io.o_cs = k->out.cs;
        io.go = vl_at(k, &g->go, b, q0, g->go.rs);
        io.go_rs = g->go.rs; io.go_cs = g->go.cs;
        io.lse = vl_at(k, &k->lse, b, q0, k->lse.cs);
        io.lse_s = k->lse.cs;
        io.dq = vl_at(k, &g->dq, b, q0, g->dq.rs);
        io.dq_rs = g->dq.rs; io.dq_cs = g->dq.cs;
        io.dk = vl_at(k, &g->dk, b, k0, g->dk.rs);
        io.dk_rs = g->dk.rs; io.dk_cs = g->dk.cs;
        io.dv = vl_at(k, &g->dv, b, k0, g->dv.rs);
        io.dv_rs = g->dv.rs; io.dv_cs = g->dv.cs;
        io.dsink = c->dsinks ? c->dsinks + i * count + b : NULL;
        pa_bwd_head_chunked(c->fam, &s, count / c->ninner, &a, &io, c->ws[tid]);   /* the dense call's split */
    }
}

/* the backward's tasks: (sequence, key/value head) with keys and queries;
 * *lmax: the longest sequence's queries */
static size_t vl_bwd_plan(const vl_ctx *c, pa_ssize nouter, vl_task *out, pa_ssize *lmax)
{
    const pa_attn_call *k = c->call;
    size_t n = 0;
    *lmax = 0;
    for (pa_ssize i = 0; i < vl_nseq(k); i++) {
        const pa_ssize L = (pa_ssize)(k->cu_seqlens_q[i + 1] - k->cu_seqlens_q[i]);
        const pa_ssize S = (pa_ssize)(k->cu_seqlens_k[i + 1] - k->cu_seqlens_k[i]);
        if (L == 0 || S == 0) continue;
        if (L > *lmax) *lmax = L;
        for (pa_ssize o = 0; o < nouter; o++, n++)
            if (out) {
                vl_task *t = &out[n];
                memset(t, 0, sizeof *t);
                t->seq = i; t->b = o; t->i1 = L;
                t->cost = (double)L * (double)S;
            }
    }
    return n;
}

int pa_attention_varlen_backward(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                                 int nthreads)
{
    const pa_batch *bt = &call->bt;
    const pa_ssize nseq = vl_nseq(call);
    vl_ctx c;
    memset(&c, 0, sizeof c);
    c.fam = fam; c.call = call; c.g = g;
    void *wsv[PA_MAX_THREADS];
    int nth = 0, ok = 0;
    size_t bytes, nt;
    pa_ssize lmax;
    if (g->dsinks)
        for (pa_ssize b = 0; b < bt->count; b++) g->dsinks[b] = 0;
    if (bt->count == 0 || call->L == 0 || call->S == 0) return 0;
    c.ninner = 1;
    for (int d = 0; d < bt->nb; d++)
        if (g->reduce[d]) c.ninner *= bt->shape[d];
    const pa_ssize nouter = bt->count / c.ninner;
    nt = vl_bwd_plan(&c, nouter, NULL, &lmax);
    if (nt == 0) return 0;
    if (!pa_mul_ok(nt, sizeof(vl_task), &bytes)) goto fail;
    c.tasks = (vl_task *)pa_alloc64(bytes);
    if (!c.tasks) goto fail;
    if (g->dsinks) {
        if (!pa_mul_ok((size_t)nseq, (size_t)bt->count, &bytes) || !pa_mul_ok(bytes, sizeof(double), &bytes))
            goto fail;
        c.dsinks = (double *)pa_alloc64(bytes);
        if (!c.dsinks) goto fail;
        memset(c.dsinks, 0, bytes);
    }
    (void)vl_bwd_plan(&c, nouter, c.tasks, &lmax);
    qsort(c.tasks, nt, sizeof(vl_task), pa_seq_task_cmp);
    bytes = pa_bwd_ws(fam, call->dtype, lmax, call->E, call->Ev);
    if (bytes == 0) goto fail;
    nth = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nth > nt) nth = (int)nt;
    ok = vl_alloc_ws(wsv, nth, bytes, 1) == 0;
    if (!ok) goto fail;
    c.ws = wsv;
    pa_parallel_for((pa_ssize)nt, vl_bwd_task, &c, nth);
    if (g->dsinks)                      /* in sequence order */
        for (pa_ssize i = 0; i < nseq; i++)
            for (pa_ssize b = 0; b < bt->count; b++) g->dsinks[b] += c.dsinks[i * bt->count + b];
fail:
    vl_free_ws(wsv, nth);
    pa_free64(c.dsinks);
    pa_free64(c.tasks);
    return ok ? 0 : -1;
}
