/* dp_loss_tmpl.h - bodies of the kernels in dp_loss.h for one dtype.
 * Included by dp_loss.c with T, S (_f32/_f64), EXPNEG, LOG1P01, LOG defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

int KV(dp_softmax_xent)(T *dlogits, double *loss_sum, const T *logits, const int64_t *labels,
                       int B, int C, T grad_scale)
{
    // logits is (B, C); loss_i = logsumexp(z_i) - z_i[y_i], computed as
    // log(sum_j exp(z_ij - max_i)) + max_i - z_i[y_i] so that no exp overflows.
    for (int i = 0; i < B; i++)            /* labels first: nothing is written on error */
        if (labels[i] < 0 || labels[i] >= C) return DP_ELABEL;
    double total = 0;
    for (int i = 0; i < B; i++) {
        const T *z = logits + (ptrdiff_t)i * C;
        int64_t y = labels[i];
        T mx = z[0], zy = z[y];       /* read before dlogits (which may be logits) is written */
        for (int j = 1; j < C; j++) mx = z[j] > mx ? z[j] : mx;
        T sum = 0;
        if (dlogits) {
            T *d = dlogits + (ptrdiff_t)i * C;
            for (int j = 0; j < C; j++) { d[j] = EXPNEG(z[j] - mx); sum += d[j]; }
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

/* Rows per block: a block's loss terms are summed in T, blocks in double. 32 rows measured
 * best for logistic regression on 1M x 20 (8 and 128 are 10-40% slower). */
#define LOSS_ROWS 32

/* Binary cross-entropy on a logit, without overflow, for a block of n <= LOSS_ROWS logits:
 * loss_i = softplus(z_i) - y_i z_i = max(z_i, 0) - y_i z_i + log1p(exp(-|z_i|)),
 * g_i = (sigmoid(z_i) - y_i) * grad_scale. Branch-free so that the loop vectorizes.
 * Returns the block's loss sum; *right counts (z_i > 0) == y_i. n <= LOSS_ROWS. */
DP_INLINE T K(bce_block)(T *g, int64_t *right, const T *z,
                         const int64_t *DP_RESTRICT labels, int n, T grad_scale)
{
    T y[LOSS_ROWS], lsum = 0;
    int64_t ok = 0;
    for (int i = 0; i < n; i++) {
        y[i] = labels[i] ? (T)1 : (T)0;
        ok += (z[i] > 0) == (labels[i] != 0);
    }
    for (int i = 0; i < n; i++) {
        T zi = z[i];
        T e = EXPNEG(zi < 0 ? zi : -zi);            /* exp(-|z|) in (0, 1] */
        T inv = (T)1 / ((T)1 + e);
        T s = zi >= 0 ? inv : e * inv;              /* sigmoid(z) */
        lsum += (zi > 0 ? zi : (T)0) - y[i] * zi + LOG1P01(e);
        g[i] = (s - y[i]) * grad_scale;
    }
    *right = ok;
    return lsum;
}

static int K(check_binary_labels)(const int64_t *labels, int B)
{
    int bad = 0;
    for (int i = 0; i < B; i++) bad |= (uint64_t)labels[i] > 1;
    return bad ? DP_ELABEL : DP_OK;
}

int KV(dp_sigmoid_bce)(T *dlogits, double *loss_sum, const T *logits, const int64_t *labels,
                      int B, T grad_scale)
{
    // logits is (B,), labels in {0, 1}: loss_i = softplus(z_i) - y_i z_i, dz = sigmoid(z) - y
    if (K(check_binary_labels)(labels, B)) return DP_ELABEL;
    double total = 0;
    for (int r0 = 0; r0 < B; r0 += LOSS_ROWS) {
        int rows = B - r0 < LOSS_ROWS ? B - r0 : LOSS_ROWS;
        int64_t ok;
        T scratch[LOSS_ROWS];
        total += (double)K(bce_block)(dlogits ? dlogits + r0 : scratch, &ok, logits + r0,
                                      labels + r0, rows, grad_scale);
    }
    *loss_sum = total;
    return DP_OK;
}

/* Vectors of the build's width (DP_VEC_BYTES: 16 generic, 32 AVX2, 64 AVX-512) for the
 * hand-vectorized loops below: GCC cannot vectorize a float sum without reassociating it, so
 * the dot products keep explicit vector partial sums. (32-byte vectors in the generic build
 * were split through memory: logistic regression's kernel ran 4.7x slower than in the AVX2
 * build, 439 against 93 us per 8192 x 20 float64 batch; at 16 bytes 2.7x, 320 against 117.) */
#define KVL (DP_VEC_BYTES / TBYTES)   /* TBYTES: sizeof(T), as a preprocessor number */
typedef T K(kvec) __attribute__((vector_size(DP_VEC_BYTES)));

DP_INLINE K(kvec) K(kload)(const T *p)
{
    K(kvec) v;
    memcpy(&v, p, sizeof v);
    return v;
}

DP_INLINE void K(kstore)(T *p, K(kvec) v) { memcpy(p, &v, sizeof v); }

/* The sum of lanes 2i and 2i + 1 of (a, b) in lane i: applied log2(KVL) times to KVL vectors,
 * pairwise, it leaves one vector whose lane q is the sum of the lanes of vector q. */
#if KVL == 2
#define K_EVEN 0, 2
#define K_ODD 1, 3
#elif KVL == 4
#define K_EVEN 0, 2, 4, 6
#define K_ODD 1, 3, 5, 7
#elif KVL == 8
#define K_EVEN 0, 2, 4, 6, 8, 10, 12, 14
#define K_ODD 1, 3, 5, 7, 9, 11, 13, 15
#elif KVL == 16
#define K_EVEN 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define K_ODD 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#else
#error "the fused logistic kernel's vectors hold 2, 4, 8 or 16 lanes"
#endif
typedef TI K(kmask) __attribute__((vector_size(DP_VEC_BYTES)));

DP_INLINE K(kvec) K(pairsum)(K(kvec) a, K(kvec) b)
{
    return DP_SHUFFLE(K(kmask), a, b, K_EVEN) + DP_SHUFFLE(K(kmask), a, b, K_ODD);
}

/* Rows ahead of the current one that the forward prefetches: a block's arithmetic (exp,
 * log1p, the gradient) leaves the memory idle unless the next blocks' rows are on their way.
 * Measured on the AVX2 VM (1M x 20 float64, batch 8192): 0 rows 6.8 GB/s, 32 7.9, 64 8.3,
 * 128 7.1 (medians of 7 interleaved repeats). */
#define LOGREG_PF_ROWS 64

/* z[r] = b + x_r . w for the rows of one block: KVL rows at a time, each into its own vector
 * of partial sums, reduced together (pairsum) rather than one horizontal sum per row; the
 * last IN % KVL columns, and the last rows % KVL rows, one value at a time. */
DP_INLINE void K(block_gemv)(T *DP_RESTRICT z, const T *DP_RESTRICT xb, const T *DP_RESTRICT w,
                             T b, int rows, int IN)
{
    int r = 0;
    for (; r + KVL <= rows; r += KVL) {
        const T *x0 = xb + (ptrdiff_t)r * IN;
        const char *pf = (const char *)(x0 + (ptrdiff_t)LOGREG_PF_ROWS * IN);
        for (int o = 0; o < KVL * IN * (int)sizeof(T); o += 64) __builtin_prefetch(pf + o, 0, 3);
        K(kvec) acc[KVL];
        for (int q = 0; q < KVL; q++) acc[q] = (K(kvec)){0};
        int j = 0;
        for (; j + KVL <= IN; j += KVL) {
            K(kvec) wj = K(kload)(w + j);
            for (int q = 0; q < KVL; q++) acc[q] += K(kload)(x0 + (ptrdiff_t)q * IN + j) * wj;
        }
        for (int n = KVL; n > 1; n /= 2)
            for (int i = 0; i < n / 2; i++) acc[i] = K(pairsum)(acc[2 * i], acc[2 * i + 1]);
        T sums[KVL];
        K(kstore)(sums, acc[0]);
        for (int q = 0; q < KVL; q++) {
            T s = b + sums[q];
            for (int jj = j; jj < IN; jj++) s += x0[(ptrdiff_t)q * IN + jj] * w[jj];
            z[r + q] = s;
        }
    }
    for (; r < rows; r++) {
        const T *xr = xb + (ptrdiff_t)r * IN;
        T s = b;
        for (int j = 0; j < IN; j++) s += xr[j] * w[j];
        z[r] = s;
    }
}

/* dw += sum_r g[r] x_r over the rows of one block, with dw held in registers four vectors at
 * a time while the rows stream by (instead of a load/store of dw per row). Each dw vector
 * gathers two (four, for the last vectors) sums over alternate rows, added at the end: one
 * sum over all rows is a chain of dependent FMAs, which ran at the FMA's latency (the
 * profile's hottest instruction, 5 cycles a row). */
DP_INLINE void K(block_gemv_t)(T *DP_RESTRICT dw, const T *DP_RESTRICT g, const T *DP_RESTRICT xb,
                               int rows, int IN)
{
    typedef K(kvec) V;
    int j = 0;
    for (; j + 4 * KVL <= IN; j += 4 * KVL) {
        V a0 = K(kload)(dw + j), a1 = K(kload)(dw + j + KVL);
        V a2 = K(kload)(dw + j + 2 * KVL), a3 = K(kload)(dw + j + 3 * KVL);
        V b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        int r = 0;
        for (; r + 2 <= rows; r += 2) {
            const T *xr = xb + (ptrdiff_t)r * IN + j, *xs = xr + IN;
            T gr = g[r], gs = g[r + 1];
            a0 += K(kload)(xr) * gr;
            a1 += K(kload)(xr + KVL) * gr;
            a2 += K(kload)(xr + 2 * KVL) * gr;
            a3 += K(kload)(xr + 3 * KVL) * gr;
            b0 += K(kload)(xs) * gs;
            b1 += K(kload)(xs + KVL) * gs;
            b2 += K(kload)(xs + 2 * KVL) * gs;
            b3 += K(kload)(xs + 3 * KVL) * gs;
        }
        if (r < rows) {
            const T *xr = xb + (ptrdiff_t)r * IN + j;
            a0 += K(kload)(xr) * g[r];
            a1 += K(kload)(xr + KVL) * g[r];
            a2 += K(kload)(xr + 2 * KVL) * g[r];
            a3 += K(kload)(xr + 3 * KVL) * g[r];
        }
        K(kstore)(dw + j, a0 + b0);
        K(kstore)(dw + j + KVL, a1 + b1);
        K(kstore)(dw + j + 2 * KVL, a2 + b2);
        K(kstore)(dw + j + 3 * KVL, a3 + b3);
    }
    for (; j + KVL <= IN; j += KVL) {
        V a[4] = {K(kload)(dw + j), {0}, {0}, {0}};
        int r = 0;
        for (; r + 4 <= rows; r += 4)
            for (int q = 0; q < 4; q++) a[q] += K(kload)(xb + (ptrdiff_t)(r + q) * IN + j) * g[r + q];
        for (; r < rows; r++) a[0] += K(kload)(xb + (ptrdiff_t)r * IN + j) * g[r];
        K(kstore)(dw + j, (a[0] + a[1]) + (a[2] + a[3]));
    }
    for (; j < IN; j++) {
        T a = dw[j];
        for (int r = 0; r < rows; r++) a += xb[(ptrdiff_t)r * IN + j] * g[r];
        dw[j] = a;
    }
}

int KV(dp_logistic_grad)(T *dw, T *db, double *loss_sum, int64_t *correct, const T *x,
                                  const T *w, const T *b, const int64_t *labels, int B, int IN,
                                  T grad_scale)
{
    // x is (B, IN), w is (1, IN), b is (1,): logistic regression's forward, loss and backward
    // in one pass over x: a block of rows is read from memory once for z = x w + b and then
    // again, from L1, for dw += g x. dw (IN,) and db (1,) accumulate.
    if (K(check_binary_labels)(labels, B)) return DP_ELABEL;
    double total = 0;
    int64_t right = 0;
    T gsum = 0;
    for (int r0 = 0; r0 < B; r0 += LOSS_ROWS) {
        int rows = B - r0 < LOSS_ROWS ? B - r0 : LOSS_ROWS;
        const T *xb = x + (ptrdiff_t)r0 * IN;
        T z[LOSS_ROWS], g[LOSS_ROWS];
        K(block_gemv)(z, xb, w, b[0], rows, IN);
        int64_t ok;
        total += (double)K(bce_block)(g, &ok, z, labels + r0, rows, grad_scale);
        right += ok;
        for (int r = 0; r < rows; r++) gsum += g[r];
        K(block_gemv_t)(dw, g, xb, rows, IN);
    }
    db[0] += gsum;
    *loss_sum = total;
    *correct = right;
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
        if (r[best] != r[best]) break;                 /* a NaN is already the answer */
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
#undef K_EVEN
#undef K_ODD

#undef K
