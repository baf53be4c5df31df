/*
 * softmax.c -- masked, scaled softmax over the last axis.
 *
 * Shapes: x (R..., S), mask broadcast to x's shape (stride-0 views), out like
 * x. With causal masking the last batch axis is L (the rows of an (L, S)
 * score matrix) and row i keeps columns j under pa_causal_limit.
 * A task is a fixed chunk of rows; each row is computed alone, so results do
 * not depend on the thread count.
 */
#include "ops.h"
#include "threads.h"

typedef struct {
    pa_softmax_fn fn;       /* the call's family's row kernel */
    int dtype;
    const pa_batch *bt;
    pa_ssize S, rows, chunk, L;
    const pa_operand *x, *mask, *out;
    int mask_kind, causal;
    double scale;
} softmax_ctx;

static void softmax_task(void *ctx_, pa_ssize t, int tid)
{
    const softmax_ctx *c = (const softmax_ctx *)ctx_;
    const pa_ssize es = (pa_ssize)pa_elsize(c->dtype);
    const pa_ssize r0 = t * c->chunk;
    const pa_ssize r1 = pa_min(r0 + c->chunk, c->rows);
    for (pa_ssize r = r0; r < r1; r++) {
        pa_softmax_row row;
        row.S = c->S;
        row.x = (const char *)c->x->p + pa_batch_offset(c->bt, c->x->bs, r) * es;
        row.x_cs = c->x->cs;
        row.out = (char *)c->out->p + pa_batch_offset(c->bt, c->out->bs, r) * es;
        row.o_cs = c->out->cs;
        row.mask = pa_mask_of(c->bt, c->mask, c->mask_kind, c->dtype, r);
        row.limit = c->causal ? pa_causal_limit(c->causal, r % c->L, c->L, c->S) : c->S;
        row.scale = c->scale;
        c->fn(&row);
    }
}

int pa_softmax(const pa_family *fam, const pa_softmax_call *sm, int nthreads)
{
    const int dtype = sm->dtype, mask_kind = sm->mask_kind, causal = sm->causal;
    const pa_batch *bt = sm->bt;
    const pa_ssize S = sm->S;
    const pa_operand *x = sm->x, *mask = sm->mask, *out = sm->out;
    const double scale = sm->scale;
    if (bt->count == 0 || S == 0) return 0;
    softmax_ctx c;
    c.fn = fam->softmax[dtype].fn;
    c.dtype = dtype; c.bt = bt; c.S = S; c.rows = bt->count;
    c.x = x; c.mask = mask; c.out = out; c.mask_kind = mask_kind;
    c.causal = causal; c.scale = scale;
    c.L = (causal && bt->nb > 0) ? bt->shape[bt->nb - 1] : 1;
    /* about 16K elements per task, at least one row */
    c.chunk = S >= 16384 ? 1 : 16384 / S;
    const pa_ssize ntasks = (c.rows + c.chunk - 1) / c.chunk;
    pa_parallel_for(ntasks, softmax_task, &c, nthreads);
    return 0;
}

/* ---- the softmax backward: gx = scale * y * (gy - sum(gy * y)) per row,
 * 0 where y is 0 (masked entries). The row sum runs in order, in the
 * compute dtype; rows are independent, chunked as above. */
typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize S, rows, chunk;
    const pa_operand *gy, *y, *out;
    double scale;
} softmax_bwd_ctx;

#define PA_DEFINE_SMBWD(T, DT)                                                                  \
    static void softmax_bwd_row_##DT(const T *gy, pa_ssize gcs, const T *y, pa_ssize ycs,      \
                                     T *gx, pa_ssize ocs, pa_ssize S, T scale)                 \
    {                                                                                           \
        T d = 0;                                                                                \
        for (pa_ssize j = 0; j < S; j++) d += gy[j * gcs] * y[j * ycs];                         \
        for (pa_ssize j = 0; j < S; j++) {                                                      \
            const T yj = y[j * ycs];                                                            \
            gx[j * ocs] = yj == 0 ? (T)0 : scale * yj * (gy[j * gcs] - d);                      \
        }                                                                                       \
    }
PA_DEFINE_SMBWD(float, f32)
PA_DEFINE_SMBWD(double, f64)
#undef PA_DEFINE_SMBWD

static void softmax_bwd_task(void *ctx_, pa_ssize t, int tid)
{
    const softmax_bwd_ctx *c = (const softmax_bwd_ctx *)ctx_;
    const pa_ssize es = (pa_ssize)pa_elsize(c->dtype);
    const pa_ssize r0 = t * c->chunk;
    const pa_ssize r1 = pa_min(r0 + c->chunk, c->rows);
    for (pa_ssize r = r0; r < r1; r++) {
        const char *gy = (const char *)c->gy->p + pa_batch_offset(c->bt, c->gy->bs, r) * es;
        const char *y = (const char *)c->y->p + pa_batch_offset(c->bt, c->y->bs, r) * es;
        char *gx = (char *)c->out->p + pa_batch_offset(c->bt, c->out->bs, r) * es;
        if (c->dtype == PA_F32)
            softmax_bwd_row_f32((const float *)gy, c->gy->cs, (const float *)y, c->y->cs, (float *)gx,
                                c->out->cs, c->S, (float)c->scale);
        else
            softmax_bwd_row_f64((const double *)gy, c->gy->cs, (const double *)y, c->y->cs, (double *)gx,
                                c->out->cs, c->S, c->scale);
    }
}

int pa_softmax_backward(int dtype, const pa_batch *bt, pa_ssize S, const pa_operand *gy,
                        const pa_operand *y, double scale, const pa_operand *out, int nthreads)
{
    if (bt->count == 0 || S == 0) return 0;
    softmax_bwd_ctx c;
    c.dtype = dtype; c.bt = bt; c.S = S; c.rows = bt->count;
    c.gy = gy; c.y = y; c.out = out; c.scale = scale;
    c.chunk = S >= 16384 ? 1 : 16384 / S;
    pa_parallel_for((c.rows + c.chunk - 1) / c.chunk, softmax_bwd_task, &c, nthreads);
    return 0;
}
