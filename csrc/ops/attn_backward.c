/*
 * attn_backward.c -- the dense attention backward over a batch of heads (API.md
 * "Gradients"; the per-head tiles: attn_backward.inc), and one head's key-split
 * run alone (pa_bwd_head_chunked) for the packed-sequence backward. Below
 * attn_varlen.c, which calls that; the routing (packed or dense) is
 * attention.c's pa_attention_backward.
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
 *
 * Key-split: a call with fewer than PA_BWD_SPLIT_TASKS key/value heads
 * (MQA with B = 1: one task) splits each head's keys into chunks on the
 * 60-key tile grid, cut where the rows' key ranges (causal, window) give
 * them equal work; a task is (head, chunk). A chunk writes the dK, dV rows
 * of its own keys (summed as without the split: the same tiles, query
 * blocks and heads in the same order) and a dQ partial: chunk 0 into dq,
 * chunk c > 0 into a zeroed buffer of its own; then dq += partial 1,
 * partial 2, ... in order of c. The chunks follow from the shape alone
 * (heads, L, S, E, the key rule), never from the thread count, so the
 * result is the same for any number of threads.
 *
 * A split call runs in passes over groups of query heads per key/value head
 * (as many as PA_BWD_GROUP_BYTES of packed query sides and dQ partials
 * hold, at least one), each pass in three parallel steps: pack every
 * (query head, key/value head) of the group in slices of query blocks
 * (so the packing runs on every thread, not on one while the others wait),
 * then the (key/value head, chunk) tasks, each running the group's query
 * heads in order, then dq += the partials. The sums (a chunk's dK, dV over
 * the query heads in order; a dq over the chunks in order) are those of a
 * pass per query head, so are the bits.
 *
 * Memory: a call's workspaces (each thread's, the split's partials and
 * packed query sides) are one block from pa_ws_take (ops.h), kept from call
 * to call, so a call touches no fresh page (a few MiB freed and allocated a
 * call were page faults every call); a call that overlaps another (the GIL
 * released) gets a block of its own.
 */
#include <string.h>
#include "ops.h"
#include "attention.h"
#include "threads.h"

#define PA_BWD_SPLIT_TASKS 8          /* key-split below this many key/value heads */
/* the packed-sequence backward (attn_varlen.c) runs the same split, a head's
 * chunks in turn (pa_bwd_head_chunked), so it gives each sequence's dense
 * bits (tests/test_varlen.py); 0 turns the split off in both */
#define PA_BWD_SPLIT_ON 1
#define PA_BWD_SPLIT_MINTILES 8       /* key tiles per chunk, on average at least */
#define PA_BWD_SPLIT_BYTES ((size_t)64 << 20)   /* dQ partials: at most this or dq's size */
/* a pass's packed query sides and partials: at most this or one query
 * head's. Small: a pass's chunks read their heads' packed sides from cache
 * (MQA H=8/1, L=2048, E=64 measured in one process, 1 and 2 threads: 8 MiB
 * (2 heads a pass) as fast as 1 head, 64 MiB (all 8) 15-25 % more CPU time) */
#define PA_BWD_GROUP_BYTES ((size_t)8 << 20)

typedef struct {
    const pa_family *fam;
    const pa_attn_call *call;
    const pa_attn_grads *g;
    pa_ssize ninner;
    void **ws;
    size_t wsb;                 /* bytes of each ws[tid], zeroed by its thread's first task (wsz[tid]) */
    unsigned char wsz[PA_MAX_THREADS];
    pa_ssize nsplit;            /* key chunks per head (1: no split) */
    pa_ssize cut[PA_BWD_SPLIT_TASKS + 1];   /* chunk c: keys [cut[c], cut[c + 1]) */
    char *part;                 /* dQ partials of chunks 1..nsplit-1: (c - 1, il, outer) -> (L, E) */
    pa_ssize rlo[PA_BWD_SPLIT_TASKS], rhi[PA_BWD_SPLIT_TASKS];   /* chunk c's dQ rows: its query blocks */
    pa_ssize order[PA_BWD_SPLIT_TASKS];     /* the chunks as handed out: most keys seen first */
    char *qs;                   /* split: the packed query side of (outer, ig0 + il) at qs + (il * nouter + outer) * qsz */
    size_t qsz;
    pa_ssize nouter;
    pa_ssize ig0, ng;           /* split: the query heads [ig0, ig0 + ng) of each key/value head this pass runs */
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

/* one head's operands (flat batch index b, key/value head outer, query head
 * ig0 + il of a split pass): its dQ is chunk ch's (0: dq itself, else the
 * partial of (ch, il, outer)) */
static void bwd_io_of(const bwd_ctx *c, pa_ssize b, pa_ssize outer, pa_ssize il, pa_ssize ch, pa_bwd_io *io)
{
    const pa_attn_call *k = c->call;
    const pa_attn_grads *g = c->g;
    io->o = at(k, &k->out, b);
    io->o_rs = k->out.rs; io->o_cs = k->out.cs;
    io->go = at(k, &g->go, b);
    io->go_rs = g->go.rs; io->go_cs = g->go.cs;
    io->lse = at(k, &k->lse, b);
    io->lse_s = k->lse.cs;
    if (ch == 0) {
        io->dq = at(k, &g->dq, b);
        io->dq_rs = g->dq.rs; io->dq_cs = g->dq.cs;
    } else {
        io->dq = c->part + (((ch - 1) * c->ng + il) * c->nouter + outer) * k->L * k->E * (pa_ssize)pa_elsize(k->dtype);
        io->dq_rs = k->E; io->dq_cs = 1;
    }
    io->dk = at(k, &g->dk, b);
    io->dk_rs = g->dk.rs; io->dk_cs = g->dk.cs;
    io->dv = at(k, &g->dv, b);
    io->dv_rs = g->dv.rs; io->dv_cs = g->dv.cs;
    io->dsink = g->dsinks && ch == 0 ? g->dsinks + b : NULL;
}

/* g->zero: rows [r0, r1) of operand o (ncols columns) at flat batch index
 * b set to +0 -- a task zeroes the gradient rows it alone adds into, just
 * before it does, so the zeroing (and the first touch of fresh pages) runs
 * on every thread and leaves the rows in cache */
static void bwd_zero_rows(const pa_attn_call *k, const pa_operand *o, pa_ssize b, pa_ssize r0, pa_ssize r1,
                          pa_ssize ncols)
{
    if (r0 >= r1 || ncols <= 0) return;
    const size_t es = pa_elsize(k->dtype);
    char *p = at(k, o, b);
    if (o->cs == 1 && o->rs == ncols) {
        memset(p + (size_t)(r0 * o->rs) * es, 0, (size_t)((r1 - r0) * ncols) * es);
        return;
    }
    for (pa_ssize i = r0; i < r1; i++)
        for (pa_ssize e = 0; e < ncols; e++) {
            char *x = p + (size_t)(i * o->rs + e * o->cs) * es;
            if (k->dtype == PA_F32) *(float *)x = 0;
            else *(double *)x = 0;
        }
}

/* a key-split pass, step 1: the packed query side of (outer, ig0 + il),
 * shared by its chunks, in slices of PA_BWD_PACK_BLKS query blocks (one
 * head packs on every thread); task = (il * nouter + outer) * nslab + slice */
#define PA_BWD_PACK_BLKS 4
static pa_ssize bwd_nslab(const bwd_ctx *c)
{
    const pa_ssize BQ = c->fam->attn_bq[c->call->dtype], nblk = (c->call->L + BQ - 1) / BQ;
    return (nblk + PA_BWD_PACK_BLKS - 1) / PA_BWD_PACK_BLKS;
}

static void bwd_pack_task(void *ctx_, pa_ssize task, int tid)
{
    (void)tid;
    const bwd_ctx *c = (const bwd_ctx *)ctx_;
    const pa_ssize nslab = bwd_nslab(c), head = task / nslab, sl = task % nslab;
    const pa_ssize il = head / c->nouter, outer = head % c->nouter;
    const pa_ssize b = flat_index(c, outer, c->ig0 + il);
    pa_attn_args a;
    pa_attn_setup(&a, c->fam, c->call, b);
    pa_bwd_io io;
    bwd_io_of(c, b, outer, il, 0, &io);
    pa_bwd_pack_blocks(c->fam, c->call->dtype, &a, &io, c->qs + (size_t)head * c->qsz, sl * PA_BWD_PACK_BLKS,
                       (sl + 1) * PA_BWD_PACK_BLKS);
}

/* a task: key/value head outer, key chunk ch; its query heads in order
 * (split: the pass's query heads, ig0 .. ig0 + ng - 1) */
static void bwd_task(void *ctx_, pa_ssize task, int tid)
{
    bwd_ctx *c = (bwd_ctx *)ctx_;
    if (!c->wsz[tid]) {                     /* this thread's workspace, zeroed on this thread */
        memset(c->ws[tid], 0, c->wsb);
        c->wsz[tid] = 1;
    }
    /* the heaviest chunks of every head first, the lightest last (a thread
     * that ends early takes the light ones); the order of tasks never
     * changes a sum, so neither the bits */
    const pa_ssize outer = task % c->nouter, ch = c->order[task / c->nouter];
    const pa_ssize es = (pa_ssize)pa_elsize(c->call->dtype);
    pa_stop_flag *const stop = pa_stop_get();
    if (c->g->zero && (!c->qs || c->ig0 == 0)) {   /* this chunk's dK, dV rows (shared by the heads of outer) */
        const pa_ssize b0 = flat_index(c, outer, 0);
        bwd_zero_rows(c->call, &c->g->dk, b0, c->cut[ch], c->cut[ch + 1], c->call->E);
        bwd_zero_rows(c->call, &c->g->dv, b0, c->cut[ch], c->cut[ch + 1], c->call->Ev);
    }
    for (pa_ssize inner = c->qs ? c->ig0 : 0; inner < (c->qs ? c->ig0 + c->ng : c->ninner); inner++) {
        if (pa_stopping(stop)) return;
        const pa_ssize b = flat_index(c, outer, inner), il = inner - c->ig0;
        if (c->g->zero && ch == 0)          /* dq of b: chunk 0 adds into it first (the partials after) */
            bwd_zero_rows(c->call, &c->g->dq, b, 0, c->call->L, c->call->E);
        pa_attn_args a;
        pa_attn_setup(&a, c->fam, c->call, b);
        a.key_begin = c->cut[ch];
        a.key_end = c->cut[ch + 1];
        pa_bwd_io io;
        bwd_io_of(c, b, outer, il, ch, &io);
        if (ch > 0)                         /* the partial's rows this chunk adds into */
            memset((char *)io.dq + c->rlo[ch] * c->call->E * es, 0,
                   (size_t)((c->rhi[ch] - c->rlo[ch]) * c->call->E * es));
        if (c->qs) pa_bwd_keys(c->fam, c->call->dtype, &a, &io, c->qs + (size_t)(il * c->nouter + outer) * c->qsz,
                               c->ws[tid]);
        else pa_bwd_head(c->fam, c->call->dtype, &a, &io, c->ws[tid]);
    }
}

/* a key-split pass, step 3: dq of (outer, ig0 + il), rows [r0, r1): dq +=
 * partial 1, partial 2, ...
 * in order of the chunk (the fixed order of the key-split's dQ sums). A
 * partial's rows outside its chunk's query blocks are +0, and dq (zeroed by
 * the binding, then sums from +0) is never -0: adding them would change no
 * bit, so they are neither zeroed nor added. */
#define PA_BWD_SUM_ROWS 128
static void bwd_sum_task(void *ctx_, pa_ssize task, int tid)
{
    (void)tid;
    const bwd_ctx *c = (const bwd_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_ssize nrb = (k->L + PA_BWD_SUM_ROWS - 1) / PA_BWD_SUM_ROWS, nouter = c->nouter;
    const pa_ssize head = task / nrb, r0 = task % nrb * PA_BWD_SUM_ROWS, r1 = pa_min(r0 + PA_BWD_SUM_ROWS, k->L);
    const pa_ssize il = head / nouter, outer = head % nouter;
    const pa_ssize b = flat_index(c, outer, c->ig0 + il);
    const pa_ssize L = k->L, E = k->E, rs = c->g->dq.rs, cs = c->g->dq.cs;
    for (pa_ssize ch = 1; ch < c->nsplit; ch++) {
        const pa_ssize off = (((ch - 1) * c->ng + il) * nouter + outer) * L * E;
        const pa_ssize i0 = pa_max(r0, c->rlo[ch]), i1 = pa_min(r1, c->rhi[ch]);
        if (k->dtype == PA_F32) {
            float *dq = (float *)at(k, &c->g->dq, b);
            const float *p = (const float *)c->part + off;
            for (pa_ssize i = i0; i < i1; i++)
                for (pa_ssize e = 0; e < E; e++) dq[i * rs + e * cs] += p[i * E + e];
        } else {
            double *dq = (double *)at(k, &c->g->dq, b);
            const double *p = (const double *)c->part + off;
            for (pa_ssize i = i0; i < i1; i++)
                for (pa_ssize e = 0; e < E; e++) dq[i * rs + e * cs] += p[i * E + e];
        }
    }
}

/* How many key chunks a call of nouter key/value heads splits each head's
 * keys into (below 2: no split): enough for PA_BWD_SPLIT_TASKS tasks, at
 * least PA_BWD_SPLIT_MINTILES key tiles each on average, and the chunks' dQ
 * partials within PA_BWD_SPLIT_BYTES (or one chunk's) */
static pa_ssize bwd_chunk_count(const pa_attn_call *k, pa_ssize nouter)
{
    const pa_ssize ntile = (k->S + PA_FLASH_BK - 1) / PA_FLASH_BK;
    if (!PA_BWD_SPLIT_ON || nouter >= PA_BWD_SPLIT_TASKS || k->E == 0) return 1;
    pa_ssize n = pa_min((PA_BWD_SPLIT_TASKS + nouter - 1) / nouter, ntile / PA_BWD_SPLIT_MINTILES);
    size_t one, cap = PA_BWD_SPLIT_BYTES;     /* one chunk's partials */
    if (!pa_mul_ok((size_t)nouter, (size_t)k->L, &one) || !pa_mul_ok(one, (size_t)k->E, &one) ||
        !pa_mul_ok(one, pa_elsize(k->dtype), &one))
        return 1;
    if (one > cap) cap = one;
    return pa_min(n, (pa_ssize)(cap / one) + 1);
}

/* row i's key range under rule r, clipped to [0, S) (empty: *lo >= *hi) */
static void bwd_row_keys(const pa_keyrule *r, pa_ssize i, pa_ssize S, pa_ssize *lo, pa_ssize *hi)
{
    pa_key_range(r, i, lo, hi);
    *lo = pa_max(*lo, 0);
    *hi = pa_min(*hi, S);
}

/* c->cut[1 .. n - 1] and c->nsplit: chunk ch ends at the first tile where
 * the running work reaches (ch + 1) / n of the total. Work of tiles [0, t]:
 * per row, the tiles of its key range up to t (an integer: exact in a
 * double); no allocation, so a head run alone (pa_bwd_head_chunked) always
 * gets the call's plan. O(L + tiles): the work of tile t is the number of
 * rows whose tiles [tlo, thi] hold t, and both ends are nondecreasing in the
 * row (pa_key_range; rows that see no key left out), so two cursors count
 * the rows with tlo <= t and those with thi < t */
static void bwd_chunk_cuts(bwd_ctx *c, const pa_attn_args *a, pa_ssize n)
{
    const pa_ssize S = c->call->S, L = c->call->L, BK = PA_FLASH_BK, ntile = (S + BK - 1) / BK;
    double total = 0;
    for (pa_ssize i = 0; i < L; i++) {
        pa_ssize lo, hi;
        bwd_row_keys(&a->rule, i, S, &lo, &hi);
        if (lo < hi) total += (double)((hi - 1) / BK - lo / BK + 1);
    }
    pa_ssize ch = 1, t = 0, ia = 0, ib = 0, na = 0, nb = 0;
    double acc = 0;
    for (; t < ntile && ch < n; t++) {
        for (; ia < L; ia++) {                        /* na: rows with tlo <= t */
            pa_ssize lo, hi;
            bwd_row_keys(&a->rule, ia, S, &lo, &hi);
            if (lo >= hi) continue;
            if (lo / BK > t) break;
            na++;
        }
        for (; ib < L; ib++) {                        /* nb: rows with thi < t */
            pa_ssize lo, hi;
            bwd_row_keys(&a->rule, ib, S, &lo, &hi);
            if (lo >= hi) continue;
            if ((hi - 1) / BK >= t) break;
            nb++;
        }
        acc += (double)(na - nb);
        if (acc >= total * (double)ch / (double)n && ntile - (t + 1) >= (n - ch)) c->cut[ch++] = (t + 1) * BK;
    }
    c->nsplit = ch;
    c->cut[ch] = S;
}

/* c->rlo, c->rhi: the query blocks that meet each chunk (the rule of b = 0:
 * every b's but with kv_len) */
static void bwd_chunk_rows(bwd_ctx *c, const pa_attn_args *a)
{
    const pa_attn_call *k = c->call;
    const pa_ssize L = k->L, BQ = c->fam->attn_bq[k->dtype];
    for (pa_ssize h = 0; h < c->nsplit; h++) {
        c->rlo[h] = L; c->rhi[h] = 0;
        for (pa_ssize i0 = 0; i0 < L; i0 += BQ) {
            pa_ssize lo, hi;
            pa_block_keys(&a->rule, i0, pa_min(i0 + BQ, L), &lo, &hi);
            if (!k->kv_len && (lo >= hi || hi <= c->cut[h] || lo >= c->cut[h + 1])) continue;
            c->rlo[h] = pa_min(c->rlo[h], i0);
            c->rhi[h] = pa_max(c->rhi[h], pa_min(i0 + BQ, L));
        }
        if (c->rlo[h] >= c->rhi[h]) c->rlo[h] = c->rhi[h] = 0;
    }
}

/* c->order, the order of the tasks: the chunks by the (row, key) pairs they
 * hold (the first head's rule), most first, ties by index (an insertion
 * sort of at most PA_BWD_SPLIT_TASKS) */
static void bwd_chunk_order(bwd_ctx *c, const pa_attn_args *a)
{
    const pa_ssize ch = c->nsplit;
    double w[PA_BWD_SPLIT_TASKS];
    for (pa_ssize h = 0; h < ch; h++) w[h] = 0;
    for (pa_ssize i = 0; i < c->call->L; i++) {
        pa_ssize lo, hi;
        pa_key_range(&a->rule, i, &lo, &hi);
        for (pa_ssize h = 0; h < ch; h++) {
            const pa_ssize x0 = pa_max(lo, c->cut[h]), x1 = pa_min(hi, c->cut[h + 1]);
            if (x1 > x0) w[h] += (double)(x1 - x0);
        }
    }
    for (pa_ssize h = 0; h < ch; h++) {
        pa_ssize j = h;
        for (; j > 0 && w[c->order[j - 1]] < w[h]; j--) c->order[j] = c->order[j - 1];
        c->order[j] = h;
    }
}

/* The key chunks of a call with nouter key/value heads (c->nsplit, c->cut,
 * their query rows c->rlo, c->rhi and task order c->order): from the shape
 * alone. Work per key tile = the query rows whose key range meets it (the
 * first head's rule: causal, window). Returns -1 when out of memory. */
static int bwd_chunks(bwd_ctx *c, pa_ssize nouter)
{
    c->nsplit = 1; c->cut[0] = 0; c->cut[1] = c->call->S; c->order[0] = 0;
    const pa_ssize n = bwd_chunk_count(c->call, nouter);
    if (n < 2) return 0;
    pa_attn_args a;
    pa_attn_setup(&a, c->fam, c->call, 0);
    bwd_chunk_cuts(c, &a, n);
    bwd_chunk_rows(c, &a);
    bwd_chunk_order(c, &a);
    return 0;
}

/* One head's backward with the key-split of a call of nouter key/value heads
 * run in turn (the packed-sequence backward, attn_varlen.c): the chunks of
 * bwd_chunks, chunk 0 into dq, chunk c into the zeroed partial at the end
 * of ws, then dq += partial -- the sums and order of pa_attention_backward's
 * passes, so the bits of the dense call. ws: pa_bwd_ws bytes. */
void pa_bwd_head_chunked(const pa_family *fam, const pa_attn_call *call, pa_ssize nouter, const pa_attn_args *a0,
                         const pa_bwd_io *io0, void *ws)
{
    bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.fam = fam; c.call = call;
    (void)bwd_chunks(&c, nouter);
    const int dt = call->dtype;
    if (c.nsplit == 1) {
        pa_bwd_head(fam, dt, a0, io0, ws);
        return;
    }
    const pa_ssize L = call->L, E = call->E, es = (pa_ssize)pa_elsize(dt);
    char *qs = (char *)ws, *part = (char *)ws + pa_bwd_ws(fam, dt, L, E, call->Ev) - (size_t)(L * E * es);
    char *tiles = qs + pa_bwd_ws_qside(fam, dt, L, E, call->Ev);
    pa_bwd_pack(fam, dt, a0, io0, qs);
    for (pa_ssize ch = 0; ch < c.nsplit; ch++) {
        pa_attn_args a = *a0;
        pa_bwd_io io = *io0;
        a.key_begin = c.cut[ch];
        a.key_end = c.cut[ch + 1];
        if (ch > 0) {
            io.dq = part; io.dq_rs = E; io.dq_cs = 1; io.dsink = NULL;
            memset(part + c.rlo[ch] * E * es, 0, (size_t)((c.rhi[ch] - c.rlo[ch]) * E * es));
        }
        pa_bwd_keys(fam, dt, &a, &io, qs, tiles);
        if (ch == 0) continue;
        const pa_ssize rs = io0->dq_rs, cs = io0->dq_cs;
        for (pa_ssize i = c.rlo[ch]; i < c.rhi[ch]; i++)
            for (pa_ssize e = 0; e < E; e++) {
                if (dt == PA_F32) ((float *)io0->dq)[i * rs + e * cs] += ((const float *)part)[i * E + e];
                else ((double *)io0->dq)[i * rs + e * cs] += ((const double *)part)[i * E + e];
            }
    }
}

/* g->zero with no key or no query: nothing to add, the gradients are zeros */
static void bwd_zero_all(const pa_attn_call *call, const pa_attn_grads *g)
{
    for (pa_ssize b = 0; b < call->bt.count; b++) {
        bwd_zero_rows(call, &g->dq, b, 0, call->L, call->E);
        bwd_zero_rows(call, &g->dk, b, 0, call->S, call->E);
        bwd_zero_rows(call, &g->dv, b, 0, call->S, call->Ev);
    }
}

/* A key-split call's buffers (c->nsplit > 1): a pass's, per (query head of
 * the group, key/value head), a packed query side and the chunks' dQ
 * partials (their bytes: *qb, *pb; c->qsz); the threads' workspaces hold
 * tiles only (*wsb: bytes, one head's workspace less its query side). The
 * group (c->ng): as many query heads as PA_BWD_GROUP_BYTES holds, at least
 * one. Returns -1 when a size overflows. */
static int bwd_split_sizes(bwd_ctx *c, size_t bytes, size_t *wsb, size_t *qb, size_t *pb)
{
    const pa_attn_call *call = c->call;
    const pa_ssize nouter = c->nouter;
    const size_t q1 = pa_bwd_ws_qside(c->fam, call->dtype, call->L, call->E, call->Ev);
    const size_t p1 = (size_t)(c->nsplit - 1) * (size_t)call->L * (size_t)call->E *
                      pa_elsize(call->dtype);   /* one head's partials: <= the cap, checked in bwd_chunks */
    size_t per;
    c->qsz = q1 == 0 || q1 > SIZE_MAX - 64 ? 0 : (q1 + 63) / 64 * 64;
    if (c->qsz == 0 || c->qsz > SIZE_MAX - p1 || !pa_mul_ok(c->qsz + p1, (size_t)nouter, &per)) return -1;
    c->ng = (pa_ssize)pa_min((size_t)c->ninner, PA_BWD_GROUP_BYTES / per);
    if (c->ng < 1) c->ng = 1;
    if (!pa_mul_ok(c->qsz * (size_t)nouter, (size_t)c->ng, qb) || !pa_mul_ok(p1 * (size_t)nouter, (size_t)c->ng, pb))
        return -1;
    *wsb = bytes - q1;
    return 0;
}

/* The tasks of a call with its workspaces in place: one parallel step, or
 * with the key-split a pass per group of query heads of the key/value heads
 * (their dK, dV sums run over the query heads in order), each in three
 * steps (pack, chunks, dq += partials). nt: threads for the chunk tasks
 * (at most one per task), nall: for the others */
static void bwd_run(bwd_ctx *c, pa_ssize ntasks, int nt, int nall)
{
    if (c->nsplit == 1) {
        pa_parallel_for(ntasks, bwd_task, c, nt);
        return;
    }
    pa_stop_flag *const stop = pa_stop_get();
    const pa_ssize nrb = (c->call->L + PA_BWD_SUM_ROWS - 1) / PA_BWD_SUM_ROWS, nouter = c->nouter;
    const pa_ssize ngroup = c->ng;
    for (c->ig0 = 0; c->ig0 < c->ninner && !pa_stopping(stop); c->ig0 += ngroup) {
        c->ng = pa_min(ngroup, c->ninner - c->ig0);
        pa_parallel_for(c->ng * nouter * bwd_nslab(c), bwd_pack_task, c, nall);
        pa_parallel_for(ntasks, bwd_task, c, nt);
        pa_parallel_for(c->ng * nouter * nrb, bwd_sum_task, c, nall);
    }
}

/* The dense backward (attention.c's pa_attention_backward routes packed
 * sequences to attn_varlen.c, everything else here). */
int pa_attention_backward_dense(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                                int nthreads)
{
    const pa_batch *bt = &call->bt;
    if (g->dsinks)
        for (pa_ssize b = 0; b < bt->count; b++) g->dsinks[b] = 0;
    if (bt->count == 0) return 0;
    if (call->L == 0 || call->S == 0) {
        if (g->zero) bwd_zero_all(call, g);
        return 0;
    }
    bwd_ctx c;
    c.fam = fam; c.call = call; c.g = g;
    c.ninner = 1;
    for (int d = 0; d < bt->nb; d++)
        if (g->reduce[d]) c.ninner *= bt->shape[d];
    const pa_ssize nouter = bt->count / c.ninner;
    c.nouter = nouter;
    const size_t bytes = pa_bwd_ws(fam, call->dtype, call->L, call->E, call->Ev);
    if (bytes == 0) return -1;
    c.part = c.qs = NULL;
    c.qsz = 0;
    c.ig0 = 0; c.ng = 1;
    if (bwd_chunks(&c, nouter) < 0) return -1;
    size_t wsb = bytes, qb = 0, pb = 0;
    if (c.nsplit > 1 && bwd_split_sizes(&c, bytes, &wsb, &qb, &pb) < 0) return -1;
    const pa_ssize ntasks = nouter * c.nsplit;
    const int nall = nthreads < 1 ? 1 : nthreads;
    const int nt = nall > ntasks ? (int)ntasks : nall;
    /* one block (pa_ws_take: kept from call to call, no page faults): the
     * threads' workspaces, each on 64 bytes, then the partials, then the
     * packed query sides */
    size_t wsa, all;
    if (wsb > SIZE_MAX - 63) return -1;
    wsa = (wsb + 63) / 64 * 64;
    if (!pa_mul_ok(wsa, (size_t)nt, &all) || all > SIZE_MAX - pb || all + pb > SIZE_MAX - 64 - qb) return -1;
    const size_t poff = all, qoff = (all + pb + 63) / 64 * 64;
    char *blk = (char *)pa_ws_take(qoff + qb);
    if (!blk) return -1;
    void *wsv[PA_MAX_THREADS];
    for (int i = 0; i < nt; i++) wsv[i] = blk + (size_t)i * wsa;
    if (c.nsplit > 1) {
        c.part = blk + poff;
        c.qs = blk + qoff;
    }
    c.ws = wsv;
    c.wsb = wsb;
    memset(c.wsz, 0, sizeof c.wsz);
    bwd_run(&c, ntasks, nt, nall);
    pa_ws_give(blk);
    return 0;
}
