/*
 * bind_matmul.c -- _C.matmul, _C.softmax and _C.softmax_backward: the
 * bindings of ops/matmul.c and ops/softmax.c (bind_matmul.h).
 *
 * Shape legend: B batch axes, L queries, S keys, E head dim, Ev value dim,
 * M, N, K matmul.
 */
#include "bind_views.h"
#include "bind_matmul.h"
#include "bind_interrupt.h"
#include "bind_config.h"
#include "threads.h"

#include <string.h>

const char pa_matmul_doc[] =
    "matmul(a, b, out=None, bias=None, nthreads=0, bf16=False) -> out\n\n"
    "Private kernel entry: a (..., M, K) @ b (..., K, N) (+ bias (N,)) with equal\n"
    "batch axes and dtypes. Use pyattn.matmul.";

PyObject *pa_py_matmul(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"a", "b", "out", "bias", "nthreads", "bf16", NULL};
    PyObject *ao, *bo, *outo = Py_None, *biaso = Py_None;
    PyArrayObject *res = NULL;
    pa_view a, b, o, bias;
    int req_threads = 0, bf16 = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOip:matmul", kwlist, &ao, &bo, &outo, &biaso,
                                     &req_threads, &bf16))
        return NULL;
    if (pa_get_view(ao, "a", 2, PA_ALLOW_16, 0, &a) < 0 || pa_get_view(bo, "b", 2, PA_ALLOW_16, 0, &b) < 0)
        goto fail;
    const pa_view *ab[2] = {&a, &b};
    const int cd = pa_compute_of(ab, 2, "a and b");
    if (cd < 0) goto fail;
    if (bf16 && cd != PA_F32) {
        PyErr_SetString(PyExc_ValueError, "precision='bf16' needs float32 (or 16-bit) a and b, not float64");
        goto fail;
    }
    const int nd = a.nd, nb = nd - 2;
    if (pa_same_batch(&a, "a", &b, "b", nb) < 0) goto fail;
    const pa_ssize M = a.shape[nd - 2], K = a.shape[nd - 1], N = b.shape[nd - 1];
    if (b.shape[nd - 2] != K) { pa_shape_error("b", &b, "a", &a); goto fail; }
    const void *bias_p = NULL;
    pa_ssize bias_s = 0;
    if (biaso != Py_None) {
        if (pa_get_view(biaso, "bias", 1, 0, 0, &bias) < 0) goto fail;
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
    res = pa_get_out(outo, nd, oshape, cd, &o, "matmul result");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand A, B, C;
    pa_batch_of(&a, nb, &bt);
    pa_operand_of(&a, nb, &A);
    pa_operand_of(&b, nb, &B);
    pa_operand_of(&o, nb, &C);
    const pa_matmul_call mm = {.dtype = cd, .a_dt = a.dtype, .b_dt = b.dtype, .bt = &bt, .M = M, .N = N,
                               .K = K, .A = &A, .B = &B, .C = &C, .bias = bias_p, .bias_s = bias_s,
                               .bf16 = bf16};
    int rc, nt = pa_call_threads(req_threads);
    const pa_family *fam = pa_family_now();
    PA_STOPPABLE_CALL((double)bt.count * (double)M * (double)N * (double)K,
                      rc = pa_matmul(fam, &mm, nt), (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    return (PyObject *)res;
fail:
    Py_XDECREF(res);
    return NULL;
}

const char pa_softmax_doc[] =
    "softmax(x, out=None, mask=None, causal=0, scale=1.0) -> out\n\n"
    "Private kernel entry: softmax over the last axis of x, mask of x's shape.\n"
    "Use pyattn.softmax.";

PyObject *pa_py_softmax(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "out", "mask", "causal", "scale", NULL};
    PyObject *xo, *outo = Py_None, *mo = Py_None;
    int causal = 0;
    double scale = 1.0;
    PyArrayObject *res = NULL;
    pa_view x, o, m;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOid:softmax", kwlist, &xo, &outo, &mo, &causal, &scale))
        return NULL;
    if (pa_get_view(xo, "x", 1, 0, 0, &x) < 0) goto fail;
    if (pa_check_causal(causal) < 0) goto fail;
    if (causal && x.nd < 2) {
        PyErr_SetString(PyExc_ValueError, "is_causal needs x with at least 2 dimensions");
        goto fail;
    }
    if (pa_get_mask(mo, &x, x.dtype, &m, &kind) < 0) goto fail;
    res = pa_get_out(outo, x.nd, x.shape, x.dtype, &o, "softmax result");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand X, Mk, O;
    pa_batch_of(&x, x.nd - 1, &bt);
    pa_operand_of(&x, x.nd - 1, &X);
    pa_operand_of(&o, x.nd - 1, &O);
    if (kind) pa_operand_of(&m, x.nd - 1, &Mk);
    const pa_softmax_call sm = {.dtype = x.dtype, .bt = &bt, .S = x.shape[x.nd - 1], .x = &X,
                                .mask = kind ? &Mk : NULL, .out = &O, .mask_kind = kind,
                                .causal = causal, .scale = scale};
    int rc, nt = pa_get_num_threads();
    const pa_family *fam = pa_family_now();
    PA_STOPPABLE_CALL(16.0 * (double)bt.count * (double)x.shape[x.nd - 1],
                      rc = pa_softmax(fam, &sm, nt), (void)0);
    if (rc < 0) { PyErr_NoMemory(); goto fail; }
    return (PyObject *)res;
fail:
    Py_XDECREF(res);
    return NULL;
}

const char pa_softmax_backward_doc[] =
    "softmax_backward(grad_y, y, scale=1.0) -> grad_x\n\n"
    "Private kernel entry: the softmax backward over the last axis, grad_y and y\n"
    "of one dtype and shape. Use pyattn.softmax_backward.";

PyObject *pa_py_softmax_backward(PyObject *self, PyObject *args)
{
    PyObject *go, *yo;
    double scale = 1.0;
    PyArrayObject *res = NULL;
    pa_view g, y, o;
    if (!PyArg_ParseTuple(args, "OO|d:softmax_backward", &go, &yo, &scale)) return NULL;
    if (pa_get_view(go, "grad_y", 1, 0, 0, &g) < 0 || pa_get_view(yo, "y", 1, 0, 0, &y) < 0) goto fail;
    if (g.dtype != y.dtype) {
        PyErr_SetString(PyExc_TypeError, "grad_y and y must have one dtype");
        goto fail;
    }
    if (pa_same_batch(&y, "y", &g, "grad_y", y.nd) < 0) goto fail;
    res = pa_get_out(Py_None, y.nd, y.shape, y.dtype, &o, "softmax gradient");
    if (!res) goto fail;
    pa_batch bt;
    pa_operand G, Y, O;
    pa_batch_of(&y, y.nd - 1, &bt);
    pa_operand_of(&g, y.nd - 1, &G);
    pa_operand_of(&y, y.nd - 1, &Y);
    pa_operand_of(&o, y.nd - 1, &O);
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
