/*
 * families_api.c -- pa_families_api_table (families_api.h): dispatch.c's
 * family choice and words, the dtype table and each SIMD family's vocabulary
 * test hook, lent to the kernel checks (csrc/check/) through the capsule
 * pyattn._C._families_capsule. Static data and one switch; used by no op.
 */
#include "dispatch.h"
#include "families_api.h"

/* each SIMD family's vocabulary hook (kernels/vec/vocab_check.inc, which
 * family_vec.inc instantiates for every family built on it: the registry's
 * rows of arch x86 and arm; the portable family, arch any, has none) */
#define FA_SIMD_any 0
#define FA_SIMD_x86 PA_ARCH_x86
#define FA_SIMD_arm PA_ARCH_arm
#define FA_DECL(CODE, word, isa, arch, ...) \
    PA_WHEN(FA_SIMD_##arch)(pa_vocab_sig pa_vocab_f32_##isa; pa_vocab_sig pa_vocab_f64_##isa;)
#define FA_HOOK(CODE, word, isa, arch, ...) \
    PA_WHEN(FA_SIMD_##arch)(case PA_ISA_##CODE: v[PA_F32] = pa_vocab_f32_##isa; v[PA_F64] = pa_vocab_f64_##isa; break;)
PA_FAMILIES(FA_DECL, _)
static void fa_vocab_hooks(int isa, pa_vocab_fn v[PA_NCOMPUTE])
{
    v[PA_F32] = v[PA_F64] = NULL;
    switch (isa) {
    PA_FAMILIES(FA_HOOK, _)
    default: break;
    }
}
#undef FA_DECL
#undef FA_HOOK
#undef FA_SIMD_any
#undef FA_SIMD_x86
#undef FA_SIMD_arm

const pa_families_api pa_families_api_table = {
    PA_FAMILIES_API_VERSION, (int)sizeof(pa_families_api), (int)sizeof(pa_family), PA_ISA_COUNT, PA_NDTYPES,
    pa_choose_family, pa_isa_name, pa_isa_built, pa_dtypes, fa_vocab_hooks,
};
