/* dp_kernels.c - instantiates dp_kernels_tmpl.h for float and double.
 * Leaves out on purpose: SIMD intrinsics (these kernels are memory-bound or tiny next to the
 * GEMMs; the compiler's auto-vectorization at -O3 is enough) and any kernel that would need
 * per-call allocation. */
#include "dp_kernels.h"

#include <math.h>
#include <string.h>

#include "dp_math.h"

#define T float
#define S _f32
#define EXPNEG dp_expneg_f32
#define LOG logf
#define LOG1P01 dp_log1p01_f32
#include "dp_kernels_tmpl.h"
#undef LOG1P01
#undef LOG
#undef EXPNEG
#undef S
#undef T

#define T double
#define S _f64
#define EXPNEG dp_expneg_f64
#define LOG log
#define LOG1P01 dp_log1p01_f64
#include "dp_kernels_tmpl.h"
#undef LOG1P01
#undef LOG
#undef EXPNEG
#undef S
#undef T
