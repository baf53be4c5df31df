/* attn_flash.c -- the tiled (FlashAttention-2) forward: frame code around a
 * family's GEMM micro-kernel and tile step (attn_flash.inc, once per dtype). */
#include <math.h>
#include "attention.h"

#define PA_TEMPLATE "ops/attn_flash.inc"
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
