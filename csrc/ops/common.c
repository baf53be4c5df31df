/* common.c -- small helpers shared by the ops. */
#include <stdlib.h>
#include "ops.h"

#define PA_DTYPE_ROW(CODE, sfx, name, size, compute, c, s, w, ...) [PA_##CODE] = {name, size, compute},
const pa_dtype_info pa_dtypes[PA_NDTYPES] = {PA_DTYPES(PA_DTYPE_ROW, _)};
#undef PA_DTYPE_ROW
_Static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32 / binary64");

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
