/* dp_act.c - see dp_act.h: the dtype-specific pieces of tanh and GELU (the exp of an exactly
 * split square, the normal tail's Chebyshev series, tanh's rational function near 0), then
 * dp_act_tmpl.h for float and double.
 * Leaves out on purpose: SIMD intrinsics (branch-free scalar code the compiler vectorizes, as
 * in the other kernel files; a build per ISA: dp_vec.h). */
#include "dp_act.h"

#include <math.h>
#include <string.h>

#include "dp_math.h"

/* ---- double ---------------------------------------------------------------------------- */

/* exp(hi + lo) for hi <= 0 and |lo| << 1 (0 below -708): dp_expneg_f64's Cody & Waite
 * reduction with lo added to the reduced argument r = hi - n ln2 (exact: Sterbenz), so that
 * hi + lo is never rounded as a whole (that would be an absolute error eps |hi| in the
 * exponent, a relative error of up to 708 eps in the result). */
DP_INLINE double expsum_f64(double hi, double lo)
{
    const double inv_ln2 = 1.4426950408889634, shifter = 6755399441055744.0; /* 1.5 * 2^52 */
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    double keep = hi + lo < -708.0 ? 0.0 : 1.0;
    hi = hi + lo < -708.0 ? -708.0 : hi;
    double t = (hi + lo) * inv_ln2 + shifter;
    double n = t - shifter;
    double r = (hi - n * ln2_hi) + (lo - n * ln2_lo);
    double p = dp_exp_poly_f64(r);
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 1023u) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * keep;
}

/* exp(-a^2 / 2), 0 <= a <= 40: a = ah + al with ah's low 27 mantissa bits cleared, so ah^2
 * (26 x 26 bits) and ah^2 / 2 are exact and the rest, ah al + al^2 / 2, is tiny. */
DP_INLINE double gauss_f64(double a)
{
    uint64_t bits;
    memcpy(&bits, &a, sizeof bits);
    bits &= ~(uint64_t)0x7FFFFFF;
    double ah;
    memcpy(&ah, &bits, sizeof ah);
    double al = a - ah;
    return expsum_f64(-0.5 * (ah * ah), -(ah * al + 0.5 * (al * al)));
}

/* g(t) = erfc(z) exp(z^2) (3 + z) / 3, z = 3 / t - 3, as sum_k a_k T_k(u), u = 2t - 1: degree
 * 23 (csrc/tests/gen_act_coeffs.py). Clenshaw's recurrence, unrolled so the element loop
 * around it vectorizes. */
static const double phi_cheb_f64[24] = {
    4.71146074660290653511e-1,   3.77158949691565792806e-1,   1.18036033447495454251e-1,
    2.83623466996951515153e-2,   4.87175775760554638765e-3,   4.59852387876544278611e-4,
    -2.14302223810531519356e-5,  -1.30144736992413488498e-5,  -8.80928358285351363346e-7,
    2.74648004797028445267e-7,   4.41599189922378550835e-8,   -6.39840838557548284128e-9,
    -1.67683572124846441693e-9,  1.94733547008900241467e-10,  6.24744130346938950734e-11,
    -8.12455755224449573526e-12, -2.33031461322256572524e-12, 4.19103853922533297577e-13,
    8.19333526881302985937e-14,  -2.33524721079292632895e-14, -2.24425856491653643024e-15,
    1.28114352980505061602e-15,  1.10545829653963038334e-18,  -6.44579513564903971148e-17,
};

DP_INLINE double phi_tail_g_f64(double u)
{
    double b1 = 0, b2 = 0, two_u = 2 * u;
#pragma GCC unroll 24
    for (int k = 23; k > 0; k--) {
        double b = phi_cheb_f64[k] + two_u * b1 - b2;
        b2 = b1;
        b1 = b;
    }
    return phi_cheb_f64[0] + u * b1 - b2;
}

/* tanh x = x P(x^2) / Q(x^2), Lambert's continued fraction cut after 15: 8e-19 relative for
 * |x| <= 0.55 */
DP_INLINE double tanh_near0_f64(double x)
{
    double s = x * x;
    double p = ((36.0 * s + 6930.0) * s + 270270.0) * s + 2027025.0;
    double q = (((s + 630.0) * s + 51975.0) * s + 945945.0) * s + 2027025.0;
    return x * p / q;
}

/* ---- float ------------------------------------------------------------------------------ */

DP_INLINE float expsum_f32(float hi, float lo)
{
    const float inv_ln2 = 1.44269504f, shifter = 12582912.0f; /* 1.5 * 2^23 */
    const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-06f;
    float keep = hi + lo < -87.0f ? 0.0f : 1.0f;
    hi = hi + lo < -87.0f ? -87.0f : hi;
    float t = (hi + lo) * inv_ln2 + shifter;
    float n = t - shifter;
    float r = (hi - n * ln2_hi) + (lo - n * ln2_lo);
    float p = dp_exp_poly_f32(r);
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * keep;
}

/* exp(-a^2 / 2), 0 <= a <= 14: ah keeps 12 significant bits (ah^2 exact in 24) */
DP_INLINE float gauss_f32(float a)
{
    uint32_t bits;
    memcpy(&bits, &a, sizeof bits);
    bits &= ~(uint32_t)0xFFF;
    float ah;
    memcpy(&ah, &bits, sizeof ah);
    float al = a - ah;
    return expsum_f32(-0.5f * (ah * ah), -(ah * al + 0.5f * (al * al)));
}

/* the same series cut at degree 10: 2.5e-7 relative */
static const float phi_cheb_f32[11] = {
    4.71146074660290653511e-1f,  3.77158949691565792806e-1f,  1.18036033447495454251e-1f,
    2.83623466996951515153e-2f,  4.87175775760554638765e-3f,  4.59852387876544278611e-4f,
    -2.14302223810531519356e-5f, -1.30144736992413488498e-5f, -8.80928358285351363346e-7f,
    2.74648004797028445267e-7f,  4.41599189922378550835e-8f,
};

DP_INLINE float phi_tail_g_f32(float u)
{
    float b1 = 0, b2 = 0, two_u = 2 * u;
#pragma GCC unroll 11
    for (int k = 10; k > 0; k--) {
        float b = phi_cheb_f32[k] + two_u * b1 - b2;
        b2 = b1;
        b1 = b;
    }
    return phi_cheb_f32[0] + u * b1 - b2;
}

/* cut after 9: 2e-10 relative for |x| <= 0.55 */
DP_INLINE float tanh_near0_f32(float x)
{
    float s = x * x;
    float p = (s + 105.0f) * s + 945.0f;
    float q = (15.0f * s + 420.0f) * s + 945.0f;
    return x * p / q;
}

#define T float
#define S _f32
#define EXPNEG dp_expneg_f32
#define GAUSS gauss_f32
#define GELU_AMAX 14.0f /* exp(-14^2 / 2) = 3e-43: below float's normals */
#define PHI_TAIL_G phi_tail_g_f32
#define TANH_NEAR0 tanh_near0_f32
#define TANH_LIBM tanhf
#define EXP_LIBM expf
#define ERFC_LIBM erfcf
#include "dp_act_tmpl.h"
#undef ERFC_LIBM
#undef EXP_LIBM
#undef TANH_LIBM
#undef TANH_NEAR0
#undef PHI_TAIL_G
#undef GELU_AMAX
#undef GAUSS
#undef EXPNEG
#undef S
#undef T

#define T double
#define S _f64
#define EXPNEG dp_expneg_f64
#define GAUSS gauss_f64
#define GELU_AMAX 40.0 /* exp(-40^2 / 2) = 0 in double */
#define PHI_TAIL_G phi_tail_g_f64
#define TANH_NEAR0 tanh_near0_f64
#define TANH_LIBM tanh
#define EXP_LIBM exp
#define ERFC_LIBM erfc
#include "dp_act_tmpl.h"
#undef ERFC_LIBM
#undef EXP_LIBM
#undef TANH_LIBM
#undef TANH_NEAR0
#undef PHI_TAIL_G
#undef GELU_AMAX
#undef GAUSS
#undef EXPNEG
#undef S
#undef T
