/*
 * bind_blockmask.c -- block masks' binding (bind_blockmask.h). Arrays come
 * through the buffer protocol (C-contiguous), so this file needs no NumPy
 * C API.
 */
#include "bind_blockmask.h"

const char pa_bm_pack_doc[] =
    "_bm_pack(m, tq, tk, L, S, state, bits)\n\n"
    "Private (pyattn.BlockMask's builder): m uint8/bool (n, 96, 60) C-contiguous, the bools\n"
    "of n tiles at tile rows tq and columns tk (int64 (n,)) of an L x S block mask; writes\n"
    "each tile's state (0 empty, 1 full, 2 partial) into state uint8 (n,) and its rows'\n"
    "bits into bits uint64 (n, 96).";

/* a C-contiguous buffer of n items of itemsize isz (n < 0: any count) */
static int get_buf(PyObject *o, const char *name, Py_ssize_t isz, Py_ssize_t n, int writable, Py_buffer *b)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (b->itemsize != isz || (n >= 0 && b->len != n * isz) || b->len % isz) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes, got %zd bytes of %zd",
                     name, n, isz, b->len, b->itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

PyObject *pa_py_bm_pack(PyObject *self, PyObject *args)
{
    PyObject *mo, *tqo, *tko, *so, *bo;
    Py_ssize_t L, S;
    Py_buffer b[5];
    int nb = 0;
    PyObject *res = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnnOO:_bm_pack", &mo, &tqo, &tko, &L, &S, &so, &bo)) return NULL;
    if (get_buf(tqo, "tq", 8, -1, 0, &b[nb]) < 0) goto fail;
    nb++;
    const Py_ssize_t n = b[0].len / 8;
    if (get_buf(mo, "m", 1, n * PA_BM_QB * PA_BM_KB, 0, &b[nb]) < 0) goto fail;
    nb++;
    if (get_buf(tko, "tk", 8, n, 0, &b[nb]) < 0) goto fail;
    nb++;
    if (get_buf(so, "state", 1, n, 1, &b[nb]) < 0) goto fail;
    nb++;
    if (get_buf(bo, "bits", 8, n * PA_BM_QB, 1, &b[nb]) < 0) goto fail;
    nb++;
    const int64_t *tq = b[0].buf, *tk = b[2].buf;
    for (Py_ssize_t k = 0; k < n; k++)
        if (tq[k] < 0 || tq[k] * PA_BM_QB >= L || tk[k] < 0 || tk[k] * PA_BM_KB >= S) {
            PyErr_SetString(PyExc_ValueError, "_bm_pack: a tile outside L x S");
            goto fail;
        }
    Py_BEGIN_ALLOW_THREADS
    pa_bm_pack(b[1].buf, n, tq, tk, L, S, b[3].buf, b[4].buf);
    Py_END_ALLOW_THREADS
    res = Py_NewRef(Py_None);
fail:
    while (nb > 0) PyBuffer_Release(&b[--nb]);
    return res;
}

void pa_bm_release(pa_bm_arg *arg)
{
    while (arg->nbuf > 0) PyBuffer_Release(&arg->buf[--arg->nbuf]);
}

static int bm_error(const char *what)
{
    PyErr_Format(PyExc_ValueError, "block_mask: %s", what);
    return -1;
}

/* the tile map's own consistency: states 0..2, a partial tile's number in
 * [0, npartial), slabs in [0, nslab) */
static int bm_check(const pa_bmask *m, pa_ssize ntiles, pa_ssize npartial, pa_ssize count)
{
    for (pa_ssize x = 0; x < ntiles; x++) {
        if (m->state[x] > PA_BM_PARTIAL) return bm_error("a tile state outside 0..2");
        if (m->state[x] == PA_BM_PARTIAL && (m->index[x] < 0 || m->index[x] >= npartial))
            return bm_error("a partial tile without its bits");
    }
    for (pa_ssize b = 0; b < count; b++)
        if (m->slab[b] < 0 || m->slab[b] >= m->nslab) return bm_error("a head outside the block mask");
    return 0;
}

int pa_bm_get(PyObject *o, pa_attn_call *c, pa_bm_arg *arg)
{
    arg->nbuf = 0;
    if (o == NULL || o == Py_None) return 0;
    PyObject *st, *ix, *bi, *sl;
    pa_bmask *m = &arg->m;
    Py_ssize_t L, S, qe, ke;
    if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "OOOOnnnn:block_mask", &st, &ix, &bi, &sl, &L, &S, &qe, &ke)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "block_mask: a tuple from BlockMask._c_arg");
        return -1;
    }
    if (L < 0 || S < 0 || qe < -PA_POS_MAX || qe > PA_POS_MAX || ke < -PA_POS_MAX || ke > PA_POS_MAX)
        return bm_error("L, S or an offset out of range");
    m->L = L; m->S = S;
    m->nqt = (L + PA_BM_QB - 1) / PA_BM_QB;
    m->nkt = (S + PA_BM_KB - 1) / PA_BM_KB;
    if (get_buf(st, "block_mask state", 1, -1, 0, &arg->buf[0]) < 0) return -1;
    arg->nbuf = 1;
    size_t per;
    const pa_ssize ntiles = arg->buf[0].len;
    if (!pa_mul_ok((size_t)m->nqt, (size_t)m->nkt, &per) || (per == 0 ? ntiles != 0 : ntiles % (pa_ssize)per))
        return bm_error("its tile map does not match L and S");
    m->nslab = per ? ntiles / (pa_ssize)per : PTRDIFF_MAX;   /* no tiles: nothing is read */
    if (get_buf(ix, "block_mask index", 8, ntiles, 0, &arg->buf[1]) < 0) return -1;
    arg->nbuf = 2;
    if (get_buf(bi, "block_mask bits", 8, -1, 0, &arg->buf[2]) < 0) return -1;
    arg->nbuf = 3;
    size_t nsl = (size_t)c->bt.count;         /* varlen: a slab per (sequence, head) */
    if (c->cu_seqlens_q && !pa_mul_ok((size_t)c->nseq, nsl, &nsl)) return bm_error("too many heads");
    if (get_buf(sl, "block_mask heads", 8, (Py_ssize_t)nsl, 0, &arg->buf[3]) < 0) return -1;
    arg->nbuf = 4;
    if (arg->buf[2].len / 8 % PA_BM_QB) return bm_error("bits of a partial tile cut short");
    m->state = arg->buf[0].buf;
    m->index = arg->buf[1].buf;
    m->bits = arg->buf[2].buf;
    m->slab = arg->buf[3].buf;
    m->q_extra = qe;
    m->k_extra = ke;
    if (bm_check(m, ntiles, arg->buf[2].len / 8 / PA_BM_QB, (pa_ssize)nsl) < 0) return -1;
    c->block_mask = m;
    return 0;
}
