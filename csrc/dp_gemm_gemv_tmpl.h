/* dp_gemm_gemv_tmpl.h - the GEMM's matrix-vector products for one dtype and one ISA build
 * (dp_vec.h): what the driver (dp_gemm_drv.h's gemv) runs for N = 1 or M = 1 with a unit-stride
 * matrix, X (rows, len) with contiguous rows ldx apart:
 *   block_gemv     z[r] = b + x_r . v over a block of rows (X v)
 *   block_gemv_t   dw += sum_r g[r] x_r over a block of rows (X^T v); block_gemv_t_rows for
 *                  long rows, in the same order
 * (inline), and the vector kernels built on them, dp_gemv_rows (X v) and dp_gemv_cols (X^T v),
 * declared in dp_gemm.h. The logistic kernel of dp_loss_tmpl.h is the two blocks fused
 * around the loss, so it includes this file too.
 *
 * Included with T, TI (the integer of T's width), TBYTES (sizeof(T), as a preprocessor
 * number) and S (_f32/_f64) defined, by dp_gemm_gemv.c with DP_GEMV_KERNELS (the kernels)
 * and by dp_loss_tmpl.h without (the blocks alone). dp_vec_*.c compile both in one unit: the
 * blocks come once per dtype (DP_GEMV_BLOCKS_F32 / _F64), with dp_loss.c first, where they
 * were before they moved here: in the other order GCC allocated the logistic kernel's
 * registers otherwise (the same arithmetic, another machine code).
 */
#ifndef CAT
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#endif
#ifndef K
#define K(name) CAT(name, S)
#define DP_GEMV_OWN_K
#endif

#define KVL (DP_VEC_BYTES / TBYTES) /* TBYTES: sizeof(T), as a preprocessor number */

#if (TBYTES == 4 && !defined(DP_GEMV_BLOCKS_F32)) || (TBYTES == 8 && !defined(DP_GEMV_BLOCKS_F64))
#if TBYTES == 4
#define DP_GEMV_BLOCKS_F32
#else
#define DP_GEMV_BLOCKS_F64
#endif

/* Vectors of the build's width (DP_VEC_BYTES: 16 generic, 32 AVX2, 64 AVX-512) for the
 * hand-vectorized loops below: GCC cannot vectorize a float sum without reassociating it, so
 * the dot products keep explicit vector partial sums. (Wider vectors than the build's were
 * split through memory: the generic build's 16 bytes, not 32.) */
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

DP_INLINE K(kvec) K(rowsums)(K(kvec) * acc)
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
/* How far ahead block_gemv prefetches x when asked (the logistic kernel's forward, for rows
 * its backward takes in several passes; dp_loss_tmpl.h's LOGREG_PF_BYTES says why). */
#define GEMV_PF_ROWS 64

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
 * prefetch: x GEMV_PF_ROWS rows ahead (the logistic kernel asks, for rows that its backward
 * takes in more than one pass). The GEMM's matrix-vector product goes without: it has no
 * arithmetic for the memory to overlap, the hardware prefetcher follows its KVL streams, and
 * the prefetches took load slots (it ran about twice as fast without them). */
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
            const char *pf = (const char *)(x0 + (ptrdiff_t)GEMV_PF_ROWS * ldx);
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
    for (; r < rows; r++) { /* IN < KVL */
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
DP_INLINE void K(gemv_t_vecs)(K(kvec) * out, const T *DP_RESTRICT dw, const T *DP_RESTRICT g,
                              const T *DP_RESTRICT xb, ptrdiff_t ldx, int rows, const int *col,
                              int nv, int pf, int pf_rows, K(hvec) * hout, int hcol)
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
{ memcpy(dw + IN / KVL * KVL, lanes + width - IN % KVL, sizeof(T) * (size_t)(IN % KVL)); }

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
    if (IN < KVL) { /* one column at a time (one chain), for every column */
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
    switch (nv) { /* constant vector counts, so that each call is unrolled */
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
 * memory order. 16 KB was a little faster still, but would fill a 32 KB L1 with dw and odd
 * alone. */
#define GEMV_T_CHUNK 8192

/* block_gemv_t for long rows, in the same order (so the same bits): dw + the even rows, plus
 * the odd rows, each column on its own. block_gemv_t walks down the block four vectors of
 * columns at a time, a row's stride between loads: once the block is larger than L1, the
 * hardware prefetcher does not follow its 64 streams and those loads wait. Here the rows go
 * by in memory order, 4 at a time, and dw and odd take a load and a store per 4 rows'
 * vectors. */
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
            const T *x0 = xb + (ptrdiff_t)r * ldx + c0, *x1 = x0 + ldx, *x2 = x1 + ldx,
                    *x3 = x2 + ldx;
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
                if (r + 1 < rows)
                    K(kstore)(odd + j, K(kload)(odd + j) + K(kload)(x0 + ldx + j) * g[r + 1]);
            }
        }
        for (int j = 0; j < n; j += KVL) K(kstore)(d + j, K(kload)(d + j) + K(kload)(odd + j));
    }
    K(gemv_t_tail)(dw, g, xb, ldx, rows, IN);
}

#undef K_ROWS
#undef K_LO1
#undef K_HI1
#undef K_LO2
#undef K_HI2
#undef K_LO3
#undef K_HI3
#undef K_LO4
#undef K_HI4
#endif /* the blocks of this dtype */

#ifdef DP_GEMV_KERNELS
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
DP_GEMV_VEC(DP_VEC_DEFINE, T, S)
#endif
#undef GEMV_COLS_ROWS
#undef GEMV_T_ROWS_MIN
#endif /* DP_GEMV_KERNELS */

#ifdef DP_GEMV_OWN_K
#undef K
#undef DP_GEMV_OWN_K
#endif
