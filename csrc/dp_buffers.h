/* dp_buffers.h - flat-buffer arithmetic for the gradient exchange: the sum of the workers'
 * buffers and the averaging scale.
 *
 * Letters: k buffers, [start, stop) an element range of them. Every buffer is 1-D of one
 * length; the sum is taken in the order the buffers are given, so a result does not depend
 * on how a range is split between callers. Bodies: dp_buffers_tmpl.h, instantiated for float
 * and double by dp_buffers.c (and once per wider ISA by dp_vec_*.c).
 * Reference twins: dptrain.reference.sum_buffers / scale_.
 *
 * Leaves out on purpose: the shared-memory group's all-reduce, which also synchronizes
 * (dp_allreduce.h).
 */
#ifndef DP_BUFFERS_H
#define DP_BUFFERS_H

#include "dp_common.h"
#include "dp_vec.h"

/* The vector kernels (dp_vec.h: a build per ISA and the public function that picks one):
 * - sum_buffers: out[start:stop] = scale * (ins[0] + ins[1] + ... + ins[k-1])[start:stop],
 *   added left to right; out may be one of the inputs;
 * - scale: buf[0:n] *= alpha;
 * - bias_relu / bias_add: y (OC, n) += b[o] in row o (bias_relu then max(., 0), a NaN stays
 *   NaN); add_row_sums: db[o] += the sum of row o of d (OC, n), in 8 interleaved partial sums.
 *   The bias passes of dp_model's layers;
 * - sum_squares: the sum of x[0:n]^2 in double, in DP_SQUARES_LANES interleaved partial sums
 *   (lane j takes the elements i with i mod DP_SQUARES_LANES == j, in order), then the lanes
 *   added in order: gradient clipping's norm, the same bits on every worker and in every
 *   ISA's build for float32 (a float's square is exact in double, so a fused multiply-add
 *   rounds as the add alone); a float64 buffer's may differ in its last bit between builds
 *   with and without FMA. */
#define DP_SQUARES_LANES 16
#define DP_BUFFERS_VEC(X, T, S)                                                       \
    X(void, dp_sum_buffers, S,                                                        \
      (T *out, const T *const *ins, int k, ptrdiff_t start, ptrdiff_t stop, T scale), \
      (out, ins, k, start, stop, scale))                                              \
    X(void, dp_scale, S, (T *buf, ptrdiff_t n, T alpha), (buf, n, alpha))             \
    X(void, dp_bias_relu, S, (T *y, const T *b, int OC, int n), (y, b, OC, n))        \
    X(void, dp_bias_add, S, (T *y, const T *b, int OC, int n), (y, b, OC, n))         \
    X(void, dp_add_row_sums, S, (T *db, const T *d, int OC, int n), (db, d, OC, n))   \
    X(double, dp_sum_squares, S, (const T *x, ptrdiff_t n), (x, n))

/* bfloat16 (the high 16 bits of a float, held as uint16_t) for the gradient exchange of
 * mixed precision, vector kernels too (suffix _bf16):
 * - dp_to_bf16: out[0:n] = x[0:n] rounded to the nearest bfloat16, ties to even (a NaN
 *   stays a quiet NaN, a float above bfloat16's largest becomes inf): dp_round_bf16's bits;
 * - dp_from_bf16: out[0:n] = x[0:n] widened to float (exact);
 * - dp_sum_bf16: out[start:stop] = scale * (ins[0] + ... + ins[k-1])[start:stop] summed in
 *   float, each input widened exactly, added left to right (as dp_sum_buffers), then rounded
 *   to bfloat16 as dp_to_bf16: a bfloat16 all-reduce moves bfloat16 both ways. out may be
 *   one of the inputs. */
#define DP_BF16_VEC(X, T, S)                                                              \
    X(void, dp_to_bf16, S, (uint16_t *out, const float *x, ptrdiff_t n), (out, x, n))     \
    X(void, dp_from_bf16, S, (float *out, const uint16_t *x, ptrdiff_t n), (out, x, n))   \
    X(void, dp_sum_bf16, S,                                                               \
      (uint16_t *out, const uint16_t *const *ins, int k, ptrdiff_t start, ptrdiff_t stop, \
       float scale),                                                                      \
      (out, ins, k, start, stop, scale))

/* The concrete symbols, for grep: dp_to_bf16 dp_from_bf16 dp_sum_bf16 dp_sum_buffers_f32 dp_sum_buffers_f64 dp_scale_f32
 * dp_scale_f64 dp_bias_relu_f32 dp_bias_relu_f64 dp_bias_add_f32 dp_bias_add_f64
 * dp_add_row_sums_f32 dp_add_row_sums_f64 dp_sum_squares_f32 dp_sum_squares_f64. */
DP_BUFFERS_VEC(DP_VEC_PROTO, float, _f32)
DP_BUFFERS_VEC(DP_VEC_PROTO, double, _f64)
DP_BF16_VEC(DP_VEC_PROTO, float, )

#endif
