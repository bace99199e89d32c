/* dp_allreduce_tmpl.h - bodies of the all-reduce's vector kernels (dp_allreduce.h) for one
 * dtype (a build per ISA: dp_vec.h): the native slice reduction and the ring and tree
 * schedules. Included by dp_allreduce.c (and dp_vec_*.c) with T and S (_f32/_f64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

/* ---- native: one worker's slice ---------------------------------------------------------- */

/* Elements per chunk: the running sum stays in L1 while it is written to every buffer. */
#define REDUCE_CHUNK 1024

/* One pass per input and one per output, the scale folded into the writes. */
void KV(dp_allreduce_slice)(T *const *bufs, int k, ptrdiff_t lo, ptrdiff_t hi, T scale)
{
    T acc[REDUCE_CHUNK];
    for (ptrdiff_t c0 = lo; c0 < hi; c0 += REDUCE_CHUNK) {
        ptrdiff_t len = hi - c0 < REDUCE_CHUNK ? hi - c0 : REDUCE_CHUNK;
        const T *s0 = bufs[0] + c0;
        if (k == 1) {
            for (ptrdiff_t i = 0; i < len; i++) acc[i] = s0[i];
        } else {
            const T *s1 = bufs[1] + c0;
            for (ptrdiff_t i = 0; i < len; i++) acc[i] = s0[i] + s1[i];
        }
        for (int q = 2; q < k; q++) {
            const T *src = bufs[q] + c0;
            for (ptrdiff_t i = 0; i < len; i++) acc[i] += src[i];
        }
        for (int q = 0; q < k; q++) {
            T *dst = bufs[q] + c0;
            for (ptrdiff_t i = 0; i < len; i++) dst[i] = acc[i] * scale;
        }
    }
}

/* ---- the point-to-point schedules ---------------------------------------------------------- */
#define BARRIER_OR_RETURN()                         \
    do {                                            \
        int rc_ = dp_barrier_wait(b, policy, code); \
        if (rc_) return rc_;                        \
    } while (0)

int KV(dp_allreduce_ring)(T *const *bufs, int n, int rank, ptrdiff_t start, ptrdiff_t stop, T scale,
                          dp_barrier *b, const dp_wait_policy *policy, uint32_t *code)
{
    T *mine = bufs[rank];
    if (n == 1) {
        if (scale != (T)1)
            for (ptrdiff_t i = start; i < stop; i++) mine[i] *= scale;
        return DP_OK;
    }
    const T *left = bufs[(rank + n - 1) % n];
    ptrdiff_t lo, hi;
    /* reduce-scatter: step s adds the left worker's running sum of part (rank - s - 1),
     * and after n - 1 steps this worker holds the full (scaled) sum of part rank + 1 */
    for (int s = 0; s < n - 1; s++) {
        dp_slice(start, stop, ((rank - s - 1) % n + n) % n, n, (int)sizeof(T), &lo, &hi);
        if (s < n - 2)
            for (ptrdiff_t i = lo; i < hi; i++) mine[i] += left[i];
        else
            for (ptrdiff_t i = lo; i < hi; i++) mine[i] = (mine[i] + left[i]) * scale;
        BARRIER_OR_RETURN();
    }
    /* all-gather: step s copies the finished part (rank - s) from the left worker */
    for (int s = 0; s < n - 1; s++) {
        dp_slice(start, stop, ((rank - s) % n + n) % n, n, (int)sizeof(T), &lo, &hi);
        memcpy(mine + lo, left + lo, (size_t)(hi - lo) * sizeof(T));
        BARRIER_OR_RETURN();
    }
    return DP_OK;
}

int KV(dp_allreduce_tree)(T *const *bufs, T *tmp, int n, int rank, ptrdiff_t start, ptrdiff_t stop,
                          T scale, dp_barrier *b, const dp_wait_policy *policy, uint32_t *code)
{
    T *mine = bufs[rank] + start;
    ptrdiff_t len = stop - start;
    int pof2 = 1;
    while (pof2 * 2 <= n) pof2 *= 2;
    int extra = n - pof2;
    if (n == 1) {
        if (scale != (T)1)
            for (ptrdiff_t i = 0; i < len; i++) mine[i] *= scale;
        return DP_OK;
    }
    if (extra) { /* fold: worker pof2 + r hands its buffer to worker r */
        if (rank < extra) {
            const T *other = bufs[rank + pof2] + start;
            for (ptrdiff_t i = 0; i < len; i++) mine[i] += other[i];
        }
        BARRIER_OR_RETURN();
    }
    for (int mask = 1; mask < pof2; mask <<= 1) {
        /* sum into scratch first: the partner still reads this buffer in this round */
        if (rank < pof2) {
            const T *other = bufs[rank ^ mask] + start;
            for (ptrdiff_t i = 0; i < len; i++) tmp[i] = mine[i] + other[i];
        }
        BARRIER_OR_RETURN();
        if (rank < pof2) {
            if (mask * 2 < pof2) {
                if (len > 0) memcpy(mine, tmp, (size_t)len * sizeof(T)); /* tmp: NULL at 0 */
            } else
                for (ptrdiff_t i = 0; i < len; i++) mine[i] = tmp[i] * scale;
        }
        BARRIER_OR_RETURN();
    }
    if (extra) { /* unfold: the extra workers copy the result back */
        if (rank >= pof2 && len > 0)
            memcpy(mine, bufs[rank - pof2] + start, (size_t)len * sizeof(T));
        BARRIER_OR_RETURN();
    }
    return DP_OK;
}

#ifndef DP_VEC_PASS
DP_ALLREDUCE_VEC(DP_VEC_DEFINE, T, S)
#endif

#undef BARRIER_OR_RETURN
#undef REDUCE_CHUNK
#undef K
