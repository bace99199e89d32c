/* dp_gemm_gemv.c - instantiates the GEMM's matrix-vector kernels (dp_gemm_gemv_tmpl.h) for
 * float and double: dp_gemv_rows_f32, dp_gemv_rows_f64, dp_gemv_cols_f32, dp_gemv_cols_f64
 * (see dp_gemm.h), a build per ISA (dp_vec.h). */
#include "dp_gemm.h"

#include <string.h>

#define DP_GEMV_KERNELS

#define T float
#define TI int32_t
#define TBYTES 4
#define S _f32
#include "dp_gemm_gemv_tmpl.h"
#undef S
#undef TBYTES
#undef TI
#undef T

#define T double
#define TI int64_t
#define TBYTES 8
#define S _f64
#include "dp_gemm_gemv_tmpl.h"
#undef S
#undef TBYTES
#undef TI
#undef T

#undef DP_GEMV_KERNELS
#undef KVL
