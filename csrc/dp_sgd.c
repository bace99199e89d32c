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

#ifndef DP_VEC_PASS    /* (dp_vec_*.c include this file for the vector kernels alone) */
typedef struct {
    char *p;
    size_t nbytes;
} zero_job;

static void zero_task(void *arg, int t, int nt)
{
    const zero_job *j = arg;
    const size_t unit = DP_SGD_UNIT * sizeof(float);
    size_t units = (j->nbytes + unit - 1) / unit;
    size_t lo = units * (size_t)t / (size_t)nt * unit;
    size_t hi = units * (size_t)(t + 1) / (size_t)nt * unit;
    if (hi > j->nbytes) hi = j->nbytes;
    if (lo < hi) memset(j->p + lo, 0, hi - lo);
}

void dp_zero_team(dp_threads *team, void *p, size_t nbytes)
{
    int threads = dp_threads_size(team);
    size_t parts = nbytes / (DP_SGD_MIN_PART * sizeof(float));
    if ((size_t)threads > parts) threads = parts > 1 ? (int)parts : 1;
    if (threads <= 1) {
        memset(p, 0, nbytes);
        return;
    }
    zero_job job = {p, nbytes};
    dp_threads_run(team, threads, zero_task, &job);
}
#endif
