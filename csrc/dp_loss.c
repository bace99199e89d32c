/* dp_loss.c - instantiates dp_loss_tmpl.h for float and double (see dp_loss.h).
 * Leaves out on purpose: SIMD intrinsics (the compiler's auto-vectorization and the GNU
 * vectors of the fused logistic kernel are enough for these memory-bound loops). */
#include "dp_loss.h"

#include <math.h>
#include <string.h>

#include "dp_math.h"

#define T float
#define TI int32_t
#define TBYTES 4
#define S _f32
#define EXPNEG dp_expneg_f32
#define LOG logf
#define LOG1P01 dp_log1p01_f32
#include "dp_loss_tmpl.h"
#undef LOG1P01
#undef LOG
#undef EXPNEG
#undef S
#undef TBYTES
#undef TI
#undef T

#define T double
#define TI int64_t
#define TBYTES 8
#define S _f64
#define EXPNEG dp_expneg_f64
#define LOG log
#define LOG1P01 dp_log1p01_f64
#include "dp_loss_tmpl.h"
#undef LOG1P01
#undef LOG
#undef EXPNEG
#undef S
#undef TBYTES
#undef TI
#undef T
