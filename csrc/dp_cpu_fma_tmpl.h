/* dp_cpu_fma_tmpl.h - the timed block of dp_cpu.c's FMA peak, for one dtype and one ISA.
 * Included by dp_cpu.c once per (dtype, ISA) with these macros defined:
 *   T      element type (float or double)
 *   VB     bytes in one vector (16 generic, 32 AVX2, 64 AVX-512)
 *   TGT    function attribute selecting the ISA (empty for the generic build)
 *   SUF    name suffix, e.g. _f32_avx2
 *   VFMA(a, b, c)  a * b + c on two vectors: an intrinsic for the wide ISAs (always one fused
 *          vfmadd), the plain expression for the generic build (fused where the target has an
 *          FMA and -ffp-contract allows it, a multiply and an add otherwise)
 *
 * Assumptions: 0 < m < 1 and 0 <= c, so every accumulator stays in [0, max(1, c / (1 - m))]
 * from its start in (0, 1]: no overflow, and no subnormal operand to slow the FMA down.
 */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define F(name) CAT(name, SUF)

typedef T F(fvec_t) __attribute__((vector_size(VB)));

/* `rounds` rounds of DP_FMA_CHAINS independent acc = acc * m + c (the chains hide the FMA
 * latency; nothing but the FMAs and the loop counter runs). Returns the sum of every lane of
 * every accumulator, so that none of the work can be left out by the compiler. noinline:
 * it is called through a pointer anyway, and its loop is what the disassembly should show. */
TGT __attribute__((noinline)) static double F(fma_block)(int64_t rounds, double m, double c)
{
    const F(fvec_t) vm = (F(fvec_t)){0} + (T)m, vc = (F(fvec_t)){0} + (T)c;
    F(fvec_t) acc[DP_FMA_CHAINS];
    for (int j = 0; j < DP_FMA_CHAINS; j++) acc[j] = (F(fvec_t)){0} + (T)(j + 1) / DP_FMA_CHAINS;
    for (int64_t i = 0; i < rounds; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < DP_FMA_CHAINS; j++) acc[j] = VFMA(acc[j], vm, vc);
    }
    double sum = 0;
    for (int j = 0; j < DP_FMA_CHAINS; j++)
        for (int l = 0; l < (int)(VB / sizeof(T)); l++) sum += acc[j][l];
    return sum;
}

#undef F
#undef CAT
#undef CAT_
