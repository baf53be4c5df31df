/*
 * bind_quant.c -- pyattn._C.quantize / dequantize: the binding of
 * ops/quant.c. pyattn/_quant.py moves the quantized axis last (a view) and
 * allocates the outputs; this checks what the C code relies on (dtypes,
 * shapes, alignment, strides), so a direct call can raise but never crash.
 */
#include "bind_quant.h"
/* this file's own NumPy API table (not bind_views.h's shared one), imported
 * on the first call */
#include <numpy/arrayobject.h>

#include <string.h>
#include "threads.h"
#include "ops/quant.h"
#include "bind_nd.h"      /* pa_nd_fp8 */

const char pa_quantize_doc[] =
    "quantize(x, q, scale, bits, group_size): x float32 (..., E) -> q int8 (..., E), uint8\n"
    "(..., E/2) (bits 4) or ml_dtypes fp8 (bits 1: float8_e4m3fn, 2: float8_e5m2), scale float32\n"
    "(..., E/group_size), written in place. Private: see\n"
    "pyattn.quantize. ValueError when x holds NaN or infinity.";
const char pa_dequantize_doc[] =
    "dequantize(q, scale, x, bits, group_size): the inverse, x = q * scale, written in place:\n"
    "x float32 (the product rounded once) or float64 (the exact product). Private: see\n"
    "pyattn.dequantize.";

/* arr (ndarray of npy type tn, aligned, native, nd dims), its element strides */
static int qview(PyObject *o, const char *name, int tn, int writeable, PyArrayObject **arr)
{
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != tn) {
        PyArray_Descr *d = PyArray_DescrFromType(tn);
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray of %s", name,
                     d ? d->typeobj->tp_name : "?");
        Py_XDECREF(d);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    if (!PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be aligned and in native byte order", name);
        return -1;
    }
    if (PyArray_NDIM(a) < 1 || PyArray_NDIM(a) > PA_MAXDIMS) {
        PyErr_Format(PyExc_ValueError, "%s must have between 1 and %d dimensions", name, PA_MAXDIMS);
        return -1;
    }
    if (writeable && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be writeable", name);
        return -1;
    }
    const npy_intp is = PyArray_ITEMSIZE(a);
    for (int d = 0; d < PyArray_NDIM(a); d++)
        if (PyArray_STRIDES(a)[d] % is != 0) {
            PyErr_Format(PyExc_ValueError, "%s has a stride that is not a multiple of its item size", name);
            return -1;
        }
    *arr = a;
    return 0;
}

static void qoperand(PyArrayObject *a, int nb, pa_operand *o)
{
    const npy_intp is = PyArray_ITEMSIZE(a);
    o->p = PyArray_BYTES(a);
    for (int d = 0; d < nb; d++) o->bs[d] = (pa_ssize)(PyArray_STRIDES(a)[d] / is);
    o->rs = 0;
    o->cs = (pa_ssize)(PyArray_STRIDES(a)[nb] / is);
}

/* c's shape from x, q and scale (views checked by qview): the leading
 * shapes agree, the axis lengths fit bits and group size G */
static int quant_shape(PyArrayObject *x, PyArrayObject *q, PyArrayObject *s, int bits, Py_ssize_t G,
                       pa_quant_call *c)
{
    const int nd = PyArray_NDIM(x);
    if (PyArray_NDIM(q) != nd || PyArray_NDIM(s) != nd) {
        PyErr_SetString(PyExc_ValueError, "x, q and scale must have the same number of dimensions");
        return -1;
    }
    const int nb = nd - 1;
    const pa_ssize E = (pa_ssize)PyArray_DIMS(x)[nb];
    if (G < 1 || E % G != 0 || (bits == 4 && E % 2 != 0)) {
        PyErr_Format(PyExc_ValueError, "group_size %zd must divide the axis length %zd%s", G, (Py_ssize_t)E,
                     bits == 4 ? " (even for int4)" : "");
        return -1;
    }
    c->bits = bits;
    c->E = E;
    c->G = (pa_ssize)G;
    c->bt.nb = nb;
    c->bt.count = 1;
    for (int d = 0; d < nb; d++) {
        const npy_intp n = PyArray_DIMS(x)[d];
        if (PyArray_DIMS(q)[d] != n || PyArray_DIMS(s)[d] != n) {
            PyErr_SetString(PyExc_ValueError, "x, q and scale must have the same leading shape");
            return -1;
        }
        c->bt.shape[d] = (pa_ssize)n;
        c->bt.count *= (pa_ssize)n;     /* no overflow: the elements of an existing array */
    }
    if (PyArray_DIMS(q)[nb] != (bits == 4 ? E / 2 : E) || PyArray_DIMS(s)[nb] != E / G) {
        PyErr_SetString(PyExc_ValueError, "q must have E (int4: E/2) and scale E/group_size values along the axis");
        return -1;
    }
    qoperand(x, nb, &c->x);
    qoperand(q, nb, &c->q);
    qoperand(s, nb, &c->s);
    return 0;
}

/* x, q, s in that order; dq: whether x is the output */
static PyObject *quant_call(PyObject *args, int dq)
{
    PyObject *xo, *qo, *so;
    int bits;
    Py_ssize_t G;
    PyArrayObject *x, *q, *s;
    pa_quant_call c;
    if (PyArray_API == NULL && _import_array() < 0) return NULL;
    if (dq) {
        if (!PyArg_ParseTuple(args, "OOOin:dequantize", &qo, &so, &xo, &bits, &G)) return NULL;
    } else {
        if (!PyArg_ParseTuple(args, "OOOin:quantize", &xo, &qo, &so, &bits, &G)) return NULL;
    }
    if (bits != 8 && bits != 4 && !pa_qfp8(bits)) {
        PyErr_Format(PyExc_ValueError, "bits must be 8, 4, %d (fp8 e4m3) or %d (fp8 e5m2), got %d", PA_QF8E4,
                     PA_QF8E5, bits);
        return NULL;
    }
    /* dequantize writes float32 or float64 */
    const int x64 = dq && PyArray_Check(xo) && PyArray_TYPE((PyArrayObject *)xo) == NPY_FLOAT64;
    /* fp8: q is ml_dtypes' float8 array of that format (a user dtype) */
    const int qfp8 = pa_qfp8(bits), fdt = bits == PA_QF8E4 ? PA_F8E4 : PA_F8E5;
    if (qfp8 && pa_nd_fp8(qo) != fdt) {
        PyErr_Format(PyExc_TypeError, "q must be a numpy.ndarray of ml_dtypes.%s", pa_dtypes[fdt].name);
        return NULL;
    }
    if (qview(xo, "x", x64 ? NPY_FLOAT64 : NPY_FLOAT32, dq, &x) < 0 ||
        qview(qo, "q", qfp8 ? PyArray_TYPE((PyArrayObject *)qo) : bits == 8 ? NPY_INT8 : NPY_UINT8, !dq, &q) < 0 ||
        qview(so, "scale", NPY_FLOAT32, !dq, &s) < 0 ||
        quant_shape(x, q, s, bits, G, &c) < 0)
        return NULL;
    c.x64 = x64;
    pa_ssize bad = -1;
    int rc;
    const int nt = pa_get_num_threads();
    Py_BEGIN_ALLOW_THREADS
    rc = dq ? pa_dequantize(&c, nt) : pa_quantize(&c, nt, &bad);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_NoMemory();
    if (rc > 0) {
        PyErr_Format(PyExc_ValueError, "x holds NaN or infinity (row %zd of the rows along the axis); "
                     "a scale cannot hold it", (Py_ssize_t)bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *pa_py_quantize(PyObject *self, PyObject *args)
{
    (void)self;
    return quant_call(args, 0);
}

PyObject *pa_py_dequantize(PyObject *self, PyObject *args)
{
    (void)self;
    return quant_call(args, 1);
}

/* a float32 scale array as a view: 4-D here or nd-D in a call; its element
 * strides in st (nd of them) */
static int scale_view(PyObject *o, const char *name, int nd, int writeable, PyArrayObject **arr, pa_ssize *st)
{
    if (PyArray_API == NULL && _import_array() < 0) return -1;
    if (qview(o, name, NPY_FLOAT32, writeable, arr) < 0) return -1;
    if (PyArray_NDIM(*arr) != nd) {
        PyErr_Format(PyExc_ValueError, "%s must have %d dimensions, got %d", name, nd, PyArray_NDIM(*arr));
        return -1;
    }
    for (int d = 0; d < nd; d++) st[d] = (pa_ssize)(PyArray_STRIDES(*arr)[d] / 4);
    return 0;
}

/* the group size of D values with ng scales per row */
static int group_of(const char *name, pa_ssize D, pa_ssize ng, pa_ssize *G)
{
    if (ng < 1 || D % ng != 0) {
        PyErr_Format(PyExc_ValueError, "%s has %zd scales per row: it must divide the head dim %zd "
                     "(one scale per group of head_dim / groups values)", name, (Py_ssize_t)ng, (Py_ssize_t)D);
        return -1;
    }
    *G = D / ng;
    return 0;
}

int pa_append_scales(PyObject *o, int x, pa_ssize B, pa_ssize H, pa_ssize S, pa_ssize D, float **sc,
                     pa_ssize *st, pa_ssize *G)
{
    const char *name = x ? "v_scale" : "k_scale";
    PyArrayObject *a;
    if (o == Py_None) {
        PyErr_Format(PyExc_ValueError, "the %s cache is quantized: %s is required", x ? "value" : "key", name);
        return -1;
    }
    if (scale_view(o, name, 4, 1, &a, st) < 0) return -1;
    const npy_intp *sh = PyArray_DIMS(a);
    if (sh[0] != B || sh[1] != H || sh[2] != S) {
        PyErr_Format(PyExc_ValueError, "%s must be (B, H, S_max, groups) = (%zd, %zd, %zd, groups) as its "
                     "cache", name, (Py_ssize_t)B, (Py_ssize_t)H, (Py_ssize_t)S);
        return -1;
    }
    *sc = (float *)PyArray_BYTES(a);
    return group_of(name, D, (pa_ssize)sh[3], G);
}

/* one operand's scales: checks, then the operand of qs */
static int call_scales(PyObject *o, const char *name, const char *what, int dt, const pa_attn_call *c,
                       pa_ssize D, pa_ssize cs, pa_operand *op, pa_ssize *G)
{
    const int nb = c->bt.nb;
    op->p = NULL;
    *G = 1;
    if (!pa_qbits(dt)) {
        if (o != Py_None) {
            PyErr_Format(PyExc_ValueError, "%s is given but the %s is not int8 / int4 / fp8", name, what);
            return -1;
        }
        return 0;
    }
    if (o == Py_None) {
        PyErr_Format(PyExc_ValueError, "the %s is %s: %s (its float32 scales) is required", what,
                     pa_dtypes[dt].name, name);
        return -1;
    }
    if (cs != 1) {
        PyErr_Format(PyExc_ValueError, "a quantized %s must be contiguous along its rows", what);
        return -1;
    }
    PyArrayObject *a;
    pa_ssize st[PA_MAXDIMS];
    if (scale_view(o, name, nb + 2, 0, &a, st) < 0) return -1;
    for (int d = 0; d < nb; d++)
        if ((pa_ssize)PyArray_DIMS(a)[d] != c->bt.shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s must have the %s's leading axes", name, what);
            return -1;
        }
    if ((pa_ssize)PyArray_DIMS(a)[nb] != c->S || (PyArray_DIMS(a)[nb + 1] > 1 && st[nb + 1] != 1)) {
        PyErr_Format(PyExc_ValueError, "%s must be (..., S, groups) with S = %zd rows, contiguous groups",
                     name, (Py_ssize_t)c->S);
        return -1;
    }
    if (group_of(name, D, (pa_ssize)PyArray_DIMS(a)[nb + 1], G) < 0) return -1;
    op->p = PyArray_BYTES(a);
    for (int d = 0; d < nb; d++) op->bs[d] = st[d];
    op->rs = st[nb];
    op->cs = 1;
    return 0;
}

int pa_bind_kv_scales(PyObject *ks, PyObject *vs, pa_attn_call *c, int want_w, pa_cache *qs)
{
    /* a row of one stored element (int4 with head dim 2, int8 with 1): the
     * stride of a length-1 axis is no layout (NumPy broadcasts it as 0) */
    pa_operand *kv[2] = {&c->k, &c->v};
    const int dts[2] = {c->k_dt, c->v_dt};
    const pa_ssize Ds[2] = {c->E, c->Ev};
    for (int x = 0; x < 2; x++)
        if (pa_qbits(dts[x]) && (pa_qbits(dts[x]) == 4 ? (Ds[x] + 1) / 2 : Ds[x]) == 1) kv[x]->cs = 1;
    if (call_scales(ks, "k_scale", "key", c->k_dt, c, c->E, c->k.cs, &qs->ks, &qs->kG) < 0 ||
        call_scales(vs, "v_scale", "value", c->v_dt, c, c->Ev, c->v.cs, &qs->vs, &qs->vG) < 0)
        return -1;
    if (!qs->ks.p && !qs->vs.p) return 0;
    if (want_w || (c->bf16 && !qs->ks.p) ||
        c->E > PA_FLASH_MAXD || c->Ev > PA_FLASH_MAXD) {
        PyErr_Format(PyExc_ValueError, "int8 / int4 / fp8 caches do not take %s",
                     want_w ? "return_weights"
                     : c->bf16 ? "precision='bf16' without a quantized (int8 / int4 / fp8) key cache"
                               : "head dims over 512");
        return -1;
    }
    c->cache = qs;
    return 0;
}
