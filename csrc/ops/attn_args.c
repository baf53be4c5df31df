/*
 * attn_args.c -- the pa_attn_args of one head of an attention call: below
 * both attention ops (attention.c, the forward; attn_backward.c, the
 * backward), which fill their heads' arguments here and run them through
 * the tiled frame (attn_flash.c) or the exact path (attention_ref.c).
 * Calls nothing. One head's arguments come from the call's one
 * description, pa_attn_call (ops.h).
 */
#include "attention.h"

#include <string.h>

/* element pointer of flat batch index b in operand o (elements of es bytes) */
static const char *at(const pa_attn_call *c, const pa_operand *o, pa_ssize b, int dt)
{
    return (const char *)o->p + pa_batch_offset(&c->bt, o->bs, b) * (pa_ssize)pa_elsize(dt);
}

/* the element offset, in operand o (a contiguous cache's k, v or scales),
 * of flat b's first key row from where its batch offset puts it: the
 * sequence's cache entry (pa_cache's idx) and its left pad (pad rows) */
static pa_ssize kv_shift(const pa_attn_call *c, const pa_operand *o, pa_ssize b, pa_ssize pad)
{
    const pa_cache *cc = c->cache;
    if (!cc || !cc->idx) return pad * o->rs;
    const pa_ssize s = b / cc->per_seq;
    return pad * o->rs + ((pa_ssize)cc->idx[s] - s) * o->bs[0];
}

/* flat batch index b's view of the call's KV cache (ops.h, pa_cache): its
 * block table row, the pools' strides, its scales (from its first key
 * row: kv_shift); a call without one: the rows of k and v as their strides
 * give them */
static void kv_head(pa_kv_head *h, const pa_attn_call *c, pa_ssize b, pa_ssize pad)
{
    const pa_cache *cc = c->cache;
    memset(h, 0, sizeof *h);
    h->rs[PA_KV_K] = c->k.rs;
    h->rs[PA_KV_V] = c->v.rs;
    h->kG = h->vG = 1;
    if (!cc) return;
    if (cc->table) {                                /* paged: rows through the table */
        h->bt = pa_cache_table_row(c, b);
        h->bsz = cc->block_size;
        h->blk[PA_KV_K] = cc->k_blk; h->blk[PA_KV_V] = cc->v_blk;
        h->blk[PA_KV_KS] = cc->ks_blk; h->blk[PA_KV_VS] = cc->vs_blk;
        h->rs[PA_KV_K] = cc->k_rs; h->rs[PA_KV_V] = cc->v_rs;
    }
    h->ks = cc->ks.p ? (const float *)cc->ks.p + pa_batch_offset(&c->bt, cc->ks.bs, b) + kv_shift(c, &cc->ks, b, pad)
                     : NULL;
    h->vs = cc->vs.p ? (const float *)cc->vs.p + pa_batch_offset(&c->bt, cc->vs.bs, b) + kv_shift(c, &cc->vs, b, pad)
                     : NULL;
    h->rs[PA_KV_KS] = cc->ks.rs;
    h->rs[PA_KV_VS] = cc->vs.rs;
    h->kG = cc->kG;
    h->vG = cc->vG;
}

void pa_attn_setup(pa_attn_args *out, const pa_family *fam, const pa_attn_call *c, pa_ssize b)
{
    /* a left-padded sequence's keys from row pad on: its S, kv_len and
     * positions count from there, as on the view k[pad:] */
    const pa_ssize pad = c->cache && c->cache->pad ? (pa_ssize)c->cache->pad[b / c->cache->per_seq] : 0;
    const pa_ssize L = c->L, S = c->S - pad;
    pa_attn_args a;
    a.fam = (c->q8 || c->qbf16) && fam->isa == PA_ISA_GENERIC ? &pa_family_generic_vecbits : fam;   /* softcap */
    a.L = L; a.S = S; a.E = c->E; a.Ev = c->Ev;
    a.q = at(c, &c->q, b, c->q_dt);
    a.q_rs = c->q.rs; a.q_cs = c->q.cs;
    a.k = at(c, &c->k, b, c->k_dt) + kv_shift(c, &c->k, b, pad) * (pa_ssize)pa_elsize(c->k_dt);
    a.k_rs = c->k.rs; a.k_cs = c->k.cs;
    a.v = at(c, &c->v, b, c->v_dt) + kv_shift(c, &c->v, b, pad) * (pa_ssize)pa_elsize(c->v_dt);
    a.v_rs = c->v.rs; a.v_cs = c->v.cs;
    a.q_dt = c->q_dt; a.k_dt = c->k_dt; a.v_dt = c->v_dt;
    a.mask = pa_mask_of(&c->bt, &c->mask, c->mask_kind, c->dtype, b);
    const pa_ssize n = c->kv_len ? (pa_ssize)c->kv_len[b] - pad : S;
    a.rule.S = n;
    a.rule.div = c->row_div;
    a.rule.qoff = c->has_qoff ? c->qoff
                : (c->kv_len || c->causal == PA_CAUSAL_BOTTOM_RIGHT) ? n - L / c->row_div : 0;
    a.rule.causal = c->causal != PA_CAUSAL_NONE;
    a.rule.left = c->left;
    a.rule.right = c->right;
    a.softcap = c->softcap;
    a.slope = c->slopes ? c->slopes[b] : 0.0;
    a.has_sink = c->sinks != NULL;
    a.sink = c->sinks ? c->sinks[b] : 0.0;
    a.scale = c->scale;
    a.dropout_p = c->dropout_p;
    a.dropout_key = c->dropout_key;
    a.ctr_base = (uint64_t)b * (uint64_t)L * (uint64_t)c->S;
    a.out = (void *)at(c, &c->out, b, c->dtype);
    a.o_rs = c->out.rs; a.o_cs = c->out.cs;
    if (c->has_w) {
        a.w = (void *)at(c, &c->w, b, c->dtype);
        a.w_rs = c->w.rs; a.w_cs = c->w.cs;
    } else {
        a.w = NULL; a.w_rs = a.w_cs = 0;
    }
    if (c->has_lse) {
        a.lse = (void *)at(c, &c->lse, b, c->dtype);
        a.lse_s = c->lse.cs;
    } else {
        a.lse = NULL; a.lse_s = 0;
    }
    a.key_begin = 0;
    a.key_end = S;
    a.partial = NULL;
    a.bf16 = c->bf16;
    a.q8 = c->q8;
    a.qbf16 = c->qbf16;
    a.kvp = NULL;
    a.kvp_tile = 0;
    kv_head(&a.kv, c, b, pad);
    a.k_rs = a.kv.rs[PA_KV_K]; a.v_rs = a.kv.rs[PA_KV_V];
    a.bm.state = NULL;
    if (c->block_mask) {
        const pa_bmask *m = c->block_mask;
        const pa_ssize x = (pa_ssize)m->slab[b] * m->nqt * m->nkt;
        a.bm.state = m->state + x;
        a.bm.index = m->index + x;
        a.bm.bits = m->bits;
        a.bm.L = m->L; a.bm.S = m->S; a.bm.nqt = m->nqt; a.bm.nkt = m->nkt;
        a.bm.qoff = (c->kv_len ? a.rule.qoff : 0) + m->q_extra;
        a.bm.koff = m->k_extra;
        a.bm.div = c->row_div;
    }
    *out = a;
}
