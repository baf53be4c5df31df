/*
 * kcheck_module.c -- the test-only extension _kcheck: the per-kernel checks
 * (kernel_check.h) for tests/test_kernels.py, tests/test_ukr.py and
 * tests/test_exp.py. Not part of pyattn and never installed: tests/kcheck.py
 * builds it from csrc/check/ (kernel_check.c, this file) and imports it.
 * It runs the shipped pyattn._C's own family tables, which it gets at import
 * through the private capsule pyattn._C._families_capsule (families_api.h):
 * the kernels checked are the ones pyattn runs, and none is compiled here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernel_check.h"

static const pa_families_api *api;     /* _C's, set once by PyInit__kcheck */

static const char kernel_check_doc[] =
    "kernel_check(isa, kinds=None) -> (family, {kind: cases}, failures, kernels)\n\n"
    "Runs each kernel kind of the family for isa code `isa` (as select_isa: capped at what the\n"
    "CPU has; -1 the best; `family` says which ran) against its portable twin. kinds: names\n"
    "to run (None: all). cases: cases checked, 0 for a kind not run, -1 where the kind does\n"
    "not apply to the family. failures: one line per failed case (the first few of each\n"
    "kind, then a count), naming the family, the kernel and the case. kernels: the symbols\n"
    "of the family's kernels that ran.";

static PyObject *py_kernel_check(PyObject *self, PyObject *args)
{
    int isa;
    PyObject *kinds = Py_None, *seq = NULL, *counts = NULL, *fails = NULL, *used = NULL, *out = NULL;
    const int nk = pa_kc_nkinds();
    pa_kc_result *res = NULL;
    char *run = NULL;
    int rc = 0;
    if (!PyArg_ParseTuple(args, "i|O:kernel_check", &isa, &kinds)) return NULL;
    if (isa < -1 || isa >= api->isa_count) {
        PyErr_Format(PyExc_ValueError, "isa must be -1 to %d, got %d", api->isa_count - 1, isa);
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
    const pa_family *f = api->choose_family(isa);
    Py_BEGIN_ALLOW_THREADS
    for (int k = 0; k < nk; k++)
        if (run[k] && pa_kernel_check(api, f, k, &res[k]) < 0) rc = -1;
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
                line = PyUnicode_FromFormat("%s %s: %lld more failed cases", api->isa_name(f->isa), pa_kc_kind_name(k),
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
    out = Py_BuildValue("(sOOO)", api->isa_name(f->isa), counts, fails, used);
fail:
    Py_XDECREF(seq);
    Py_XDECREF(counts);
    Py_XDECREF(fails);
    Py_XDECREF(used);
    PyMem_Free(res);
    PyMem_Free(run);
    return out;
}

static const char vexp_doc[] =
    "vexp(isa, x) -> (family, bytes)\n\n"
    "The shared vector exp (kernels/vec/exp_vec.inc) of the family for isa code `isa` (as\n"
    "select_isa: capped at what the CPU has; `family` says which ran) on x, a C-contiguous\n"
    "buffer of float32 ('f') or float64 ('d') whose length is a multiple of 16: its results'\n"
    "bytes. ValueError for a family without a vector exp (generic) or a bad x. A test hook.";

static PyObject *py_vexp(PyObject *self, PyObject *args)
{
    int isa, dtype = -1, vl = 0;
    PyObject *obj, *out = NULL, *res = NULL;
    Py_buffer x = {0};
    Py_ssize_t es = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "iO:vexp", &isa, &obj)) return NULL;
    if (isa < -1 || isa >= api->isa_count) {
        PyErr_Format(PyExc_ValueError, "isa must be -1 to %d, got %d", api->isa_count - 1, isa);
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
    const pa_family *f = api->choose_family(isa);
    out = PyBytes_FromStringAndSize(NULL, x.len);
    if (!out) goto fail;
    char *y = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    vl = pa_kc_vexp(api, f, dtype, x.buf, y, x.len / es);
    Py_END_ALLOW_THREADS
    if (vl <= 0) {
        PyErr_Format(PyExc_ValueError, "the %s family has no vector exp", api->isa_name(f->isa));
        goto fail;
    }
    res = Py_BuildValue("(sO)", api->isa_name(f->isa), out);
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&x);
    return res;
}

static PyObject *py_kinds(PyObject *self, PyObject *noargs)
{
    const int nk = pa_kc_nkinds();
    PyObject *out = PyTuple_New(nk);
    (void)self;
    if (!out) goto fail;
    for (int k = 0; k < nk; k++) {
        PyObject *s = PyUnicode_FromString(pa_kc_kind_name(k));
        if (!s) goto fail;
        PyTuple_SET_ITEM(out, k, s);
    }
    return out;
fail:
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"kernel_check", py_kernel_check, METH_VARARGS, kernel_check_doc},
    {"vexp", py_vexp, METH_VARARGS, vexp_doc},
    {"kinds", py_kinds, METH_NOARGS, "kinds() -> (name, ...): the kernel kinds checked, in order"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_kcheck",
    "pyattn's per-kernel checks (test-only; built by tests/kcheck.py, not installed).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* _C's capsule, checked against the layout this file was compiled with: a
 * _kcheck built from other sources than the _C it meets refuses to load
 * (tests/kcheck.py keys its build by the sources, so it rebuilds). */
PyMODINIT_FUNC PyInit__kcheck(void)
{
    const pa_families_api *a = PyCapsule_Import(PA_FAMILIES_API_NAME, 0);
    if (!a) return NULL;
    if (a->version != PA_FAMILIES_API_VERSION || a->size != (int)sizeof(pa_families_api)
        || a->family_size != (int)sizeof(pa_family) || a->isa_count != PA_ISA_COUNT || a->ndtypes != PA_NDTYPES) {
        PyErr_Format(PyExc_ImportError,
                     "_kcheck was built for another pyattn._C (families API version %d, family table %d bytes; "
                     "this _C has %d, %d bytes): rebuild pyattn and the checks from the same sources",
                     PA_FAMILIES_API_VERSION, (int)sizeof(pa_family), a->version, a->family_size);
        return NULL;
    }
    api = a;
    return PyModule_Create(&moddef);
}
