/* dp_conv.h - 2-D convolution (zero padding, a stride), NCHW (plain C99).
 *
 * Letters: B batch, C input channels, H/W input height/width, OC output channels, KH/KW
 * kernel height/width, PAD zero rows/columns added on every side, ST the stride, OH = (H + 2 PAD
 * - KH) / ST + 1 and OW = (W + 2 PAD - KW) / ST + 1 the output size (rounded down), P = OH OW output positions per channel, K = C KH KW
 * the length of one patch (the reduction of the convolution's GEMM).
 * Layout as PyTorch's Conv2d: x (B, C, H, W), w (OC, C, KH, KW), b (OC,), y (B, OC, OH, OW);
 * the "convolution" is a cross-correlation:
 *     y[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] x[n, c, i ST + u - PAD, j ST + v - PAD]
 * (x read as 0 outside the image). A stride above 1 takes plain loops in im2col and col2im
 * (and declines the direct and in-place paths, written for stride 1): a strided layer is one
 * of a few in a network, and its GEMM is the same (the plane path, below, takes strides).
 *
 * How: per image, im2col copies the patches into a (K, P) matrix `col` (row k = (c, u, v) holds
 * x[c, i + u - PAD, j + v - PAD] for every output position (i, j)), and the convolution is our
 * GEMM (dp_gemm.h) on it: y_n = w (OC, K) col (K, P). Backward: dw^T += col dy_n^T (recomputing
 * col; summed over the images as dw^T (K, OC), then added into dw once), dcol = w^T dy_n, and
 * col2im gathers the patches of dcol back into dx_n. A 1x1 kernel with PAD 0 needs no copy:
 * col is x_n itself. The col buffer is the caller's (a dp_scratch owned by a context or a
 * network): nothing here is file-scope state. The image functions can compute just the
 * top-left block of the output (what a 2x2 pooling reads when the output size is odd).
 *
 * The plane path (float, AVX2 and AVX-512 builds; the caller passes the weights packed once,
 * dp_conv_pack, as `wp`): whole outputs of every layer but a plain 1x1 and the direct
 * forward's short unpadded patches (every layer with padding or a stride, and unpadded
 * stride-1 layers with C KH KW > 64). The image is
 * copied once into zero-padded planes (for a stride S, its S x S phases: dp_conv_to_planes),
 * where each patch entry k of output (i, j) sits at a fixed offset ent[k] from i Wq + j, so
 * the forward is a sum of shifted vector loads times broadcast weights (dp_conv_plane, no
 * im2col: a 3x3 patch copied the image 9 times); the weight gradient is the patch GEMM
 * (dp_gemm_patch) reading the planes in place; at stride 1 the input gradient is dp_conv_plane
 * again on dy's planes with the kernel flipped, instead of a GEMM of depth OC and col2im; at a
 * stride S (up to 4: DP_CONV_MAX_STRIDE_PHASES) it is that phase by phase, each of dx's S x S
 * phases a stride-1 convolution of dy with its kernel taps, written into dx with stride S.
 * A 3x3 kernel at stride 1 and padding 1 on even maps takes Winograd's F(2x2, 3x3) instead,
 * for the forward where C >= 16 and for the input gradient (the same convolution of dy with
 * the kernel flipped and transposed) where OC >= 16: each 2x2 block of outputs from its 4x4
 * input patch with 16 multiplies a channel pair, not 36 (the weights transformed once, in
 * dp_conv_pack); its rounding differs from the direct sum's by float's ulps, not more.
 *
 * Gradients: dw and db ACCUMULATE (+=) as in dp_dense.h; dx is WRITTEN (=), every element
 * of it.
 *
 * Leaves out on purpose: dilation, groups, batching several images into
 * one GEMM (per image, col and the output stay in L2), and pooling (dp_pool.h).
 */
#ifndef DP_CONV_H
#define DP_CONV_H

#include "dp_common.h"
#include "dp_vec.h"
#include "dp_gemm.h"

typedef struct {
    int C, H, W;    /* input channels, height, width */
    int OC, KH, KW; /* output channels, kernel height and width */
    int pad;        /* zero padding on each side */
    int stride;     /* the step between output positions; 0 (an initializer without it) is 1 */
} dp_conv_geom;

/* A geometry's stride: 0 counts as 1. */
DP_INLINE int dp_conv_stride(const dp_conv_geom *g) { return g->stride > 1 ? g->stride : 1; }

/* Checks the geometry and sets the output size: DP_EVALUE when a size is < 1, pad < 0, the
 * kernel is larger than the padded input, or C KH KW, OC KH KW or OC OH OW overflows an int
 * (or C or OC rounded up to 8 would). */
int dp_conv_out(const dp_conv_geom *g, int *OH, int *OW);
/* Elements of the im2col buffer for one image: K * P and a slack of DP_CONV_COL_SLACK (col2im's
 * masked vector lanes may read up to W + KW + PAD past the end of its dcol). */
#define DP_CONV_COL_SLACK(g) ((size_t)(g)->W + (size_t)(g)->KW + (size_t)(g)->pad + 16)
size_t dp_conv_col_elems(const dp_conv_geom *g);
/* The generic build's vector bytes (DP_VEC_BYTES: 16, or 64 where csrc/tests emulates
 * AVX-512's width with -DDP_VEC_EMULATE_WIDE), for the tests' choice of expected paths. */
int dp_conv_generic_vec_bytes(void);

/* The plane path's input gradient takes strides whose S x S phases fit this (stride 4 and
 * less; a larger stride keeps GEMM + col2im). */
#define DP_CONV_MAX_STRIDE_PHASES 16

/* The vector kernels (dp_vec.h: a build per ISA and the public function that picks one):
 * - conv_direct_forward: y (OC, oh ow) = w col(x) + beta y for one image without im2col,
 *   the same bits as the im2col path; returns 1 (nothing done) where the layer does not fit
 *   (padding, ow below one vector, K = C KH KW above 64) or the build does not take it
 *   (float64, 16-byte vectors: no faster there), else 0; conv_direct_dwt: dwt (K, OC) +=
 *   col(x) dy^T for one image in the same way, where the direct forward runs on the AVX-512
 *   build (its sums in another order than the GEMM's: within the same bound, not the same
 *   bits);
 * - conv_plane: y (NO, OH OW) = the sums over entries k of wt[k OCp + o] xq[ent[k] + i Wq + j]
 *   (+ beta y), through ye (the extended positions i Wq + j, j < Wq, in whole vectors); 1
 *   where the build does not take it (float on 32- and 64-byte vectors only);
 *   conv_to_planes: x (C, H, W) as zero-padded planes (S x S phases each, Hq x Wq) and a
 *   zero tail up to nq elements; conv_wino_in / conv_wino_out: Winograd F(2x2, 3x3)'s input
 *   transform of a chunk of 2x2 tiles (read from the 2 x 2 phases) and output transform
 *   (written to y), around dp_conv_plane's 16 products (a 3x3 kernel, stride 1, padding 1,
 *   even maps, 16 input channels or more);
 * - im2col: col (K, oh ow) with row stride ldcol from x (C, H, W); col2im is its adjoint (dx
 *   is written). */
#define DP_CONV_VEC(X, T, S)                                                                   \
    X(int, dp_conv_direct_forward, S,                                                          \
      (T *y, const T *x, const T *w, const dp_conv_geom *g, int oh, int ow, T beta),           \
      (y, x, w, g, oh, ow, beta))                                                              \
    X(int, dp_conv_direct_dwt, S,                                                              \
      (T *dwt, const T *dy, const T *x, const dp_conv_geom *g, int oh, int ow),                \
      (dwt, dy, x, g, oh, ow))                                                                 \
    X(int, dp_conv_plane, S,                                                                   \
      (T *ye, ptrdiff_t lde, const T *xq, const ptrdiff_t *ent, int Kd, const T *wt, int OCp,  \
       ptrdiff_t Pe),                                                                          \
      (ye, lde, xq, ent, Kd, wt, OCp, Pe))                                                     \
    X(void, dp_conv_unext, S,                                                                  \
      (T *y, ptrdiff_t ldy, int W, int rs, int cs, ptrdiff_t off, const T *ye, ptrdiff_t lde,  \
       int NO, int R, int Cn, int Wq, T beta),                                                 \
      (y, ldy, W, rs, cs, off, ye, lde, NO, R, Cn, Wq, beta))                                  \
    X(void, dp_conv_to_planes, S,                                                              \
      (T *xq, const T *x, int C, int H, int W, int S_, int PA, int PB, int ph, int pw, int Hq, \
       int Wq, ptrdiff_t nq),                                                                  \
      (xq, x, C, H, W, S_, PA, PB, ph, pw, Hq, Wq, nq))                                        \
    X(void, dp_conv_wino_in, S,                                                                \
      (T *V, ptrdiff_t ldv, const T *xq, int C, int Hq, int Wq, ptrdiff_t p0, ptrdiff_t np),   \
      (V, ldv, xq, C, Hq, Wq, p0, np))                                                         \
    X(void, dp_conv_wino_out, S,                                                               \
      (T *y, ptrdiff_t ldy, const T *M, ptrdiff_t ldm, int OC, int OCp, int TH, int TW, int W, \
       int Wq, ptrdiff_t p0, ptrdiff_t np, T beta),                                            \
      (y, ldy, M, ldm, OC, OCp, TH, TW, W, Wq, p0, np, beta))                                  \
    X(void, dp_im2col, S,                                                                      \
      (T *col, ptrdiff_t ldcol, const T *x, const dp_conv_geom *g, int oh, int ow),            \
      (col, ldcol, x, g, oh, ow))                                                              \
    X(void, dp_col2im, S,                                                                      \
      (T *dx, const T *dcol, ptrdiff_t ldcol, const dp_conv_geom *g, int oh, int ow),          \
      (dx, dcol, ldcol, g, oh, ow))

#define DP_DECLARE_CONV(T, S)                                                                      \
    /* One image, the top-left oh x ow block of its output (oh <= OH, ow <= OW; a network    \
     * whose 2x2 pooling drops an odd last row or column never computes it): y (OC, oh ow)    \
     * = w col(x) + beta y, col a scratch of dp_conv_scratch_elems(g) elements; wp: w packed \
     * (dp_conv_pack) for the plane path, or NULL (im2col + GEMM). */     \
    int dp_conv_image_forward##S(dp_ctx *ctx, T *col, T *y, const T *x, const T *w, const T *wp,   \
                                 const dp_conv_geom *g, int oh, int ow, T beta);                   \
    /* One image, dy (OC, oh ow) the gradient of that block: dwt (K, OC) += col(x) dy^T, dw's \
     * gradient transposed (see dp_conv_add_dwt); dx = col2im(w^T dy) when dx is not NULL    \
     * (written). */    \
    int dp_conv_image_backward##S(dp_ctx *ctx, T *col, T *dwt, T *dx, const T *dy, const T *x,     \
                                  const T *w, const T *wp, const dp_conv_geom *g, int oh, int ow); \
    /* The plane path's packed weights (wp of the image calls; NULL there: not taken): their  \
     * elements, and w packed into them (after each change of w). */    \
    size_t dp_conv_pack_elems##S(const dp_conv_geom *g);                                           \
    void dp_conv_pack##S(T *wp, const T *w, const dp_conv_geom *g);                                \
    /* The image calls' scratch: im2col's buffer or the plane path's, the larger (0: a bad   \
     * geometry). */     \
    size_t dp_conv_plane_elems##S(const dp_conv_geom *g);                                          \
    size_t dp_conv_scratch_elems##S(const dp_conv_geom *g);                                        \
    /* dw (OC, K) += dwt^T */                                                                      \
    void dp_conv_add_dwt##S(T *dw, const T *dwt, const dp_conv_geom *g);                           \
    /* The batch: y = conv(x) + b; col_scratch grows to dp_conv_scratch_elems(g) +    \
     * dp_conv_pack_elems(g) + 1 elements (the image calls' scratch, the packed weights). */            \
    int dp_conv2d_forward##S(dp_ctx *ctx, dp_scratch *col_scratch, T *y, const T *x, const T *w,   \
                             const T *b, int B, const dp_conv_geom *g);                            \
    /* dw += d/dw, db += d/db of sum(dy * y); dx (optional) = d/dx, written; col_scratch    \
     * grows by OC K elements more (dw^T). */      \
    int dp_conv2d_backward##S(dp_ctx *ctx, dp_scratch *col_scratch, T *dw, T *db, T *dx,           \
                              const T *dy, const T *x, const T *w, int B, const dp_conv_geom *g);  \
    /* The readable twins: the sums above as loops, accumulated in T (tests, reference). */        \
    void dp_conv2d_forward_naive##S(T *y, const T *x, const T *w, const T *b, int B,               \
                                    const dp_conv_geom *g);                                        \
    void dp_conv2d_backward_naive##S(T *dw, T *db, T *dx, const T *dy, const T *x, const T *w,     \
                                     int B, const dp_conv_geom *g);                                \
    DP_CONV_VEC(DP_VEC_PROTO, T, S)

/* Declared above for float and double (bodies: dp_conv_tmpl.h), that is:
 * dp_conv_image_forward_f32, dp_conv_image_forward_f64,
 * dp_conv_image_backward_f32, dp_conv_image_backward_f64, dp_conv_add_dwt_f32,
 * dp_conv_add_dwt_f64, dp_im2col_f32, dp_im2col_f64, dp_col2im_f32, dp_col2im_f64,
 * dp_conv2d_forward_f32, dp_conv2d_forward_f64, dp_conv2d_backward_f32, dp_conv2d_backward_f64,
 * dp_conv2d_forward_naive_f32, dp_conv2d_forward_naive_f64, dp_conv2d_backward_naive_f32,
 * dp_conv2d_backward_naive_f64, dp_conv_direct_forward_f32, dp_conv_direct_forward_f64,
 * dp_conv_direct_dwt_f32, dp_conv_direct_dwt_f64, dp_conv_plane_f32, dp_conv_plane_f64,
 * dp_conv_to_planes_f32, dp_conv_to_planes_f64, dp_conv_pack_elems_f32, dp_conv_pack_elems_f64,
 * dp_conv_pack_f32, dp_conv_pack_f64, dp_conv_plane_elems_f32, dp_conv_plane_elems_f64,
 * dp_conv_scratch_elems_f32, dp_conv_scratch_elems_f64, dp_conv_wino_in_f32,
 * dp_conv_wino_in_f64, dp_conv_wino_out_f32, dp_conv_wino_out_f64. */
DP_DECLARE_CONV(float, _f32)
DP_DECLARE_CONV(double, _f64)

#endif
