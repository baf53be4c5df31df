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
 */
#include "ops.h"
#include "attention.h"
#include "threads.h"

typedef struct {
    const pa_family *fam;   /* the call's kernels, fixed for the whole call */
    int dtype;
    pa_ssize bq;            /* query rows per task (at most the family's attn_bq) */
    const pa_batch *bt;
    pa_ssize L, S, E, Ev, nblk;
    const pa_operand *q, *k, *v, *mask, *out, *w;
    int mask_kind;
    const pa_attn_opts *opts;
    double scale, dropout_p;
    uint64_t key;
    void **ws;
    uint16_t *kvp;           /* bf16 with several query blocks: K, V packed per b, */
    pa_ssize kvp_tile, ntiles; /* ntiles tiles of kvp_tile elements each */
    pa_ssize nchunks;        /* key chunks per head (split mode), else 0 */
    char *partials;          /* (count, nchunks, L, 2 + Ev) in split mode */
} attn_ctx;

static void attn_args(const attn_ctx *c, pa_ssize b, pa_attn_args *out)
{
    pa_attn_setup(out, c->fam, c->dtype, c->bt, b, c->L, c->S, c->E, c->Ev, c->q, c->k, c->v,
                  c->mask, c->mask_kind, c->opts, c->scale, c->dropout_p, c->key, c->out, c->w);
}

static void attn_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_ssize b = t / c->nblk;
    const pa_ssize blk = c->nblk - 1 - t % c->nblk;
    const pa_ssize i0 = blk * c->bq;
    const pa_ssize i1 = pa_min(i0 + c->bq, c->L);
    pa_attn_args a;
    attn_args(c, b, &a);
    if (c->kvp) {
        a.kvp = c->kvp + (size_t)(b * c->ntiles) * (size_t)c->kvp_tile;
        a.kvp_tile = c->kvp_tile;
    }
    pa_flash_run(c->fam, c->dtype, &a, i0, i1, c->ws[tid]);
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
    const pa_ssize nj = pa_min(c->S - j0, PA_FLASH_BK);
    uint16_t *Kp = c->kvp + (size_t)t * (size_t)c->kvp_tile;
    const pa_ssize mr = c->fam->gemm_bf16.mr;
    const pa_ssize e2 = pa_round_up(c->E > 0 ? c->E : 1, 2);
    pa_bf16_pack_kv(c->fam, &a, j0, nj, Kp, Kp + pa_round_up(PA_FLASH_BK, mr) * e2);
    (void)tid;
}

/* split mode, pass 1: (b, key chunk) -> partial (m, l, O) of every row */
static void chunk_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_ssize es = (pa_ssize)pa_elsize(c->dtype);
    const pa_ssize b = t / c->nchunks, ch = t % c->nchunks;
    pa_attn_args a;
    attn_args(c, b, &a);
    a.key_begin = ch * PA_SPLIT_CHUNK;
    a.key_end = pa_min(a.key_begin + PA_SPLIT_CHUNK, c->S);
    a.partial = c->partials + (t * c->L * (2 + c->Ev)) * es;
    pa_flash_run(c->fam, c->dtype, &a, 0, c->L, c->ws[tid]);
}

/* split mode, pass 2: b -> merge every row's chunks, in chunk order */
static void merge_task(void *ctx_, pa_ssize b, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_ssize es = (pa_ssize)pa_elsize(c->dtype);
    pa_attn_args a;
    attn_args(c, b, &a);
    const pa_ssize stride = c->L * (2 + c->Ev);
    const char *P = c->partials + (b * c->nchunks * stride) * es;
    for (pa_ssize i = 0; i < c->L; i++) pa_flash_merge(c->dtype, &a, i, P, c->nchunks, stride, c->ws[tid]);
}

int pa_attention(const pa_family *fam, int dtype, const pa_batch *bt, pa_ssize L, pa_ssize S, pa_ssize E, pa_ssize Ev,
                 const pa_operand *q, const pa_operand *k, const pa_operand *v,
                 const pa_operand *mask, int mask_kind, const pa_attn_opts *opts, double scale,
                 double dropout_p, uint64_t dropout_key,
                 const pa_operand *out, const pa_operand *w, int nthreads)
{
    if (bt->count == 0 || L == 0 || (Ev == 0 && w == NULL && opts->lse == NULL)) {
        if (opts->before) opts->before(opts->before_ctx);
        return 0;
    }
    attn_ctx c;
    c.fam = fam;
    c.dtype = dtype; c.bt = bt; c.L = L; c.S = S; c.E = E; c.Ev = Ev;
    c.q = q; c.k = k; c.v = v; c.mask = mask; c.out = out; c.w = w;
    c.mask_kind = mask_kind; c.opts = opts; c.scale = scale;
    c.dropout_p = dropout_p; c.key = dropout_key;
    c.bq = fam->attn_bq[dtype];
    c.nblk = (L + c.bq - 1) / c.bq;
    {   /* blocks of equal height (multiples of 16 rows, never above the
         * family's): L = 128 with BQ = 96 gives 64 + 64, not 96 + 32, so two
         * threads share the work evenly. A row's arithmetic does not depend
         * on its block (the flash frame is row-independent: every family's
         * own BQ gives the same bits), so neither do the results. */
        const pa_ssize h = ((L + c.nblk - 1) / c.nblk + 15) / 16 * 16;
        if (h < c.bq) c.bq = h;
    }
    c.nchunks = 0;
    c.partials = NULL;
    c.kvp = NULL;
    c.kvp_tile = c.ntiles = 0;
    size_t ntasks;
    if (!pa_mul_ok((size_t)bt->count, (size_t)c.nblk, &ntasks) || ntasks > (size_t)PTRDIFF_MAX)
        return -1;
    if (w == NULL && !opts->bf16 && (L <= PA_SPLIT_MAXL || (opts->row_div > 1 && L <= c.bq)) && S >= PA_SPLIT_MINS &&
        E <= PA_FLASH_MAXD && Ev <= PA_FLASH_MAXD) {
        size_t n, bytes;
        c.nchunks = (S + PA_SPLIT_CHUNK - 1) / PA_SPLIT_CHUNK;
        if (!pa_mul_ok((size_t)bt->count, (size_t)c.nchunks, &ntasks) ||
            !pa_mul_ok(ntasks, (size_t)(L * (2 + Ev)), &n) ||
            !pa_mul_ok(n, pa_elsize(dtype), &bytes) ||
            ntasks > (size_t)PTRDIFF_MAX)
            return -1;
        c.partials = (char *)pa_alloc64(bytes);
        if (!c.partials) return -1;
    }
    if (opts->bf16 && c.nblk > 1 && S > 0) {   /* K, V packed once, shared by the query blocks */
        size_t n;
        c.kvp_tile = pa_bf16_kv_tile(fam, E, Ev);
        c.ntiles = (S + PA_FLASH_BK - 1) / PA_FLASH_BK;
        if (!pa_mul_ok((size_t)bt->count, (size_t)c.ntiles, &n) || !pa_mul_ok(n, (size_t)c.kvp_tile, &n) ||
            !pa_mul_ok(n, sizeof(uint16_t), &n))
            return -1;
        c.kvp = (uint16_t *)pa_alloc64(n);
        if (!c.kvp) return -1;
    }
    const size_t bytes = pa_flash_ws(fam, dtype, E, Ev);
    if (bytes == 0) { pa_free64(c.partials); pa_free64(c.kvp); return -1; }
    int nt = nthreads < 1 ? 1 : nthreads;
    if ((size_t)nt > ntasks) nt = (int)ntasks;
    void *wsv[PA_MAX_THREADS];
    int ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (ok) {
        c.ws = wsv;
        if (opts->before) opts->before(opts->before_ctx);   /* everything is allocated */
        if (c.nchunks) {
            pa_parallel_for((pa_ssize)ntasks, chunk_task, &c, nt);
            pa_parallel_for(bt->count, merge_task, &c, nt);
        } else {
            if (c.kvp) pa_parallel_for(bt->count * c.ntiles, kvpack_task, &c, nt);
            pa_parallel_for((pa_ssize)ntasks, attn_task, &c, nt);
        }
    }
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    pa_free64(c.partials);
    pa_free64(c.kvp);
    return ok ? 0 : -1;
}
