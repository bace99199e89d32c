/* dp_cpu.h - what this CPU can do: run-time feature detection and the measured FMA peak.
 *
 * Detection reads CPUID (leaves 0, 1, 7 sub-leaves 0 and 1, and the 0x8000000x brand leaves)
 * and XCR0 (XGETBV): a vector feature counts only when the CPU has it AND the OS saves its
 * registers on a context switch (AVX, FMA, AVX2: OSXSAVE and XCR0 bits 1, 2; AVX-512:
 * XCR0 bits 5, 6, 7 as well). A hypervisor can hide either half; then the flag is false.
 * On other architectures (and compilers without GNU inline assembly) every flag is false.
 *
 * The peak: dp_fma_peak_f32/f64 time a loop of independent vector FMAs (acc = acc * m + c,
 * DP_FMA_CHAINS accumulators, enough to cover the FMA latency on two pipes) on ONE thread of
 * the caller and return the best rate of its timed blocks in GFLOP/s (an FMA counts 2 flop
 * per lane). This is the ceiling a compute-bound kernel of that vector width can reach on this
 * core at the clock it runs now, a figure measured on the machine rather than a datasheet's.
 *
 * ISAs: DP_ISA_GENERIC is the portable build (GNU vectors of 16 bytes, the baseline width of
 * x86-64 and AArch64; whatever the compiler makes of a*b+c, fused where -ffp-contract allows
 * and the baseline has an FMA); DP_ISA_AVX2 is 256-bit vfmadd (target "avx2,fma", the ISA
 * of our GEMM's fast path); DP_ISA_AVX512 is 512-bit vfmadd (target "avx512f"). No compiler
 * flag is needed: the wide loops carry target attributes and run only where detection says.
 *
 * The ISA the kernels run: one process-wide choice (dp_isa_active), the widest the CPU has
 * until dp_isa_select (DPTRAIN_ISA at import, _core.set_isa) changes it. The GEMM and the
 * vector kernels read it on every call, so a change applies from the next call on; it is
 * meant for start-up, tests and benchmarks, not for while other threads run kernels.
 * DP_ISA_AVX512 asks for F, BW, VL and DQ (x86-64-v4: every AVX-512 core since Skylake-SP
 * and Zen 4), since the kernels' 512-bit build is compiled for all four.
 *
 * Leaves out on purpose: caching the detection (it is a handful of CPUID instructions), frequency and power reporting (the VM gives no access), AMX, SVE and
 * multi-thread peaks (the caller runs one measurement per thread if it wants them).
 */
#ifndef DP_CPU_H
#define DP_CPU_H

#include "dp_common.h"

#define DP_ENOTSUP (-20) /* the CPU (or this build) lacks the requested instruction set */

/* ISAs of the peak loops, in increasing vector width. */
#define DP_ISA_GENERIC 0
#define DP_ISA_AVX2 1
#define DP_ISA_AVX512 2
#define DP_ISA_COUNT 3

/* Independent FMA chains per loop: 12 covers 2 pipes x a latency of up to 6 cycles, and
 * leaves room for the two broadcast operands in 16 ymm / xmm registers. */
#define DP_FMA_CHAINS 12

typedef struct {
    char vendor[13];    /* CPUID leaf 0, e.g. "AuthenticAMD"; "" where unknown */
    char brand[49];     /* leaves 0x80000002-4, leading blanks dropped; "" where unknown */
    int avx, fma, avx2; /* each with the OS saving the YMM state */
    int avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni, avx512_bf16; /* and ZMM state */
    int amx_tile, amx_bf16; /* AMX, with the OS saving the tile state (XCR0 bits 17, 18); Linux
                             * still lends the tile data only on request (dp_gemm_amx.h) */
} dp_cpu_features;

/* Fills *f (never fails; all zero off x86). */
void dp_cpu_detect(dp_cpu_features *f);

/* 1 if the peak loop of `isa` can run here (on this CPU, with this build), else 0. */
int dp_cpu_has_isa(const dp_cpu_features *f, int isa);
/* The widest ISA dp_cpu_has_isa accepts (DP_ISA_GENERIC at least). */
int dp_cpu_widest_isa(const dp_cpu_features *f);
/* "generic", "avx2", "avx512"; NULL for an unknown isa. */
const char *dp_isa_name(int isa);
/* Vector bits of the isa's peak loop (128, 256, 512); 0 for an unknown isa. */
int dp_isa_bits(int isa);

/* One thread's FMA throughput of `isa` in GFLOP/s, timed for about `seconds` (0 < seconds,
 * finite). Returns DP_OK, DP_EVALUE (unknown isa, bad seconds) or DP_ENOTSUP (the CPU or the
 * build lacks the isa; *gflops is then untouched). */
/* The ISA the kernels run now (the widest the CPU has until a dp_isa_select). */
int dp_isa_active(void);
/* Makes `isa` the kernels' ISA: DP_OK, DP_EVALUE (unknown isa) or DP_ENOTSUP (the CPU or the
 * build lacks it; the active ISA is then unchanged). */
int dp_isa_select(int isa);
/* The DP_ISA_* of "generic", "avx2" or "avx512"; -1 for any other name. */
int dp_isa_from_name(const char *name);

int dp_fma_peak_f32(int isa, double seconds, double *gflops);
/* The same for AVX512_BF16's vdpbf16ps (zmm, float32 accumulators, bfloat16 pairs; 64 flop an
 * instruction): DP_ENOTSUP where the CPU (AVX-512 and AVX512_BF16) or the compiler lacks it.
 * Measured, not assumed: its issue time against the FMA's differs between CPUs, and where
 * it is long the instruction's doubled flop per lane does not pay. */
int dp_bf16dot_peak(double seconds, double *gflops);
int dp_fma_peak_f64(int isa, double seconds, double *gflops);

#endif
