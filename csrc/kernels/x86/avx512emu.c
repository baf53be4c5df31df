/*
 * avx512emu.c -- the avx512 family's bodies at its widths (16 floats /
 * 8 doubles) over pairs of AVX2 registers (simd_avx512emu.h): bit for bit
 * the arithmetic of avx512.c, so CPUs without AVX-512 test it
 * (PYATTN_ISA=avx512emu; slow). Exports pa_{gemm,tilesm}_{f32,f64}_avx512emu
 * and pa_fma_probe_avx512emu.
 */
#include "kernels/kernels.h"

#ifdef PA_HAVE_X86_KERNELS
#include "simd_avx512emu.h"
#include "kernels/vec/vocab.h"

#define PA_SIMD emu
#define PA_ISA avx512emu
#define PA_VFN __attribute__((target("avx2,fma,f16c")))
#define PA_MR 12
#define PA_WITH_SOFTMAX 2
#define PA_TEMPLATE "kernels/vec/family_vec.inc"
#include "dtypes.inc"
#undef PA_TEMPLATE
#undef PA_SIMD
#undef PA_ISA
#undef PA_VFN
#undef PA_MR
#undef PA_WITH_SOFTMAX
#endif
