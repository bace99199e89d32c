/* dp_conv.c - see dp_conv.h; instantiates dp_conv_tmpl.h for float and double.
 * Leaves out on purpose: SIMD intrinsics (the FLOPs are in dp_gemm; im2col and col2im are
 * copies the compiler vectorizes, with GNU vector extensions where they mask, portable like
 * the GEMM's micro-kernel). */
#include "dp_conv.h"
#include "dp_buffers.h"

#include <limits.h>
#include <string.h>

#ifndef DP_VEC_PASS /* the vector kernels' builds (dp_vec.h) need only the template */
int dp_conv_out(const dp_conv_geom *g, int *OH, int *OW)
{
    if (g->C < 1 || g->H < 1 || g->W < 1 || g->OC < 1 || g->KH < 1 || g->KW < 1 || g->pad < 0 ||
        g->stride < 0)
        return DP_EVALUE;
    long long span_h = (long long)g->H + 2LL * g->pad - g->KH;
    long long span_w = (long long)g->W + 2LL * g->pad - g->KW;
    if (span_h < 0 || span_w < 0) return DP_EVALUE;
    long long oh = span_h / dp_conv_stride(g) + 1, ow = span_w / dp_conv_stride(g) + 1;
    /* every count the kernels index with an int (oh and ow first: their product of two
     * values near 2^32, from a padding near INT_MAX, would overflow a long long) */
    if (oh > INT_MAX || ow > INT_MAX) return DP_EVALUE;
    long long k = (long long)g->C * g->KH * g->KW, p = oh * ow;
    if (k > INT_MAX || p > INT_MAX || (long long)g->OC * p > INT_MAX ||
        (long long)g->C * g->H * g->W > INT_MAX)
        return DP_EVALUE;
    /* the plane path's counts: the input gradient's taps (OC KH KW) and the channel counts
     * rounded up to 8 */
    if ((long long)g->OC * g->KH * g->KW > INT_MAX || g->C > INT_MAX - 7 || g->OC > INT_MAX - 7)
        return DP_EVALUE;
    *OH = (int)oh;
    *OW = (int)ow;
    return DP_OK;
}

size_t dp_conv_col_elems(const dp_conv_geom *g)
{
    int OH, OW;
    if (dp_conv_out(g, &OH, &OW)) return 0;
    return (size_t)g->C * g->KH * g->KW * (size_t)OH * (size_t)OW + DP_CONV_COL_SLACK(g);
}

int dp_conv_generic_vec_bytes(void) { return DP_VEC_BYTES; }
#endif

/* The 32-byte vectors (dp_vec32_tmpl.h): VL values of T, IT the same-width integer, and the
 * lane indices (IOTA). */
#define T float
#define S _f32
#define VL 8
#define IT int32_t
#define IOTA {0, 1, 2, 3, 4, 5, 6, 7}
#include "dp_conv_tmpl.h"
#undef IOTA
#undef IT
#undef VL
#undef S
#undef T

#define T double
#define S _f64
#define VL 4
#define IT int64_t
#define IOTA {0, 1, 2, 3}
#include "dp_conv_tmpl.h"
#undef IOTA
#undef IT
#undef VL
#undef S
#undef T
