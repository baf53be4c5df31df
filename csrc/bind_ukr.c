/*
 * bind_ukr.c -- _C._ukr_info, _C._ukr_select, _C._ukr_classify: the avx512
 * family's float32 micro-kernel shape (ukr_select.c). Private: pyattn/_ukr.py
 * (PYATTN_UKR, show_config's line) and the tests call them.
 */
#include "bind_ukr.h"

#include <string.h>

#include "ukr_select.h"

static const char *class_word(int cls)
{
    return cls == PA_FMA512_FULL ? "full" : cls == PA_FMA512_HALF ? "half" : "unknown";
}

const char pa_ukr_info_doc[] =
    "_ukr_info() -> dict: the avx512 family's float32 GEMM micro-kernel shape and why:\n"
    "shape, kernel, mr, nr, forced, probed, rate512, rate256 (probe flops/s), class\n"
    "('full', 'half', 'unknown'), shapes (the names _ukr_select takes)";

PyObject *pa_py_ukr_info(PyObject *self, PyObject *unused)
{
    const pa_ukr_state *s = pa_ukr_info();
    int n = 0;
    for (int i = 0; i < pa_ukr_nshapes; i++) n += pa_ukr_shapes[i].attn;
    PyObject *names = PyTuple_New(n);
    if (!names) return NULL;
    for (int i = 0, k = 0; i < pa_ukr_nshapes; i++) {
        if (!pa_ukr_shapes[i].attn) continue;
        PyObject *w = PyUnicode_FromString(pa_ukr_shapes[i].name);
        if (!w) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, k++, w);
    }
    const pa_ukr_shape *u = pa_ukr_nshapes ? &pa_ukr_shapes[s->shape] : NULL;
    return Py_BuildValue("{s:s,s:s,s:i,s:i,s:O,s:O,s:d,s:d,s:s,s:N}",
                         "shape", u ? u->name : "", "kernel", u ? u->sym : "",
                         "mr", u ? u->mr : 0, "nr", u ? u->nr : 0,
                         "forced", s->forced ? Py_True : Py_False,
                         "probed", s->probed ? Py_True : Py_False,
                         "rate512", s->rate512, "rate256", s->rate256,
                         "class", class_word(s->cls), "shapes", names);
}

const char pa_ukr_select_doc[] =
    "_ukr_select(name) -> None: run the avx512 family's float32 GEMM in shape name\n"
    "(one of _ukr_info()['shapes']; None: the probe's choice) from the next\n"
    "select_isa on. ValueError for another name.";

PyObject *pa_py_ukr_select(PyObject *self, PyObject *arg)
{
    int idx = -1;
    if (arg != Py_None) {
        if (!PyUnicode_Check(arg)) {
            PyErr_Format(PyExc_TypeError, "shape must be a str or None, got %.100s", Py_TYPE(arg)->tp_name);
            return NULL;
        }
        const char *w = PyUnicode_AsUTF8(arg);
        if (!w) return NULL;
        for (int i = 0; i < pa_ukr_nshapes; i++)
            if (pa_ukr_shapes[i].attn && strcmp(w, pa_ukr_shapes[i].name) == 0) idx = i;
        if (idx < 0) {
            PyErr_Format(PyExc_ValueError, "shape must be one of _ukr_info()['shapes'], got %R", arg);
            return NULL;
        }
    }
    if (pa_ukr_force(idx) < 0) {
        PyErr_Format(PyExc_ValueError, "shape %R cannot be selected", arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

const char pa_ukr_classify_doc[] =
    "_ukr_classify(rate512, rate256) -> (class, shape): the decision on given probe\n"
    "rates (flops/s at 16 and 8 float32 lanes), without probing";

PyObject *pa_py_ukr_classify(PyObject *self, PyObject *args)
{
    double r512, r256;
    if (!PyArg_ParseTuple(args, "dd:_ukr_classify", &r512, &r256)) return NULL;
    const int cls = pa_ukr_classify(r512, r256);
    const int s = pa_ukr_shape_of(cls);
    return Py_BuildValue("(ss)", class_word(cls), pa_ukr_nshapes ? pa_ukr_shapes[s].name : "");
}
