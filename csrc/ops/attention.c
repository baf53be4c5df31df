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
 * Decode shapes (L <= PA_SPLIT_MAXL queries, or a GQA group of any size
 * stacked as rows; S >= PA_SPLIT_MINS keys) have too
 * few query blocks to keep the threads busy: there a task is (b, chunk of
 * PA_SPLIT_CHUNK keys), each leaves its running max, sum and unnormalised
 * output, and a second pass merges the chunks of each row in chunk order.
 * The chunking depends on the shape only, so results stay bit-identical
 * whatever the thread count (they differ in the last bits from the same
 * rows computed among more than PA_SPLIT_MAXL queries).
 * Over a paged pool the chunks of heads whose keys there are the same rows
 * of the same blocks (forks of a sequence: a shared prompt) are one task,
 * each key read once for all of them (shared-prefix or cascade reads:
 * attn_cascade, pa_flash_shared): a row's arithmetic stays its own, so are
 * the bits -- the chunks lie on key positions, whoever shares them.
 * Precision "bf16" on decode shapes (pa_bf16_rows_shape) splits only the
 * scores: tasks (b, chunk of PA_BF16_SPLIT_CHUNK keys, on the key tiles'
 * grid) leave them in a scratch, then a task per b runs the rest of the
 * rows path over them in key order -- the bits of the unsplit call.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "ops.h"
#include "attention.h"
#include "threads.h"

/* query rows of one shared task (its workspace: pa_flash_shared_ws) */
#define PA_CASCADE_MAXR 128

/* blocks read once for several heads' queries, and the reads that saved
 * (per key/value head and block), since the module was loaded */
static atomic_ullong cascade_blocks, cascade_saved;

void pa_cascade_stats(unsigned long long *blocks, unsigned long long *saved)
{
    *blocks = atomic_load(&cascade_blocks);
    *saved = atomic_load(&cascade_saved);
}

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
    /* split mode over a paged pool (attn_cascade): task g is chunk gch[g] of
     * the heads gmem[goff[g], goff[g + 1]) (flat b); NULL: task (b, chunk) */
    pa_ssize *goff, *gmem, *gch, *gend;   /* gend: the end of the keys read once */
    pa_ssize gmax;           /* the most heads of a task */
    size_t gws;              /* its rows' workspace (pa_flash_shared_ws), then gmax args */
    unsigned long long nblocks, nsaved;   /* for cascade_blocks, cascade_saved */
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
    const pa_ssize nj = pa_min(a.S - j0, PA_FLASH_BK);       /* the head's S (a left pad's: less) */
    if (nj <= 0) return;                                      /* past its keys: never read */
    uint16_t *Kp = c->kvp + (size_t)t * (size_t)c->kvp_tile;
    const pa_ssize mr = c->fam->gemm_bf16.mr;
    const pa_ssize e2 = pa_round_up(c->call->E > 0 ? c->call->E : 1, 2);
    pa_bf16_pack_kv(c->fam, &a, j0, nj, Kp, Kp + pa_round_up(PA_FLASH_BK, mr) * e2);
    (void)tid;
}

/* split mode, pass 1: (b, key chunk) -> partial (m, l, O) of every row
 * (task (b, chunk), or with attn_cascade's groups chunk gch[t] of their
 * heads: one head's run, or pa_flash_shared for several) */
static void chunk_task(void *ctx_, pa_ssize t, int tid)
{
    const attn_ctx *c = (const attn_ctx *)ctx_;
    const pa_attn_call *k = c->call;
    const pa_ssize es = (pa_ssize)pa_elsize(k->dtype), stride = k->L * (2 + k->Ev);
    pa_ssize b = t / c->nchunks, ch = t % c->nchunks, n = 1;
    if (c->goff) {
        b = c->gmem[c->goff[t]];
        ch = c->gch[t];
        n = c->goff[t + 1] - c->goff[t];
    }
    if (n == 1) {
        pa_attn_args a;
        attn_args(c, b, &a);
        a.key_begin = ch * c->chunk;
        a.key_end = pa_max(a.key_begin, pa_min(a.key_begin + c->chunk, a.S));   /* the head's S */
        a.partial = c->partials + ((b * c->nchunks + ch) * stride) * es;
        pa_flash_run(c->fam, k->dtype, &a, 0, k->L, c->ws[tid]);
        return;
    }
    pa_attn_args *as = (pa_attn_args *)((char *)c->ws[tid] + c->gws);
    const pa_attn_args **grp = (const pa_attn_args **)(as + c->gmax);
    for (pa_ssize m = 0; m < n; m++) {
        b = c->gmem[c->goff[t] + m];
        attn_args(c, b, as + m);
        as[m].key_begin = ch * c->chunk;
        as[m].key_end = pa_max(as[m].key_begin, pa_min(as[m].key_begin + c->chunk, as[m].S));
        as[m].partial = c->partials + ((b * c->nchunks + ch) * stride) * es;
        grp[m] = as + m;
    }
    pa_flash_shared(c->fam, k->dtype, grp, n, c->gend[t], c->ws[tid]);
}

/* ---- shared-prefix (cascade) reads: which heads read the same rows in a
 * chunk. Per flat b, what decides it: the key/value head's pools (and
 * scales), the block table row, the filled keys. */
typedef struct {
    const void *k, *v;
    const float *ks, *vs;
    const int64_t *bt;
    pa_ssize n;              /* filled keys */
} casc_head;
typedef struct {
    uint64_t h;
    pa_ssize b;
} casc_key;

static int casc_cmp(const void *x_, const void *y_)
{
    const casc_key *x = (const casc_key *)x_, *y = (const casc_key *)y_;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return x->b < y->b ? -1 : x->b > y->b;
}

static uint64_t casc_mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xbf58476d1ce4e5b9ull;
}

/* heads x and y start chunk [k0, ...) on the same block of the same pools */
static int casc_same(const casc_head *x, const casc_head *y, pa_ssize k0, pa_ssize bsz)
{
    return x->k == y->k && x->v == y->v && x->ks == y->ks && x->vs == y->vs && x->bt[k0 / bsz] == y->bt[k0 / bsz];
}

/* the end of the keys from k0 (< e) that heads x and y read from the same
 * blocks, within both's filled keys up to e */
static pa_ssize casc_common(const casc_head *x, const casc_head *y, pa_ssize k0, pa_ssize e, pa_ssize bsz)
{
    const pa_ssize end = pa_min(e, pa_min(x->n, y->n));
    pa_ssize i = k0 / bsz;
    while (i * bsz < end && x->bt[i] == y->bt[i]) i++;
    return pa_min(end, i * bsz);
}

/* The cascade's plan being built: the heads and their sort keys, the
 * chunk at hand (ch: keys from k0 to at most k1) and the tasks so far
 * (ng groups in c->goff, c->gch, c->gend; nm members in c->gmem) */
typedef struct {
    attn_ctx *c;
    const casc_head *hd;
    casc_key *ky;
    pa_ssize bsz;            /* the pools' block size */
    pa_ssize ch, k0, k1;
    pa_ssize ng, nm;
} casc_plan;

/* a task of chunk p->ch from its keys k0 up to end (k0: every key of the
 * chunk alone; more: a group's shared tiles first), its members added next */
static void casc_task(casc_plan *p, pa_ssize end)
{
    attn_ctx *c = p->c;
    c->goff[p->ng] = p->nm; c->gch[p->ng] = p->ch; c->gend[p->ng++] = end;
}

/* One task for heads ky[i0, i1) of the chunk if they share whole key
 * tiles, else a task each */
static void casc_emit(casc_plan *p, pa_ssize i0, pa_ssize i1)
{
    attn_ctx *c = p->c;
    const casc_key *ky = p->ky;
    const pa_ssize k0 = p->k0, bsz = p->bsz;
    pa_ssize end = p->k1;
    for (pa_ssize i = i0 + 1; i < i1; i++)
        end = pa_min(end, casc_common(p->hd + ky[i0].b, p->hd + ky[i].b, k0, end, bsz));
    const pa_ssize ksh = k0 + (end - k0) / PA_FLASH_BK * PA_FLASH_BK;
    if (i1 - i0 < 2 || ksh <= k0) {
        for (pa_ssize i = i0; i < i1; i++) {
            casc_task(p, k0);
            c->gmem[p->nm++] = ky[i].b;
        }
        return;
    }
    casc_task(p, ksh);
    for (pa_ssize i = i0; i < i1; i++) c->gmem[p->nm++] = ky[i].b;
    const unsigned long long nb = (unsigned long long)((ksh - 1) / bsz - k0 / bsz + 1);
    c->nblocks += nb;
    c->nsaved += nb * (unsigned long long)(i1 - i0 - 1);
}

/* chunk p->ch's tasks: a head with no key there a task of its own; the
 * others sorted by their start (pools, scales, first block), and each run of
 * heads that start it on the same block (casc_same) in groups of at most
 * gmax, in order of b (casc_emit) */
static void casc_chunk(casc_plan *p)
{
    attn_ctx *c = p->c;
    const casc_head *hd = p->hd;
    casc_key *ky = p->ky;
    const pa_ssize k0 = p->k0, bsz = p->bsz, count = c->call->bt.count;
    pa_ssize nk = 0;
    for (pa_ssize b = 0; b < count; b++) {
        if (hd[b].n <= k0) {                     /* no key of b here: a task of its own */
            casc_task(p, k0);
            c->gmem[p->nm++] = b;
            continue;
        }
        uint64_t h = casc_mix(casc_mix((uint64_t)(uintptr_t)hd[b].k, (uint64_t)(uintptr_t)hd[b].v),
                              (uint64_t)(uintptr_t)hd[b].ks);
        h = casc_mix(casc_mix(h, (uint64_t)(uintptr_t)hd[b].vs), (uint64_t)hd[b].bt[k0 / bsz]);
        ky[nk].h = h;
        ky[nk++].b = b;
    }
    qsort(ky, (size_t)nk, sizeof(casc_key), casc_cmp);
    for (pa_ssize r0 = 0, r1; r0 < nk; r0 = r1) {  /* runs of one hash: almost always one */
        const uint64_t h = ky[r0].h;
        for (r1 = r0 + 1; r1 < nk && ky[r1].h == h; r1++) {}
        for (pa_ssize i = r0; i < r1; i++) {      /* the groups in it, in order of b */
            pa_ssize n = 1;
            for (pa_ssize j = i + 1; j < r1; j++) /* move i's group next to it */
                if (casc_same(hd + ky[i].b, hd + ky[j].b, k0, bsz)) {
                    const casc_key t = ky[j];
                    memmove(ky + i + n + 1, ky + i + n, (size_t)(j - i - n) * sizeof(casc_key));
                    ky[i + n++] = t;
                }
            for (pa_ssize g = i; g < i + n; g += c->gmax) casc_emit(p, g, pa_min(g + c->gmax, i + n));
            i += n - 1;                          /* the rest: not i's group */
        }
    }
}

/* The split's tasks over a paged pool: per chunk, heads that start it on
 * the same block of the same pools (casc_same), in groups of at most gmax
 * (in order of b) that read their common key tiles once (casc_emit); the
 * others a task each. Decided by the tables and lengths only, never by the
 * threads. Leaves c->goff etc. NULL where nothing is shared, or memory is
 * short: the plain tasks then (the same bits). */
static void attn_cascade(attn_ctx *c, size_t *ntasks)
{
    const pa_attn_call *k = c->call;
    const pa_ssize count = k->bt.count, L = k->L, nch = c->nchunks;
    if (!pa_call_paged(k) || k->bf16 || k->dropout_p > 0 || k->block_mask || count < 2 || 2 * L > PA_CASCADE_MAXR)
        return;
    size_t tot;
    if (!pa_mul_ok((size_t)count, (size_t)nch, &tot) || tot > (size_t)PTRDIFF_MAX / 8) return;
    casc_head *hd = (casc_head *)malloc((size_t)count * sizeof(casc_head));
    casc_key *ky = (casc_key *)malloc((size_t)count * sizeof(casc_key));
    c->goff = (pa_ssize *)malloc((tot + 1) * sizeof(pa_ssize));
    c->gmem = (pa_ssize *)malloc(tot * sizeof(pa_ssize));
    c->gch = (pa_ssize *)malloc(tot * sizeof(pa_ssize));
    c->gend = (pa_ssize *)malloc(tot * sizeof(pa_ssize));
    casc_plan p = {c, hd, ky, k->cache->block_size, 0, 0, 0, 0, 0};
    c->gmax = PA_CASCADE_MAXR / L;
    if (!hd || !ky || !c->goff || !c->gmem || !c->gch || !c->gend) goto fail;
    for (pa_ssize b = 0; b < count; b++) {
        pa_attn_args a;
        attn_args(c, b, &a);
        hd[b].k = a.k; hd[b].v = a.v; hd[b].ks = a.kv.ks; hd[b].vs = a.kv.vs;
        hd[b].bt = a.kv.bt;
        hd[b].n = pa_min(a.rule.S, k->S);
    }
    for (p.ch = 0; p.ch < nch; p.ch++) {
        p.k0 = p.ch * c->chunk;
        p.k1 = pa_min(p.k0 + c->chunk, k->S);
        casc_chunk(&p);
    }
    c->goff[p.ng] = p.nm;
    if (c->nblocks == 0) goto fail;
    *ntasks = (size_t)p.ng;
    free(hd); free(ky);
    return;
fail:
    free(c->goff); free(c->gmem); free(c->gch); free(c->gend);
    c->goff = c->gmem = c->gch = c->gend = NULL;
    c->nblocks = c->nsaved = 0;
    free(hd); free(ky);
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
    a.key_end = pa_max(a.key_begin, pa_min(a.key_begin + c->chunk, a.S));
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
    c->goff = c->gmem = c->gch = c->gend = NULL;
    c->gmax = 0;
    c->gws = 0;
    c->nblocks = c->nsaved = 0;
}

/* Decode shapes take the split mode: tasks over (b, key chunk), then the
 * merge (precision "bf16": the rows path's shapes, pa_bf16_rows_shape; its
 * scores by (b, key chunk), then per b the rest of the rows path on them) */
static int attn_splits(const attn_ctx *c)
{
    const pa_attn_call *k = c->call;
    if (k->has_w || k->S < PA_SPLIT_MINS || !pa_rows_dims(k->E, k->Ev)) return 0;
    /* bf16: the split leaves the bits as they are (a scores pass); only
     * where there are few heads per thread is it worth its scratch */
    if (k->bf16) return pa_bf16_rows_shape(k->L, k->row_div, k->E, k->Ev) && k->bt.count < 4 * (pa_ssize)c->nreq;
    return k->L <= PA_SPLIT_MAXL || k->row_div > 1;   /* (a GQA group's rows: pa_flash_run blocks them) */
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
        if (!c->partials) return -1;
        attn_cascade(c, ntasks);
        return 0;
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
    if (call->cu_seqlens_q && pa_call_paged(call)) return pa_attention_paged_packed(fam, call, nthreads);
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
    if (c.goff) {                /* shared tasks: their rows, then gmax args and pointers */
        const size_t rows = pa_flash_shared_ws(fam, call->dtype, call->E, call->Ev, c.gmax * call->L);
        if (rows == 0) goto fail;
        c.gws = pa_round_up((pa_ssize)rows, 64);
        const size_t need = c.gws + (size_t)c.gmax * (sizeof(pa_attn_args) + sizeof(void *));
        if (need > bytes) bytes = need;
    }
    nt = nthreads < 1 ? 1 : nthreads;
    {   /* the most tasks a pass has: a split call's merge has count (shared tasks may be fewer) */
        const size_t most = c.nchunks && (size_t)call->bt.count > ntasks ? (size_t)call->bt.count : ntasks;
        if ((size_t)nt > most) nt = (int)most;
    }
    ok = 1;
    for (int i = 0; i < nt; i++) { wsv[i] = pa_alloc64(bytes); ok &= wsv[i] != NULL; }
    if (!ok) goto fail;
    c.ws = wsv;
    if (call->before) call->before(call->before_ctx);   /* everything is allocated */
    attn_run(&c, ntasks, nt);
    if (c.goff && !pa_stopping(pa_stop_get())) {
        atomic_fetch_add(&cascade_blocks, c.nblocks);
        atomic_fetch_add(&cascade_saved, c.nsaved);
    }
fail:
    for (int i = 0; i < nt; i++) pa_free64(wsv[i]);
    pa_free64(c.partials);
    pa_free64(c.sc);
    pa_free64(c.kvp);
    free(c.goff); free(c.gmem); free(c.gch); free(c.gend);
    return ok ? 0 : -1;
}
