/*
 * bind_config.c -- the kernel family in use, threads, select_isa, config,
 * families, the benchmark's probes and the allocation-failure test hook
 * (bind_config.h).
 */
#include "bind_views.h"
#include "bind_config.h"
#include "dispatch.h"
#include "threads.h"
#include "cpu.h"

#include <stdio.h>
#include <string.h>

/* The kernel family new calls use (dispatch.c chooses it; select_isa
 * changes it). Read and written with the GIL held only: each entry point
 * reads it once, before releasing the GIL, and hands it to its op, so a
 * call keeps its family even if another thread changes this meanwhile. */
static const pa_family *family = NULL;

void pa_config_init(void)
{
    family = pa_choose_family(-1);
    pa_dec_read_set(pa_cpu_decode_read());
}

static const char *const pa_read_words[PA_READ_COUNT] = {"hw", "nta", "gather", "t2"};

/* set_decode_read(word) -> the word before: how decode reads a float cache
 * from now on (family.h, PA_READ_*; the same results whatever it is) */
PyObject *pa_py_set_decode_read(PyObject *self, PyObject *arg)
{
    const char *w = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!w) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "mode must be a str: 'hw', 't2', 'nta' or 'gather'");
        return NULL;
    }
    int mode = -1;
    for (int i = 0; i < PA_READ_COUNT; i++)
        if (!strcmp(w, pa_read_words[i])) mode = i;
    if (mode < 0) {
        PyErr_Format(PyExc_ValueError, "mode must be 'hw', 't2', 'nta' or 'gather', got %R", arg);
        return NULL;
    }
    const int old = pa_dec_read();
    pa_dec_read_set(mode);
    return PyUnicode_FromString(pa_read_words[old]);
}

const pa_family *pa_family_now(void)
{
    return family;
}

/* Threads for this call: a private nthreads argument in [1, PA_MAX_THREADS]
 * (pyattn.dask gives each task its share of a worker), else the pool's. */
int pa_call_threads(int req)
{
    return (req >= 1 && req <= PA_MAX_THREADS) ? req : pa_get_num_threads();
}

PyObject *pa_py_set_num_threads(PyObject *self, PyObject *arg)
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
    pa_ws_release();         /* the ops' kept workspace was sized for the old count */
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_SetString(PyExc_RuntimeError, "threads could not be started");
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *pa_py_get_num_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(pa_get_num_threads());
}

PyObject *pa_py_select_isa(PyObject *self, PyObject *arg)
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

PyObject *pa_py_config(PyObject *self, PyObject *unused)
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
    unsigned long long shared_blocks, shared_saved;
    pa_cascade_stats(&shared_blocks, &shared_saved);
    PyObject *kernels = kernel_names(f);
    if (!kernels) return NULL;
    return Py_BuildValue(
        "{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:n,s:n,s:n,"
        "s:(iiiii),s:(iiiii),s:(ii),s:(ii),s:N,s:s,s:K,s:K,s:s}",
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
        "kernels", kernels, "gemm_blocking_from", gnote,
        "shared_blocks", shared_blocks, "shared_reads_saved", shared_saved,
        "decode_read", pa_read_words[pa_dec_read()]);
}

/* families() -> ((word, code, built), ...): the rows of PA_FAMILIES
 * (registry.h) in code order; built: this build has the family (its
 * architecture's). pyattn reads PYATTN_ISA's words from it, CI the
 * families it runs the tests on. */
PyObject *pa_py_families(PyObject *self, PyObject *unused)
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

PyObject *pa_py_bf16_probe(PyObject *self, PyObject *arg)
{
    return run_probe(arg, family->bf16_probe);
}

PyObject *pa_py_fma_probe(PyObject *self, PyObject *arg)
{
    return run_probe(arg, family->fma_probe);
}

/* gemm_probe(dtype, kc, iters) -> flops: the GEMM micro-kernel in use, alone
 * on L1-resident panels (pa_gemm_probe); time it around. */
PyObject *pa_py_gemm_probe(PyObject *self, PyObject *args)
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

/* read_probe(buf) -> sum: the benchmark's read-bandwidth probe over a
 * float32 C-contiguous 1-D array (time it around), on the threads in use. */
PyObject *pa_py_read_probe(PyObject *self, PyObject *arg)
{
    pa_view b;
    if (pa_get_view(arg, "buf", 1, 0, 0, &b) < 0) return NULL;
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
PyObject *pa_py_alloc_hook(PyObject *self, PyObject *arg)
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
