/* common.c -- small helpers shared by the ops. */
#include <stdatomic.h>
#include <stdlib.h>
#include "ops.h"

#define PA_DTYPE_ROW(CODE, sfx, name, size, compute, c, s, w, ...) [PA_##CODE] = {name, size, compute},
const pa_dtype_info pa_dtypes[PA_NDTYPES] = {PA_DTYPES(PA_DTYPE_ROW, _)};
#undef PA_DTYPE_ROW
_Static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32 / binary64");

static atomic_long fail_countdown = 0;  /* > 0: allocations until one fails */
static atomic_long live_blocks = 0;     /* pa_alloc64 blocks not yet freed */

long pa_alloc_hook(long n, long *live)
{
    *live = atomic_load(&live_blocks);
    return atomic_exchange(&fail_countdown, n > 0 ? n : 0);
}

int pa_alloc_fails(void)
{
    if (atomic_load_explicit(&fail_countdown, memory_order_relaxed) <= 0) return 0;
    long n = atomic_load(&fail_countdown);
    while (n > 0 && !atomic_compare_exchange_weak(&fail_countdown, &n, n - 1)) {}
    return n == 1;
}

/* 64-byte aligned block; the raw pointer is kept just before it. */
void *pa_alloc64(size_t bytes)
{
    if (bytes > SIZE_MAX - 64 - sizeof(void *) || pa_alloc_fails()) return NULL;
    char *raw = (char *)malloc(bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    atomic_fetch_add(&live_blocks, 1);
    uintptr_t a = ((uintptr_t)(raw + sizeof(void *)) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    return (void *)a;
}

void pa_free64(void *p)
{
    if (!p) return;
    atomic_fetch_sub(&live_blocks, 1);
    free(((void **)p)[-1]);
}

/* The reusable workspace (ops.h): at most one parked block, its capacity in
 * the word below the raw pointer. The slot is one atomic pointer: a call
 * takes the block by exchanging NULL in (so two calls never share it: the
 * second finds NULL and allocates its own), and gives it back by exchanging
 * it in (freeing what it pushed out: the block of a call that overlapped).
 * A parked block is not live for the hook (pa_alloc_hook's count): taking it
 * makes it live again, parking it not. */
static _Atomic(void *) ws_slot = NULL;

static void ws_free_raw(void *p)
{
    if (p) free(((void **)p)[-1]);
}

void *pa_ws_take(size_t bytes)
{
    if (pa_alloc_fails()) return NULL;            /* the hook: a take counts as an allocation */
    if (bytes == 0) bytes = 1;
    void *p = atomic_exchange(&ws_slot, NULL);
    if (p && ((size_t *)p)[-2] >= bytes) {
        atomic_fetch_add(&live_blocks, 1);
        return p;
    }
    ws_free_raw(p);                               /* too small: grown below */
    if (bytes > SIZE_MAX - 64 - 2 * sizeof(void *)) return NULL;
    char *raw = (char *)malloc(bytes + 64 + 2 * sizeof(void *));
    if (!raw) return NULL;
    atomic_fetch_add(&live_blocks, 1);
    uintptr_t a = ((uintptr_t)(raw + 2 * sizeof(void *)) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    ((size_t *)a)[-2] = bytes;
    return (void *)a;
}

void pa_ws_give(void *p)
{
    if (!p) return;
    atomic_fetch_sub(&live_blocks, 1);
    if (((size_t *)p)[-2] > PA_WS_KEEP_MAX) {     /* too large to hold between calls */
        ws_free_raw(p);
        return;
    }
    ws_free_raw(atomic_exchange(&ws_slot, p));
}

void pa_ws_release(void)
{
    ws_free_raw(atomic_exchange(&ws_slot, NULL));
}
