/* dp_sgd_tmpl.h - bodies of the kernels in dp_sgd.h for one dtype.
 * Included by dp_sgd.c with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

void KV(dp_sgd_step)(T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum, T dampening,
                     T weight_decay, int nesterov, int first_step)
{
    // p, v, g are (P,). torch.optim.SGD: d = g + wd p; v = momentum v + (1 - dampening) d
    // (v = d on the first step); d = d + momentum v if nesterov else v; p -= lr d.
    // v == NULL: no momentum (the caller's momentum is 0). As PyTorch, weight_decay == 0 adds
    // no term (0 * p would turn an infinite parameter into NaN); the branch is loop-invariant.
#define DECAYED(i) (weight_decay != 0 ? g[i] + weight_decay * p[i] : g[i])
    if (!v) {
        for (ptrdiff_t i = 0; i < n; i++) p[i] -= lr * DECAYED(i);
        return;
    }
    T damp = (T)1 - dampening;
    if (first_step) {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = DECAYED(i);
            v[i] = d;
            p[i] -= lr * (nesterov ? d + momentum * d : d);
        }
    } else if (nesterov) {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = DECAYED(i);
            T vi = momentum * v[i] + damp * d;
            v[i] = vi;
            p[i] -= lr * (d + momentum * vi);
        }
    } else {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = DECAYED(i);
            T vi = momentum * v[i] + damp * d;
            v[i] = vi;
            p[i] -= lr * vi;
        }
    }
#undef DECAYED
}

#ifndef DP_VEC_PASS
DP_SGD_VEC(DP_VEC_DEFINE, T, S)

typedef struct {
    T *p, *v;
    const T *g;
    ptrdiff_t n;
    T lr, momentum, dampening, weight_decay;
    int nesterov, first_step;
} K(sgd_job);

static void K(sgd_task)(void *arg, int t, int nt)
{
    const K(sgd_job) *j = arg;
    ptrdiff_t lo, hi;
    dp_threads_part(j->n, DP_SGD_UNIT, t, nt, &lo, &hi);
    if (lo < hi)
        K(dp_sgd_step)(j->p + lo, j->v ? j->v + lo : NULL, j->g + lo, hi - lo, j->lr, j->momentum,
                       j->dampening, j->weight_decay, j->nesterov, j->first_step);
}

void K(dp_sgd_step_team)(dp_threads *team, T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum,
                         T dampening, T weight_decay, int nesterov, int first_step)
{
    // p, v, g are (P,), split over the team in whole units
    int threads = dp_threads_for(dp_threads_size(team), n, DP_SGD_MIN_PART);
    if (threads <= 1) {
        K(dp_sgd_step)(p, v, g, n, lr, momentum, dampening, weight_decay, nesterov, first_step);
        return;
    }
    K(sgd_job) job = {p, v, g, n, lr, momentum, dampening, weight_decay, nesterov, first_step};
    dp_threads_run(team, threads, K(sgd_task), &job);
}
#endif

#undef K
