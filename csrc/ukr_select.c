/*
 * ukr_select.c -- which float32 GEMM micro-kernel shape the avx512 family
 * runs on this CPU (ukr_select.h). The probe: the family's FMA peak probe at
 * 16 lanes (pa_fma_probe_avx512) against the avx2 family's at 8 lanes
 * (pa_fma_probe_avx2), each 12 independent chains, alternated, on the
 * thread's CPU clock (a preempted run is not charged), the minimum time of
 * each over several runs after a warm-up (AVX-512 units that power up on
 * first use; other processes on a shared host only lengthen runs). Two full
 * 512-bit ports do twice the 256-bit rate; one 512-bit FMA per cycle (two
 * 256-bit halves, as Zen 4, or one port) the same rate.
 */
#define _GNU_SOURCE
#include "ukr_select.h"

#include <math.h>
#include <time.h>

#include "cpu.h"
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#define PA_SHAPE(name, mr, nr, sym, attn) {name, mr, nr, sym, #sym, attn}
const pa_ukr_shape pa_ukr_shapes[] = {
    PA_SHAPE("12x32", 12, 32, pa_gemm_f32_avx512, 1),       /* the table's own (avx512.c) */
    PA_SHAPE("6x48", 6, 48, pa_gemm_f32_avx512_6x48, 1),    /* avx512_ukr.c */
};
#undef PA_SHAPE
const int pa_ukr_nshapes = (int)(sizeof pa_ukr_shapes / sizeof pa_ukr_shapes[0]);
#else
const pa_ukr_shape pa_ukr_shapes[] = {{"none", 0, 0, NULL, "", 0}};
const int pa_ukr_nshapes = 0;
#endif

int pa_ukr_classify(double rate512, double rate256)
{
    if (!(rate512 > 0) || !(rate256 > 0) || !isfinite(rate512) || !isfinite(rate256))
        return PA_FMA512_UNKNOWN;
    const double r = rate512 / rate256;
    return r >= 1.6 ? PA_FMA512_FULL : r <= 1.3 ? PA_FMA512_HALF : PA_FMA512_UNKNOWN;
}

int pa_ukr_shape_of(int cls)
{
    (void)cls;      /* 12x32 on every class: see csrc/README.md, "The AVX-512 micro-kernel" */
    return 0;
}

static pa_ukr_state state = {0, 0, 0, PA_FMA512_UNKNOWN, 0, 0};
static int state_ready = 0;                 /* set under the GIL */

#ifdef PA_HAVE_X86_KERNELS
static double thread_seconds(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* flops per second of probe at its best over runs of iters rounds */
static void probe_rates(double *r512, double *r256)
{
    const long long iters = 20000;          /* 240k FMAs: ~30 us at 2 per cycle */
    float sink;
    double best512 = 0, best256 = 0, f512 = 0, f256 = 0;
    pa_family_avx512.fma_probe(4 * iters, &sink);     /* warm-up */
    for (int run = 0; run < 9; run++) {
        double t0 = thread_seconds();
        f512 = pa_family_avx512.fma_probe(iters, &sink);
        double t1 = thread_seconds();
        f256 = pa_family_avx2.fma_probe(iters, &sink);
        double t2 = thread_seconds();
        if (t0 < 0 || t1 < 0 || t2 < 0) break;
        if (t1 > t0 && (best512 == 0 || t1 - t0 < best512)) best512 = t1 - t0;
        if (t2 > t1 && (best256 == 0 || t2 - t1 < best256)) best256 = t2 - t1;
    }
    *r512 = best512 > 0 ? f512 / best512 : 0;
    *r256 = best256 > 0 ? f256 / best256 : 0;
}
#endif

const pa_ukr_state *pa_ukr_info(void)
{
    if (!state_ready) {
        state_ready = 1;
#ifdef PA_HAVE_X86_KERNELS
        if (pa_isa_machine() == PA_ISA_AVX512) {
            probe_rates(&state.rate512, &state.rate256);
            state.probed = 1;
            state.cls = pa_ukr_classify(state.rate512, state.rate256);
        }
#endif
        if (!state.forced) state.shape = pa_ukr_shape_of(state.cls);
    }
    return &state;
}

int pa_ukr_force(int shape)
{
    pa_ukr_info();
    if (shape < 0) {
        state.forced = 0;
        state.shape = pa_ukr_shape_of(state.cls);
        return 0;
    }
    if (shape >= pa_ukr_nshapes || !pa_ukr_shapes[shape].attn) return -1;
    state.forced = 1;
    state.shape = shape;
    return 0;
}

const pa_family *pa_ukr_family(const pa_family *base)
{
#ifdef PA_HAVE_X86_KERNELS
    enum { NBASE = 4, NSHAPE = sizeof pa_ukr_shapes / sizeof pa_ukr_shapes[0] };
    static pa_family copies[NBASE][NSHAPE];
    static char made[NBASE][NSHAPE];
    const int b = base == &pa_family_avx512 ? 0 : base == &pa_family_avx512bf16 ? 1
                : base == &pa_family_avx512vnni ? 2 : base == &pa_family_avx512bf16vnni ? 3 : -1;
    if (b < 0) return base;
    const int s = pa_ukr_info()->shape;
    if (s == 0) return base;
    if (!made[b][s]) {
        const pa_ukr_shape *u = &pa_ukr_shapes[s];
        copies[b][s] = *base;
        pa_gemm_kernel *g = &copies[b][s].gemm[PA_F32];
        g->ukr = u->ukr;
        g->name = u->sym;
        g->mr = u->mr;
        g->nr = u->nr;
        g->mc = g->mc / u->mr * u->mr;      /* whole panels (96: 16 of 6) */
        g->nc = g->nc / u->nr * u->nr;
        made[b][s] = 1;
    }
    return &copies[b][s];
#else
    return base;
#endif
}
