/*
 * module.c -- the CPython / NumPy binding of pyattn._C: its method table
 * and PyInit__C. The entries live in the bind_*.c files (csrc/README.md's
 * file map).
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

#include "families_api.h"
#include "bind_sdpa.h"
#include "bind_matmul.h"
#include "bind_config.h"
#include "bind_views.h"
#include "bind_quant.h"
#include "bind_blockmask.h"
#include "bind_rotary.h"
#include "bind_ukr.h"
#include "threads.h"

/* threadpoolctl (pyattn/_threadpoolctl.py) reaches the pool through ctypes,
 * as it reaches OpenBLAS's: these two and PyInit__C are the only symbols the
 * extension exports (it is built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define PA_EXPORT __attribute__((visibility("default")))
#else
#define PA_EXPORT
#endif
PA_EXPORT int pyattn_threadpool_get_num_threads(void) { return pa_get_num_threads(); }
PA_EXPORT int pyattn_threadpool_set_num_threads(int n)
{
    const int rc = pa_set_num_threads(n);
    pa_ws_release();              /* the kept workspace was sized for the old count */
    return rc;
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))pa_py_matmul, METH_VARARGS | METH_KEYWORDS, pa_matmul_doc},
    {"softmax", (PyCFunction)(void (*)(void))pa_py_softmax, METH_VARARGS | METH_KEYWORDS, pa_softmax_doc},
    {"softmax_backward", pa_py_softmax_backward, METH_VARARGS, pa_softmax_backward_doc},
    {"sdpa", (PyCFunction)(void (*)(void))pa_py_sdpa, METH_VARARGS | METH_KEYWORDS, pa_sdpa_doc},
    {"rotary", (PyCFunction)(void (*)(void))pa_py_rotary, METH_VARARGS | METH_KEYWORDS, pa_rotary_doc},
    {"sdpa_backward", (PyCFunction)(void (*)(void))pa_py_sdpa_backward, METH_VARARGS | METH_KEYWORDS,
     pa_sdpa_backward_doc},
    {"merge", (PyCFunction)(void (*)(void))pa_py_merge, METH_VARARGS | METH_KEYWORDS, pa_merge_doc},
    {"set_num_threads", pa_py_set_num_threads, METH_O, "set_num_threads(n): threads for the kernels"},
    {"get_num_threads", pa_py_get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"select_isa", pa_py_select_isa, METH_O,
     "select_isa(code) -> code chosen (-1: best); calls already running keep their family"},
    {"config", pa_py_config, METH_NOARGS, "config() -> dict of the kernels in use"},
    {"set_decode_read", pa_py_set_decode_read, METH_O,
     "set_decode_read(mode) -> the mode before: how decode reads a float cache ('hw', 't2', 'nta', 'gather')"},
    {"families", pa_py_families, METH_NOARGS,
     "families() -> ((word, code, built), ...): the kernel families in code order"},
    {"fma_probe", pa_py_fma_probe, METH_O,
     "fma_probe(iters) -> float32 flops done at the family's vector width (None: generic)"},
    {"bf16_probe", pa_py_bf16_probe, METH_O,
     "bf16_probe(iters) -> flops done by vdpbf16ps chains (None: no AVX512_BF16 in this family)"},
    {"read_probe", pa_py_read_probe, METH_O,
     "read_probe(buf) -> sum of a float32 1-D C-contiguous array, read once on the threads in use"},
    {"gemm_probe", pa_py_gemm_probe, METH_VARARGS,
     "gemm_probe(dtype, kc, iters) -> flops done by the GEMM micro-kernel on L1-resident panels"},
    {"_alloc_hook", pa_py_alloc_hook, METH_O,
     "_alloc_hook(n) -> (pending, live): tests only; the n-th allocation from now fails (0: off)"},
    {"quantize", pa_py_quantize, METH_VARARGS, pa_quantize_doc},
    {"dequantize", pa_py_dequantize, METH_VARARGS, pa_dequantize_doc},
    {"_bm_pack", pa_py_bm_pack, METH_VARARGS, pa_bm_pack_doc},
    {"_ukr_info", pa_py_ukr_info, METH_NOARGS, pa_ukr_info_doc},
    {"_ukr_select", pa_py_ukr_select, METH_O, pa_ukr_select_doc},
    {"_ukr_classify", pa_py_ukr_classify, METH_VARARGS, pa_ukr_classify_doc},
    {NULL, NULL, 0, NULL},
};

/* module teardown: the ops' kept workspace (ops.h, pa_ws_take) and the
 * outputs' kept memory (bind_views.h, pa_new_array_kept) */
static void module_free(void *m)
{
    (void)m;
    pa_ws_release();
    pa_kept_release();
}

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_C", "pyattn's C kernels (private; use the pyattn package).", -1, methods,
    NULL, NULL, NULL, module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    if (pa_views_import() < 0) return NULL;
    pa_config_init();
    PyObject *m = PyModule_Create(&moddef);
    /* the kernel checks' test-only extension reaches the family tables through this
     * private capsule (families_api.h; csrc/check/kcheck_module.c): static data, no cost */
    PyObject *cap = m ? PyCapsule_New((void *)&pa_families_api_table, PA_FAMILIES_API_NAME, NULL) : NULL;
    if (!cap || PyModule_AddObject(m, "_families_capsule", cap) < 0) {
        Py_XDECREF(cap);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
