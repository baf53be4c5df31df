/*
 * kernels.h -- the symbols of every leaf kernel, by family. Their contract
 * (what each kind receives and computes) is in family.h and README.md;
 * each family.c puts a family's kernels into its pa_family.
 *
 *   pa_gemm_<dt>_<isa>     GEMM micro-kernel (pa_gemm_ukr)
 *   pa_tilesm_<dt>_<isa>   online-softmax tile step (pa_tilesm_fn)
 *   pa_tilep_<dt>_<isa>    the backward's probability step (pa_tilep_fn)
 *   pa_tileds_<dt>_<isa>   the backward's dS step (pa_tileds_fn)
 *   pa_softmax_<dt>_<isa>  one softmax row (pa_softmax_fn)
 *   pa_row{dot,sm,pv}_<dt>_<isa>  the decode kernels (pa_decode_kernel)
 *   pa_softcap_<dt>_<isa>  the logit softcap (pa_softcap_fn)
 *   pa_fma_probe_<isa>     the benchmark's FMA peak probe (pa_fma_probe_fn)
 *   pa_read_probe_<isa>    its read-bandwidth probe (pa_read_probe_fn)
 *   pa_widen_{f16,bf16}_f32_<isa>  16-bit storage to float32 (pa_widen_fn)
 *   pa_gemm_bf16_{ref,avx512bf16}  bfloat16 products (gemm_bf16): the exact
 *                          emulation, and AVX512_BF16's vdpbf16ps
 *   pa_vocab_<dt>_<isa>    not a kernel: the vector vocabulary op by op on
 *                          arrays, for kernel_check.c (kernels/vec/vocab_check.inc)
 */
#ifndef PYATTN_KERNELS_H
#define PYATTN_KERNELS_H

#include "family.h"

#define PA_KERNELS_OF(ISA, DT)                                                                    \
    void pa_gemm_##DT##_##ISA(pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs,         \
                              const void *B, pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs,  \
                              int m, int n, int accumulate);                                     \
    void pa_tilesm_##DT##_##ISA(void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,              \
                                void *m, void *l, void *alpha);                                  \
    void pa_tilep_##DT##_##ISA(void *St, pa_ssize nj, pa_ssize ncols, pa_ssize ld,               \
                               const void *lse);                                                 \
    void pa_tileds_##DT##_##ISA(const void *P, void *dP, pa_ssize nj, pa_ssize ncols, pa_ssize ld,   \
                                const void *D, double scale);                                    \
    void pa_softmax_##DT##_##ISA(const pa_softmax_row *r);                                      \
    void pa_rowdot_##DT##_##ISA(const void *Q, pa_ssize qrs, pa_ssize R, const void *K,          \
                                pa_ssize krs, pa_ssize nj, pa_ssize E, void *s, pa_ssize ss);    \
    void pa_rowsm_##DT##_##ISA(void *s, pa_ssize nj, void *m, void *l, void *alpha);            \
    void pa_softcap_##DT##_##ISA(void *x, pa_ssize n, double cap);                              \
    void pa_rowpv_##DT##_##ISA(const void *P, pa_ssize ps, pa_ssize R, const void *V,            \
                               pa_ssize vrs, pa_ssize nj, pa_ssize Ev, void *acc, pa_ssize ald);
/* the vocabulary test hook (kernels/vec/vocab_check.inc): its ops */
enum { PA_VOP_ADD, PA_VOP_SUB, PA_VOP_MUL, PA_VOP_DIV, PA_VOP_MAX, PA_VOP_FMA, PA_VOP_FNMA,
       PA_VOP_LT, PA_VOP_EQ, PA_VOP_ZERO_WHERE, PA_VOP_POW2I, PA_VOP_EXP, PA_VOP_BCAST,
       PA_VOP_COUNT, PA_VOP_HSUM16 = 100, PA_VOP_LANES = 101 };
typedef int (*pa_vocab_fn)(int op, const void *a, const void *b, const void *c, void *out, pa_ssize n);
#define PA_VOCAB_OF(ISA)                                                                          \
    int pa_vocab_f32_##ISA(int op, const void *a, const void *b, const void *c, void *out,       \
                           pa_ssize n);                                                          \
    int pa_vocab_f64_##ISA(int op, const void *a, const void *b, const void *c, void *out,       \
                           pa_ssize n);
#define PA_WIDEN_OF(ISA)                                                                          \
    void pa_widen_f16_f32_##ISA(float *dst, const uint16_t *src, pa_ssize n);                    \
    void pa_widen_bf16_f32_##ISA(float *dst, const uint16_t *src, pa_ssize n);                   \
    PA_DECODE16_OF(ISA, f16)                                                                      \
    PA_DECODE16_OF(ISA, bf16)
#define PA_DECODE16_OF(ISA, H)                                                                    \
    void pa_rowdot_##H##_f32_##ISA(const void *Q, pa_ssize qrs, pa_ssize R, const void *K,       \
                                   pa_ssize krs, pa_ssize nj, pa_ssize E, void *s, pa_ssize ss); \
    void pa_rowpv_##H##_f32_##ISA(const void *P, pa_ssize ps, pa_ssize R, const void *V,         \
                                  pa_ssize vrs, pa_ssize nj, pa_ssize Ev, void *acc, pa_ssize ald);

PA_KERNELS_OF(ref, f32)
PA_KERNELS_OF(ref, f64)
PA_WIDEN_OF(ref)
float pa_read_probe_ref(const float *p, size_t n);
void pa_gemm_bf16_ref(pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs, const void *B,
                      pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs, int m, int n, int accumulate);
#ifdef PA_HAVE_X86_KERNELS
PA_KERNELS_OF(avx2, f32)
PA_KERNELS_OF(avx2, f64)
PA_WIDEN_OF(avx2)
PA_WIDEN_OF(avx512)
PA_WIDEN_OF(avx512emu)
PA_KERNELS_OF(avx512, f32)
PA_KERNELS_OF(avx512, f64)
PA_KERNELS_OF(avx512emu, f32)
PA_KERNELS_OF(avx512emu, f64)
PA_VOCAB_OF(avx2)
PA_VOCAB_OF(avx512)
PA_VOCAB_OF(avx512emu)
double pa_fma_probe_avx2(long long iters, float *sink);
double pa_fma_probe_avx512(long long iters, float *sink);
double pa_fma_probe_avx512emu(long long iters, float *sink);
float pa_read_probe_avx2(const float *p, size_t n);
float pa_read_probe_avx512(const float *p, size_t n);
float pa_read_probe_avx512emu(const float *p, size_t n);
double pa_bf16_probe_avx512bf16(long long iters, float *sink);
void pa_gemm_bf16_avx512bf16(pa_ssize kc, const void *A, pa_ssize a_rs, pa_ssize a_cs, const void *B,
                             pa_ssize b_rs, void *C, pa_ssize rs, pa_ssize cs, int m, int n,
                             int accumulate);
#endif
#ifdef PA_HAVE_NEON_KERNELS
PA_KERNELS_OF(neon, f32)
PA_KERNELS_OF(neon, f64)
PA_WIDEN_OF(neon)
PA_VOCAB_OF(neon)
double pa_fma_probe_neon(long long iters, float *sink);
float pa_read_probe_neon(const float *p, size_t n);
#endif
#undef PA_KERNELS_OF
#undef PA_WIDEN_OF
#undef PA_VOCAB_OF
#undef PA_DECODE16_OF

#endif
