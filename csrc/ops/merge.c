/*
 * merge.c -- merge_attention: partial attention results over disjoint key
 * sets, each with its rows' log-sum-exp, combined into the result over the
 * union (split-KV / ring attention; API.md "Log-sum-exp out, and merging").
 *
 * Per row, with M = max_p lse_p:  w_p = exp(lse_p - M),  lse = M + log(sum_p w_p),
 * out = sum_p (w_p / sum) out_p,  in the order of p. A part with lse_p = -inf
 * has weight 0 and its row is not read (NaN there does not spread, as for a
 * key of weight 0); a row with every lse_p = -inf gives 0 and -inf; NaN in an
 * lse spreads to its row; an lse of +inf gives +inf (as logaddexp) and a
 * NaN row (inf - inf). One task per flat batch index: no dependence on
 * the thread count. Weights are computed in double for both dtypes.
 */
#include <math.h>
#include "ops.h"
#include "threads.h"

typedef struct {
    int dtype;
    const pa_batch *bt;
    pa_ssize P, L, Ev, outs_ps, lses_ps;
    const pa_operand *outs, *lses, *out, *lse;
} merge_ctx;

#define PA_DEFINE_MERGE(T, DT)                                                              \
    static void merge_rows_##DT(const merge_ctx *c, pa_ssize b)                            \
    {                                                                                       \
        const T *os = (const T *)c->outs->p + pa_batch_offset(c->bt, c->outs->bs, b);       \
        const T *ls = (const T *)c->lses->p + pa_batch_offset(c->bt, c->lses->bs, b);       \
        T *o = (T *)c->out->p + pa_batch_offset(c->bt, c->out->bs, b);                      \
        T *lo = (T *)c->lse->p + pa_batch_offset(c->bt, c->lse->bs, b);                     \
        for (pa_ssize i = 0; i < c->L; i++) {                                               \
            const T *li = ls + i * c->lses->cs;                                             \
            T *oi = o + i * c->out->rs;                                                     \
            double M = -INFINITY, sum = 0;                                                  \
            for (pa_ssize p = 0; p < c->P; p++)                                             \
                if ((double)li[p * c->lses_ps] > M) M = (double)li[p * c->lses_ps];         \
            for (pa_ssize p = 0; p < c->P; p++) {                                           \
                const double x = (double)li[p * c->lses_ps];                                \
                if (x != -INFINITY) sum += exp(x - M);                                      \
            }                                                                               \
            for (pa_ssize d = 0; d < c->Ev; d++) oi[d * c->out->cs] = 0;                    \
            if (M == -INFINITY && sum == 0) {   /* nothing admissible anywhere */           \
                lo[i * c->lse->cs] = (T)-INFINITY;                                          \
                continue;                                                                   \
            }                                                                               \
            /* an lse of +inf: +inf (logaddexp), the row NaN (inf - inf) */                \
            lo[i * c->lse->cs] = (T)(M == INFINITY ? M : M + log(sum));                     \
            for (pa_ssize p = 0; p < c->P; p++) {                                           \
                const double x = (double)li[p * c->lses_ps];                                \
                if (x == -INFINITY) continue;                                               \
                const T w = (T)(exp(x - M) / sum);                                          \
                const T *op = os + p * c->outs_ps + i * c->outs->rs;                        \
                for (pa_ssize d = 0; d < c->Ev; d++)                                        \
                    oi[d * c->out->cs] += w * op[d * c->outs->cs];                          \
            }                                                                               \
        }                                                                                   \
    }
PA_DEFINE_MERGE(float, f32)
PA_DEFINE_MERGE(double, f64)
#undef PA_DEFINE_MERGE

static void merge_task(void *ctx_, pa_ssize b, int tid)
{
    const merge_ctx *c = (const merge_ctx *)ctx_;
    (void)tid;
    if (c->dtype == PA_F32) merge_rows_f32(c, b);
    else merge_rows_f64(c, b);
}

int pa_merge(const pa_merge_call *mg, int nthreads)
{
    const pa_batch *bt = mg->bt;
    merge_ctx c = {mg->dtype, bt, mg->P, mg->L, mg->Ev, mg->outs_ps, mg->lses_ps, mg->outs, mg->lses,
                   mg->out, mg->lse};
    if (bt->count == 0 || mg->L == 0) return 0;
    int nt = nthreads < 1 ? 1 : nthreads;
    if (nt > bt->count) nt = (int)bt->count;
    pa_parallel_for(bt->count, merge_task, &c, nt);
    return 0;
}
