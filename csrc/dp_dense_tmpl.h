/* dp_dense_tmpl.h - bodies of the kernels in dp_dense.h for one dtype.
 * Included by dp_dense.c with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

int K(dp_dense_forward)(dp_ctx *ctx, T *y, const T *x, const T *w, const T *b, int B, int IN,
                        int OUT)
{
    // x is (B, IN), w is (OUT, IN), b is (OUT,), y is (B, OUT):  y = x w^T + b
    for (int i = 0; i < B; i++) memcpy(y + (ptrdiff_t)i * OUT, b, sizeof(T) * (size_t)OUT);
    return K(dp_gemm)(ctx, y, OUT, x, IN, 1, w, 1, IN, B, OUT, IN, (T)1, (T)1);
}

int K(dp_dense_backward)(dp_ctx *ctx, T *dw, T *db, T *dx, const T *dy, const T *x, const T *w,
                         int B, int IN, int OUT)
{
    // dy is (B, OUT), x is (B, IN), w is (OUT, IN): dw += dy^T x, db += sum_rows dy, dx = dy w
    int rc = K(dp_gemm)(ctx, dw, IN, dy, 1, OUT, x, IN, 1, OUT, IN, B, (T)1, (T)1);
    if (rc) return rc;
    for (int i = 0; i < B; i++) {
        const T *r = dy + (ptrdiff_t)i * OUT;
        for (int o = 0; o < OUT; o++) db[o] += r[o];
    }
    if (dx) rc = K(dp_gemm)(ctx, dx, IN, dy, OUT, 1, w, IN, 1, B, IN, OUT, (T)1, (T)0);
    return rc;
}

#undef K
