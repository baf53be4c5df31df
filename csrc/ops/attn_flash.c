/* attn_flash.c -- the tiled (FlashAttention-2) forward and backward: frame
 * code around a family's GEMM micro-kernel and tile steps (attn_flash.inc,
 * attn_backward.inc, once per dtype). */
#include <math.h>
#include "attention.h"

/* n rows x cols of a strided operand stored in 16 bits (sd: PA_F16 or
 * PA_BF16), widened into dst (row stride ld) by the family's kernel where
 * rows are contiguous. The tiled paths call it once per key tile: the
 * operand is read in place, never copied whole. */
static void widen_rows(const pa_family *f, int sd, const void *p, pa_ssize rs, pa_ssize cs,
                       pa_ssize n, pa_ssize cols, float *dst, pa_ssize ld)
{
    const uint16_t *h = (const uint16_t *)p;
    if (cs == 1) {
        const pa_widen_fn w = f->widen[sd == PA_BF16].fn;
        for (pa_ssize r = 0; r < n; r++) w(dst + r * ld, h + r * rs, cols);
    } else {
        for (pa_ssize r = 0; r < n; r++)
            for (pa_ssize c = 0; c < cols; c++) dst[r * ld + c] = pa_load_f32(h, r * rs + c * cs, sd);
    }
}

#define PA_TEMPLATE "ops/attn_flash.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#define PA_TEMPLATE "ops/attn_backward.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE

size_t pa_flash_ws(const pa_family *f, int dtype, pa_ssize E, pa_ssize Ev)
{
    return dtype == PA_F32 ? flash_ws_f32(f, E, Ev) : flash_ws_f64(f, E, Ev);
}

void pa_flash_run(const pa_family *f, int dtype, const pa_attn_args *a, pa_ssize i0, pa_ssize i1,
                  void *ws)
{
    if (dtype == PA_F32) flash_run_f32(f, a, i0, i1, ws);
    else flash_run_f64(f, a, i0, i1, ws);
}

void pa_flash_merge(int dtype, const pa_attn_args *a, pa_ssize i, const void *partials,
                    pa_ssize nchunks, pa_ssize chunk_stride, void *ws)
{
    if (dtype == PA_F32) flash_merge_f32(a, i, partials, nchunks, chunk_stride, ws);
    else flash_merge_f64(a, i, partials, nchunks, chunk_stride, ws);
}

size_t pa_bwd_ws(const pa_family *f, int dtype, pa_ssize L, pa_ssize E, pa_ssize Ev)
{
    return dtype == PA_F32 ? bwd_ws_f32(f, L, E, Ev) : bwd_ws_f64(f, L, E, Ev);
}

void pa_bwd_head(const pa_family *f, int dtype, const pa_attn_args *a, const pa_bwd_io *io, void *ws)
{
    if (dtype == PA_F32) bwd_head_f32(f, a, io, ws);
    else bwd_head_f64(f, a, io, ws);
}
