/*
 * bind_nd.c -- an ndarray argument as a strided view (bind_nd.h).
 */
#include "bind_nd.h"

#include <numpy/arrayobject.h>

#include <string.h>

int pa_nd_fp8(PyObject *o)
{
    if (PyArray_API == NULL && _import_array() < 0) {
        PyErr_Clear();
        return -1;
    }
    if (!PyArray_Check(o)) return -1;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_TYPE(a) < NPY_USERDEF || PyArray_ITEMSIZE(a) != 1) return -1;
    const char *n = PyArray_DESCR(a)->typeobj->tp_name, *dot = strrchr(n, '.');
    if (dot) n = dot + 1;
    return strcmp(n, "float8_e4m3fn") == 0 ? PA_F8E4 : strcmp(n, "float8_e5m2") == 0 ? PA_F8E5 : -1;
}

/* an fp8 array's dtype code, else PA_ND_OTHER */
static int pa_nd_fp8_or_other(PyObject *o)
{
    const int f = pa_nd_fp8(o);
    return f >= 0 ? f : PA_ND_OTHER;
}

int pa_nd_dtype(PyObject *o, const char *name)
{
    if (PyArray_API == NULL && _import_array() < 0) return -1;   /* this file's NumPy API table */
    if (!PyArray_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    const int tn = PyArray_TYPE((PyArrayObject *)o);
    return tn == NPY_FLOAT32 ? PA_F32 : tn == NPY_FLOAT64 ? PA_F64 : tn == NPY_HALF ? PA_F16
         : tn == NPY_UINT16 ? PA_BF16 : tn == NPY_INT64 ? PA_ND_INT64 : tn == NPY_INT8 ? PA_I8
         : tn == NPY_UINT8 ? PA_I4 : pa_nd_fp8_or_other(o);
}

int pa_nd_view(PyObject *o, const char *name, int nd, int writeable, pa_nd *r)
{
    PyArrayObject *a = (PyArrayObject *)o;
    if (nd < 1 || nd > 4 || PyArray_NDIM(a) != nd || !PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a) ||
        (writeable && !PyArray_ISWRITEABLE(a))) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, aligned, native%s", name, nd,
                     writeable ? " and writeable" : "");
        return -1;
    }
    const npy_intp is = PyArray_ITEMSIZE(a);
    r->data = PyArray_BYTES(a);
    for (int d = 0; d < nd; d++) {
        if (PyArray_STRIDES(a)[d] % is != 0) {
            PyErr_Format(PyExc_ValueError, "%s has a stride that is not a multiple of its item size", name);
            return -1;
        }
        r->shape[d] = (pa_ssize)PyArray_DIMS(a)[d];
        r->st[d] = (pa_ssize)(PyArray_STRIDES(a)[d] / is);
    }
    return 0;
}
