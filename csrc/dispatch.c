/*
 * dispatch.c -- which kernel family runs: the best the machine supports
 * (cpu.c identifies it) capped by the request (PYATTN_ISA, through
 * pyattn._C.select_isa); the avx512 family comes in two variants, with
 * AVX512_BF16's bfloat16 products where the CPU has them, else their exact
 * emulation. Nothing else lives here.
 */
#include "dispatch.h"
#include "cpu.h"
#include "ukr_select.h"

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
    if (isa == PA_ISA_AVX512) {
        const int bf = pa_cpu_has_avx512bf16(), vn = pa_cpu_has_avx512vnni();
        return pa_ukr_family(bf ? (vn ? &pa_family_avx512bf16vnni : &pa_family_avx512bf16)
                                : (vn ? &pa_family_avx512vnni : &pa_family_avx512));
    }
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
