/* dp_vec_avx2.c - the AVX2+FMA build of the vector kernels (dp_vec.h): the kernel files
 * compiled once more with DP_VEC_PASS = _avx2 under the avx2 target, so that each defines
 * its kernels as name_f32_avx2 / name_f64_avx2 and nothing else. Empty off x86. */
#include "dp_common.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_VEC_PASS _avx2
#define DP_VEC_BYTES 32
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
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
typedef int dp_vec_avx2_empty; /* ISO C: a translation unit declares something */
#endif
