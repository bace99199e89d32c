/* dp_gemm_inst.h - one ISA build of the GEMM: dp_gemm_tmpl.h for float and for double.
 * Included by dp_gemm.c with these macros defined, which it undefines after:
 *   TGT          the build's function attribute (empty for the generic build)
 *   ISFX         the build's name suffix (_generic, _avx2, _avx512)
 *   ROWS         MR, the micro-tile's rows
 *   VL32, VL64   elements per vector for float and for double
 *   PERFECT_SHUFFLE (optional) the transpose network of dp_gemm_tmpl.h */
#define GI_CAT_(a, b) a##b
#define GI_CAT(a, b) GI_CAT_(a, b)

#define T float
#define TI int32_t
#define VL VL32
#define SUF GI_CAT(_f32, ISFX)
#include "dp_gemm_tmpl.h"
#undef SUF
#undef VL
#undef TI
#undef T

#define T double
#define TI int64_t
#define VL VL64
#define SUF GI_CAT(_f64, ISFX)
#include "dp_gemm_tmpl.h"
#undef SUF
#undef VL
#undef TI
#undef T

#undef GI_CAT
#undef GI_CAT_
#undef PERFECT_SHUFFLE
#undef VL64
#undef VL32
#undef ROWS
#undef ISFX
#undef TGT
