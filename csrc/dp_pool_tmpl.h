/* dp_pool_tmpl.h - bodies of the kernels in dp_pool.h for one dtype (a build per ISA:
 * dp_vec.h). Included by dp_pool.c with T, S, VL, IT and the pooling's shuffle masks defined
 * (EVEN, ODD, ILO, IHI, ONES, TWOS, LOW_BYTES, SPREAD_BYTES, CODE_WORD: see dp_pool.c). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define K(name) CAT(name, S)

#include "dp_vec32_tmpl.h" /* pvec, pmask, pload, pstore, pselect */

/* VL window codes as bytes, 32 of them, and 32 bytes as integers of VL bytes */
typedef uint8_t K(pcode) __attribute__((vector_size(VL)));
typedef uint8_t K(pbytes) __attribute__((vector_size(32)));
typedef CODE_WORD K(pwords) __attribute__((vector_size(32)));

/* b beats the best so far a: larger, or the first NaN (NumPy's argmax); 1 or 0 (scalar),
 * all ones or 0 (vector) */
#define BEATS(b, a) (((b) > (a)) | (((b) != (b)) & ((a) == (a))))

void KV(dp_maxpool2_forward)(T *y, uint8_t *idx, const T *x, ptrdiff_t planes, int H, int W)
{
    // x is (planes, H, W), y and idx are (planes, H / 2, W / 2)
    // A tournament without branches (random data would mispredict every other branch): the
    // better of each window's top pair and of its bottom pair, then the bottom winner only if
    // it beats the top one, which keeps the first maximum in the order (0,0), (0,1), (1,0),
    // (1,1).
    typedef K(pvec) V;
    typedef K(pmask) M;
    const M one = ONES, two = TWOS;
    int OH = H / 2, OW = W / 2;
    const T *xend = x + planes * H * W;
    const T *yend = y + planes * OH * OW;
    for (ptrdiff_t p = 0; p < planes; p++) {
        const T *xp = x + p * H * W;
        T *yp = y + p * OH * OW;
        uint8_t *ip = idx + p * OH * OW;
        for (int i = 0; i < OH; i++) {
            const T *r0 = xp + (ptrdiff_t)2 * i * W, *r1 = r0 + W;
            T *yr = yp + (ptrdiff_t)i * OW;
            uint8_t *ir = ip + (ptrdiff_t)i * OW;
            for (int j = 0; j < OW; j += VL) {
                /* The row's last VL windows read past the row into the next ones and write
                 * past it into the next output row, which is written again later; only at
                 * the very end of the arrays does that go through a padded copy. */
                const T *t = r0 + 2 * j, *b = r1 + 2 * j;
                T tt[2 * VL] = {0}, bb[2 * VL] = {0}, ty[VL];
                uint8_t tc[VL];
                int n = OW - j < VL ? OW - j : VL;
                if (n < VL && b + 2 * VL > xend) {
                    for (int q = 0; q < 2 * n; q++) {
                        tt[q] = t[q];
                        bb[q] = b[q];
                    }
                    t = tt;
                    b = bb;
                }
                V t0 = K(pload)(t), t1 = K(pload)(t + VL);
                V b0 = K(pload)(b), b1 = K(pload)(b + VL);
                V a0 = DP_SHUFFLE(M, t0, t1, EVEN), a1 = DP_SHUFFLE(M, t0, t1, ODD);
                V c0 = DP_SHUFFLE(M, b0, b1, EVEN), c1 = DP_SHUFFLE(M, b0, b1, ODD);
                M kt = BEATS(a1, a0), kb = BEATS(c1, c0);
                V top = K(pselect)(kt, a1, a0), bot = K(pselect)(kb, c1, c0);
                M kf = BEATS(bot, top);
                M code = (kf & (two + (kb & one))) | (~kf & (kt & one));
                /* the low byte of each lane, gathered by a byte shuffle (a lane-by-lane
                 * conversion compiles to scalar extracts) */
                K(pbytes) lows = DP_SHUFFLE(K(pbytes), (K(pbytes))code, (K(pbytes))code, LOW_BYTES);
                K(pcode) bytes;
                memcpy(&bytes, &lows, VL);
                if (n == VL || yr + j + VL <= yend) {
                    K(pstore)(yr + j, K(pselect)(kf, bot, top));
                    memcpy(ir + j, &bytes, VL);
                } else {
                    K(pstore)(ty, K(pselect)(kf, bot, top));
                    memcpy(tc, &bytes, VL);
                    for (int q = 0; q < n; q++) {
                        yr[j + q] = ty[q];
                        ir[j + q] = tc[q];
                    }
                }
            }
        }
    }
}

#undef BEATS

void KV(dp_maxpool2_backward)(T *dx, const T *dy, const uint8_t *idx, ptrdiff_t planes, int H,
                              int W)
{
    // dy and idx are (planes, H / 2, W / 2), dx is (planes, H, W), every element written
    typedef K(pvec) V;
    typedef K(pmask) M;
    const M zero = {0}, one = ONES, two = TWOS, three = two + one;
    const K(pbytes) zero_bytes = {0};
    const V vzero = {0};
    int OH = H / 2, OW = W / 2;
    const T *gend = dy + planes * OH * OW;
    T *dxend = dx + planes * H * W;
    for (ptrdiff_t p = 0; p < planes; p++) {
        T *dp = dx + p * H * W;
        const T *gp = dy + p * OH * OW;
        const uint8_t *ip = idx + p * OH * OW;
        for (int i = 0; i < OH; i++) {
            T *r0 = dp + (ptrdiff_t)2 * i * W, *r1 = r0 + W;
            const T *gr = gp + (ptrdiff_t)i * OW;
            const uint8_t *ir = ip + (ptrdiff_t)i * OW;
            /* Last chunk first: its stores may run past the row pair (into r1's start and the
             * next row pair), and everything they spill into is written again afterwards:
             * r1 by this chunk's own r1 stores and the chunks before it, the next row pair
             * later. Only at the very end of the arrays does a padded copy do it. */
            for (int j = (OW - 1) / VL * VL; j >= 0; j -= VL) {
                int n = OW - j < VL ? OW - j : VL;
                const T *gsrc = gr + j;
                const uint8_t *csrc = ir + j;
                T tg[VL] = {0}, out[4 * VL];
                uint8_t tcode[VL] = {0};
                if (n < VL && gsrc + VL > gend) {
                    for (int q = 0; q < n; q++) {
                        tg[q] = gsrc[q];
                        tcode[q] = csrc[q];
                    }
                    gsrc = tg;
                    csrc = tcode;
                }
                V g = K(pload)(gsrc);
                /* the VL codes as one integer in lane 0 (a vector built from a partly
                 * written one would stall on store forwarding), then byte q to lane q's low
                 * byte, the rest 0 */
                CODE_WORD word;
                memcpy(&word, csrc, VL);
                K(pwords) words = {word};
                M k = (M)DP_SHUFFLE(K(pbytes), (K(pbytes))words, zero_bytes, SPREAD_BYTES);
                V v00 = K(pselect)(k == zero, g, vzero), v01 = K(pselect)(k == one, g, vzero);
                V v10 = K(pselect)(k == two, g, vzero), v11 = K(pselect)(k == three, g, vzero);
                int direct = n == VL || r1 + 2 * j + 2 * VL <= dxend;
                T *o0 = direct ? r0 + 2 * j : out, *o1 = direct ? r1 + 2 * j : out + 2 * VL;
                K(pstore)(o0, DP_SHUFFLE(M, v00, v01, ILO));
                K(pstore)(o0 + VL, DP_SHUFFLE(M, v00, v01, IHI));
                K(pstore)(o1, DP_SHUFFLE(M, v10, v11, ILO));
                K(pstore)(o1 + VL, DP_SHUFFLE(M, v10, v11, IHI));
                if (!direct)
                    for (int q = 0; q < 2 * n; q++) {
                        r0[2 * j + q] = out[q];
                        r1[2 * j + q] = out[2 * VL + q];
                    }
            }
            if (W & 1) r0[W - 1] = r1[W - 1] = 0;
        }
        if (H & 1) memset(dp + (ptrdiff_t)(H - 1) * W, 0, sizeof(T) * (size_t)W);
    }
}

#ifndef DP_VEC_PASS
DP_POOL_VEC(DP_VEC_DEFINE, T, S)
#endif

#undef K
