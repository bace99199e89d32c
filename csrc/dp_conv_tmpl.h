/* dp_conv_tmpl.h - bodies of the kernels in dp_conv.h for one dtype.
 * Included by dp_conv.c with T (float or double), S (_f32/_f64), VL (T values in 32 bytes),
 * IT (the integer of T's width) and IOTA (the lane indices 0 .. VL - 1) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

#include "dp_vec32_tmpl.h" /* pvec, pmask, pload, pstore, pselect */

/* The offset in x (C, H, W) of patch entry k = (c KH + u) KW + v from its output position's
 * (the direct weight gradient's and dp_gemm_patch's A rows; padding 0) */
DP_INLINE ptrdiff_t K(entry_offset)(const dp_conv_geom *g, int k)
{
    int c = k / (g->KH * g->KW), u = k / g->KW % g->KH, v = k % g->KW;
    return ((ptrdiff_t)c * g->H + u) * g->W + v;
}

/* Output columns j whose input column j + v - PAD lies inside [0, W): [*j0, *j1). */
DP_INLINE void K(valid_cols)(int v, int pad, int W, int OW, int *j0, int *j1)
{
    int lo = pad - v, hi = W + pad - v;
    *j0 = lo > 0 ? lo : 0;
    *j1 = hi < OW ? hi : OW;
    if (*j1 < *j0) *j1 = *j0;
}

/* Vectors of the build's own width (DP_VEC_BYTES: 16 generic, 32 AVX2, 64 AVX-512) for
 * im2col's row copies. */
typedef T K(rvec) __attribute__((vector_size(DP_VEC_BYTES)));
typedef IT K(rmask) __attribute__((vector_size(DP_VEC_BYTES))); /* lane masks, permutes */
#define RVL ((int)(DP_VEC_BYTES / sizeof(T)))

DP_INLINE K(rvec) K(rload)(const T *p)
{
    K(rvec) v;
    memcpy(&v, p, sizeof v);
    return v;
}

DP_INLINE void K(rstore)(T *p, K(rvec) v) { memcpy(p, &v, sizeof v); }

/* d[0:n] = s[0:n] for a short row (12 to 30 values in the CNNs here) in whole vectors, not a
 * memcpy call per row. A row of at most RVL values is one vector where `over` allows it
 * (reading and writing up to RVL - 1 values past the row: im2col writes its rows in
 * increasing order, so what runs past one is written again by the next row or block, the
 * last block's run landing in the buffer's slack, DP_CONV_COL_SLACK; the caller allows it
 * where the read stays inside the image): conv2's rows of 12 floats on AVX-512. Otherwise
 * the last vector overlaps the one before. */
DP_INLINE void K(copy_row)(T *DP_RESTRICT d, const T *DP_RESTRICT s, int n, int over)
{
    if (n <= RVL && over) {
        K(rstore)(d, K(rload)(s));
        return;
    }
    if (n < RVL) {
        for (int j = 0; j < n; j++) d[j] = s[j];
        return;
    }
    for (int j = 0; j + RVL < n; j += RVL) K(rstore)(d + j, K(rload)(s + j));
    K(rstore)(d + n - RVL, K(rload)(s + n - RVL));
}

/* im2col of a layer without padding whose output rows are narrower than a vector (OW < RVL:
 * conv2's rows of 12 floats on AVX-512) on 64-byte vectors: a col row is OH runs of OW
 * values, W apart in x, and each of its vectors is made by one two-source permute of the two
 * vectors of x from its first value on (the values of a vector span less than 2 RVL of x where
 * the plan accepts the shape), instead of one vector copy per run, whose stores overlapped the
 * run before and mostly crossed a line. The permutes repeat every lcm(OW, RVL) values of the
 * row: *npat patterns, pattern t's first value at base[t] past its period's first row in x,
 * its lanes at idx[t] from there; a period covers *rows rows of x. 0, or -1 where a pattern
 * would span more than two vectors. GCC only: Clang has no permute with a mask of variables
 * (its builds keep the copies). */
#if DP_VEC_BYTES == 64 && !defined(__clang__)
#define IM2COL_PERMUTE 1

static int K(im2col_plan)(K(rmask) * idx, int *base, int *npat, int *rows, int W, int OW)
{
    int period = RVL;
    while (period % OW) period += RVL; /* lcm(OW, RVL): at most OW vectors */
    *npat = period / RVL;
    *rows = period / OW;
    int at = 0, j = 0; /* x offset and column of value t RVL + l */
    for (int t = 0; t < *npat; t++) {
        base[t] = at;
        for (int l = 0; l < RVL; l++) {
            if (at - base[t] >= 2 * RVL) return -1;
            idx[t][l] = at - base[t];
            if (++j == OW) {
                j = 0;
                at += W - OW + 1;
            } else {
                at++;
            }
        }
    }
    return 0;
}
#endif

/* im2col and col2im with a stride above 1: one value at a time (ST = 2 takes every other
 * value of a row, which the row copies cannot) */
static void K(im2col_strided)(T *col, ptrdiff_t ldcol, const T *x, const dp_conv_geom *g, int OH,
                              int OW)
{
    int H = g->H, W = g->W, pad = g->pad, st = dp_conv_stride(g);
    for (int c = 0; c < g->C; c++)
        for (int u = 0; u < g->KH; u++)
            for (int v = 0; v < g->KW; v++) {
                T *dst = col + ((ptrdiff_t)(c * g->KH + u) * g->KW + v) * ldcol;
                for (int i = 0; i < OH; i++) {
                    int h = i * st + u - pad;
                    T *d = dst + (ptrdiff_t)i * OW;
                    if (h < 0 || h >= H) {
                        for (int j = 0; j < OW; j++) d[j] = 0;
                        continue;
                    }
                    const T *xr = x + ((ptrdiff_t)c * H + h) * W;
                    for (int j = 0; j < OW; j++) {
                        int q = j * st + v - pad;
                        d[j] = q >= 0 && q < W ? xr[q] : (T)0;
                    }
                }
            }
}

static void K(col2im_strided)(T *dx, const T *dcol, ptrdiff_t ldcol, const dp_conv_geom *g, int OH,
                              int OW)
{
    int H = g->H, W = g->W, pad = g->pad, st = dp_conv_stride(g);
    memset(dx, 0, sizeof(T) * (size_t)g->C * H * W);
    for (int c = 0; c < g->C; c++)
        for (int u = 0; u < g->KH; u++)
            for (int v = 0; v < g->KW; v++) {
                const T *src = dcol + ((ptrdiff_t)(c * g->KH + u) * g->KW + v) * ldcol;
                for (int i = 0; i < OH; i++) {
                    int h = i * st + u - pad;
                    if (h < 0 || h >= H) continue;
                    T *xr = dx + ((ptrdiff_t)c * H + h) * W;
                    const T *s = src + (ptrdiff_t)i * OW;
                    for (int j = 0; j < OW; j++) {
                        int q = j * st + v - pad;
                        if (q >= 0 && q < W) xr[q] += s[j];
                    }
                }
            }
}

void KV(dp_im2col)(T *col, ptrdiff_t ldcol, const T *x, const dp_conv_geom *g, int OH, int OW)
{
    // x is (C, H, W), col is (C KH KW, OH OW) with row stride ldcol, for the output block
    // i < OH, j < OW: col[(c KH + u) KW + v, i OW + j] = x[c, i + u - PAD, j + v - PAD], 0
    // outside the image
    int H = g->H, W = g->W, pad = g->pad;
    const T *xend = x + (ptrdiff_t)g->C * H * W;
    if (dp_conv_stride(g) != 1) {
        K(im2col_strided)(col, ldcol, x, g, OH, OW);
        return;
    }
#ifdef IM2COL_PERMUTE
    K(rmask) idx[RVL];
    int base[RVL], npat, rows;
    if (pad == 0 && OW < RVL && K(im2col_plan)(idx, base, &npat, &rows, W, OW) == 0) {
        const int P = OH * OW;
        for (int c = 0; c < g->C; c++)
            for (int u = 0; u < g->KH; u++)
                for (int v = 0; v < g->KW; v++) {
                    T *dst = col + ((ptrdiff_t)(c * g->KH + u) * g->KW + v) * ldcol;
                    const T *src = x + (ptrdiff_t)c * H * W + (ptrdiff_t)u * W + v, *sp = src;
                    int p = 0;
                    for (int t = 0; p + RVL <= P; p += RVL) {
                        const T *q = sp + base[t];
                        if (q + 2 * RVL > xend) break; /* the image's last values */
                        K(rvec) lo = K(rload)(q), hi = K(rload)(q + RVL);
                        K(rstore)(dst + p, __builtin_shuffle(lo, hi, idx[t]));
                        if (++t == npat) {
                            t = 0;
                            sp += (ptrdiff_t)rows * W;
                        }
                    }
                    for (; p < P; p++) dst[p] = src[(ptrdiff_t)(p / OW) * W + p % OW];
                }
        return;
    }
#endif
    for (int c = 0; c < g->C; c++) {
        const T *xc = x + (ptrdiff_t)c * H * W;
        for (int u = 0; u < g->KH; u++) {
            /* output rows [i0, i1) read input row i + u - PAD inside [0, H); the others are 0 */
            int i0 = pad - u > 0 ? pad - u : 0, i1 = H + pad - u < OH ? H + pad - u : OH;
            if (i1 < i0) i1 = i0;
            for (int v = 0; v < g->KW; v++) {
                T *dst = col + ((ptrdiff_t)(c * g->KH + u) * g->KW + v) * ldcol;
                int j0, j1, shift = v - pad;
                K(valid_cols)(v, pad, W, OW, &j0, &j1);
                int n = j1 - j0;
                if (i0 > 0) memset(dst, 0, sizeof(T) * (size_t)i0 * OW);
                for (int i = i0; i < i1; i++) {
                    T *DP_RESTRICT d = dst + (ptrdiff_t)i * OW;
                    /* j0 + shift = max(0, v - PAD) >= 0: the copy starts inside the row */
                    const T *s = xc + (ptrdiff_t)(i + u - pad) * W + j0 + shift;
                    for (int j = 0; j < j0; j++) d[j] = 0;
                    K(copy_row)(d + j0, s, n, s + RVL <= xend);
                    for (int j = j1; j < OW; j++) d[j] = 0;
                }
                if (i1 < OH)
                    memset(dst + (ptrdiff_t)i1 * OW, 0, sizeof(T) * (size_t)(OH - i1) * OW);
            }
        }
    }
}

/* The most kernel rows col2im gathers at once (more: in several passes that add). */
#define COL2IM_ROWS 16

/* Lanes q0 .. q0 + VL - 1 of a dx row whose term from kernel column v lies inside the dcol
 * row: 0 <= q + PAD - v < OW. */
DP_INLINE K(pmask) K(col_mask)(int q0, int v, int pad, int OW)
{
    const K(pmask) iota = IOTA;
    K(pmask) q = iota + (IT)q0;
    return (q >= (IT)(v - pad)) & (q < (IT)(OW + v - pad));
}

/* d[0:W] (+)= sum over the rows r[t] (kernel row u's dcol row for kernel column 0 at the
 * matching output row) and the kernel columns v of r[t][v ldcol + q + PAD - v], the terms
 * outside the dcol row masked to 0: whole vectors, summed in registers and stored once (a
 * running sum in memory would reload vectors that straddle the ones just stored: a
 * store-forwarding stall each). The last vector overlaps the one before and is computed
 * before any store. Masked lanes may read a little outside the row (never outside dcol and
 * its slack, see dp_conv_col_elems); their bits are cleared, garbage or not. */
DP_INLINE void K(gather_row)(T *DP_RESTRICT d, const T *const *r, int rows, ptrdiff_t ldcol, int W,
                             int KW, int pad, int OW, int qlo, int qhi, int accumulate)
{
    typedef K(pvec) V;
    typedef K(pmask) M;
    const M all = ~(M){0};
    int e = W - VL;
    V last = {0};
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: the last vector (kept); pass 1: the others, stored as they are done */
        int q0 = pass == 0 ? e : 0;
        for (; pass == 0 ? q0 == e : q0 < e; q0 += VL) {
            V a = {0};
            if (accumulate) a = K(pload)(d + q0);
            int edge = q0 < qlo || q0 + VL > qhi;
            for (int v = 0; v < KW; v++) {
                M m = edge ? K(col_mask)(q0, v, pad, OW) : all;
                ptrdiff_t off = v * ldcol + q0 + pad - v;
                for (int t = 0; t < rows; t++) a += (V)((M)K(pload)(r[t] + off) & m);
            }
            if (pass == 0)
                last = a;
            else
                K(pstore)(d + q0, a);
            if (pass == 0) break;
        }
    }
    K(pstore)(d + e, last);
}

/* col2im for an image whose rows fit in one vector of the build's width (W <= RVL: conv2's
 * 15-float rows on AVX-512, which gather_row's 32-byte vectors took in two overlapping
 * halves, and the rows narrower than those, which went one value at a time): each dx row is
 * one vector, summed from the masked dcol rows in the order of the path it replaces (v, then
 * the kernel rows, as gather_row; the kernel rows, then v, for W < VL), so the same bits.
 * The vector is stored whole: its lanes past W land on the next row, which is stored later,
 * and only the last row of dx is stored value by value. Masked lanes read inside dcol and its
 * slack, as gather_row's. Returns 1 (nothing written) for a wider image, KW > RVL or more
 * kernel rows than COL2IM_ROWS. */
static int K(col2im_narrow)(T *dx, const T *dcol, ptrdiff_t ldcol, const dp_conv_geom *g, int OH,
                            int OW)
{
    typedef K(rvec) V;
    int H = g->H, W = g->W, pad = g->pad, KH = g->KH, KW = g->KW;
    if (W > RVL || KW > RVL || KH > COL2IM_ROWS) return 1;
    /* mv[v]: the lanes q whose term from kernel column v lies in the dcol row */
    K(rmask) mv[RVL];
    for (int v = 0; v < KW; v++)
        for (int l = 0; l < RVL; l++) mv[v][l] = l + pad - v >= 0 && l + pad - v < OW ? -1 : 0;
    const int v_outer = W >= VL;
    T *const end = dx + (ptrdiff_t)g->C * H * W;
    for (int c = 0; c < g->C; c++)
        for (int h = 0; h < H; h++) {
            T *d = dx + ((ptrdiff_t)c * H + h) * W;
            const T *rows[COL2IM_ROWS];
            int n = 0;
            for (int u = 0; u < KH; u++) {
                int i = h + pad - u;
                if (i >= 0 && i < OH)
                    rows[n++] =
                        dcol + (ptrdiff_t)(c * KH + u) * KW * ldcol + (ptrdiff_t)i * OW + pad;
            }
            V a = {0};
            if (v_outer) {
                for (int v = 0; v < KW; v++)
                    for (int t = 0; t < n; t++)
                        a += (V)((K(rmask))K(rload)(rows[t] + v * (ldcol - 1)) & mv[v]);
            } else {
                for (int t = 0; t < n; t++)
                    for (int v = 0; v < KW; v++)
                        a += (V)((K(rmask))K(rload)(rows[t] + v * (ldcol - 1)) & mv[v]);
            }
            if (d + RVL <= end) {
                K(rstore)(d, a);
            } else {
                T lanes[RVL];
                K(rstore)(lanes, a);
                memcpy(d, lanes, sizeof(T) * (size_t)W);
            }
        }
    return 0;
}

void KV(dp_col2im)(T *dx, const T *dcol, ptrdiff_t ldcol, const dp_conv_geom *g, int OH, int OW)
{
    // dcol is (C KH KW, OH OW) with row stride ldcol (the output block i < OH, j < OW), dx is
    // (C, H, W), written: dx[c, h, q] = sum over (u, v) of
    // dcol[(c KH + u) KW + v, (h + PAD - u) OW + q + PAD - v] over the entries inside the block
    // (those im2col copied x[c, h, q] into), gathered one dx row at a time and written once.
    // Scattering dcol's rows instead would add into dx at a different offset for every v, and
    // the vector loads of dx would wait on the stores just made (store-forwarding stalls).
    if (dp_conv_stride(g) != 1) {
        K(col2im_strided)(dx, dcol, ldcol, g, OH, OW);
        return;
    }
    if (K(col2im_narrow)(dx, dcol, ldcol, g, OH, OW) == 0) return;
    int H = g->H, W = g->W, pad = g->pad, KH = g->KH, KW = g->KW;
    /* q in [qlo, qhi): every v reads inside the dcol row (j = q + PAD - v in [0, OW)) */
    int qlo = KW - 1 - pad > 0 ? KW - 1 - pad : 0, qhi = OW - pad < W ? OW - pad : W;
    if (qhi < qlo) qhi = qlo;
    for (int c = 0; c < g->C; c++)
        for (int h = 0; h < H; h++) {
            T *DP_RESTRICT d = dx + ((ptrdiff_t)c * H + h) * W;
            /* rows[t]: dcol's row (c, u, 0) at output row i = h + PAD - u, for the valid u;
             * row (c, u, v) is rows[t] + v ldcol and holds dx[c, h, q]'s term at q + PAD - v */
            const T *rows[COL2IM_ROWS];
            int n = 0, first = 1;
            for (int u = 0; u <= KH; u++) {
                int i = h + pad - u;
                if (u < KH && i >= 0 && i < OH)
                    rows[n++] = dcol + (ptrdiff_t)(c * KH + u) * KW * ldcol + (ptrdiff_t)i * OW;
                if (n < COL2IM_ROWS && u < KH) continue;
                if (W >= VL) {
                    K(gather_row)(d, rows, n, ldcol, W, KW, pad, OW, qlo, qhi, !first);
                } else { /* a row narrower than a vector: element by element */
                    for (int q = 0; q < W; q++) {
                        T a = first ? (T)0 : d[q];
                        for (int t = 0; t < n; t++)
                            for (int v = 0; v < KW; v++) {
                                int j = q + pad - v;
                                if (j >= 0 && j < OW) a += rows[t][v * ldcol + j];
                            }
                        d[q] = a;
                    }
                }
                first = 0;
                n = 0;
            }
        }
}

#undef COL2IM_ROWS

/* The direct forward (dp_conv_direct_forward): no im2col and no packing, for a layer whose
 * patch is short (K = C KH KW <= DIRECT_K: a first layer's 3 x 3 x 3 = 27, where the GEMM's
 * shallow depth leaves it far from the FMA peak, and im2col writes 27 copies of the image).
 * Vectors of the build's own width along an output row (im2col's rvec, RVL values each). */
#define DIRECT_K 64
/* Where it runs: float on 32- and 64-byte vectors, where it was faster than im2col + GEMM;
 * double was slower with it, and the generic build's 16-byte vectors gained nothing: those
 * keep the im2col path. */
#define DIRECT_BUILD (sizeof(T) == 4 && DP_VEC_BYTES >= 32)

/* The accumulators of one tile: filter f's two output vectors (columns ja and jb of row i) */
#define DT_DECL(f) K(rvec) a##f = {0}, b##f = {0};
#define DT_FMA(f)       \
    {                   \
        T s = wk[f];    \
        a##f += xa * s; \
        b##f += xb * s; \
    }
#define DT_STORE(f)                         \
    if ((f) < nf) {                         \
        T *yo = yr + (ptrdiff_t)(f) * P;    \
        K(rvec) ra = a##f, rb = b##f;       \
        if (beta != 0) {                    \
            ra += K(rload)(yo + ja) * beta; \
            rb += K(rload)(yo + jb) * beta; \
        }                                   \
        K(rstore)(yo + ja, ra);             \
        K(rstore)(yo + jb, rb);             \
    }
#define DT_DO4(X) X(0) X(1) X(2) X(3)
#define DT_DO6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DT_DO12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* The tile's sums: k = (c KH + u) KW + v ascending, one FMA each from 0, then alpha = 1 and
 * beta as the GEMM's store_tile: what the im2col path's GEMM computes for each output, so the
 * same bits (the tests compare them). */
#define DT_BODY(DO)                                                                 \
    {                                                                               \
        DO(DT_DECL)                                                                 \
        const T *wk = wt;                                                           \
        for (int c = 0; c < g->C; c++)                                              \
            for (int u = 0; u < g->KH; u++) {                                       \
                const T *xr = x + ((ptrdiff_t)c * g->H + i + u) * g->W;             \
                for (int v = 0; v < g->KW; v++, wk += NF) {                         \
                    K(rvec) xa = K(rload)(xr + ja + v), xb = K(rload)(xr + jb + v); \
                    DO(DT_FMA)                                                      \
                }                                                                   \
            }                                                                       \
        DO(DT_STORE)                                                                \
    }

/* Filters o0 .. o0 + nf - 1 of output row i at the vectors from columns ja and jb, from the
 * tile's weights wt packed k by k (NF a k, rows past nf repeating the last: computed, never
 * stored; NF a constant once inlined) */
DP_INLINE void K(direct_tile)(T *y, ptrdiff_t P, int ow, const T *x, const T *wt,
                              const dp_conv_geom *g, int o0, int nf, int i, int ja, int jb, T beta,
                              const int NF)
{
    T *yr = y + (ptrdiff_t)o0 * P + (ptrdiff_t)i * ow;
    if (NF == 12)
        DT_BODY(DT_DO12)
    else if (NF == 6)
        DT_BODY(DT_DO6)
    else
        DT_BODY(DT_DO4)
}

int KV(dp_conv_direct_forward)(T *y, const T *x, const T *w, const dp_conv_geom *g, int oh, int ow,
                               T beta)
{
    // x is (C, H, W), w is (OC, K), y is (OC, oh ow): y = w col(x) + beta y as
    // dp_conv_image_forward; returns 1 (nothing written) where the layer does not fit: padding,
    // an output row narrower than one vector, a patch longer than DIRECT_K
    int Kd = g->C * g->KH * g->KW;
    if (!DIRECT_BUILD || g->pad != 0 || dp_conv_stride(g) != 1 || ow < RVL || Kd > DIRECT_K)
        return 1;
    /* 64-byte vectors: 32 registers, 12 filters x 2 vectors + 2 + a broadcast; else 16 */
    const int big = DP_VEC_BYTES >= 64 ? 12 : 6;
    ptrdiff_t P = (ptrdiff_t)oh * ow;
    int nv = (ow + RVL - 1) / RVL;
    /* a tile's weights k by k (wt[k NF + f]): its broadcasts from one pointer at constant
     * offsets, instead of one pointer a filter (12 of the 16 general registers) */
    T wt[12 * DIRECT_K];
    for (int o0 = 0; o0 < g->OC;) {
        int NF = g->OC - o0 >= big ? big : 4, nf = g->OC - o0 < NF ? g->OC - o0 : NF;
        for (int k = 0; k < Kd; k++)
            for (int f = 0; f < NF; f++)
                wt[k * NF + f] = w[(ptrdiff_t)(o0 + (f < nf ? f : nf - 1)) * Kd + k];
        for (int i = 0; i < oh; i++)
            for (int q = nv % 2 ? -1 : 0; q < nv; q += 2) {
                /* vector q at column q RVL, the last one at ow - RVL, overlapping the one
                 * before: those two are always in one tile, so that the overlap is read
                 * (beta != 0) before either is stored; an odd count's first tile is vector 0
                 * twice */
                int ja = q < 0 ? 0 : q * RVL < ow - RVL ? q * RVL : ow - RVL;
                int jb = (q + 1) * RVL < ow - RVL ? (q + 1) * RVL : ow - RVL;
                if (NF == big)
                    K(direct_tile)(y, P, ow, x, wt, g, o0, nf, i, ja, jb, beta, big);
                else
                    K(direct_tile)(y, P, ow, x, wt, g, o0, nf, i, ja, jb, beta, 4);
            }
        o0 += nf;
    }
    return 0;
}

/* The direct weight gradient (dp_conv_direct_dwt), for the layers the direct forward takes:
 * dwt (K, OC) += col(x) dy^T without im2col, whose GEMM reads col strided, packs dy^T and
 * sums over 27 x 32 outputs in 3 K slices. A tile of NO filters x NK patch entries
 * accumulates, in one vector each, its products over every output position (vectors along
 * an output row: the last one, where it overlaps the one before, with the overlap's lanes
 * cleared in dy and x alike); each vector's lanes are then summed and added to dwt. On the
 * AVX-512 build only: it was faster than the GEMM there, slower on AVX2, which keeps the
 * GEMM. */
#define DW_NO 4
#define DW_NK 6
#define DW_KDO(X) X(0) X(1) X(2) X(3) X(4) X(5)
/* the last tile of a patch with at most 3 entries left: conv1's 27 = 4 x 6 + 3 computed 3
 * clamped entries for nothing */
#define DW_KDO3(X) X(0) X(1) X(2)

/* v's lanes summed (a fixed tree: halves added until one is left) */
DP_INLINE T K(dsum)(K(rvec) v)
{
    T t[RVL];
    memcpy(t, &v, sizeof t);
    for (int h = RVL / 2; h >= 1; h /= 2)
        for (int q = 0; q < h; q++) t[q] += t[q + h];
    return t[0];
}

/* The four sums of dsum at once, out[f] = dsum(v_f): the same halving tree on each vector
 * (the same additions, so the same bits), with the halves of two vectors gathered into one
 * by shuffles at each level (16 float lanes: the build the direct dwt runs on). Four scalar
 * trees were about a tenth of the kernel's time. */
DP_INLINE void K(dsum4)(K(rvec) a, K(rvec) b, K(rvec) c, K(rvec) d, T out[4])
{
#if DP_VEC_BYTES == 64 && VL == 8
    typedef K(rvec) V;
    typedef K(rmask) M;
    V ab = DP_SHUFFLE(M, a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           DP_SHUFFLE(M, a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    V cd = DP_SHUFFLE(M, c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           DP_SHUFFLE(M, c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    V w = DP_SHUFFLE(M, ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
          DP_SHUFFLE(M, ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    V z = DP_SHUFFLE(M, w, w, 0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13) +
          DP_SHUFFLE(M, w, w, 2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15);
    V r = DP_SHUFFLE(M, z, z, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6) +
          DP_SHUFFLE(M, z, z, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7);
    memcpy(out, &r, 4 * sizeof(T));
#else
    out[0] = K(dsum)(a);
    out[1] = K(dsum)(b);
    out[2] = K(dsum)(c);
    out[3] = K(dsum)(d);
#endif
}

#define DW_DECL(kk)                                                     \
    K(rvec) s0_##kk = {0}, s1_##kk = {0}, s2_##kk = {0}, s3_##kk = {0}; \
    const T *xk##kk = x + xo[kk];
#define DW_FMA(kk)                                    \
    {                                                 \
        K(rvec) xv = K(rload)(xk##kk + at);           \
        if (masked) xv = (K(rvec))((K(rmask))xv & m); \
        s0_##kk += d0 * xv;                           \
        s1_##kk += d1 * xv;                           \
        s2_##kk += d2 * xv;                           \
        s3_##kk += d3 * xv;                           \
    }
#define DW_ADD(kk)                                                  \
    if (k0 + (kk) < Kd) {                                           \
        T *row = dwt + (ptrdiff_t)(k0 + (kk)) * g->OC + o0, sum[4]; \
        K(dsum4)(s0_##kk, s1_##kk, s2_##kk, s3_##kk, sum);          \
        for (int f = 0; f < nf; f++) row[f] += sum[f];              \
    }

/* One step: the products at column j of output row i (masked: the lanes m clears zeroed)
 * for the tile's entries KDO */
#define DW_STEP(masked_, KDO)                                                   \
    {                                                                           \
        const int masked = (masked_);                                           \
        ptrdiff_t at = (ptrdiff_t)i * g->W + j, ad = (ptrdiff_t)i * ow + j;     \
        K(rvec) d0 = K(rload)(dr[0] + ad), d1 = K(rload)(dr[1] + ad);           \
        K(rvec) d2 = K(rload)(dr[2] + ad), d3 = K(rload)(dr[3] + ad);           \
        if (masked) {                                                           \
            d0 = (K(rvec))((K(rmask))d0 & m), d1 = (K(rvec))((K(rmask))d1 & m); \
            d2 = (K(rvec))((K(rmask))d2 & m), d3 = (K(rvec))((K(rmask))d3 & m); \
        }                                                                       \
        KDO(DW_FMA)                                                             \
    }

/* A tile: its entries' sums over every output position, added to dwt */
#define DW_TILE(KDO)                                            \
    {                                                           \
        KDO(DW_DECL)                                            \
        for (int i = 0; i < oh; i++) {                          \
            for (int j = 0; j < full; j += RVL) DW_STEP(0, KDO) \
            if (full < ow) {                                    \
                int j = js;                                     \
                DW_STEP(1, KDO)                                 \
            }                                                   \
        }                                                       \
        KDO(DW_ADD)                                             \
    }

int KV(dp_conv_direct_dwt)(T *dwt, const T *dy, const T *x, const dp_conv_geom *g, int oh, int ow)
{
    // dy is (OC, oh ow), x is (C, H, W), dwt is (K, OC): dwt += col(x) dy^T as
    // dp_conv_image_backward's first GEMM; returns 1 (nothing done) where the direct forward
    // would
    int Kd = g->C * g->KH * g->KW;
    /* 4 x 6 vectors: 32 registers (AVX-512) */
    if (!DIRECT_BUILD || DP_VEC_BYTES < 64 || g->pad != 0 || dp_conv_stride(g) != 1 || ow < RVL ||
        Kd > DIRECT_K)
        return 1;
    ptrdiff_t P = (ptrdiff_t)oh * ow;
    int full = ow / RVL * RVL, js = ow - RVL;
    /* m: the last vector's lanes that the vector before it has not taken */
    K(rmask) m, iota;
    for (int q = 0; q < RVL; q++) iota[q] = (IT)q;
    m = (K(rmask))(iota >= (IT)(full - js));
    for (int o0 = 0; o0 < g->OC; o0 += DW_NO) {
        int nf = g->OC - o0 < DW_NO ? g->OC - o0 : DW_NO;
        const T *dr[DW_NO];
        for (int f = 0; f < DW_NO; f++) dr[f] = dy + (ptrdiff_t)(o0 + (f < nf ? f : nf - 1)) * P;
        for (int k0 = 0; k0 < Kd; k0 += DW_NK) {
            ptrdiff_t xo[DW_NK];
            for (int kk = 0; kk < DW_NK; kk++)
                xo[kk] = K(entry_offset)(g, k0 + kk < Kd ? k0 + kk : Kd - 1);
            if (Kd - k0 <= 3)
                DW_TILE(DW_KDO3)
            else
                DW_TILE(DW_KDO)
        }
    }
    return 0;
}

/* The plane path (dp_conv_plane): a convolution of any kernel, padding and stride as a sum
 * of shifted vectors, without im2col. The image is first laid out as planes
 * (dp_conv_to_planes): zero-padded, and for a stride S split into its S x S phases, so that
 * patch entry k of output (i, j) reads xq[ent[k] + i Wq + j] (Wq: a plane's row). Every load
 * is then a plain vector load at a constant offset from the output position, whatever the
 * padding and the stride: no zeros copied in nine times (im2col's 3x3 patches), no branch at
 * a row's edge. A tile is PL_NF filters x PL_NV vectors of outputs: per entry, PL_NV loads of
 * x and PL_NF broadcasts of a weight feed PL_NF PL_NV FMAs (AVX-512: 8 x 3 = 24 of the 32
 * registers; AVX2: 4 x 3 of 16). Each output sums its entries k ascending, one FMA each from
 * 0, then adds beta y. Float on 32- and 64-byte vectors (double and the generic build keep
 * im2col + GEMM). */
#define PL_BUILD (sizeof(T) == 4 && DP_VEC_BYTES >= 32)
#define PL_NF (DP_VEC_BYTES >= 64 ? 8 : 4)
#define PL_NV 3

/* Filters o0 .. o0 + PL_NF - 1 at NV (3 or 1) vectors of extended positions from p (row o
 * at ye + o lde). Named accumulators, not an array, and one pointer to the vectors (constant
 * offsets from it): with arrays and a pointer a vector, GCC ran out of general registers and
 * kept two of the three x vectors on the stack (a load an FMA). */
#define PT_DECL3(f) K(rvec) a##f##_0 = {0}, a##f##_1 = {0}, a##f##_2 = {0};
#define PT_DECL1(f) K(rvec) a##f##_0 = {0};
#define PT_FMA3(f)           \
    {                        \
        T s_ = wk[f];        \
        a##f##_0 += x0 * s_; \
        a##f##_1 += x1 * s_; \
        a##f##_2 += x2 * s_; \
    }
#define PT_FMA1(f)           \
    {                        \
        T s_ = wk[f];        \
        a##f##_0 += x0 * s_; \
    }
#define PT_STORE3(f)                               \
    {                                              \
        T *at_ = ye + (ptrdiff_t)(o0 + (f)) * lde; \
        K(rstore)(at_, a##f##_0);                  \
        K(rstore)(at_ + RVL, a##f##_1);            \
        K(rstore)(at_ + 2 * RVL, a##f##_2);        \
    }
#define PT_STORE1(f) K(rstore)(ye + (ptrdiff_t)(o0 + (f)) * lde, a##f##_0);
#if DP_VEC_BYTES >= 64
#define PT_DO(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#define PT_DO(X) X(0) X(1) X(2) X(3)
#endif

DP_INLINE void K(plane_tile3)(T *ye, ptrdiff_t lde, int o0, const T *xq, const ptrdiff_t *ent,
                              int Kd, const T *wk, int OCp)
{
    PT_DO(PT_DECL3)
    for (int k = 0; k < Kd; k++, wk += OCp) {
        const T *xs = xq + ent[k];
        K(rvec) x0 = K(rload)(xs), x1 = K(rload)(xs + RVL), x2 = K(rload)(xs + 2 * RVL);
        PT_DO(PT_FMA3)
    }
    PT_DO(PT_STORE3)
}

DP_INLINE void K(plane_tile1)(T *ye, ptrdiff_t lde, int o0, const T *xq, const ptrdiff_t *ent,
                              int Kd, const T *wk, int OCp)
{
    PT_DO(PT_DECL1)
    for (int k = 0; k < Kd; k++, wk += OCp) {
        K(rvec) x0 = K(rload)(xq + ent[k]);
        PT_DO(PT_FMA1)
    }
    PT_DO(PT_STORE1)
}

#undef PT_DECL3
#undef PT_DECL1
#undef PT_FMA3
#undef PT_FMA1
#undef PT_STORE3
#undef PT_STORE1
#undef PT_DO

int KV(dp_conv_plane)(T *ye, ptrdiff_t lde, const T *xq, const ptrdiff_t *ent, int Kd, const T *wt,
                      int OCp, ptrdiff_t Pe)
{
    // ye[o lde + p] = sum over k of wt[k OCp + o] xq[ent[k] + p], k ascending, for o < OCp
    // (a multiple of 8) and p < Pe rounded up to a whole vector (lde at least that); returns
    // 1 (nothing written) where the build does not take it
    if (!PL_BUILD || OCp % 8) return 1;
    ptrdiff_t p = 0;
    /* positions outer, filters inner: a tile's x (its rows of every channel) stays in L1
     * while the weights cycle */
    for (; p + PL_NV * RVL <= Pe; p += PL_NV * RVL)
        for (int o = 0; o < OCp; o += PL_NF)
            K(plane_tile3)(ye + p, lde, o, xq + p, ent, Kd, wt + o, OCp);
    for (; p < Pe; p += RVL)
        for (int o = 0; o < OCp; o += PL_NF)
            K(plane_tile1)(ye + p, lde, o, xq + p, ent, Kd, wt + o, OCp);
    return 0;
}

void KV(dp_conv_unext)(T *y, ptrdiff_t ldy, int W, int rs, int cs, ptrdiff_t off, const T *ye,
                       ptrdiff_t lde, int NO, int R, int Cn, int Wq, T beta)
{
    // y[o ldy + off + r rs W + s cs] = ye[o lde + r Wq + s] (+ beta y), o < NO, r < R, s < Cn:
    // the extended positions' valid columns, in place (cs = 1) or as one phase of a stride
    for (int o = 0; o < NO; o++)
        for (int r = 0; r < R; r++) {
            T *DP_RESTRICT d = y + o * ldy + off + (ptrdiff_t)r * rs * W;
            const T *DP_RESTRICT e = ye + o * lde + (ptrdiff_t)r * Wq;
            if (cs == 1) {
                if (beta != 0)
                    for (int j = 0; j < Cn; j++) d[j] = e[j] + beta * d[j];
                else
                    for (int j = 0; j < Cn; j++) d[j] = e[j];
            } else {
                for (int j = 0; j < Cn; j++) d[(ptrdiff_t)j * cs] = e[j];
            }
        }
}

void KV(dp_conv_to_planes)(T *xq, const T *x, int C, int H, int W, int S, int PA, int PB, int ph,
                           int pw, int Hq, int Wq, ptrdiff_t nq)
{
    // xq[((c PA + a) PB + b) Hq Wq + r Wq + s] = x[c, S r + a - ph, S s + b - pw], 0 outside
    // x, for the phases a < PA, b < PB (those a kernel reads); xq's elements from there to nq:
    // 0
    const K(rvec) zero = {0};
#ifndef __clang__
    K(rmask) even; /* lanes 2 l of (lo, hi) where hi starts at lo's lane RVL - 1 */
    for (int l = 0; l < RVL; l++) even[l] = (IT)(2 * l < RVL ? 2 * l : 2 * l + 1);
#endif
    /* x's rows in order (every phase's row r reads rows S r - ph ..: a strided layer's phases
     * from one pass over x, which the prefetchers follow); a strided layer's planes are
     * zeroed first with their tail, in whole vectors (the rows of phases in the order of x's
     * rows are not written in the order of memory: a row's last vector may not run into the
     * next, and the rows are often shorter than a vector) */
    ptrdiff_t i = 0;
    if (S > 1) {
        for (; i + RVL <= nq; i += RVL) K(rstore)(xq + i, zero);
        for (; i < nq; i++) xq[i] = 0;
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < Hq; r++)
            for (int a = 0; a < PA; a++) {
                int h = S * r + a - ph, inside = h >= 0 && h < H;
                const T *xr = inside ? x + ((ptrdiff_t)c * H + h) * W : x;
                for (int b = 0; b < PB; b++) {
                    T *at = xq + (((ptrdiff_t)(c * PA + a) * PB + b) * Hq + r) * Wq;
                    if (S == 1 && inside && Wq - pw >= RVL && W >= RVL) {
                        /* columns [pw, pw + W) of the row hold x's row, the rest 0: the
                         * zeros first (the last vector may run into the next row, written
                         * after, or the tail), then the row over them */
                        int m = Wq - pw < W ? Wq - pw : W;
                        for (int s = 0; s < pw; s += RVL) K(rstore)(at + s, zero);
                        for (int s = pw + m; s < Wq; s += RVL) K(rstore)(at + s, zero);
                        for (int s = 0; s + RVL < m; s += RVL)
                            K(rstore)(at + pw + s, K(rload)(xr + s));
                        K(rstore)(at + pw + m - RVL, K(rload)(xr + m - RVL));
                        continue;
                    }
                    /* stride 1: zeros over the row in whole vectors (the last one may run
                     * into the next row, written after, or the tail) */
                    int s = 0;
                    if (S == 1)
                        for (; s < Wq; s += RVL) K(rstore)(at + s, zero);
                    if (!inside) continue;
                    if (S == 1) { /* a row narrower than a vector (wider: above) */
                        int m = Wq - pw < W ? Wq - pw : W;
                        for (s = 0; s < m; s++) at[pw + s] = xr[s];
                        continue;
                    }
                    /* columns s with 0 <= S s + b - pw < W: [s0, s1) */
                    int s0 = pw - b > 0 ? (pw - b + S - 1) / S : 0;
                    int last = W - 1 + pw - b, s1 = last < 0 ? 0 : last / S + 1;
                    if (s1 > Wq) s1 = Wq;
                    const T *xs = xr + S * s0 + b - pw;
                    s = s0;
#ifndef __clang__
                    /* stride 2: a vector of every other value from two loads, the second
                     * from the first's last lane on, so that nothing past the last value
                     * taken is read (Clang has no permute with a mask of variables) */
                    if (S == 2)
                        for (; s + RVL <= s1; s += RVL, xs += 2 * RVL)
                            K(rstore)(at + s, __builtin_shuffle(K(rload)(xs),
                                                                K(rload)(xs + RVL - 1), even));
#endif
                    for (; s < s1; s++, xs += S) at[s] = *xs;
                }
            }
    if (S > 1) return;
    for (i = (ptrdiff_t)C * Hq * Wq; i + RVL <= nq; i += RVL) K(rstore)(xq + i, zero);
    for (; i < nq; i++) xq[i] = 0;
}

/* Winograd F(2x2, 3x3) for 3x3 kernels at stride 1 and padding 1 (dp_conv_wino_*): each
 * 2x2 block of outputs (a tile) is A^T [(G g G^T) . (B^T d B)] A from the tile's 4x4 input
 * patch d, so a channel pair costs 16 multiplies a tile, not 36. The tiles are the plane
 * path's extended positions over the input's 2 x 2 phases (dp_conv_to_planes at stride 2,
 * padding 1: tile p = i Wq + j, j < Wq, reads phase (r % 2, s % 2) at p + (r / 2) Wq + s / 2
 * for its d[r][s]); the 16 products, summed over channels, are dp_conv_plane with an entry a
 * channel, one call per product. */
void KV(dp_conv_wino_in)(T *V, ptrdiff_t ldv, const T *xq, int C, int Hq, int Wq, ptrdiff_t p0,
                         ptrdiff_t np)
{
    // V[(xi C + c) ldv + q] = (B^T d B)[xi / 4][xi % 4] of tile p0 + q of channel c, for
    // q < np rounded up to whole vectors; xq: the 2 x 2 phases (Hq x Wq each) of C channels
    ptrdiff_t pl = (ptrdiff_t)Hq * Wq;
    for (int c = 0; c < C; c++) {
        const T *ph[4];
        for (int f = 0; f < 4; f++) ph[f] = xq + (4 * (ptrdiff_t)c + f) * pl + p0;
        T *vc = V + (ptrdiff_t)c * ldv;
        for (ptrdiff_t q = 0; q < np; q += RVL) {
            K(rvec) t[4][4];
            for (int s = 0; s < 4; s++) { /* B^T on the patch's columns */
                const T *col = ph[s & 1] + q + (s >> 1);
                K(rvec) d0 = K(rload)(col), d1 = K(rload)(col + 2 * pl);
                K(rvec) d2 = K(rload)(col + Wq), d3 = K(rload)(col + 2 * pl + Wq);
                t[0][s] = d0 - d2;
                t[1][s] = d1 + d2;
                t[2][s] = d2 - d1;
                t[3][s] = d1 - d3;
            }
            for (int r = 0; r < 4; r++) { /* then B on its rows */
                T *at = vc + (ptrdiff_t)4 * r * C * ldv + q;
                K(rstore)(at, t[r][0] - t[r][2]);
                K(rstore)(at + (ptrdiff_t)C * ldv, t[r][1] + t[r][2]);
                K(rstore)(at + (ptrdiff_t)2 * C * ldv, t[r][2] - t[r][1]);
                K(rstore)(at + (ptrdiff_t)3 * C * ldv, t[r][1] - t[r][3]);
            }
        }
    }
}

void KV(dp_conv_wino_out)(T *y, ptrdiff_t ldy, const T *M, ptrdiff_t ldm, int OC, int OCp, int TH,
                          int TW, int W, int Wq, ptrdiff_t p0, ptrdiff_t np, T beta)
{
    // y[o ldy + (2 i + a) W + 2 j + b] = (A^T m A)[a][b] (+ beta y) for the tiles p0 + q =
    // i Wq + j (q < np, i < TH, j < TW), m[xi] = M[(xi OCp + o) ldm + q]; reads up to a
    // vector past M's last value used
#ifndef __clang__
    K(rmask) lo, hi; /* (a, 0) and (a, 1) of a vector of tiles interleaved: two output vectors */
    for (int l = 0; l < RVL; l++) {
        lo[l] = (IT)(l / 2 + (l % 2) * RVL);
        hi[l] = (IT)(RVL / 2 + l / 2 + (l % 2) * RVL);
    }
#endif
    /* tile row by tile row, so that a vector's tiles share one (the rows are Wq = TW + 1
     * tiles apart in M: a vector over M's positions would straddle two rows most times) */
    ptrdiff_t row = (ptrdiff_t)4 * OCp * ldm, pe = p0 + np;
    for (int o = 0; o < OC; o++) {
        T *yo = y + (ptrdiff_t)o * ldy;
        for (int i = (int)(p0 / Wq); i < TH && (ptrdiff_t)i * Wq < pe; i++) {
            ptrdiff_t rb = (ptrdiff_t)i * Wq;
            int jb = rb < p0 ? (int)(p0 - rb) : 0, je = pe - rb < TW ? (int)(pe - rb) : TW;
            for (int j = jb; j < je; j += RVL) {
                K(rvec) u0[4], u1[4];
                for (int s = 0; s < 4; s++) { /* A^T on the columns */
                    const T *m = M + ((ptrdiff_t)s * OCp + o) * ldm + rb + j - p0;
                    K(rvec) m0 = K(rload)(m), m1 = K(rload)(m + row), m2 = K(rload)(m + 2 * row);
                    K(rvec) m3 = K(rload)(m + 3 * row);
                    u0[s] = m0 + m1 + m2;
                    u1[s] = m1 - m2 - m3;
                }
                K(rvec) y00 = u0[0] + u0[1] + u0[2], y01 = u0[1] - u0[2] - u0[3];
                K(rvec) y10 = u1[0] + u1[1] + u1[2], y11 = u1[1] - u1[2] - u1[3];
                int n = je - j < RVL ? je - j : RVL;
                T *at = yo + (ptrdiff_t)2 * i * W + 2 * j;
#ifndef __clang__
                if (n == RVL || n == RVL / 2) {
                    /* the tiles' two output rows, interleaved: 2 n values each, whole
                     * vectors (half the tiles: the first vector of each row) */
                    K(rvec) r0 = __builtin_shuffle(y00, y01, lo);
                    K(rvec) r1 = __builtin_shuffle(y10, y11, lo);
                    if (beta != 0) {
                        r0 += beta * K(rload)(at);
                        r1 += beta * K(rload)(at + W);
                    }
                    K(rstore)(at, r0);
                    K(rstore)(at + W, r1);
                    if (n == RVL / 2) continue;
                    r0 = __builtin_shuffle(y00, y01, hi);
                    r1 = __builtin_shuffle(y10, y11, hi);
                    if (beta != 0) {
                        r0 += beta * K(rload)(at + RVL);
                        r1 += beta * K(rload)(at + W + RVL);
                    }
                    K(rstore)(at + RVL, r0);
                    K(rstore)(at + W + RVL, r1);
                    continue;
                }
#endif
                T out[4][RVL]; /* (a, b): the tiles' outputs, then to their places in y */
                K(rstore)(out[0], y00);
                K(rstore)(out[1], y01);
                K(rstore)(out[2], y10);
                K(rstore)(out[3], y11);
                for (int l = 0; l < n; l++) {
                    T *a = at + 2 * l;
                    if (beta != 0) {
                        a[0] = out[0][l] + beta * a[0];
                        a[1] = out[1][l] + beta * a[1];
                        a[W] = out[2][l] + beta * a[W];
                        a[W + 1] = out[3][l] + beta * a[W + 1];
                    } else {
                        a[0] = out[0][l];
                        a[1] = out[1][l];
                        a[W] = out[2][l];
                        a[W + 1] = out[3][l];
                    }
                }
            }
        }
    }
}

#undef PL_NF
#undef PL_NV

#undef DW_NO
#undef DW_NK
#undef DW_KDO
#undef DW_KDO3
#undef DW_TILE
#undef DW_DECL
#undef DW_FMA
#undef DW_ADD
#undef DW_STEP

#undef DT_DECL
#undef DT_FMA
#undef DT_STORE
#undef DT_DO4
#undef DT_DO6
#undef DT_DO12
#undef DT_BODY
#undef DIRECT_K
#undef DIRECT_BUILD
#undef PL_BUILD
#undef RVL

#ifndef DP_VEC_PASS
/* A 1x1 kernel without padding: the patch matrix is the image itself. */
DP_INLINE int K(is_direct)(const dp_conv_geom *g)
{ return g->KH == 1 && g->KW == 1 && g->pad == 0 && dp_conv_stride(g) == 1; }

/* The output block of an image call: 1 <= oh <= OH, 1 <= ow <= OW; sets P = oh ow. */
DP_INLINE int K(check_block)(const dp_conv_geom *g, int oh, int ow, int *P)
{
    int OH, OW;
    if (dp_conv_out(g, &OH, &OW) || oh < 1 || ow < 1 || oh > OH || ow > OW) return DP_EVALUE;
    *P = oh * ow;
    return DP_OK;
}

/* The offset tables of dp_gemm_patch for an output block without padding, in col's space
 * (K P values of T, which im2col would fill): pos[p] the offset in x of output position
 * p = i ow + j's patch (ST (i W + j)), ent[k] that of patch entry k = (c KH + u) KW + v
 * ((c H + u) W + v). 0 where they do not fit (or col is not aligned for them), or where the
 * patch path is not taken: padding (its zeros are not in x), one filter, one patch entry or
 * one output position (dp_gemm's matrix-vector path sums in another order), a context of
 * several threads (dp_gemm splits the work). */
static int K(patch_tables)(const dp_ctx *ctx, const dp_conv_geom *g, int oh, int ow, T *col,
                           ptrdiff_t **pos, ptrdiff_t **ent)
{
    size_t P = (size_t)oh * ow, Kd = (size_t)g->C * g->KH * g->KW;
    if (g->pad != 0 || g->OC < 2 || Kd < 2 || P < 2 || (ctx && ctx->threads > 1) ||
        (P + Kd) * sizeof(ptrdiff_t) > Kd * P * sizeof(T) ||
        (uintptr_t)(void *)col % sizeof(ptrdiff_t) != 0)
        return 0;
    *pos = (ptrdiff_t *)(void *)col;
    *ent = *pos + P;
    ptrdiff_t st = dp_conv_stride(g);
    for (int i = 0, p = 0; i < oh; i++)
        for (int j = 0; j < ow; j++, p++) (*pos)[p] = i * st * g->W + j * st;
    for (int k = 0; k < (int)Kd; k++) (*ent)[k] = K(entry_offset)(g, k);
    return 1;
}

/* ---- the plane path (dp_conv_plane): geometry, layout of the scratch, packing ------------ */

/* The planes of an input (C, H, W) read at stride S: PA x PB phases a channel (those some
 * kernel row / column reads), each Hq x Wq: phase (a, b) row r column s holds x[S r + a - ph,
 * S s + b - pw] (0 outside x; Hq and Wq may cut x short or pad it past its end); nq: their
 * elements and a zero tail that the tiles' last vectors may read into (garbage positions). */
typedef struct {
    int C, H, W, S, PA, PB, ph, pw, Hq, Wq;
    ptrdiff_t nq;
} K(planes);

static void K(planes_set)(K(planes) * q, int C, int H, int W, int S, int PA, int PB, int ph, int pw,
                          int Hq, int Wq)
{
    q->C = C, q->H = H, q->W = W, q->S = S, q->PA = PA, q->PB = PB, q->ph = ph, q->pw = pw;
    q->Hq = Hq, q->Wq = Wq;
    q->nq = (ptrdiff_t)C * PA * PB * Hq * Wq + Wq + 64;
}

DP_INLINE void K(to_planes)(T *xq, const T *x, const K(planes) * q)
{
    K(dp_conv_to_planes)(xq, x, q->C, q->H, q->W, q->S, q->PA, q->PB, q->ph, q->pw, q->Hq, q->Wq,
                         q->nq);
}

/* Elements of T that n offsets take, rounded up to 64 bytes. */
DP_INLINE size_t K(pl_table_elems)(size_t n)
{ return (n * sizeof(ptrdiff_t) + 63) / 64 * (64 / sizeof(T)); }

DP_INLINE ptrdiff_t K(lde)(ptrdiff_t Pe) { return (Pe + 15) / 16 * 16; }
DP_INLINE int K(up8)(int n) { return (n + 7) / 8 * 8; }

/* The forward's planes: the layer's padding and stride, OH + (KH - 1) / S rows of phases (a
 * kernel row u reads phase u % S from row u / S on) */
static void K(fw_planes)(K(planes) * q, const dp_conv_geom *g, int OH, int OW)
{
    int S = dp_conv_stride(g);
    K(planes_set)(q, g->C, g->H, g->W, S, S < g->KH ? S : g->KH, S < g->KW ? S : g->KW, g->pad,
                  g->pad, OH + (g->KH - 1) / S, OW + (g->KW - 1) / S);
}

/* ent[k]: the offset of patch entry k = (c KH + u) KW + v in the forward's planes */
static void K(fw_entries)(ptrdiff_t *ent, const K(planes) * q, const dp_conv_geom *g)
{
    int S = q->S, k = 0;
    for (int c = 0; c < g->C; c++)
        for (int u = 0; u < g->KH; u++)
            for (int v = 0; v < g->KW; v++)
                ent[k++] =
                    (((ptrdiff_t)(c * q->PA + u % S) * q->PB + v % S) * q->Hq + u / S) * q->Wq +
                    v / S;
}

/* The input gradient, phase by phase: dx[c, h, q] with h + PAD = S r + a, q + PAD = S s + b
 * gets the terms of kernel rows u = a + S tu (tu <= TU) and columns v = b + S tv, from dy at
 * (r - tu, s - tv): phase (a, b) of dx is a stride-1 convolution of dy (each output channel
 * o an input channel) with those taps, over its rows [r0, r1) and columns [s0, s1) (those
 * inside dx). At stride 1, one phase: the kernel flipped. All phases read one set of dy
 * planes (stride 1, padding ph on top, pw on the left, Hq x Wq). */
typedef struct {
    int TU, TV, r0, r1, s0, s1;
} K(dxphase);

typedef struct {
    K(planes) q;
    K(dxphase) ph[DP_CONV_MAX_STRIDE_PHASES];
    int zero; /* a phase without taps: dx is cleared first */
    int taps; /* the most taps of a phase: OC (TU + 1) (TV + 1) */
    ptrdiff_t lde;
} K(dxplan);

static int K(dx_plan)(K(dxplan) * d, const dp_conv_geom *g, int OH, int OW)
{
    int S = dp_conv_stride(g), pad = g->pad, ph = 0, pw = 0, r1max = 0, s1max = 0;
    if (S * S > DP_CONV_MAX_STRIDE_PHASES) return 1;
    d->zero = 0;
    d->taps = 0;
    d->lde = 0;
    for (int a = 0; a < S; a++)
        for (int b = 0; b < S; b++) {
            K(dxphase) *f = &d->ph[a * S + b];
            f->TU = a <= g->KH - 1 ? (g->KH - 1 - a) / S : -1;
            f->TV = b <= g->KW - 1 ? (g->KW - 1 - b) / S : -1;
            int lh = g->H - 1 + pad - a, lw = g->W - 1 + pad - b;
            f->r0 = pad > a ? (pad - a + S - 1) / S : 0;
            f->s0 = pad > b ? (pad - b + S - 1) / S : 0;
            f->r1 = lh < 0 ? 0 : lh / S + 1;
            f->s1 = lw < 0 ? 0 : lw / S + 1;
            if (f->r1 <= f->r0 || f->s1 <= f->s0) continue; /* no dx value in this phase */
            if (f->TU < 0 || f->TV < 0) {
                d->zero = 1;
                continue;
            }
            if (f->TU - f->r0 > ph) ph = f->TU - f->r0;
            if (f->TV - f->s0 > pw) pw = f->TV - f->s0;
            if (f->r1 > r1max) r1max = f->r1;
            if (f->s1 > s1max) s1max = f->s1;
            int taps = g->OC * (f->TU + 1) * (f->TV + 1);
            if (taps > d->taps) d->taps = taps;
        }
    K(planes_set)(&d->q, g->OC, OH, OW, 1, 1, 1, ph, pw, r1max + ph, s1max + pw);
    for (int f = 0; f < S * S; f++) {
        const K(dxphase) *e = &d->ph[f];
        if (e->r1 > e->r0 && e->s1 > e->s0 && e->TU >= 0 && e->TV >= 0) {
            ptrdiff_t l = K(lde)((ptrdiff_t)(e->r1 - e->r0) * d->q.Wq);
            if (l > d->lde) d->lde = l;
        }
    }
    return 0;
}

/* Whether a layer takes the plane path: float (the plane kernel's builds), a kernel larger
 * than 1x1 or a padding or a stride (a plain 1x1 has no patch to gather), not the first-layer
 * direct forward's layers (pad 0, stride 1, K <= DIRECT_K: that path stays), the full output
 * (a pooled block's top-left part keeps im2col) and the active build's kernel (the probe:
 * an empty call). */
static int K(pl_takes)(const dp_ctx *ctx, const dp_conv_geom *g, int oh, int ow)
{
    int OH, OW;
    if (sizeof(T) != 4 || (ctx && ctx->bf16_inputs) || dp_conv_out(g, &OH, &OW) || oh != OH ||
        ow != OW)
        return 0;
    if (g->KH == 1 && g->KW == 1 && g->pad == 0 && dp_conv_stride(g) == 1) return 0;
    if (g->pad == 0 && dp_conv_stride(g) == 1 && g->C * g->KH * g->KW <= 64) return 0;
    return K(dp_conv_plane)(NULL, 0, NULL, NULL, 0, NULL, 8, 0) == 0;
}

/* Whether the plane path's forward is Winograd's F(2x2, 3x3) (dp_conv_wino_in): float, a 3x3
 * kernel at stride 1 with padding 1 (the output the input's size), an even height and width
 * (whole 2x2 tiles), and 16 input channels or more: each product is then a sum over C
 * channels; with 8 the transforms and the plane kernel's short tiles cost more than the
 * multiplies saved (bench/README.md, "Winograd") */
DP_INLINE int K(wino_geom)(const dp_conv_geom *g)
{
    return sizeof(T) == 4 && g->KH == 3 && g->KW == 3 && g->pad == 1 && dp_conv_stride(g) == 1 &&
           g->H % 2 == 0 && g->W % 2 == 0;
}

DP_INLINE int K(wino_takes)(const dp_conv_geom *g) { return K(wino_geom)(g) && g->C >= 16; }

/* The input gradient of such a layer is the same convolution of dy (OC channels) with the
 * kernel flipped and transposed: Winograd's where OC >= 16 */
DP_INLINE int K(wino_dx_takes)(const dp_conv_geom *g) { return K(wino_geom)(g) && g->OC >= 16; }

/* The tiles a pass of the Winograd forward transforms: as many as keep its 16 products (V:
 * C rows of them, M: up8(OC) rows) within 128 KB, so that they stay in L2 beside the weights
 * and the planes on a 512 KB L2 (Zen 3's; 96 tiles, 392 KB at 32 channels, spilled there:
 * bench/README.md, "Winograd"), at most 96 and at least one unit, fewer where the image
 * has fewer, in whole units of the plane kernel's tiles (unit: 3 vectors, 24 on AVX2, 48 on
 * AVX-512): no vector runs past a row */
DP_INLINE ptrdiff_t K(wino_chunk)(const dp_conv_geom *g, int unit)
{
    ptrdiff_t Pe = (ptrdiff_t)(g->H / 2) * (g->W / 2 + 1);
    ptrdiff_t n = 2048 / (K(up8)(g->C) + K(up8)(g->OC)) / unit * unit;
    if (n > 96) n = 96 / unit * unit;
    if (n < unit) n = unit;
    return Pe < n ? (Pe + unit - 1) / unit * unit : n;
}

/* The rows of V and M: a pass's tiles rounded up to 48, a multiple of every build's vector.
 * The scratch holds the longer of the two units' rows: they are not ordered (at 24 channels
 * in all, 2048 / 24 is 72 tiles on AVX2, 96 long, and 48 on AVX-512) */
DP_INLINE ptrdiff_t K(wino_ldv)(const dp_conv_geom *g, int unit)
{ return (K(wino_chunk)(g, unit) + 47) / 48 * 48; }

DP_INLINE size_t K(pack_base_elems)(const dp_conv_geom *g)
{
    size_t taps = (size_t)g->KH * g->KW;
    return taps * ((size_t)g->C * K(up8)(g->OC) + (size_t)g->OC * K(up8)(g->C));
}

/* Where the packed weights hold Winograd's transformed ones: the forward's (16 C up8(OC))
 * after the plane path's, then the input gradient's (16 OC up8(C)); the offset of the
 * forward's (dx 0), the input gradient's (dx 1), or (dx 2) the end */
DP_INLINE size_t K(wino_offset)(const dp_conv_geom *g, int dx)
{
    size_t at = K(pack_base_elems)(g);
    if (dx >= 1 && K(wino_takes)(g)) at += (size_t)16 * g->C * K(up8)(g->OC);
    if (dx >= 2 && K(wino_dx_takes)(g)) at += (size_t)16 * g->OC * K(up8)(g->C);
    return at;
}

size_t K(dp_conv_pack_elems)(const dp_conv_geom *g)
{
    int OH, OW;
    if (dp_conv_out(g, &OH, &OW)) return 0;
    return K(wino_offset)(g, 2);
}

/* Winograd's U[xi][c][o] = (G g G^T)[xi / 4][xi % 4] of the 3x3 kernel g from channel c to
 * filter o (o < up8(OC), 0 past OC), G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], in double
 * and rounded once. g is w[o, c] of w (OC, C, 3, 3) (dx 0), or, for the input gradient (dx
 * 1), w[c, o] rotated by 180 degrees, of w (C, OC, 3, 3): the kernel flipped and transposed. */
static void K(wino_pack)(T *U, const T *w, int C, int OC, int dx)
{
    int OCp = K(up8)(OC);
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OCp; o++) {
            double gg[3][3], t[4][3];
            for (int u = 0; u < 3; u++)
                for (int v = 0; v < 3; v++) {
                    ptrdiff_t at = dx ? (((ptrdiff_t)c * OC + o) * 3 + 2 - u) * 3 + 2 - v
                                      : (((ptrdiff_t)o * C + c) * 3 + u) * 3 + v;
                    gg[u][v] = o < OC ? (double)w[at] : 0.0;
                }
            for (int v = 0; v < 3; v++) {
                t[0][v] = gg[0][v];
                t[1][v] = (gg[0][v] + gg[1][v] + gg[2][v]) / 2;
                t[2][v] = (gg[0][v] - gg[1][v] + gg[2][v]) / 2;
                t[3][v] = gg[2][v];
            }
            for (int r = 0; r < 4; r++) {
                double u4[4] = {t[r][0], (t[r][0] + t[r][1] + t[r][2]) / 2,
                                (t[r][0] - t[r][1] + t[r][2]) / 2, t[r][2]};
                for (int s4 = 0; s4 < 4; s4++)
                    U[((ptrdiff_t)(4 * r + s4) * C + c) * OCp + o] = (T)u4[s4];
            }
        }
}

void K(dp_conv_pack)(T *wp, const T *w, const dp_conv_geom *g)
{
    // wp = [wt (K, OCp): w transposed, the forward's] [the input gradient's, phase by phase
    // (a, b), its taps (o, tu, tv) a row of Cp: w[o, c, a + S tu, b + S tv]], the channel
    // counts rounded up to 8 with zeros
    int Kd = g->C * g->KH * g->KW, OCp = K(up8)(g->OC), Cp = K(up8)(g->C), S = dp_conv_stride(g);
    int KH = g->KH, KW = g->KW;
    T *wt = wp, *wd = wp + (size_t)Kd * OCp;
    for (int k = 0; k < Kd; k++)
        for (int o = 0; o < OCp; o++)
            wt[(ptrdiff_t)k * OCp + o] = o < g->OC ? w[(ptrdiff_t)o * Kd + k] : (T)0;
    for (int a = 0; a < S && a < KH; a++)
        for (int b = 0; b < S && b < KW; b++)
            for (int o = 0; o < g->OC; o++)
                for (int u = a; u < KH; u += S)
                    for (int v = b; v < KW; v += S, wd += Cp)
                        for (int c = 0; c < Cp; c++)
                            wd[c] =
                                c < g->C ? w[(((ptrdiff_t)o * g->C + c) * KH + u) * KW + v] : (T)0;
    if (K(wino_takes)(g)) K(wino_pack)(wp + K(wino_offset)(g, 0), w, g->C, g->OC, 0);
    if (K(wino_dx_takes)(g)) K(wino_pack)(wp + K(wino_offset)(g, 1), w, g->OC, g->C, 1);
}

/* Scratch of the forward (ent, planes, ye), the weight gradient (ent, pos, planes) and the
 * input gradient (its taps' table, dy's planes, ye) */
static size_t K(fw_elems)(const K(planes) * q, int Kd, int OCp, int OH)
{
    return K(pl_table_elems)((size_t)Kd) + (size_t)q->nq +
           (size_t)OCp * K(lde)((ptrdiff_t)OH * q->Wq);
}

size_t K(dp_conv_plane_elems)(const dp_conv_geom *g)
{
    // the scratch the plane path needs beside the packed weights (0: a bad geometry)
    int OH, OW, Kd = g->C * g->KH * g->KW;
    if (K(dp_conv_pack_elems)(g) == 0 || dp_conv_out(g, &OH, &OW)) return 0;
    K(planes) fw;
    K(dxplan) dx;
    K(fw_planes)(&fw, g, OH, OW);
    size_t n = K(fw_elems)(&fw, Kd, K(up8)(g->OC), OH), m;
    m = K(pl_table_elems)((size_t)Kd + (size_t)OH * OW) + (size_t)fw.nq;
    if (m > n) n = m;
    if (K(dx_plan)(&dx, g, OH, OW) == 0) {
        m = K(pl_table_elems)((size_t)dx.taps) + (size_t)dx.q.nq + (size_t)K(up8)(g->C) * dx.lde;
        if (m > n) n = m;
    }
    for (int dxs = 0; dxs < 2; dxs++) { /* ent, the 2 x 2 phases, V and M of a chunk */
        if (!(dxs ? K(wino_dx_takes)(g) : K(wino_takes)(g))) continue;
        int C = dxs ? g->OC : g->C, OC = dxs ? g->C : g->OC;
        K(planes) q;
        K(planes_set)(&q, C, g->H, g->W, 2, 2, 2, 1, 1, g->H / 2 + 1, g->W / 2 + 1);
        ptrdiff_t l24 = K(wino_ldv)(g, 24), l48 = K(wino_ldv)(g, 48);
        m = K(pl_table_elems)((size_t)C) + (size_t)q.nq +
            (size_t)16 * (size_t)(l24 > l48 ? l24 : l48) * ((size_t)C + K(up8)(OC)) + 64;
        if (m > n) n = m;
    }
    return n;
}

/* The Winograd forward (K(wino_takes)) of C channels to OC: y (OC, H W) = conv(x) + beta y,
 * U the packed transformed weights (dp_conv_pack); g gives the maps' size and the chunk. The
 * input gradient (K(wino_dx_takes)) is this with C and OC swapped, x dy, y dx. */
static void K(wino_forward)(T *scratch, T *y, const T *x, const T *U, const dp_conv_geom *g, int C,
                            int OC, T beta)
{
    /* ldc tiles a pass, in whole 3-vector tiles of the plane kernel on this ISA; rows of V and
     * M ldv long, a multiple of every build's vector (a build whose unit is not ldc's still
     * writes whole vectors inside its row) */
    int OCp = K(up8)(OC), TH = g->H / 2, TW = g->W / 2;
    ptrdiff_t Pe = (ptrdiff_t)TH * (TW + 1);
    int unit = dp_isa_bits(dp_isa_active()) >= 512 ? 48 : 24;
    ptrdiff_t ldc = K(wino_chunk)(g, unit), ldv = K(wino_ldv)(g, unit);
    K(planes) q;
    K(planes_set)(&q, C, g->H, g->W, 2, 2, 2, 1, 1, TH + 1, TW + 1);
    ptrdiff_t *ent = (ptrdiff_t *)(void *)scratch;
    T *xq = scratch + K(pl_table_elems)((size_t)C), *V = xq + q.nq;
    T *M = V + (ptrdiff_t)16 * C * ldv;
    for (int c = 0; c < C; c++) ent[c] = (ptrdiff_t)c * ldv;
    K(to_planes)(xq, x, &q);
    for (ptrdiff_t p0 = 0; p0 < Pe; p0 += ldc) {
        ptrdiff_t np = Pe - p0 < ldc ? Pe - p0 : ldc;
        /* whole chunks for the products (the last chunk's tiles past Pe are garbage that
         * dp_conv_wino_out leaves) */
        K(dp_conv_wino_in)(V, ldv, xq, C, q.Hq, q.Wq, p0, ldc);
        for (int xi = 0; xi < 16; xi++)
            K(dp_conv_plane)(M + (ptrdiff_t)xi * OCp * ldv, ldv, V + (ptrdiff_t)xi * C * ldv, ent,
                             C, U + (ptrdiff_t)xi * C * OCp, OCp, ldc);
        K(dp_conv_wino_out)(y, (ptrdiff_t)g->H * g->W, M, ldv, OC, OCp, TH, TW, g->W, q.Wq, p0, np,
                            beta);
    }
}

/* The forward on the planes: y (OC, OH OW) = conv(x) + beta y */
static void K(pl_forward)(T *scratch, T *y, const T *x, const T *wt, const dp_conv_geom *g, int OH,
                          int OW, T beta)
{
    if (K(wino_takes)(g)) {
        K(wino_forward)(scratch, y, x, wt + K(wino_offset)(g, 0), g, g->C, g->OC, beta);
        return;
    }
    int Kd = g->C * g->KH * g->KW, OCp = K(up8)(g->OC);
    K(planes) q;
    K(fw_planes)(&q, g, OH, OW);
    ptrdiff_t *ent = (ptrdiff_t *)(void *)scratch, Pe = (ptrdiff_t)OH * q.Wq, lde = K(lde)(Pe);
    T *xq = scratch + K(pl_table_elems)((size_t)Kd), *ye = xq + q.nq;
    K(fw_entries)(ent, &q, g);
    K(to_planes)(xq, x, &q);
    K(dp_conv_plane)(ye, lde, xq, ent, Kd, wt, OCp, Pe);
    K(dp_conv_unext)(y, (ptrdiff_t)OH * OW, OW, 1, 1, 0, ye, lde, g->OC, OH, OW, q.Wq, beta);
}

/* The input gradient on dy's planes, phase by phase (dx written) */
static void K(pl_dx)(T *scratch, T *dx, const T *dy, const T *wd, const dp_conv_geom *g,
                     const K(dxplan) * d)
{
    int S = dp_conv_stride(g), Cp = K(up8)(g->C), Wq = d->q.Wq, Hq = d->q.Hq;
    ptrdiff_t *ent = (ptrdiff_t *)(void *)scratch;
    T *xq = scratch + K(pl_table_elems)((size_t)d->taps), *ye = xq + d->q.nq;
    if (d->zero) memset(dx, 0, sizeof(T) * (size_t)g->C * g->H * g->W);
    K(to_planes)(xq, dy, &d->q);
    for (int a = 0; a < S && a < g->KH; a++)
        for (int b = 0; b < S && b < g->KW; b++) {
            const K(dxphase) *f = &d->ph[a * S + b];
            int n = 0, R = f->r1 - f->r0, Cn = f->s1 - f->s0;
            int taps = g->OC * (f->TU + 1) * (f->TV + 1);
            if (R > 0 && Cn > 0) {
                for (int o = 0; o < g->OC; o++)
                    for (int tu = 0; tu <= f->TU; tu++)
                        for (int tv = 0; tv <= f->TV; tv++)
                            ent[n++] = ((ptrdiff_t)o * Hq + d->q.ph - tu) * Wq + d->q.pw - tv;
                ptrdiff_t Pe = (ptrdiff_t)R * Wq, lde = K(lde)(Pe);
                K(dp_conv_plane)(ye, lde, xq + (ptrdiff_t)f->r0 * Wq + f->s0, ent, n, wd, Cp, Pe);
                ptrdiff_t off = (ptrdiff_t)(S * f->r0 + a - g->pad) * g->W + S * f->s0 + b - g->pad;
                K(dp_conv_unext)(dx, (ptrdiff_t)g->H * g->W, g->W, S, S, off, ye, lde, g->C, R, Cn,
                                 Wq, (T)0);
            }
            wd += (size_t)taps * Cp; /* the next phase's weights */
        }
}

int K(dp_conv_image_forward)(dp_ctx *ctx, T *col, T *y, const T *x, const T *w, const T *wp,
                             const dp_conv_geom *g, int oh, int ow, T beta)
{
    // x is (C, H, W), w is (OC, K), y is (OC, oh ow): y = w col(x) + beta y over the output
    // block i < oh, j < ow
    int P;
    if (K(check_block)(g, oh, ow, &P)) return DP_EVALUE;
    int Kd = g->C * g->KH * g->KW;
    const T *cx = x;
    int bf16 = ctx && ctx->bf16_inputs && sizeof(T) == sizeof(float);
    if (!bf16 && K(dp_conv_direct_forward)(y, x, w, g, oh, ow, beta) == 0) return DP_OK;
    if (wp && K(pl_takes)(ctx, g, oh, ow)) {
        K(pl_forward)(col, y, x, wp, g, oh, ow, beta);
        return DP_OK;
    }
    if (!K(is_direct)(g) || oh * ow != g->H * g->W) {
        K(dp_im2col)(col, P, x, g, oh, ow);
        cx = col;
    }
    return K(dp_gemm)(ctx, y, P, w, Kd, 1, cx, P, 1, g->OC, P, Kd, (T)1, beta);
}

int K(dp_conv_image_backward)(dp_ctx *ctx, T *col, T *dwt, T *dx, const T *dy, const T *x,
                              const T *w, const T *wp, const dp_conv_geom *g, int oh, int ow)
{
    // dy is (OC, oh ow) (the output block i < oh, j < ow; the rest of the output has no
    // gradient), x is (C, H, W), w is (OC, K), dwt is (K, OC): dwt += col(x) dy^T (the
    // transpose of dw's gradient); dx (C, H, W) = col2im(w^T dy) when given
    int P;
    if (K(check_block)(g, oh, ow, &P)) return DP_EVALUE;
    int Kd = g->C * g->KH * g->KW, direct = K(is_direct)(g) && oh * ow == g->H * g->W;
    int bf16 = ctx && ctx->bf16_inputs && sizeof(T) == sizeof(float), rc = DP_OK;
    int planes = wp && K(pl_takes)(ctx, g, oh, ow);
    /* the direct kernel where it runs, with dx or without (dw the same bits either way) */
    if (bf16 || K(dp_conv_direct_dwt)(dwt, dy, x, g, oh, ow) != 0) {
        ptrdiff_t *pos, *ent;
        /* dw^T = col dy^T rather than dw = dy col^T: the big operand, col, is then packed
         * along its rows (A's fast path) instead of transposed column by column into B
         * panels, and M = K, N = OC fill the 6 x 16 tiles better (288 x 64: no padding) */
        if (planes && (!ctx || ctx->threads <= 1) && g->OC > 1 && Kd > 1 && P > 1) {
            /* col(x)'s rows read from x's planes (padding and stride laid out there) */
            K(planes) q;
            K(fw_planes)(&q, g, oh, ow);
            ent = (ptrdiff_t *)(void *)col;
            pos = ent + Kd;
            T *xq = col + K(pl_table_elems)((size_t)Kd + (size_t)P);
            K(fw_entries)(ent, &q, g);
            for (int i = 0, p = 0; i < oh; i++)
                for (int j = 0; j < ow; j++, p++) pos[p] = (ptrdiff_t)i * q.Wq + j;
            K(to_planes)(xq, x, &q);
            rc =
                K(dp_gemm_patch)(ctx, dwt, g->OC, xq, ent, pos, dy, 1, P, Kd, g->OC, P, (T)1, (T)1);
        } else if (!bf16 && !direct && K(patch_tables)(ctx, g, oh, ow, col, &pos, &ent)) {
            /* col(x)'s rows read from x where they are: the same sums as on im2col's copy,
             * without writing the copy */
            rc = K(dp_gemm_patch)(ctx, dwt, g->OC, x, ent, pos, dy, 1, P, Kd, g->OC, P, (T)1, (T)1);
        } else {
            if (!direct) K(dp_im2col)(col, P, x, g, oh, ow);
            rc = K(dp_gemm)(ctx, dwt, g->OC, direct ? x : col, P, 1, dy, 1, P, Kd, g->OC, P, (T)1,
                            (T)1);
        }
    }
    if (rc || !dx) return rc;
    K(dxplan) d;
    if (planes && K(wino_dx_takes)(g)) {
        K(wino_forward)(col, dx, dy, wp + K(wino_offset)(g, 1), g, g->OC, g->C, (T)0);
        return DP_OK;
    }
    if (planes && K(dx_plan)(&d, g, oh, ow) == 0) { /* dx: dy's planes, phase by phase */
        K(pl_dx)(col, dx, dy, wp + (size_t)Kd * K(up8)(g->OC), g, &d);
        return DP_OK;
    }
    /* dcol (K, P) = w^T dy; col(x) is no longer needed, so dcol takes its place */
    T *dcol = direct ? dx : col;
    rc = K(dp_gemm)(ctx, dcol, P, w, 1, Kd, dy, P, 1, Kd, P, g->OC, (T)1, (T)0);
    if (rc == DP_OK && !direct) K(dp_col2im)(dx, dcol, P, g, oh, ow);
    return rc;
}

void K(dp_conv_add_dwt)(T *dw, const T *dwt, const dp_conv_geom *g)
{
    // dw is (OC, K), dwt is (K, OC): dw += dwt^T
    int Kd = g->C * g->KH * g->KW, OC = g->OC;
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < Kd; k++) dw[(ptrdiff_t)o * Kd + k] += dwt[(ptrdiff_t)k * OC + o];
}

size_t K(dp_conv_scratch_elems)(const dp_conv_geom *g)
{
    size_t n = dp_conv_col_elems(g), m = K(dp_conv_plane_elems)(g);
    return m > n ? m : n;
}

/* The scratch of a batch call (the caller's, or a local one): the image calls' scratch, then
 * the packed weights, then (extra > 0) `extra` more elements; *wp: the packed weights (w
 * packed into them). */
static T *K(conv_scratch)(dp_scratch *cs, dp_scratch *local, const dp_conv_geom *g, const T *w,
                          T **wp, size_t extra)
{
    size_t n = K(dp_conv_scratch_elems)(g), np = K(dp_conv_pack_elems)(g);
    T *col = dp_scratch_get(cs ? cs : local, sizeof(T) * (n + np + extra + 1));
    if (col) {
        *wp = col + n;
        K(dp_conv_pack)(*wp, w, g);
    }
    return col;
}

int K(dp_conv2d_forward)(dp_ctx *ctx, dp_scratch *col_scratch, T *y, const T *x, const T *w,
                         const T *b, int B, const dp_conv_geom *g)
{
    // x is (B, C, H, W), w is (OC, C, KH, KW), b is (OC,), y is (B, OC, OH, OW)
    int OH, OW;
    if (dp_conv_out(g, &OH, &OW)) return DP_EVALUE;
    ptrdiff_t P = (ptrdiff_t)OH * OW, in = (ptrdiff_t)g->C * g->H * g->W, out = g->OC * P;
    dp_scratch local = {0};
    T *wp;
    T *col = K(conv_scratch)(col_scratch, &local, g, w, &wp, 0);
    if (!col) return DP_ENOMEM;
    int rc = DP_OK;
    for (int n = 0; n < B && rc == DP_OK; n++) {
        T *yn = y + n * out;
        for (int o = 0; o < g->OC; o++)
            for (ptrdiff_t p = 0; p < P; p++) yn[o * P + p] = b[o];
        rc = K(dp_conv_image_forward)(ctx, col, yn, x + n * in, w, wp, g, OH, OW, (T)1);
    }
    dp_scratch_free(&local);
    return rc;
}

int K(dp_conv2d_backward)(dp_ctx *ctx, dp_scratch *col_scratch, T *dw, T *db, T *dx, const T *dy,
                          const T *x, const T *w, int B, const dp_conv_geom *g)
{
    // dy is (B, OC, OH, OW), x and dx are (B, C, H, W), w and dw are (OC, C, KH, KW):
    // dw += sum_n dy_n col(x_n)^T, db += sum of dy over n, i, j, dx_n = col2im(w^T dy_n)
    int OH, OW;
    if (dp_conv_out(g, &OH, &OW)) return DP_EVALUE;
    ptrdiff_t P = (ptrdiff_t)OH * OW, in = (ptrdiff_t)g->C * g->H * g->W, out = g->OC * P;
    size_t nw = (size_t)g->OC * g->C * g->KH * g->KW;
    dp_scratch local = {0};
    T *wp;
    T *col = K(conv_scratch)(col_scratch, &local, g, w, &wp, nw);
    if (!col) return DP_ENOMEM;
    T *dwt = wp + K(dp_conv_pack_elems)(g); /* dw^T, (K, OC), summed over the batch */
    memset(dwt, 0, sizeof(T) * nw);
    int rc = DP_OK;
    for (int n = 0; n < B && rc == DP_OK; n++) {
        const T *dyn = dy + n * out;
        /* 8 interleaved partial sums, vectorized (one sum per output channel was a chain of
         * dependent adds, most of the time of a first layer's conv2d_backward without dx);
         * the CNN engine sums its db the same way */
        K(dp_add_row_sums)(db, dyn, g->OC, (int)P);
        rc = K(dp_conv_image_backward)(ctx, col, dwt, dx ? dx + n * in : NULL, dyn, x + n * in, w,
                                       wp, g, OH, OW);
    }
    if (rc == DP_OK) K(dp_conv_add_dwt)(dw, dwt, g);
    dp_scratch_free(&local);
    return rc;
}

void K(dp_conv2d_forward_naive)(T *y, const T *x, const T *w, const T *b, int B,
                                const dp_conv_geom *g)
{
    // y[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] x[n, c, i ST + u - PAD, j ST + v - PAD]
    int OH, OW, st = dp_conv_stride(g);
    if (dp_conv_out(g, &OH, &OW)) return;
    int C = g->C, H = g->H, W = g->W, KH = g->KH, KW = g->KW, pad = g->pad;
    for (int n = 0; n < B; n++)
        for (int o = 0; o < g->OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    T s = 0;
                    for (int c = 0; c < C; c++)
                        for (int u = 0; u < KH; u++)
                            for (int v = 0; v < KW; v++) {
                                int h = i * st + u - pad, q = j * st + v - pad;
                                int inside = h >= 0 && h < H && q >= 0 && q < W;
                                /* a padded position is a zero, not a skipped term: an inf or
                                 * NaN weight over it gives NaN, as in the reference and the
                                 * im2col path */
                                T xv = inside ? x[((ptrdiff_t)(n * C + c) * H + h) * W + q] : (T)0;
                                s += w[((ptrdiff_t)(o * C + c) * KH + u) * KW + v] * xv;
                            }
                    y[((ptrdiff_t)(n * g->OC + o) * OH + i) * OW + j] = b[o] + s;
                }
}

void K(dp_conv2d_backward_naive)(T *dw, T *db, T *dx, const T *dy, const T *x, const T *w, int B,
                                 const dp_conv_geom *g)
{
    // the same sums, read backwards: every (n, o, i, j, c, u, v) term of the forward adds
    // dy * x to dw and dy * w to dx
    int OH, OW, st = dp_conv_stride(g);
    if (dp_conv_out(g, &OH, &OW)) return;
    int C = g->C, H = g->H, W = g->W, KH = g->KH, KW = g->KW, pad = g->pad, OC = g->OC;
    if (dx) memset(dx, 0, sizeof(T) * (size_t)B * C * H * W);
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    T d = dy[((ptrdiff_t)(n * OC + o) * OH + i) * OW + j];
                    db[o] += d;
                    for (int c = 0; c < C; c++)
                        for (int u = 0; u < KH; u++)
                            for (int v = 0; v < KW; v++) {
                                int h = i * st + u - pad, q = j * st + v - pad;
                                ptrdiff_t wi = ((ptrdiff_t)(o * C + c) * KH + u) * KW + v;
                                if (h < 0 || h >= H || q < 0 || q >= W) {
                                    dw[wi] += d * (T)0; /* the zero padding: see forward */
                                    continue;
                                }
                                ptrdiff_t xi = ((ptrdiff_t)(n * C + c) * H + h) * W + q;
                                dw[wi] += d * x[xi];
                                if (dx) dx[xi] += d * w[wi];
                            }
                }
}

#endif /* DP_VEC_PASS */

#ifndef DP_VEC_PASS
DP_CONV_VEC(DP_VEC_DEFINE, T, S)
#endif

#undef K
