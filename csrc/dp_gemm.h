/* dp_gemm.h - dense matrix multiply for the forward/backward kernels, written here (no BLAS).
 *
 *   C = alpha * A * B + beta * C,   A is M x K, B is K x N, C is M x N (row-major, row stride ldc)
 *
 * A and B are addressed through a row stride and a column stride each, so the three variants
 * the layers need (A*B, A*B^T, A^T*B) are one routine: a transpose is a swap of the strides,
 * paid once while packing. beta == 0 never reads C (C may hold NaN garbage).
 *
 * The context owns what the routine needs besides its arguments: the intra-worker threads
 * (dp_threads.h) and one pair of packing buffers per thread. A context is used by one caller at a time.
 */
#ifndef DP_GEMM_H
#define DP_GEMM_H

#include "dp_common.h"
#include "dp_threads.h"
#include "dp_vec.h"

#define DP_MAX_THREADS 256

typedef struct {
    dp_threads *team; /* the intra-worker threads; NULL when threads == 1 */
    int threads;
    /* 1: the float GEMMs round A and B to bfloat16 (round to nearest even) as they pack them
     * and accumulate in float (bf16 x bf16 products are exact in float, so this is what
     * AVX512_BF16's vdpbf16ps computes, up to its flushing of denormals). The double GEMMs
     * ignore it. dp_ctx_init sets 0; the caller sets it. */
    int bf16_inputs;
    dp_scratch pack[2 * DP_MAX_THREADS]; /* [2t] packed A block, [2t + 1] packed B panel */
    dp_scratch ct; /* the matrix-vector path's output (dp_gemm_drv.h's gemv) */
} dp_ctx;

int dp_ctx_init(dp_ctx *ctx, int threads);
void dp_ctx_free(dp_ctx *ctx);
/* The context dp_gemm uses when given none: the calling thread's own (one thread, float
 * inputs), made at its first such call and freed when the thread ends, so that its packing
 * buffers are reused from one call to the next; NULL if it cannot be made (then dp_gemm makes
 * a context for the call). One made and freed per call cost more than a small GEMM's whole
 * call. */
dp_ctx *dp_ctx_default(void);

/* The SIMD level the dispatcher picked on this CPU: "avx2+fma" or "generic". */
const char *dp_gemm_isa(void);
/* Micro-kernel shape of the chosen path, for `dptrain info`. */
void dp_gemm_blocking(int dtype_bytes, int *mr, int *nr, int *kc, int *mc, int *nc);

int dp_gemm_f32(dp_ctx *ctx, float *C, ptrdiff_t ldc, const float *A, ptrdiff_t rsa, ptrdiff_t csa,
                const float *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K, float alpha,
                float beta);
int dp_gemm_f64(dp_ctx *ctx, double *C, ptrdiff_t ldc, const double *A, ptrdiff_t rsa,
                ptrdiff_t csa, const double *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                double alpha, double beta);

/* dp_gemm from inside a parallel region (dp_threads_region on ctx->team, n its size): each of
 * the n parts calls it with the same arguments and its own t, computes its share (the blocks
 * of C that dp_gemm cuts on n threads, or, for an accumulation with too few blocks, K slices
 * of them into `partials`, then its rows of C: see ksplit_slices in dp_gemm_drv.h; either way
 * the bits of one thread) and returns; the region's barrier after the call ends the product.
 * partials: dp_gemm_part_scratch(n, M, N, K, alpha, beta) elements, or NULL (no cut along
 * K). The matrix-vector, bfloat16 and empty cases run whole on part 0. Each part sizes its
 * own packing buffers: DP_ENOMEM from the part that could not (C is then unspecified). */
int dp_gemm_part_f32(dp_ctx *ctx, float *partials, int t, int n, float *C, ptrdiff_t ldc,
                     const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B, ptrdiff_t rsb,
                     ptrdiff_t csb, int M, int N, int K, float alpha, float beta);
int dp_gemm_part_f64(dp_ctx *ctx, double *partials, int t, int n, double *C, ptrdiff_t ldc,
                     const double *A, ptrdiff_t rsa, ptrdiff_t csa, const double *B, ptrdiff_t rsb,
                     ptrdiff_t csb, int M, int N, int K, double alpha, double beta);
size_t dp_gemm_part_scratch_f32(int n, int M, int N, int K, float alpha, float beta);
size_t dp_gemm_part_scratch_f64(int n, int M, int N, int K, double alpha, double beta);

/* dp_gemm on the calling thread with A (M, K) read in place from an image: element (i, k)
 * at x[aoff[i] + koff[k]] (the convolution's col(x) without im2col, for
 * dp_conv_image_backward's weight gradient; the k offsets are one table load per k for all
 * of a tile's rows: a branch at each output row's end in the k loop cost the micro-kernel
 * more than im2col). The same sums, so the same bits, as dp_gemm's blocked path on a
 * single-thread context (not its matrix-vector path, M or N = 1), float inputs (a context's
 * bf16_inputs is not looked at: the caller takes dp_gemm for those). ctx may be NULL (the
 * thread's default); DP_ENOMEM or DP_OK. */
int dp_gemm_patch_f32(dp_ctx *ctx, float *C, ptrdiff_t ldc, const float *x, const ptrdiff_t *aoff,
                      const ptrdiff_t *koff, const float *B, ptrdiff_t rsb, ptrdiff_t csb, int M,
                      int N, int K, float alpha, float beta);
int dp_gemm_patch_f64(dp_ctx *ctx, double *C, ptrdiff_t ldc, const double *x, const ptrdiff_t *aoff,
                      const ptrdiff_t *koff, const double *B, ptrdiff_t rsb, ptrdiff_t csb, int M,
                      int N, int K, double alpha, double beta);

/* Rounds x[0:n] to the nearest bfloat16 (ties to even) in place, as float: the low 16 bits
 * become 0. Infinities stay; a NaN stays a (quiet) NaN; a finite value above bfloat16's
 * largest rounds to infinity, as the hardware's conversion does. The readable twin (a
 * branch per case) of dp_bf16_round_bits, which the kernels use: the tests' reference. */
void dp_round_bf16(float *x, size_t n);

/* The bfloat16 GEMM's dot-product path: with dp_ctx.bf16_inputs, a float GEMM may run a
 * vdpbf16ps micro-kernel (bfloat16 pairs, float accumulation: the same bits as the rounding
 * path, except that denormals count as zero) where the CPU has AVX512_BF16 and the AVX-512
 * build is the active ISA. Whether it does is the setting's:
 *   DP_BF16_DOT_AUTO (the default): where vdpbf16ps was measured here (dp_bf16dot_peak
 *     against the float32 FMA peak, once per process, about 12 ms at the first bfloat16
 *     GEMM) to do at least DP_BF16_DOT_GAIN times the FMA's flop; 1: wherever it can run;
 *     0: never (the rounding path, float micro-kernel).
 *   dp_gemm_bf16_dot_available: 1 if the CPU and this build have it
 *   dp_gemm_bf16_dot_ratio: the measured ratio (measuring it on the first call); -1 where the
 *     path is not available
 *   dp_gemm_bf16_dot: 1 if a bfloat16-input GEMM takes the dot path now
 * Each process measures for itself: on a CPU whose ratio sits near DP_BF16_DOT_GAIN, two
 * processes of one run may choose differently, and their GEMMs then differ on denormal
 * inputs only (which vdpbf16ps reads as 0); dp_gemm_set_bf16_dot(0 or 1) pins the path.
 * (csrc/tests' wide build, DP_GEMM_EMULATE_WIDE, runs an emulation of it in the generic slot,
 * with a ratio of 2) */
#define DP_BF16_DOT_AUTO (-1)
#define DP_BF16_DOT_GAIN 1.2
int dp_gemm_bf16_dot_available(void);
void dp_gemm_set_bf16_dot(int mode);
int dp_gemm_bf16_dot_setting(
    void); /* the last dp_gemm_set_bf16_dot's (DP_BF16_DOT_AUTO at start) */
double dp_gemm_bf16_dot_ratio(void);
int dp_gemm_bf16_dot(void);
/* What the dot path is, in words (for build_info and the tests' summary). */
const char *dp_gemm_bf16_dot_name(void);

/* The bfloat16 GEMM's AMX path: with dp_ctx.bf16_inputs, a float GEMM runs on Intel AMX's
 * tiles (tdpbf16ps, dp_gemm_amx_tmpl.h) where the CPU has AMX-BF16, Linux lends the process
 * the tile state, and the AVX-512 build is the active ISA; it takes precedence over the dot
 * path. Its sums keep more precision inside an instruction than the float path's one-by-one
 * rounding: its results are within the float bound of the rounding path's, not its bits,
 * and the same on every run for the same shapes. The setting: DP_BF16_DOT_AUTO (the
 * default: wherever it can run), 1 (the same, asked for), 0 (never).
 *   dp_gemm_bf16_amx_available: 1 if this process can run it
 *   dp_gemm_bf16_amx_why: why not, in words (NULL where it can)
 *   dp_gemm_bf16_amx: 1 if a bfloat16-input GEMM with K >= DP_GEMM_AMX_MIN_K takes it now
 * (csrc/tests' wide build runs an emulation of it in the generic slot: the rounding path's
 * order, so its bits are the rounding path's) */
/* the least K a GEMM takes the AMX path for (one whole 32-k chunk; below, the dot or the
 * rounding path runs it: dp_gemm_drv.h) */
#define DP_GEMM_AMX_MIN_K 32
int dp_gemm_bf16_amx_available(void);
const char *dp_gemm_bf16_amx_why(void);
void dp_gemm_set_bf16_amx(int mode);
int dp_gemm_bf16_amx_setting(void);
int dp_gemm_bf16_amx(void);
const char *dp_gemm_bf16_amx_name(void);

/* The matrix-vector products (vector kernels, dp_vec.h: a build per ISA and the public
 * function that picks one), which the driver (dp_gemm_drv.h's gemv) takes for N = 1 or M = 1
 * with a unit-stride matrix, X (rows, len) with contiguous rows ldx apart:
 * - gemv_rows: out (rows,) = X v;
 * - gemv_cols: out (len,) = X^T v (overwritten).
 * Bodies: dp_gemm_gemv_tmpl.h, instantiated by dp_gemm_gemv.c; the logistic kernel
 * (dp_logistic_grad, dp_loss.h) fuses their blocks around the loss. */
#define DP_GEMV_VEC(X, T, S)                                                                     \
    X(void, dp_gemv_rows, S, (T *out, const T *X, ptrdiff_t ldx, const T *v, int rows, int len), \
      (out, X, ldx, v, rows, len))                                                               \
    X(void, dp_gemv_cols, S, (T *out, const T *X, ptrdiff_t ldx, const T *v, int rows, int len), \
      (out, X, ldx, v, rows, len))

/* The concrete symbols, for grep: dp_gemv_rows_f32 dp_gemv_rows_f64 dp_gemv_cols_f32
 * dp_gemv_cols_f64. */
DP_GEMV_VEC(DP_VEC_PROTO, float, _f32)
DP_GEMV_VEC(DP_VEC_PROTO, double, _f64)

/* The readable twin: a triple loop, the reference for tests and the fallback nobody needs. */
void dp_gemm_naive_f32(float *C, ptrdiff_t ldc, const float *A, ptrdiff_t rsa, ptrdiff_t csa,
                       const float *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                       float alpha, float beta);
void dp_gemm_naive_f64(double *C, ptrdiff_t ldc, const double *A, ptrdiff_t rsa, ptrdiff_t csa,
                       const double *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                       double alpha, double beta);

#endif
