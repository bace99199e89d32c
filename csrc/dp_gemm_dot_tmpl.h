/* dp_gemm_dot_tmpl.h - the bfloat16 GEMM's dot-product path (float32 GEMMs with
 * dp_ctx.bf16_inputs): packed panels turned into bfloat16 pairs, and a 12 x 32 micro-kernel
 * built on AVX512_BF16's vdpbf16ps, which multiplies 16 pairs of bfloat16 by 16 pairs and
 * adds both products to 16 float accumulators: 2 k per instruction where vfmadd213ps does 1.
 * Included by dp_gemm.c with these macros defined (undefined at the end):
 *   DSFX     name suffix: _avx512bf16 (the instruction) or _emul (csrc/tests' wide build:
 *            the same arithmetic in plain vector code, so that the pairing, the odd k and
 *            the edges run on any CPU)
 *   DOT_TGT  the function attribute of the build (empty for _emul)
 *   DOT_HW   1: vdpbf16ps through its intrinsic; 0: the emulation
 *   DOT_VF, DOT_STORE, DOT_TRANSPOSE  the float build of the same 12 x 2 x 16 shape whose
 *            vector type, store_tile (alpha, beta, the edges) and 16 x 16 transpose the
 *            kernel and the packing share: the avx512 build's, or the wide build's generic
 *            slot for the emulation
 *
 * The pairs. The driver packs A (12-row micro-panels, 12 floats per k) and B (32-column
 * micro-panels, 32 floats per k) as for float32; dot_pair_a / dot_pair_b then round them to
 * bfloat16 as the rounding path does and pack rows k and k + 1 of each micro-panel into one
 * row of 32-bit pairs, in place: row k in the HIGH half, row k + 1 in the low half, a zero
 * low half past an odd kc. Where the operand's rows (a row-major B, a transposed A:
 * dot_pack_pair_a / _b) or its columns (a transposed B, a row-major A: dot_tpack_pair_a / _b)
 * are contiguous in k, packing, rounding and pairing are one pass instead. vdpbf16ps computes, per lane (Intel SDM), acc += hi(a) * hi(b), rounded, then acc += lo(a) * lo(b), rounded,
 * with products of bfloat16 exact in float: so k, then k + 1, each added and rounded, which
 * is what the float path's vfmadd sequence does. The two paths give the same bits, except
 * that vdpbf16ps treats denormal inputs and results as zero (and the sign of a zero sum).
 *
 * The kernel: 24 accumulators (12 rows x 2 vectors of 16 lanes) + 2 B vectors + a broadcast
 * pair, as the float32 AVX-512 kernel; one k pair per step, 24 vdpbf16ps.
 */

#define DCAT_(a, b) a##b
#define DCAT(a, b) DCAT_(a, b)
#define DF(name) DCAT(name, DSFX)

#define DOT_MR 12
#define DOT_NR 32

typedef DOT_VF DF(dot_vf);
typedef uint32_t DF(dot_vu) __attribute__((vector_size(64)));

/* u rounded to bfloat16, as dp_bf16_round_bits (dp_common.h) per lane: to nearest even, a
 * NaN kept quiet */
DOT_TGT DP_INLINE DF(dot_vu) DF(dot_round)(DF(dot_vu) u)
{
    typedef DF(dot_vu) U;
    typedef int32_t I __attribute__((vector_size(64)));
    U rne = u + 0x7fffu + ((u >> 16) & 1u), quiet = u | 0x00400000u;
    U nan = (U)((I)(u & 0x7fffffffu) > 0x7f800000);
    return ((quiet & nan) | (rne & ~nan)) & 0xffff0000u;
}

/* The first n (0 to 16) floats at p as 32-bit lanes, the rest 0; a partial vector through a
 * masked load on the hardware (a memcpy of 48 bytes into a 64-byte vector goes through the
 * stack) */
DOT_TGT DP_INLINE DF(dot_vu) DF(dot_load)(const float *p, int n)
{
    DF(dot_vu) v = {0};
    if (n >= 16) {
        memcpy(&v, p, sizeof v);
    } else if (n > 0) {
#if DOT_HW
        v = (DF(dot_vu))_mm512_maskz_loadu_epi32((__mmask16)((1u << n) - 1), p);
#else
        memcpy(&v, p, (size_t)n * sizeof(float));
#endif
    }
    return v;
}

/* The first n (1 to 16) lanes of v at p, the same way */
DOT_TGT DP_INLINE void DF(dot_store)(float *p, DF(dot_vu) v, int n)
{
#if DOT_HW
    if (n < 16) {
        _mm512_mask_storeu_epi32(p, (__mmask16)((1u << n) - 1), (__m512i)v);
        return;
    }
#endif
    memcpy(p, &v, (size_t)n * sizeof(float));
}

/* Rounds rows r and r + 1 (r + 1 < kc, or zeros) of a k-major source (element (k, j) at
 * src[k * ld + j] for j < n, zeros for n <= j < w) to bfloat16 and pairs them into row r / 2
 * of a micro-panel of w pairs per row, 16 lanes at a time. Two uses: the float-packed panel
 * itself, in place (src == dst, ld = n = w: row r / 2 <= r, and a chunk of it is written only
 * after the same chunk of rows r and r + 1 has been read; rows below r / 2 are no longer
 * needed), after which the rounding path's round_bf16 pass is not needed; and, for the
 * layouts whose k-th rows are contiguous (a row-major B, a transposed A), the operand itself,
 * which replaces the float packing too. A partial chunk (w = 12, or past n) goes through
 * masked loads and stores on the hardware: a 48-byte memcpy into a 64-byte vector went
 * through the stack, and pairing A then cost several times what packing it did. */
DOT_TGT DP_INLINE void DF(dot_pack_pair)(float *dst, const float *src, ptrdiff_t ld, int kc, int n,
                                         int w)
{
    typedef DF(dot_vu) U;
    for (int r = 0; r < kc; r += 2) {
        const float *hi_row = src + (ptrdiff_t)r * ld, *lo_row = hi_row + ld;
        float *out_row = dst + (ptrdiff_t)(r / 2) * w;
        for (int c = 0; c < w; c += 16) {
            int valid = n - c < 0 ? 0 : n - c, lanes = w - c < 16 ? w - c : 16;
            U hi = DF(dot_load)(hi_row + c, valid);
            U lo = r + 1 < kc ? DF(dot_load)(lo_row + c, valid) : (U){0};
            DF(dot_store)(out_row + c, DF(dot_round)(hi) | (DF(dot_round)(lo) >> 16), lanes);
        }
    }
}

/* One chunk of dot_tpack_pair: `left` (1 to 32) values from k of columns h .. h + 15 */
DOT_TGT DP_INLINE void DF(dot_tpack_chunk)(float *dst, const float *src, ptrdiff_t ld, int k,
                                           int left, int h, int n, int w)
{
    typedef DF(dot_vu) U;
    typedef uint16_t W __attribute__((vector_size(64)));
    typedef int16_t MW __attribute__((vector_size(64)));
    (void)sizeof(MW);
    U r[16];
    for (int q = 0; q < 16; q++) {
        U x0 = {0}, x1 = {0};
        if (h + q < n) {
            const float *col = src + (ptrdiff_t)(h + q) * ld + k;
            x0 = DF(dot_load)(col, left);
            x1 = DF(dot_load)(col + 16, left - 16);
        }
        /* the high halves (16-bit words 2 f + 1) of the rounded 32 floats f: the pair p's low
         * half is float 2 p + 1's, its high half float 2 p's */
        W w0 = (W)DF(dot_round)(x0), w1 = (W)DF(dot_round)(x1);
        r[q] = (U)DP_SHUFFLE(MW, w0, w1, 3, 1, 7, 5, 11, 9, 15, 13, 19, 17, 23, 21, 27, 25, 31, 29,
                             35, 33, 39, 37, 43, 41, 47, 45, 51, 49, 55, 53, 59, 57, 63, 61);
    }
    /* transposed as floats by the float build's 16 x 16 transpose (lanes moved, bits kept) */
    DF(dot_vf) f[16];
    for (int q = 0; q < 16; q++) f[q] = (DF(dot_vf))r[q];
    DOT_TRANSPOSE(f);
    for (int q = 0; q < 16; q++) r[q] = (U)f[q];
    int lanes = w - h < 16 ? w - h : 16;
    for (int p = 0; p < (left + 1) / 2; p++)
        DF(dot_store)(dst + (ptrdiff_t)(k / 2 + p) * w + h, r[p], lanes);
}

/* dot_pack_pair for a source whose rows are the panel's columns: column j's kc values at
 * src + j * ld, contiguous in k (j < n; columns n <= j < w are zeros): W^T, the B of a
 * layer's forward, and a row-major A. It replaces the float packing's register transpose and
 * the pairing pass over its panel with one pass: 32 k at a time, a column's 32 values become
 * its 16 pairs in one vector (even k in the high halves, odd in the low), and 16 columns'
 * vectors are transposed into 16 rows of pairs; the last kc % 32 values (all of them where
 * kc < 32: the conv's K = 27) are a chunk of masked loads, zeros past kc. The same rounding,
 * so the same bits as packing then pairing. */
DOT_TGT DP_INLINE void DF(dot_tpack_pair)(float *dst, const float *src, ptrdiff_t ld, int kc, int n,
                                          int w)
{
    int kv = kc / 32 * 32;
    for (int h = 0; h < w; h += 16) {
        for (int k = 0; k < kv; k += 32) DF(dot_tpack_chunk)(dst, src, ld, k, 32, h, n, w);
        if (kv < kc) DF(dot_tpack_chunk)(dst, src, ld, kv, kc - kv, h, n, w);
    }
}

/* `panels` float-packed micro-panels of kc rows each, kc * W floats apart: each becomes
 * (kc + 1) / 2 rows of W pairs at its own start, in place (the rest of its slot is left as it
 * was). */
DOT_TGT static void DF(dot_pair_a)(float *buf, int panels, int kc)
{
    for (int q = 0; q < panels; q++) {
        float *panel = buf + (ptrdiff_t)q * kc * DOT_MR;
        DF(dot_pack_pair)(panel, panel, DOT_MR, kc, DOT_MR, DOT_MR);
    }
}

DOT_TGT static void DF(dot_pair_b)(float *buf, int panels, int kc)
{
    for (int q = 0; q < panels; q++) {
        float *panel = buf + (ptrdiff_t)q * kc * DOT_NR;
        DF(dot_pack_pair)(panel, panel, DOT_NR, kc, DOT_NR, DOT_NR);
    }
}

/* The mc x kc block of a transposed A (row i at A + i, its k-th value csa further) as paired
 * 12-row micro-panels, kc * 12 floats apart (the float packing's slots) */
DOT_TGT static void DF(dot_pack_pair_a)(float *buf, const float *A, ptrdiff_t csa, int mc, int kc)
{
    for (int i = 0; i < mc; i += DOT_MR)
        DF(dot_pack_pair)(buf + (ptrdiff_t)(i / DOT_MR) * kc * DOT_MR, A + i, csa, kc,
                          mc - i < DOT_MR ? mc - i : DOT_MR, DOT_MR);
}

/* The kc x nc panel of a row-major B (row k at B + k * rsb) as paired 32-column micro-panels */
DOT_TGT static void DF(dot_pack_pair_b)(float *buf, const float *B, ptrdiff_t rsb, int kc, int nc)
{
    for (int j = 0; j < nc; j += DOT_NR)
        DF(dot_pack_pair)(buf + (ptrdiff_t)(j / DOT_NR) * kc * DOT_NR, B + j, rsb, kc,
                          nc - j < DOT_NR ? nc - j : DOT_NR, DOT_NR);
}

/* The mc x kc block of a row-major A (row i at A + i * rsa) as paired 12-row micro-panels */
DOT_TGT static void DF(dot_tpack_pair_a)(float *buf, const float *A, ptrdiff_t rsa, int mc, int kc)
{
    for (int i = 0; i < mc; i += DOT_MR)
        DF(dot_tpack_pair)(buf + (ptrdiff_t)(i / DOT_MR) * kc * DOT_MR, A + (ptrdiff_t)i * rsa, rsa,
                           kc, mc - i < DOT_MR ? mc - i : DOT_MR, DOT_MR);
}

/* The kc x nc panel of a transposed B (column j at B + j * csb) as paired 32-column
 * micro-panels */
DOT_TGT static void DF(dot_tpack_pair_b)(float *buf, const float *B, ptrdiff_t csb, int kc, int nc)
{
    for (int j = 0; j < nc; j += DOT_NR)
        DF(dot_tpack_pair)(buf + (ptrdiff_t)(j / DOT_NR) * kc * DOT_NR, B + (ptrdiff_t)j * csb, csb,
                           kc, nc - j < DOT_NR ? nc - j : DOT_NR, DOT_NR);
}

#if DOT_HW
/* acc + hi(a) hi(b) + lo(a) lo(b) per lane, a one pair broadcast */
#define DOT_STEP(acc, a, b) \
    (acc) = (V)_mm512_dpbf16_ps((__m512)(acc), (__m512bh)_mm512_set1_epi32((int)(a)), (__m512bh)(b))
#else
#define DOT_STEP(acc, a, b)                                      \
    do {                                                         \
        U a_ = (U){0} + (a);                                     \
        (acc) += (V)(a_ & 0xffff0000u) * (V)((b) & 0xffff0000u); \
        (acc) += (V)(a_ << 16) * (V)((b) << 16);                 \
    } while (0)
#endif

#define DOT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DOT_DECL(i) V c##i##_0 = {0}, c##i##_1 = {0};
#define DOT_ROW(i)                             \
    {                                          \
        uint32_t ai;                           \
        memcpy(&ai, a + (i), sizeof ai);       \
        DOT_STEP(c##i##_0, ai, b0);            \
        if (WIDE_) DOT_STEP(c##i##_1, ai, b1); \
    }
#define DOT_KEEP(i) {c##i##_0, c##i##_1},

/* The kernel's body; WIDE (a constant) 0 is the narrow tile for nr <= 16 (an output layer's
 * N = 10, the last panel of N = 32 q + r, r <= 16): 12 rows x one vector, the same sums for
 * the columns it has at half the instructions, as the float kernel's */
#define DOT_BODY(WIDE)                                 \
    {                                                  \
        enum { WIDE_ = (WIDE) };                       \
        DOT_ROWS(DOT_DECL)                             \
        for (int p = 0; p < kp; p++) {                 \
            U b0, b1 = {0};                            \
            memcpy(&b0, b, sizeof b0);                 \
            if (WIDE_) memcpy(&b1, b + 16, sizeof b1); \
            DOT_ROWS(DOT_ROW)                          \
            a += DOT_MR;                               \
            b += DOT_NR;                               \
        }                                              \
        V acc[DOT_MR][2] = {DOT_ROWS(DOT_KEEP)};       \
        DOT_STORE(C, ldc, acc, mr, nr, alpha, beta);   \
    }

/* C[0:mr, 0:nr] = alpha * (a . b) + beta * C over kp pairs: a is 12 pairs per step, b 32
 * (beta == 0: C is not read). */
DOT_TGT static void DF(dot_ukernel)(float *DP_RESTRICT C, ptrdiff_t ldc, const float *DP_RESTRICT a,
                                    const float *DP_RESTRICT b, int kp, int mr, int nr, float alpha,
                                    float beta)
{
    typedef DF(dot_vf) V;
    typedef DF(dot_vu) U;
    if (nr <= 16)
        DOT_BODY(0)
    else
        DOT_BODY(1)
}

/* The macro-kernel over an mc x kc block of paired A and a kc x nc panel of paired B, their
 * micro-panels apanel and bpanel floats apart (the slots of the float packing). */
DOT_TGT static void DF(dot_macro)(float *C, ptrdiff_t ldc, const float *A, ptrdiff_t apanel,
                                  const float *B, ptrdiff_t bpanel, int mc, int nc, int kc,
                                  float alpha, float beta)
{
    int kp = (kc + 1) / 2;
    for (int j0 = 0; j0 < nc; j0 += DOT_NR) {
        int nr = nc - j0 < DOT_NR ? nc - j0 : DOT_NR;
        const float *bp = B + (ptrdiff_t)(j0 / DOT_NR) * bpanel;
        for (int i0 = 0; i0 < mc; i0 += DOT_MR) {
            int mr = mc - i0 < DOT_MR ? mc - i0 : DOT_MR;
            DF(dot_ukernel)(C + (ptrdiff_t)i0 * ldc + j0, ldc,
                            A + (ptrdiff_t)(i0 / DOT_MR) * apanel, bp, kp, mr, nr, alpha, beta);
        }
    }
}

static const dp_gemm_dot_fns DF(dot_fns) = {
    DF(dot_pair_a),      DF(dot_pair_b),       DF(dot_macro),       DF(dot_pack_pair_a),
    DF(dot_pack_pair_b), DF(dot_tpack_pair_a), DF(dot_tpack_pair_b)};

#undef DOT_ROWS
#undef DOT_DECL
#undef DOT_ROW
#undef DOT_KEEP
#undef DOT_BODY
#undef DOT_STEP
#undef DOT_MR
#undef DOT_NR
#undef DF
#undef DCAT
#undef DCAT_
#undef DSFX
#undef DOT_TGT
#undef DOT_HW
#undef DOT_VF
#undef DOT_STORE
#undef DOT_TRANSPOSE
