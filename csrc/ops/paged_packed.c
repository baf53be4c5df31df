/*
 * paged_packed.c -- one call for a mixed batch on a paged cache (issue #24:
 * prefill chunks and decode steps together): a pa_attn_call with both
 * cache->table (pa_cache, ops.h) and cu_seqlens_q. pa_attention hands such calls
 * here.
 *
 * The call: batch axes (H) or, with GQA, (Hkv, G); q, out (and lse) hold
 * the packed tokens as rows (L = total), sequence i being rows [cu_q[i],
 * cu_q[i+1]); its keys are the rows of block table row i (pa_cache.table +
 * i * tbs[0]), kv_len[i * count + b] of them filled (every b alike), S the
 * table's columns x block_size; ALiBi slopes nseq * count. row_div = G > 1
 * (GQA only, no slopes or sinks): a sequence with one new token has the G
 * query heads of each key/value head stacked as rows (batch (Hkv), L = G),
 * as the dense call of a decode step does (pyattn/_api.py, _sdpa).
 *
 * pp_seq makes sequence i exactly the dense call that the per-count path
 * made of it (attention_with_kvcache called on that sequence alone, or in a
 * group of sequences bringing as many tokens): the same pa_attn_setup, the
 * dense op's split rule (attention.c, attn_splits) and key chunks with their
 * merge, the same block heights -- so the same bits. Tasks: (sequence, head,
 * query block), or (sequence, head, key chunk) then a merge per (sequence,
 * head) for the split ones; most work first. Dropout, masks and weights do
 * not reach this op (the binding excludes them).
 */
#include <stdlib.h>
#include <string.h>
#include "ops.h"
#include "attention.h"
#include "threads.h"

/* rows [i0, i1) of (seq, b); chunk >= 0: a key chunk (partials at poff);
 * chunk = -2: the merge of nchunks partials at poff */
typedef pa_seq_task pp_task;

typedef struct {
    const pa_family *fam;
    const pa_attn_call *call;
    const pp_task *tasks;
    char *partials;
    void **ws;
} pp_ctx;

static void pp_shift(pa_operand *o, pa_ssize rows, pa_ssize rs, int dt)
{
    o->p = (const char *)o->p + rows * rs * (pa_ssize)pa_elsize(dt);
}

/* sequence i of call c as the dense call of its own, into *s (its table row
 * described by *pg) */
static void pp_seq(const pa_attn_call *c, pa_ssize i, pa_attn_call *s, pa_cache *pg)
{
    const pa_cache *cp = c->cache;
    const pa_ssize q0 = (pa_ssize)c->cu_seqlens_q[i];
    *s = *c;
    *pg = *cp;
    pg->table = cp->table + i * cp->tbs[0];
    memset(pg->tbs, 0, sizeof pg->tbs);
    s->cache = pg;
    s->L = (pa_ssize)c->cu_seqlens_q[i + 1] - q0;
    s->cu_seqlens_q = s->cu_seqlens_k = NULL;
    s->nseq = 0;
    s->kv_len = c->kv_len + i * c->bt.count;
    if (c->slopes) s->slopes = c->slopes + i * c->bt.count;
    pp_shift(&s->q, q0, c->q.rs, c->q_dt);
    pp_shift(&s->out, q0, c->out.rs, c->dtype);
    if (c->has_lse) pp_shift(&s->lse, q0, c->lse.cs, c->dtype);
    s->row_div = 1;
    if (c->row_div > 1 && s->L == 1) {      /* a decode step: the G query heads as rows */
        s->bt.nb = 1;
        s->bt.count = c->bt.shape[0];
        s->L = c->row_div;
        s->row_div = c->row_div;
        s->q.rs = c->q.bs[1];
        s->out.rs = c->out.bs[1];
        s->lse.cs = c->lse.bs[1];
    }
}

/* the dense op's query block height for L rows (attention.c, attn_init) */
static pa_ssize pp_bq(const pa_family *fam, int dtype, pa_ssize L)
{
    const pa_ssize bq = fam->attn_bq[dtype];
    const pa_ssize nblk = (L + bq - 1) / bq;
    const pa_ssize h = ((L + nblk - 1) / nblk + 15) / 16 * 16;
    return h < bq ? h : bq;
}

/* the dense op's split rule (attention.c, attn_splits) */
static int pp_splits(const pa_family *fam, const pa_attn_call *s)
{
    (void)fam;
    return !s->has_w && !s->bf16 && (s->L <= PA_SPLIT_MAXL || s->row_div > 1) &&
           s->S >= PA_SPLIT_MINS && pa_rows_dims(s->E, s->Ev);
}

static void pp_set(pp_task *t, pa_ssize seq, pa_ssize b, pa_ssize i0, pa_ssize i1, pa_ssize chunk,
                   pa_ssize nchunks, size_t poff, double cost)
{
    t->seq = seq; t->b = b; t->i0 = i0; t->i1 = i1; t->chunk = chunk; t->nchunks = nchunks;
    t->poff = poff; t->cost = cost;
}

/* Count (out = NULL) or make the tasks: *nt block and chunk tasks, then *nm
 * merge tasks (at out + the first pass's *nt), *np partial elements. -1: a
 * size overflows. */
static int pp_plan(const pp_ctx *c, pp_task *out, size_t *nt, size_t *nm, size_t *np)
{
    const pa_attn_call *k = c->call;
    pp_task *merges = out ? out + *nt : NULL;
    size_t t = 0, m = 0, p = 0;
    for (pa_ssize i = 0; i < k->nseq; i++) {
        pa_attn_call s;
        pa_cache pg;
        pp_seq(k, i, &s, &pg);
        if (s.L == 0 || s.bt.count == 0) continue;
        const double cost = (double)s.L * (double)(s.kv_len[0] + 16);
        if (pp_splits(c->fam, &s)) {
            const pa_ssize nch = (s.S + PA_SPLIT_CHUNK - 1) / PA_SPLIT_CHUNK;
            const size_t per = (size_t)s.L * (size_t)(2 + s.Ev);
            size_t add;
            for (pa_ssize b = 0; b < s.bt.count; b++) {
                for (pa_ssize ch = 0; ch < nch; ch++, t++)
                    if (out) pp_set(&out[t], i, b, 0, s.L, ch, nch, p + (size_t)ch * per, cost / (double)nch);
                if (out) pp_set(&merges[m], i, b, 0, s.L, -2, nch, p, 0);
                m++;
                if (!pa_mul_ok(per, (size_t)nch, &add) || p + add < p) return -1;
                p += add;
            }
        } else {
            const pa_ssize bq = pp_bq(c->fam, k->dtype, s.L);
            for (pa_ssize i0 = 0; i0 < s.L; i0 += bq)
                for (pa_ssize b = 0; b < s.bt.count; b++, t++)
                    if (out) pp_set(&out[t], i, b, i0, pa_min(i0 + bq, s.L), -1, 0, 0, cost);
        }
        if (t > (size_t)PTRDIFF_MAX / 4 || m > (size_t)PTRDIFF_MAX / 4) return -1;
    }
    *nt = t;
    *nm = m;
    *np = p;
    return 0;
}

static void pp_task_run(void *ctx_, pa_ssize ti, int tid)
{
    const pp_ctx *c = (const pp_ctx *)ctx_;
    const pp_task *k = &c->tasks[ti];
    pa_attn_call s;
    pa_cache pg;
    pa_attn_args a;
    pp_seq(c->call, k->seq, &s, &pg);
    pa_attn_setup(&a, c->fam, &s, k->b);
    pa_seq_task_run(c->fam, &a, &s, k, c->partials, c->ws[tid]);
}

int pa_attention_paged_packed(const pa_family *fam, const pa_attn_call *call, int nthreads)
{
    pp_ctx c;
    memset(&c, 0, sizeof c);
    c.fam = fam;
    c.call = call;
    size_t nt = 0, nm = 0, np = 0, bytes;
    pp_task *tasks = NULL;
    void *wsv[PA_MAX_THREADS];
    int nth = 0, ok = 0;
    if (pp_plan(&c, NULL, &nt, &nm, &np) != 0 || !pa_mul_ok(nt + nm, sizeof(pp_task), &bytes)) goto fail;
    tasks = (pp_task *)pa_alloc64(bytes > 0 ? bytes : 1);
    if (!tasks || !pa_mul_ok(np, pa_elsize(call->dtype), &bytes)) goto fail;
    if (np) {
        c.partials = (char *)pa_alloc64(bytes);
        if (!c.partials) goto fail;
    }
    if (pp_plan(&c, tasks, &nt, &nm, &np) != 0) goto fail;
    qsort(tasks, nt, sizeof(pp_task), pa_seq_task_cmp);
    bytes = pa_flash_ws(fam, call->dtype, call->E, call->Ev);
    if (bytes == 0) goto fail;
    nth = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nth > nt) nth = (int)(nt > 0 ? nt : 1);
    ok = 1;
    for (int i = 0; i < nth; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (!ok) goto fail;
    if (call->before) call->before(call->before_ctx);   /* everything is allocated */
    c.ws = wsv;
    c.tasks = tasks;
    pa_parallel_for((pa_ssize)nt, pp_task_run, &c, nth);
    if (nm) {
        c.tasks = tasks + nt;
        pa_parallel_for((pa_ssize)nm, pp_task_run, &c, nth);
    }
fail:
    for (int i = 0; i < nth; i++) pa_free64(wsv[i]);
    pa_free64(c.partials);
    pa_free64(tasks);
    return ok ? 0 : -1;
}
