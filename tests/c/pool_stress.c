/*
 * pool_stress.c -- the thread pool's claim protocol under ThreadSanitizer
 * (.ci/run builds it with -fsanitize=thread against csrc/threads.c).
 *
 * 200 000 jobs of 1 to 7 tasks on up to 6 threads, the pool's size changed
 * now and then: every task must run exactly once per job, and a worker that
 * wakes after its job is over must claim nothing (the per-job counters live
 * on the caller's stack, so a late claim would write into the next job's).
 * Exit status 0 when every job was right; TSan reports any data race.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "threads.h"

typedef struct {
    atomic_int hits[8];
} job_t;

static atomic_long on_workers;

static void task(void *ctx, pa_ssize t, int tid)
{
    job_t *j = (job_t *)ctx;
    atomic_fetch_add(&j->hits[t], 1);
    if (tid != 0) atomic_fetch_add(&on_workers, 1);
}

int main(void)
{
    pa_set_num_threads(5);
    for (int it = 0; it < 200000; it++) {
        const pa_ssize n = 1 + it % 7;
        job_t j;
        for (int i = 0; i < 8; i++) atomic_init(&j.hits[i], 0);
        pa_parallel_for(n, task, &j, 1 + it % 6);
        for (pa_ssize i = 0; i < 8; i++) {
            const int want = i < n ? 1 : 0;
            if (atomic_load(&j.hits[i]) != want) {
                printf("job %d: task %ld ran %d times\n", it, (long)i, atomic_load(&j.hits[i]));
                return 1;
            }
        }
        if (it % 50000 == 0) pa_set_num_threads(2 + it % 4);
    }
    printf("pool_stress: 200000 jobs right, %ld tasks ran on workers\n", (long)atomic_load(&on_workers));
    return atomic_load(&on_workers) > 0 ? 0 : 1;   /* the workers took part */
}
