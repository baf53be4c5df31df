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

typedef void (*pa_task_fn)(void *ctx, pa_ssize task, int tid);

void pa_parallel_for(pa_ssize ntasks, pa_task_fn fn, void *ctx, int max_threads);
int pa_get_num_threads(void);
/* Returns 0 on success, -1 if the threads could not be started (the pool then
 * keeps the count it could start). */
int pa_set_num_threads(int n);
#define PA_MAX_THREADS 1024

#endif
