/* dp_pool.h - 2x2 max-pooling, stride 2, NCHW (plain C99).
 *
 * Letters: `planes` independent H x W planes (B C of them in NCHW); OH = H / 2, OW = W / 2
 * rounded down (an odd last row or column is dropped, as in PyTorch's MaxPool2d). The argmax
 * of each window is recorded as a code 0..3 = 2 du + dv (du, dv the row/column offset inside
 * the window): the first maximum in the order (0,0), (0,1), (1,0), (1,1), and a NaN counts as
 * the maximum (the first NaN wins), as NumPy's argmax does.
 * Gradient: dx is WRITTEN (=), every element of it: dy where a window took its maximum, 0
 * elsewhere.
 * Bodies: dp_pool_tmpl.h, instantiated for float and double by dp_pool.c (and once per wider
 * ISA by dp_vec_*.c). Reference twins: dptrain.reference.maxpool2_forward / maxpool2_backward.
 *
 * Leaves out on purpose: other windows and strides, average pooling.
 */
#ifndef DP_POOL_H
#define DP_POOL_H

#include "dp_common.h"
#include "dp_vec.h"

/* The vector kernels (dp_vec.h: a build per ISA and the public function that picks one):
 * - maxpool2_forward: x (planes, H, W) -> y, idx (planes, H / 2, W / 2);
 * - maxpool2_backward: dx (planes, H, W) = dy put where idx says, 0 elsewhere (written). */
#define DP_POOL_VEC(X, T, S)                                                                       \
    X(void, dp_maxpool2_forward, S,                                                                \
      (T *y, uint8_t *idx, const T *x, ptrdiff_t planes, int H, int W), (y, idx, x, planes, H, W)) \
    X(void, dp_maxpool2_backward, S,                                                               \
      (T *dx, const T *dy, const uint8_t *idx, ptrdiff_t planes, int H, int W),                    \
      (dx, dy, idx, planes, H, W))

/* The concrete symbols, for grep: dp_maxpool2_forward_f32 dp_maxpool2_forward_f64
 * dp_maxpool2_backward_f32 dp_maxpool2_backward_f64. */
DP_POOL_VEC(DP_VEC_PROTO, float, _f32)
DP_POOL_VEC(DP_VEC_PROTO, double, _f64)

#endif
