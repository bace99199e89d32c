/* dp_cpu.c - CPU feature detection and the FMA peak loops (see dp_cpu.h).
 *
 * Sources: Intel SDM vol. 2A, CPUID (leaf 1 ECX: FMA bit 12, OSXSAVE 27, AVX 28; leaf 7
 * sub-leaf 0 EBX: AVX2 5, AVX512F 16, AVX512DQ 17, AVX512BW 30, AVX512VL 31, ECX: AVX512_VNNI
 * 11, EDX: AMX-BF16 22, AMX-TILE 24; sub-leaf 1 EAX: AVX512_BF16 5), and vol. 1 section 13.3 / 15.2 (XCR0: bit 1 SSE, 2 AVX,
 * 5 opmask, 6 ZMM_Hi256, 7 Hi16_ZMM must all be set before the OS can be trusted with ZMM;
 * 17 XTILECFG and 18 XTILEDATA before it can be trusted with AMX's tiles).
 * AMD's APM vol. 3 documents the same bits.
 *
 * The peak loops are instantiated from dp_cpu_fma_tmpl.h six times:
 *   fma_block_f32_generic, fma_block_f64_generic   (every build)
 *   fma_block_f32_avx2,    fma_block_f64_avx2      (x86 with GCC/Clang: target("avx2,fma"))
 *   fma_block_f32_avx512,  fma_block_f64_avx512    (x86 with GCC/Clang: target("avx512f"))
 * and dp_fma_peak_f32 / dp_fma_peak_f64 pick one after checking dp_cpu_has_isa.
 */
#include "dp_cpu.h"
#include "dp_sync.h" /* dp_clock_s */

#include <math.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_CPU_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ---- detection ------------------------------------------------------------------------ */

#ifdef DP_CPU_X86
/* XCR0, the set of register states the OS saves (XGETBV with ECX = 0); valid only when
 * CPUID reports OSXSAVE. Written as inline assembly so that no target flag is needed. */
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static int bit(unsigned reg, int n) { return (int)((reg >> n) & 1u); }

/* A hypervisor may report anything: keep the strings printable ASCII (callers decode them). */
static void printable(char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e) *s = '?';
}

/* The 48-byte brand string of leaves 0x80000002-4, without its leading and trailing blanks. */
static void read_brand(char *out, size_t n)
{
    unsigned r[12], a, b, c, d;
    char raw[49];
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x80000004u)
        return; /* int in Clang's cpuid.h */
    for (unsigned i = 0; i < 3; i++) {
        __cpuid(0x80000002u + i, a, b, c, d);
        r[4 * i] = a, r[4 * i + 1] = b, r[4 * i + 2] = c, r[4 * i + 3] = d;
    }
    memcpy(raw, r, 48);
    raw[48] = '\0';
    printable(raw);
    const char *s = raw;
    while (*s == ' ') s++;
    size_t len = strlen(s);
    while (len > 0 && s[len - 1] == ' ') len--;
    if (len >= n) len = n - 1;
    memcpy(out, s, len);
    out[len] = '\0';
}
#endif

void dp_cpu_detect(dp_cpu_features *f)
{
    memset(f, 0, sizeof *f);
#ifdef DP_CPU_X86
    unsigned a, b, c, d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf == 0) return;
    __cpuid(0, a, b, c, d);
    memcpy(f->vendor, &b, 4); /* "Auth" "enti" "cAMD": EBX, EDX, ECX */
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = '\0';
    printable(f->vendor);
    read_brand(f->brand, sizeof f->brand);

    __cpuid(1, a, b, c, d);
    uint64_t xcr0 = bit(c, 27) ? read_xcr0() : 0;
    int os_ymm = (xcr0 & 0x6u) == 0x6u;             /* SSE and AVX state */
    int os_zmm = os_ymm && (xcr0 & 0xe0u) == 0xe0u; /* opmask, ZMM_Hi256, Hi16_ZMM */
    f->avx = bit(c, 28) && os_ymm;
    f->fma = bit(c, 12) && f->avx;
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_subleaf = a;
    f->avx2 = bit(b, 5) && f->avx;
    f->avx512f = bit(b, 16) && os_zmm;
    f->avx512dq = bit(b, 17) && os_zmm;
    f->avx512bw = bit(b, 30) && os_zmm;
    f->avx512vl = bit(b, 31) && os_zmm;
    f->avx512_vnni = bit(c, 11) && os_zmm;
    int os_amx = (xcr0 & 0x60000u) == 0x60000u;
    f->amx_tile = bit(d, 24) && os_amx;
    f->amx_bf16 = bit(d, 22) && f->amx_tile;
    if (max_subleaf >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512_bf16 = bit(a, 5) && os_zmm;
    }
#endif
}

int dp_cpu_has_isa(const dp_cpu_features *f, int isa)
{
    (void)f; /* unused where only the generic loop is built */
    switch (isa) {
    case DP_ISA_GENERIC: return 1;
#ifdef DP_CPU_X86
    case DP_ISA_AVX2: return f->avx2 && f->fma;
    case DP_ISA_AVX512:
        return f->avx2 && f->fma && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
#endif
    default: return 0;
    }
}

int dp_cpu_widest_isa(const dp_cpu_features *f)
{
    for (int isa = DP_ISA_COUNT - 1; isa > DP_ISA_GENERIC; isa--)
        if (dp_cpu_has_isa(f, isa)) return isa;
    return DP_ISA_GENERIC;
}

/* -1 until the first dp_isa_active or dp_isa_select; atomics: any thread may ask first */
static int isa_active = -1;

int dp_isa_active(void)
{
    int isa = __atomic_load_n(&isa_active, __ATOMIC_RELAXED);
    if (isa >= 0) return isa;
    dp_cpu_features f;
    dp_cpu_detect(&f);
    int widest = dp_cpu_widest_isa(&f), unset = -1;
    /* a concurrent dp_isa_select wins: it was asked for */
    __atomic_compare_exchange_n(&isa_active, &unset, widest, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return __atomic_load_n(&isa_active, __ATOMIC_RELAXED);
}

int dp_isa_select(int isa)
{
    if (isa < 0 || isa >= DP_ISA_COUNT) return DP_EVALUE;
    dp_cpu_features f;
    dp_cpu_detect(&f);
    if (!dp_cpu_has_isa(&f, isa)) return DP_ENOTSUP;
    __atomic_store_n(&isa_active, isa, __ATOMIC_RELAXED);
    return DP_OK;
}

int dp_isa_from_name(const char *name)
{
    for (int i = 0; i < DP_ISA_COUNT; i++)
        if (strcmp(name, dp_isa_name(i)) == 0) return i;
    return -1;
}

const char *dp_isa_name(int isa)
{
    switch (isa) {
    case DP_ISA_GENERIC: return "generic";
    case DP_ISA_AVX2: return "avx2";
    case DP_ISA_AVX512: return "avx512";
    default: return NULL;
    }
}

int dp_isa_bits(int isa)
{
    switch (isa) {
    case DP_ISA_GENERIC: return 128;
    case DP_ISA_AVX2: return 256;
    case DP_ISA_AVX512: return 512;
    default: return 0;
    }
}

/* ---- the peak loops ------------------------------------------------------------------- */

#define VFMA(a, b, c) ((a) * (b) + (c))
#define TGT
#define VB 16
#define T float
#define SUF _f32_generic
#include "dp_cpu_fma_tmpl.h"
#undef SUF
#undef T
#define T double
#define SUF _f64_generic
#include "dp_cpu_fma_tmpl.h"
#undef SUF
#undef T
#undef VB
#undef TGT
#undef VFMA

#ifdef DP_CPU_X86
#define TGT __attribute__((target("avx2,fma")))
#define VB 32
#define T float
#define SUF _f32_avx2
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#include "dp_cpu_fma_tmpl.h"
#undef VFMA
#undef SUF
#undef T
#define T double
#define SUF _f64_avx2
#define VFMA(a, b, c) _mm256_fmadd_pd(a, b, c)
#include "dp_cpu_fma_tmpl.h"
#undef VFMA
#undef SUF
#undef T
#undef VB
#undef TGT

#define TGT __attribute__((target("avx512f")))
#define VB 64
#define T float
#define SUF _f32_avx512
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#include "dp_cpu_fma_tmpl.h"
#undef VFMA
#undef SUF
#undef T
#define T double
#define SUF _f64_avx512
#define VFMA(a, b, c) _mm512_fmadd_pd(a, b, c)
#include "dp_cpu_fma_tmpl.h"
#undef VFMA
#undef SUF
#undef T
#undef VB
#undef TGT
#endif

/* AVX512_BF16's vdpbf16ps: per round DP_FMA_CHAINS independent acc += x . y, 16 lanes of 2
 * bfloat16 pairs each (2 FMAs a lane: the 2 * 2 * 16 flop of vdpbf16ps). x = y = 2^-10 in
 * both halves: each round adds 2^-19 to each lane, which stays normal and far from overflow
 * from (0, 1] for 2^40 rounds. Compilers with the intrinsic only (DP_CC_AVX512BF16). */
#if defined(DP_CPU_X86) && defined(DP_CC_AVX512BF16)
#define DP_CPU_BF16DOT 1
__attribute__((target("avx512f,avx512bf16"),
               noinline)) static double dot_block_bf16(int64_t rounds, double m, double c)
{
    (void)m;
    (void)c;
    const __m512i x = _mm512_set1_epi32(0x3a803a80); /* bfloat16 2^-10, twice */
    __m512 acc[DP_FMA_CHAINS];
    for (int j = 0; j < DP_FMA_CHAINS; j++) acc[j] = _mm512_set1_ps((float)(j + 1) / DP_FMA_CHAINS);
    for (int64_t i = 0; i < rounds; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < DP_FMA_CHAINS; j++)
            acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)x, (__m512bh)x);
    }
    double sum = 0;
    for (int j = 0; j < DP_FMA_CHAINS; j++) sum += _mm512_reduce_add_ps(acc[j]);
    return sum;
}
#endif

typedef double (*fma_block_fn)(int64_t rounds, double m, double c);

/* Times blocks of `block` until `seconds` have passed (and at least 3 blocks with a nonzero
 * duration), doubling the rounds per block until one lasts 1 ms; returns the best block's
 * GFLOP/s. The best, not the mean: the peak is what the core sustains while it runs; a
 * moment of time-sharing on a VM is not a property of the core, and the first blocks also
 * pay the wide units' warm-up (the AVX-512 frequency licence on Intel, power gating). */
static double fma_rate(fma_block_fn block, int lanes, double seconds)
{
    const double flop_per_round = 2.0 * DP_FMA_CHAINS * lanes;
    /* 1 - 2^-20 and 2^-20: exact in float; the accumulators' fixed point is 1 */
    const double m = 1.0 - 1.0 / 1048576.0, c = 1.0 / 1048576.0;
    const double t_end = dp_clock_s() + seconds;
    double best = 0.0, sum = 0.0;
    int64_t rounds = 256;
    for (int timed = 0; timed < 3 || dp_clock_s() < t_end;) {
        double t0 = dp_clock_s();
        sum += block(rounds, m, c);
        double dt = dp_clock_s() - t0;
        if (dt > 0) {
            double rate = flop_per_round * (double)rounds / dt;
            if (rate > best) best = rate;
            timed++;
        }
        if (dt < 1e-3 && rounds < ((int64_t)1 << 40)) rounds *= 2;
    }
    volatile double keep = sum; /* the blocks' results are used */
    (void)keep;
    return best * 1e-9;
}

static int fma_peak(int isa, int f64, double seconds, double *gflops)
{
    if (isa < 0 || isa >= DP_ISA_COUNT || !(seconds > 0.0) || !isfinite(seconds)) return DP_EVALUE;
    dp_cpu_features f;
    dp_cpu_detect(&f);
    if (!dp_cpu_has_isa(&f, isa)) return DP_ENOTSUP;
    fma_block_fn block = NULL;
    switch (isa) {
    case DP_ISA_GENERIC: block = f64 ? fma_block_f64_generic : fma_block_f32_generic; break;
#ifdef DP_CPU_X86
    case DP_ISA_AVX2: block = f64 ? fma_block_f64_avx2 : fma_block_f32_avx2; break;
    case DP_ISA_AVX512: block = f64 ? fma_block_f64_avx512 : fma_block_f32_avx512; break;
#endif
    default: return DP_ENOTSUP;
    }
    *gflops = fma_rate(block, dp_isa_bits(isa) / (f64 ? 64 : 32), seconds);
    return DP_OK;
}

int dp_fma_peak_f32(int isa, double seconds, double *gflops)
{ return fma_peak(isa, 0, seconds, gflops); }

int dp_fma_peak_f64(int isa, double seconds, double *gflops)
{ return fma_peak(isa, 1, seconds, gflops); }

int dp_bf16dot_peak(double seconds, double *gflops)
{
    if (!(seconds > 0.0) || !isfinite(seconds)) return DP_EVALUE;
#ifdef DP_CPU_BF16DOT
    dp_cpu_features f;
    dp_cpu_detect(&f);
    if (!dp_cpu_has_isa(&f, DP_ISA_AVX512) || !f.avx512_bf16) return DP_ENOTSUP;
    *gflops = fma_rate(dot_block_bf16, 32, seconds); /* 16 lanes x 2 pairs: 32 FMAs */
    return DP_OK;
#else
    (void)gflops;
    return DP_ENOTSUP;
#endif
}
