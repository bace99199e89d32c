/* dp_act_tmpl.h - bodies of the kernels in dp_act.h for one dtype.
 * Included by dp_act.c with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

DP_CLONES void K(dp_relu_forward)(T *y, const T *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) y[i] = x[i] <= 0 ? (T)0 : x[i];   /* NaN stays NaN */
}

DP_CLONES void K(dp_relu_backward)(T *dx, const T *dy, const T *y, ptrdiff_t n)
{
    // y is the forward output: relu'(x) = 1[x > 0] = 1[y > 0]
    for (ptrdiff_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? dy[i] : (T)0;
}

#undef K
