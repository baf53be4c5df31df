/* common.c -- small helpers shared by the ops. */
#include <stdlib.h>
#include "ops.h"

const pa_dtype_info pa_dtypes[PA_NDTYPES] = {
    [PA_F32] = {"float32", sizeof(float), PA_F32},
    [PA_F64] = {"float64", sizeof(double), PA_F64},
    [PA_F16] = {"float16", 2, PA_F32},
    [PA_BF16] = {"bfloat16", 2, PA_F32},
};

/* 64-byte aligned block; the raw pointer is kept just before it. */
void *pa_alloc64(size_t bytes)
{
    if (bytes > SIZE_MAX - 64 - sizeof(void *)) return NULL;
    char *raw = (char *)malloc(bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t a = ((uintptr_t)(raw + sizeof(void *)) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    return (void *)a;
}

void pa_free64(void *p)
{
    if (p) free(((void **)p)[-1]);
}
