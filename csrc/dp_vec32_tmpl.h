/* dp_vec32_tmpl.h - 32-byte vectors of T (GNU vector extensions, as in the GEMM's
 * micro-kernel) for the convolution's and the pooling's templates: pvec (VL values of T),
 * pmask (IT, the integer of T's width, for comparison masks), pload, pstore, pselect.
 * Included with T, S, VL, IT and K defined, by dp_conv_tmpl.h and dp_pool_tmpl.h; dp_vec_*.c
 * compile both in one unit, so the definitions come once per dtype (VL: 8 float, 4 double).
 */
#if (VL == 8 && !defined(DP_VEC32_F32)) || (VL == 4 && !defined(DP_VEC32_F64))
#if VL == 8
#define DP_VEC32_F32
#else
#define DP_VEC32_F64
#endif

typedef T K(pvec) __attribute__((vector_size(32)));
typedef IT K(pmask) __attribute__((vector_size(32)));

DP_INLINE K(pvec) K(pload)(const T *p)
{
    K(pvec) v;
    memcpy(&v, p, sizeof v);
    return v;
}

DP_INLINE void K(pstore)(T *p, K(pvec) v) { memcpy(p, &v, sizeof v); }

/* a where m is set (all ones), else b */
DP_INLINE K(pvec) K(pselect)(K(pmask) m, K(pvec) a, K(pvec) b)
{ return (K(pvec))((m & (K(pmask))a) | (~m & (K(pmask))b)); }

#endif
