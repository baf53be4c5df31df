/*
 * bind_sdpa.c -- _C.sdpa, _C.sdpa_backward and _C.merge: the attention's
 * entries (bind_sdpa.h). Each converts its call with pa_attn_call_of
 * (bind_call.c), checks and allocates its own operands, then runs the op.
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim.
 */
#include "bind_call.h"
#include "bind_sdpa.h"
#include "bind_interrupt.h"
#include "bind_config.h"
#include "bind_paged.h"
#include "bind_blockmask.h"

#include <string.h>

/* The keywords of _C.sdpa (F) and _C.sdpa_backward (B), one row each, in
 * each entry's positional order: X(PA_KW_<entry>_<who>, keyword, PyArg
 * format unit, destination), who = FB (both entries), F or B (that entry
 * only; qoff has a row for each, at its place in each); the required
 * keywords first, then the optional ones (PyArg's "|" between the two
 * lists). Each entry generates its kwlist, format and destinations from the
 * rows (PA_SDPA_KWLIST, PA_SDPA_FORMAT, PA_SDPA_DESTS); a destination names
 * the entry's locals (a: its pa_call_args), and both entries give the
 * shared ones the same names. pyattn/_spec.py's AttnSpec.c_kwargs passes
 * these keywords; a new option is a row here and a field in pa_call_args
 * (bind_call.h). */
#define PA_SDPA_KWARGS_REQUIRED(X, dir)                                       \
    X(PA_KW_##dir##_FB, q, "O", &a.q)                                         \
    X(PA_KW_##dir##_FB, k, "O", &a.k)                                         \
    X(PA_KW_##dir##_FB, v, "O", &a.v)                                         \
    X(PA_KW_##dir##_B, o, "O", &io[0])                                        \
    X(PA_KW_##dir##_B, go, "O", &io[1])                                       \
    X(PA_KW_##dir##_B, lse, "O", &io[2])
#define PA_SDPA_KWARGS_OPTIONAL(X, dir)                                       \
    X(PA_KW_##dir##_F, out, "O", &outo)                                       \
    X(PA_KW_##dir##_FB, mask, "O", &a.mask)                                   \
    X(PA_KW_##dir##_FB, causal, "i", &a.causal)                               \
    X(PA_KW_##dir##_FB, scale, "d", &a.scale)                                 \
    X(PA_KW_##dir##_FB, dropout_p, "d", &a.dropout_p)                         \
    X(PA_KW_##dir##_FB, dropout_key, "K", &a.key)                             \
    X(PA_KW_##dir##_F, want_weights, "p", &a.want_w)                          \
    X(PA_KW_##dir##_F, want_lse, "p", &want_lse)                              \
    X(PA_KW_##dir##_FB, left, "n", &a.left)                                   \
    X(PA_KW_##dir##_FB, right, "n", &a.right)                                 \
    X(PA_KW_##dir##_FB, softcap, "d", &a.softcap)                             \
    X(PA_KW_##dir##_FB, slopes, "O", &a.slopes)                               \
    X(PA_KW_##dir##_FB, sinks, "O", &a.sinks)                                 \
    X(PA_KW_##dir##_F, kv_len, "O", &a.kv_len)                                \
    X(PA_KW_##dir##_F, row_div, "n", &a.row_div)                              \
    X(PA_KW_##dir##_F, qoff, "O", &a.qoff)                                    \
    X(PA_KW_##dir##_B, reduce, "O", &redo)                                    \
    X(PA_KW_##dir##_FB, nthreads, "i", &req_threads)                          \
    X(PA_KW_##dir##_F, bf16, "p", &a.bf16)                                    \
    X(PA_KW_##dir##_F, int8, "p", &a.q8)                                      \
    X(PA_KW_##dir##_F, append, "O", &appo)                                    \
    X(PA_KW_##dir##_FB, cu_seqlens_q, "O", &a.cuq)                            \
    X(PA_KW_##dir##_FB, cu_seqlens_k, "O", &a.cuk)                            \
    X(PA_KW_##dir##_F, paged, "O", &pago)                                     \
    X(PA_KW_##dir##_F, k_scale, "O", &a.k_scale)                              \
    X(PA_KW_##dir##_F, v_scale, "O", &a.v_scale)                              \
    X(PA_KW_##dir##_F, cache_leftpad, "O", &a.leftpad)                        \
    X(PA_KW_##dir##_F, cache_batch_idx, "O", &a.batch_idx)                    \
    X(PA_KW_##dir##_B, qoff, "O", &a.qoff)                                    \
    X(PA_KW_##dir##_FB, block_mask, "O", &bmo)                                \
    X(PA_KW_##dir##_FB, seq_align, "p", &a.seq_align)

/* PA_KW_<entry>_<who>(...): the row's piece where the entry takes it */
#define PA_KW_F_FB(...) __VA_ARGS__
#define PA_KW_F_F(...) __VA_ARGS__
#define PA_KW_F_B(...)
#define PA_KW_B_FB(...) __VA_ARGS__
#define PA_KW_B_B(...) __VA_ARGS__
#define PA_KW_B_F(...)
#define PA_KW_NAME(on, name, fmt, dest) on(#name,)
#define PA_KW_FMT(on, name, fmt, dest) on(fmt)
#define PA_KW_DEST(on, name, fmt, dest) on(, dest)
/* an entry's kwlist (NULL-terminated), its format (":" and the entry's name
 * follow) and its destinations (after kwlist in the call) */
#define PA_SDPA_KWLIST(dir)                                                   \
    {PA_SDPA_KWARGS_REQUIRED(PA_KW_NAME, dir) PA_SDPA_KWARGS_OPTIONAL(PA_KW_NAME, dir) NULL}
#define PA_SDPA_FORMAT(dir)                                                   \
    PA_SDPA_KWARGS_REQUIRED(PA_KW_FMT, dir) "|" PA_SDPA_KWARGS_OPTIONAL(PA_KW_FMT, dir)
#define PA_SDPA_DESTS(dir)                                                    \
    PA_SDPA_KWARGS_REQUIRED(PA_KW_DEST, dir) PA_SDPA_KWARGS_OPTIONAL(PA_KW_DEST, dir)

const char pa_sdpa_doc[] =
    "sdpa(q, k, v, out=None, mask=None, causal=0, scale=1.0, dropout_p=0.0,\n"
    "     dropout_key=0, want_weights=False, want_lse=False, left=-1, right=-1,\n"
    "     softcap=0.0, slopes=None, sinks=None, kv_len=None, row_div=1, qoff=None,\n"
    "     nthreads=0, bf16=False, int8=False, append=None, cu_seqlens_q=None, cu_seqlens_k=None, paged=None,\n"
    "     k_scale=None, v_scale=None, seq_align=False, cache_leftpad=None,\n"
    "     cache_batch_idx=None)\n"
    "     -> (out, weights or None, lse or None)\n\n"
    "Private kernel entry: fused attention, all operands with equal batch axes;\n"
    "slopes, sinks (float64) and kv_len (int64) hold one value per flat batch\n"
    "index; append = (k_cache, v_cache, key, value, positions): new cache rows\n"
    "written once everything is checked and allocated (quantized caches: 7\n"
    "entries, + k_scale, v_scale of the caches; float32 rows quantized as\n"
    "written); k_scale, v_scale: float32 scales of int8 / int4 (uint8) k, v;\n"
    "paged = (k_pool, v_pool, block_table): a paged cache (bind_paged.c; append\n"
    "then (key, value, positions)); quantized pools: + (k_scale_pool, v_scale_pool),\n"
    "k_scale / v_scale then stand-ins of the call's shape. int8: precision\n"
    "'int8' (an int8 / int4 k with k_scale; query rows quantized to int8).\n"
    "cache_leftpad, cache_batch_idx (B,) int64 (contiguous caches, with kv_len):\n"
    "sequence b's keys from row pad[b] of k, v's entry idx[b] (their axis 0).  Use\n"
    "pyattn.scaled_dot_product_attention.";

PyObject *pa_py_sdpa(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = PA_SDPA_KWLIST(F);
    pa_call_args a;
    pa_cache cache;                     /* a paged / quantized cache: the call's one (ops.h) */
    pa_call_args_init(&a, PA_ALLOW_16 | PA_ALLOW_Q);
    PyObject *outo = Py_None, *appo = Py_None, *pago = Py_None, *bmo = Py_None;
    pa_bm_arg bma = {.nbuf = 0};
    int req_threads = 0, want_lse = 0;
    pa_kv_append ap;
    pa_attn_call c;
    pa_view qkv[3], o, w, lv;
    PyArrayObject *res = NULL, *wres = NULL, *lres = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, PA_SDPA_FORMAT(F) ":sdpa", kwlist PA_SDPA_DESTS(F)))
        return NULL;
    a.paged = pago != Py_None;
    if (pa_attn_call_of(&a, &c, qkv) < 0) goto fail;
    /* the KV cache (scales, pools, new rows), checked in full before anything is allocated */
    if (pa_cache_of(&a, pago, appo, bmo != Py_None, &c, &cache, &ap) < 0) goto fail;
    if (pa_bm_get(bmo, &c, &bma) < 0) goto fail;
    const int nd = qkv[0].nd, nb = nd - 2;
    pa_ssize shape[PA_MAXDIMS];         /* every check is done: allocate, then write */
    memcpy(shape, qkv[0].shape, sizeof(pa_ssize) * (size_t)nd);
    shape[nd - 1] = c.Ev;
    res = pa_get_out(outo, nd, shape, c.dtype, &o, "attention output");
    if (!res) goto fail;
    pa_operand_of(&o, nb, &c.out);
    if (a.want_w) {
        shape[nd - 1] = c.S;
        wres = pa_get_out(Py_None, nd, shape, c.dtype, &w, "attention weights");
        if (!wres) goto fail;
        pa_operand_of(&w, nb, &c.w);
        c.has_w = 1;
    }
    if (want_lse) {
        lres = pa_get_out(Py_None, nb + 1, shape, c.dtype, &lv, "log-sum-exp");
        if (!lres) goto fail;
        pa_operand_of(&lv, nb, &c.lse);
        c.has_lse = 1;
    }
    int rc, nt = pa_call_threads(req_threads);
    const pa_family *fam = pa_family_now();
    PA_STOPPABLE_CALL((double)c.bt.count * (double)c.L * (double)c.S * (double)(c.E + c.Ev + 16),
                      rc = pa_attention(fam, &c, nt), (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    pa_bm_release(&bma);
    return Py_BuildValue("(NNN)", res, wres ? (PyObject *)wres : Py_NewRef(Py_None),
                         lres ? (PyObject *)lres : Py_NewRef(Py_None));
fail:
    pa_bm_release(&bma);
    Py_XDECREF(res);
    Py_XDECREF(wres);
    Py_XDECREF(lres);
    return NULL;
}

/* Zero-filled C-contiguous array (gradients are accumulated into it). */
static PyArrayObject *new_zeros(int nd, const pa_ssize *shape, int dtype, const char *what)
{
    PyArrayObject *a = pa_new_array(nd, shape, dtype, what);
    if (a) memset(PyArray_DATA(a), 0, (size_t)PyArray_NBYTES(a));
    return a;
}

/* A varlen call's gradient (rows_first): zeros laid out token-major, (rows,
 * batch..., cols) in memory, returned as the (batch..., rows, cols) view the
 * op writes through -- so the packed (total, H, E) result needs no copy. */
static PyArrayObject *new_zeros_of(int nd, const pa_ssize *shape, int dtype, const char *what, int rows_first)
{
    if (!rows_first) return new_zeros(nd, shape, dtype, what);
    pa_ssize s2[PA_MAXDIMS];
    npy_intp perm[PA_MAXDIMS];
    s2[0] = shape[nd - 2];
    for (int d = 0; d < nd - 2; d++) { s2[d + 1] = shape[d]; perm[d] = d + 1; }
    s2[nd - 1] = shape[nd - 1];
    perm[nd - 2] = 0;
    perm[nd - 1] = nd - 1;
    PyArrayObject *a = new_zeros(nd, s2, dtype, what);
    if (!a) return NULL;
    PyArray_Dims pd = {perm, nd};
    PyObject *t = PyArray_Transpose(a, &pd);
    Py_DECREF(a);
    return (PyArrayObject *)t;
}

/* A dense backward's gradient: left unzeroed, pa_attention_backward's
 * tasks zero it (g.zero) on every thread, not here on one with the GIL
 * held; its memory kept from the gradients of earlier calls, once freed
 * (pa_new_array_kept: no page faults); a varlen call's: zeros
 * (new_zeros_of) */
static PyArrayObject *new_grad_of(int nd, const pa_ssize *shape, int dtype, const char *what, int rows_first)
{
    return rows_first ? new_zeros_of(nd, shape, dtype, what, 1) : pa_new_array_kept(nd, shape, dtype, what);
}

static void zero_all(PyArrayObject *a, PyArrayObject *b, PyArrayObject *c, PyArrayObject *d)
{
    PyArrayObject *arrs[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (arrs[i]) memset(PyArray_DATA(arrs[i]), 0, (size_t)PyArray_NBYTES(arrs[i]));
}

/* The backward's inputs beyond the call (the forward's out and lse, the
 * incoming grad_out): views of the call's compute dtype and shapes, into
 * c->out, c->lse and g->go. */
static int get_bwd_inputs(PyObject *const *objs, const pa_view *qkv, pa_attn_call *c, pa_attn_grads *g)
{
    pa_view o, go, lv;
    const pa_view *q = &qkv[0], *v = &qkv[2];
    if (pa_get_view(objs[0], "out", 2, 0, 0, &o) < 0 || pa_get_view(objs[1], "grad_out", 2, 0, 0, &go) < 0 ||
        pa_get_view(objs[2], "lse", 1, 0, 0, &lv) < 0)
        return -1;
    const int cd = c->dtype, nd = q->nd, nb = nd - 2;
    if (qkv[1].dtype != cd || v->dtype != cd || o.dtype != cd || go.dtype != cd || lv.dtype != cd) {
        PyErr_SetString(PyExc_TypeError, "query, key, value, out, grad_out and lse must have one dtype");
        return -1;
    }
    if (pa_same_batch(q, "query", &o, "out", nb) < 0 || pa_same_batch(q, "query", &go, "grad_out", nb) < 0)
        return -1;
    if (o.shape[nd - 2] != c->L || o.shape[nd - 1] != c->Ev) return pa_shape_error("out", &o, "value", v);
    if (go.shape[nd - 2] != c->L || go.shape[nd - 1] != c->Ev) return pa_shape_error("grad_out", &go, "out", &o);
    int lok = lv.nd == nb + 1;
    for (int d = 0; lok && d <= nb; d++) lok = lv.shape[d] == q->shape[d];
    if (!lok) return pa_shape_error("lse", &lv, "query", q);
    pa_operand_of(&o, nb, &c->out);
    pa_operand_of(&lv, nb, &c->lse);
    c->has_lse = 1;
    pa_operand_of(&go, nb, &g->go);
    return 0;
}

/* reduce: None or one flag per batch axis (nb of them) into r. */
static int get_reduce(PyObject *redo, int nb, int *r)
{
    for (int d = 0; d < nb; d++) r[d] = 0;
    if (!redo || redo == Py_None) return 0;
    PyObject *seq = PySequence_Fast(redo, "reduce must be a sequence");
    if (!seq) return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int bad = n != nb;
    for (Py_ssize_t d = 0; !bad && d < n; d++) {
        const int t = PyObject_IsTrue(PySequence_Fast_GET_ITEM(seq, d));
        if (t < 0) bad = 1; else r[d] = t;
    }
    Py_DECREF(seq);
    if (bad) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "reduce must hold one flag per batch axis (%d)", nb);
        return -1;
    }
    return 0;
}

const char pa_sdpa_backward_doc[] =
    "sdpa_backward(q, k, v, o, go, lse, mask=None, causal=0, scale=1.0, dropout_p=0.0,\n"
    "              dropout_key=0, left=-1, right=-1, softcap=0.0, slopes=None, sinks=None,\n"
    "              reduce=(), nthreads=0, cu_seqlens_q=None, cu_seqlens_k=None, qoff=None,\n"
    "              seq_align=False)\n"
    "              -> (dq, dk, dv, dsinks or None)\n\n"
    "Private kernel entry: the attention backward, every operand of one compute\n"
    "dtype with equal batch axes; reduce flags the batch axes that key and value\n"
    "broadcast over (dk, dv get extent 1 there, summed). dsinks: one value per\n"
    "flat batch index. Use pyattn.scaled_dot_product_attention_backward.";

PyObject *pa_py_sdpa_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = PA_SDPA_KWLIST(B);
    pa_call_args a;
    pa_call_args_init(&a, 0);
    PyObject *io[3], *redo = NULL, *bmo = Py_None;
    pa_bm_arg bma = {.nbuf = 0};
    int req_threads = 0, reduce[PA_MAXDIMS];
    pa_attn_call c;
    pa_attn_grads g;
    pa_view qkv[3], dqv, dkv, dvv;
    PyArrayObject *dq = NULL, *dk = NULL, *dv = NULL, *ds = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, PA_SDPA_FORMAT(B) ":sdpa_backward", kwlist PA_SDPA_DESTS(B)))
        return NULL;
    memset(&g, 0, sizeof g);
    if (pa_attn_call_of(&a, &c, qkv) < 0 || get_bwd_inputs(io, qkv, &c, &g) < 0 || pa_bm_get(bmo, &c, &bma) < 0)
        goto fail;
    const int nd = qkv[0].nd, nb = nd - 2, cd = c.dtype;
    if (get_reduce(redo, nb, reduce) < 0) goto fail;
    pa_ssize kshape[PA_MAXDIMS];
    memcpy(kshape, qkv[1].shape, sizeof(pa_ssize) * (size_t)nd);
    for (int d = 0; d < nb; d++)
        if (reduce[d]) kshape[d] = 1;
    const int tm = c.cu_seqlens_q != NULL;      /* varlen: token-major gradients */
    dq = new_grad_of(nd, qkv[0].shape, cd, "query gradient", tm);
    if (!dq) goto fail;
    dk = new_grad_of(nd, kshape, cd, "key gradient", tm);
    if (!dk) goto fail;
    kshape[nd - 1] = c.Ev;
    dv = new_grad_of(nd, kshape, cd, "value gradient", tm);
    if (!dv) goto fail;
    if (c.sinks) {
        const pa_ssize n = c.bt.count;
        ds = new_zeros(1, &n, PA_F64, "sink gradient");
        if (!ds) goto fail;
    }
    if (pa_get_view((PyObject *)dq, "dq", nd, 0, 1, &dqv) < 0 ||
        pa_get_view((PyObject *)dk, "dk", nd, 0, 1, &dkv) < 0 ||
        pa_get_view((PyObject *)dv, "dv", nd, 0, 1, &dvv) < 0)
        goto fail;
    for (int d = 0; d < nb; d++)
        if (reduce[d]) dkv.st[d] = dvv.st[d] = 0;
    pa_operand_of(&dqv, nb, &g.dq);
    pa_operand_of(&dkv, nb, &g.dk);
    pa_operand_of(&dvv, nb, &g.dv);
    g.reduce = reduce;
    g.dsinks = ds ? (double *)PyArray_DATA(ds) : NULL;
    g.zero = !tm;
    int rc, nt = pa_call_threads(req_threads);
    const pa_family *fam = pa_family_now();
    /* the gradients are accumulated: a rerun starts from zeros again */
    PA_STOPPABLE_CALL(2.0 * (double)c.bt.count * (double)c.L * (double)c.S * (double)(c.E + c.Ev + 16),
                      rc = pa_attention_backward(fam, &c, &g, nt), zero_all(dq, dk, dv, ds));
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    pa_bm_release(&bma);
    return Py_BuildValue("(NNNN)", dq, dk, dv, ds ? (PyObject *)ds : Py_NewRef(Py_None));
fail:
    pa_bm_release(&bma);
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(dv);
    Py_XDECREF(ds);
    return NULL;
}

const char pa_merge_doc[] =
    "merge(outs, lses, nthreads=0) -> (out, lse)\n\n"
    "Private kernel entry: outs (P, ..., L, Ev) and lses (P, ..., L) of one\n"
    "dtype with equal axes. Use pyattn.merge_attention.";

PyObject *pa_py_merge(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"outs", "lses", "nthreads", NULL};
    PyObject *oo, *lo;
    PyArrayObject *res = NULL, *lres = NULL;
    pa_view os, ls, o, l;
    int req_threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|i:merge", kwlist, &oo, &lo, &req_threads)) return NULL;
    if (pa_get_view(oo, "outputs", 3, 0, 0, &os) < 0 || pa_get_view(lo, "lses", 2, 0, 0, &ls) < 0)
        goto fail;
    if (os.dtype != ls.dtype) {
        PyErr_SetString(PyExc_TypeError, "outputs and lses must have one dtype");
        goto fail;
    }
    const int nd = os.nd, nb = nd - 3;     /* (P, batch..., L, Ev) */
    int ok = ls.nd == nd - 1;
    for (int d = 0; ok && d < nd - 1; d++) ok = ls.shape[d] == os.shape[d];
    if (!ok) { pa_shape_error("lses", &ls, "outputs", &os); goto fail; }
    const pa_ssize P = os.shape[0], L = os.shape[nd - 2], Ev = os.shape[nd - 1];
    res = pa_get_out(Py_None, nd - 1, os.shape + 1, os.dtype, &o, "merged output");
    if (!res) goto fail;
    lres = pa_get_out(Py_None, nd - 2, os.shape + 1, os.dtype, &l, "merged log-sum-exp");
    if (!lres) goto fail;
    /* views without the P axis: batch strides of the parts */
    pa_view os1 = os, ls1 = ls;
    os1.nd = nd - 1; ls1.nd = nd - 2;
    memmove(os1.shape, os.shape + 1, sizeof(pa_ssize) * (size_t)(nd - 1));
    memmove(os1.st, os.st + 1, sizeof(pa_ssize) * (size_t)(nd - 1));
    memmove(ls1.shape, ls.shape + 1, sizeof(pa_ssize) * (size_t)(nd - 2));
    memmove(ls1.st, ls.st + 1, sizeof(pa_ssize) * (size_t)(nd - 2));
    pa_batch bt;
    pa_operand Os, Ls, O, Lo;
    pa_batch_of(&o, nb, &bt);
    pa_operand_of(&os1, nb, &Os);
    pa_operand_of(&ls1, nb, &Ls);
    pa_operand_of(&o, nb, &O);
    pa_operand_of(&l, nb, &Lo);
    const pa_merge_call mg = {.dtype = os.dtype, .bt = &bt, .P = P, .L = L, .Ev = Ev, .outs = &Os,
                              .lses = &Ls, .out = &O, .lse = &Lo, .outs_ps = os.st[0],
                              .lses_ps = ls.st[0]};
    int nt = pa_call_threads(req_threads);
    Py_BEGIN_ALLOW_THREADS
    pa_merge(&mg, nt);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(NN)", res, lres);
fail:
    Py_XDECREF(res);
    Py_XDECREF(lres);
    return NULL;
}
