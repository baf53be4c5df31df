/*
 * attn_args.c -- the pa_attn_args of one head of an attention call: below
 * both attention ops (attention.c, the forward; attn_backward.c, the
 * backward), which fill their heads' arguments here and run them through
 * the tiled frame (attn_flash.c) or the exact path (attention_ref.c).
 * Calls nothing.
 */
#include "attention.h"

void pa_attn_setup(pa_attn_args *out, const pa_family *fam, int dtype, const pa_batch *bt, pa_ssize b,
                   pa_ssize L, pa_ssize S, pa_ssize E, pa_ssize Ev,
                   const pa_operand *q, const pa_operand *k, const pa_operand *v,
                   const pa_operand *mask, int mask_kind, const pa_attn_opts *o, double scale,
                   double dropout_p, uint64_t key, const pa_operand *res, const pa_operand *w)
{
    const pa_ssize es = (pa_ssize)pa_elsize(dtype);
    pa_attn_args a;
    a.fam = fam;
    a.L = L; a.S = S; a.E = E; a.Ev = Ev;
    a.q = (const char *)q->p + pa_batch_offset(bt, q->bs, b) * (pa_ssize)pa_elsize(o->q_dt);
    a.q_rs = q->rs; a.q_cs = q->cs;
    a.k = (const char *)k->p + pa_batch_offset(bt, k->bs, b) * (pa_ssize)pa_elsize(o->k_dt);
    a.k_rs = k->rs; a.k_cs = k->cs;
    a.v = (const char *)v->p + pa_batch_offset(bt, v->bs, b) * (pa_ssize)pa_elsize(o->v_dt);
    a.v_rs = v->rs; a.v_cs = v->cs;
    a.q_dt = o->q_dt; a.k_dt = o->k_dt; a.v_dt = o->v_dt;
    a.mask = pa_mask_of(bt, mask, mask_kind, dtype, b);
    const pa_ssize n = o->kv_len ? (pa_ssize)o->kv_len[b] : S;
    a.rule.S = n;
    a.rule.div = o->row_div;
    a.rule.qoff = o->has_qoff ? o->qoff
                : (o->kv_len || o->causal == PA_CAUSAL_BOTTOM_RIGHT) ? n - L / o->row_div : 0;
    a.rule.causal = o->causal != PA_CAUSAL_NONE;
    a.rule.left = o->left;
    a.rule.right = o->right;
    a.softcap = o->softcap;
    a.slope = o->slopes ? o->slopes[b] : 0.0;
    a.has_sink = o->sinks != NULL;
    a.sink = o->sinks ? o->sinks[b] : 0.0;
    a.scale = scale;
    a.dropout_p = dropout_p;
    a.dropout_key = key;
    a.ctr_base = (uint64_t)b * (uint64_t)L * (uint64_t)S;
    if (res) {
        a.out = (char *)res->p + pa_batch_offset(bt, res->bs, b) * es;
        a.o_rs = res->rs; a.o_cs = res->cs;
    } else {
        a.out = NULL; a.o_rs = a.o_cs = 0;
    }
    if (w) {
        a.w = (char *)w->p + pa_batch_offset(bt, w->bs, b) * es;
        a.w_rs = w->rs; a.w_cs = w->cs;
    } else {
        a.w = NULL; a.w_rs = a.w_cs = 0;
    }
    if (o->lse) {
        a.lse = (char *)o->lse->p + pa_batch_offset(bt, o->lse->bs, b) * es;
        a.lse_s = o->lse->cs;
    } else {
        a.lse = NULL; a.lse_s = 0;
    }
    a.key_begin = 0;
    a.key_end = S;
    a.partial = NULL;
    a.bf16 = o->bf16;
    a.kvp = NULL;
    a.kvp_tile = 0;
    *out = a;
}
