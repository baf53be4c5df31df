/*
 * bind_paged.c -- _C.sdpa's paged caches (bind_paged.h): the pools and the
 * block table checked and described for the frame (pa_cache, ops/ops.h), and the
 * new rows written into their pages by the call's `before` hook (once
 * everything is allocated: a failing call writes nothing). pyattn/_paged.py
 * gives the user-facing checks and messages; these repeat what the C code
 * relies on, so a direct call can raise but never crash.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <numpy/arrayobject.h>
#include <string.h>

#include "pyattn.h"
#include "bind_paged.h"
#include "ops/quant.h"
#include "bind_rotary.h"
#include "bind_nd.h"

/* a 4-D pool / rows array or the 2-D table (bind_nd.h), of dtype want_dt */
typedef pa_nd parr;

static int get_arr(PyObject *o, const char *name, int nd, int want_dt, int writeable, parr *r)
{
    const int dt = pa_nd_dtype(o, name);
    if (dt == -1 && PyErr_Occurred()) return -1;
    if (dt != want_dt) {
        PyErr_Format(PyExc_TypeError, "%s has the wrong dtype (%s expected)", name,
                     want_dt == PA_ND_INT64 ? "int64" : "the dtype of the matching cache operand");
        return -1;
    }
    r->dtype = dt;
    return pa_nd_view(o, name, nd, writeable, r);
}

/* where logical row r of sequence b lies: its block (the identity for a
 * contiguous cache) and its row in the block */
static inline pa_ssize append_block(const pa_kv_append *a, pa_ssize b, pa_ssize r, pa_ssize *rr)
{
    if (!a->table) { *rr = r; return b; }
    *rr = r % a->bsz;
    return (pa_ssize)a->table[b * a->tbs0 + r / a->bsz];
}

/* new row t of sequence b, head h, pool x, at logical row r */
static void append_row(const pa_kv_append *a, int x, pa_ssize b, pa_ssize h, pa_ssize t, pa_ssize r)
{
    const pa_ssize es = (pa_ssize)a->es[x], D = a->D[x];
    const pa_ssize *ps = a->pst[x], *rs = a->rst[x];
    pa_ssize rr;
    const pa_ssize blk = append_block(a, b, r, &rr);
    char *dst = a->pool[x] + (blk * ps[0] + h * ps[1] + rr * ps[2]) * es;
    const char *src = a->rows[x] + (a->cu ? ((pa_ssize)a->cu[b] + t) * rs[0] + h * rs[1]
                                          : b * rs[0] + h * rs[1] + t * rs[2]) * (pa_ssize)a->res[x];
    const int rot = a->rot && x == 0;
    if (a->bits[x]) {                   /* float32 rows quantized (finite: pa_kv_append_check) */
        const pa_ssize *ss = a->sst[x];
        float *srow = a->sc[x] + blk * ss[0] + h * ss[1] + rr * ss[2];
        float tmp[PA_QROT_MAXD];
        if (rot) pa_rope_row(&a->rope, r, src, PA_F32, rs[3], tmp, PA_F32, 1, D);
        (void)pa_quant_row(a->bits[x], rot ? tmp : (const float *)src, rot ? 1 : rs[3], D, a->G[x], dst, ps[3],
                           srow, ss[3]);
    } else if (rot)
        pa_rope_row(&a->rope, r, src, a->rope.dt, rs[3], dst, a->kdt, ps[3], D);
    else if (ps[3] == 1 && rs[3] == 1)
        memmove(dst, src, (size_t)(D * es));
    else
        for (pa_ssize e = 0; e < D; e++) memmove(dst + e * ps[3] * es, src + e * rs[3] * es, (size_t)es);
}

void pa_kv_append_run(void *ctx)
{
    const pa_kv_append *a = (const pa_kv_append *)ctx;
    for (int x = 0; x < 2; x++)
        for (pa_ssize b = 0; b < a->B; b++) {
            const pa_ssize T = a->cu ? (pa_ssize)(a->cu[b + 1] - a->cu[b]) : a->T;
            for (pa_ssize h = 0; h < a->H; h++)
                for (pa_ssize t = 0; t < T; t++) append_row(a, x, b, h, t, (pa_ssize)a->pos[b] + t);
        }
}

int pa_kv_append_check(const pa_kv_append *ap, const char *seq, const char *pool)
{
    static const char *rn[2] = {"key", "value"};
    if (ap->rot && ap->bits[0] && ap->D[0] > PA_QROT_MAXD) {
        PyErr_Format(PyExc_ValueError, "rotary with a quantized k_cache takes head dims up to %d, got %zd",
                     PA_QROT_MAXD, (Py_ssize_t)ap->D[0]);
        return -1;
    }
    for (pa_ssize b = 0; ap->rot && b < ap->B; b++)
        if (pa_rope_check_rows(&ap->rope, b, ap->pos[b], ap->cu ? (pa_ssize)(ap->cu[b + 1] - ap->cu[b]) : ap->T) < 0)
            return -1;
    for (int x = 0; x < 2; x++) {       /* quantized: every new row finite, before anything is written */
        const pa_ssize shape[3] = {ap->B, ap->H, ap->T};
        pa_ssize at[3];
        if (ap->bits[x] && !pa_quant_rows_finite((const float *)ap->rows[x], ap->rst[x], shape, ap->D[x],
                                                 ap->rot && x == 0 ? &ap->rope : NULL, ap->pos, at)) {
            PyErr_Format(PyExc_ValueError, "%s holds NaN or infinity (%s %zd, head %zd, row %zd): the %s "
                         "%s's scales cannot hold it; nothing was written", rn[x], seq, (Py_ssize_t)at[0],
                         (Py_ssize_t)at[1], (Py_ssize_t)at[2], pa_dtypes[ap->bits[x] == 8 ? PA_I8 : ap->bits[x] == 4 ? PA_I4
                                   : ap->bits[x] == PA_QF8E4 ? PA_F8E4 : PA_F8E5].name,
                         pool);
            return -1;
        }
    }
    return 0;
}

/* every entry of table row b for logical rows [0, n) in [0, nblocks) */
static int check_entries(const int64_t *row, pa_ssize n, pa_ssize bs, pa_ssize nblocks, pa_ssize b)
{
    for (pa_ssize i = 0; i < (n + bs - 1) / bs; i++)
        if (row[i] < 0 || row[i] >= (int64_t)nblocks) {
            PyErr_Format(PyExc_ValueError, "block_table[%zd, %zd] is %lld: the call reads or writes "
                         "that block, so it must be in [0, %zd); nothing was written",
                         (Py_ssize_t)b, (Py_ssize_t)i, (long long)row[i], (Py_ssize_t)nblocks);
            return -1;
        }
    return 0;
}

/* append = (key, value, positions[, rotary]): the tables of rotary (the
 * keys' compute dtype, their head dim) into ap->rope, ap->rot = 1 */
static int get_rot(PyObject *o, const parr *pool, pa_kv_append *ap)
{
    if (!PyTuple_Check(o) || (PyTuple_GET_SIZE(o) != 3 && PyTuple_GET_SIZE(o) != 4)) {
        PyErr_SetString(PyExc_TypeError, "append must be (key, value, positions[, rotary]) with paged=");
        return -1;
    }
    ap->rot = PyTuple_GET_SIZE(o) == 4;
    ap->kdt = pool[0].dtype;
    return ap->rot ? pa_bind_rope(PyTuple_GET_ITEM(o, 3), pa_dtypes[pool[0].dtype].compute,
                                  pool[0].shape[3] * (pool[0].dtype == PA_I4 ? 2 : 1), &ap->rope) : 0;
}

/* packed new rows (cu_seqlens_q): key / value (total, H, E / Ev) as the pools
 * are stored, positions (nseq,) int64, each with pos + T_i <= the table's rows */
static int get_rows_packed(PyObject *o, const parr *pool, pa_attn_call *c, const pa_cache *pg, pa_kv_append *ap)
{
    static const char *rn[2] = {"key", "value"};
    if (get_rot(o, pool, ap) < 0) return -1;
    parr r[2], pos;
    const pa_ssize B = c->nseq;
    for (int x = 0; x < 2; x++) {
        if (get_arr(PyTuple_GET_ITEM(o, x), rn[x], 3, ap->rot && !x ? ap->rope.dt : pool[x].dtype, 0, &r[x]) < 0)
            return -1;
        if (r[x].shape[0] != c->L || r[x].shape[1] != pool[x].shape[1] || r[x].shape[2] != pool[x].shape[3]) {
            PyErr_Format(PyExc_ValueError, "%s must be (total, Hkv, %s) as the query tokens and the pools are",
                         rn[x], x ? "Ev" : "E");
            return -1;
        }
        ap->pool[x] = pool[x].data;
        ap->rows[x] = r[x].data;
        memcpy(ap->pst[x], pool[x].st, sizeof(ap->pst[x]));
        ap->rst[x][0] = r[x].st[0]; ap->rst[x][1] = r[x].st[1];
        ap->rst[x][2] = 0; ap->rst[x][3] = r[x].st[2];
        ap->D[x] = pool[x].shape[3];
        ap->es[x] = pa_elsize(pool[x].dtype);
        ap->res[x] = ap->rot && !x ? pa_elsize(ap->rope.dt) : ap->es[x];
    }
    if (get_arr(PyTuple_GET_ITEM(o, 2), "positions", 1, PA_ND_INT64, 0, &pos) < 0) return -1;
    if (pos.shape[0] != B || pos.st[0] != 1) {
        PyErr_SetString(PyExc_ValueError, "positions must be a contiguous (nseq,) int64 array");
        return -1;
    }
    ap->pos = (const int64_t *)pos.data;
    ap->B = B; ap->H = pool[0].shape[1]; ap->T = 0; ap->cu = c->cu_seqlens_q;
    ap->table = pg->table; ap->tbs0 = pg->tbs[0]; ap->bsz = pg->block_size;
    for (pa_ssize b = 0; b < B; b++) {
        const pa_ssize T = (pa_ssize)(c->cu_seqlens_q[b + 1] - c->cu_seqlens_q[b]);
        if (T > c->S || ap->pos[b] < 0 || ap->pos[b] > (int64_t)(c->S - T) ||
            c->kv_len[b * c->bt.count] != ap->pos[b] + T) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens + T exceeds the block table or differs from kv_len: "
                         "entry %zd is %lld, T = %zd, rows = %zd; nothing was written", (Py_ssize_t)b,
                         (long long)ap->pos[b], (Py_ssize_t)T, (Py_ssize_t)c->S);
            return -1;
        }
        if (check_entries(pg->table + b * pg->tbs[0], (pa_ssize)ap->pos[b] + T, pg->block_size,
                          pool[0].shape[0], b) < 0)
            return -1;
    }
    if (pa_kv_append_check(ap, "sequence", "pool") < 0) return -1;
    c->before = pa_kv_append_run;
    c->before_ctx = ap;
    return 0;
}

/* the new rows: key / value (B, H, T, E / Ev) as the pools are stored, and
 * their positions (B,) int64, each with pos + T <= the table's rows */
static int get_rows(PyObject *o, const parr *pool, pa_attn_call *c, const pa_cache *pg, pa_kv_append *ap)
{
    static const char *rn[2] = {"key", "value"};
    if (get_rot(o, pool, ap) < 0) return -1;
    parr r[2], pos;
    for (int x = 0; x < 2; x++) {
        const int bits = pa_qbits(pool[x].dtype);
        if (get_arr(PyTuple_GET_ITEM(o, x), rn[x], 4, bits ? PA_F32 : ap->rot && !x ? ap->rope.dt : pool[x].dtype,
                    0, &r[x]) < 0)
            return -1;
        if (r[x].shape[0] != c->bt.shape[0] || r[x].shape[1] != pool[x].shape[1] ||
            r[x].shape[2] != r[0].shape[2] || r[x].shape[3] != (x ? c->Ev : c->E)) {
            PyErr_Format(PyExc_ValueError, "%s must be (B, Hkv, T, %s) as the pools and the batch are",
                         rn[x], x ? "Ev" : "E");
            return -1;
        }
        ap->pool[x] = pool[x].data;
        ap->rows[x] = r[x].data;
        memcpy(ap->pst[x], pool[x].st, sizeof(ap->pst[x]));
        memcpy(ap->rst[x], r[x].st, sizeof(ap->rst[x]));
        ap->D[x] = x ? c->Ev : c->E;
        ap->es[x] = pa_elsize(pool[x].dtype);
        ap->res[x] = bits ? sizeof(float) : ap->rot && !x ? pa_elsize(ap->rope.dt) : ap->es[x];
        ap->bits[x] = bits;
        if (bits) {                         /* its scale pool (bind_scale_pools) */
            const pa_cache *qs = pg;
            const pa_operand *so = x ? &qs->vs : &qs->ks;
            ap->sc[x] = (float *)(uintptr_t)so->p;
            ap->sst[x][0] = x ? qs->vs_blk : qs->ks_blk;
            ap->sst[x][1] = so->bs[1];
            ap->sst[x][2] = so->rs;
            ap->sst[x][3] = 1;
            ap->G[x] = x ? qs->vG : qs->kG;
        }
    }
    if (get_arr(PyTuple_GET_ITEM(o, 2), "positions", 1, PA_ND_INT64, 0, &pos) < 0) return -1;
    const pa_ssize B = c->bt.shape[0], T = r[0].shape[2];
    if (pos.shape[0] != B || pos.st[0] != 1) {
        PyErr_SetString(PyExc_ValueError, "positions must be a contiguous (B,) int64 array");
        return -1;
    }
    ap->pos = (const int64_t *)pos.data;
    ap->B = B; ap->H = pool[0].shape[1]; ap->T = T; ap->cu = NULL;
    ap->table = pg->table; ap->tbs0 = pg->tbs[0]; ap->bsz = pg->block_size;
    for (pa_ssize b = 0; b < B; b++) {
        if (T > c->S || ap->pos[b] < 0 || ap->pos[b] > (int64_t)(c->S - T)) {
            PyErr_Format(PyExc_ValueError, "cache_seqlens + T exceeds the block table: entry %zd is %lld, "
                         "T = %zd, rows = %zd; nothing was written", (Py_ssize_t)b, (long long)ap->pos[b],
                         (Py_ssize_t)T, (Py_ssize_t)c->S);
            return -1;
        }
        if (check_entries(pg->table + b * pg->tbs[0], (pa_ssize)ap->pos[b] + T, pg->block_size,
                          pool[0].shape[0], b) < 0)
            return -1;
    }
    if (pa_kv_append_check(ap, "sequence", "pool") < 0) return -1;
    c->before = pa_kv_append_run;
    c->before_ctx = ap;
    return 0;
}

/* a quantized call's scale pools (paged's entries 3, 4): float32 (num_blocks,
 * Hkv, block_size, D / G) for each quantized pool (G: the stand-ins' group,
 * in qs), None for a float one; then qs's operands read them (per flat b the
 * pool's [0, h, 0, 0]; rows through the block table) */
static int bind_scale_pools(PyObject *paged, int writeable, const parr *pool, pa_cache *qs)
{
    static const char *sn[2] = {"k_scale", "v_scale"};
    pa_operand *op[2] = {&qs->ks, &qs->vs};
    const pa_ssize G[2] = {qs->kG, qs->vG};
    pa_ssize *blk[2] = {&qs->ks_blk, &qs->vs_blk};
    for (int x = 0; x < 2; x++) {
        PyObject *o = PyTuple_GET_ITEM(paged, 3 + x);
        if (!op[x]->p) {
            if (o != Py_None) {
                PyErr_Format(PyExc_ValueError, "%s pool is given but that pool is not int8 / int4 / fp8", sn[x]);
                return -1;
            }
            continue;
        }
        parr sp;
        if (get_arr(o, sn[x], 4, PA_F32, writeable, &sp) < 0) return -1;
        const pa_ssize vals = pool[x].shape[3] * (pool[x].dtype == PA_I4 ? 2 : 1);
        /* an empty pool (no block) is never read: NumPy gives it any strides */
        const int empty = sp.shape[0] == 0 || sp.shape[1] == 0 || sp.shape[2] == 0;
        if (sp.shape[0] != pool[x].shape[0] || sp.shape[1] != pool[x].shape[1] ||
            sp.shape[2] != pool[x].shape[2] || sp.shape[3] * G[x] != vals ||
            (sp.shape[3] > 1 && sp.st[3] != 1 && !empty)) {
            PyErr_Format(PyExc_ValueError, "the %s pool must be (num_blocks, Hkv, block_size, groups) as its "
                         "cache pool, with contiguous groups", sn[x]);
            return -1;
        }
        op[x]->p = sp.data;
        for (int d = 0; d < PA_MAXDIMS; d++) op[x]->bs[d] = d == 1 ? sp.st[1] : 0;
        op[x]->rs = sp.st[2];
        *blk[x] = sp.st[0];
    }
    return 0;
}

int pa_bind_paged(PyObject *paged, PyObject *append, pa_attn_call *c, pa_cache *pg, pa_kv_append *ap)
{
    static const char *pn[2] = {"k_cache", "v_cache"};
    if (PyArray_API == NULL && _import_array() < 0) return -1;   /* this file's NumPy API table (NumPy 1.x and 2.x) */
    memset(ap, 0, sizeof *ap);                         /* (bits[], cu: 0 unless set below) */
    pa_cache *qs = pa_call_quant(c) ? pg : NULL;        /* its scales' stand-ins: rebound below */
    if (!PyTuple_Check(paged) || PyTuple_GET_SIZE(paged) != (qs ? 5 : 3)) {
        PyErr_SetString(PyExc_TypeError, qs ? "paged must be (k_pool, v_pool, block_table, k_scale_pool, "
                                              "v_scale_pool) with k_scale / v_scale"
                                            : "paged must be (k_pool, v_pool, block_table)");
        return -1;
    }
    parr pool[2], tb;
    const int dts[2] = {c->k_dt, c->v_dt};
    for (int x = 0; x < 2; x++) {
        if (get_arr(PyTuple_GET_ITEM(paged, x), pn[x], 4, dts[x], append != Py_None, &pool[x]) < 0) return -1;
        if (pool[x].shape[0] != pool[0].shape[0] || pool[x].shape[1] != pool[0].shape[1] ||
            pool[x].shape[2] != pool[0].shape[2] ||
            pool[x].shape[3] * (dts[x] == PA_I4 ? 2 : 1) != (x ? c->Ev : c->E)) {
            PyErr_Format(PyExc_ValueError, "%s must be (num_blocks, Hkv, block_size, %s), as k_cache", pn[x],
                         x ? "Ev" : "E");
            return -1;
        }
    }
    if (get_arr(PyTuple_GET_ITEM(paged, 2), "block_table", 2, PA_ND_INT64, 0, &tb) < 0) return -1;
    const pa_ssize nblocks = pool[0].shape[0], H = pool[0].shape[1], bs = pool[0].shape[2];
    const int packed = c->cu_seqlens_q != NULL;   /* batch (H) or (Hkv, G); rows: the sequences */
    if (packed && (bs < 1 || c->bt.count < 1 || (tb.st[1] != 1 && tb.shape[1] > 1) || c->bt.nb < 1 || c->bt.shape[0] != H || tb.shape[0] != c->nseq ||
                   tb.shape[1] > PTRDIFF_MAX / bs || tb.shape[1] * bs != c->S)) {
        PyErr_SetString(PyExc_ValueError, "paged with cu_seqlens_q: the batch axes must be (Hkv, ...) with Hkv "
                        "= the pools' heads, the block table one row per sequence, and S = its columns x "
                        "block_size (>= 1)");
        return -1;
    }
    if (!packed && (bs < 1 || tb.st[1] != 1 || c->bt.nb < 2 || c->bt.shape[0] != tb.shape[0] || c->bt.shape[1] != H ||
        tb.shape[1] > PTRDIFF_MAX / bs || tb.shape[1] * bs != c->S)) {
        PyErr_SetString(PyExc_ValueError, "paged: the batch axes must be (B, Hkv, ...) with B = the block "
                        "table's rows, Hkv = the pools' heads, and S = its columns x block_size (>= 1)");
        return -1;
    }
    pg->table = (const int64_t *)tb.data;
    memset(pg->tbs, 0, sizeof pg->tbs);
    pg->tbs[0] = tb.st[0];
    pg->block_size = bs;
    pg->k_blk = pool[0].st[0]; pg->v_blk = pool[1].st[0];
    pg->k_rs = pool[0].st[2]; pg->v_rs = pool[1].st[2];
    pa_operand *kv[2] = {&c->k, &c->v};
    for (int x = 0; x < 2; x++) {             /* element [0, h, 0, 0] of the pool per flat b */
        kv[x]->p = pool[x].data;
        for (int d = 0; d < c->bt.nb; d++) kv[x]->bs[d] = d == (packed ? 0 : 1) ? pool[x].st[1] : 0;
        kv[x]->rs = 0;                       /* rows through the table (pa_kv_row) */
        kv[x]->cs = pool[x].st[3];
    }
    c->cache = pg;
    if (qs && bind_scale_pools(paged, append != Py_None, pool, qs) < 0) return -1;
    for (pa_ssize i = 0; packed && i < c->nseq; i++) {  /* the rows each sequence reads (any head) */
        int64_t n = 0;
        for (pa_ssize b = 0; b < c->bt.count; b++)
            if (c->kv_len[i * c->bt.count + b] > n) n = c->kv_len[i * c->bt.count + b];
        if (check_entries(pg->table + i * pg->tbs[0], (pa_ssize)n, bs, nblocks, i) < 0) return -1;
    }
    if (packed && qs) {
        PyErr_SetString(PyExc_ValueError, "packed queries (cu_seqlens_q) over quantized paged pools run per "
                        "token count (pyattn/_paged.py), not as one call");
        return -1;
    }
    if (packed) return append == Py_None ? 0 : get_rows_packed(append, pool, c, pg, ap);
    for (pa_ssize b = 0; b < c->bt.count; b++) {   /* the rows the call reads */
        const pa_ssize n = c->kv_len ? (pa_ssize)c->kv_len[b] : c->S;
        if (check_entries(pa_cache_table_row(c, b), n, bs, nblocks, pa_batch_offset(&c->bt, pg->tbs, b) / (tb.st[0] ? tb.st[0] : 1)) < 0)
            return -1;
    }
    return append == Py_None ? 0 : get_rows(append, pool, c, pg, ap);
}
