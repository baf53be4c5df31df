/*
 * avx512_emu.c -- the AVX-512 kernel bodies built over pairs of 256-bit AVX2
 * registers, for testing on CPUs without AVX-512: the GEMM micro-kernels
 * (gemm_avx512.inc) and the 16- / 8-lane tile step (tilesm_vec.inc).
 *
 * A 16-float (8-double) vector is two __m256 (__m256d) halves; every vector
 * operation of a body is the same operation on each half, lane for lane,
 * with the same single-rounding FMA (and, for the tile step, the same exp
 * on each half). So this build computes exactly what the real one computes
 * -- the same tiles, the same order, bit for bit -- and a test of it is a
 * test of the kernels' indexing, edges and accumulation. It is slow (48 live
 * halves spill), and is only chosen on request (PYATTN_ISA=avx512emu).
 */
#include "dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <math.h>
#include "exp_avx2.h"

#define PA_ATTR __attribute__((target("avx2,fma")))
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

typedef struct { __m256 lo, hi; } pa_emu_v16f;
typedef struct { __m256d lo, hi; } pa_emu_v8d;

PA_ATTR static inline pa_emu_v16f emu_zero_ps(void)
{
    return (pa_emu_v16f){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
PA_ATTR static inline pa_emu_v16f emu_load_ps(const float *p)
{
    return (pa_emu_v16f){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
PA_ATTR static inline void emu_store_ps(float *p, pa_emu_v16f x)
{
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
}
PA_ATTR static inline pa_emu_v16f emu_bcast_ps(const float *p)
{
    const __m256 x = _mm256_broadcast_ss(p);
    return (pa_emu_v16f){x, x};
}
PA_ATTR static inline pa_emu_v16f emu_fma_ps(pa_emu_v16f a, pa_emu_v16f b, pa_emu_v16f c)
{
    return (pa_emu_v16f){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
PA_ATTR static inline pa_emu_v16f emu_add_ps(pa_emu_v16f a, pa_emu_v16f b)
{
    return (pa_emu_v16f){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}

PA_ATTR static inline pa_emu_v8d emu_zero_pd(void)
{
    return (pa_emu_v8d){_mm256_setzero_pd(), _mm256_setzero_pd()};
}
PA_ATTR static inline pa_emu_v8d emu_load_pd(const double *p)
{
    return (pa_emu_v8d){_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)};
}
PA_ATTR static inline void emu_store_pd(double *p, pa_emu_v8d x)
{
    _mm256_storeu_pd(p, x.lo);
    _mm256_storeu_pd(p + 4, x.hi);
}
PA_ATTR static inline pa_emu_v8d emu_bcast_pd(const double *p)
{
    const __m256d x = _mm256_broadcast_sd(p);
    return (pa_emu_v8d){x, x};
}
PA_ATTR static inline pa_emu_v8d emu_fma_pd(pa_emu_v8d a, pa_emu_v8d b, pa_emu_v8d c)
{
    return (pa_emu_v8d){_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
PA_ATTR static inline pa_emu_v8d emu_add_pd(pa_emu_v8d a, pa_emu_v8d b)
{
    return (pa_emu_v8d){_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)};
}

/* the tile step's further operations, and its exp, pair by pair */
PA_ATTR static inline pa_emu_v16f emu_set1_ps(float x)
{
    const __m256 v = _mm256_set1_ps(x);
    return (pa_emu_v16f){v, v};
}
PA_ATTR static inline pa_emu_v16f emu_sub_ps(pa_emu_v16f a, pa_emu_v16f b)
{
    return (pa_emu_v16f){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
}
PA_ATTR static inline pa_emu_v16f emu_max_ps(pa_emu_v16f a, pa_emu_v16f b)
{
    return (pa_emu_v16f){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
PA_ATTR static inline __m256 emu_ninf0_half_ps(__m256 x)
{
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), x);
}
PA_ATTR static inline pa_emu_v16f emu_ninf0_ps(pa_emu_v16f x)
{
    return (pa_emu_v16f){emu_ninf0_half_ps(x.lo), emu_ninf0_half_ps(x.hi)};
}
PA_ATTR static inline pa_emu_v16f emu_exp_ps(pa_emu_v16f x)
{
    return (pa_emu_v16f){pa_exp8_nonpos(x.lo), pa_exp8_nonpos(x.hi)};
}

PA_ATTR static inline pa_emu_v8d emu_set1_pd(double x)
{
    const __m256d v = _mm256_set1_pd(x);
    return (pa_emu_v8d){v, v};
}
PA_ATTR static inline pa_emu_v8d emu_sub_pd(pa_emu_v8d a, pa_emu_v8d b)
{
    return (pa_emu_v8d){_mm256_sub_pd(a.lo, b.lo), _mm256_sub_pd(a.hi, b.hi)};
}
PA_ATTR static inline pa_emu_v8d emu_max_pd(pa_emu_v8d a, pa_emu_v8d b)
{
    return (pa_emu_v8d){_mm256_max_pd(a.lo, b.lo), _mm256_max_pd(a.hi, b.hi)};
}
PA_ATTR static inline __m256d emu_ninf0_half_pd(__m256d x)
{
    return _mm256_andnot_pd(_mm256_cmp_pd(x, _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ), x);
}
PA_ATTR static inline pa_emu_v8d emu_ninf0_pd(pa_emu_v8d x)
{
    return (pa_emu_v8d){emu_ninf0_half_pd(x.lo), emu_ninf0_half_pd(x.hi)};
}
PA_ATTR static inline pa_emu_v8d emu_exp_pd(pa_emu_v8d x)
{
    return (pa_emu_v8d){pa_exp4_nonpos(x.lo), pa_exp4_nonpos(x.hi)};
}

#define T float
#define VT pa_emu_v16f
#define VL 16
#define VZERO() emu_zero_ps()
#define VLOAD(p) emu_load_ps(p)
#define VSTORE(p, x) emu_store_ps((p), (x))
#define VBCAST(p) emu_bcast_ps(p)
#define VFMA(a, b, c) emu_fma_ps((a), (b), (c))
#define VADD(a, b) emu_add_ps((a), (b))
#define PA_NAME pa_gemm_ukr_f32_avx512emu_12x32
#include "gemm_avx512.inc"
#undef T
#undef VT
#undef VL
#undef VZERO
#undef VLOAD
#undef VSTORE
#undef VBCAST
#undef VFMA
#undef VADD
#undef PA_NAME

#define T double
#define VT pa_emu_v8d
#define VL 8
#define VZERO() emu_zero_pd()
#define VLOAD(p) emu_load_pd(p)
#define VSTORE(p, x) emu_store_pd((p), (x))
#define VBCAST(p) emu_bcast_pd(p)
#define VFMA(a, b, c) emu_fma_pd((a), (b), (c))
#define VADD(a, b) emu_add_pd((a), (b))
#define PA_NAME pa_gemm_ukr_f64_avx512emu_12x16
#include "gemm_avx512.inc"
#undef T
#undef VT
#undef VL
#undef VZERO
#undef VLOAD
#undef VSTORE
#undef VBCAST
#undef VFMA
#undef VADD
#undef PA_NAME

/* the tile step: the macro names of tilesm_vec.inc over the pairs */
#define PA_FN PA_ATTR

#define T float
#define VT pa_emu_v16f
#define VL 16
#define VLOAD emu_load_ps
#define VSTORE emu_store_ps
#define VSET1 emu_set1_ps
#define VSUB emu_sub_ps
#define VADD emu_add_ps
#define VMAX emu_max_ps
#define VFMA emu_fma_ps
#define VZERO emu_zero_ps
#define VNINF0 emu_ninf0_ps
#define VEXP emu_exp_ps
#define PA_NAME pa_tilesm_f32_avx512emu
#define PA_REF_NAME pa_tilesm_f32_ref
#include "tilesm_vec.inc"
#undef T
#undef VT
#undef VL
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VSUB
#undef VADD
#undef VMAX
#undef VFMA
#undef VZERO
#undef VNINF0
#undef VEXP
#undef PA_NAME
#undef PA_REF_NAME

#define T double
#define VT pa_emu_v8d
#define VL 8
#define VLOAD emu_load_pd
#define VSTORE emu_store_pd
#define VSET1 emu_set1_pd
#define VSUB emu_sub_pd
#define VADD emu_add_pd
#define VMAX emu_max_pd
#define VFMA emu_fma_pd
#define VZERO emu_zero_pd
#define VNINF0 emu_ninf0_pd
#define VEXP emu_exp_pd
#define PA_NAME pa_tilesm_f64_avx512emu
#define PA_REF_NAME pa_tilesm_f64_ref
#include "tilesm_vec.inc"

#else
typedef int pa_avx512_emu_unused;   /* not x86-64 GCC/clang: nothing to build */
#endif
