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

static int K(check_binary_labels)(const int64_t *labels, int B)
{
    int bad = 0;
    for (int i = 0; i < B; i++) bad |= (uint64_t)labels[i] > 1;
    return bad ? DP_ELABEL : DP_OK;
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

/* Half vectors, for a row's last columns when they fill at most half a vector (block_gemv_t);
 * not in the generic build, whose 16-byte vectors would halve to one float64 */
#if DP_VEC_BYTES >= 32
#define K_HALF 1
#else
#define K_HALF 0
#endif
typedef T K(hvec) __attribute__((vector_size(DP_VEC_BYTES / 2)));

DP_INLINE K(hvec) K(hload)(const T *p)
{
    K(hvec) v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The row sums of KVL vectors of partial sums, as one vector (lane q: the sum of the lanes of
 * row q's vector), by log2(KVL) levels of folds: a fold of (a, b) with half-width h adds the
 * two halves of each 2h-lane group of a, and of b, and puts a's h sums then b's in the group.
 * The first level (h = KVL / 2) crosses the 128-bit lanes, the last ones (h <= 2 for 32-bit
 * lanes, 1 for 64) stay within them, which x86 shuffles do in one cycle: an even/odd split at
 * every level (vpermpd each time) had the forward's reduction as the hottest code of the
 * logistic kernel. The lanes come out bit-reversed, so acc[k] holds row K_ROWS[k]. */
#if KVL == 2
#define K_ROWS 0, 1
#define K_LO1 0, 2
#define K_HI1 1, 3
#elif KVL == 4
#define K_ROWS 0, 2, 1, 3
#define K_LO1 0, 1, 4, 5
#define K_HI1 2, 3, 6, 7
#define K_LO2 0, 4, 2, 6
#define K_HI2 1, 5, 3, 7
#elif KVL == 8
#define K_ROWS 0, 4, 2, 6, 1, 5, 3, 7
#define K_LO1 0, 1, 2, 3, 8, 9, 10, 11
#define K_HI1 4, 5, 6, 7, 12, 13, 14, 15
#define K_LO2 0, 1, 8, 9, 4, 5, 12, 13
#define K_HI2 2, 3, 10, 11, 6, 7, 14, 15
#define K_LO3 0, 8, 2, 10, 4, 12, 6, 14
#define K_HI3 1, 9, 3, 11, 5, 13, 7, 15
#elif KVL == 16
#define K_ROWS 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15
#define K_LO1 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define K_HI1 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define K_LO2 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define K_HI2 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define K_LO3 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define K_HI3 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define K_LO4 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define K_HI4 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#else
#error "the fused logistic kernel's vectors hold 2, 4, 8 or 16 lanes"
#endif
typedef TI K(kmask) __attribute__((vector_size(DP_VEC_BYTES)));

#define K_FOLD(lo, hi) DP_SHUFFLE(K(kmask), a, b, lo) + DP_SHUFFLE(K(kmask), a, b, hi)
DP_INLINE K(kvec) K(fold1)(K(kvec) a, K(kvec) b) { return K_FOLD(K_LO1, K_HI1); }
#if KVL >= 4
DP_INLINE K(kvec) K(fold2)(K(kvec) a, K(kvec) b) { return K_FOLD(K_LO2, K_HI2); }
#endif
#if KVL >= 8
DP_INLINE K(kvec) K(fold3)(K(kvec) a, K(kvec) b) { return K_FOLD(K_LO3, K_HI3); }
#endif
#if KVL >= 16
DP_INLINE K(kvec) K(fold4)(K(kvec) a, K(kvec) b) { return K_FOLD(K_LO4, K_HI4); }
#endif
#undef K_FOLD

DP_INLINE K(kvec) K(rowsums)(K(kvec) *acc)
{
    for (int i = 0; i < KVL / 2; i++) acc[i] = K(fold1)(acc[2 * i], acc[2 * i + 1]);
#if KVL >= 4
    for (int i = 0; i < KVL / 4; i++) acc[i] = K(fold2)(acc[2 * i], acc[2 * i + 1]);
#endif
#if KVL >= 8
    for (int i = 0; i < KVL / 8; i++) acc[i] = K(fold3)(acc[2 * i], acc[2 * i + 1]);
#endif
#if KVL >= 16
    acc[0] = K(fold4)(acc[0], acc[1]);
#endif
    return acc[0];
}

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
 * than the out-of-order window overlaps across iterations; split, each chain is short enough
 * (the logistic kernel on the AVX2 VM, 8192 x 20 float64 in cache: 9.0 ns a row as one loop,
 * 8.3 split). The three loops run over LOSS_ROWS values, whatever n, the logits past n taken
 * as 0 (their results unused): a constant trip count vectorizes without the remainder loops
 * (AMD EPYC Zen 4, AVX-512, the kernel called from C on 512 x 20 float64 rows in L2, 5
 * interleaved runs: 6.2-6.6 -> 5.9-6.3 ns a row), and a logit's gradient has the same bits
 * wherever it sits (a remainder loop rounded some otherwise). */
DP_INLINE T K(bce_block)(T *g, int64_t *right, const T *z,
                         const int64_t *DP_RESTRICT labels, int n, T grad_scale)
{
    T y[LOSS_ROWS], e[LOSS_ROWS], lt[LOSS_ROWS], zz[LOSS_ROWS];
    int64_t ok = 0;
    for (int i = 0; i < n; i++) {
        y[i] = labels[i] ? (T)1 : (T)0;
        ok += (z[i] > 0) == (labels[i] != 0);
        zz[i] = z[i];
    }
    for (int i = n; i < LOSS_ROWS; i++) y[i] = 0, zz[i] = 0;
    for (int i = 0; i < LOSS_ROWS; i++) e[i] = EXPNEG(zz[i] < 0 ? zz[i] : -zz[i]);  /* (0, 1] */
    for (int i = 0; i < LOSS_ROWS; i++)
        lt[i] = (zz[i] > 0 ? zz[i] : (T)0) - y[i] * zz[i] + LOG1P01(e[i]);
    for (int i = 0; i < LOSS_ROWS; i++) {
        T inv = (T)1 / ((T)1 + e[i]);
        T s = zz[i] >= 0 ? inv : e[i] * inv;                            /* sigmoid(z) */
        g[i] = (s - y[i]) * grad_scale;
    }
    *right = ok;
    return K(ksum)(lt, n);
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
        T g[LOSS_ROWS];      /* bce_block writes LOSS_ROWS values, dlogits has rows left */
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
 * LOGREG_PF_BYTES ahead; the others in a burst of KVL rows from the forward, LOGREG_PF_ROWS
 * ahead. AMD EPYC (Zen 5), the kernel called from C on x at 16 mod 64 (as NumPy's are) with
 * huge pages, 1M x 20 float64, batch 8192, ns a row streaming x (medians of 9, 3 runs): the
 * forward's burst 64 rows ahead 11.6-11.9, no prefetch 13.6-15.0, the same burst after the
 * loss 8.6-9.2, from the backward 128 to 384 rows ahead 8.0-8.6 (so a distance in bytes:
 * 32 KB; 8 and 16 KB no better, 64 and 128 KB worse). Other one-pass widths, as built here
 * (2-5 runs): float64 IN = 16 8.4-8.8 -> 7.8, 20 9.9-10.9 -> 8.5-10.3, 32 16.3-17.6 ->
 * 15.2-17.9 (mixed); float32 IN = 32 8.2-8.5 -> 7.7, 64 19.8-20.3 -> 12.7-14.3; slower:
 * float32 IN = 20 5.5-7.2 -> 6.2-7.9 (in L1 the same, 4.7). From the backward, rows of
 * several passes got slower as often as faster (float64 IN = 64 34 -> 37, 100 53 -> 57, 200
 * 114 -> 102; 35 % slower at IN = 64 on AVX2), so they keep the forward's burst. Into L2
 * (DP_PF_LOCALITY, prefetcht2, dp_common.h), not L1: on that EPYC prefetcht0 made the
 * stream slower than no prefetch at all (bench_logreg 0.124-0.202 s against 0.083-0.088 with
 * prefetcht2, 3 interleaved runs; on Zen 4, session 13: 13.6-22.5 ns a row against 7.4-9.4
 * at 4-32 KB ahead); the Intel Xeon of session 7 showed no difference between the three
 * localities. */
#define LOGREG_PF_BYTES 32768
#define LOGREG_PF_ROWS 64

/* v with the lanes where m is 0 cleared (bitwise: a cleared lane is +0 whatever v held) */
DP_INLINE K(kvec) K(kand)(K(kvec) v, K(kmask) m)
{
    K(kmask) bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= m;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* z[r] = b + x_r . w for the rows of one block: KVL rows at a time, each into its own vector
 * of partial sums, reduced together (rowsums) rather than one horizontal sum per row. The
 * last IN % KVL columns: a vector load of the row's last KVL columns with the lanes already
 * summed cleared, in x and in w (so that 0 * inf makes no NaN). The last rows % KVL rows go
 * through the same vector code (their group repeats its last row), so that every row's sum
 * is taken in the same order wherever the row sits in x (a prediction must not depend on the
 * order of the samples: scikit-learn's check_methods_sample_order_invariance); one value at
 * a time only when IN < KVL, for every row. (The scalar loop over the last columns cost
 * more than the vectors: IN = 20 leaves 4 columns with 8 lanes, AVX-512's float64.)
 * prefetch: the logistic kernel's for rows that its backward takes in more than one pass,
 * LOGREG_PF_ROWS ahead. The GEMM's matrix-vector product goes without: it has no arithmetic
 * for the memory to overlap, the hardware prefetcher follows its KVL streams, and the
 * prefetches took load slots (AVX2 VM, float64, X v, the kernel called directly, medians of
 * 5 interleaved runs: 64x520 in L2 6.3 -> 2.8 us, 8192x64 in L3 113 -> 65 us). */
DP_INLINE void K(block_gemv)(T *DP_RESTRICT z, const T *DP_RESTRICT xb, ptrdiff_t ldx,
                             const T *DP_RESTRICT w, T b, int rows, int IN, int prefetch)
{
    const int jv = IN / KVL * KVL, jt = IN - KVL, tail = jv < IN && IN >= KVL;
    K(kmask) keep = {0};
    K(kvec) wt = {0};
    if (tail) {
        for (int l = 0; l < KVL; l++) keep[l] = jt + l >= jv ? -1 : 0;
        wt = K(kand)(K(kload)(w + jt), keep);
    }
    int r = 0;
    for (; r < rows && IN >= KVL; r += KVL) {
        const T *x0 = xb + (ptrdiff_t)r * ldx;
        if (prefetch) {
            const char *pf = (const char *)(x0 + (ptrdiff_t)LOGREG_PF_ROWS * ldx);
            for (int o = 0; o < KVL * IN * (int)sizeof(T); o += 64)
                __builtin_prefetch(pf + o, 0, DP_PF_LOCALITY);
        }
        static const int row[KVL] = {K_ROWS};
        /* a last group of fewer than KVL rows repeats its last row in the lanes it lacks;
         * every group reads its rows through these pointers, so that one loop computes them
         * all (written with row indices, GCC's -O3 build of the AVX2 float kernel summed the
         * last group's rows in another order than the full groups') */
        const int nr = rows - r < KVL ? rows - r : KVL;
        const T *p[KVL];
        for (int q = 0; q < KVL; q++) p[q] = x0 + (ptrdiff_t)(row[q] < nr ? row[q] : nr - 1) * ldx;
        K(kvec) acc[KVL];
        for (int q = 0; q < KVL; q++) acc[q] = (K(kvec)){0};
        for (int j = 0; j < jv; j += KVL) {
            K(kvec) wj = K(kload)(w + j);
            for (int q = 0; q < KVL; q++) acc[q] += K(kload)(p[q] + j) * wj;
        }
        if (tail)
            for (int q = 0; q < KVL; q++) acc[q] += K(kand)(K(kload)(p[q] + jt), keep) * wt;
        K(kvec) sums = K(rowsums)(acc) + b;
        if (nr == KVL) {
            K(kstore)(z + r, sums);
        } else {
            T lanes[KVL];
            K(kstore)(lanes, sums);
            memcpy(z + r, lanes, sizeof(T) * (size_t)nr);
        }
    }
    for (; r < rows; r++) {     /* IN < KVL */
        const T *xr = xb + (ptrdiff_t)r * ldx;
        T s = b;
        for (int j = 0; j < IN; j++) s += xr[j] * w[j];
        z[r] = s;
    }
}

/* The sums of block_gemv_t for nv (a constant once inlined, 0 to 4) vectors of columns
 * starting at col[v]: out[v] = (dw's columns + the even rows' g[r] x_r) + the odd rows', the
 * two sums of each vector gathered side by side while the rows stream by. Every path of X^T v
 * sums a column in this order (block_gemv_t_rows too), so its bits do not depend on where it
 * sits. pf > 0 (the logistic kernel, whose rows are contiguous, ldx values each, and taken
 * in one pass): with each pair of rows, the pair pf rows further is prefetched, while it lies
 * within the pf_rows rows from xb. hout (non-NULL): the same sums for the half vector of
 * columns from hcol, into *hout. */
DP_INLINE void K(gemv_t_vecs)(K(kvec) *out, const T *DP_RESTRICT dw, const T *DP_RESTRICT g,
                              const T *DP_RESTRICT xb, ptrdiff_t ldx, int rows, const int *col,
                              int nv, int pf, int pf_rows, K(hvec) *hout, int hcol)
{
    typedef K(kvec) V;
    typedef K(hvec) H;
    V a[4], b[4];
    H ha = {0}, hb = {0};
    if (hout) ha = K(hload)(dw + hcol);
    for (int v = 0; v < nv; v++) a[v] = K(kload)(dw + col[v]), b[v] = (V){0};
    int r = 0;
    for (; r + 2 <= rows; r += 2) {
        const T *xr = xb + (ptrdiff_t)r * ldx, *xs = xr + ldx;
        T gr = g[r], gs = g[r + 1];
        if (pf > 0 && r + pf + 1 < pf_rows)
            dp_prefetch_range(xr + (ptrdiff_t)pf * ldx, 2 * sizeof(T) * (size_t)ldx);
        for (int v = 0; v < nv; v++) {
            a[v] += K(kload)(xr + col[v]) * gr;
            b[v] += K(kload)(xs + col[v]) * gs;
        }
        if (hout) {
            ha += K(hload)(xr + hcol) * gr;
            hb += K(hload)(xs + hcol) * gs;
        }
    }
    if (r < rows) {
        for (int v = 0; v < nv; v++) a[v] += K(kload)(xb + (ptrdiff_t)r * ldx + col[v]) * g[r];
        if (hout) ha += K(hload)(xb + (ptrdiff_t)r * ldx + hcol) * g[r];
    }
    for (int v = 0; v < nv; v++) out[v] = a[v] + b[v];
    if (hout) *hout = ha + hb;
}

/* dw's last IN % KVL columns (IN >= KVL) from the `width` lanes of sums of the row's last
 * `width` columns (a vector's or a half vector's): the lanes of the columns already done are
 * dropped */
DP_INLINE void K(store_last)(T *DP_RESTRICT dw, const T *lanes, int width, int IN)
{
    memcpy(dw + IN / KVL * KVL, lanes + width - IN % KVL, sizeof(T) * (size_t)(IN % KVL));
}

/* store_last of a vector of sums */
DP_INLINE void K(store_tail)(T *DP_RESTRICT dw, K(kvec) s, int IN)
{
    T lanes[KVL];
    K(kstore)(lanes, s);
    K(store_last)(dw, lanes, KVL, IN);
}

/* dw's last IN % KVL columns (block_gemv_t_rows; block_gemv_t for IN < KVL): the row's last
 * KVL columns summed by gemv_t_vecs (store_tail); one column at a time (one chain) only when
 * IN < KVL, for every column */
DP_INLINE void K(gemv_t_tail)(T *DP_RESTRICT dw, const T *DP_RESTRICT g, const T *DP_RESTRICT xb,
                              ptrdiff_t ldx, int rows, int IN)
{
    int j = IN / KVL * KVL;
    if (j < IN && IN >= KVL) {
        const int col[1] = {IN - KVL};
        K(kvec) s;
        K(gemv_t_vecs)(&s, dw, g, xb, ldx, rows, col, 1, 0, 0, NULL, 0);
        K(store_tail)(dw, s, IN);
        return;
    }
    for (; j < IN; j++) {
        T a = dw[j];
        for (int r = 0; r < rows; r++) a += xb[(ptrdiff_t)r * ldx + j] * g[r];
        dw[j] = a;
    }
}

/* dw += sum_r g[r] x_r over the rows of one block, with dw held in registers up to four
 * vectors at a time while the rows stream by (instead of a load/store of dw per row). Each dw
 * vector gathers two sums over alternate rows, added at the end: one sum over all rows is a
 * chain of dependent FMAs, which ran at the FMA's latency (the profile's hottest instruction,
 * 5 cycles a row). The columns past the last group of four, the last IN % KVL ones included
 * (the row's last KVL columns, the lanes already summed dropped), go in one more pass of the
 * same order: 20 float64 columns on AVX-512 are 2 vectors and a tail, which took three
 * passes of two chains each when only groups of four shared one. pf, pf_rows: gemv_t_vecs's
 * prefetch, only for the logistic kernel's rows of one pass (a constant 0 elsewhere, so that
 * the other callers have no prefetch code). */
DP_INLINE void K(block_gemv_t)(T *DP_RESTRICT dw, const T *DP_RESTRICT g, const T *DP_RESTRICT xb,
                               ptrdiff_t ldx, int rows, int IN, int pf, int pf_rows)
{
    typedef K(kvec) V;
    if (IN < KVL) {             /* one column at a time (one chain), for every column */
        K(gemv_t_tail)(dw, g, xb, ldx, rows, IN);
        return;
    }
    V s[4];
    int j = 0;
    for (; j + 4 * KVL <= IN; j += 4 * KVL) {
        const int col[4] = {j, j + KVL, j + 2 * KVL, j + 3 * KVL};
        K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 4, pf, pf_rows, NULL, 0);
        for (int v = 0; v < 4; v++) K(kstore)(dw + col[v], s[v]);
    }
    /* the last IN % KVL columns: with the last vector of columns (tail, store_tail) or, when
     * they fill at most half a vector (K_HALF builds), in half a vector (half): half the loads
     * and multiply-adds of a full one (20 float64 columns on AVX-512: 2 vectors and a half),
     * each column summed in the same order, so the same bits */
    const int full = (IN - j) / KVL, rem = IN % KVL, half = K_HALF && rem && rem <= KVL / 2;
    const int tail = rem && !half, nv = full + tail;
    int col[4] = {0};
    for (int v = 0; v < full; v++) col[v] = j + v * KVL;
    if (tail) col[full] = IN - KVL;
    if (nv == 0 && !half) return;
    K(hvec) h, *hp = half ? &h : NULL;
    const int hcol = IN - KVL / 2;
    switch (nv) {                /* constant vector counts, so that each call is unrolled */
    case 0: K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 0, pf, pf_rows, hp, hcol); break;
    case 1: K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 1, pf, pf_rows, hp, hcol); break;
    case 2: K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 2, pf, pf_rows, hp, hcol); break;
    case 3: K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 3, pf, pf_rows, hp, hcol); break;
    case 4: K(gemv_t_vecs)(s, dw, g, xb, ldx, rows, col, 4, pf, pf_rows, hp, hcol); break;
    default: return;
    }
    for (int v = 0; v < full; v++) K(kstore)(dw + col[v], s[v]);
    if (half) {
        T lanes[KVL / 2];
        memcpy(lanes, &h, sizeof h);
        K(store_last)(dw, lanes, KVL / 2, IN);
    }
    if (tail) K(store_tail)(dw, s[full], IN);
}

/* Columns of dw summed by one pass of block_gemv_t_rows: GEMV_T_CHUNK bytes of dw and as
 * many of odd (the odd rows' sums) stay in L1 while each row's matching columns stream by in
 * memory order. (AVX2 VM, float64, X^T v 2048 x 2048, medians of 5 interleaved runs: 4 KB
 * 953 us, 8 KB 865, 16 KB 822: 16 KB would fill a 32 KB L1 with dw and odd alone.) */
#define GEMV_T_CHUNK 8192

/* block_gemv_t for long rows, in the same order (so the same bits): dw + the even rows, plus
 * the odd rows, each column on its own. block_gemv_t walks down the block four vectors of
 * columns at a time, a row's stride between loads: once the block is larger than L1, the
 * hardware prefetcher does not follow its 64 streams and those loads wait. Here the rows go
 * by in memory order, 4 at a time, and dw and odd take a load and a store per 4 rows'
 * vectors (AVX2 VM, float64, X^T v, the kernel called directly, medians of 5 interleaved
 * runs: 8192x520 2193 -> 1603 us, 2048x2048 2615 -> 1336 us). */
DP_INLINE void K(block_gemv_t_rows)(T *DP_RESTRICT dw, const T *DP_RESTRICT g,
                                    const T *DP_RESTRICT xb, ptrdiff_t ldx, int rows, int IN)
{
    typedef K(kvec) V;
    enum { CH = GEMV_T_CHUNK / sizeof(T) };
    const int jv = IN / KVL * KVL;
    T odd[CH];
    for (int c0 = 0; c0 < jv; c0 += CH) {
        const int n = jv - c0 < CH ? jv - c0 : CH;
        T *d = dw + c0;
        memset(odd, 0, sizeof(T) * (size_t)n);
        int r = 0;
        for (; r + 4 <= rows; r += 4) {
            const T *x0 = xb + (ptrdiff_t)r * ldx + c0, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
            const T g0 = g[r], g1 = g[r + 1], g2 = g[r + 2], g3 = g[r + 3];
            for (int j = 0; j < n; j += KVL) {
                V a = K(kload)(d + j), b = K(kload)(odd + j);
                a += K(kload)(x0 + j) * g0;
                b += K(kload)(x1 + j) * g1;
                a += K(kload)(x2 + j) * g2;
                b += K(kload)(x3 + j) * g3;
                K(kstore)(d + j, a);
                K(kstore)(odd + j, b);
            }
        }
        for (; r < rows; r += 2) {
            const T *x0 = xb + (ptrdiff_t)r * ldx + c0;
            for (int j = 0; j < n; j += KVL) {
                V a = K(kload)(d + j) + K(kload)(x0 + j) * g[r];
                K(kstore)(d + j, a);
                if (r + 1 < rows) K(kstore)(odd + j, K(kload)(odd + j) + K(kload)(x0 + ldx + j) * g[r + 1]);
            }
        }
        for (int j = 0; j < n; j += KVL) K(kstore)(d + j, K(kload)(d + j) + K(kload)(odd + j));
    }
    K(gemv_t_tail)(dw, g, xb, ldx, rows, IN);
}

/* dp_logistic_grad's blocks of rows, one_pass a constant once inlined: whether the backward
 * takes a row in one pass of gemv_t_vecs (KVL to 4 KVL values), and then prefetches x
 * (block_gemv_t's pf), or in several, and then the forward does. Two copies of the loop: in
 * one loop with both branches, rows of several passes ran slower than before the backward
 * prefetched (AMD EPYC, the kernel called from C, float64 IN = 64, ns a row streaming, 3
 * interleaved runs: 34.4-35.3 with the branch taken out at compile time, 38.3-38.6 with it). */
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

int KV(dp_logistic_grad)(T *dw, T *db, double *loss_sum, int64_t *correct, const T *x,
                                  const T *w, const T *b, const int64_t *labels, int B, int IN,
                                  T grad_scale)
{
    // x is (B, IN), w is (1, IN), b is (1,): logistic regression's forward, loss and backward
    // in one pass over x: a block of rows is read from memory once for z = x w + b and then
    // again, from L1, for dw += g x. dw (IN,) and db (1,) accumulate.
#if defined(DP_VEC_PASS) && DP_VEC_BYTES == 64
    /* a row narrower than a 64-byte vector would go one value at a time here: the AVX2
     * build's 32-byte vectors take it (a CPU with AVX-512 has AVX2). AMD EPYC, 1 thread,
     * ns a row streaming a 160 MB x, 2 interleaved runs: float32 IN = 8 8.3-8.6 -> 3.7-5.0,
     * IN = 12 12.0-14.4 -> 4.6-6.4, IN = 15 14.3-20.0 -> 5.0-6.2; float64 IN = 4..7 within
     * the noise (6.5-11.7 against 6.4-9.1) */
    if (IN < KVL && 2 * IN >= KVL)
        return DP_VEC_CAT(K(dp_logistic_grad), _avx2)(dw, db, loss_sum, correct, x, w, b, labels,
                                                      B, IN, grad_scale);
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

/* The GEMM's matrix-vector shapes (dp_gemm_drv.h), on the logistic kernel's two halves. X's
 * rows are contiguous, ldx apart. */
void KV(dp_gemv_rows)(T *out, const T *X, ptrdiff_t ldx, const T *v, int rows, int len)
{
    // out[r] = X[r, 0:len] . v
    K(block_gemv)(out, X, ldx, v, (T)0, rows, len, 0);
}

/* rows of X per pass of block_gemv_t: out stays in L1 while they stream by */
#define GEMV_COLS_ROWS 64
/* rows at least this long go through block_gemv_t_rows: 64 rows of 64 float64 fill L1 */
#define GEMV_T_ROWS_MIN 64

void KV(dp_gemv_cols)(T *out, const T *X, ptrdiff_t ldx, const T *v, int rows, int len)
{
    // out[0:len] = sum_r v[r] X[r, 0:len]
    memset(out, 0, sizeof(T) * (size_t)len);
    for (int r0 = 0; r0 < rows; r0 += GEMV_COLS_ROWS) {
        int n = rows - r0 < GEMV_COLS_ROWS ? rows - r0 : GEMV_COLS_ROWS;
        if (len >= GEMV_T_ROWS_MIN)
            K(block_gemv_t_rows)(out, v + r0, X + (ptrdiff_t)r0 * ldx, ldx, n, len);
        else
            K(block_gemv_t)(out, v + r0, X + (ptrdiff_t)r0 * ldx, ldx, n, len, 0, 0);
    }
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
#undef K_ROWS
#undef K_LO1
#undef K_HI1
#undef K_LO2
#undef K_HI2
#undef K_LO3
#undef K_HI3
#undef K_LO4
#undef K_HI4

#undef K
