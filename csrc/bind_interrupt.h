/*
 * bind_interrupt.h -- Ctrl-C: stopping a long call (bind_interrupt.c). An
 * entry runs its op through PA_STOPPABLE_CALL, which releases the GIL
 * around it.
 */
#ifndef PYATTN_BIND_INTERRUPT_H
#define PYATTN_BIND_INTERRUPT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct { int armed; } pa_stop_scope;

/* Before releasing the GIL: arm the SIGINT wrapper where it applies (a call
 * of about `work` multiply-adds). */
void pa_stop_begin(pa_stop_scope *s, double work);
/* After taking the GIL back: 0 the call ran through; 1 it was stopped and a
 * Python handler raised (the exception is set); 2 it was stopped and the
 * handlers returned: run the call again. */
int pa_stop_end(pa_stop_scope *s);

/* Runs `call` (a statement that sets rc; about `work` multiply-adds)
 * without the GIL until it ends unstopped, `again` (a statement) before each
 * rerun; then jumps to fail when a SIGINT handler raised. */
#define PA_STOPPABLE_CALL(work, call, again)                                  \
    do {                                                                      \
        int st_;                                                              \
        for (;;) {                                                            \
            pa_stop_scope sc_;                                                   \
            pa_stop_begin(&sc_, (work));                                         \
            Py_BEGIN_ALLOW_THREADS                                            \
            call;                                                             \
            Py_END_ALLOW_THREADS                                              \
            st_ = pa_stop_end(&sc_);                                             \
            if (st_ != 2) break;                                              \
            again;                                                            \
        }                                                                     \
        if (st_ == 1) goto fail;                                              \
    } while (0)

#endif
