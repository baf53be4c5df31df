/*
 * kernel_check_py.c -- pyattn._C._kernel_check, the binding of the per-kernel
 * checks (kernel_check.h) for tests/test_kernels.py. Private: a test entry
 * point, not part of the API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dispatch.h"
#include "kernel_check.h"

const char pa_kernel_check_doc[] =
    "_kernel_check(isa, kinds=None) -> (family, {kind: cases}, failures, kernels)\n\n"
    "Runs each kernel kind of the family for isa code `isa` (as select_isa: capped at what the\n"
    "CPU has; -1 the best; `family` says which ran) against its portable twin. kinds: names\n"
    "to run (None: all). cases: cases checked, 0 for a kind not run, -1 where the kind does\n"
    "not apply to the family. failures: one line per failed case (the first few of each\n"
    "kind, then a count), naming the family, the kernel and the case. kernels: the symbols\n"
    "of the family's kernels that ran.";

PyObject *pa_py_kernel_check(PyObject *self, PyObject *args)
{
    int isa;
    PyObject *kinds = Py_None, *seq = NULL, *counts = NULL, *fails = NULL, *used = NULL, *out = NULL;
    const int nk = pa_kc_nkinds();
    pa_kc_result *res = NULL;
    char *run = NULL;
    int rc = 0;
    if (!PyArg_ParseTuple(args, "i|O:_kernel_check", &isa, &kinds)) return NULL;
    if (isa < -1 || isa >= PA_ISA_COUNT) {
        PyErr_Format(PyExc_ValueError, "isa must be -1 to %d, got %d", PA_ISA_COUNT - 1, isa);
        return NULL;
    }
    res = PyMem_Calloc((size_t)nk, sizeof *res);
    run = PyMem_Calloc((size_t)nk, 1);
    if (!res || !run) {
        PyErr_NoMemory();
        goto fail;
    }
    if (kinds == Py_None) {
        memset(run, 1, (size_t)nk);
    } else {
        seq = PySequence_Fast(kinds, "kinds must be None or a sequence of kernel kind names");
        if (!seq) goto fail;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
            const char *name = PyUnicode_Check(it) ? PyUnicode_AsUTF8(it) : NULL;
            if (!name) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_TypeError, "kinds must hold str, got %s", Py_TYPE(it)->tp_name);
                goto fail;
            }
            int found = -1;
            for (int k = 0; k < nk; k++)
                if (strcmp(name, pa_kc_kind_name(k)) == 0) found = k;
            if (found < 0) {
                PyErr_Format(PyExc_ValueError, "kinds: unknown kernel kind %R", it);
                goto fail;
            }
            run[found] = 1;
        }
    }
    const pa_family *f = pa_choose_family(isa);
    Py_BEGIN_ALLOW_THREADS
    for (int k = 0; k < nk; k++)
        if (run[k] && pa_kernel_check(f, k, &res[k]) < 0) rc = -1;
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    counts = PyDict_New();
    fails = PyList_New(0);
    used = PyList_New(0);
    if (!counts || !fails || !used) goto fail;
    for (int k = 0; k < nk; k++) {
        PyObject *c = PyLong_FromLongLong(res[k].cases);
        if (!c || PyDict_SetItemString(counts, pa_kc_kind_name(k), c) < 0) {
            Py_XDECREF(c);
            goto fail;
        }
        Py_DECREF(c);
        for (int i = 0; i < res[k].nused; i++) {
            PyObject *u = PyUnicode_FromString(res[k].used[i]);
            if (!u || PyList_Append(used, u) < 0) {
                Py_XDECREF(u);
                goto fail;
            }
            Py_DECREF(u);
        }
        for (int i = 0; i <= res[k].nlines; i++) {
            PyObject *line;
            if (i < res[k].nlines)
                line = PyUnicode_DecodeUTF8(res[k].lines[i], (Py_ssize_t)strlen(res[k].lines[i]), "replace");
            else if (res[k].failures > res[k].nlines)
                line = PyUnicode_FromFormat("%s %s: %lld more failed cases", pa_isa_name(f->isa), pa_kc_kind_name(k),
                                            res[k].failures - res[k].nlines);
            else
                break;
            if (!line || PyList_Append(fails, line) < 0) {
                Py_XDECREF(line);
                goto fail;
            }
            Py_DECREF(line);
        }
    }
    out = Py_BuildValue("(sOOO)", pa_isa_name(f->isa), counts, fails, used);
fail:
    Py_XDECREF(seq);
    Py_XDECREF(counts);
    Py_XDECREF(fails);
    Py_XDECREF(used);
    PyMem_Free(res);
    PyMem_Free(run);
    return out;
}

const char pa_vexp_doc[] =
    "_vexp(isa, x) -> (family, bytes)\n\n"
    "The shared vector exp (kernels/vec/exp_vec.inc) of the family for isa code `isa` (as\n"
    "select_isa: capped at what the CPU has; `family` says which ran) on x, a C-contiguous\n"
    "buffer of float32 ('f') or float64 ('d') whose length is a multiple of 16: its results'\n"
    "bytes. ValueError for a family without a vector exp (generic) or a bad x. A test hook.";

PyObject *pa_py_vexp(PyObject *self, PyObject *args)
{
    int isa, dtype = -1, vl = 0;
    PyObject *obj, *out = NULL, *res = NULL;
    Py_buffer x = {0};
    Py_ssize_t es = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "iO:_vexp", &isa, &obj)) return NULL;
    if (isa < -1 || isa >= PA_ISA_COUNT) {
        PyErr_Format(PyExc_ValueError, "isa must be -1 to %d, got %d", PA_ISA_COUNT - 1, isa);
        return NULL;
    }
    if (PyObject_GetBuffer(obj, &x, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (x.format && strcmp(x.format, "f") == 0) dtype = PA_F32, es = 4;
    if (x.format && strcmp(x.format, "d") == 0) dtype = PA_F64, es = 8;
    if (dtype < 0) {
        PyErr_SetString(PyExc_ValueError, "x must be a C-contiguous float32 or float64 buffer");
        goto fail;
    }
    if (x.len % (16 * es)) {
        PyErr_SetString(PyExc_ValueError, "x's length must be a multiple of 16");
        goto fail;
    }
    const pa_family *f = pa_choose_family(isa);
    out = PyBytes_FromStringAndSize(NULL, x.len);
    if (!out) goto fail;
    char *y = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    vl = pa_kc_vexp(f, dtype, x.buf, y, x.len / es);
    Py_END_ALLOW_THREADS
    if (vl <= 0) {
        PyErr_Format(PyExc_ValueError, "the %s family has no vector exp", pa_isa_name(f->isa));
        goto fail;
    }
    res = Py_BuildValue("(sO)", pa_isa_name(f->isa), out);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&x);
    return res;
}
