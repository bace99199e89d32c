/* dp_sgd.c - instantiates dp_sgd_tmpl.h for float and double (see dp_sgd.h). */
#include "dp_sgd.h"

#include <string.h>

#define T float
#define S _f32
#include "dp_sgd_tmpl.h"
#undef S
#undef T

#define T double
#define S _f64
#include "dp_sgd_tmpl.h"
#undef S
#undef T

#ifndef DP_VEC_PASS /* (dp_vec_*.c include this file for the vector kernels alone) */
typedef struct {
    char *p;
    ptrdiff_t n;
    size_t size;
} zero_job;

/* part t of nt: sgd_task's element range */
static void zero_task(void *arg, int t, int nt)
{
    const zero_job *j = arg;
    ptrdiff_t lo, hi;
    dp_threads_part(j->n, DP_SGD_UNIT, t, nt, &lo, &hi);
    if (lo < hi) memset(j->p + (size_t)lo * j->size, 0, (size_t)(hi - lo) * j->size);
}

void dp_zero_team(dp_threads *team, void *p, ptrdiff_t n, size_t size)
{
    // p is (n,) of `size`-byte elements, split as dp_sgd_step_team splits n
    int threads = dp_threads_for(dp_threads_size(team), n, DP_SGD_MIN_PART);
    if (threads <= 1) {
        if (n > 0) memset(p, 0, (size_t)n * size);
        return;
    }
    zero_job job = {p, n, size};
    dp_threads_run(team, threads, zero_task, &job);
}
#endif
