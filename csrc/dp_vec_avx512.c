/* dp_vec_avx512.c - the AVX-512 (x86-64-v4) build of the vector kernels (dp_vec.h): the kernel files
 * compiled once more with DP_VEC_PASS = _avx512 under the avx512 target, so that each defines
 * its kernels as name_f32_avx512 / name_f64_avx512 and nothing else. Empty off x86. */
#include "dp_common.h"

/* (a #pragma GCC target takes a string literal, not a macro: the same string as
 * DP_TARGET_AVX512, which a test compares) */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_VEC_PASS _avx512
#define DP_VEC_BYTES 64
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target(DP_TARGET_AVX512))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma") /* DP_TARGET_AVX512 */
#endif

#include "dp_act.c"
#include "dp_allreduce.c"
#include "dp_buffers.c"
#include "dp_conv.c"
#include "dp_pool.c"
#include "dp_layers.c"
#include "dp_loss.c"
#include "dp_gemm_gemv.c" /* after dp_loss.c: see dp_gemm_gemv_tmpl.h */
#include "dp_sgd.c"
#include "dp_adam.c"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
typedef int dp_vec_avx512_empty; /* ISO C: a translation unit declares something */
#endif
