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

/* The operations the bodies use, on pairs: emu_<op>_<SFX> applies the AVX2
 * operation _mm256_<op>_<SFX> to each half. SFX: ps / pd; V: the pair type;
 * H: a half; T: the element; HL: lanes per half; EXP: the half-width exp. */
#define PA_EMU_BINARY(op, SFX, V)                                                \
    PA_ATTR static inline V emu_##op##_##SFX(V a, V b)                          \
    {                                                                           \
        return (V){_mm256_##op##_##SFX(a.lo, b.lo), _mm256_##op##_##SFX(a.hi, b.hi)}; \
    }
#define PA_EMU_OPS(SFX, V, H, T, HL, EXP)                                       \
    PA_ATTR static inline V emu_set1_##SFX(T x)                                 \
    {                                                                           \
        const H v = _mm256_set1_##SFX(x);                                       \
        return (V){v, v};                                                       \
    }                                                                           \
    PA_ATTR static inline V emu_zero_##SFX(void) { return emu_set1_##SFX(0); } \
    PA_ATTR static inline V emu_bcast_##SFX(const T *p) { return emu_set1_##SFX(*p); } \
    PA_ATTR static inline V emu_load_##SFX(const T *p)                          \
    {                                                                           \
        return (V){_mm256_loadu_##SFX(p), _mm256_loadu_##SFX(p + HL)};          \
    }                                                                           \
    PA_ATTR static inline void emu_store_##SFX(T *p, V x)                       \
    {                                                                           \
        _mm256_storeu_##SFX(p, x.lo);                                           \
        _mm256_storeu_##SFX(p + HL, x.hi);                                      \
    }                                                                           \
    PA_EMU_BINARY(add, SFX, V)                                                  \
    PA_EMU_BINARY(sub, SFX, V)                                                  \
    PA_EMU_BINARY(max, SFX, V)                                                  \
    PA_ATTR static inline V emu_fma_##SFX(V a, V b, V c)                        \
    {                                                                           \
        return (V){_mm256_fmadd_##SFX(a.lo, b.lo, c.lo), _mm256_fmadd_##SFX(a.hi, b.hi, c.hi)}; \
    }                                                                           \
    /* lanes equal to -inf -> +0 */                                             \
    PA_ATTR static inline H emu_ninf0_half_##SFX(H x)                           \
    {                                                                           \
        return _mm256_andnot_##SFX(_mm256_cmp_##SFX(x, _mm256_set1_##SFX(-INFINITY), _CMP_EQ_OQ), x); \
    }                                                                           \
    PA_ATTR static inline V emu_ninf0_##SFX(V x)                                \
    {                                                                           \
        return (V){emu_ninf0_half_##SFX(x.lo), emu_ninf0_half_##SFX(x.hi)};     \
    }                                                                           \
    PA_ATTR static inline V emu_exp_##SFX(V x) { return (V){EXP(x.lo), EXP(x.hi)}; }

PA_EMU_OPS(ps, pa_emu_v16f, __m256, float, 8, pa_exp8_nonpos)
PA_EMU_OPS(pd, pa_emu_v8d, __m256d, double, 4, pa_exp4_nonpos)

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
#include "gemm_avx512.inc"         /* (it #undefs the macros it takes) */

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
#include "gemm_avx512.inc"         /* (it #undefs the macros it takes) */

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
#include "tilesm_vec.inc"         /* (it #undefs the macros it takes) */

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
