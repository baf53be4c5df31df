/*
 * bind_call.c -- the converter of an attention call (bind_call.h).
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim.
 */
#include "bind_call.h"
#include "bind_append.h"
#include "bind_quant.h"

#include <math.h>
#include <string.h>

/* A window side as the frame takes it: negative (unbounded) -> -1, and a
 * side at least S + L + |qoff| wide, which reaches past every key from every
 * row's position (within [-L, S] without qoff, [qoff, qoff + L) with it),
 * -1 as well: the ends of the key ranges then never overflow. */
static pa_ssize window_side(Py_ssize_t w, pa_ssize S, pa_ssize L, pa_ssize qoff)
{
    if (w < 0) return -1;
    const pa_ssize bound = pa_add_sat(pa_add_sat(S, L), qoff < 0 ? -qoff : qoff);
    return (pa_ssize)w >= bound ? -1 : (pa_ssize)w;
}

void pa_call_args_init(pa_call_args *a, int allow)
{
    memset(a, 0, sizeof *a);
    a->mask = a->slopes = a->sinks = a->kv_len = a->qoff = a->k_scale = a->v_scale = Py_None;
    a->allow = allow;
    a->scale = 1.0;
    a->left = a->right = -1;
    a->row_div = 1;
    a->cuq = a->cuk = a->leftpad = a->batch_idx = Py_None;
}

/* One of a varlen call's offsets: a 1-D contiguous, aligned int64 array of
 * nseq + 1 entries, 0 first, non-decreasing, total last. */
static int get_cu1(PyObject *o, const char *name, pa_ssize total, const int64_t **cu, pa_ssize *n)
{
    PyArrayObject *a = (PyArrayObject *)o;
    if (!PyArray_Check(o) || PyArray_TYPE(a) != NPY_INT64 || PyArray_NDIM(a) != 1 ||
        !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a) ||
        PyArray_DIMS(a)[0] < 1) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D contiguous, aligned int64 array of at least 1 entry",
                     name);
        return -1;
    }
    const int64_t *c = (const int64_t *)PyArray_DATA(a);
    const pa_ssize m = (pa_ssize)PyArray_DIMS(a)[0];
    for (pa_ssize i = 0; i < m; i++) {
        const int64_t lo = i == 0 ? 0 : c[i - 1];
        if ((i == 0 && c[0] != 0) || c[i] < lo || c[i] > (int64_t)total || (i == m - 1 && c[i] != (int64_t)total)) {
            PyErr_Format(PyExc_ValueError, "%s is not 0, non-decreasing, ..., %zd: bad entry at position %zd (%lld)",
                         name, (Py_ssize_t)total, (Py_ssize_t)i, (long long)c[i]);
            return -1;
        }
    }
    *cu = c;
    *n = m - 1;
    return 0;
}

/* A varlen call's offsets (both or neither), and what they exclude. */
static int get_cu(const pa_call_args *a, pa_attn_call *c)
{
    if (a->cuq == Py_None && a->cuk == Py_None) {
        if (a->seq_align) {
            PyErr_SetString(PyExc_ValueError, "seq_align needs cu_seqlens_q and cu_seqlens_k");
            return -1;
        }
        return 0;
    }
    pa_ssize nq, nk;
    if (a->paged) {             /* packed queries on a paged cache: kv_len per (sequence, head) */
        if (a->cuk != Py_None || a->kv_len == Py_None || a->mask != Py_None || a->want_w || a->qoff != Py_None ||
            a->dropout_p > 0) {
            PyErr_SetString(PyExc_ValueError, "paged with cu_seqlens_q: give kv_len, no cu_seqlens_k, mask, "
                            "weights, qoff or dropout");
            return -1;
        }
        if (get_cu1(a->cuq, "cu_seqlens_q", c->L, &c->cu_seqlens_q, &nq) < 0) return -1;
        if (a->row_div > 1 && (c->bt.nb != 2 || c->bt.shape[1] != (pa_ssize)a->row_div || a->slopes != Py_None ||
                               a->sinks != Py_None)) {
            PyErr_SetString(PyExc_ValueError, "paged with cu_seqlens_q: row_div > 1 needs batch axes (Hkv, "
                            "row_div) and no slopes or sinks");
            return -1;
        }
        c->nseq = nq;
        return 0;
    }
    if (a->cuq == Py_None || a->cuk == Py_None) {
        PyErr_SetString(PyExc_ValueError, "give both cu_seqlens_q and cu_seqlens_k, or neither");
        return -1;
    }
    if (get_cu1(a->cuq, "cu_seqlens_q", c->L, &c->cu_seqlens_q, &nq) < 0 ||
        get_cu1(a->cuk, "cu_seqlens_k", c->S, &c->cu_seqlens_k, &nk) < 0)
        return -1;
    if (nq != nk) {
        PyErr_Format(PyExc_ValueError, "cu_seqlens_q has %zd sequences and cu_seqlens_k %zd: they must match",
                     (Py_ssize_t)nq, (Py_ssize_t)nk);
        return -1;
    }
    if (a->mask != Py_None || a->want_w || a->kv_len != Py_None || a->row_div != 1 || a->qoff != Py_None) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens exclude masks, weights, kv_len, row_div and qoff");
        return -1;
    }
    c->nseq = nq;
    c->seq_align = a->seq_align != 0;
    return 0;
}

/* The qoff of a call: row i at key position i + qoff (pyattn.dask's blocks). */
static int get_qoff(const pa_call_args *a, pa_attn_call *c)
{
    if (a->qoff == Py_None) return 0;
    const Py_ssize_t qv = PyLong_AsSsize_t(a->qoff);
    if (qv == -1 && PyErr_Occurred()) return -1;
    if (a->kv_len != Py_None) {
        PyErr_SetString(PyExc_ValueError, "qoff excludes kv_len");
        return -1;
    }
    if (qv < -PA_POS_MAX || qv > PA_POS_MAX) {
        PyErr_SetString(PyExc_ValueError, "qoff must be within +-2**62");
        return -1;
    }
    c->has_qoff = 1;
    c->qoff = (pa_ssize)qv;
    return 0;
}

/* The scalar options of a call, checked. */
static int check_scalars(const pa_call_args *a, int cd)
{
    if (pa_check_causal(a->causal) < 0) return -1;
    if (!(a->dropout_p >= 0.0 && a->dropout_p < 1.0)) {
        PyErr_SetString(PyExc_ValueError, "dropout_p must be in [0, 1)");
        return -1;
    }
    if (!(a->softcap >= 0.0 && a->softcap < INFINITY)) {
        PyErr_SetString(PyExc_ValueError, "softcap must be finite and > 0 (0: none)");
        return -1;
    }
    if (a->bf16 && (cd != PA_F32 || a->want_w)) {
        PyErr_SetString(PyExc_ValueError, "precision='bf16' needs float32 (or 16-bit) inputs and no weights");
        return -1;
    }
    return 0;
}

/* The per-head arrays of a call (count = c->bt.count entries each). */
static int get_perhead(const pa_call_args *a, pa_attn_call *c)
{
    const void *pp;
    const pa_ssize ns = c->cu_seqlens_q ? c->nseq : 1;     /* varlen: one row per sequence */
    if (pa_get_perbatch(a->slopes, "alibi_slopes", NPY_FLOAT64, c->bt.count * ns, &pp) < 0) return -1;
    c->slopes = (const double *)pp;
    if (pa_get_perbatch(a->sinks, "sinks", NPY_FLOAT64, c->bt.count, &pp) < 0) return -1;
    c->sinks = (const double *)pp;
    if (pa_get_perbatch(a->kv_len, "cache_seqlens", NPY_INT64, c->bt.count * ns, &pp) < 0) return -1;
    c->kv_len = (const int64_t *)pp;
    for (pa_ssize b = 0; c->kv_len && b < c->bt.count * ns; b++)
        if (c->kv_len[b] < 0 || c->kv_len[b] > (int64_t)c->S) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens must be in [0, %zd]", (Py_ssize_t)c->S);
            return -1;
        }
    return 0;
}

/* cache_batch_idx (B,) int64: sequence s reads entry idx[s] of k and v's
 * batch axis 0 (any length, one for both), each checked within it; the
 * views then take the query's B there (their strides stay the caches') */
static int cache_entries(const pa_call_args *a, const pa_view *q, pa_view *k, pa_view *v)
{
    if (a->batch_idx == Py_None) return 0;
    const void *pp;
    if (q->nd < 3 || k->nd != q->nd || v->nd != q->nd || k->shape[0] != v->shape[0]) {
        PyErr_SetString(PyExc_ValueError, "cache_batch_idx needs key and value with one batch axis 0 (the "
                                          "caches' entries) and the query's other axes");
        return -1;
    }
    if (pa_get_perbatch(a->batch_idx, "cache_batch_idx", NPY_INT64, q->shape[0], &pp) < 0) return -1;
    const int64_t *idx = (const int64_t *)pp;
    for (pa_ssize s = 0; s < q->shape[0]; s++)
        if (idx[s] < 0 || idx[s] >= (int64_t)k->shape[0]) {
            PyErr_Format(PyExc_ValueError, "cache_batch_idx[%zd] = %lld is outside [0, %zd] (the caches' batch "
                         "entries); nothing was written", (Py_ssize_t)s, (long long)idx[s],
                         (Py_ssize_t)k->shape[0] - 1);
            return -1;
        }
    k->shape[0] = v->shape[0] = q->shape[0];
    return 0;
}

/* THE converter of an attention call, shared by the forward and the
 * backward: checks q, k, v (views left in qkv[0..3) for the entry's own
 * checks), the mask and every option, and fills *c but for the results
 * and the entry's own operands. -1 with an exception set. */
int pa_attn_call_of(const pa_call_args *a, pa_attn_call *c, pa_view *qkv)
{
    pa_view *q = &qkv[0], *k = &qkv[1], *v = &qkv[2], m, scores;
    memset(c, 0, sizeof *c);
    if (pa_get_view(a->q, "query", 2, a->allow, 0, q) < 0 || pa_get_view(a->k, "key", 2, a->allow, 0, k) < 0 ||
        pa_get_view(a->v, "value", 2, a->allow, 0, v) < 0)
        return -1;
    const pa_view *vs[3] = {q, k, v};
    const int cd = pa_compute_of(vs, 3, "query, key and value");
    if (cd < 0 || check_scalars(a, cd) < 0) return -1;
    const int nd = q->nd, nb = nd - 2;
    if (cache_entries(a, q, k, v) < 0) return -1;
    if (pa_same_batch(q, "query", k, "key", nb) < 0 || pa_same_batch(q, "query", v, "value", nb) < 0) return -1;
    const pa_ssize L = q->shape[nd - 2], E = q->shape[nd - 1];
    if (a->row_div < 1 || (L % a->row_div != 0 && !(a->paged && a->cuq != Py_None)) || (a->row_div > 1 && (a->want_w || a->mask != Py_None))) {
        PyErr_SetString(PyExc_ValueError, "row_div must be >= 1 and divide L (and excludes masks "
                                          "and weights)");
        return -1;
    }
    const pa_ssize S = k->shape[nd - 2], Ev = v->shape[nd - 1];
    if (k->shape[nd - 1] != E) return pa_shape_error("key", k, "query", q);
    if (v->shape[nd - 2] != S) return pa_shape_error("value", v, "key", k);
    scores = *q;
    scores.shape[nd - 1] = S;
    if (pa_get_mask(a->mask, &scores, cd, &m, &c->mask_kind) < 0) return -1;
    c->dtype = cd;
    pa_batch_of(q, nb, &c->bt);
    c->L = L; c->S = S; c->E = E; c->Ev = Ev;
    pa_operand_of(q, nb, &c->q);
    pa_operand_of(k, nb, &c->k);
    pa_operand_of(v, nb, &c->v);
    c->q_dt = q->dtype; c->k_dt = k->dtype; c->v_dt = v->dtype;
    if (c->mask_kind) pa_operand_of(&m, nb, &c->mask);
    c->causal = a->causal;
    c->scale = a->scale;
    c->softcap = a->softcap;
    c->dropout_p = a->dropout_p;
    c->dropout_key = (uint64_t)a->key;
    c->row_div = (pa_ssize)a->row_div;
    c->bf16 = a->bf16;
    if (get_qoff(a, c) < 0) return -1;
    c->left = window_side(a->left, S, L, c->qoff);
    c->right = window_side(a->right, S, L, c->qoff);
    if (get_cu(a, c) < 0) return -1;
    return get_perhead(a, c);
}

/* cache_leftpad / cache_batch_idx (B,) int64 (the query's batch axis 0:
 * the sequences) into cc: where each sequence's rows lie in contiguous
 * caches (cache_entries checked the entries); each pad within every
 * kv_len of its sequence. */
static int cache_rows(const pa_call_args *a, PyObject *paged, int has_bm, const pa_attn_call *c, pa_cache *cc)
{
    if (a->leftpad == Py_None && a->batch_idx == Py_None) return 0;
    if (paged != Py_None || c->cu_seqlens_q || !c->kv_len || c->mask_kind || a->want_w || has_bm ||
        c->dropout_p > 0 || c->bt.nb < 1) {
        PyErr_SetString(PyExc_ValueError, "cache_leftpad and cache_batch_idx index contiguous caches: they "
                        "need kv_len and batch axes, and exclude paged, cu_seqlens, masks, weights, "
                        "block_mask and dropout");
        return -1;
    }
    const pa_ssize B = c->bt.shape[0];
    const void *pp;
    cc->per_seq = B > 0 ? c->bt.count / B : 1;
    if (pa_get_perbatch(a->batch_idx, "cache_batch_idx", NPY_INT64, B, &pp) < 0) return -1;
    cc->idx = (const int64_t *)pp;
    if (pa_get_perbatch(a->leftpad, "cache_leftpad", NPY_INT64, B, &pp) < 0) return -1;
    cc->pad = (const int64_t *)pp;
    for (pa_ssize b = 0; cc->pad && b < c->bt.count; b++) {
        const int64_t p = cc->pad[b / cc->per_seq];
        if (p < 0 || p > c->kv_len[b]) {
            PyErr_Format(PyExc_ValueError, "cache_leftpad[%zd] = %lld is outside [0, %lld] (at most the "
                         "sequence's keys); nothing was written", (Py_ssize_t)(b / cc->per_seq), (long long)p,
                         (long long)c->kv_len[b]);
            return -1;
        }
    }
    return 0;
}

int pa_cache_of(const pa_call_args *a, PyObject *paged, PyObject *append, int has_bm, pa_attn_call *c,
                pa_cache *cc, pa_kv_append *ap)
{
    memset(cc, 0, sizeof *cc);
    cc->kG = cc->vG = 1;
    if (cache_rows(a, paged, has_bm, c, cc) < 0) return -1;
    /* cache_batch_idx: the scales hold the caches' entries on axis 0 */
    const pa_ssize B = c->bt.nb ? c->bt.shape[0] : 0;
    if (cc->idx) c->bt.shape[0] = (pa_ssize)PyArray_DIMS((PyArrayObject *)a->k)[0];
    const int rc = pa_bind_kv_scales(a->k_scale, a->v_scale, c, a->want_w, cc);   /* c->cache = cc if so */
    if (cc->idx) c->bt.shape[0] = B;
    if (rc < 0) return -1;
    if (cc->pad || cc->idx) c->cache = cc;
    if (a->q8 && (!pa_call_quant(c) || (c->k_dt != PA_I8 && c->k_dt != PA_I4) || a->want_w || c->E > PA_FLASH_MAXD)) {
        PyErr_Format(PyExc_ValueError, "precision='int8' needs an int8 or int4 key cache (with k_scale), "
                                       "no weights and a head dim of at most %d", PA_FLASH_MAXD);
        return -1;
    }
    c->q8 = a->q8;
    if (c->bf16 && pa_call_quant(c)) {               /* int8 / int4 keys: qrowdot on the query */
        c->bf16 = 0;                                 /* rounded to bfloat16 (the rows path) */
        c->qbf16 = 1;
    }
    if (((append != Py_None && paged == Py_None) || pa_call_quant(c) || (has_bm && paged != Py_None)) &&
        c->cu_seqlens_q) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens exclude append (but for a paged cache), quantized caches "
                        "and block_mask with a paged cache");
        return -1;
    }
    if (paged != Py_None)               /* pools, block table (c->cache = cc), new rows */
        return pa_bind_paged(paged, append, c, cc, ap);
    if (append != Py_None) {            /* a contiguous cache's new rows: the identity table */
        if (pa_get_append(append, cc->idx, B, ap) < 0) return -1;
        c->before = pa_kv_append_run;
        c->before_ctx = ap;
    }
    return 0;
}
