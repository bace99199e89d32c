/* dp_common.h - shared definitions of the plain-C core (no Python.h in any dp_* file: only the
 * bindings, module.c and mod_*.c, talk to CPython and NumPy).
 *
 * Dimension letters used across csrc/: B batch rows, IN/OUT features of a dense layer,
 * C classes, M/N/K of a GEMM (C is M x N, the reduction runs over K), P a flat parameter count.
 *
 * Error convention: every helper returns DP_OK (0) or a negative DP_E* code; the module turns
 * the code into a Python exception. Nothing here prints, exits or aborts.
 */
#ifndef DP_COMMON_H
#define DP_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define DP_OK 0
#define DP_ENOMEM (-1)  /* an allocation failed */
#define DP_ELABEL (-2)  /* a label is out of range */
#define DP_ETHREAD (-3) /* a worker thread could not be started */
#define DP_EVALUE (-4)  /* an argument value is invalid */
#define DP_EORDER (-5)  /* a step of a backward sweep out of order, or with no sweep in progress */
#define DP_EEXCHANGE (-6) /* a caller's exchange (a batch norm's statistics) failed */
#define DP_EBNSINGLE (-7) /* a batch norm in training saw one value per channel */

#if defined(__GNUC__) || defined(__clang__)
#define DP_RESTRICT __restrict__
#define DP_INLINE static inline __attribute__((always_inline))
#define DP_LIKELY(x) __builtin_expect(!!(x), 1)
#else
#define DP_RESTRICT
#define DP_INLINE static inline
#define DP_LIKELY(x) (x)
#endif

/* DP_SHUFFLE(M, a, b, i0, i1, ...): a vector of the lanes of a (indices 0..N-1) and b (N..2N-1)
 * at constant indices, N of them; M is the integer vector type of the same lane count and
 * width (GCC's __builtin_shuffle takes a mask vector of that type; Clang has only
 * __builtin_shufflevector, which takes the indices, and GCC has that only from version 12). */
#if defined(__clang__)
#define DP_SHUFFLE(M, a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)
#else
#define DP_SHUFFLE(M, a, b, ...) __builtin_shuffle((a), (b), (M){__VA_ARGS__})
#endif

/* The target of the kernels' 512-bit builds: x86-64-v4's AVX-512 subsets with the AVX2 and
 * FMA they extend (dp_cpu_has_isa(DP_ISA_AVX512) checks the same four). */
#define DP_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"

/* 1 where the compiler has AVX512_BF16's intrinsics (_mm512_dpbf16_ps): GCC 10, LLVM Clang 9,
 * Apple Clang 12 (Apple's 9-11 are older LLVMs); the vdpbf16ps code is left out elsewhere. */
#if (defined(__x86_64__) || defined(__i386__)) &&                                         \
    ((defined(__apple_build_version__) && __clang_major__ >= 12) ||                       \
     (defined(__clang__) && !defined(__apple_build_version__) && __clang_major__ >= 9) || \
     (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10))
#define DP_CC_AVX512BF16 1
#endif

/* 1 where the compiler has AMX-TILE's and AMX-BF16's intrinsics (_tile_dpbf16ps): GCC 11,
 * LLVM Clang 12; on Linux only, whose arch_prctl lends a process the tile state (5.16 on). */
#if defined(__x86_64__) && defined(__linux__) &&                                           \
    ((defined(__clang__) && !defined(__apple_build_version__) && __clang_major__ >= 12) || \
     (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11))
#define DP_CC_AMX 1
#endif

/* Packed GEMM panels and activations are aligned to a cache line (and to the widest vector). */
#define DP_ALIGN 64

void *dp_aligned_alloc(size_t bytes);
void dp_aligned_free(void *p);

/* A growable aligned scratch buffer; owned by a context, never shared between threads. */
typedef struct {
    void *ptr;
    size_t cap;
} dp_scratch;

/* Returns a buffer of at least `bytes` (contents undefined), or NULL on allocation failure. */
void *dp_scratch_get(dp_scratch *s, size_t bytes);
void dp_scratch_free(dp_scratch *s);

/* Prefetches [p, p + len) into L2 (prefetcht2; the streaming kernels' locality, see
 * dp_loss_tmpl.h's LOGREG_PF_BYTES): the lines 64 bytes apart from p, and the last byte's (a
 * fixed count, so that the loop's branch is predicted). Prefetches never fault. */
#define DP_PF_LOCALITY 1
DP_INLINE void dp_prefetch_range(const void *p, size_t len)
{
    const char *c = p;
    const size_t n = (len + 63) / 64;
    for (size_t i = 0; i < n; i++) __builtin_prefetch(c + 64 * i, 0, DP_PF_LOCALITY);
    __builtin_prefetch(c + len - 1, 0, DP_PF_LOCALITY);
}

/* Row i of dst (n rows of row_bytes) = row ix[i] of src; every ix[i] must be a row of src
 * (the caller checks). A shuffled batch's assembly: see dp_common.c for its prefetching. */
void dp_gather_rows(void *dst, const void *src, const int64_t *ix, ptrdiff_t n, size_t row_bytes);

/* Image augmentation keyed to the sample, not to the worker: row i of dst (n images of C x H
 * x W elements of `itemsize` bytes, row-major) = row i of src shifted as a random crop of the
 * image zero-padded by `pad` on each side (offsets oy, ox in [0, 2 pad]: dst[c][y][x] =
 * src[c][y + oy - pad][x + ox - pad], 0 outside), then mirrored left-right where `flip` and
 * the sample's coin say so (torchvision's RandomCrop(padding) then RandomHorizontalFlip).
 * The draw is a function of (seed, epoch, ids[i]) alone (dp_augment_draw: splitmix64), so
 * an image gets the same crop and flip whichever worker or chunk takes it. dst and src must
 * not overlap. */
void dp_augment_images(void *dst, const void *src, const int64_t *ids, ptrdiff_t n, int C, int H,
                       int W, int itemsize, int pad, int flip, uint64_t seed, int64_t epoch);
/* The sample's draw: *oy, *ox in [0, 2 pad], *flipped 0 or 1 (the reference's twin). */
void dp_augment_draw(uint64_t seed, int64_t epoch, int64_t id, int pad, int *oy, int *ox,
                     int *flipped);

/* bfloat16 (the high half of a float): the bits u of a float rounded to the nearest bfloat16,
 * ties to even, with the low half 0. A NaN stays a quiet NaN (sign and high payload kept), a
 * float above bfloat16's largest becomes inf. Branch-free so that a loop over it vectorizes
 * (a signed compare: SSE2 has none unsigned, and u & 0x7fffffff < 2^31). Used by the GEMM's
 * bfloat16 inputs and the bfloat16 buffers; dp_round_bf16 (dp_gemm.h) is its readable twin. */
/* splitmix64's output for the state z (Steele, Lea, Flood 2014): the finalizer of
 * z + golden. A counter-based draw, no state: augmentation's and dropout's. */
DP_INLINE uint64_t dp_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

DP_INLINE uint32_t dp_bf16_round_bits(uint32_t u)
{
    uint32_t rne = u + 0x7fffu + ((u >> 16) & 1u), quiet = u | 0x00400000u;
    return ((int32_t)(u & 0x7fffffffu) > 0x7f800000 ? quiet : rne) & 0xffff0000u;
}

#endif
