/* dp_act_tmpl.h - bodies of the kernels in dp_act.h for one dtype.
 * Included by dp_act.c with T, S (_f32/_f64) and the dtype's helpers defined: EXPNEG (exp of
 * x <= 0), GAUSS (exp(-a^2 / 2) for 0 <= a <= GELU_AMAX), PHI_TAIL_G (the Chebyshev series g
 * of dp_act.h at u = 2t - 1), TANH_NEAR0 (x P(x^2) / Q(x^2)), and libm's TANH_LIBM, EXP_LIBM,
 * ERFC_LIBM for the naive twins. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* Below this |x| tanh is the rational function (no cancellation in 1 - e); above it
 * e = exp(-2|x|) <= exp(-1.1) = 0.33, so 1 - e loses nothing. */
#define TANH_SPLIT ((T)0.55)
#define SQRT1_2 ((T)0.70710678118654752440)
#define INV_SQRT_2PI ((T)0.39894228040143267794)
/* Values of the MSE summed in T before the sum moves to double (8 partial sums of 32 each). */
#define MSE_BLOCK 256

void KV(dp_relu_forward)(T *y, const T *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) y[i] = x[i] <= 0 ? (T)0 : x[i]; /* NaN stays NaN */
}

void KV(dp_relu_backward)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    // y is the forward output: relu'(x) = 1[x > 0] = 1[y > 0]
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? dy[i] : (T)0;
}

void KV(dp_tanh_forward)(T *y, const T *x, ptrdiff_t n)
{
    // x, y are (n,); y may be x
    for (ptrdiff_t i = 0; i < n; i++) {
        T xi = x[i], ax = xi < 0 ? -xi : xi;
        T e = EXPNEG(-2 * ax); /* NaN stays NaN, -inf gives 0 */
        T far = (1 - e) / (1 + e);
        far = xi < 0 ? -far : far;
        y[i] = ax < TANH_SPLIT ? TANH_NEAR0(xi) : far;
    }
}

void KV(dp_tanh_backward)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    // y is the forward output: tanh'(x) = 1 - tanh(x)^2
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = dy[i] * (1 - y[i] * y[i]);
}

void KV(dp_sigmoid_forward)(T *y, const T *x, ptrdiff_t n)
{
    // x, y are (n,); y may be x
    for (ptrdiff_t i = 0; i < n; i++) {
        T xi = x[i];
        T e = EXPNEG(xi < 0 ? xi : -xi); /* exp(-|x|) in (0, 1] */
        T inv = 1 / (1 + e);
        y[i] = xi >= 0 ? inv : e * inv;
    }
}

void KV(dp_sigmoid_backward)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    // y is the forward output: sigmoid'(x) = y (1 - y)
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = dy[i] * (y[i] * (1 - y[i]));
}

/* Phi(x) for a finite |x| clamped to GELU_AMAX (beyond, exp(-x^2 / 2) is 0 in T anyway), and
 * *gauss = exp(-ax^2 / 2): Phi(-|x|) = 0.5 t exp(-x^2 / 2) g(t), t = 3 / (3 + |x| / sqrt 2). */
DP_INLINE T K(normal_cdf)(T xi, T *gauss)
{
    T ax = xi < 0 ? -xi : xi;
    ax = ax > GELU_AMAX ? GELU_AMAX : ax;
    T E = GAUSS(ax);
    T t = 3 / (3 + ax * SQRT1_2);
    T q = (T)0.5 * t * (E * PHI_TAIL_G(2 * t - 1));
    *gauss = E;
    return xi > 0 ? 1 - q : q;
}

void KV(dp_gelu_forward)(T *y, const T *x, ptrdiff_t n)
{
    // x, y are (n,); y may be x. GELU(x) = x Phi(x) (erf form)
    for (ptrdiff_t i = 0; i < n; i++) {
        T xi = x[i], E;
        T v = xi * K(normal_cdf)(xi, &E);
        y[i] = xi == xi ? v : xi; /* the clamp may have dropped a NaN */
    }
}

void KV(dp_gelu_backward)(T *dx, const T *dy, const T *x, ptrdiff_t n)
{
    // x is the forward INPUT: GELU'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
    for (ptrdiff_t i = 0; i < n; i++) {
        T xi = x[i], E;
        T p = K(normal_cdf)(xi, &E);
        T v = dy[i] * (p + xi * (E * INV_SQRT_2PI));
        dx[i] = xi == xi ? v : xi;
    }
}

/* sum of (y - t)^2 over n <= MSE_BLOCK values, in 8 interleaved partial sums (a vector) */
DP_INLINE T K(sq_diff_sum)(const T *y, const T *t, int n)
{
    T a[8] = {0};
    int q = 0;
    for (; q + 8 <= n; q += 8)
        for (int k = 0; k < 8; k++) {
            T d = y[q + k] - t[q + k];
            a[k] += d * d;
        }
    T s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; q < n; q++) s += (y[q] - t[q]) * (y[q] - t[q]);
    return s;
}

void KV(dp_mse)(T *dy, double *loss_sum, const T *y, const T *target, int B, int OUT, T grad_scale)
{
    // y, target, dy are (B, OUT): loss_sum = sum (y - t)^2, dy = 2 grad_scale (y - t) (dy may
    // be y or NULL)
    ptrdiff_t n = (ptrdiff_t)B * OUT;
    T g = 2 * grad_scale;
    double total = 0;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += MSE_BLOCK) {
        int len = n - c0 < MSE_BLOCK ? (int)(n - c0) : MSE_BLOCK;
        total += (double)K(sq_diff_sum)(y + c0, target + c0, len); /* before dy overwrites y */
        if (dy)
            for (int q = 0; q < len; q++) dy[c0 + q] = g * (y[c0 + q] - target[c0 + q]);
    }
    *loss_sum = total;
}

#ifndef DP_VEC_PASS
DP_ACT_VEC(DP_VEC_DEFINE, T, S)

/* ---- the naive twins: the definitions, on libm ------------------------------------------ */

void K(dp_tanh_forward_naive)(T *y, const T *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) y[i] = TANH_LIBM(x[i]);
}

void K(dp_tanh_backward_naive)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = dy[i] * (1 - y[i] * y[i]);
}

void K(dp_sigmoid_forward_naive)(T *y, const T *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) y[i] = 1 / (1 + EXP_LIBM(-x[i]));
}

void K(dp_sigmoid_backward_naive)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = dy[i] * y[i] * (1 - y[i]);
}

void K(dp_gelu_forward_naive)(T *y, const T *x, ptrdiff_t n)
{
    // x Phi(x), Phi(x) = 0.5 erfc(-x / sqrt 2) (= 0.5 (1 + erf(x / sqrt 2)), without the
    // cancellation of 1 + erf for x << 0)
    for (ptrdiff_t i = 0; i < n; i++) y[i] = x[i] * ((T)0.5 * ERFC_LIBM(-x[i] * SQRT1_2));
}

void K(dp_gelu_backward_naive)(T *dx, const T *dy, const T *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) {
        T p = (T)0.5 * ERFC_LIBM(-x[i] * SQRT1_2);
        T phi = EXP_LIBM(-x[i] * x[i] / 2) * INV_SQRT_2PI;
        dx[i] = dy[i] * (p + x[i] * phi);
    }
}

void K(dp_mse_naive)(T *dy, double *loss_sum, const T *y, const T *target, int B, int OUT,
                     T grad_scale)
{
    double total = 0;
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * OUT; i++) {
        T d = y[i] - target[i];
        total += (double)d * (double)d;
        if (dy) dy[i] = 2 * grad_scale * d;
    }
    *loss_sum = total;
}

#endif /* DP_VEC_PASS */

#undef MSE_BLOCK
#undef INV_SQRT_2PI
#undef SQRT1_2
#undef TANH_SPLIT
#undef K
