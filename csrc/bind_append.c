/*
 * bind_append.c -- the contiguous KV cache append (bind_append.h): the
 * checks of append=; the rows are written by THE append's writer
 * (bind_paged.c, pa_kv_append_run), the identity table.
 *
 * Shape legend: B batch, H heads, T new rows, S_max cache rows, E / Ev head
 * dims of k / v.
 */
#include "bind_append.h"
#include "bind_views.h"
#include "bind_quant.h"
#include "bind_rotary.h"
#include "ops/quant.h"

#include <string.h>

/* append = (k_cache, v_cache, key, value, positions (B,) int64[, k_scale,
 * v_scale][, rotary]): validated in full here, before the call allocates or
 * writes anything. rotary = (cos, sin, interleaved) (bind_rotary.h): key is
 * then of the compute dtype (float32 for 16-bit and quantized caches),
 * rotated at positions [pos[b], pos[b] + T) as it is written. */
/* append's cache x (k_cache / v_cache) and its new rows (key / value):
 * 4-D views *c, *r of dtypes that fit (a quantized cache takes float32
 * rows; with rotary the keys are of k_cache's compute dtype) */
static int append_operand(PyObject *o, int x, pa_view *c, pa_view *r, pa_kv_append *ap)
{
    static const char *cn[2] = {"k_cache", "v_cache"}, *rn[2] = {"key", "value"};
    if (pa_get_view(PyTuple_GET_ITEM(o, x), cn[x], 4, PA_ALLOW_16 | PA_ALLOW_Q, 1, c) < 0 ||
        pa_get_view(PyTuple_GET_ITEM(o, 2 + x), rn[x], 4, PA_ALLOW_16, 0, r) < 0)
        return -1;
    if (c->nd != 4 || r->nd != 4) {
        PyErr_Format(PyExc_ValueError, "%s and %s must be 4-D", cn[x], rn[x]);
        return -1;
    }
    ap->bits[x] = pa_qbits(c->dtype);
    if (ap->bits[x]) {
        if (r->dtype != PA_F32) {
            PyErr_Format(PyExc_TypeError, "%s must be float32 for the %s cache %s (it is quantized "
                         "as it is written)", rn[x], pa_dtype_name(c->dtype), cn[x]);
            return -1;
        }
    } else if (ap->rot && x == 0) {
        if (r->dtype != pa_dtypes[c->dtype].compute) {
            PyErr_Format(PyExc_TypeError, "key must be %s (k_cache's compute dtype) with rotary, got %s",
                         pa_dtype_name(pa_dtypes[c->dtype].compute), pa_dtype_name(r->dtype));
            return -1;
        }
    } else if (r->dtype != c->dtype) {
        PyErr_Format(PyExc_TypeError, "%s must be stored as %s is (%s), got %s", rn[x], cn[x],
                     pa_dtype_name(c->dtype), pa_dtype_name(r->dtype));
        return -1;
    }
    return 0;
}

int pa_get_append(PyObject *o, const int64_t *idx, pa_ssize nseq, pa_kv_append *ap)
{
    static const char *cn[2] = {"k_cache", "v_cache"}, *rn[2] = {"key", "value"};
    const Py_ssize_t na = PyTuple_Check(o) ? PyTuple_GET_SIZE(o) : 0;
    if (na < 5 || na > 8) {
        PyErr_SetString(PyExc_TypeError, "append must be (k_cache, v_cache, key, value, positions"
                                         "[, k_scale, v_scale][, rotary])");
        return -1;
    }
    memset(ap, 0, sizeof *ap);          /* (table, cu: NULL) */
    ap->rot = na == 6 || na == 8;
    pa_view c[2], r[2];
    for (int x = 0; x < 2; x++)
        if (append_operand(o, x, &c[x], &r[x], ap) < 0) return -1;
    /* B sequences of new rows; Bc cache entries (cache_batch_idx: sequence b's, idx[b]) */
    const pa_ssize Bc = c[0].shape[0], B = idx ? nseq : Bc, H = c[0].shape[1], S = c[0].shape[2],
                   T = r[0].shape[2];
    for (int x = 0; x < 2; x++) {
        if (c[x].shape[0] != Bc || c[x].shape[1] != H || c[x].shape[2] != S) {
            pa_shape_error(cn[x], &c[x], "k_cache", &c[0]);
            return -1;
        }
        if (r[x].shape[0] != B || r[x].shape[1] != H || r[x].shape[2] != T || r[x].shape[3] != c[x].shape[3]) {
            pa_shape_error(rn[x], &r[x], cn[x], &c[x]);
            return -1;
        }
        ap->pool[x] = c[x].data;
        ap->rows[x] = r[x].data;
        memcpy(ap->pst[x], c[x].st, sizeof(ap->pst[x]));
        memcpy(ap->rst[x], r[x].st, sizeof(ap->rst[x]));
        ap->D[x] = c[x].shape[3];
        ap->es[x] = pa_elsize(c[x].dtype);
        ap->res[x] = pa_elsize(r[x].dtype);
        if (ap->bits[x] && pa_append_scales(na >= 7 ? PyTuple_GET_ITEM(o, 5 + x) : Py_None,
                                            x, Bc, H, S, ap->D[x], &ap->sc[x], ap->sst[x], &ap->G[x]) < 0)
            return -1;
    }
    const void *pp;
    if (pa_get_perbatch(PyTuple_GET_ITEM(o, 4), "cache_seqlens", NPY_INT64, B, &pp) < 0) return -1;
    ap->pos = (const int64_t *)pp;
    for (pa_ssize b = 0; b < B; b++)       /* S - T: no sum that could wrap */
        if (T > S || ap->pos[b] < 0 || ap->pos[b] > (int64_t)(S - T)) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens + T exceeds the cache: entry %zd is %lld, "
                         "T = %zd, S_max = %zd; nothing was written", (Py_ssize_t)b,
                         (long long)ap->pos[b], (Py_ssize_t)T, (Py_ssize_t)S);
            return -1;
        }
    ap->B = B; ap->H = H; ap->T = T;
    ap->table = NULL;                   /* the identity: block b, rows [0, S_max) */
    ap->bsz = S > 0 ? S : 1;
    for (pa_ssize b = 0; idx && b < B; b++)
        if (idx[b] < 0 || idx[b] >= (int64_t)Bc) {
            PyErr_Format(PyExc_ValueError, "cache_batch_idx[%zd] = %lld is outside the caches' %zd entries",
                         (Py_ssize_t)b, (long long)idx[b], (Py_ssize_t)Bc);
            return -1;
        }
    if (idx) {                          /* block b: entry idx[b] (one block of S_max rows each) */
        ap->table = idx;
        ap->tbs0 = 1;
    }
    if (ap->rot) {                      /* the tables, every new row's position in them */
        ap->kdt = c[0].dtype;
        if (pa_bind_rope(PyTuple_GET_ITEM(o, na - 1), pa_dtypes[c[0].dtype].compute, c[0].shape[3], &ap->rope) < 0)
            return -1;
    }
    return pa_kv_append_check(ap, "batch", "cache");
}
