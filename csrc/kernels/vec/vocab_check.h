/* vocab_check.h -- the ops of the vocabulary test hook pa_vocab_<dt>_<isa>
 * (vocab_check.inc, instantiated by family_vec.inc for every SIMD family;
 * kernel_check.c calls it). Not a kernel kind: the frame never calls it. */
#ifndef PYATTN_VOCAB_CHECK_H
#define PYATTN_VOCAB_CHECK_H

#include "pyattn.h"

enum { PA_VOP_ADD, PA_VOP_SUB, PA_VOP_MUL, PA_VOP_DIV, PA_VOP_MAX, PA_VOP_FMA, PA_VOP_FNMA,
       PA_VOP_LT, PA_VOP_EQ, PA_VOP_ZERO_WHERE, PA_VOP_POW2I, PA_VOP_EXP, PA_VOP_BCAST,
       PA_VOP_COUNT, PA_VOP_HSUM16 = 100, PA_VOP_LANES = 101 };
typedef int pa_vocab_sig(int op, const void *a, const void *b, const void *c, void *out, pa_ssize n);
typedef pa_vocab_sig *pa_vocab_fn;

#endif
