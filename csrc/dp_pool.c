/* dp_pool.c - see dp_pool.h; instantiates dp_pool_tmpl.h for float and double.
 * Leaves out on purpose: SIMD intrinsics (GNU vector extensions, portable like the GEMM's
 * micro-kernel). */
#include "dp_pool.h"

#include <string.h>

/* Pooling's vectors (dp_vec32_tmpl.h, dp_pool_tmpl.h): VL values per 32 bytes, IT the
 * same-width integer, shuffle masks picking the even and odd values of two vectors and
 * interleaving two back, byte shuffles between one byte per lane and VL packed bytes, and the
 * integer of VL bytes (CODE_WORD). */
#define T float
#define S _f32
#define VL 8
#define IT int32_t
#define EVEN 0, 2, 4, 6, 8, 10, 12, 14
#define ODD 1, 3, 5, 7, 9, 11, 13, 15
#define ILO 0, 8, 1, 9, 2, 10, 3, 11
#define IHI 4, 12, 5, 13, 6, 14, 7, 15
#define ONES {1, 1, 1, 1, 1, 1, 1, 1}
#define TWOS {2, 2, 2, 2, 2, 2, 2, 2}
#define LOW_BYTES                                                                                  \
    0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
        0, 0
#define CODE_WORD uint64_t
#define SPREAD_BYTES                                                                             \
    0, 32, 32, 32, 1, 32, 32, 32, 2, 32, 32, 32, 3, 32, 32, 32, 4, 32, 32, 32, 5, 32, 32, 32, 6, \
        32, 32, 32, 7, 32, 32, 32
#include "dp_pool_tmpl.h"
#undef CODE_WORD
#undef SPREAD_BYTES
#undef LOW_BYTES
#undef TWOS
#undef ONES
#undef IHI
#undef ILO
#undef ODD
#undef EVEN
#undef IT
#undef VL
#undef S
#undef T

#define T double
#define S _f64
#define VL 4
#define IT int64_t
#define EVEN 0, 2, 4, 6
#define ODD 1, 3, 5, 7
#define ILO 0, 4, 1, 5
#define IHI 2, 6, 3, 7
#define ONES {1, 1, 1, 1}
#define TWOS {2, 2, 2, 2}
#define LOW_BYTES \
    0, 8, 16, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
#define CODE_WORD uint32_t
#define SPREAD_BYTES                                                                             \
    0, 32, 32, 32, 32, 32, 32, 32, 1, 32, 32, 32, 32, 32, 32, 32, 2, 32, 32, 32, 32, 32, 32, 32, \
        3, 32, 32, 32, 32, 32, 32, 32
#include "dp_pool_tmpl.h"
#undef CODE_WORD
#undef SPREAD_BYTES
#undef LOW_BYTES
#undef TWOS
#undef ONES
#undef IHI
#undef ILO
#undef ODD
#undef EVEN
#undef IT
#undef VL
#undef S
#undef T
