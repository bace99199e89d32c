/* dp_math.h - branch-free exp and log1p on the ranges the loss kernels need, written so that
 * the compiler can vectorize loops that call them (libm's exp/log1p are scalar calls and made
 * the logistic-regression kernel many times slower than its memory traffic).
 *
 *   dp_expneg(x) = exp(x) for x <= 0   (0 below x = -708 / -87, where exp(x) nears the
 *                                        smallest normal; NaN stays NaN so divergence shows)
 *   dp_log1p01(e) = log(1 + e) for 0 <= e <= 1
 *
 * exp: Cody & Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor
 * polynomial (degree 13 for double, 7 for float: truncation error below 2e-16 / 1.2e-7
 * relative), 2^n assembled in the exponent bits. n is read off the low mantissa bits of
 * x / ln2 + 1.5 * 2^52 (the "shifter" trick), so no float->int conversion is needed.
 * log1p: log(1 + e) = 2 atanh(u) by the odd series 2u (1 + u^2/3 + u^4/5 + ...) after a
 * range split (see dp_log1p01_f64).
 *
 * The polynomials are evaluated by Estrin's scheme (pairs c_i + c_{i+1} r, then pairs of
 * those times r^2, r^4, ...) but for their last one or two steps, which stay Horner's: 6
 * dependent multiply-adds for exp's degree 13 where Horner's rule chains 13, 5 for log1p's
 * 10, with the same accuracy (measured against expl/log1pl over 2M points: exp 0.63 eps,
 * log1p 1.94; Horner's 0.61 and 1.97). In a vectorized loop that calls both once per element
 * (the logistic loss), Horner's chains, ~100 cycles a vector, were more than the out-of-order
 * window could overlap: the loop ran at their latency.
 */
#ifndef DP_MATH_H
#define DP_MATH_H

#include <stdint.h>
#include <string.h>

#include "dp_common.h"

/* exp(r) for |r| <= ln2 / 2: 1 + r (1 + r t(r)), t(r) = sum_{2 <= k <= 13} r^(k-2) / k! by
 * Estrin's scheme (see above). The last two steps stay Horner's: they set the rounding error
 * (0.53 eps against the exact exp, measured over 2M points; Estrin's down to the 1 gave 1.9). */
DP_INLINE double dp_exp_poly_f64(double r)
{
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double a0 = 1.0 / 2 + r * (1.0 / 6), a1 = 1.0 / 24 + r * (1.0 / 120);
    double a2 = 1.0 / 720 + r * (1.0 / 5040), a3 = 1.0 / 40320 + r * (1.0 / 362880);
    double a4 = 1.0 / 3628800 + r * (1.0 / 39916800);
    double a5 = 1.0 / 479001600 + r * (1.0 / 6227020800.0);
    double t = ((a0 + r2 * a1) + r4 * (a2 + r2 * a3)) + r8 * (a4 + r2 * a5);
    return 1.0 + r * (1.0 + r * t);
}

/* exp(r) for |r| <= ln2 / 2: 1 + r (1 + r t(r)), t(r) = sum_{2 <= k <= 7} r^(k-2) / k! */
DP_INLINE float dp_exp_poly_f32(float r)
{
    float r2 = r * r, r4 = r2 * r2;
    float a0 = 0.5f + r * (1.0f / 6), a1 = 1.0f / 24 + r * (1.0f / 120);
    float a2 = 1.0f / 720 + r * (1.0f / 5040);
    float t = (a0 + r2 * a1) + r4 * a2;
    return 1.0f + r * (1.0f + r * t);
}

DP_INLINE double dp_expneg_f64(double x)
{
    const double inv_ln2 = 1.4426950408889634, shifter = 6755399441055744.0; /* 1.5 * 2^52 */
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    double x0 = x, keep = x < -708.0 ? 0.0 : 1.0;
    x = x < -708.0 ? -708.0 : x;
    double t = x * inv_ln2 + shifter;
    double n = t - shifter;
    double r = (x - n * ln2_hi) - n * ln2_lo;
    double p = dp_exp_poly_f64(r);
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 1023u) << 52; /* 2^n: n + 1023 in the exponent field */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    /* vectorized, the clamp above may become max(), which drops a NaN: put it back */
    return x0 == x0 ? p * scale * keep : x0;
}

DP_INLINE float dp_expneg_f32(float x)
{
    const float inv_ln2 = 1.44269504f, shifter = 12582912.0f; /* 1.5 * 2^23 */
    const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-06f;
    float x0 = x, keep = x < -87.0f ? 0.0f : 1.0f;
    x = x < -87.0f ? -87.0f : x;
    float t = x * inv_ln2 + shifter;
    float n = t - shifter;
    float r = (x - n * ln2_hi) - n * ln2_lo;
    float p = dp_exp_poly_f32(r);
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x0 == x0 ? p * scale * keep : x0;
}

/* log(1 + e) for e in [0, 1]: with t = 1[e > sqrt(2) - 1],
 *   log(1 + e) = t ln 2 + 2 atanh(u),  u = (e - t) / (2 + e + t),  |u| <= 3 - 2 sqrt(2) = 0.1716,
 * so u^2 <= 0.0295 and the odd series needs 11 terms (double) or 5 (float); for small e
 * (t = 0) u = e / (2 + e) keeps the result accurate in relative terms. Below e = 2^-52
 * (2^-23) the series is 1 to the last bit, and its powers of u (up to u^16, u^4) are left out:
 * they underflow into subnormals, which x86 cores compute in microcode, ~100 cycles each
 * (the logistic kernel ran slower on well-separated data, |z| > 44, exp(-44) = 2^-63). */
DP_INLINE double dp_log1p01_f64(double e)
{
    double t = e > 0.41421356237309503 ? 1.0 : 0.0;
    double u = (e - t) / (2.0 + e + t), us = e < 0x1p-52 ? 0.0 : u;
    double v = us * us, v2 = v * v, v4 = v2 * v2, v8 = v4 * v4;
    double a0 = 1.0 / 3 + v * (1.0 / 5), a1 = 1.0 / 7 + v * (1.0 / 9),
           a2 = 1.0 / 11 + v * (1.0 / 13);
    double a3 = 1.0 / 15 + v * (1.0 / 17), a4 = 1.0 / 19 + v * (1.0 / 21);
    double p = 1.0 + v * (((a0 + v2 * a1) + v4 * (a2 + v2 * a3)) + v8 * a4);
    return t * 0.69314718055994531 + 2.0 * u * p;
}

DP_INLINE float dp_log1p01_f32(float e)
{
    float t = e > 0.414213562f ? 1.0f : 0.0f;
    float u = (e - t) / (2.0f + e + t), us = e < 0x1p-23f ? 0.0f : u, v = us * us, v2 = v * v;
    float p = 1.0f + v * ((1.0f / 3 + v * (1.0f / 5)) + v2 * (1.0f / 7 + v * (1.0f / 9)));
    return t * 0.693147182f + 2.0f * u * p;
}

#endif
