/*
 * module.c -- the CPython / NumPy binding of pyattn._C.
 *
 * Each entry point: parse -> convert (dtype, ndim, byte strides -> element
 * strides) -> validate shapes -> allocate the output -> release the GIL ->
 * call an op -> one fail: label. No arithmetic here.
 *
 * pyattn/_api.py does the user-facing work first (array-likes, dtype
 * promotion, broadcasting to stride-0 views, messages that name arguments);
 * the checks here repeat what the C code relies on, so that a direct call of
 * this private module can raise but never crash.
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim,
 * M, N, K matmul.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <numpy/arrayobject.h>

#include <math.h>
#include <string.h>

#if (defined(__linux__) || defined(__APPLE__)) && !defined(__STDC_NO_ATOMICS__)
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#else
#include <pthread.h>
#endif
#define PA_STOPPABLE 1
#endif

#include "pyattn.h"
#include "dispatch.h"
#include "threads.h"
#include "cpu.h"
#include "ops/ops.h"
#include "kernel_check.h"
#include "bind_paged.h"
#include "bind_quant.h"
#include "ops/quant.h"
#include "bind_blockmask.h"
#include "bind_rotary.h"
#include "bind_ukr.h"

#define PA_ALLOW_BOOL 1
#define PA_ALLOW_16 2 /* float16 arrays, and uint16 arrays holding bfloat16 bits */
#define PA_ALLOW_Q 4  /* int8 arrays, and uint8 arrays holding int4 pairs (quantized caches) */

typedef struct {
    PyArrayObject *arr;     /* borrowed */
    int nd;
    int dtype;              /* PA_F32, PA_F64 or PA_BOOL */
    pa_ssize shape[PA_MAXDIMS];
    pa_ssize st[PA_MAXDIMS];/* element strides */
    char *data;
} view;

/* The kernel family new calls use (dispatch.c chooses it; select_isa
 * changes it). Read and written with the GIL held only: each entry point
 * reads it once, before releasing the GIL, and hands it to its op, so a
 * call keeps its family even if another thread changes this meanwhile. */
static const pa_family *family = NULL;

static const char *dtype_name(int d)
{
    return pa_dtypes[d].name;
}

/* Validate obj as an ndarray the kernels can read (or write) in place. */
static int get_view(PyObject *obj, const char *name, int min_nd, int allow,
                    int writeable, view *v)
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
static int compute_of(const view *const *vs, int n, const char *names)
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

/* Threads for this call: a private nthreads argument in [1, PA_MAX_THREADS]
 * (pyattn.dask gives each task its share of a worker), else the pool's. */
static int call_threads(int req)
{
    return (req >= 1 && req <= PA_MAX_THREADS) ? req : pa_get_num_threads();
}

/* Shape as a Python string, for messages. New reference. */
static PyObject *shape_str(const view *v)
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

static int shape_error(const char *name, const view *a, const char *what, const view *b)
{
    PyObject *sa = shape_str(a), *sb = shape_str(b);
    if (sa && sb)
        PyErr_Format(PyExc_ValueError, "%s has shape %U, which does not match %s of shape %U",
                     name, sa, what, sb);
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    return -1;
}

/* Leading nb axes of a and b must be equal (the Python layer broadcast them). */
static int same_batch(const view *a, const char *an, const view *b, const char *bn, int nb)
{
    if (b->nd != a->nd) return shape_error(bn, b, an, a);
    for (int d = 0; d < nb; d++)
        if (a->shape[d] != b->shape[d]) return shape_error(bn, b, an, a);
    return 0;
}

static void batch_of(const view *v, int nb, pa_batch *bt)
{
    bt->nb = nb;
    bt->count = 1;
    for (int d = 0; d < nb; d++) {
        bt->shape[d] = v->shape[d];
        bt->count *= v->shape[d];   /* fits: it is part of an existing array's size */
    }
}

static void operand_of(const view *v, int nb, pa_operand *o)
{
    o->p = v->data;
    for (int d = 0; d < nb; d++) o->bs[d] = v->st[d];
    o->rs = v->nd >= nb + 2 ? v->st[nb] : 0;
    o->cs = v->st[v->nd - 1];
}

/* New C-contiguous array of the given dtype; MemoryError when the byte size
 * does not fit in memory arithmetic, instead of a silent overflow. */
static PyArrayObject *new_array(int nd, const pa_ssize *shape, int dtype, const char *what)
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

/* out: given (checked for exact shape and dtype, writeable) or allocated. */
static PyArrayObject *get_out(PyObject *out_obj, int nd, const pa_ssize *shape, int dtype,
                              view *ov, const char *what)
{
    PyArrayObject *res;
    if (out_obj == NULL || out_obj == Py_None) {
        res = new_array(nd, shape, dtype, what);
        if (!res) return NULL;
    } else {
        res = (PyArrayObject *)out_obj;
        Py_INCREF(res);
    }
    if (get_view((PyObject *)res, "out", nd, 0, 1, ov) < 0) goto fail;
    int ok = ov->nd == nd && ov->dtype == dtype;
    for (int d = 0; ok && d < nd; d++) ok = ov->shape[d] == shape[d];
    if (!ok) {
        view want = *ov;
        want.nd = nd;
        for (int d = 0; d < nd; d++) want.shape[d] = shape[d];
        PyObject *sw = shape_str(&want), *so = shape_str(ov);
        if (sw && so)
            PyErr_Format(PyExc_ValueError,
                         "out has shape %U and dtype %s, but the result has shape %U and dtype %s",
                         so, dtype_name(ov->dtype), sw, dtype_name(dtype));
        Py_XDECREF(sw);
        Py_XDECREF(so);
        goto fail;
    }
    return res;
fail:
    Py_XDECREF(res);
    return NULL;
}

/* ---- Ctrl-C: stopping a long call ----------------------------------------
 *
 * With the GIL released, Python's SIGINT handler only notes the signal; its
 * Python-level handler (KeyboardInterrupt) would run after the call. So a
 * call from the main thread (where Python runs signal handlers) puts
 * on_sigint in front of the handler in place, for the time the GIL is
 * released: it sets sigint_hit, which the op's threads see between tasks and
 * tiles (threads.h: pa_stop_set), and calls the previous handler, so
 * Python's own handling (its flag, set_wakeup_fd, a user's
 * signal.signal(SIGINT, ...)) still happens. Afterwards the previous
 * handler is put back and, if the signal came, PyErr_CheckSignals runs the
 * Python handlers: one that raises (KeyboardInterrupt) ends the call with
 * that exception and its outputs are discarded; one that returns lets the
 * call run again from the start (its outputs are incomplete), as if the
 * signal had arrived between two Python statements. Nothing is installed
 * when SIGINT is ignored or has its default action (the process ends), nor
 * off the main thread (those calls run to the end, as before). */
#ifdef PA_STOPPABLE
static pa_stop_flag sigint_hit;             /* the stop flag of main-thread calls */
static struct sigaction sigint_prev;        /* what on_sigint chains to */

static void on_sigint(int sig, siginfo_t *info, void *uc)
{
    const int saved = errno;
    atomic_store(&sigint_hit, 1);
    if (sigint_prev.sa_flags & SA_SIGINFO) sigint_prev.sa_sigaction(sig, info, uc);
    else if (sigint_prev.sa_handler != SIG_DFL && sigint_prev.sa_handler != SIG_IGN)
        sigint_prev.sa_handler(sig);
    errno = saved;
}

/* the thread Python runs signal handlers in: the process's first thread, in
 * the main interpreter */
static int on_main_thread(void)
{
#if defined(__linux__)
    if ((pid_t)syscall(SYS_gettid) != getpid()) return 0;
#else
    if (!pthread_main_np()) return 0;
#endif
    return PyInterpreterState_Get() == PyInterpreterState_Main();
}
#endif

typedef struct { int armed; } stop_scope;

/* Calls of fewer multiply-adds (or element steps) than this end within
 * milliseconds anyway (Python then handles the signal): they skip the four
 * system calls of arming, about a microsecond. */
#define PA_STOP_MIN_WORK 16777216.0

/* Before releasing the GIL: arm the SIGINT wrapper where it applies. */
static void stop_begin(stop_scope *s, double work)
{
    s->armed = 0;
    pa_stop_set(NULL);
#ifdef PA_STOPPABLE
    if (work < PA_STOP_MIN_WORK || !on_main_thread()) return;
    struct sigaction cur, ours;
    if (sigaction(SIGINT, NULL, &cur) != 0) return;
    if (cur.sa_flags & SA_SIGINFO) {
        if (cur.sa_sigaction == on_sigint) return;              /* never twice */
    } else if (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
        return;
    }
    sigint_prev = cur;
    ours = cur;                                  /* its mask and flags */
    ours.sa_flags |= SA_SIGINFO;
    ours.sa_sigaction = on_sigint;
    atomic_store(&sigint_hit, 0);
    if (sigaction(SIGINT, &ours, NULL) != 0) return;
    pa_stop_set(&sigint_hit);
    s->armed = 1;
#else
    (void)work;
#endif
}

/* After taking the GIL back: 0 the call ran through; 1 it was stopped and a
 * Python handler raised (the exception is set); 2 it was stopped and the
 * handlers returned: run the call again. */
static int stop_end(stop_scope *s)
{
    pa_stop_set(NULL);
#ifdef PA_STOPPABLE
    if (!s->armed) return 0;
    s->armed = 0;
    sigaction(SIGINT, &sigint_prev, NULL);
    if (!atomic_load(&sigint_hit)) return 0;
    return PyErr_CheckSignals() < 0 ? 1 : 2;
#else
    return 0;
#endif
}

/* Runs `call` (a statement that sets rc; about `work` multiply-adds)
 * without the GIL until it ends unstopped, `again` (a statement) before each
 * rerun; then jumps to fail when a SIGINT handler raised. */
#define PA_STOPPABLE_CALL(work, call, again)                                  \
    do {                                                                      \
        int st_;                                                              \
        for (;;) {                                                            \
            stop_scope sc_;                                                   \
            stop_begin(&sc_, (work));                                         \
            Py_BEGIN_ALLOW_THREADS                                            \
            call;                                                             \
            Py_END_ALLOW_THREADS                                              \
            st_ = stop_end(&sc_);                                             \
            if (st_ != 2) break;                                              \
            again;                                                            \
        }                                                                     \
        if (st_ == 1) goto fail;                                              \
    } while (0)

/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(matmul_doc,
"matmul(a, b, out=None, bias=None, nthreads=0, bf16=False) -> out\n\n"
"Private kernel entry: a (..., M, K) @ b (..., K, N) (+ bias (N,)) with equal\n"
"batch axes and dtypes. Use pyattn.matmul.");

static PyObject *py_matmul(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"a", "b", "out", "bias", "nthreads", "bf16", NULL};
    PyObject *ao, *bo, *outo = Py_None, *biaso = Py_None;
    PyArrayObject *res = NULL;
    view a, b, o, bias;
    int req_threads = 0, bf16 = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOip:matmul", kwlist, &ao, &bo, &outo, &biaso,
                                     &req_threads, &bf16))
        return NULL;
    if (get_view(ao, "a", 2, PA_ALLOW_16, 0, &a) < 0 || get_view(bo, "b", 2, PA_ALLOW_16, 0, &b) < 0)
        goto fail;
    const view *ab[2] = {&a, &b};
    const int cd = compute_of(ab, 2, "a and b");
    if (cd < 0) goto fail;
    if (bf16 && cd != PA_F32) {
        PyErr_SetString(PyExc_ValueError, "precision='bf16' needs float32 (or 16-bit) a and b, not float64");
        goto fail;
    }
    const int nd = a.nd, nb = nd - 2;
    if (same_batch(&a, "a", &b, "b", nb) < 0) goto fail;
    const pa_ssize M = a.shape[nd - 2], K = a.shape[nd - 1], N = b.shape[nd - 1];
    if (b.shape[nd - 2] != K) { shape_error("b", &b, "a", &a); goto fail; }
    const void *bias_p = NULL;
    pa_ssize bias_s = 0;
    if (biaso != Py_None) {
        if (get_view(biaso, "bias", 1, 0, 0, &bias) < 0) goto fail;
        if (bias.nd != 1 || bias.shape[0] != N || bias.dtype != cd) {
            PyErr_SetString(PyExc_ValueError, "bias must be 1-D with the compute dtype and length N");
            goto fail;
        }
        bias_p = bias.data;
        bias_s = bias.st[0];
    }
    pa_ssize oshape[PA_MAXDIMS];
    memcpy(oshape, a.shape, sizeof(pa_ssize) * (size_t)nd);
    oshape[nd - 1] = N;
    res = get_out(outo, nd, oshape, cd, &o, "matmul result");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand A, B, C;
    batch_of(&a, nb, &bt);
    operand_of(&a, nb, &A);
    operand_of(&b, nb, &B);
    operand_of(&o, nb, &C);
    const pa_matmul_call mm = {.dtype = cd, .a_dt = a.dtype, .b_dt = b.dtype, .bt = &bt, .M = M, .N = N,
                               .K = K, .A = &A, .B = &B, .C = &C, .bias = bias_p, .bias_s = bias_s,
                               .bf16 = bf16};
    int rc, nt = call_threads(req_threads);
    const pa_family *fam = family;
    PA_STOPPABLE_CALL((double)bt.count * (double)M * (double)N * (double)K,
                      rc = pa_matmul(fam, &mm, nt), (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    return (PyObject *)res;
fail:
    Py_XDECREF(res);
    return NULL;
}

/* mask: None, or an array of the compute dtype (additive) or bool, whose
 * shape equals want (the Python layer broadcast it). */
static int get_mask(PyObject *mo, const view *like, int dtype, view *m, int *kind)
{
    *kind = PA_MASK_NONE;
    if (mo == Py_None) return 0;
    if (get_view(mo, "attn_mask", 1, PA_ALLOW_BOOL, 0, m) < 0) return -1;
    if (m->dtype != PA_BOOL && m->dtype != dtype) {
        PyErr_Format(PyExc_TypeError, "attn_mask must be bool or %s, got %s",
                     dtype_name(dtype), dtype_name(m->dtype));
        return -1;
    }
    int ok = m->nd == like->nd;
    for (int d = 0; ok && d < like->nd; d++) ok = m->shape[d] == like->shape[d];
    if (!ok) return shape_error("attn_mask", m, "the scores", like);
    *kind = m->dtype == PA_BOOL ? PA_MASK_BOOL : PA_MASK_ADD;
    return 0;
}

static int check_causal(int causal)
{
    if (causal < PA_CAUSAL_NONE || causal > PA_CAUSAL_BOTTOM_RIGHT) {
        PyErr_Format(PyExc_ValueError, "is_causal code must be 0, 1 or 2, got %d", causal);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(softmax_doc,
"softmax(x, out=None, mask=None, causal=0, scale=1.0) -> out\n\n"
"Private kernel entry: softmax over the last axis of x, mask of x's shape.\n"
"Use pyattn.softmax.");

static PyObject *py_softmax(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "out", "mask", "causal", "scale", NULL};
    PyObject *xo, *outo = Py_None, *mo = Py_None;
    int causal = 0;
    double scale = 1.0;
    PyArrayObject *res = NULL;
    view x, o, m;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOid:softmax", kwlist, &xo, &outo, &mo, &causal, &scale))
        return NULL;
    if (get_view(xo, "x", 1, 0, 0, &x) < 0) goto fail;
    if (check_causal(causal) < 0) goto fail;
    if (causal && x.nd < 2) {
        PyErr_SetString(PyExc_ValueError, "is_causal needs x with at least 2 dimensions");
        goto fail;
    }
    if (get_mask(mo, &x, x.dtype, &m, &kind) < 0) goto fail;
    res = get_out(outo, x.nd, x.shape, x.dtype, &o, "softmax result");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand X, Mk, O;
    batch_of(&x, x.nd - 1, &bt);
    operand_of(&x, x.nd - 1, &X);
    operand_of(&o, x.nd - 1, &O);
    if (kind) operand_of(&m, x.nd - 1, &Mk);
    const pa_softmax_call sm = {.dtype = x.dtype, .bt = &bt, .S = x.shape[x.nd - 1], .x = &X,
                                .mask = kind ? &Mk : NULL, .out = &O, .mask_kind = kind,
                                .causal = causal, .scale = scale};
    int rc, nt = pa_get_num_threads();
    const pa_family *fam = family;
    PA_STOPPABLE_CALL(16.0 * (double)bt.count * (double)x.shape[x.nd - 1],
                      rc = pa_softmax(fam, &sm, nt), (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    return (PyObject *)res;
fail:
    Py_XDECREF(res);
    return NULL;
}

PyDoc_STRVAR(softmax_backward_doc,
"softmax_backward(grad_y, y, scale=1.0) -> grad_x\n\n"
"Private kernel entry: the softmax backward over the last axis, grad_y and y\n"
"of one dtype and shape. Use pyattn.softmax_backward.");

static PyObject *py_softmax_backward(PyObject *self, PyObject *args)
{
    PyObject *go, *yo;
    double scale = 1.0;
    PyArrayObject *res = NULL;
    view g, y, o;
    if (!PyArg_ParseTuple(args, "OO|d:softmax_backward", &go, &yo, &scale)) return NULL;
    if (get_view(go, "grad_y", 1, 0, 0, &g) < 0 || get_view(yo, "y", 1, 0, 0, &y) < 0) goto fail;
    if (g.dtype != y.dtype) {
        PyErr_SetString(PyExc_TypeError, "grad_y and y must have one dtype");
        goto fail;
    }
    if (same_batch(&y, "y", &g, "grad_y", y.nd) < 0) goto fail;
    res = get_out(Py_None, y.nd, y.shape, y.dtype, &o, "softmax gradient");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand G, Y, O;
    batch_of(&y, y.nd - 1, &bt);
    operand_of(&g, y.nd - 1, &G);
    operand_of(&y, y.nd - 1, &Y);
    operand_of(&o, y.nd - 1, &O);
    int rc, nt = pa_get_num_threads();
    PA_STOPPABLE_CALL(4.0 * (double)bt.count * (double)y.shape[y.nd - 1],
                      rc = pa_softmax_backward(y.dtype, &bt, y.shape[y.nd - 1], &G, &Y, scale, &O, nt),
                      (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    return (PyObject *)res;
fail:
    Py_XDECREF(res);
    return NULL;
}

/* A per-head value array of the attention binding: None, or a 1-D
 * C-contiguous array of npy_type with one entry per flat batch index. */
static int get_perbatch(PyObject *o, const char *name, int npy_type, pa_ssize count,
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

/* attention_with_kvcache's new rows: key / value (B, H, T, E / Ev), stored
 * as the caches are, copied into rows [pos[b], pos[b] + T) of k_cache /
 * v_cache (B, H, S_max, E / Ev) by pa_attention once everything the call
 * needs is allocated (opts.before), so a failing call writes nothing. */
typedef struct {
    char *cache[2];
    const char *rows[2];
    pa_ssize cst[2][4], rst[2][4];  /* element strides */
    pa_ssize B, H, T, D[2];
    size_t es[2];
    const int64_t *pos;
    int bits[2];                    /* 8 / 4: an int8 / int4 cache, its new rows float32 */
    float *sc[2];                   /* its scales (B, H, S_max, D / G) */
    pa_ssize sst[2][4], G[2];
    int rot, kdt;                   /* rotary: the keys (float32 / float64) rotated as written */
    pa_rope rope;                   /* into k_cache, stored as kdt (bind_rotary.h) */
} kv_append;

static void kv_append_run(void *ctx)
{
    const kv_append *a = (const kv_append *)ctx;
    for (int x = 0; x < 2; x++) {
        const pa_ssize es = (pa_ssize)a->es[x], D = a->D[x];
        const pa_ssize res = a->rot && x == 0 ? (pa_ssize)pa_elsize(a->rope.dt) : es;   /* the rows' */
        const pa_ssize *cs = a->cst[x], *rs = a->rst[x];
        for (pa_ssize b = 0; b < a->B; b++)
            for (pa_ssize h = 0; h < a->H; h++)
                for (pa_ssize t = 0; t < a->T; t++) {
                    const pa_ssize at = b * cs[0] + h * cs[1] + ((pa_ssize)a->pos[b] + t) * cs[2];
                    const char *src = a->rows[x] + (b * rs[0] + h * rs[1] + t * rs[2]) * res;
                    char *dst = a->cache[x] + (a->bits[x] ? at : at * es);
                    const int rot = a->rot && x == 0;
                    float tmp[PA_QROT_MAXD];
                    if (rot && a->bits[x])  /* rotated, then quantized */
                        pa_rope_row(&a->rope, (pa_ssize)a->pos[b] + t, src, PA_F32, rs[3], tmp, PA_F32, 1, D);
                    if (a->bits[x]) {       /* finite: get_append checked every row */
                        const pa_ssize *ss = a->sst[x];
                        float *srow = a->sc[x] + b * ss[0] + h * ss[1] + ((pa_ssize)a->pos[b] + t) * ss[2];
                        (void)pa_quant_row(a->bits[x], rot ? tmp : (const float *)src, rot ? 1 : rs[3], D,
                                           a->G[x], dst, cs[3], srow, ss[3]);
                    } else if (rot)
                        pa_rope_row(&a->rope, (pa_ssize)a->pos[b] + t, src, a->rope.dt, rs[3], dst, a->kdt, cs[3], D);
                    else if (cs[3] == 1 && rs[3] == 1)
                        memmove(dst, src, (size_t)(D * es));
                    else
                        for (pa_ssize e = 0; e < D; e++) memmove(dst + e * cs[3] * es, src + e * rs[3] * es, (size_t)es);
                }
    }
}

/* append = (k_cache, v_cache, key, value, positions (B,) int64[, k_scale,
 * v_scale][, rotary]): validated in full here, before the call allocates or
 * writes anything. rotary = (cos, sin, interleaved) (bind_rotary.h): key is
 * then of the compute dtype (float32 for 16-bit and quantized caches),
 * rotated at positions [pos[b], pos[b] + T) as it is written. */
/* append's cache x (k_cache / v_cache) and its new rows (key / value):
 * 4-D views *c, *r of dtypes that fit (a quantized cache takes float32
 * rows; with rotary the keys are of k_cache's compute dtype) */
static int append_operand(PyObject *o, int x, view *c, view *r, kv_append *ap)
{
    static const char *cn[2] = {"k_cache", "v_cache"}, *rn[2] = {"key", "value"};
    if (get_view(PyTuple_GET_ITEM(o, x), cn[x], 4, PA_ALLOW_16 | PA_ALLOW_Q, 1, c) < 0 ||
        get_view(PyTuple_GET_ITEM(o, 2 + x), rn[x], 4, PA_ALLOW_16, 0, r) < 0)
        return -1;
    if (c->nd != 4 || r->nd != 4) {
        PyErr_Format(PyExc_ValueError, "%s and %s must be 4-D", cn[x], rn[x]);
        return -1;
    }
    ap->bits[x] = pa_qbits(c->dtype);
    if (ap->bits[x]) {
        if (r->dtype != PA_F32) {
            PyErr_Format(PyExc_TypeError, "%s must be float32 for the %s cache %s (it is quantized "
                         "as it is written)", rn[x], dtype_name(c->dtype), cn[x]);
            return -1;
        }
    } else if (ap->rot && x == 0) {
        if (r->dtype != pa_dtypes[c->dtype].compute) {
            PyErr_Format(PyExc_TypeError, "key must be %s (k_cache's compute dtype) with rotary, got %s",
                         dtype_name(pa_dtypes[c->dtype].compute), dtype_name(r->dtype));
            return -1;
        }
    } else if (r->dtype != c->dtype) {
        PyErr_Format(PyExc_TypeError, "%s must be stored as %s is (%s), got %s", rn[x], cn[x],
                     dtype_name(c->dtype), dtype_name(r->dtype));
        return -1;
    }
    return 0;
}

static int get_append(PyObject *o, kv_append *ap)
{
    static const char *cn[2] = {"k_cache", "v_cache"}, *rn[2] = {"key", "value"};
    const Py_ssize_t na = PyTuple_Check(o) ? PyTuple_GET_SIZE(o) : 0;
    if (na < 5 || na > 8) {
        PyErr_SetString(PyExc_TypeError, "append must be (k_cache, v_cache, key, value, positions"
                                         "[, k_scale, v_scale][, rotary])");
        return -1;
    }
    ap->rot = na == 6 || na == 8;
    view c[2], r[2];
    for (int x = 0; x < 2; x++)
        if (append_operand(o, x, &c[x], &r[x], ap) < 0) return -1;
    const pa_ssize B = c[0].shape[0], H = c[0].shape[1], S = c[0].shape[2], T = r[0].shape[2];
    for (int x = 0; x < 2; x++) {
        if (c[x].shape[0] != B || c[x].shape[1] != H || c[x].shape[2] != S) {
            shape_error(cn[x], &c[x], "k_cache", &c[0]);
            return -1;
        }
        if (r[x].shape[0] != B || r[x].shape[1] != H || r[x].shape[2] != T || r[x].shape[3] != c[x].shape[3]) {
            shape_error(rn[x], &r[x], cn[x], &c[x]);
            return -1;
        }
        ap->cache[x] = c[x].data;
        ap->rows[x] = r[x].data;
        memcpy(ap->cst[x], c[x].st, sizeof(ap->cst[x]));
        memcpy(ap->rst[x], r[x].st, sizeof(ap->rst[x]));
        ap->D[x] = c[x].shape[3];
        ap->es[x] = pa_elsize(ap->bits[x] ? r[x].dtype : c[x].dtype);
        if (ap->bits[x] && pa_append_scales(na >= 7 ? PyTuple_GET_ITEM(o, 5 + x) : Py_None,
                                            x, B, H, S, ap->D[x], &ap->sc[x], ap->sst[x], &ap->G[x]) < 0)
            return -1;
    }
    const void *pp;
    if (get_perbatch(PyTuple_GET_ITEM(o, 4), "cache_seqlens", NPY_INT64, B, &pp) < 0) return -1;
    ap->pos = (const int64_t *)pp;
    for (pa_ssize b = 0; b < B; b++)       /* S - T: no sum that could wrap */
        if (T > S || ap->pos[b] < 0 || ap->pos[b] > (int64_t)(S - T)) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens + T exceeds the cache: entry %zd is %lld, "
                         "T = %zd, S_max = %zd; nothing was written", (Py_ssize_t)b,
                         (long long)ap->pos[b], (Py_ssize_t)T, (Py_ssize_t)S);
            return -1;
        }
    ap->B = B; ap->H = H; ap->T = T;
    if (ap->rot) {                      /* the tables, every new row's position in them */
        ap->kdt = c[0].dtype;
        if (pa_bind_rope(PyTuple_GET_ITEM(o, na - 1), pa_dtypes[c[0].dtype].compute, c[0].shape[3], &ap->rope) < 0)
            return -1;
        if (ap->bits[0] && ap->D[0] > PA_QROT_MAXD) {
            PyErr_Format(PyExc_ValueError, "rotary with a quantized k_cache takes head dims up to %d, got %zd",
                         PA_QROT_MAXD, (Py_ssize_t)ap->D[0]);
            return -1;
        }
        for (pa_ssize b = 0; b < B; b++)
            if (pa_rope_check_rows(&ap->rope, b, ap->pos[b], T) < 0) return -1;
    }
    for (int x = 0; x < 2; x++) {       /* quantized: every new row finite, before anything is written */
        const pa_ssize shape[3] = {B, H, T};
        pa_ssize at[3];
        if (ap->bits[x] && !pa_quant_rows_finite((const float *)ap->rows[x], ap->rst[x], shape, ap->D[x],
                                                 ap->rot && x == 0 ? &ap->rope : NULL, ap->pos, at)) {
            PyErr_Format(PyExc_ValueError, "%s holds NaN or infinity (batch %zd, head %zd, row %zd): the %s "
                         "cache's scales cannot hold it; nothing was written", rn[x], (Py_ssize_t)at[0],
                         (Py_ssize_t)at[1], (Py_ssize_t)at[2], dtype_name(c[x].dtype));
            return -1;
        }
    }
    return 0;
}

/* An attention call as the entries' keywords give it (the forward's and
 * the backward's share these: pyattn/_spec.py's AttnSpec.c_kwargs), before
 * attn_call_of converts it. */
typedef struct {
    PyObject *q, *k, *v, *mask, *slopes, *sinks, *kv_len, *qoff;
    int allow;                  /* get_view's allow for q, k, v */
    int causal, bf16, want_w;
    double scale, dropout_p, softcap;
    unsigned long long key;
    Py_ssize_t left, right, row_div;
    PyObject *cuq, *cuk;        /* packed sequences' offsets (varlen), or None */
    PyObject *k_scale, *v_scale;    /* a quantized cache's scales, or None */
    pa_kv_scales *qsc;              /* where attn_call_of puts them (NULL: not accepted) */
    int paged;                      /* a paged cache: cu_seqlens_q alone (ops/paged_packed.c) */
    int seq_align;                  /* varlen: each sequence bottom-right aligned (align=) */
} call_args;

static void call_args_init(call_args *a, int allow)
{
    memset(a, 0, sizeof *a);
    a->mask = a->slopes = a->sinks = a->kv_len = a->qoff = a->k_scale = a->v_scale = Py_None;
    a->allow = allow;
    a->scale = 1.0;
    a->left = a->right = -1;
    a->row_div = 1;
    a->cuq = a->cuk = Py_None;
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
static int get_cu(const call_args *a, pa_attn_call *c)
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
static int get_qoff(const call_args *a, pa_attn_call *c)
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
static int check_scalars(const call_args *a, int cd)
{
    if (check_causal(a->causal) < 0) return -1;
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
static int get_perhead(const call_args *a, pa_attn_call *c)
{
    const void *pp;
    const pa_ssize ns = c->cu_seqlens_q ? c->nseq : 1;     /* varlen: one row per sequence */
    if (get_perbatch(a->slopes, "alibi_slopes", NPY_FLOAT64, c->bt.count * ns, &pp) < 0) return -1;
    c->slopes = (const double *)pp;
    if (get_perbatch(a->sinks, "sinks", NPY_FLOAT64, c->bt.count, &pp) < 0) return -1;
    c->sinks = (const double *)pp;
    if (get_perbatch(a->kv_len, "cache_seqlens", NPY_INT64, c->bt.count * ns, &pp) < 0) return -1;
    c->kv_len = (const int64_t *)pp;
    for (pa_ssize b = 0; c->kv_len && b < c->bt.count * ns; b++)
        if (c->kv_len[b] < 0 || c->kv_len[b] > (int64_t)c->S) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens must be in [0, %zd]", (Py_ssize_t)c->S);
            return -1;
        }
    return 0;
}

/* THE converter of an attention call, shared by the forward and the
 * backward: checks q, k, v (views left in qkv[0..3) for the entry's own
 * checks), the mask and every option, and fills *c but for the results
 * and the entry's own operands. -1 with an exception set. */
static int attn_call_of(const call_args *a, pa_attn_call *c, view *qkv)
{
    view *q = &qkv[0], *k = &qkv[1], *v = &qkv[2], m, scores;
    memset(c, 0, sizeof *c);
    if (get_view(a->q, "query", 2, a->allow, 0, q) < 0 || get_view(a->k, "key", 2, a->allow, 0, k) < 0 ||
        get_view(a->v, "value", 2, a->allow, 0, v) < 0)
        return -1;
    const view *vs[3] = {q, k, v};
    const int cd = compute_of(vs, 3, "query, key and value");
    if (cd < 0 || check_scalars(a, cd) < 0) return -1;
    const int nd = q->nd, nb = nd - 2;
    if (same_batch(q, "query", k, "key", nb) < 0 || same_batch(q, "query", v, "value", nb) < 0) return -1;
    const pa_ssize L = q->shape[nd - 2], E = q->shape[nd - 1];
    if (a->row_div < 1 || (L % a->row_div != 0 && !(a->paged && a->cuq != Py_None)) || (a->row_div > 1 && (a->want_w || a->mask != Py_None))) {
        PyErr_SetString(PyExc_ValueError, "row_div must be >= 1 and divide L (and excludes masks "
                                          "and weights)");
        return -1;
    }
    const pa_ssize S = k->shape[nd - 2], Ev = v->shape[nd - 1];
    if (k->shape[nd - 1] != E) return shape_error("key", k, "query", q);
    if (v->shape[nd - 2] != S) return shape_error("value", v, "key", k);
    scores = *q;
    scores.shape[nd - 1] = S;
    if (get_mask(a->mask, &scores, cd, &m, &c->mask_kind) < 0) return -1;
    c->dtype = cd;
    batch_of(q, nb, &c->bt);
    c->L = L; c->S = S; c->E = E; c->Ev = Ev;
    operand_of(q, nb, &c->q);
    operand_of(k, nb, &c->k);
    operand_of(v, nb, &c->v);
    c->q_dt = q->dtype; c->k_dt = k->dtype; c->v_dt = v->dtype;
    if (c->mask_kind) operand_of(&m, nb, &c->mask);
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
    if (a->qsc && pa_bind_kv_scales(a->k_scale, a->v_scale, c, a->want_w, a->qsc) < 0) return -1;
    return get_perhead(a, c);
}

PyDoc_STRVAR(sdpa_doc,
"sdpa(q, k, v, out=None, mask=None, causal=0, scale=1.0, dropout_p=0.0,\n"
"     dropout_key=0, want_weights=False, want_lse=False, left=-1, right=-1,\n"
"     softcap=0.0, slopes=None, sinks=None, kv_len=None, row_div=1, qoff=None,\n"
"     nthreads=0, bf16=False, append=None, cu_seqlens_q=None, cu_seqlens_k=None, paged=None,\n"
"     k_scale=None, v_scale=None, seq_align=False)\n"
"     -> (out, weights or None, lse or None)\n\n"
"Private kernel entry: fused attention, all operands with equal batch axes;\n"
"slopes, sinks (float64) and kv_len (int64) hold one value per flat batch\n"
"index; append = (k_cache, v_cache, key, value, positions): new cache rows\n"
"written once everything is checked and allocated (quantized caches: 7\n"
"entries, + k_scale, v_scale of the caches; float32 rows quantized as\n"
"written); k_scale, v_scale: float32 scales of int8 / int4 (uint8) k, v;\n"
"paged = (k_pool, v_pool, block_table): a paged cache (bind_paged.c; append\n"
"then (key, value, positions)); quantized pools: + (k_scale_pool, v_scale_pool),\n"
"k_scale / v_scale then stand-ins of the call's shape. Use\n"
"pyattn.scaled_dot_product_attention.");

static PyObject *py_sdpa(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"q", "k", "v", "out", "mask", "causal", "scale", "dropout_p",
                             "dropout_key", "want_weights", "want_lse", "left", "right",
                             "softcap", "slopes", "sinks", "kv_len", "row_div", "qoff", "nthreads",
                             "bf16", "append", "cu_seqlens_q", "cu_seqlens_k", "paged", "k_scale", "v_scale",
                             "block_mask", "seq_align", NULL};
    call_args a;
    pa_kv_scales qsc;
    call_args_init(&a, PA_ALLOW_16 | PA_ALLOW_Q);
    a.qsc = &qsc;
    PyObject *outo = Py_None, *appo = Py_None, *pago = Py_None, *bmo = Py_None;
    pa_bm_arg bma = {.nbuf = 0};
    int req_threads = 0, want_lse = 0;
    kv_append ap;
    pa_paged pg;
    pa_paged_append pap;
    pa_attn_call c;
    view qkv[3], o, w, lv;
    PyArrayObject *res = NULL, *wres = NULL, *lres = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOiddKppnndOOOnOipOOOOOOOp:sdpa", kwlist, &a.q, &a.k, &a.v,
                                     &outo, &a.mask, &a.causal, &a.scale, &a.dropout_p, &a.key,
                                     &a.want_w, &want_lse, &a.left, &a.right, &a.softcap, &a.slopes,
                                     &a.sinks, &a.kv_len, &a.row_div, &a.qoff, &req_threads, &a.bf16,
                                     &appo, &a.cuq, &a.cuk, &pago, &a.k_scale, &a.v_scale, &bmo, &a.seq_align))
        return NULL;
    a.paged = pago != Py_None;
    if (attn_call_of(&a, &c, qkv) < 0) goto fail;
    if (((appo != Py_None && pago == Py_None) || c.kv_scales || (bmo != Py_None && pago != Py_None)) &&
        c.cu_seqlens_q) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens exclude append (but for a paged cache), quantized caches "
                        "and block_mask with a paged cache");
        goto fail;
    }
    if (pa_bm_get(bmo, &c, &bma) < 0) goto fail;
    if (pago != Py_None) {              /* a paged cache (bind_paged.c), checked in full */
        if (pa_bind_paged(pago, appo, &c, &pg, &pap) < 0) goto fail;
    } else if (appo != Py_None) {       /* checked in full before anything is allocated */
        if (get_append(appo, &ap) < 0) goto fail;
        c.before = kv_append_run;
        c.before_ctx = &ap;
    }
    const int nd = qkv[0].nd, nb = nd - 2;
    pa_ssize shape[PA_MAXDIMS];         /* every check is done: allocate, then write */
    memcpy(shape, qkv[0].shape, sizeof(pa_ssize) * (size_t)nd);
    shape[nd - 1] = c.Ev;
    res = get_out(outo, nd, shape, c.dtype, &o, "attention output");
    if (!res) goto fail;
    operand_of(&o, nb, &c.out);
    if (a.want_w) {
        shape[nd - 1] = c.S;
        wres = get_out(Py_None, nd, shape, c.dtype, &w, "attention weights");
        if (!wres) goto fail;
        operand_of(&w, nb, &c.w);
        c.has_w = 1;
    }
    if (want_lse) {
        lres = get_out(Py_None, nb + 1, shape, c.dtype, &lv, "log-sum-exp");
        if (!lres) goto fail;
        operand_of(&lv, nb, &c.lse);
        c.has_lse = 1;
    }
    int rc, nt = call_threads(req_threads);
    const pa_family *fam = family;
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
    PyArrayObject *a = new_array(nd, shape, dtype, what);
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
 * held; a varlen call's: zeros (new_zeros_of) */
static PyArrayObject *new_grad_of(int nd, const pa_ssize *shape, int dtype, const char *what, int rows_first)
{
    return rows_first ? new_zeros_of(nd, shape, dtype, what, 1) : new_array(nd, shape, dtype, what);
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
static int get_bwd_inputs(PyObject *const *objs, const view *qkv, pa_attn_call *c, pa_attn_grads *g)
{
    view o, go, lv;
    const view *q = &qkv[0], *v = &qkv[2];
    if (get_view(objs[0], "out", 2, 0, 0, &o) < 0 || get_view(objs[1], "grad_out", 2, 0, 0, &go) < 0 ||
        get_view(objs[2], "lse", 1, 0, 0, &lv) < 0)
        return -1;
    const int cd = c->dtype, nd = q->nd, nb = nd - 2;
    if (qkv[1].dtype != cd || v->dtype != cd || o.dtype != cd || go.dtype != cd || lv.dtype != cd) {
        PyErr_SetString(PyExc_TypeError, "query, key, value, out, grad_out and lse must have one dtype");
        return -1;
    }
    if (same_batch(q, "query", &o, "out", nb) < 0 || same_batch(q, "query", &go, "grad_out", nb) < 0)
        return -1;
    if (o.shape[nd - 2] != c->L || o.shape[nd - 1] != c->Ev) return shape_error("out", &o, "value", v);
    if (go.shape[nd - 2] != c->L || go.shape[nd - 1] != c->Ev) return shape_error("grad_out", &go, "out", &o);
    int lok = lv.nd == nb + 1;
    for (int d = 0; lok && d <= nb; d++) lok = lv.shape[d] == q->shape[d];
    if (!lok) return shape_error("lse", &lv, "query", q);
    operand_of(&o, nb, &c->out);
    operand_of(&lv, nb, &c->lse);
    c->has_lse = 1;
    operand_of(&go, nb, &g->go);
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

PyDoc_STRVAR(sdpa_backward_doc,
"sdpa_backward(q, k, v, o, go, lse, mask=None, causal=0, scale=1.0, dropout_p=0.0,\n"
"              dropout_key=0, left=-1, right=-1, softcap=0.0, slopes=None, sinks=None,\n"
"              reduce=(), nthreads=0, cu_seqlens_q=None, cu_seqlens_k=None, qoff=None,\n"
"              seq_align=False)\n"
"              -> (dq, dk, dv, dsinks or None)\n\n"
"Private kernel entry: the attention backward, every operand of one compute\n"
"dtype with equal batch axes; reduce flags the batch axes that key and value\n"
"broadcast over (dk, dv get extent 1 there, summed). dsinks: one value per\n"
"flat batch index. Use pyattn.scaled_dot_product_attention_backward.");

static PyObject *py_sdpa_backward(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"q", "k", "v", "o", "go", "lse", "mask", "causal", "scale",
                             "dropout_p", "dropout_key", "left", "right", "softcap", "slopes",
                             "sinks", "reduce", "nthreads", "cu_seqlens_q", "cu_seqlens_k", "qoff", "block_mask", "seq_align",
                             NULL};
    call_args a;
    call_args_init(&a, 0);
    PyObject *io[3], *redo = NULL, *bmo = Py_None;
    pa_bm_arg bma = {.nbuf = 0};
    int req_threads = 0, reduce[PA_MAXDIMS];
    pa_attn_call c;
    pa_attn_grads g;
    view qkv[3], dqv, dkv, dvv;
    PyArrayObject *dq = NULL, *dk = NULL, *dv = NULL, *ds = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|OiddKnndOOOiOOOOp:sdpa_backward", kwlist, &a.q, &a.k,
                                     &a.v, &io[0], &io[1], &io[2], &a.mask, &a.causal, &a.scale,
                                     &a.dropout_p, &a.key, &a.left, &a.right, &a.softcap, &a.slopes,
                                     &a.sinks, &redo, &req_threads, &a.cuq, &a.cuk, &a.qoff, &bmo, &a.seq_align))
        return NULL;
    memset(&g, 0, sizeof g);
    if (attn_call_of(&a, &c, qkv) < 0 || get_bwd_inputs(io, qkv, &c, &g) < 0 || pa_bm_get(bmo, &c, &bma) < 0)
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
    if (get_view((PyObject *)dq, "dq", nd, 0, 1, &dqv) < 0 || get_view((PyObject *)dk, "dk", nd, 0, 1, &dkv) < 0 ||
        get_view((PyObject *)dv, "dv", nd, 0, 1, &dvv) < 0)
        goto fail;
    for (int d = 0; d < nb; d++)
        if (reduce[d]) dkv.st[d] = dvv.st[d] = 0;
    operand_of(&dqv, nb, &g.dq);
    operand_of(&dkv, nb, &g.dk);
    operand_of(&dvv, nb, &g.dv);
    g.reduce = reduce;
    g.dsinks = ds ? (double *)PyArray_DATA(ds) : NULL;
    g.zero = !tm;
    int rc, nt = call_threads(req_threads);
    const pa_family *fam = family;
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

PyDoc_STRVAR(merge_doc,
"merge(outs, lses, nthreads=0) -> (out, lse)\n\n"
"Private kernel entry: outs (P, ..., L, Ev) and lses (P, ..., L) of one\n"
"dtype with equal axes. Use pyattn.merge_attention.");

static PyObject *py_merge(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"outs", "lses", "nthreads", NULL};
    PyObject *oo, *lo;
    PyArrayObject *res = NULL, *lres = NULL;
    view os, ls, o, l;
    int req_threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|i:merge", kwlist, &oo, &lo, &req_threads)) return NULL;
    if (get_view(oo, "outputs", 3, 0, 0, &os) < 0 || get_view(lo, "lses", 2, 0, 0, &ls) < 0)
        goto fail;
    if (os.dtype != ls.dtype) {
        PyErr_SetString(PyExc_TypeError, "outputs and lses must have one dtype");
        goto fail;
    }
    const int nd = os.nd, nb = nd - 3;     /* (P, batch..., L, Ev) */
    int ok = ls.nd == nd - 1;
    for (int d = 0; ok && d < nd - 1; d++) ok = ls.shape[d] == os.shape[d];
    if (!ok) { shape_error("lses", &ls, "outputs", &os); goto fail; }
    const pa_ssize P = os.shape[0], L = os.shape[nd - 2], Ev = os.shape[nd - 1];
    res = get_out(Py_None, nd - 1, os.shape + 1, os.dtype, &o, "merged output");
    if (!res) goto fail;
    lres = get_out(Py_None, nd - 2, os.shape + 1, os.dtype, &l, "merged log-sum-exp");
    if (!lres) goto fail;
    /* views without the P axis: batch strides of the parts */
    view os1 = os, ls1 = ls;
    os1.nd = nd - 1; ls1.nd = nd - 2;
    memmove(os1.shape, os.shape + 1, sizeof(pa_ssize) * (size_t)(nd - 1));
    memmove(os1.st, os.st + 1, sizeof(pa_ssize) * (size_t)(nd - 1));
    memmove(ls1.shape, ls.shape + 1, sizeof(pa_ssize) * (size_t)(nd - 2));
    memmove(ls1.st, ls.st + 1, sizeof(pa_ssize) * (size_t)(nd - 2));
    pa_batch bt;
    pa_operand Os, Ls, O, Lo;
    batch_of(&o, nb, &bt);
    operand_of(&os1, nb, &Os);
    operand_of(&ls1, nb, &Ls);
    operand_of(&o, nb, &O);
    operand_of(&l, nb, &Lo);
    const pa_merge_call mg = {.dtype = os.dtype, .bt = &bt, .P = P, .L = L, .Ev = Ev, .outs = &Os,
                              .lses = &Ls, .out = &O, .lse = &Lo, .outs_ps = os.st[0],
                              .lses_ps = ls.st[0]};
    int nt = call_threads(req_threads);
    Py_BEGIN_ALLOW_THREADS
    pa_merge(&mg, nt);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(NN)", res, lres);
fail:
    Py_XDECREF(res);
    Py_XDECREF(lres);
    return NULL;
}

/* ------------------------------------------------------------------------ */

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > PA_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "n must be between 1 and %d, got %ld", PA_MAX_THREADS, n);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS   /* may wait for a running call to finish */
    rc = pa_set_num_threads((int)n);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(PyExc_RuntimeError, "threads could not be started");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(pa_get_num_threads());
}

static PyObject *py_select_isa(PyObject *self, PyObject *arg)
{
    long req = PyLong_AsLong(arg);
    if (req == -1 && PyErr_Occurred()) return NULL;
    if (req < -1 || req >= PA_ISA_COUNT) {
        PyErr_Format(PyExc_ValueError, "isa code must be -1 to %d", PA_ISA_COUNT - 1);
        return NULL;
    }
    family = pa_choose_family((int)req);      /* running calls keep theirs */
    return PyLong_FromLong(family->isa);
}

/* The names of every kernel of family f, in the order of PA_KERNEL_KINDS
 * (registry.h) and of the dtype codes, then its bfloat16 GEMM: each name is
 * the kernel's C symbol. */
static int add_name(PyObject *list, const char *name)
{
    if (!name) return 0;
    PyObject *s = PyUnicode_FromString(name);
    if (!s) return -1;
    const int rc = PyList_Append(list, s);
    Py_DECREF(s);
    return rc;
}

static PyObject *kernel_names(const pa_family *f)
{
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
#define PA_NAMES_KIND(kind, shape, ret, params, ...) PA_REG_CAT(PA_NAMES_, shape)(kind)
#define PA_NAMES_N(kind, n)                                                   \
    for (int d = 0; d < (n); d++)                                             \
        if (add_name(l, f->kind[d].name) < 0) goto fail;
#define PA_NAMES_G(kind) PA_NAMES_N(kind, PA_NCOMPUTE)
#define PA_NAMES_C(kind) PA_NAMES_N(kind, PA_NCOMPUTE)
#define PA_NAMES_S(kind) PA_NAMES_N(kind, PA_NDTYPES)
#define PA_NAMES_W(kind) PA_NAMES_N(kind, PA_NDTYPES)
#define PA_NAMES_F(kind) if (add_name(l, f->kind.name) < 0) goto fail;
    PA_KERNEL_KINDS(PA_NAMES_KIND, _)
#undef PA_NAMES_KIND
#undef PA_NAMES_N
#undef PA_NAMES_G
#undef PA_NAMES_C
#undef PA_NAMES_S
#undef PA_NAMES_W
#undef PA_NAMES_F
    if (add_name(l, f->gemm_bf16.name) < 0) goto fail;
    return l;
fail:
    Py_DECREF(l);
    return NULL;
}

static PyObject *py_config(PyObject *self, PyObject *unused)
{
    const pa_family *f = family;
#if defined(__clang__)
    const char *cc = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *cc = "gcc " __VERSION__;
#elif defined(_MSC_VER)
    const char *cc = "msvc";
#else
    const char *cc = "unknown";
#endif
    size_t l1d, l2, l3;
    pa_cache_sizes(&l1d, &l2, &l3);
    const pa_gemm_kernel b32 = pa_gemm_blocked(&f->gemm[PA_F32], pa_elsize(PA_F32)),
                         b64 = pa_gemm_blocked(&f->gemm[PA_F64], pa_elsize(PA_F64));
    const pa_gemm_kernel *g32 = &b32, *g64 = &b64;   /* as pa_matmul blocks them here */
    char gnote[160];
    pa_gemm_blocking_note(gnote, sizeof gnote);
    char attn32[64], attn64[64];
    snprintf(attn32, sizeof attn32, "pyattn_attn_f32_flash_%dx%d", f->attn_bq[PA_F32], PA_FLASH_BK);
    snprintf(attn64, sizeof attn64, "pyattn_attn_f64_flash_%dx%d", f->attn_bq[PA_F64], PA_FLASH_BK);
    PyObject *kernels = kernel_names(f);
    if (!kernels) return NULL;
    return Py_BuildValue(
        "{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:n,s:n,s:n,"
        "s:(iiiii),s:(iiiii),s:(ii),s:(ii),s:N,s:s}",
        "isa", pa_isa_name(f->isa), "isa_machine", pa_isa_name(pa_isa_machine()),
        "gemm_f32", g32->name, "gemm_f64", g64->name, "gemm_bf16", f->gemm_bf16.name,
        "attn_f32", attn32, "attn_f64", attn64,
        "tilesm_f32", f->tilesm[PA_F32].name, "tilesm_f64", f->tilesm[PA_F64].name,
        "backward_f32", f->tilep[PA_F32].name, "backward_ds_f32", f->tileds[PA_F32].name,
        "softmax_f32", f->softmax[PA_F32].name, "softmax_f64", f->softmax[PA_F64].name,
        "compiler", cc, "threads", pa_get_num_threads(), "max_threads", PA_MAX_THREADS,
        "l1d_bytes", (Py_ssize_t)l1d, "l2_bytes", (Py_ssize_t)l2, "l3_bytes", (Py_ssize_t)l3,
        "gemm_f32_blocking", g32->mr, g32->nr, g32->kc, g32->mc, g32->nc,
        "gemm_f64_blocking", g64->mr, g64->nr, g64->kc, g64->mc, g64->nc,
        "attn_f32_tile", f->attn_bq[PA_F32], PA_FLASH_BK,
        "attn_f64_tile", f->attn_bq[PA_F64], PA_FLASH_BK,
        "kernels", kernels, "gemm_blocking_from", gnote);
}

/* families() -> ((word, code, built), ...): the rows of PA_FAMILIES
 * (registry.h) in code order; built: this build has the family (its
 * architecture's). pyattn reads PYATTN_ISA's words from it, CI the
 * families it runs the tests on. */
static PyObject *py_families(PyObject *self, PyObject *unused)
{
    PyObject *t = PyTuple_New(PA_ISA_COUNT);
    if (!t) return NULL;
    for (int i = 0; i < PA_ISA_COUNT; i++) {
        PyObject *row = Py_BuildValue("(siO)", pa_isa_name(i), i, pa_isa_built(i) ? Py_True : Py_False);
        if (!row) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, row);
    }
    return t;
}

/* fma_probe(iters) -> flops: the benchmark's peak probe (time it around), at
 * the float32 vector width of the family in use (16 lanes on avx512, 8 on
 * avx2 and avx512emu, 4 on neon). None for the generic family. */
/* A peak probe of the current family (NULL: None): iters >= 0 rounds. */
static PyObject *run_probe(PyObject *arg, pa_fma_probe_fn probe)
{
    long long iters = PyLong_AsLongLong(arg);
    if (iters == -1 && PyErr_Occurred()) return NULL;
    if (iters < 0) {
        PyErr_SetString(PyExc_ValueError, "iters must be >= 0");
        return NULL;
    }
    if (!probe) Py_RETURN_NONE;
    double flops;
    float sink;
    Py_BEGIN_ALLOW_THREADS
    flops = probe(iters, &sink);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(flops + 0.0 * (double)sink);
}

static PyObject *py_bf16_probe(PyObject *self, PyObject *arg)
{
    return run_probe(arg, family->bf16_probe);
}

static PyObject *py_fma_probe(PyObject *self, PyObject *arg)
{
    return run_probe(arg, family->fma_probe);
}

/* gemm_probe(dtype, kc, iters) -> flops: the GEMM micro-kernel in use, alone
 * on L1-resident panels (pa_gemm_probe); time it around. */
static PyObject *py_gemm_probe(PyObject *self, PyObject *args)
{
    const char *dt;
    Py_ssize_t kc;
    long long iters;
    if (!PyArg_ParseTuple(args, "snL:gemm_probe", &dt, &kc, &iters)) return NULL;
    int dtype;
    if (strcmp(dt, "float32") == 0) dtype = PA_F32;
    else if (strcmp(dt, "float64") == 0) dtype = PA_F64;
    else {
        PyErr_Format(PyExc_ValueError, "dtype must be 'float32' or 'float64', got '%s'", dt);
        return NULL;
    }
    if (kc < 1 || kc > 4096) {
        PyErr_Format(PyExc_ValueError, "kc must be between 1 and 4096, got %zd", kc);
        return NULL;
    }
    if (iters < 0) {
        PyErr_SetString(PyExc_ValueError, "iters must be >= 0");
        return NULL;
    }
    double flops, sink;
    const pa_family *fam = family;
    Py_BEGIN_ALLOW_THREADS
    flops = pa_gemm_probe(fam, dtype, kc, iters, &sink);
    Py_END_ALLOW_THREADS
    if (flops < 0) return PyErr_NoMemory();
    return PyFloat_FromDouble(flops + 0.0 * sink);
}

/* threadpoolctl (pyattn/_threadpoolctl.py) reaches the pool through ctypes,
 * as it reaches OpenBLAS's: these two and PyInit__C are the only symbols the
 * extension exports (it is built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define PA_EXPORT __attribute__((visibility("default")))
#else
#define PA_EXPORT
#endif
PA_EXPORT int pyattn_threadpool_get_num_threads(void) { return pa_get_num_threads(); }
PA_EXPORT int pyattn_threadpool_set_num_threads(int n) { return pa_set_num_threads(n); }

/* read_probe(buf) -> sum: the benchmark's read-bandwidth probe over a
 * float32 C-contiguous 1-D array (time it around), on the threads in use. */
static PyObject *py_read_probe(PyObject *self, PyObject *arg)
{
    view b;
    if (get_view(arg, "buf", 1, 0, 0, &b) < 0) return NULL;
    if (b.nd != 1 || b.dtype != PA_F32 || (b.shape[0] > 1 && b.st[0] != 1)) {
        PyErr_SetString(PyExc_ValueError, "buf must be a 1-D C-contiguous float32 array");
        return NULL;
    }
    const pa_family *fam = family;
    const int nt = pa_get_num_threads();
    double s = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pa_read_probe(fam, (const float *)b.data, (size_t)b.shape[0], nt, &s);
    Py_END_ALLOW_THREADS
    if (rc < 0) return PyErr_NoMemory();
    return PyFloat_FromDouble(s);
}

/* _alloc_hook(n) -> (pending, live): arm the allocation-failure test hook
 * (the n-th allocation from now fails, once; 0: off) and return the
 * countdown it replaced (0 once the armed failure happened) and the scratch
 * blocks now allocated. For tests only. */
static PyObject *py_alloc_hook(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0 (0: off)");
        return NULL;
    }
    long live;
    const long pending = pa_alloc_hook(n, &live);
    return Py_BuildValue("(ll)", pending, live);
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_VARARGS | METH_KEYWORDS, matmul_doc},
    {"softmax", (PyCFunction)(void (*)(void))py_softmax, METH_VARARGS | METH_KEYWORDS, softmax_doc},
    {"softmax_backward", py_softmax_backward, METH_VARARGS, softmax_backward_doc},
    {"sdpa", (PyCFunction)(void (*)(void))py_sdpa, METH_VARARGS | METH_KEYWORDS, sdpa_doc},
    {"rotary", (PyCFunction)(void (*)(void))pa_py_rotary, METH_VARARGS | METH_KEYWORDS, pa_rotary_doc},
    {"sdpa_backward", (PyCFunction)(void (*)(void))py_sdpa_backward, METH_VARARGS | METH_KEYWORDS,
     sdpa_backward_doc},
    {"merge", (PyCFunction)(void (*)(void))py_merge, METH_VARARGS | METH_KEYWORDS, merge_doc},
    {"set_num_threads", py_set_num_threads, METH_O, "set_num_threads(n): threads for the kernels"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"select_isa", py_select_isa, METH_O,
     "select_isa(code) -> code chosen (-1: best); calls already running keep their family"},
    {"config", py_config, METH_NOARGS, "config() -> dict of the kernels in use"},
    {"families", py_families, METH_NOARGS,
     "families() -> ((word, code, built), ...): the kernel families in code order"},
    {"fma_probe", py_fma_probe, METH_O,
     "fma_probe(iters) -> float32 flops done at the family's vector width (None: generic)"},
    {"bf16_probe", py_bf16_probe, METH_O,
     "bf16_probe(iters) -> flops done by vdpbf16ps chains (None: no AVX512_BF16 in this family)"},
    {"read_probe", py_read_probe, METH_O,
     "read_probe(buf) -> sum of a float32 1-D C-contiguous array, read once on the threads in use"},
    {"gemm_probe", py_gemm_probe, METH_VARARGS,
     "gemm_probe(dtype, kc, iters) -> flops done by the GEMM micro-kernel on L1-resident panels"},
    {"_alloc_hook", py_alloc_hook, METH_O,
     "_alloc_hook(n) -> (pending, live): tests only; the n-th allocation from now fails (0: off)"},
    {"_kernel_check", pa_py_kernel_check, METH_VARARGS, pa_kernel_check_doc},
    {"quantize", pa_py_quantize, METH_VARARGS, pa_quantize_doc},
    {"dequantize", pa_py_dequantize, METH_VARARGS, pa_dequantize_doc},
    {"_bm_pack", pa_py_bm_pack, METH_VARARGS, pa_bm_pack_doc},
    {"_vexp", pa_py_vexp, METH_VARARGS, pa_vexp_doc},
    {"_ukr_info", pa_py_ukr_info, METH_NOARGS, pa_ukr_info_doc},
    {"_ukr_select", pa_py_ukr_select, METH_O, pa_ukr_select_doc},
    {"_ukr_classify", pa_py_ukr_classify, METH_VARARGS, pa_ukr_classify_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_C", "pyattn's C kernels (private; use the pyattn package).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    family = pa_choose_family(-1);
    return PyModule_Create(&moddef);
}
