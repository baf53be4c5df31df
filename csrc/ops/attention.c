/*
 * attention.c -- fused scaled-dot-product attention over a batch of heads.
 *
 * Shapes (per flat batch index b, which covers batch and head axes):
 *   q (L, E), k (S, E), v (S, Ev), mask (L, S) or none, out (L, Ev),
 *   w (L, S) only when the weights are asked for.
 * A task is (b, block of BQ query rows; BQ = the family's attn_bq); the
 * flash frame streams all key tiles for that block, so each output row is
 * computed by exactly one task with a fixed order of arithmetic: results do
 * not depend on the thread count, nor on the batch a row came in. Within each b, blocks are handed out last-first so
 * that with causal masking the long rows start early (better balance).
 *
 * Decode shapes (L <= PA_SPLIT_MAXL queries, S >= PA_SPLIT_MINS keys) have too
 * few query blocks to keep the threads busy: there a task is (b, chunk of
 * PA_SPLIT_CHUNK keys), each leaves its running max, sum and unnormalised
 * output, and a second pass merges the chunks of each row in chunk order.
 * The chunking depends on the shape only, so results stay bit-identical
 * whatever the thread count (they differ in the last bits from the same
 * rows computed among more than PA_SPLIT_MAXL queries).
 * Precision "bf16" on decode shapes (pa_bf16_rows_shape) splits only the
 * scores: tasks (b, chunk of PA_BF16_SPLIT_CHUNK keys, on the key tiles'
 * grid) leave them in a scratch, then a task per b runs the rest of the
 * rows path over them in key order -- the bits of the unsplit call.
 */
#include "ops.h"
#include "attention.h"
#include "threads.h"

typedef struct {
    const pa_family *fam;   /* the call's kernels, fixed for the whole call */
    const pa_attn_call *call;
    pa_ssize bq;            /* query rows per task (at most the family's attn_bq) */
    pa_ssize nblk;
    int small_last;         /* 1: the short last block of every b goes at the job's end */
    void **ws;
    uint16_t *kvp;           /* bf16 with several query blocks: K, V packed per b, */
    pa_ssize kvp_tile, ntiles; /* ntiles tiles of kvp_tile elements each */
    pa_ssize nchunks;        /* key chunks per head (split mode), else 0 */
    pa_ssize chunk;          /* keys per chunk: PA_SPLIT_CHUNK, PA_BF16_SPLIT_CHUNK */
    int nreq;                /* the threads asked for (bf16: whether to split) */
    char *partials;          /* (count, nchunks, L, 2 + Ev) in split mode */
    float *sc;               /* bf16 split: (count, nchunks, L, chunk) scores */
} attn_ctx;

static void attn_args(const attn_ctx *c, pa_ssize b, pa_attn_args *out)
{
    pa_attn_setup(out, c->fam, c->call, b);
}

static void attn_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    pa_ssize b = t / c->nblk, blk = c->nblk - 1 - t % c->nblk;
    if (c->small_last) {            /* the full blocks (last-first per b), then the short ones */
        const pa_ssize full = c->call->bt.count * (c->nblk - 1);
        if (t < full) { b = t / (c->nblk - 1); blk = c->nblk - 2 - t % (c->nblk - 1); }
        else { b = t - full; blk = c->nblk - 1; }
    }
    const pa_ssize i0 = blk * c->bq;
    const pa_ssize i1 = pa_min(i0 + c->bq, c->call->L);
    pa_attn_args a;
    attn_args(c, b, &a);
    if (c->kvp) {
        a.kvp = c->kvp + (size_t)(b * c->ntiles) * (size_t)c->kvp_tile;
        a.kvp_tile = c->kvp_tile;
    }
    pa_flash_run(c->fam, c->call->dtype, &a, i0, i1, c->ws[tid]);
}

/* bf16: task (b, key tile) -> that tile of K and V packed once for all the
 * query blocks of b */
static void kvpack_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_ssize b = t / c->ntiles, tile = t % c->ntiles;
    pa_attn_args a;
    attn_args(c, b, &a);
    const pa_ssize j0 = tile * PA_FLASH_BK;
    const pa_ssize nj = pa_min(c->call->S - j0, PA_FLASH_BK);
    uint16_t *Kp = c->kvp + (size_t)t * (size_t)c->kvp_tile;
    const pa_ssize mr = c->fam->gemm_bf16.mr;
    const pa_ssize e2 = pa_round_up(c->call->E > 0 ? c->call->E : 1, 2);
    pa_bf16_pack_kv(c->fam, &a, j0, nj, Kp, Kp + pa_round_up(PA_FLASH_BK, mr) * e2);
    (void)tid;
}

/* split mode, pass 1: (b, key chunk) -> partial (m, l, O) of every row */
static void chunk_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_ssize es = (pa_ssize)pa_elsize(k->dtype);
    const pa_ssize b = t / c->nchunks, ch = t % c->nchunks;
    pa_attn_args a;
    attn_args(c, b, &a);
    a.key_begin = ch * c->chunk;
    a.key_end = pa_min(a.key_begin + c->chunk, k->S);
    a.partial = c->partials + (t * k->L * (2 + k->Ev)) * es;
    pa_flash_run(c->fam, k->dtype, &a, 0, k->L, c->ws[tid]);
}

/* bf16 split (the rows path on bfloat16 values, attn_flash.c): pass 1,
 * (b, key chunk) -> the chunk's scores of every row */
static void bf16_scores_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_ssize b = t / c->nchunks, ch = t % c->nchunks;
    pa_attn_args a;
    attn_args(c, b, &a);
    a.key_begin = ch * c->chunk;
    a.key_end = pa_min(a.key_begin + c->chunk, k->S);
    pa_bf16_rows_scores(c->fam, &a, c->sc + (size_t)t * (size_t)(k->L * c->chunk), c->chunk, c->ws[tid]);
}

/* pass 2, b -> its rows over all keys on those scores (the softmax steps,
 * P rounded, P V, in the order of the call without the split) */
static void bf16_finish_task(void *ctx_, pa_ssize b, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    pa_attn_args a;
    attn_args(c, b, &a);
    pa_bf16_rows_finish(c->fam, &a, c->sc + (size_t)(b * c->nchunks) * (size_t)(k->L * c->chunk), c->chunk,
                        k->L * c->chunk, c->ws[tid]);
}

/* split mode, pass 2: b -> merge every row's chunks, in chunk order */
static void merge_task(void *ctx_, pa_ssize b, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_ssize es = (pa_ssize)pa_elsize(k->dtype);
    pa_attn_args a;
    attn_args(c, b, &a);
    const pa_ssize stride = k->L * (2 + k->Ev);
    const char *P = c->partials + (b * c->nchunks * stride) * es;
    for (pa_ssize i = 0; i < k->L; i++) pa_flash_merge(k->dtype, &a, i, P, c->nchunks, stride, c->ws[tid]);
}

/* The call's query blocks: the family's BQ rows, or fewer of equal height
 * (multiples of 16 rows): L = 128 with BQ = 96 gives 64 + 64, not 96 + 32,
 * so two threads share the work evenly. A row's arithmetic does not depend
 * on its block (the flash frame is row-independent: every family's own BQ
 * gives the same bits), so neither do the results. No scratch yet. */
static void attn_init(attn_ctx *c, const pa_family *fam, const pa_attn_call *call)
{
    const pa_ssize L = call->L;
    c->fam = fam;
    c->call = call;
    c->bq = fam->attn_bq[call->dtype];
    c->nblk = (L + c->bq - 1) / c->bq;
    const pa_ssize h = ((L + c->nblk - 1) / c->nblk + 15) / 16 * 16;
    if (h < c->bq && !call->block_mask) c->bq = h;   /* a block mask: blocks on its grid */
    /* Where every row costs the same (no causal rule, no window, no block
     * mask), a short last block (L = 512 with BQ = 96: 5 x 96 + 32) is a
     * small task: handed out last, the short blocks of all b fill the job's
     * end, and the threads finish within a short block of each other, not
     * a full one. Which rows a task holds is unchanged, so are the bits. */
    c->small_last = L % c->bq != 0 && c->nblk > 1 && (c->nblk - 1) * c->bq < L && call->causal == PA_CAUSAL_NONE && call->left < 0 &&
                    call->right < 0 && !call->block_mask;
    c->ws = NULL;
    c->kvp = NULL;
    c->kvp_tile = c->ntiles = 0;
    c->nchunks = 0;
    c->chunk = call->bf16 ? PA_BF16_SPLIT_CHUNK : PA_SPLIT_CHUNK;
    c->partials = NULL;
    c->sc = NULL;
    c->nreq = 1;
}

/* Decode shapes take the split mode: tasks over (b, key chunk), then the
 * merge (precision "bf16": the rows path's shapes, pa_bf16_rows_shape; its
 * scores by (b, key chunk), then per b the rest of the rows path on them) */
static int attn_splits(const attn_ctx *c)
{
    const pa_attn_call *k = c->call;
    if (k->has_w || k->S < PA_SPLIT_MINS || k->E > PA_FLASH_MAXD || k->Ev > PA_FLASH_MAXD) return 0;
    /* bf16: the split leaves the bits as they are (a scores pass); only
     * where there are few heads per thread is it worth its scratch */
    if (k->bf16) return pa_bf16_rows_shape(k->L, k->row_div, k->E, k->Ev) && k->bt.count < 4 * (pa_ssize)c->nreq;
    return k->L <= PA_SPLIT_MAXL || (k->row_div > 1 && k->L <= c->bq);
}

/* The call's task count in *ntasks, and the scratch its tasks share: the
 * chunks' partials (split mode), or K and V packed once for all the query
 * blocks (bfloat16 with several blocks). -1: a size overflows or memory is
 * short; what was allocated is in c for the caller to free. */
static int attn_scratch(attn_ctx *c, size_t *ntasks)
{
    const pa_attn_call *k = c->call;
    const size_t count = (size_t)k->bt.count;
    size_t n;
    if (!pa_mul_ok(count, (size_t)c->nblk, ntasks) || *ntasks > (size_t)PTRDIFF_MAX) return -1;
    if (attn_splits(c)) {
        c->nchunks = (k->S + c->chunk - 1) / c->chunk;
        if (!pa_mul_ok(count, (size_t)c->nchunks, ntasks) || *ntasks > (size_t)PTRDIFF_MAX) return -1;
        if (k->bf16) {                               /* the scores of every chunk */
            if (!pa_mul_ok(*ntasks, (size_t)k->L, &n) || !pa_mul_ok(n, (size_t)c->chunk, &n) ||
                !pa_mul_ok(n, sizeof(float), &n))
                return -1;
            c->sc = (float *)pa_alloc64(n);
            return c->sc ? 0 : -1;
        }
        if (!pa_mul_ok(*ntasks, (size_t)(k->L * (2 + k->Ev)), &n) || !pa_mul_ok(n, pa_elsize(k->dtype), &n))
            return -1;
        c->partials = (char *)pa_alloc64(n);
        return c->partials ? 0 : -1;
    }
    if (k->bf16 && c->nblk > 1 && k->S > 0 && !pa_bf16_rows_shape(k->L, k->row_div, k->E, k->Ev)) {
        c->kvp_tile = pa_bf16_kv_tile(c->fam, k->E, k->Ev);
        c->ntiles = (k->S + PA_FLASH_BK - 1) / PA_FLASH_BK;
        if (!pa_mul_ok(count, (size_t)c->ntiles, &n) || !pa_mul_ok(n, (size_t)c->kvp_tile, &n) ||
            !pa_mul_ok(n, sizeof(uint16_t), &n))
            return -1;
        c->kvp = (uint16_t *)pa_alloc64(n);
        return c->kvp ? 0 : -1;
    }
    return 0;
}

/* The parallel part: ntasks tasks on nt threads (c->ws holds their workspaces) */
static void attn_run(attn_ctx *c, size_t ntasks, int nt)
{
    const pa_ssize count = c->call->bt.count;
    if (c->sc) {
        pa_parallel_for((pa_ssize)ntasks, bf16_scores_task, c, nt);
        pa_parallel_for(count, bf16_finish_task, c, nt);
    } else if (c->nchunks) {
        pa_parallel_for((pa_ssize)ntasks, chunk_task, c, nt);
        pa_parallel_for(count, merge_task, c, nt);
    } else {
        if (c->kvp) pa_parallel_for(count * c->ntiles, kvpack_task, c, nt);
        pa_parallel_for((pa_ssize)ntasks, attn_task, c, nt);
    }
}

/* The backward's router: packed sequences to attn_varlen.c (which runs each
 * head's key-split through attn_backward.c's pa_bwd_head_chunked), the rest
 * to the dense backward -- so both drivers sit below this file, and neither
 * calls the other's router. */
int pa_attention_backward(const pa_family *fam, const pa_attn_call *call, const pa_attn_grads *g,
                          int nthreads)
{
    if (call->cu_seqlens_q) return pa_attention_varlen_backward(fam, call, g, nthreads);
    return pa_attention_backward_dense(fam, call, g, nthreads);
}

int pa_attention(const pa_family *fam, const pa_attn_call *call, int nthreads)
{
    if (call->cu_seqlens_q && call->block_table) return pa_attention_paged_packed(fam, call, nthreads);
    if (call->cu_seqlens_q) return pa_attention_varlen(fam, call, nthreads);
    if (call->bt.count == 0 || call->L == 0 || (call->Ev == 0 && !call->has_w && !call->has_lse)) {
        if (call->before) call->before(call->before_ctx);   /* nothing to allocate */
        return 0;
    }
    attn_ctx c;
    size_t ntasks, bytes;
    void *wsv[PA_MAX_THREADS];
    int nt = 0, ok = 0;
    attn_init(&c, fam, call);
    c.nreq = nthreads < 1 ? 1 : nthreads;
    if (attn_scratch(&c, &ntasks) != 0) goto fail;
    bytes = pa_flash_ws(fam, call->dtype, call->E, call->Ev);
    if (bytes == 0) goto fail;
    nt = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nt > ntasks) nt = (int)ntasks;
    ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (!ok) goto fail;
    c.ws = wsv;
    if (call->before) call->before(call->before_ctx);   /* everything is allocated */
    attn_run(&c, ntasks, nt);
fail:
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    pa_free64(c.partials);
    pa_free64(c.sc);
    pa_free64(c.kvp);
    return ok ? 0 : -1;
}
