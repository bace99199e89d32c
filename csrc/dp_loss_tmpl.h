/* dp_loss_tmpl.h - bodies of the kernels in dp_loss.h for one dtype.
 * Included by dp_loss.c with T, TI, TBYTES, S (_f32/_f64), EXPNEG, LOG1P01, LOG defined. The
 * logistic kernel is the GEMM's two matrix-vector blocks (dp_gemm_gemv_tmpl.h) fused around
 * the sigmoid BCE. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

int KV(dp_softmax_xent)(T *dlogits, double *loss_sum, const T *logits, const int64_t *labels, int B,
                        int C, T grad_scale)
{
    // logits is (B, C); loss_i = logsumexp(z_i) - z_i[y_i], computed as
    // log(sum_j exp(z_ij - max_i)) + max_i - z_i[y_i] so that no exp overflows.
    for (int i = 0; i < B; i++) /* labels first: nothing is written on error */
        if (labels[i] < 0 || labels[i] >= C) return DP_ELABEL;
    double total = 0;
    for (int i = 0; i < B; i++) {
        const T *z = logits + (ptrdiff_t)i * C;
        int64_t y = labels[i];
        T mx = z[0], zy = z[y]; /* read before dlogits (which may be logits) is written */
        for (int j = 1; j < C; j++) mx = z[j] > mx ? z[j] : mx;
        T sum = 0;
        if (dlogits) {
            T *d = dlogits + (ptrdiff_t)i * C;
            for (int j = 0; j < C; j++) {
                d[j] = EXPNEG(z[j] - mx);
                sum += d[j];
            }
            /* (softmax - onehot) first, then the scale: scaling p and 1 apart gave inf - inf
             * = NaN at the label where grad_scale overflows T (e.g. 1e308 in float32), and
             * (p - 1) * grad_scale is -inf there */
            T inv = (T)1 / sum;
            for (int j = 0; j < C; j++) d[j] *= inv;
            d[y] -= (T)1;
            for (int j = 0; j < C; j++) d[j] *= grad_scale;
        } else {
            for (int j = 0; j < C; j++) sum += EXPNEG(z[j] - mx);
        }
        total += (double)LOG(sum) + (double)mx - (double)zy;
    }
    *loss_sum = total;
    return DP_OK;
}

/* Rows per block: a block's loss terms are summed in T, blocks in double. 32 rows: fewer
 * leave the per-block work exposed, more spill the block out of the registers and L1. */
#define LOSS_ROWS 32

static int K(check_binary_labels)(const int64_t *labels, int B)
{
    int bad = 0;
    for (int i = 0; i < B; i++) bad |= (uint64_t)labels[i] > 1;
    return bad ? DP_ELABEL : DP_OK;
}

#include "dp_gemm_gemv_tmpl.h" /* KVL, the vectors, block_gemv and block_gemv_t */

/* The sum of a[0 .. n): KVL-lane partial sums in two vectors, then their lanes. (A scalar
 * `sum += a[i]` in the vectorized loops was an in-order chain of scalar adds, 3-4 cycles a
 * row.) */
DP_INLINE T K(ksum)(const T *a, int n)
{
    K(kvec) s0 = {0}, s1 = {0};
    int i = 0;
    for (; i + 2 * KVL <= n; i += 2 * KVL) {
        s0 += K(kload)(a + i);
        s1 += K(kload)(a + i + KVL);
    }
    for (; i + KVL <= n; i += KVL) s0 += K(kload)(a + i);
    T lanes[KVL], r = 0;
    K(kstore)(lanes, s0 + s1);
    for (int q = 0; q < KVL; q++) r += lanes[q];
    for (; i < n; i++) r += a[i];
    return r;
}

/* Binary cross-entropy on a logit, without overflow, for a block of n <= LOSS_ROWS logits:
 * loss_i = softplus(z_i) - y_i z_i = max(z_i, 0) - y_i z_i + log1p(exp(-|z_i|)),
 * g_i = (sigmoid(z_i) - y_i) * grad_scale. Branch-free so that the loops vectorize.
 * Returns the block's loss sum; *right counts (z_i > 0) == y_i. n <= LOSS_ROWS; g has room
 * for LOSS_ROWS values (those past n are left undefined) and may be z.
 * Three loops (exp; the loss; the gradient) rather than one: one loop's chain of dependent
 * operations (exp, a division, log1p's division and series), ~100 cycles a vector, was more
 * than the out-of-order window overlaps across iterations; split, each chain is short enough.
 * The three loops run over LOSS_ROWS values, whatever n, the logits past n taken as 0 (their
 * results unused): a constant trip count vectorizes without the remainder loops, and a
 * logit's gradient has the same bits wherever it sits (a remainder loop rounded some
 * otherwise). */
DP_INLINE T K(bce_block)(T *g, int64_t *right, const T *z, const int64_t *DP_RESTRICT labels, int n,
                         T grad_scale)
{
    T y[LOSS_ROWS], e[LOSS_ROWS], lt[LOSS_ROWS], zz[LOSS_ROWS];
    int64_t ok = 0;
    for (int i = 0; i < n; i++) {
        y[i] = labels[i] ? (T)1 : (T)0;
        ok += (z[i] > 0) == (labels[i] != 0);
        zz[i] = z[i];
    }
    for (int i = n; i < LOSS_ROWS; i++) y[i] = 0, zz[i] = 0;
    for (int i = 0; i < LOSS_ROWS; i++) e[i] = EXPNEG(zz[i] < 0 ? zz[i] : -zz[i]); /* (0, 1] */
    for (int i = 0; i < LOSS_ROWS; i++)
        lt[i] = (zz[i] > 0 ? zz[i] : (T)0) - y[i] * zz[i] + LOG1P01(e[i]);
    for (int i = 0; i < LOSS_ROWS; i++) {
        T inv = (T)1 / ((T)1 + e[i]);
        T s = zz[i] >= 0 ? inv : e[i] * inv; /* sigmoid(z) */
        g[i] = (s - y[i]) * grad_scale;
    }
    *right = ok;
    return K(ksum)(lt, n);
}

int KV(dp_sigmoid_bce)(T *dlogits, double *loss_sum, const T *logits, const int64_t *labels, int B,
                       T grad_scale)
{
    // logits is (B,), labels in {0, 1}: loss_i = softplus(z_i) - y_i z_i, dz = sigmoid(z) - y
    if (K(check_binary_labels)(labels, B)) return DP_ELABEL;
    double total = 0;
    for (int r0 = 0; r0 < B; r0 += LOSS_ROWS) {
        int rows = B - r0 < LOSS_ROWS ? B - r0 : LOSS_ROWS;
        int64_t ok;
        T g[LOSS_ROWS]; /* bce_block writes LOSS_ROWS values, dlogits has rows left */
        total += (double)K(bce_block)(g, &ok, logits + r0, labels + r0, rows, grad_scale);
        if (dlogits) memcpy(dlogits + r0, g, sizeof(T) * (size_t)rows);
    }
    *loss_sum = total;
    return DP_OK;
}

/* How far ahead of the rows it reads the logistic kernel prefetches x: a block's arithmetic
 * (exp, log1p, the gradient) leaves the memory idle unless later blocks' rows are on their
 * way. Rows that the backward takes in one pass (KVL to 4 KVL values: logistic regression's
 * 20 float64 features) are prefetched from there, a few lines with each pair of rows,
 * LOGREG_PF_BYTES ahead; the others in a burst of KVL rows from the forward, GEMV_PF_ROWS
 * (dp_gemm_gemv_tmpl.h) ahead. A distance in bytes, 32 KB: the backward's prefetch was the
 * fastest of those tried at 32 KB, no better nearer and worse further; from the backward,
 * rows of several passes got slower as often as faster, so they keep the forward's burst.
 * Into L2 (DP_PF_LOCALITY, prefetcht2, dp_common.h), not L1: on AMD EPYCs prefetcht0 made
 * the stream slower than no prefetch at all, where an Intel Xeon showed no difference between
 * the localities. */
#define LOGREG_PF_BYTES 32768

/* dp_logistic_grad's blocks of rows, one_pass a constant once inlined: whether the backward
 * takes a row in one pass of gemv_t_vecs (KVL to 4 KVL values), and then prefetches x
 * (block_gemv_t's pf), or in several, and then the forward does. Two copies of the loop: in
 * one loop with both branches, rows of several passes ran slower than before the backward
 * prefetched. */
DP_INLINE void K(logistic_blocks)(T *dw, T *db, double *loss_sum, int64_t *correct, const T *x,
                                  const T *w, const T *b, const int64_t *labels, int B, int IN,
                                  T grad_scale, int one_pass)
{
    double total = 0;
    int64_t right = 0;
    T gsum = 0;
    const int pf_bytes = LOGREG_PF_BYTES / (IN * (int)sizeof(T));
    const int pf = pf_bytes > LOSS_ROWS ? pf_bytes : LOSS_ROWS;
    for (int r0 = 0; r0 < B; r0 += LOSS_ROWS) {
        int rows = B - r0 < LOSS_ROWS ? B - r0 : LOSS_ROWS;
        const T *xb = x + (ptrdiff_t)r0 * IN;
        T z[LOSS_ROWS], g[LOSS_ROWS];
        K(block_gemv)(z, xb, IN, w, b[0], rows, IN, !one_pass);
        int64_t ok;
        total += (double)K(bce_block)(g, &ok, z, labels + r0, rows, grad_scale);
        right += ok;
        gsum += K(ksum)(g, rows);
        K(block_gemv_t)(dw, g, xb, IN, rows, IN, one_pass ? pf : 0, B - r0);
    }
    db[0] += gsum;
    *loss_sum = total;
    *correct = right;
}

int KV(dp_logistic_grad)(T *dw, T *db, double *loss_sum, int64_t *correct, const T *x, const T *w,
                         const T *b, const int64_t *labels, int B, int IN, T grad_scale)
{
    // x is (B, IN), w is (1, IN), b is (1,): logistic regression's forward, loss and backward
    // in one pass over x: a block of rows is read from memory once for z = x w + b and then
    // again, from L1, for dw += g x. dw (IN,) and db (1,) accumulate.
#if defined(DP_VEC_PASS) && DP_VEC_BYTES == 64
    /* a row narrower than a 64-byte vector would go one value at a time here: the AVX2
     * build's 32-byte vectors take it (a CPU with AVX-512 has AVX2), about twice as fast
     * for float32 rows */
    if (IN < KVL && 2 * IN >= KVL)
        return DP_VEC_CAT(K(dp_logistic_grad), _avx2)(dw, db, loss_sum, correct, x, w, b, labels, B,
                                                      IN, grad_scale);
#endif
    if (K(check_binary_labels)(labels, B)) return DP_ELABEL;
    /* rows the backward takes in one pass prefetch from there, the others from the forward
     * (LOGREG_PF_BYTES); two copies of the loop, each with one of them */
    if (IN >= KVL && IN <= 4 * KVL)
        K(logistic_blocks)(dw, db, loss_sum, correct, x, w, b, labels, B, IN, grad_scale, 1);
    else
        K(logistic_blocks)(dw, db, loss_sum, correct, x, w, b, labels, B, IN, grad_scale, 0);
    return DP_OK;
}

#ifndef DP_VEC_PASS
DP_LOSS_VEC(DP_VEC_DEFINE, T, S)

/* Index of the row's maximum as NumPy's argmax picks it: the first maximum, and a NaN
 * counts as larger than any number (the first NaN wins). */
DP_INLINE int K(row_argmax)(const T *r, int C)
{
    int best = 0;
    for (int j = 1; j < C; j++) {
        if (r[best] != r[best]) break; /* a NaN is already the answer */
        if (r[j] > r[best] || r[j] != r[j]) best = j;
    }
    return best;
}

void K(dp_argmax)(int64_t *out, const T *x, int B, int C)
{
    // x is (B, C)
    for (int i = 0; i < B; i++) out[i] = K(row_argmax)(x + (ptrdiff_t)i * C, C);
}

int K(dp_count_correct)(int64_t *correct, const T *logits, const int64_t *labels, int B, int C)
{
    // logits is (B, C); C == 1 is a binary logit: predicted 1 when z > 0, labels in {0, 1}
    int64_t right = 0, classes = C == 1 ? 2 : C;
    for (int i = 0; i < B; i++) {
        const T *r = logits + (ptrdiff_t)i * C;
        if (labels[i] < 0 || labels[i] >= classes) return DP_ELABEL;
        int64_t pred = C == 1 ? r[0] > 0 : K(row_argmax)(r, C);
        right += pred == labels[i];
    }
    *correct = right;
    return DP_OK;
}

#undef KVL
#endif /* DP_VEC_PASS */

#undef K
