/* gemm_ref.c -- the portable GEMM micro-kernels (see gemm_ref.inc). */
#include "dispatch.h"

#define T float
#define MR 4
#define NR 16
#define PA_NAME pa_gemm_ukr_f32_ref_4x16
#include "gemm_ref.inc"
#undef T
#undef MR
#undef NR
#undef PA_NAME

#define T double
#define MR 4
#define NR 8
#define PA_NAME pa_gemm_ukr_f64_ref_4x8
#include "gemm_ref.inc"
