/* dp_adam_tmpl.h - bodies of the kernels in dp_adam.h for one dtype.
 * Included by dp_adam.c with T, S (_f32/_f64) and SQRT (sqrtf/sqrt) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* One element's update; `amsgrad` is a constant 0 or 1, so that each of the kernel's loops
 * below is a straight line the compiler vectorizes. */
#define ADAM_ELEMENT(i, amsgrad)                                          \
    do {                                                                  \
        T pi = p[i];                                                      \
        if (decoupled) pi *= decay;                                       \
        T gi = l2 ? g[i] + weight_decay * pi : g[i];                      \
        T mi = beta1 * m[i] + omb1 * gi;                                  \
        T vi = beta2 * v[i] + omb2 * gi * gi;                             \
        m[i] = mi;                                                        \
        v[i] = vi;                                                        \
        if (amsgrad) {                                                    \
            /* torch.maximum: NaN wins (a diverged run shows) */          \
            T vm = vmax[i];                                               \
            vi = (vi > vm || vi != vi) ? vi : vm;                         \
            vmax[i] = vi;                                                 \
        }                                                                 \
        p[i] = pi - step_size * (mi / (SQRT(vi) * inv_bias2_sqrt + eps)); \
    } while (0)

void KV(dp_adam_step)(T *p, T *m, T *v, T *vmax, const T *g, ptrdiff_t n,
                      const K(dp_adam_hyper) * h)
{
    // p, m, v, vmax, g are (P,); vmax NULL without AMSGrad. torch.optim.adam._single_tensor_adam:
    // g += wd p (Adam) or p *= 1 - lr wd (AdamW); m, v the moving averages; vmax their max;
    // p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps). The branches on l2 and
    // decoupled are loop-invariant (the compiler unswitches them).
    const T step_size = h->step_size, beta1 = h->beta1, omb1 = h->one_minus_beta1;
    const T beta2 = h->beta2, omb2 = h->one_minus_beta2, eps = h->eps;
    const T inv_bias2_sqrt = h->inv_bias2_sqrt, weight_decay = h->weight_decay, decay = h->decay;
    const int l2 = weight_decay != 0, decoupled = decay != 1;
    if (vmax) {
        for (ptrdiff_t i = 0; i < n; i++) ADAM_ELEMENT(i, 1);
    } else {
        for (ptrdiff_t i = 0; i < n; i++) ADAM_ELEMENT(i, 0);
    }
}
#undef ADAM_ELEMENT

/* One element of RMSprop; `centered` and `mom` are constants 0 or 1 in each loop below. */
#define RMSPROP_ELEMENT(i, centered, mom)                     \
    do {                                                      \
        T gi = l2 ? g[i] + weight_decay * p[i] : g[i];        \
        T si = alpha * sq[i] + oma * gi * gi;                 \
        sq[i] = si;                                           \
        T avg;                                                \
        if (centered) {                                       \
            T ga = gavg[i] + oma * (gi - gavg[i]);            \
            gavg[i] = ga;                                     \
            T var = si - ga * ga; /* below 0: 0; NaN stays */ \
            avg = SQRT(var < 0 ? (T)0 : var) + eps;           \
        } else {                                              \
            avg = SQRT(si) + eps;                             \
        }                                                     \
        if (mom) {                                            \
            T bi = momentum * buf[i] + gi / avg;              \
            buf[i] = bi;                                      \
            p[i] = p[i] - lr * bi;                            \
        } else {                                              \
            p[i] = p[i] - lr * (gi / avg);                    \
        }                                                     \
    } while (0)

void KV(dp_rmsprop_step)(T *p, T *sq, T *gavg, T *buf, const T *g, ptrdiff_t n,
                         const K(dp_rmsprop_hyper) * h)
{
    // p, sq, gavg, buf, g are (P,): torch.optim.rmsprop._single_tensor_rmsprop (see dp_adam.h)
    const T lr = h->lr, alpha = h->alpha, oma = h->one_minus_alpha, eps = h->eps;
    const T weight_decay = h->weight_decay, momentum = h->momentum;
    const int l2 = weight_decay != 0;
    if (gavg && buf) {
        for (ptrdiff_t i = 0; i < n; i++) RMSPROP_ELEMENT(i, 1, 1);
    } else if (gavg) {
        for (ptrdiff_t i = 0; i < n; i++) RMSPROP_ELEMENT(i, 1, 0);
    } else if (buf) {
        for (ptrdiff_t i = 0; i < n; i++) RMSPROP_ELEMENT(i, 0, 1);
    } else {
        for (ptrdiff_t i = 0; i < n; i++) RMSPROP_ELEMENT(i, 0, 0);
    }
}
#undef RMSPROP_ELEMENT

#ifndef DP_VEC_PASS
DP_ADAM_VEC(DP_VEC_DEFINE, T, S)
DP_RMSPROP_VEC(DP_VEC_DEFINE, T, S)

void K(dp_adam_prepare)(K(dp_adam_hyper) * h, double lr, double beta1, double beta2, double eps,
                        double weight_decay, int decoupled, long long t)
{
    // torch: step_size = lr / bias_correction1; bias_correction2_sqrt = bias_correction2 ** 0.5
    // (Python's float ** is C's pow); AdamW's param.mul_(1 - lr * weight_decay)
    h->step_size = (T)(lr / (1.0 - pow(beta1, (double)t)));
    h->inv_bias2_sqrt = (T)(1.0 / pow(1.0 - pow(beta2, (double)t), 0.5));
    h->beta1 = (T)beta1;
    h->one_minus_beta1 = (T)(1.0 - beta1);
    h->beta2 = (T)beta2;
    h->one_minus_beta2 = (T)(1.0 - beta2);
    h->eps = (T)eps;
    h->weight_decay = (T)(decoupled ? 0.0 : weight_decay);
    h->decay = (T)(decoupled && weight_decay != 0 ? 1.0 - lr * weight_decay : 1.0);
}

typedef struct {
    T *p, *m, *v, *vmax;
    const T *g;
    ptrdiff_t n;
    const K(dp_adam_hyper) * h;
} K(adam_job);

static void K(adam_task)(void *arg, int t, int nt)
{
    const K(adam_job) *j = arg;
    ptrdiff_t lo, hi;
    dp_threads_part(j->n, DP_SGD_UNIT, t, nt, &lo, &hi);
    if (lo < hi)
        K(dp_adam_step)(j->p + lo, j->m + lo, j->v + lo, j->vmax ? j->vmax + lo : NULL, j->g + lo,
                        hi - lo, j->h);
}

void K(dp_adam_step_team)(dp_threads *team, T *p, T *m, T *v, T *vmax, const T *g, ptrdiff_t n,
                          const K(dp_adam_hyper) * h)
{
    // p, m, v, vmax, g are (P,), split over the team in whole units
    int threads = dp_threads_for(dp_threads_size(team), n, DP_SGD_MIN_PART);
    if (threads <= 1) {
        K(dp_adam_step)(p, m, v, vmax, g, n, h);
        return;
    }
    K(adam_job) job = {p, m, v, vmax, g, n, h};
    dp_threads_run(team, threads, K(adam_task), &job);
}

typedef struct {
    T *p, *sq, *gavg, *buf;
    const T *g;
    ptrdiff_t n;
    const K(dp_rmsprop_hyper) * h;
} K(rmsprop_job);

static void K(rmsprop_task)(void *arg, int t, int nt)
{
    const K(rmsprop_job) *j = arg;
    ptrdiff_t lo, hi;
    dp_threads_part(j->n, DP_SGD_UNIT, t, nt, &lo, &hi);
    if (lo < hi)
        K(dp_rmsprop_step)(j->p + lo, j->sq + lo, j->gavg ? j->gavg + lo : NULL,
                           j->buf ? j->buf + lo : NULL, j->g + lo, hi - lo, j->h);
}

void K(dp_rmsprop_step_team)(dp_threads *team, T *p, T *sq, T *gavg, T *buf, const T *g,
                             ptrdiff_t n, const K(dp_rmsprop_hyper) * h)
{
    // p, sq, gavg, buf, g are (P,), split over the team in whole units
    int threads = dp_threads_for(dp_threads_size(team), n, DP_SGD_MIN_PART);
    if (threads <= 1) {
        K(dp_rmsprop_step)(p, sq, gavg, buf, g, n, h);
        return;
    }
    K(rmsprop_job) job = {p, sq, gavg, buf, g, n, h};
    dp_threads_run(team, threads, K(rmsprop_task), &job);
}
#endif

#undef K
