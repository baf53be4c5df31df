/*
 * bind_rotary.c -- rotary embedding (ops/rotary.h) bound for Python: the
 * tables an append rotates its new keys with (pa_bind_rope), and
 * _C.rotary(x, positions, cos, sin, interleaved, out), which rotates rows
 * into another array (pyattn/_kvextra.py: the queries of a call, into a
 * scratch of the queries' size). Everything is checked before a row is
 * written; the GIL is released around the rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <numpy/arrayobject.h>

#include "pyattn.h"
#include "bind_rotary.h"
#include "bind_nd.h"

/* an nd-D rotary table or rows array (bind_nd.h): float32, float64,
 * float16, bfloat16 (as uint16) or int64 (PA_ND_INT64) */
typedef pa_nd rarr;

static int get_rarr(PyObject *o, const char *name, int nd, int writeable, rarr *r)
{
    const int dt = pa_nd_dtype(o, name);
    if (dt == -1 && PyErr_Occurred()) return -1;
    if (dt != PA_F32 && dt != PA_F64 && dt != PA_F16 && dt != PA_BF16 && dt != PA_ND_INT64) {
        PyErr_Format(PyExc_TypeError, "%s must be float32, float64, float16, bfloat16 (as uint16) or int64",
                     name);
        return -1;
    }
    r->dtype = dt;
    return pa_nd_view(o, name, nd, writeable, r);
}

int pa_bind_rope(PyObject *o, int cd, pa_ssize E, pa_rope *r)
{
    if (PyArray_API == NULL && _import_array() < 0) return -1;   /* this file's NumPy API table */
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3) {
        PyErr_SetString(PyExc_TypeError, "rotary must be (rotary_cos, rotary_sin, interleaved)");
        return -1;
    }
    rarr c, s;
    if (get_rarr(PyTuple_GET_ITEM(o, 0), "rotary_cos", 2, 0, &c) < 0 ||
        get_rarr(PyTuple_GET_ITEM(o, 1), "rotary_sin", 2, 0, &s) < 0)
        return -1;
    if (c.dtype != cd || s.dtype != cd) {
        PyErr_Format(PyExc_TypeError, "rotary_cos and rotary_sin must be %s (the compute dtype), got %s and %s",
                     pa_dtypes[cd].name, c.dtype < 0 ? "int64" : pa_dtypes[c.dtype].name,
                     s.dtype < 0 ? "int64" : pa_dtypes[s.dtype].name);
        return -1;
    }
    if (c.shape[0] != s.shape[0] || c.shape[1] != s.shape[1] || c.shape[1] > E / 2) {
        PyErr_Format(PyExc_ValueError, "rotary_cos (%zd, %zd) and rotary_sin (%zd, %zd) must be one shape "
                     "(R, rotary_dim / 2) with rotary_dim <= the head dim %zd", (Py_ssize_t)c.shape[0],
                     (Py_ssize_t)c.shape[1], (Py_ssize_t)s.shape[0], (Py_ssize_t)s.shape[1], (Py_ssize_t)E);
        return -1;
    }
    const int il = PyObject_IsTrue(PyTuple_GET_ITEM(o, 2));
    if (il < 0) return -1;
    r->cos = c.data; r->sin = s.data;
    r->R = c.shape[0]; r->half = c.shape[1];
    r->cst[0] = c.st[0]; r->cst[1] = c.st[1];
    r->sst[0] = s.st[0]; r->sst[1] = s.st[1];
    r->dt = cd;
    r->interleaved = il;
    return 0;
}

int pa_rope_check_rows(const pa_rope *r, pa_ssize b, int64_t pos, pa_ssize T)
{
    if (T > 0 && (pos < 0 || T > r->R || pos > (int64_t)(r->R - T))) {    /* no sum that could wrap */
        PyErr_Format(PyExc_ValueError, "rotary_cos/rotary_sin have %zd rows, but sequence %zd's new rows "
                     "sit at positions [%lld, %lld + %zd); nothing was written", (Py_ssize_t)r->R,
                     (Py_ssize_t)b, (long long)pos, (long long)pos, (Py_ssize_t)T);
        return -1;
    }
    return 0;
}

const char pa_rotary_doc[] =
"rotary(x, positions, cos, sin, interleaved, out) -> out\n\n"
"Private kernel entry: rotary embedding of the rows of x (A, H, T, E) into\n"
"out (same shape; no overlap with x), row (a, h, t) at positions[a, t]\n"
"(int64 (A, T), any strides, each in [0, R)); cos / sin (R, half) of the\n"
"compute dtype (float32: x, out float32 / float16 / bfloat16 as uint16;\n"
"float64: both float64), 2 * half <= E. Use\n"
"pyattn.attention_with_kvcache(..., rotary_cos=, rotary_sin=).";

typedef struct {
    const pa_rope *r;
    rarr x, p, y;
} rot_job;

static void rot_run(const rot_job *j)
{
    const size_t xe = pa_elsize(j->x.dtype), ye = pa_elsize(j->y.dtype);
    for (pa_ssize a = 0; a < j->x.shape[0]; a++)
        for (pa_ssize h = 0; h < j->x.shape[1]; h++)
            for (pa_ssize t = 0; t < j->x.shape[2]; t++) {
                const int64_t pos = ((const int64_t *)j->p.data)[a * j->p.st[0] + t * j->p.st[1]];
                const char *xr = j->x.data + (a * j->x.st[0] + h * j->x.st[1] + t * j->x.st[2]) * (pa_ssize)xe;
                char *yr = j->y.data + (a * j->y.st[0] + h * j->y.st[1] + t * j->y.st[2]) * (pa_ssize)ye;
                pa_rope_row(j->r, (pa_ssize)pos, xr, j->x.dtype, j->x.st[3], yr, j->y.dtype, j->y.st[3],
                            j->x.shape[3]);
            }
}

/* the byte extent [lo, hi) of a 4-D array (empty: lo == hi) */
static void extent(const rarr *a, char **lo, char **hi)
{
    pa_ssize l = 0, h = 0;
    const pa_ssize es = (pa_ssize)pa_elsize(a->dtype);
    for (int d = 0; d < 4; d++) {
        if (a->shape[d] == 0) { *lo = *hi = a->data; return; }
        const pa_ssize reach = (a->shape[d] - 1) * a->st[d];
        if (reach < 0) l += reach; else h += reach;
    }
    *lo = a->data + l * es;
    *hi = a->data + (h + 1) * es;
}

static int overlap(const rarr *x, const rarr *y)
{
    char *a, *b, *c, *d;
    extent(x, &a, &b);
    extent(y, &c, &d);
    const uintptr_t xl = (uintptr_t)a, xh = (uintptr_t)b, yl = (uintptr_t)c, yh = (uintptr_t)d;
    return xl < xh && yl < yh && xl < yh && yl < xh;
}

PyObject *pa_py_rotary(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "positions", "cos", "sin", "interleaved", "out", NULL};
    PyObject *xo, *po, *co, *so, *ilo, *yo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO:rotary", kwlist, &xo, &po, &co, &so, &ilo, &yo))
        return NULL;
    if (PyArray_API == NULL && _import_array() < 0) return NULL;
    rot_job j;
    pa_rope r;
    if (get_rarr(xo, "x", 4, 0, &j.x) < 0 || get_rarr(po, "positions", 2, 0, &j.p) < 0 ||
        get_rarr(yo, "out", 4, 1, &j.y) < 0)
        goto fail;
    if (j.x.dtype < 0 || j.y.dtype < 0 || j.p.dtype != PA_ND_INT64) {
        PyErr_SetString(PyExc_TypeError, "x and out must be floating, positions int64");
        goto fail;
    }
    const int cd = j.x.dtype == PA_F64 ? PA_F64 : PA_F32;
    if ((j.y.dtype == PA_F64) != (cd == PA_F64)) {
        PyErr_SetString(PyExc_TypeError, "x and out must both be float64, or neither");
        goto fail;
    }
    for (int d = 0; d < 4; d++)
        if (j.y.shape[d] != j.x.shape[d]) {
            PyErr_SetString(PyExc_ValueError, "out must have x's shape");
            goto fail;
        }
    if (j.p.shape[0] != j.x.shape[0] || j.p.shape[1] != j.x.shape[2]) {
        PyErr_SetString(PyExc_ValueError, "positions must be (A, T) as x (A, H, T, E)");
        goto fail;
    }
    {
        PyObject *t = PyTuple_Pack(3, co, so, ilo);
        if (!t) goto fail;
        const int rc = pa_bind_rope(t, cd, j.x.shape[3], &r);
        Py_DECREF(t);
        if (rc < 0) goto fail;
    }
    if (j.x.shape[1] > 0 && j.x.shape[3] > 0)
        for (pa_ssize a = 0; a < j.p.shape[0]; a++)
            for (pa_ssize t = 0; t < j.p.shape[1]; t++) {
                const int64_t pos = ((const int64_t *)j.p.data)[a * j.p.st[0] + t * j.p.st[1]];
                if (pos < 0 || pos >= (int64_t)r.R) {
                    PyErr_Format(PyExc_ValueError, "rotary_cos/rotary_sin have %zd rows, but position %lld "
                                 "is needed", (Py_ssize_t)r.R, (long long)pos);
                    goto fail;
                }
            }
    if (overlap(&j.x, &j.y)) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap x");
        goto fail;
    }
    j.r = &r;
    Py_BEGIN_ALLOW_THREADS
    rot_run(&j);
    Py_END_ALLOW_THREADS
    return Py_NewRef(yo);
fail:
    return NULL;
}
