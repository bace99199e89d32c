/* dp_layers.h - the per-sample layers of the model engine that are not a GEMM: 2x2 average
 * pooling, global average pooling, dropout and layer normalization (plain C99; the compiler
 * vectorizes the loops).
 *
 * Layout NCHW, a row per sample as in dp_model.h. Gradients dx are WRITTEN (=); the
 * parameter gradients of layer normalization ACCUMULATE (+=).
 *
 * - avgpool2: `planes` H x W planes to H/2 x W/2 (an odd last row or column dropped, as
 *   PyTorch's AvgPool2d(2)): y = (((x00 + x01) + x10) + x11) * 0.25; dx = dy * 0.25 at the
 *   window's four values, 0 on a dropped row or column.
 * - gap (global average pooling): `planes` planes of n values to one each, summed in double
 *   in order and divided by n, then rounded; dx = dy / n (in double, rounded) on every value.
 * - dropout: a counter-based draw, no state: the unit u of row r keeps its value, times
 *   1 / (1 - p), where dp_dropout_bits(key(r), u) >= dp_dropout_threshold(p), and is 0
 *   elsewhere; key(r) = dp_dropout_key(seed, step, row0 + r, layer). So a sample's mask is a
 *   function of (seed, step, its global index in the step's batch, the layer) alone: the
 *   same on any number of workers and threads. The mask is kept (one byte per value) for
 *   backward: dx = dy * mask * 1 / (1 - p).
 * - layernorm: per row of n values, mean and variance (biased) in double, rstd = 1 / sqrt(var
 *   + eps); y = xhat gamma + beta with xhat = (x - mean) rstd rounded to T; (mean, rstd) kept
 *   per row (two doubles). Backward: g = dy gamma, dx = rstd (g - mean(g) - xhat mean(g xhat))
 *   (the means in double); dgamma += sum over rows of dy xhat, dbeta += sum of dy, for the
 *   columns [c0, c1) (the engine splits them over its threads, each column summed in row
 *   order: the bits of one thread).
 * - batch norm, per channel c of (C, HW) rows ((F,) rows: C = F, HW = 1): bn_row_sums writes
 *   each row's (sum x, sum x^2) per channel in double; the engine adds the rows in row order
 *   and, where a run has several workers, across them (its exchange), into the batch's mean
 *   and variance (biased); bn_normalize: y = (x - mean) rstd gamma + beta, with (mean, rstd)
 *   per channel, computed as x sc + sh in T (sc, sh per channel, in double then rounded).
 *   Backward: bn_grad_row_sums writes each row's (sum dy, sum dy xhat), the second as rstd
 *   (sum dy x - mean sum dy); with their batch totals (A, B) and the batch's count N,
 *   bn_backward_dx: dx = gamma rstd (dy - A / N - xhat B / N), as dy c1 + x c2 + c3 in T.
 *   Fused for the engine (each an option, NULL or 0: off): bn_normalize applies the ReLU
 *   after it (relu: dp_relu_forward's y, the ReLU stage's pass saved); bn_grad_row_sums
 *   first takes dy through that ReLU (relu_y: its output; dy is masked in place, as
 *   dp_relu_backward would); bn_backward_dx also writes each row's channel sums of dx in T
 *   (rsum, (rows, C): dp_add_row_sums's sums, the conv before's bias gradient, made while
 *   dx is in cache).
 */
#ifndef DP_LAYERS_H
#define DP_LAYERS_H

#include "dp_common.h"
#include "dp_vec.h"

#define DP_LAYERNORM_EPS 1e-5 /* PyTorch's nn.LayerNorm default */
#define DP_BATCHNORM_EPS 1e-5 /* PyTorch's nn.BatchNorm*d defaults */
#define DP_BATCHNORM_MOMENTUM 0.1

/* The row key of a dropout draw, and the 32 bits of unit u (splitmix64's output sequence from
 * the key: the finalizer of key + (u + 1) golden). */
uint64_t dp_dropout_key(uint64_t seed, int64_t step, int64_t row, int layer);
DP_INLINE uint32_t dp_dropout_bits(uint64_t key, int64_t unit)
{ return (uint32_t)(dp_mix64(key + (uint64_t)unit * 0x9e3779b97f4a7c15ULL) >> 32); }
/* The smallest kept draw: floor(p 2^32) (p in [0, 1)). */
uint32_t dp_dropout_threshold(double p);

/* Every kernel below is a vector kernel (dp_vec.h: a build per ISA, the public function
 * picks one). */
#define DP_LAYERS_VEC(X, T, S)                                                                     \
    X(void, dp_avgpool2_forward, S, (T *y, const T *x, ptrdiff_t planes, int H, int W),            \
      (y, x, planes, H, W))                                                                        \
    X(void, dp_avgpool2_backward, S, (T *dx, const T *dy, ptrdiff_t planes, int H, int W),         \
      (dx, dy, planes, H, W))                                                                      \
    X(void, dp_gap_forward, S, (T *y, const T *x, ptrdiff_t planes, int n), (y, x, planes, n))     \
    X(void, dp_gap_backward, S, (T *dx, const T *dy, ptrdiff_t planes, int n),                     \
      (dx, dy, planes, n))                                                                         \
    /* rows [0, rows) of width n; mask (rows, n) is written */                                     \
    X(void, dp_dropout_forward, S,                                                                 \
      (T *y, uint8_t *mask, const T *x, int rows, int n, double p, uint64_t seed, int64_t step,    \
       int64_t row0, int layer),                                                                   \
      (y, mask, x, rows, n, p, seed, step, row0, layer))                                           \
    X(void, dp_dropout_backward, S,                                                                \
      (T *dx, const T *dy, const uint8_t *mask, int rows, int n, double p),                        \
      (dx, dy, mask, rows, n, p))                                                                  \
    /* stats (rows, 2): mean, rstd */                                                              \
    X(void, dp_layernorm_forward, S,                                                               \
      (T *y, double *stats, const T *x, const T *gamma, const T *beta, int rows, int n),           \
      (y, stats, x, gamma, beta, rows, n))                                                         \
    /* dx (rows, n), written */                                                                    \
    X(void, dp_layernorm_backward_dx, S,                                                           \
      (T *dx, const T *dy, const T *x, const double *stats, const T *gamma, int rows, int n),      \
      (dx, dy, x, stats, gamma, rows, n))                                                          \
    /* dgamma, dbeta += over rows [0, rows), columns [c0, c1) */                                   \
    X(void, dp_layernorm_backward_params, S,                                                       \
      (T *dgamma, T *dbeta, const T *dy, const T *x, const double *stats, int rows, int n, int c0, \
       int c1),                                                                                    \
      (dgamma, dbeta, dy, x, stats, rows, n, c0, c1))                                              \
    /* sums (rows, 2 C): per row, (sum x, sum x^2) of each channel */                              \
    X(void, dp_bn_row_sums, S, (double *sums, const T *x, int rows, int C, int HW),                \
      (sums, x, rows, C, HW))                                                                      \
    /* mr (2 C): (mean, rstd) per channel */                                                       \
    X(void, dp_bn_normalize, S,                                                                    \
      (T *y, const T *x, const double *mr, const T *gamma, const T *beta, int rows, int C, int HW, \
       int relu),                                                                                  \
      (y, x, mr, gamma, beta, rows, C, HW, relu))                                                  \
    /* sums (rows, 2 C): per row, (sum dy, sum dy xhat) of each channel */                         \
    X(void, dp_bn_grad_row_sums, S,                                                                \
      (double *sums, T *dy, const T *x, const double *mr, int rows, int C, int HW,                 \
       const T *relu_y),                                                                           \
      (sums, dy, x, mr, rows, C, HW, relu_y))                                                      \
    /* tot (2 C): the batch's (A, B); count: its values per channel (N) */                         \
    X(void, dp_bn_backward_dx, S,                                                                  \
      (T *dx, const T *dy, const T *x, const double *mr, const double *tot, const T *gamma,        \
       double count, int rows, int C, int HW, T *rsum),                                            \
      (dx, dy, x, mr, tot, gamma, count, rows, C, HW, rsum))

/* The concrete symbols, for grep: dp_avgpool2_forward_f32 dp_avgpool2_forward_f64
 * dp_avgpool2_backward_f32 dp_avgpool2_backward_f64 dp_gap_forward_f32 dp_gap_forward_f64
 * dp_gap_backward_f32 dp_gap_backward_f64 dp_dropout_forward_f32 dp_dropout_forward_f64
 * dp_dropout_backward_f32 dp_dropout_backward_f64 dp_layernorm_forward_f32
 * dp_layernorm_forward_f64 dp_layernorm_backward_dx_f32 dp_layernorm_backward_dx_f64
 * dp_layernorm_backward_params_f32 dp_layernorm_backward_params_f64 */
DP_LAYERS_VEC(DP_VEC_PROTO, float, _f32)
DP_LAYERS_VEC(DP_VEC_PROTO, double, _f64)

#endif
