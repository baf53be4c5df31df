/*
 * registry.h -- THE lists: element types, kernel kinds, kernel families.
 * Everything else that enumerates them is generated from these rows: the
 * dtype codes and pa_dtypes (pyattn.h, ops/common.c), the kernel signatures,
 * the fields of pa_family and the kernel declarations (family.h,
 * kernels/kernels.h), each family's table (PA_FAMILY_KERNELS, in the
 * family's own kernel file), the kernel names config() reports (each the
 * C symbol, stringised), the ISA codes and words (dispatch.c) and what
 * Python and CI see (_C.families(), pyattn._ISA_CODES, .ci/run).
 *
 * To add a KERNEL KIND: one row in PA_KERNEL_KINDS (its shape, return type
 * and parameters), its portable kernel in kernels/ref/ (pa_<kind>_<dt>_ref),
 * a body in kernels/vec/ included by family_vec.inc (or a kernel per family
 * file), and the frame that calls it (f-><kind>[...].fn). The field, the
 * declarations, every family's table entry and its name follow.
 * To add a FAMILY: one row in PA_FAMILIES, its vocabulary simd_<isa>.h and
 * its kernel file kernels/<arch>/<isa>.c (the template instantiation and
 * `const pa_family pa_family_<isa> = { PA_FAMILY_KERNELS(<isa>), ... }` with
 * its tiles), and its detection in dispatch.c's pa_detect_isa.
 * To add an ELEMENT TYPE (e.g. int8 storage): one row in PA_DTYPES and the
 * kernels of the kinds whose shape it is an index of (its flags).
 *
 * Every list takes a macro X and passes any further arguments to each row
 * (PA_KERNEL_KINDS(X, ctx) calls X(kind, shape, ret, params, ctx)); give at
 * least one (C11), e.g. PA_FAMILIES(X, _).
 */
#ifndef PYATTN_REGISTRY_H
#define PYATTN_REGISTRY_H

/* ---- element types --------------------------------------------------------
 * X(CODE, sfx, "numpy name", bytes, compute code, C, S, W, ...)
 *   PA_<CODE>  its code (the row's position: compute dtypes come first)
 *   sfx        its word in kernel symbols (pa_rowdot_<sfx>_<isa>): the dtype,
 *              then the compute dtype where they differ
 *   C, S, W    0/1: it indexes kernels of shape C (a compute dtype), S
 *              (operands a kernel reads stored as it), W (widened to its
 *              compute dtype by a widen kernel)
 * bool is a storage code of masks only (no kernel reads it). int8 and int4
 * are a quantized KV cache's storage (ops/quant.h: symmetric, per group,
 * float32 scales beside the rows; int4 two values per byte, its "element"
 * and its strides are bytes): the kinds qrowdot, qrowpv, qwiden read them
 * with their scales (one kernel per family, the bits as an argument), and
 * q8rowdot against int8 query rows (precision "int8": exact integer sums per
 * group). float8_e4m3fn and float8_e5m2 (ml_dtypes' fp8 formats) are the
 * fp8 caches' storage, per group float32 scales the same way: the frame
 * widens their rows into float32 tiles (the family's qwiden) and the
 * float32 kernels read those -- no kernel is indexed by them (qwiden takes
 * their bits codes). */
#define PA_DTYPES(X, ...)                                                   \
    X(F32,  f32,      "float32",  4, PA_F32, 1, 1, 0, __VA_ARGS__)          \
    X(F64,  f64,      "float64",  8, PA_F64, 1, 1, 0, __VA_ARGS__)          \
    X(F16,  f16_f32,  "float16",  2, PA_F32, 0, 1, 1, __VA_ARGS__)          \
    X(BF16, bf16_f32, "bfloat16", 2, PA_F32, 0, 1, 1, __VA_ARGS__)          \
    X(BOOL, b8,       "bool",     1, -1,     0, 0, 0, __VA_ARGS__)          \
    X(I8,   i8_f32,   "int8",     1, PA_F32, 0, 0, 0, __VA_ARGS__)          \
    X(I4,   i4_f32,   "int4",     1, PA_F32, 0, 0, 0, __VA_ARGS__)          \
    X(F8E4, f8e4_f32, "float8_e4m3fn", 1, PA_F32, 0, 0, 0, __VA_ARGS__)     \
    X(F8E5, f8e5_f32, "float8_e5m2",   1, PA_F32, 0, 0, 0, __VA_ARGS__)

/* ---- kernel kinds -----------------------------------------------------------
 * X(kind, shape, return type, (parameters), ...): the kind's signature is
 * pa_<kind>_sig, its pointer type pa_<kind>_fn, its field in pa_family
 * f-><kind>, and its symbol in family <isa> pa_<kind>_<sfx>_<isa>. Shapes:
 *   G  a GEMM micro-kernel, one per compute dtype: f-><kind>[dtype] is a
 *      pa_gemm_kernel (with the family's tile PA_TILE_<kind>_<sfx>)
 *   C  one per compute dtype: f-><kind>[dtype] = {fn, name}
 *   S  one per stored dtype it reads (flag S): f-><kind>[storage dtype]
 *   W  one per widened dtype (flag W): f-><kind>[storage dtype]
 *   F  one per family: f-><kind> = {fn, name}, symbol pa_<kind>_<isa>
 * Their contracts: family.h and csrc/README.md, "The kernel kinds". */
#define PA_KERNEL_KINDS(X, ...)                                                                \
    X(gemm, G, void, (pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs, const void *B,  \
                      pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs, int m, int n,          \
                      int accumulate), __VA_ARGS__)                                            \
    X(tilesm, C, void, (void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld, void *m, void *l,   \
                        void *alpha), __VA_ARGS__)                                             \
    X(tilep, C, void, (void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld, const void *lse),    \
      __VA_ARGS__)                                                                             \
    X(tileds, C, void, (const void *P, void *dP, pa_ssize nj, pa_ssize ncols, pa_ssize ld,      \
                        const void *D, double scale), __VA_ARGS__)                             \
    X(softmax, C, void, (const pa_softmax_row *r), __VA_ARGS__)                                \
    X(softcap, C, void, (void *x, pa_ssize n, double cap), __VA_ARGS__)                        \
    X(rescale, C, void, (void *O, pa_ssize nr, pa_ssize ld, pa_ssize n, const void *alpha),     \
      __VA_ARGS__)                                                                             \
    X(rowdot, S, void, (const void *Q, pa_ssize qrs, pa_ssize R, const void *K, pa_ssize krs,   \
                        pa_ssize nj, pa_ssize E, void *s, pa_ssize ss, const void *next,       \
                        pa_ssize nnext), __VA_ARGS__)                                          \
    X(rowsm, C, void, (void *s, pa_ssize nj, void *m, void *l, void *alpha), __VA_ARGS__)      \
    X(rowpv, S, void, (const void *P, pa_ssize ps, pa_ssize R, const void *V, pa_ssize vrs,     \
                       pa_ssize nj, pa_ssize Ev, void *acc, pa_ssize ald, const void *next,    \
                       pa_ssize nnext), __VA_ARGS__)                                           \
    X(widen, W, void, (float *dst, const uint16_t *src, pa_ssize n), __VA_ARGS__)              \
    X(read_probe, F, float, (const float *p, size_t n), __VA_ARGS__)                           \
    X(qrowdot, F, void, (const float *Q, pa_ssize qrs, pa_ssize R, const void *K, pa_ssize krs,  \
                         const float *ks, pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G,  \
                         int bits, float *s, pa_ssize ss), __VA_ARGS__)                        \
    X(qrowpv, F, void, (const float *P, pa_ssize ps, pa_ssize R, const void *V, pa_ssize vrs,   \
                        const float *vs, pa_ssize vsrs, pa_ssize nj, pa_ssize Ev, pa_ssize G,  \
                        int bits, float *acc, pa_ssize ald), __VA_ARGS__)                      \
    X(qwiden, F, void, (float *dst, const void *src, const float *scale, pa_ssize n, pa_ssize G, \
                        int bits), __VA_ARGS__)                                                \
    X(q8rowdot, F, void, (const int8_t *Q, pa_ssize qrs, const float *qs, pa_ssize qsrs,        \
                          pa_ssize R, const void *K, pa_ssize krs, const float *ks,            \
                          pa_ssize ksrs, pa_ssize nj, pa_ssize E, pa_ssize G, int bits,        \
                          float scale, float *s, pa_ssize ss), __VA_ARGS__)

/* ---- kernel families --------------------------------------------------------
 * X(CODE, word, isa, arch, ...)
 *   PA_ISA_<CODE>  its code (the row's position; PYATTN_ISA's word `word`)
 *   isa            its word in kernel symbols (pa_gemm_f32_<isa>) and its
 *                  table pa_family_<isa>
 *   arch           where it is built: any, x86 (PA_HAVE_X86_KERNELS) or
 *                  arm (PA_HAVE_NEON_KERNELS)
 * x86 families are levels: a request is capped at what the CPU has
 * (dispatch.c); avx512emu (tests) runs the AVX-512 bodies over pairs of
 * AVX2 registers. */
#define PA_FAMILIES(X, ...)                                                 \
    X(GENERIC,    generic,   ref,       any, __VA_ARGS__)                   \
    X(AVX2,       avx2,      avx2,      x86, __VA_ARGS__)                   \
    X(AVX512,     avx512,    avx512,    x86, __VA_ARGS__)                   \
    X(AVX512_EMU, avx512emu, avx512emu, x86, __VA_ARGS__)                   \
    X(NEON,       neon,      neon,      arm, __VA_ARGS__)

/* ---- preprocessor helpers for the generators ---- */
#define PA_REG_CAT_(a, b) a##b
#define PA_REG_CAT(a, b) PA_REG_CAT_(a, b)
#define PA_REG_STR_(x) #x
#define PA_REG_STR(x) PA_REG_STR_(x)
/* PA_WHEN(flag)(tokens): the tokens where flag expands to 1, nothing for 0 */
#define PA_WHEN(flag) PA_REG_CAT(PA_WHEN_, flag)
#define PA_WHEN_0(...)
#define PA_WHEN_1(...) __VA_ARGS__
/* PA_IF(flag)(a, b): a where flag expands to 1, b for 0 */
#define PA_IF(flag) PA_REG_CAT(PA_IF_, flag)
#define PA_IF_0(a, b) b
#define PA_IF_1(a, b) a

#endif
