/* dp_gemm_tmpl.h - packing routines and the MR x NR micro-kernel, for one dtype and one ISA.
 * Included by dp_gemm.c once per (dtype, ISA) with these macros defined:
 *   T      element type (float or double)
 *   TI     the signed integer type of T's width (int32_t, int64_t): shuffle masks
 *   VL     elements in one vector (16-byte vectors: 4 or 2; 32-byte: 8 or 4; 64-byte: 16 or 8)
 *   ROWS   MR, the micro-tile's rows
 *   SUF    name suffix, e.g. _f32_avx2
 *   TGT    function attribute selecting the ISA (empty for the generic build)
 * The micro-kernel is written with GNU vector extensions: under TGT = target("avx2,fma") they
 * become ymm registers and vfmadd; under the AVX-512 target zmm registers; in the generic
 * build (16-byte vectors, the baseline width) xmm registers on x86-64 or NEON's q registers
 * on AArch64. The tile is MR rows x NR = 2 vectors:
 *   16- and 32-byte vectors, MR = 6: 12 accumulators + 2 B vectors + 1 broadcast = 15 of the
 *     16 xmm / ymm registers (the BLIS Haswell shape);
 *   64-byte vectors, MR = 12: 24 accumulators + 2 B vectors + 1 broadcast = 27 of the 32
 *     zmm registers (the broadcast may also be an embedded {1toN} memory operand).
 *
 * Assumptions: panels are packed by the routines below (zero-padded to MR/NR, aligned to
 * DP_ALIGN); C is row-major with unit column stride; kc >= 1.
 */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define F(name) CAT(name, SUF)

#define MR ROWS
#define NR (2 * VL)

typedef T F(vec_t) __attribute__((vector_size(VL * sizeof(T))));

TGT DP_INLINE F(vec_t) F(vload)(const T *p)
{
    F(vec_t) v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

TGT DP_INLINE void F(vstore)(T *p, F(vec_t) v) { __builtin_memcpy(p, &v, sizeof v); }

/* r[q][i] -> r[i][q]. 32-byte vectors (no PERFECT_SHUFFLE): AVX's unpack / shuffle /
 * 128-bit-permute network (3 stages of 8 shuffles for float, 2 of 4 for double), each
 * shuffle one in-lane instruction. PERFECT_SHUFFLE (the 64-byte builds, where a two-source
 * permute across the whole register is one instruction): log2(VL) stages that each
 * interleave row i with row i + VL/2; a stage rotates the bits of (row, column) by one, so
 * log2(VL) stages swap them. */
TGT DP_INLINE void F(transpose)(F(vec_t) * r)
{
    typedef F(vec_t) V;
    typedef TI M __attribute__((vector_size(VL * sizeof(T))));
    (void)sizeof(M); /* (the shuffle indices are macros, #undef'd below) */
#if defined(PERFECT_SHUFFLE) && VL == 16
#define TR_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define TR_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
    enum { STAGES = 4 };
#elif defined(PERFECT_SHUFFLE) && VL == 8
#define TR_LO 0, 8, 1, 9, 2, 10, 3, 11
#define TR_HI 4, 12, 5, 13, 6, 14, 7, 15
    enum { STAGES = 3 };
#elif defined(PERFECT_SHUFFLE) && VL == 4
#define TR_LO 0, 4, 1, 5
#define TR_HI 2, 6, 3, 7
    enum { STAGES = 2 };
#elif defined(PERFECT_SHUFFLE) && VL == 2
#define TR_LO 0, 2
#define TR_HI 1, 3
    enum { STAGES = 1 };
#endif
#ifdef PERFECT_SHUFFLE
    for (int s = 0; s < STAGES; s++) {
        V t[VL];
        for (int i = 0; i < VL / 2; i++) {
            t[2 * i] = DP_SHUFFLE(M, r[i], r[i + VL / 2], TR_LO);
            t[2 * i + 1] = DP_SHUFFLE(M, r[i], r[i + VL / 2], TR_HI);
        }
        for (int i = 0; i < VL; i++) r[i] = t[i];
    }
#elif VL == 8
#define TR_LO 0, 8, 1, 9, 4, 12, 5, 13
#define TR_HI 2, 10, 3, 11, 6, 14, 7, 15
#define TR_S44 0, 1, 8, 9, 4, 5, 12, 13
#define TR_SEE 2, 3, 10, 11, 6, 7, 14, 15
#define TR_P20 0, 1, 2, 3, 8, 9, 10, 11
#define TR_P31 4, 5, 6, 7, 12, 13, 14, 15
    V t0 = DP_SHUFFLE(M, r[0], r[1], TR_LO), t1 = DP_SHUFFLE(M, r[0], r[1], TR_HI);
    V t2 = DP_SHUFFLE(M, r[2], r[3], TR_LO), t3 = DP_SHUFFLE(M, r[2], r[3], TR_HI);
    V t4 = DP_SHUFFLE(M, r[4], r[5], TR_LO), t5 = DP_SHUFFLE(M, r[4], r[5], TR_HI);
    V t6 = DP_SHUFFLE(M, r[6], r[7], TR_LO), t7 = DP_SHUFFLE(M, r[6], r[7], TR_HI);
    V s0 = DP_SHUFFLE(M, t0, t2, TR_S44), s1 = DP_SHUFFLE(M, t0, t2, TR_SEE);
    V s2 = DP_SHUFFLE(M, t1, t3, TR_S44), s3 = DP_SHUFFLE(M, t1, t3, TR_SEE);
    V s4 = DP_SHUFFLE(M, t4, t6, TR_S44), s5 = DP_SHUFFLE(M, t4, t6, TR_SEE);
    V s6 = DP_SHUFFLE(M, t5, t7, TR_S44), s7 = DP_SHUFFLE(M, t5, t7, TR_SEE);
    r[0] = DP_SHUFFLE(M, s0, s4, TR_P20), r[1] = DP_SHUFFLE(M, s1, s5, TR_P20);
    r[2] = DP_SHUFFLE(M, s2, s6, TR_P20), r[3] = DP_SHUFFLE(M, s3, s7, TR_P20);
    r[4] = DP_SHUFFLE(M, s0, s4, TR_P31), r[5] = DP_SHUFFLE(M, s1, s5, TR_P31);
    r[6] = DP_SHUFFLE(M, s2, s6, TR_P31), r[7] = DP_SHUFFLE(M, s3, s7, TR_P31);
#elif VL == 4
#define TR_LO 0, 4, 2, 6
#define TR_HI 1, 5, 3, 7
#define TR_P20 0, 1, 4, 5
#define TR_P31 2, 3, 6, 7
    V t0 = DP_SHUFFLE(M, r[0], r[1], TR_LO), t1 = DP_SHUFFLE(M, r[0], r[1], TR_HI);
    V t2 = DP_SHUFFLE(M, r[2], r[3], TR_LO), t3 = DP_SHUFFLE(M, r[2], r[3], TR_HI);
    r[0] = DP_SHUFFLE(M, t0, t2, TR_P20), r[1] = DP_SHUFFLE(M, t1, t3, TR_P20);
    r[2] = DP_SHUFFLE(M, t0, t2, TR_P31), r[3] = DP_SHUFFLE(M, t1, t3, TR_P31);
#else
#error "transpose: VL must be 4 or 8, or 2, 4, 8 or 16 with PERFECT_SHUFFLE"
#endif
#undef TR_LO
#undef TR_HI
#undef TR_S44
#undef TR_SEE
#undef TR_P20
#undef TR_P31
}

/* Packs the mc x kc block of A (element (i, k) at A[i * rsa + k * csa]) into MR-row
 * micro-panels: panel p holds rows p*MR.., stored k-major (MR values per k), zero-padded. */
TGT static void F(pack_a)(T *DP_RESTRICT Ap, const T *DP_RESTRICT A, ptrdiff_t rsa, ptrdiff_t csa,
                          int mc, int kc)
{
    /* the packed block ends here: a vector store may run past the current k's MR values
     * (the next store overwrites them) but never past this */
    const T *end = Ap + (ptrdiff_t)((mc + MR - 1) / MR) * MR * kc;
    enum { G = (MR + VL - 1) / VL }; /* vectors per k: MR values in G x VL lanes */
    for (int i0 = 0; i0 < mc; i0 += MR) {
        int mr = mc - i0 < MR ? mc - i0 : MR;
        const T *a = A + (ptrdiff_t)i0 * rsa;
        if (mr == MR && csa == 1) {
            /* row-major A: VL values of each of the MR rows, transposed in registers (rows
             * past MR repeat the last one), stored as VL runs of MR values; runs are written
             * with whole vectors whose extra lanes the next run overwrites */
            int k = 0;
            for (; k + VL <= kc && Ap + (ptrdiff_t)MR * VL + G * VL - MR <= end; k += VL) {
                F(vec_t) r[G][VL];
                for (int g = 0; g < G; g++) {
                    for (int q = 0; q < VL; q++) {
                        int row = g * VL + q < MR ? g * VL + q : MR - 1;
                        r[g][q] = F(vload)(a + (ptrdiff_t)row * rsa + k);
                    }
                    F(transpose)(r[g]);
                }
                for (int q = 0; q < VL; q++)
                    for (int g = 0; g < G; g++) F(vstore)(Ap + (ptrdiff_t)q * MR + g * VL, r[g][q]);
                Ap += (ptrdiff_t)MR * VL;
            }
            for (; k < kc; k++) {
                for (int i = 0; i < MR; i++) Ap[i] = a[(ptrdiff_t)i * rsa + k];
                Ap += MR;
            }
        } else if (mr == MR && rsa == 1) {
            /* transposed A (A^T stored K x M): MR contiguous values per k */
            for (int k = 0; k < kc; k++) {
                const T *src = a + (ptrdiff_t)k * csa;
                for (int i = 0; i < MR; i++) Ap[i] = src[i];
                Ap += MR;
            }
        } else if (rsa == 1) {
            /* transposed A, a last panel of mr < MR rows: the values past mr zeroed in the same
             * loop (as a copy loop and a zeroing loop, GCC called memcpy and memset for every
             * k: 10x128x128 TN, A^T 128 x 10, spent 8 % of its time in them) */
            for (int k = 0; k < kc; k++) {
                const T *src = a + (ptrdiff_t)k * csa;
                for (int i = 0; i < MR; i++) Ap[i] = i < mr ? src[i] : (T)0;
                Ap += MR;
            }
        } else {
            for (int k = 0; k < kc; k++) {
                int i = 0;
                for (; i < mr; i++) Ap[i] = a[(ptrdiff_t)i * rsa + (ptrdiff_t)k * csa];
                for (; i < MR; i++) Ap[i] = 0;
                Ap += MR;
            }
        }
    }
}

/* Packs the kc x nc panel of B (element (k, j) at B[k * rsb + j * csb]) into NR-column
 * micro-panels stored k-major (NR values per k), zero-padded. */
TGT static void F(pack_b)(T *DP_RESTRICT Bp, const T *DP_RESTRICT B, ptrdiff_t rsb, ptrdiff_t csb,
                          int kc, int nc)
{
    for (int j0 = 0; j0 < nc; j0 += NR) {
        int nr = nc - j0 < NR ? nc - j0 : NR;
        const T *b = B + (ptrdiff_t)j0 * csb;
        if (nr == NR && csb == 1) {
            for (int k = 0; k < kc; k++) {
                const T *src = b + (ptrdiff_t)k * rsb;
                for (int j = 0; j < NR; j++) Bp[j] = src[j];
                Bp += NR;
            }
        } else if (rsb == 1) {
            /* B = W^T with W row-major: a kc x NR transpose, VL x VL blocks at a time in
             * registers (VL rows of W loaded contiguously, VL panel rows stored whole; rows
             * of W past nr are zeros); the last kc % VL values element by element */
            int k = 0;
            for (; k + VL <= kc; k += VL)
                for (int h = 0; h < NR; h += VL) {
                    F(vec_t) r[VL];
                    for (int q = 0; q < VL; q++) {
                        F(vec_t) zero = {0};
                        r[q] = h + q < nr ? F(vload)(b + (ptrdiff_t)(h + q) * csb + k) : zero;
                    }
                    F(transpose)(r);
                    for (int q = 0; q < VL; q++) F(vstore)(Bp + (ptrdiff_t)(k + q) * NR + h, r[q]);
                }
            for (int j = 0; j < NR; j++) {
                const T *src = b + (ptrdiff_t)j * csb;
                for (int kk = k; kk < kc; kk++) Bp[(ptrdiff_t)kk * NR + j] = j < nr ? src[kk] : 0;
            }
            Bp += (ptrdiff_t)kc * NR;
        } else {
            for (int k = 0; k < kc; k++) {
                int j = 0;
                for (; j < nr; j++) Bp[j] = b[(ptrdiff_t)k * rsb + (ptrdiff_t)j * csb];
                for (; j < NR; j++) Bp[j] = 0;
                Bp += NR;
            }
        }
    }
}

/* x[0:n] rounded to bfloat16 in place (dp_bf16_round_bits), in this build's vectors. Used on
 * packed float panels only; the double builds never call theirs. */
TGT static __attribute__((unused)) void F(round_bf16)(float *DP_RESTRICT x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        __builtin_memcpy(&u, &x[i], sizeof u);
        u = dp_bf16_round_bits(u);
        __builtin_memcpy(&x[i], &u, sizeof u);
    }
}

/* Stores the MR x NR accumulators into C[0:mr, 0:nr]: alpha * acc + beta * C (beta == 0:
 * C is not read). */
TGT DP_INLINE void F(store_tile)(T *DP_RESTRICT C, ptrdiff_t ldc, F(vec_t) acc[MR][2], int mr,
                                 int nr, T alpha, T beta)
{
    typedef F(vec_t) V;
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            T *c = C + (ptrdiff_t)i * ldc;
            V r0 = acc[i][0] * alpha, r1 = acc[i][1] * alpha;
            if (beta != 0) {
                r0 += F(vload)(c) * beta;
                r1 += F(vload)(c + VL) * beta;
            }
            F(vstore)(c, r0);
            F(vstore)(c + VL, r1);
        }
    } else if (mr == MR && nr == VL) { /* the narrow kernel's whole tile */
        for (int i = 0; i < MR; i++) {
            T *c = C + (ptrdiff_t)i * ldc;
            V r0 = acc[i][0] * alpha;
            if (beta != 0) r0 += F(vload)(c) * beta;
            F(vstore)(c, r0);
        }
    } else {
        /* a partial tile (the last rows or columns of C): each row's whole vectors as above,
         * its last nr % VL values one by one (the same arithmetic, so the same bits); the
         * scalar copy of the whole tile it replaces was 6 % of a 32x900x27 GEMM (the conv's
         * 32 filters: 8 of every 32 rows in a partial tile) */
        for (int i = 0; i < mr; i++) {
            T *c = C + (ptrdiff_t)i * ldc;
            int j = 0, h = 0;
            for (; j + VL <= nr; j += VL, h++) {
                V r = acc[i][h] * alpha;
                if (beta != 0) r += F(vload)(c + j) * beta;
                F(vstore)(c + j, r);
            }
            if (j < nr) {
                T last[VL];
                F(vstore)(last, acc[i][h] * alpha);
                if (beta != 0)
                    for (int q = 0; q < nr - j; q++) c[j + q] = last[q] + beta * c[j + q];
                else
                    for (int q = 0; q < nr - j; q++) c[j + q] = last[q];
            }
        }
    }
}

/* The micro-kernel body: kc rank-1 updates of the MR x NR tile, k innermost, then the store.
 * A_AT(i) reads A's row i at the current k, A_NEXT advances k, and B's rows are BKS apart.
 * Every accumulator is a named variable (an array of them, or of row pointers, is kept in
 * memory by GCC in the strided kernel: 100 stack accesses in its k loop, against none this
 * way). It is instantiated for packed panels (every stride a constant) and for operands read
 * in place (strides from the caller), so the packed path keeps its tight loop.
 * WIDE (a constant) 0 is the narrow tile: nr <= VL, where B's second vector would multiply
 * zero padding, so MR rows x one vector: the same sums over k in the same order (so the same
 * bits) at half the FMAs. It takes the conv's N = 16 filters and an output layer's N = 10 on
 * AVX-512 float, and the last panel of any N = NR q + r with r <= VL; B's panels keep their
 * NR stride (the same packing). */
#define ACC_DECL(i) V c##i##_0 = {0}, c##i##_1 = {0};
#define ACC_ROW(i)                      \
    {                                   \
        T ai = A_AT(i);                 \
        c##i##_0 += b0 * ai;            \
        if (WIDE_) c##i##_1 += b1 * ai; \
    }
#define ACC_TILE(i) acc[i][0] = c##i##_0, acc[i][1] = c##i##_1;
/* row i of a whole tile, alpha 1 and beta 0 or 1: acc, or C + acc (what store_tile computes
 * then, one rounding either way, so the same bits) */
#define STORE_ROW(i)                            \
    {                                           \
        T *ci = C + (ptrdiff_t)(i) * ldc;       \
        V r0 = c##i##_0, r1 = c##i##_1;         \
        if (beta != 0) {                        \
            r0 += F(vload)(ci);                 \
            if (WIDE_) r1 += F(vload)(ci + VL); \
        }                                       \
        F(vstore)(ci, r0);                      \
        if (WIDE_) F(vstore)(ci + VL, r1);      \
    }
/* (written out: a SEP of COMMA cannot be passed on to another of these) */
#define ROWS_DO4(X, SEP) X(0) SEP X(1) SEP X(2) SEP X(3)
#define ROWS_DO6(X, SEP) X(0) SEP X(1) SEP X(2) SEP X(3) SEP X(4) SEP X(5)
#define ROWS_DO8(X, SEP) X(0) SEP X(1) SEP X(2) SEP X(3) SEP X(4) SEP X(5) SEP X(6) SEP X(7)
#define ROWS_DO10(X, SEP) \
    X(0) SEP X(1) SEP X(2) SEP X(3) SEP X(4) SEP X(5) SEP X(6) SEP X(7) SEP X(8) SEP X(9)
#define ROWS_DO12(X, SEP)                                                                      \
    X(0)                                                                                       \
    SEP X(1) SEP X(2) SEP X(3) SEP X(4) SEP X(5) SEP X(6) SEP X(7) SEP X(8) SEP X(9) SEP X(10) \
        SEP X(11)
#if ROWS == 6
#define ROWS_DO ROWS_DO6
#elif ROWS == 12
#define ROWS_DO ROWS_DO12
#else
#error "ROWS must be 6 or 12"
#endif
#define NOSEP
#define COMMA ,
#define UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, RDO)                                           \
    {                                                                                        \
        typedef F(vec_t) V;                                                                  \
        enum { WIDE_ = (WIDE) };                                                             \
        RDO(ACC_DECL, NOSEP)                                                                 \
        _Pragma("GCC unroll 4") for (int k = 0; k < kc; k++)                                 \
        {                                                                                    \
            V b0 = F(vload)(b), b1 = {0};                                                    \
            if (WIDE_) b1 = F(vload)(b + VL);                                                \
            RDO(ACC_ROW, NOSEP)                                                              \
            A_NEXT;                                                                          \
            b += (BKS);                                                                      \
        }                                                                                    \
        if (mr == MR && nr == (WIDE_ ? NR : VL) && alpha == 1 && (beta == 0 || beta == 1)) { \
            RDO(STORE_ROW, NOSEP)                                                            \
        } else {                                                                             \
            V acc[MR][2];                                                                    \
            RDO(ACC_TILE, NOSEP)                                                             \
            F(store_tile)(C, ldc, acc, mr, nr, alpha, beta);                                 \
        }                                                                                    \
    }

/* The body for a tile of mr rows: the MR-row tile, or a tile of 4 rows (or 8 or 10 where MR
 * is 12) when mr is at most that, for C's last rows: with MR = 12, M = 27 = 12 + 12 + 3
 * (conv1's K x OC weight gradient) computed 36 rows for 27, 32 and 64 filters 36 and 72, and
 * an output layer's weight gradient (M = 10 classes) 12. The smaller tiles read the same
 * packed MR-row panels, so they make the same sums in the same order (the same bits). */
#if ROWS == 12
#define UKERNEL_ROWS(A_AT, A_NEXT, BKS, WIDE)                \
    {                                                        \
        if (mr <= 4)                                         \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO4)  \
        else if (mr <= 8)                                    \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO8)  \
        else if (mr <= 10)                                   \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO10) \
        else                                                 \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO)   \
    }
#else
#define UKERNEL_ROWS(A_AT, A_NEXT, BKS, WIDE)               \
    {                                                       \
        if (mr <= 4)                                        \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO4) \
        else                                                \
            UKERNEL_BODY(A_AT, A_NEXT, BKS, WIDE, ROWS_DO)  \
    }
#endif

/* C[0:mr, 0:nr] = alpha * Ap * Bp + beta * C for packed micro-panels: Ap is MR x kc stored
 * k-major (MR values per k), Bp is kc x NR (NR values per k). */
TGT static void F(ukernel_packed)(T *DP_RESTRICT C, ptrdiff_t ldc, const T *DP_RESTRICT a,
                                  const T *DP_RESTRICT b, int kc, int mr, int nr, T alpha, T beta)
{
#define A_AT(i) a[i]
    if (nr <= VL)
        UKERNEL_ROWS(A_AT, a += MR, NR, 0)
    else
        UKERNEL_ROWS(A_AT, a += MR, NR, 1)
#undef A_AT
}

/* The same with A's element (i, k) at a[i * ars + k * acs] and B's k-th row at b + k * bks,
 * for operands read in place. Rows i >= mr re-read row mr - 1 (valid memory); their results
 * are never stored. */
TGT static void F(ukernel_strided)(T *DP_RESTRICT C, ptrdiff_t ldc, const T *a, ptrdiff_t ars,
                                   ptrdiff_t acs, const T *DP_RESTRICT b, ptrdiff_t bks, int kc,
                                   int mr, int nr, T alpha, T beta)
{
    const T *p[MR];
    for (int i = 0; i < MR; i++) p[i] = a + (ptrdiff_t)(i < mr ? i : mr - 1) * ars;
#define PTR_DECL(i) const T *p##i = p[i];
    ROWS_DO(PTR_DECL, NOSEP)
#undef PTR_DECL
    ptrdiff_t off = 0;
#define A_AT(i) p##i[off]
    if (nr <= VL)
        UKERNEL_ROWS(A_AT, off += acs, bks, 0)
    else
        UKERNEL_ROWS(A_AT, off += acs, bks, 1)
#undef A_AT
}

/* The same with A's rows the entries of an image's patches, read where they are (the
 * convolution's col(x) without im2col, dp_gemm_patch): element (i, k) at
 * x[aoff[i] + koff[k]]. The sums are ukernel_strided's on im2col's rows. */
TGT static void F(ukernel_patch)(T *DP_RESTRICT C, ptrdiff_t ldc, const T *x, const ptrdiff_t *aoff,
                                 const ptrdiff_t *koff, const T *DP_RESTRICT b, int kc, int mr,
                                 int nr, T alpha, T beta)
{
    const T *p[MR];
    for (int i = 0; i < MR; i++) p[i] = x + aoff[i < mr ? i : mr - 1];
#define PTR_DECL(i) const T *p##i = p[i];
    ROWS_DO(PTR_DECL, NOSEP)
#undef PTR_DECL
#define A_AT(i) p##i[*koff]
    if (nr <= VL)
        UKERNEL_ROWS(A_AT, koff++, NR, 0)
    else
        UKERNEL_ROWS(A_AT, koff++, NR, 1)
#undef A_AT
}

#if ROWS == 12
/* Small K (kc <= SMALLK_MAX; an output layer's input gradient dY W has K = 10 classes), on
 * the 32-register builds. A tile's few rank-1 updates do not hide its prologue and its 2 MR
 * stores: a tile's fixed cost was about three k's. Here B's kc x NR strip stays in 2 kc
 * registers while C's rows go by, each row's two stores right after its FMAs. Each C value is
 * UKERNEL_BODY's sum in its order (0, then += b_k a_ik for k = 0, 1, ...), stored as its
 * STORE_ROW stores it, so the same bits; hence alpha 1 and beta 0 or 1 only (every GEMM of
 * the engines): a general alpha and beta is left to store_tile, whose rounding of
 * alpha acc + beta C (which product GCC fuses) the bfloat16 dot path shares. Past 16, B's 2 kc
 * registers spill (slower than the tile kernel in one pass), so smallk_block splits K in
 * two. */
#define SMALLK_MAX 16
#define SK_KDO(X) \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define SK_LOAD_B(k)                                        \
    V b##k##_0 = {0}, b##k##_1 = {0};                       \
    if ((k) < KC) {                                         \
        b##k##_0 = F(vload)(b + (ptrdiff_t)(k) * bks);      \
        b##k##_1 = F(vload)(b + (ptrdiff_t)(k) * bks + VL); \
    }
#define SK_FMA(k)                        \
    if ((k) < KC) {                      \
        T a_ = ar[(ptrdiff_t)(k) * acs]; \
        c0 += b##k##_0 * a_;             \
        c1 += b##k##_1 * a_;             \
    }

/* What smallk_rows does with C: SK_STORE C = A B, SK_ADD C = A B + C (beta 1: the sum, then
 * C added), SK_GO_ON C = the sum over k started from C (the second half of a K split in two:
 * the first half's sum carried on in the same order, so the bits of one pass over all of K) */
#ifndef DP_GEMM_SK_MODES
#define DP_GEMM_SK_MODES
enum { SK_STORE, SK_ADD, SK_GO_ON };
#endif

/* C[0:m, 0:NR] as mode says, for B's KC x NR strip (row k at b + k * bks) and A's m rows
 * (element (i, k) at a[i * ars + k * acs]); KC a constant (the caller's switch) */
TGT DP_INLINE void F(smallk_rows)(T *C, ptrdiff_t ldc, const T *a, ptrdiff_t ars, ptrdiff_t acs,
                                  const T *b, ptrdiff_t bks, int m, const int KC, int mode)
{
    typedef F(vec_t) V;
    SK_KDO(SK_LOAD_B)
    for (int i = 0; i < m; i++) {
        const T *ar = a + (ptrdiff_t)i * ars;
        T *c = C + (ptrdiff_t)i * ldc;
        V c0 = {0}, c1 = {0};
        if (mode == SK_GO_ON) {
            c0 = F(vload)(c);
            c1 = F(vload)(c + VL);
        }
        SK_KDO(SK_FMA)
        if (mode == SK_ADD) {
            c0 += F(vload)(c);
            c1 += F(vload)(c + VL);
        }
        F(vstore)(c, c0);
        F(vstore)(c + VL, c1);
    }
}

TGT static void F(ukernel_smallk)(T *C, ptrdiff_t ldc, const T *a, ptrdiff_t ars, ptrdiff_t acs,
                                  const T *b, ptrdiff_t bks, int kc, int m, int mode)
{
#define SK_CASE(k) \
    case (k) + 1: F(smallk_rows)(C, ldc, a, ars, acs, b, bks, m, (k) + 1, mode); break;
    switch (kc) {
        SK_KDO(SK_CASE)
    }
#undef SK_CASE
}

/* C[0:m, 0:NR] = A B + beta C (beta 0 or 1) for kc <= SMALLK_MAX, or beta 0 and kc <= 2
 * SMALLK_MAX in two passes over C's m rows (B's first ceil(kc / 2) rows in registers, then
 * the rest, SK_GO_ON), while they are in L1: K = 27 (a 3x3 convolution of 3 channels, the
 * im2col product x w^T), through the tile kernel's 27 rank-1 updates a tile, ran well below
 * the FMA peak. The same bits: the sum is made in the same order. */
TGT static void F(smallk_block)(T *C, ptrdiff_t ldc, const T *a, ptrdiff_t ars, ptrdiff_t acs,
                                const T *b, ptrdiff_t bks, int kc, int m, int add_c)
{
    if (kc <= SMALLK_MAX) {
        F(ukernel_smallk)(C, ldc, a, ars, acs, b, bks, kc, m, add_c ? SK_ADD : SK_STORE);
        return;
    }
    int k1 = (kc + 1) / 2;
    F(ukernel_smallk)(C, ldc, a, ars, acs, b, bks, k1, m, SK_STORE);
    F(ukernel_smallk)(C, ldc, a + (ptrdiff_t)k1 * acs, ars, acs, b + (ptrdiff_t)k1 * bks, bks,
                      kc - k1, m, SK_GO_ON);
}
#undef SK_KDO
#undef SK_LOAD_B
#undef SK_FMA
#else
#define SMALLK_MAX 0
#endif

#undef UKERNEL_BODY
#undef UKERNEL_ROWS
#undef ROWS_DO4
#undef ROWS_DO6
#undef ROWS_DO8
#undef ROWS_DO10
#undef ROWS_DO12
#undef ACC_DECL
#undef ACC_ROW
#undef ACC_TILE
#undef ROWS_DO
#undef NOSEP
#undef COMMA

/* The two loops around the micro-kernel (BLIS's macro-kernel) over an mc x kc block of A and
 * a kc x nc panel of B, either of which may be packed or read in place:
 *   A micro-panel p starts at A + p * apanel, element (i, k) at [i * ars + k * acs];
 *   B micro-panel q starts at B + q * bpanel, its k-th row at [k * bks]; when B is read in
 *   place, a last partial panel (nc % NR != 0) would be read past its row, so the caller
 *   passes a packed, zero-padded copy of it in bedge. */
TGT static void F(macrokernel)(T *C, ptrdiff_t ldc, const T *A, ptrdiff_t ars, ptrdiff_t acs,
                               ptrdiff_t apanel, const T *B, ptrdiff_t bks, ptrdiff_t bpanel,
                               const T *bedge, int mc, int nc, int kc, T alpha, T beta)
{
    for (int j0 = 0; j0 < nc; j0 += NR) {
        int nr = nc - j0 < NR ? nc - j0 : NR;
        const T *bp = B + (ptrdiff_t)(j0 / NR) * bpanel;
        ptrdiff_t bs = bks;
        if (nr < NR && bedge) {
            bp = bedge;
            bs = NR;
        }
#if SMALLK_MAX
        if (nr == NR && alpha == 1 &&
            ((kc <= SMALLK_MAX && beta == 1) || (kc <= 2 * SMALLK_MAX && beta == 0))) {
            if (apanel == MR * ars) /* A's rows evenly spaced: all mc of them at once */
                F(smallk_block)(C + j0, ldc, A, ars, acs, bp, bs, kc, mc, beta != 0);
            else
                for (int i0 = 0; i0 < mc; i0 += MR)
                    F(smallk_block)(C + (ptrdiff_t)i0 * ldc + j0, ldc,
                                    A + (ptrdiff_t)(i0 / MR) * apanel, ars, acs, bp, bs, kc,
                                    mc - i0 < MR ? mc - i0 : MR, beta != 0);
            continue;
        }
#endif
        for (int i0 = 0; i0 < mc; i0 += MR) {
            int mr = mc - i0 < MR ? mc - i0 : MR;
            const T *ap = A + (ptrdiff_t)(i0 / MR) * apanel;
            if (ars == 1 && acs == MR && bs == NR)
                F(ukernel_packed)(C + (ptrdiff_t)i0 * ldc + j0, ldc, ap, bp, kc, mr, nr, alpha,
                                  beta);
            else
                F(ukernel_strided)(C + (ptrdiff_t)i0 * ldc + j0, ldc, ap, ars, acs, bp, bs, kc, mr,
                                   nr, alpha, beta);
        }
    }
}

/* The macro-kernel of dp_gemm_patch: the mc x kc block of patch rows aoff[0:mc] at the k
 * offsets koff[0:kc] (see ukernel_patch) times a packed kc x nc panel of B. */
TGT static void F(macro_patch)(T *C, ptrdiff_t ldc, const T *x, const ptrdiff_t *aoff,
                               const ptrdiff_t *koff, const T *B, int mc, int nc, int kc, T alpha,
                               T beta)
{
    for (int j0 = 0; j0 < nc; j0 += NR) {
        int nr = nc - j0 < NR ? nc - j0 : NR;
        const T *bp = B + (ptrdiff_t)(j0 / NR) * NR * kc;
        for (int i0 = 0; i0 < mc; i0 += MR) {
            int mr = mc - i0 < MR ? mc - i0 : MR;
            F(ukernel_patch)(C + (ptrdiff_t)i0 * ldc + j0, ldc, x, aoff + i0, koff, bp, kc, mr, nr,
                             alpha, beta);
        }
    }
}

#undef SMALLK_MAX
#undef MR
#undef NR
#undef F
