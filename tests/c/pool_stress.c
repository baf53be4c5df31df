/*
 * pool_stress.c -- the thread pool's claim protocol under ThreadSanitizer
 * (.ci/run builds it with -fsanitize=thread against csrc/threads.c).
 *
 * 200 000 jobs of 1 to 7 tasks on up to 6 threads, the pool's size changed
 * now and then: every task must run exactly once per job, and a worker that
 * wakes after its job is over must claim nothing (the per-job counters live
 * on the caller's stack, so a late claim would write into the next job's).
 * Then 100 000 jobs of 1 to 40 tasks whose stop flag (threads.h: Ctrl-C) one
 * task sets: no task runs twice, none after its call returned, the one that
 * set it ran, and the tasks that saw it in pa_stop_get() were that job's.
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

typedef struct {
    atomic_int hits[40];
    pa_stop_flag stop;
    int stop_at;
    atomic_int wrong_flag;
} stop_job_t;

static void stop_task(void *ctx, pa_ssize t, int tid)
{
    stop_job_t *j = (stop_job_t *)ctx;
    (void)tid;
    if (pa_stop_get() != &j->stop) atomic_fetch_add(&j->wrong_flag, 1);
    atomic_fetch_add(&j->hits[t], 1);
    if (t == j->stop_at) atomic_store(&j->stop, 1);
}

static int stop_jobs(void)
{
    long skipped = 0;
    for (int it = 0; it < 100000; it++) {
        const pa_ssize n = 1 + it % 40;
        stop_job_t j;
        for (int i = 0; i < 40; i++) atomic_init(&j.hits[i], 0);
        atomic_init(&j.stop, 0);
        atomic_init(&j.wrong_flag, 0);
        j.stop_at = (int)((it * 7) % n);
        pa_stop_set(&j.stop);
        pa_parallel_for(n, stop_task, &j, 1 + it % 6);
        pa_stop_set(NULL);
        int ran = 0;
        for (pa_ssize i = 0; i < 40; i++) {
            const int h = atomic_load(&j.hits[i]);
            if (h > 1 || (i >= n && h) || (i == j.stop_at && h != 1)) {
                printf("stop job %d: task %ld ran %d times\n", it, (long)i, h);
                return 1;
            }
            ran += h;
        }
        if (atomic_load(&j.wrong_flag)) {
            printf("stop job %d: a task saw another flag\n", it);
            return 1;
        }
        skipped += (long)n - ran;
        if (it % 25000 == 0) pa_set_num_threads(2 + it % 4);
    }
    printf("pool_stress: 100000 stopped jobs right, %ld tasks skipped\n", skipped);
    return skipped > 0 ? 0 : 1;     /* the stop took effect */
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
    if (atomic_load(&on_workers) == 0) return 1;   /* the workers took part */
    return stop_jobs();
}
