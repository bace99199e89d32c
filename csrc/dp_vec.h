/* dp_vec.h - the vector kernels: one source, a build per ISA, and the dispatch between them.
 *
 * A vector kernel is a memory-bound loop the compiler vectorizes (activations, losses, bias,
 * im2col/col2im, pooling, SGD, the buffer sums and the all-reduce's reductions). Each is
 * written once, in its file's template, under the name KV(name), and compiled three times:
 *   generic  in its own file (dp_act.c, dp_buffers.c, dp_conv.c, dp_loss.c, dp_sgd.c), for
 *            the baseline ISA: name_f32_generic;
 *   avx2     in dp_vec_avx2.c, which includes those files with DP_VEC_PASS = _avx2 under
 *            #pragma GCC target("avx2,fma"): name_f32_avx2;
 *   avx512   in dp_vec_avx512.c, the same under DP_TARGET_AVX512: name_f32_avx512.
 * In a DP_VEC_PASS build a file compiles its vector kernels only (the rest of it, e.g. the
 * naive twins and the drivers, is under #ifndef DP_VEC_PASS).
 *
 * Each header lists its vector kernels once, as X(ret, name, S, (params), (args)) entries of
 * a DP_*_VEC(X, T, S) list. DP_VEC_PROTO declares from it the public function and the builds;
 * DP_VEC_DEFINE (in the generic file) defines the public function, which calls the build of
 * the ISA dp_isa_active() names (dp_cpu.h: the widest the CPU has, or DPTRAIN_ISA /
 * _core.set_isa's choice): one predictable branch per call of a kernel that walks an array.
 *
 * Off x86, or without GCC/Clang, only the generic build exists and the public function calls
 * it. Leaves out on purpose: GCC's target_clones (the loader's ifunc picks a clone from the
 * CPU alone, so a path could not be forced for tests and benchmarks) and intrinsics (the
 * kernels are plain loops; the ISA is the compiler's target).
 */
#ifndef DP_VEC_H
#define DP_VEC_H

#include "dp_cpu.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_VEC_X86 1
#endif

#define DP_VEC_CAT_(a, b) a##b
#define DP_VEC_CAT(a, b) DP_VEC_CAT_(a, b)

/* the suffix of the build being compiled, and the width of its vectors in bytes (for the
 * kernels that write GNU vectors by hand; wider than the ISA's registers, GCC splits them
 * through memory) */
#ifdef DP_VEC_PASS
#define DP_VEC_SFX DP_VEC_PASS
#else
#define DP_VEC_SFX _generic
#ifdef DP_VEC_EMULATE_WIDE
/* csrc/tests' wide build: the generic build with the AVX-512 build's vector width, so that
 * the hand-written 64-byte vector code (the logistic kernel's 8- and 16-lane reductions) runs
 * on any CPU, GCC splitting the vectors */
#define DP_VEC_BYTES 64
#else
#define DP_VEC_BYTES 16
#endif
#endif

/* KV(name): a vector kernel's name in this build; templates define K(name) (name + dtype) */
#define KV(name) DP_VEC_CAT(K(name), DP_VEC_SFX)

#ifdef DP_VEC_X86
#define DP_VEC_PROTO_WIDE(ret, f, params) \
    ret f##_avx2 params;                  \
    ret f##_avx512 params;
#define DP_VEC_CALL(f, args)                    \
    switch (dp_isa_active()) {                  \
    case DP_ISA_AVX512: return f##_avx512 args; \
    case DP_ISA_AVX2: return f##_avx2 args;     \
    default: return f##_generic args;           \
    }
#else
#define DP_VEC_PROTO_WIDE(ret, f, params)
#define DP_VEC_CALL(f, args) return f##_generic args;
#endif

#define DP_VEC_PROTO(ret, name, S, params, args) \
    ret name##S params;                          \
    ret name##S##_generic params;                \
    DP_VEC_PROTO_WIDE(ret, name##S, params)

#define DP_VEC_DEFINE(ret, name, S, params, args) \
    ret name##S params { DP_VEC_CALL(name##S, args) }

#endif
