/* dp_buffers_tmpl.h - bodies of the kernels in dp_buffers.h for one dtype.
 * Included by dp_buffers.c with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* Elements per chunk: ins[0..k) are added chunk by chunk so the running sum stays in L1. */
#define SUM_CHUNK 2048

DP_CLONES void K(dp_sum_buffers)(T *out, const T *const *ins, int k, ptrdiff_t start, ptrdiff_t stop,
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

DP_CLONES void K(dp_scale)(T *buf, ptrdiff_t n, T alpha)
{
    for (ptrdiff_t i = 0; i < n; i++) buf[i] *= alpha;
}

#undef K
