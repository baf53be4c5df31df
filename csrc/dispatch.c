/*
 * dispatch.c -- which kernel family runs: CPUID + XGETBV on x86-64, the
 * architecture itself on aarch64 (NEON is baseline there; no optional
 * extension is used, so there is no HWCAP to read), and the request
 * (PYATTN_ISA, through pyattn._C.select_isa); the avx512 family comes in
 * two variants, with AVX512_BF16's bfloat16 products where the CPU has
 * them, else their exact emulation. Nothing else lives here.
 */
#include "dispatch.h"
#include "ukr_select.h"

#include <stdlib.h>
#include <string.h>

#ifdef PA_HAVE_X86_KERNELS
#include <cpuid.h>

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
#if defined(PA_HAVE_X86_KERNELS)
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return PA_ISA_GENERIC;
    unsigned long long xcr0 = pa_xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return PA_ISA_GENERIC;            /* XMM + YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return PA_ISA_GENERIC;
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1;
    int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    if (!avx2 || !fma || !f16c) return PA_ISA_GENERIC;
    if (avx512f && avx512dq && avx512bw && avx512vl && (xcr0 & 0xe6) == 0xe6)
        return PA_ISA_AVX512;                                  /* + opmask, ZMM state */
    return PA_ISA_AVX2;
#elif defined(PA_HAVE_NEON_KERNELS)
    return PA_ISA_NEON;
#else
    return PA_ISA_GENERIC;
#endif
}

/* AVX512_BF16 (CPUID leaf 7, subleaf 1, EAX bit 5) with the AVX-512 state. */
int pa_cpu_has_avx512bf16(void)
{
#if defined(PA_HAVE_X86_KERNELS)
    static int has = -1;         /* first set under the GIL, at import */
    if (has < 0) {
        unsigned int a, b, c, d;
        has = pa_isa_machine() == PA_ISA_AVX512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
              ((a >> 5) & 1);
        const char *cap = getenv("PYATTN_TEST_CPU");    /* testing hook: the emulation on any AVX-512 CPU */
        if (cap && !strcmp(cap, "nobf16")) has = 0;
    }
    return has;
#else
    return 0;
#endif
}

int pa_isa_machine(void)
{
    static int machine = -1;     /* first set under the GIL, at import */
    if (machine < 0) {
        machine = pa_detect_isa();
        /* testing hook: PYATTN_TEST_CPU=avx2|generic lowers what the CPU is
           taken to support (tests of PYATTN_ISA's fallback warnings) */
        const char *cap = getenv("PYATTN_TEST_CPU");
        if (cap && !strcmp(cap, "generic")) machine = PA_ISA_GENERIC;
        else if (cap && !strcmp(cap, "avx2") && machine == PA_ISA_AVX512) machine = PA_ISA_AVX2;
    }
    return machine;
}

/* From PA_FAMILIES (registry.h): each family's word, and its table where
 * this build has it (NULL: a family of another architecture). */
#define PA_ISA_WORD(CODE, word, isa, arch, ...) [PA_ISA_##CODE] = #word,
#define PA_ISA_TABLE(CODE, word, isa, arch, ...) \
    [PA_ISA_##CODE] = PA_IF(PA_ARCH_##arch)(&pa_family_##word, NULL),
static const char *const pa_isa_words[PA_ISA_COUNT] = {PA_FAMILIES(PA_ISA_WORD, _)};
static const pa_family *const pa_isa_tables[PA_ISA_COUNT] = {PA_FAMILIES(PA_ISA_TABLE, _)};
#undef PA_ISA_WORD
#undef PA_ISA_TABLE

const char *pa_isa_name(int isa)
{
    return isa >= 0 && isa < PA_ISA_COUNT ? pa_isa_words[isa] : pa_isa_words[PA_ISA_GENERIC];
}

int pa_isa_built(int isa)
{
    return isa >= 0 && isa < PA_ISA_COUNT && pa_isa_tables[isa] != NULL;
}

static const pa_family *pa_family_of(int isa)
{
#ifdef PA_HAVE_X86_KERNELS
    if (isa == PA_ISA_AVX512 && pa_cpu_has_avx512bf16()) return pa_ukr_family(&pa_family_avx512bf16);
#endif
    return pa_ukr_family(pa_isa_built(isa) ? pa_isa_tables[isa] : &pa_family_generic);
}

const pa_family *pa_choose_family(int requested)
{
    const int machine = pa_isa_machine();
    int isa = machine;
    if (requested == PA_ISA_GENERIC)
        isa = PA_ISA_GENERIC;
    else if (requested == PA_ISA_AVX512_EMU)                   /* tests: needs AVX2 only */
        isa = machine == PA_ISA_AVX2 || machine == PA_ISA_AVX512 ? PA_ISA_AVX512_EMU : machine;
    else if ((requested == PA_ISA_AVX2 || requested == PA_ISA_AVX512) &&
             (machine == PA_ISA_AVX2 || machine == PA_ISA_AVX512))
        isa = requested < machine ? requested : machine;      /* x86 levels: capped */
    return pa_family_of(isa);
}
