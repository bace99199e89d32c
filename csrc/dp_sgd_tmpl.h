/* dp_sgd_tmpl.h - bodies of the kernels in dp_sgd.h for one dtype.
 * Included by dp_sgd.c with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

DP_CLONES void K(dp_sgd_step)(T *p, T *v, const T *g, ptrdiff_t n, T lr, T momentum, T dampening,
                    T weight_decay, int nesterov, int first_step)
{
    // p, v, g are (P,). torch.optim.SGD: d = g + wd p; v = momentum v + (1 - dampening) d
    // (v = d on the first step); d = d + momentum v if nesterov else v; p -= lr d.
    if (momentum == 0) {
        for (ptrdiff_t i = 0; i < n; i++) p[i] -= lr * (g[i] + weight_decay * p[i]);
        return;
    }
    T damp = (T)1 - dampening;
    if (first_step) {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = g[i] + weight_decay * p[i];
            v[i] = d;
            p[i] -= lr * (nesterov ? d + momentum * d : d);
        }
    } else if (nesterov) {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = g[i] + weight_decay * p[i];
            T vi = momentum * v[i] + damp * d;
            v[i] = vi;
            p[i] -= lr * (d + momentum * vi);
        }
    } else {
        for (ptrdiff_t i = 0; i < n; i++) {
            T d = g[i] + weight_decay * p[i];
            T vi = momentum * v[i] + damp * d;
            v[i] = vi;
            p[i] -= lr * vi;
        }
    }
}

#undef K
