/* dp_kernels.c - instantiates dp_kernels_tmpl.h for float and double.
 * Leaves out on purpose: SIMD intrinsics (these kernels are memory-bound or tiny next to the
 * GEMMs; the compiler's auto-vectorization at -O3 is enough) and any kernel that would need
 * per-call allocation. */
#include "dp_kernels.h"

#include <math.h>
#include <string.h>

#define T float
#define S _f32
#define EXP expf
#define LOG logf
#define LOG1P log1pf
#include "dp_kernels_tmpl.h"
#undef LOG1P
#undef LOG
#undef EXP
#undef S
#undef T

#define T double
#define S _f64
#define EXP exp
#define LOG log
#define LOG1P log1p
#include "dp_kernels_tmpl.h"
#undef LOG1P
#undef LOG
#undef EXP
#undef S
#undef T
