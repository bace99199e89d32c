/* dp_buffers_tmpl.h - bodies of the vector kernels in dp_buffers.h, for one dtype (a build
 * per ISA: dp_vec.h). Included by dp_buffers.c (and dp_vec_*.c) with T and S (_f32/_f64)
 * defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* Elements per chunk: ins[0..k) are added chunk by chunk so the running sum stays in L1. */
#define SUM_CHUNK 2048

void KV(dp_sum_buffers)(T *out, const T *const *ins, int k, ptrdiff_t start, ptrdiff_t stop,
                        T scale)
{
    // out[start:stop] = scale * (ins[0] + ins[1] + ... + ins[k-1])[start:stop], added left to
    // right in that order (so the result does not depend on how [start, stop) is sliced)
    for (ptrdiff_t c0 = start; c0 < stop; c0 += SUM_CHUNK) {
        ptrdiff_t c1 = stop - c0 < SUM_CHUNK ? stop : c0 + SUM_CHUNK;
        T acc[SUM_CHUNK];
        ptrdiff_t len = c1 - c0;
        if (k == 0) {
            for (ptrdiff_t i = 0; i < len; i++) acc[i] = 0;
        } else {
            const T *a = ins[0] + c0;
            for (ptrdiff_t i = 0; i < len; i++) acc[i] = a[i];
        }
        for (int q = 1; q < k; q++) {
            const T *a = ins[q] + c0;
            for (ptrdiff_t i = 0; i < len; i++) acc[i] += a[i];
        }
        T *o = out + c0;
        if (scale == 1)
            for (ptrdiff_t i = 0; i < len; i++) o[i] = acc[i];
        else
            for (ptrdiff_t i = 0; i < len; i++) o[i] = acc[i] * scale;
    }
}

double KV(dp_sum_squares)(const T *x, ptrdiff_t n)
{
    // sum of x^2 in double, lane j of DP_SQUARES_LANES taking i = j (mod lanes) in order,
    // the lanes added in order (dp_buffers.h): one order whatever the build
    double acc[DP_SQUARES_LANES] = {0};
    ptrdiff_t i = 0;
    for (; i + DP_SQUARES_LANES <= n; i += DP_SQUARES_LANES)
        for (int j = 0; j < DP_SQUARES_LANES; j++) {
            double v = (double)x[i + j];
            acc[j] += v * v;
        }
    for (int j = 0; i < n; i++, j++) {
        double v = (double)x[i];
        acc[j] += v * v;
    }
    double s = 0;
    for (int j = 0; j < DP_SQUARES_LANES; j++) s += acc[j];
    return s;
}

void KV(dp_scale)(T *buf, ptrdiff_t n, T alpha)
{
    for (ptrdiff_t i = 0; i < n; i++) buf[i] *= alpha;
}

/* ---- the layers' bias passes (dp_model) ---------------------------------------------- */

/* y (OC, n) = act(y + b[o] in row o). ReLU fused into the bias pass (a NaN stays NaN: v <= 0
 * is false for it); the others after it, in place. */
void KV(dp_bias_relu)(T *y, const T *b, int OC, int n)
{
    for (int o = 0; o < OC; o++) {
        T *DP_RESTRICT r = y + (ptrdiff_t)o * n, bo = b[o];
        for (int q = 0; q < n; q++) {
            T v = r[q] + bo;
            r[q] = v <= 0 ? (T)0 : v;
        }
    }
}

void KV(dp_bias_add)(T *y, const T *b, int OC, int n)
{
    for (int o = 0; o < OC; o++) {
        T *DP_RESTRICT r = y + (ptrdiff_t)o * n, bo = b[o];
        for (int q = 0; q < n; q++) r[q] += bo;
    }
}

/* db[o] += sum of row o of d (OC, n), in 8 interleaved partial sums (independent chains that
 * vectorize without reassociating the sum) */
void KV(dp_add_row_sums)(T *db, const T *d, int OC, int n)
{
    for (int o = 0; o < OC; o++) {
        const T *r = d + (ptrdiff_t)o * n;
        T a[8] = {0};
        int q = 0;
        for (; q + 8 <= n; q += 8)
            for (int k = 0; k < 8; k++) a[k] += r[q + k];
        T s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (; q < n; q++) s += r[q];
        db[o] += s;
    }
}

#ifndef DP_VEC_PASS
DP_BUFFERS_VEC(DP_VEC_DEFINE, T, S)
#endif

#undef SUM_CHUNK
#undef K
