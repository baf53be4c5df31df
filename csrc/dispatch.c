/*
 * dispatch.c -- CPU detection (CPUID + XGETBV) and the kernel table.
 */
#include "dispatch.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#define PA_X86 1
#endif
#if defined(PA_X86) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define PA_HAVE_CPUID 1
#endif

pa_dispatch pa_kernels;

const char *pa_isa_name(int isa)
{
    switch (isa) {
    case PA_ISA_AVX512_EMU: return "avx512emu";
    case PA_ISA_AVX512: return "avx512";
    case PA_ISA_AVX2: return "avx2";
    default: return "generic";
    }
}

#ifdef PA_HAVE_CPUID
static unsigned long long pa_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Best family this CPU *and* the OS (saved register state) support. */
static int pa_detect_isa(void)
{
#ifdef PA_HAVE_CPUID
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx) return PA_ISA_GENERIC;
    unsigned long long xcr0 = pa_xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return PA_ISA_GENERIC;            /* XMM + YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1;
    int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    if (!avx2 || !fma) return PA_ISA_GENERIC;
    if (avx512f && avx512dq && avx512bw && avx512vl && (xcr0 & 0xe6) == 0xe6)
        return PA_ISA_AVX512;                                  /* + opmask, ZMM state */
    return PA_ISA_AVX2;
#else
    return PA_ISA_GENERIC;
#endif
}

static void pa_fill_ref(void)
{
    pa_kernels.gemm[PA_F32] = (pa_gemm_kernel){pa_gemm_ukr_f32_ref_4x16, 4, 16, 256, 64, 2048,
                                               "pyattn_gemm_f32_ref_4x16"};
    pa_kernels.gemm[PA_F64] = (pa_gemm_kernel){pa_gemm_ukr_f64_ref_4x8, 4, 8, 256, 64, 1024,
                                               "pyattn_gemm_f64_ref_4x8"};
    pa_kernels.tilesm_float = pa_tilesm_f32_ref;
    pa_kernels.tilesm_double = pa_tilesm_f64_ref;
    pa_kernels.tilesm_name = "pyattn_tilesm_ref";
    pa_kernels.softmax[PA_F32] = pa_softmax_f32_ref;
    pa_kernels.softmax[PA_F64] = pa_softmax_f64_ref;
    pa_kernels.softmax_name[PA_F32] = "pyattn_softmax_f32_ref";
    pa_kernels.softmax_name[PA_F64] = "pyattn_softmax_f64_ref";
}

int pa_dispatch_init(int requested)
{
    int machine = pa_detect_isa();
    int isa = machine;
    if (requested == PA_ISA_AVX512_EMU)              /* tests: needs AVX2 only */
        isa = machine >= PA_ISA_AVX2 && pa_have_avx2_kernels() ? PA_ISA_AVX512_EMU : machine;
    else if (requested >= 0 && requested < isa)
        isa = requested;
    pa_fill_ref();
    pa_kernels.isa_machine = machine;
    /* every family runs the tiled attention on its own micro-kernel and exp;
     * the scalar reference kernel serves the weights path and huge head dims.
     * The query block is the smallest multiple of lcm(MR, NR) >= 48. */
    pa_kernels.attn[PA_F32] = (pa_attn_kernel){pa_attn_f32_flash, pa_attn_ws_f32_flash,
                                               pa_attn_merge_f32_flash, 48,
                                               "pyattn_attn_f32_flash_48x60"};
    pa_kernels.attn[PA_F64] = (pa_attn_kernel){pa_attn_f64_flash, pa_attn_ws_f64_flash,
                                               pa_attn_merge_f64_flash, 48,
                                               "pyattn_attn_f64_flash_48x60"};
    /* Each family overwrites the entries it has kernels for; the rest keep
     * the reference kernels. */
    if (isa >= PA_ISA_AVX2 && pa_have_avx2_kernels()) {
        pa_kernels.gemm[PA_F32] = (pa_gemm_kernel){pa_gemm_ukr_f32_avx2_6x16, 6, 16, 256, 96, 2048,
                                                   "pyattn_gemm_f32_avx2_6x16"};
        pa_kernels.gemm[PA_F64] = (pa_gemm_kernel){pa_gemm_ukr_f64_avx2_6x8, 6, 8, 256, 72, 1024,
                                                   "pyattn_gemm_f64_avx2_6x8"};
        pa_kernels.tilesm_float = pa_tilesm_f32_avx2;
        pa_kernels.tilesm_double = pa_tilesm_f64_avx2;
        pa_kernels.tilesm_name = "pyattn_tilesm_avx2";
        pa_kernels.softmax[PA_F32] = pa_softmax_f32_avx2;
        pa_kernels.softmax[PA_F64] = pa_softmax_f64_avx2;
        pa_kernels.softmax_name[PA_F32] = "pyattn_softmax_f32_avx2";
        pa_kernels.softmax_name[PA_F64] = "pyattn_softmax_f64_avx2";
    }
    /* AVX-512: 12 x 2-vector micro-kernels and the 16-lane tile step. The
     * blocking (KC 256; MC 96, NC 2048 for f32) is sized from the L1/L2 of
     * AVX-512 Xeons, not tuned on one: none was at hand when it was written. */
    int avx512_real = isa == PA_ISA_AVX512 && pa_have_avx512_kernels();
    if (avx512_real || isa == PA_ISA_AVX512_EMU) {
        pa_kernels.gemm[PA_F32] = (pa_gemm_kernel){
            avx512_real ? pa_gemm_ukr_f32_avx512_12x32 : pa_gemm_ukr_f32_avx512emu_12x32,
            12, 32, 256, 96, 2048,
            avx512_real ? "pyattn_gemm_f32_avx512_12x32" : "pyattn_gemm_f32_avx512emu_12x32"};
        pa_kernels.gemm[PA_F64] = (pa_gemm_kernel){
            avx512_real ? pa_gemm_ukr_f64_avx512_12x16 : pa_gemm_ukr_f64_avx512emu_12x16,
            12, 16, 256, 96, 1024,
            avx512_real ? "pyattn_gemm_f64_avx512_12x16" : "pyattn_gemm_f64_avx512emu_12x16"};
        pa_kernels.tilesm_float = avx512_real ? pa_tilesm_f32_avx512 : pa_tilesm_f32_avx512emu;
        pa_kernels.tilesm_double = avx512_real ? pa_tilesm_f64_avx512 : pa_tilesm_f64_avx512emu;
        pa_kernels.tilesm_name = avx512_real ? "pyattn_tilesm_avx512" : "pyattn_tilesm_avx512emu";
        pa_kernels.attn[PA_F32].bq = 96;
        pa_kernels.attn[PA_F32].name = "pyattn_attn_f32_flash_96x60";
    }
    pa_kernels.isa = isa;
    return isa;
}
