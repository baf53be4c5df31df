/*
 * bind_views.c -- the bindings' ndarray arguments as views (bind_views.h).
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim,
 * M, N, K matmul.
 */
#define PA_VIEWS_IMPORT 1       /* this file defines the NumPy table */
#include "bind_views.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/quant.h"   /* pa_qbits */
#include "bind_nd.h"     /* pa_nd_fp8 */

/* The kept memory of large outputs (pa_new_array_kept): a NumPy memory
 * handler whose freed blocks of PA_KEEP_MIN bytes or more wait, a few at a
 * time, for the next array of the same size. glibc hands a freed block of a
 * few MiB back to the OS when its trim threshold (twice the largest block
 * freed so far) is below what a call frees, so the next call's first writes
 * fault every page in again (the backward's three gradients: about 1,700
 * faults and 3 ms a call at L = 2048, H = 8, E = 64; benchmarks/
 * RESULTS_summary.md). Each block has a 64-byte header (its raw pointer and
 * size: NumPy's free is not trusted with the size); the arrays are ordinary
 * ndarrays that own their data. The slots: at most PA_KEEP_SLOTS blocks and
 * PA_KEEP_BYTES in all (the oldest freed first), under a spin lock (NumPy
 * frees with the GIL held; the lock makes no such assumption). */
#define PA_KEEP_MIN ((size_t)1 << 20)
#define PA_KEEP_SLOTS 8
#define PA_KEEP_BYTES ((size_t)64 << 20)

static atomic_flag keep_lock = ATOMIC_FLAG_INIT;
static void *keep_p[PA_KEEP_SLOTS];       /* blocks (user pointers), NULL: empty */
static unsigned long keep_age[PA_KEEP_SLOTS], keep_clock;
static size_t keep_total;
static PyObject *keep_capsule;            /* the handler, made once by pa_views_import */

static void keep_acquire(void)
{
    while (atomic_flag_test_and_set_explicit(&keep_lock, memory_order_acquire)) {}
}

static void keep_release(void)
{
    atomic_flag_clear_explicit(&keep_lock, memory_order_release);
}

static size_t keep_size(const void *p) { return ((const size_t *)p)[-2]; }

static void keep_free_raw(void *p)
{
    if (p) free(((void **)p)[-1]);
}

static void *keep_malloc(void *ctx, size_t n)
{
    (void)ctx;
    if (n >= PA_KEEP_MIN) {
        void *p = NULL;
        keep_acquire();
        for (int i = 0; i < PA_KEEP_SLOTS && !p; i++)
            if (keep_p[i] && keep_size(keep_p[i]) == n) {
                p = keep_p[i];
                keep_p[i] = NULL;
                keep_total -= n;
            }
        keep_release();
        if (p) return p;
    }
    if (n > SIZE_MAX - 128) return NULL;
    char *raw = (char *)malloc(n + 128);
    if (!raw) return NULL;
    uintptr_t a = ((uintptr_t)raw + 64 + 63) & ~(uintptr_t)63;   /* >= 2 words of header */
    ((void **)a)[-1] = raw;
    ((size_t *)a)[-2] = n;
    return (void *)a;
}

static void *keep_calloc(void *ctx, size_t m, size_t n)
{
    size_t b;
    if (!pa_mul_ok(m, n, &b)) return NULL;
    void *p = keep_malloc(ctx, b);
    if (p) memset(p, 0, b);
    return p;
}

static void keep_free(void *ctx, void *p, size_t n)
{
    (void)ctx; (void)n;                   /* the size: the header's */
    if (!p) return;
    const size_t sz = keep_size(p);
    if (sz < PA_KEEP_MIN || sz > PA_KEEP_BYTES) {
        keep_free_raw(p);
        return;
    }
    void *out[PA_KEEP_SLOTS + 1];
    int nout = 0;
    keep_acquire();
    for (;;) {                            /* room: the oldest out first */
        int empty = -1, old = -1;
        for (int i = 0; i < PA_KEEP_SLOTS; i++) {
            if (!keep_p[i]) { if (empty < 0) empty = i; continue; }
            if (old < 0 || keep_age[i] < keep_age[old]) old = i;
        }
        if (empty >= 0 && keep_total + sz <= PA_KEEP_BYTES) {
            keep_p[empty] = p;
            keep_age[empty] = ++keep_clock;
            keep_total += sz;
            break;
        }
        keep_total -= keep_size(keep_p[old]);
        out[nout++] = keep_p[old];
        keep_p[old] = NULL;
    }
    keep_release();
    for (int i = 0; i < nout; i++) keep_free_raw(out[i]);
}

static void *keep_realloc(void *ctx, void *p, size_t n)
{
    if (!p) return keep_malloc(ctx, n);
    void *q = keep_malloc(ctx, n);
    if (!q) return NULL;
    const size_t old = keep_size(p);
    memcpy(q, p, old < n ? old : n);
    keep_free(ctx, p, old);
    return q;
}

static PyDataMem_Handler keep_handler = {
    "pyattn_kept", 1, {NULL, keep_malloc, keep_calloc, keep_realloc, keep_free},
};

void pa_kept_release(void)
{
    void *out[PA_KEEP_SLOTS];
    keep_acquire();
    for (int i = 0; i < PA_KEEP_SLOTS; i++) {
        out[i] = keep_p[i];
        keep_p[i] = NULL;
    }
    keep_total = 0;
    keep_release();
    for (int i = 0; i < PA_KEEP_SLOTS; i++) keep_free_raw(out[i]);
}

int pa_views_import(void)
{
    import_array1(-1);
    keep_capsule = PyCapsule_New(&keep_handler, "mem_handler", NULL);
    if (!keep_capsule) return -1;
    return 0;
}

/* Validate obj as an ndarray the kernels can read (or write) in place. */
int pa_get_view(PyObject *obj, const char *name, int min_nd, int allow,
                    int writeable, pa_view *v)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    int tn = PyArray_TYPE(a);
    if (tn == NPY_FLOAT32) v->dtype = PA_F32;
    else if (tn == NPY_FLOAT64) v->dtype = PA_F64;
    else if (tn == NPY_BOOL && (allow & PA_ALLOW_BOOL)) v->dtype = PA_BOOL;
    else if (tn == NPY_HALF && (allow & PA_ALLOW_16)) v->dtype = PA_F16;
    else if (tn == NPY_UINT16 && (allow & PA_ALLOW_16)) v->dtype = PA_BF16;
    else if (tn == NPY_INT8 && (allow & PA_ALLOW_Q)) v->dtype = PA_I8;
    else if (tn == NPY_UINT8 && (allow & PA_ALLOW_Q)) v->dtype = PA_I4;
    else if ((allow & PA_ALLOW_Q) && pa_nd_fp8(obj) >= 0) v->dtype = pa_nd_fp8(obj);
    else {
        PyErr_Format(PyExc_TypeError, "%s must be float32 or float64%s", name,
                     (allow & PA_ALLOW_BOOL) ? " (or bool)" :
                     (allow & PA_ALLOW_16) ? " (or float16, or uint16 holding bfloat16 bits)" : "");
        return -1;
    }
    if (!PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be aligned and in native byte order", name);
        return -1;
    }
    int nd = PyArray_NDIM(a);
    if (nd < min_nd || nd > PA_MAXDIMS) {
        PyErr_Format(PyExc_ValueError, "%s must have between %d and %d dimensions, got %d",
                     name, min_nd, PA_MAXDIMS, nd);
        return -1;
    }
    if (writeable && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be writeable", name);
        return -1;
    }
    npy_intp is = PyArray_ITEMSIZE(a);
    v->arr = a;
    v->nd = nd;
    v->data = PyArray_BYTES(a);
    for (int d = 0; d < nd; d++) {
        npy_intp s = PyArray_STRIDES(a)[d];
        if (s % is != 0) {
            PyErr_Format(PyExc_ValueError, "%s has a stride that is not a multiple of its item size", name);
            return -1;
        }
        v->shape[d] = (pa_ssize)PyArray_DIMS(a)[d];
        v->st[d] = (pa_ssize)(s / is);
    }
    if (v->dtype == PA_I4) v->shape[nd - 1] *= 2;   /* values; strides stay in bytes */
    return 0;
}

/* The compute dtype of operands that may be stored in 16 bits: that of the
 * float32/float64 ones (which must agree), float32 when all are 16-bit;
 * 16-bit storage computes in float32 only. -1 with a TypeError set. */
int pa_compute_of(const pa_view *const *vs, int n, const char *names)
{
    int cd = -1, n16 = 0;
    for (int t = 0; t < n; t++) {
        const int d = vs[t]->dtype;
        if (d == PA_F16 || d == PA_BF16 || pa_qbits(d)) { n16++; continue; }
        if (cd >= 0 && cd != d) {
            PyErr_Format(PyExc_TypeError, "%s must have one compute dtype", names);
            return -1;
        }
        cd = d;
    }
    if (cd < 0) cd = PA_F32;
    if (n16 && cd != PA_F32) {
        PyErr_Format(PyExc_TypeError, "16-bit %s compute in float32: the others must be float32 "
                     "or 16-bit", names);
        return -1;
    }
    return cd;
}

/* Shape as a Python string, for messages. New reference. */
PyObject *pa_shape_str(const pa_view *v)
{
    PyObject *t = PyTuple_New(v->nd);
    if (!t) return NULL;
    for (int d = 0; d < v->nd; d++) {
        PyObject *n = PyLong_FromSsize_t(v->shape[d]);
        if (!n) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, d, n);
    }
    PyObject *s = PyObject_Str(t);
    Py_DECREF(t);
    return s;
}

int pa_shape_error(const char *name, const pa_view *a, const char *what, const pa_view *b)
{
    PyObject *sa = pa_shape_str(a), *sb = pa_shape_str(b);
    if (sa && sb)
        PyErr_Format(PyExc_ValueError, "%s has shape %U, which does not match %s of shape %U",
                     name, sa, what, sb);
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    return -1;
}

/* Leading nb axes of a and b must be equal (the Python layer broadcast them). */
int pa_same_batch(const pa_view *a, const char *an, const pa_view *b, const char *bn, int nb)
{
    if (b->nd != a->nd) return pa_shape_error(bn, b, an, a);
    for (int d = 0; d < nb; d++)
        if (a->shape[d] != b->shape[d]) return pa_shape_error(bn, b, an, a);
    return 0;
}

void pa_batch_of(const pa_view *v, int nb, pa_batch *bt)
{
    bt->nb = nb;
    bt->count = 1;
    for (int d = 0; d < nb; d++) {
        bt->shape[d] = v->shape[d];
        bt->count *= v->shape[d];   /* fits: it is part of an existing array's size */
    }
}

void pa_operand_of(const pa_view *v, int nb, pa_operand *o)
{
    o->p = v->data;
    for (int d = 0; d < nb; d++) o->bs[d] = v->st[d];
    o->rs = v->nd >= nb + 2 ? v->st[nb] : 0;
    o->cs = v->st[v->nd - 1];
}

/* New C-contiguous array of the given dtype; MemoryError when the byte size
 * does not fit in memory arithmetic, instead of a silent overflow. */
PyArrayObject *pa_new_array(int nd, const pa_ssize *shape, int dtype, const char *what)
{
    npy_intp dims[PA_MAXDIMS];
    size_t n = dtype == PA_F32 ? sizeof(float) : sizeof(double);
    for (int d = 0; d < nd; d++) {
        dims[d] = (npy_intp)shape[d];
        if (!pa_mul_ok(n, (size_t)shape[d], &n) || n > (size_t)PY_SSIZE_T_MAX) {
            PyErr_Format(PyExc_MemoryError, "the %s would need more than %zd bytes", what,
                         (Py_ssize_t)PY_SSIZE_T_MAX);
            return NULL;
        }
    }
    if (pa_alloc_fails()) {             /* the test hook (_alloc_hook) */
        PyErr_Format(PyExc_MemoryError, "the %s could not be allocated (test hook)", what);
        return NULL;
    }
    return (PyArrayObject *)PyArray_SimpleNew(nd, dims, dtype == PA_F32 ? NPY_FLOAT32 : NPY_FLOAT64);
}

/* pa_new_array with its data from the kept memory (keep_handler above) */
PyArrayObject *pa_new_array_kept(int nd, const pa_ssize *shape, int dtype, const char *what)
{
    PyObject *old = PyDataMem_SetHandler(keep_capsule);
    if (!old) return NULL;
    PyArrayObject *a = pa_new_array(nd, shape, dtype, what);
#if PY_VERSION_HEX >= 0x030C0000          /* its MemoryError kept aside while the handler goes back */
    PyObject *err = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
#endif
    PyObject *mine = PyDataMem_SetHandler(old);   /* back as it was */
    Py_DECREF(old);
    if (!mine) {
        Py_XDECREF(a);
        a = NULL;
    } else {
        Py_DECREF(mine);
    }
    if (a || !PyErr_Occurred()) {
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(err);
#else
        PyErr_Restore(et, ev, tb);
#endif
    } else {
#if PY_VERSION_HEX >= 0x030C0000
        Py_XDECREF(err);
#else
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
#endif
    }
    return a;
}

/* out: given (checked for exact shape and dtype, writeable) or allocated. */
PyArrayObject *pa_get_out(PyObject *out_obj, int nd, const pa_ssize *shape, int dtype,
                              pa_view *ov, const char *what)
{
    PyArrayObject *res;
    if (out_obj == NULL || out_obj == Py_None) {
        res = pa_new_array(nd, shape, dtype, what);
        if (!res) return NULL;
    } else {
        res = (PyArrayObject *)out_obj;
        Py_INCREF(res);
    }
    if (pa_get_view((PyObject *)res, "out", nd, 0, 1, ov) < 0) goto fail;
    int ok = ov->nd == nd && ov->dtype == dtype;
    for (int d = 0; ok && d < nd; d++) ok = ov->shape[d] == shape[d];
    if (!ok) {
        pa_view want = *ov;
        want.nd = nd;
        for (int d = 0; d < nd; d++) want.shape[d] = shape[d];
        PyObject *sw = pa_shape_str(&want), *so = pa_shape_str(ov);
        if (sw && so)
            PyErr_Format(PyExc_ValueError,
                         "out has shape %U and dtype %s, but the result has shape %U and dtype %s",
                         so, pa_dtype_name(ov->dtype), sw, pa_dtype_name(dtype));
        Py_XDECREF(sw);
        Py_XDECREF(so);
        goto fail;
    }
    return res;
fail:
    Py_XDECREF(res);
    return NULL;
}

/* mask: None, or an array of the compute dtype (additive) or bool, whose
 * shape equals want (the Python layer broadcast it). */
int pa_get_mask(PyObject *mo, const pa_view *like, int dtype, pa_view *m, int *kind)
{
    *kind = PA_MASK_NONE;
    if (mo == Py_None) return 0;
    if (pa_get_view(mo, "attn_mask", 1, PA_ALLOW_BOOL, 0, m) < 0) return -1;
    if (m->dtype != PA_BOOL && m->dtype != dtype) {
        PyErr_Format(PyExc_TypeError, "attn_mask must be bool or %s, got %s",
                     pa_dtype_name(dtype), pa_dtype_name(m->dtype));
        return -1;
    }
    int ok = m->nd == like->nd;
    for (int d = 0; ok && d < like->nd; d++) ok = m->shape[d] == like->shape[d];
    if (!ok) return pa_shape_error("attn_mask", m, "the scores", like);
    *kind = m->dtype == PA_BOOL ? PA_MASK_BOOL : PA_MASK_ADD;
    return 0;
}

int pa_check_causal(int causal)
{
    if (causal < PA_CAUSAL_NONE || causal > PA_CAUSAL_BOTTOM_RIGHT) {
        PyErr_Format(PyExc_ValueError, "is_causal code must be 0, 1 or 2, got %d", causal);
        return -1;
    }
    return 0;
}

/* A per-head value array of the attention binding: None, or a 1-D
 * C-contiguous array of npy_type with one entry per flat batch index. */
int pa_get_perbatch(PyObject *o, const char *name, int npy_type, pa_ssize count,
                        const void **ptr)
{
    *ptr = NULL;
    if (o == Py_None) return 0;
    if (!PyArray_Check(o) || PyArray_TYPE((PyArrayObject *)o) != npy_type ||
        PyArray_NDIM((PyArrayObject *)o) != 1 || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)o) ||
        !PyArray_ISNOTSWAPPED((PyArrayObject *)o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D contiguous %s array", name,
                     npy_type == NPY_INT64 ? "int64" : "float64");
        return -1;
    }
    if ((pa_ssize)PyArray_DIMS((PyArrayObject *)o)[0] != count) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries, expected one per batch-head (%zd)",
                     name, (Py_ssize_t)PyArray_DIMS((PyArrayObject *)o)[0], (Py_ssize_t)count);
        return -1;
    }
    *ptr = PyArray_DATA((PyArrayObject *)o);
    return 0;
}
