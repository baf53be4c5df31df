/* vocab.h -- the dtype-generic names the kernel bodies of kernels/vec are
 * written in, mapped onto the vocabulary of the ISA in use (PA_SIMD) and the
 * dtype in use (PA_DT, set by dtypes.inc): V is pa_<PA_SIMD>_v_<PA_DT>,
 * vadd is pa_<PA_SIMD>_add_<PA_DT>, and so on. PA_KERNEL(op) names an
 * exported kernel: pa_<op>_<PA_DT>_<PA_ISA>.
 *
 * T is the element, V a vector of VL elements, VM a lane mask. Every
 * vocabulary (simd_<isa>.h) defines, for each dtype:
 *   vload(p) vstore(p, x)     VL elements, unaligned
 *   vset1(x) vzero() vbcast(p) every lane x, 0, or *p
 *   vadd vsub vmul vdiv       IEEE, lane by lane
 *   vmax(a, b)                a > b ? a : b per lane (x86 maxps: b when
 *                             either is NaN -- the softmax NaN rule needs it)
 *   vfma(a, b, c)             a*b + c, one rounding
 *   vfnma(a, b, c)            c - a*b, one rounding
 *   vlt(a, b) veq(a, b)       ordered compares -> VM (false for NaN)
 *   vzero_where(m, y)         lanes of m -> +0, others y
 *   vpow2i(t)                 t's low mantissa bits moved into the exponent
 *                             field (shift left by 23 / 52)
 * and, for f32 only:
 *   vwiden_f16(p) vwiden_bf16(p)  VL 16-bit values (float16 / bfloat16 bits)
 *                             at p, as floats (exact)
 *   vwiden_i8(p) vwiden_i4(p) VL int8 values at p / VL int4 values in the
 *                             VL / 2 bytes at p (kernels/ref/quant_ref.h),
 *                             as floats (exact)
 *   vfp8(p, e4)               (vocabularies that define PA_FP8_<PA_SIMD> 1) VL
 *                             fp8 bytes at p, e4m3fn (e4 = 1) or e5m2, as
 *                             floats (exact: quant_ref.h's pa_fp8_value)
 *   vfp8n(p, e4)              (the same vocabularies) as vfp8, for VL bytes
 *                             that are all normal numbers (no zero,
 *                             subnormal, inf or NaN code: the caller checks)
 * and, for both dtypes:
 *   vhsum16(a)                the sum of 16 partials held in a[0 .. 16/VL):
 *                             p[l] + p[l + 8], then + 4, + 2, + 1
 * and exp_vec.inc adds vexp(x) for x <= 0. A vocabulary whose vectors hold
 * two 32-byte softmax pieces (AVX-512, its emulation) also defines VP (one
 * piece), vpzero(), vpadd(s, e) (s + e's low piece, then + its high piece)
 * and vpstore(p, s). */
#ifndef PYATTN_VEC_VOCAB_H
#define PYATTN_VEC_VOCAB_H

#define PA_V(op) PA_CAT(PA_CAT(PA_CAT(pa_, PA_SIMD), _##op##_), PA_DT)
#define PA_KERNEL(op) PA_CAT(PA_CAT(pa_##op##_, PA_DT), PA_CAT(_, PA_ISA))
#if defined(__clang__)
#define PA_UNROLL _Pragma("unroll")
#else
#define PA_UNROLL _Pragma("GCC unroll 32")
#endif

#define V PA_V(v)
#define VM PA_V(m)
#define VL PA_V(lanes)
#define vload PA_V(load)
#define vstore PA_V(store)
#define vset1 PA_V(set1)
#define vzero PA_V(zero)
#define vbcast PA_V(bcast)
#define vadd PA_V(add)
#define vsub PA_V(sub)
#define vmul PA_V(mul)
#define vdiv PA_V(div)
#define vmax PA_V(max)
#define vfma PA_V(fma)
#define vfnma PA_V(fnma)
#define vlt PA_V(lt)
#define veq PA_V(eq)
#define vzero_where PA_V(zero_where)
#define vpow2i PA_V(pow2i)
#define vwiden_f16 PA_V(widen_f16)
#define vwiden_bf16 PA_V(widen_bf16)
#define vwiden_i8 PA_V(widen_i8)
#define vwiden_i4 PA_V(widen_i4)
#define vfp8 PA_CAT(PA_CAT(pa_, PA_SIMD), _fp8_f32)   /* where PA_FP8_<PA_SIMD>: VL fp8 bytes, exact */
#define vfp8n PA_CAT(PA_CAT(pa_, PA_SIMD), _fp8n_f32) /* ... VL fp8 bytes that are all normals */
#define vhsum16 PA_V(hsum16)
#define vexp PA_CAT(vexp_, PA_DT)        /* exp_vec.inc */
#define vexpn PA_CAT(vexpn_, PA_DT)      /* exp_vec.inc */
#define VP PA_V(p)                       /* softmax piece sums (two-piece vectors only) */
#define vpzero PA_V(pzero)
#define vpadd PA_V(padd)
#define vpstore PA_V(pstore)

#endif
