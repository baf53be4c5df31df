/*
 * ukr_select.h -- the avx512 family's float32 GEMM micro-kernel shape per
 * CPU class (ukr_select.c): a short probe of the 512-bit vs the 256-bit FMA
 * rate classifies the AVX-512 FMA hardware (two full 512-bit ports, or one
 * 512-bit FMA per cycle: Zen 4's two 256-bit halves, one-port Intel parts),
 * and the class picks a shape; _C._ukr_select forces one (PYATTN_UKR). The
 * shape reaches the ops through a copy of the family's table with that
 * kernel (pa_ukr_family), so no frame reads any of this.
 */
#ifndef PYATTN_UKR_SELECT_H
#define PYATTN_UKR_SELECT_H

#include "family.h"

enum { PA_FMA512_UNKNOWN = 0, PA_FMA512_FULL = 1, PA_FMA512_HALF = 2 };

typedef struct {
    const char *name;       /* "12x32" */
    int mr, nr;
    pa_gemm_ukr ukr;
    const char *sym;        /* the kernel's C symbol */
    int attn;               /* usable by the attention frame: MR | PA_FLASH_BK and
                               lcm(MR, NR) | the family's attn_bq */
} pa_ukr_shape;

extern const pa_ukr_shape pa_ukr_shapes[];
extern const int pa_ukr_nshapes;

/* The class of the probe's float32 rates (flops per second, 16 vs 8 lanes):
 * FULL from 1.6x, HALF up to 1.3x, UNKNOWN between, or where a rate is not
 * a positive finite number. Pure: the same figures give the same class. */
int pa_ukr_classify(double rate512, double rate256);
/* The shape (an index of pa_ukr_shapes) a class runs. Pure. */
int pa_ukr_shape_of(int cls);

typedef struct {
    int probed;             /* the probe ran (an AVX-512 machine) */
    double rate512, rate256;
    int cls;                /* PA_FMA512_* */
    int shape;              /* index in pa_ukr_shapes */
    int forced;             /* shape set by pa_ukr_force, not the class */
} pa_ukr_state;

/* The state; the first call runs the probe on an AVX-512 machine (~1 ms;
 * under the GIL). */
const pa_ukr_state *pa_ukr_info(void);
/* Force a shape (index; -1: the class's again). 0, or -1 for an index out of
 * range or a shape the attention cannot use. Takes effect at the next family
 * choice (_C.select_isa). */
int pa_ukr_force(int shape);
/* base with the chosen float32 GEMM kernel: base itself when it is not an
 * avx512 table or the shape is the table's own, else a copy (made once,
 * never changed after: calls running keep theirs). */
const pa_family *pa_ukr_family(const pa_family *base);

#endif
