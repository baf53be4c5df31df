/*
 * threads.h -- one persistent worker pool for the process (pthreads).
 *
 * pa_parallel_for runs fn(ctx, task, tid) for task = 0..ntasks-1 on at most
 * max_threads threads (tid < max_threads, the caller is tid 0). Tasks must be
 * independent; each task's arithmetic must not depend on tid, so results are
 * bit-identical whatever the thread count. Call it without the GIL.
 * If another call already owns the pool, this call runs serially on its own
 * thread (tid 0) instead of waiting.
 */
#ifndef PYATTN_THREADS_H
#define PYATTN_THREADS_H

#include "pyattn.h"

/* a stop flag: set from a signal handler, read by every thread of the call */
#ifndef __STDC_NO_ATOMICS__
#include <stdatomic.h>
typedef atomic_int pa_stop_flag;
#define PA_STOP_LOAD(f) atomic_load_explicit((f), memory_order_relaxed)
#else
typedef volatile int pa_stop_flag;
#define PA_STOP_LOAD(f) (*(f))
#endif

typedef void (*pa_task_fn)(void *ctx, pa_ssize task, int tid);

/* Stopping a call early (Ctrl-C; bind_interrupt.c sets the flag from a SIGINT
 * handler). pa_stop_set(flag) names the calling thread's stop flag (NULL:
 * none) for the ops it calls next; pa_parallel_for hands it on to the threads
 * that run the op's tasks and, once it is set, skips the tasks not yet
 * started (the call still returns only after every started task ended).
 * Long loops inside a task (key tiles, query blocks, K panels) read
 * pa_stop_get() once and ask pa_stopping() between iterations, never per
 * element. An op that stops leaves its outputs incomplete; the binding
 * discards them. A call whose flag stays clear computes exactly what it did
 * before: the flag decides only whether work runs, never how. */
void pa_stop_set(pa_stop_flag *flag);
pa_stop_flag *pa_stop_get(void);
static inline int pa_stopping(pa_stop_flag *flag)
{
    return flag != NULL && PA_STOP_LOAD(flag) != 0;
}

void pa_parallel_for(pa_ssize ntasks, pa_task_fn fn, void *ctx, int max_threads);
int pa_get_num_threads(void);
/* Returns 0 on success, -1 if the threads could not be started (the pool then
 * keeps the count it could start). */
int pa_set_num_threads(int n);
#define PA_MAX_THREADS 1024

#endif
