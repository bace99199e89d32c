/* dp_gemm.c - instantiates the GEMM for float and double, each built for three ISAs
 * (generic, AVX2+FMA, AVX-512), and runs the build of the ISA dp_isa_active() names
 * (dp_cpu.h: the widest the CPU has, or what DPTRAIN_ISA / _core.set_isa chose).
 * Leaves out on purpose: complex types and any BLAS fallback. */
#include "dp_gemm.h"
#include "dp_cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_HAVE_X86_FAST 1
#endif

/* ---- instantiations ----
 * generic: 16-byte GNU vectors, 6 x 2 tiles, no target (SSE2 on x86-64, NEON on ARM);
 * avx2:    32-byte vectors, 6 x 2 tiles, under target("avx2,fma");
 * avx512:  64-byte vectors, 12 x 2 tiles, under the x86-64-v4 target.
 * DP_GEMM_EMULATE_WIDE (csrc/tests only) builds the generic slot with the avx512 slot's
 * shape and no target, so that its packing, tiles and edges run on any CPU. */
#define TGT
#define ISFX _generic
#define PERFECT_SHUFFLE 1
#ifdef DP_GEMM_EMULATE_WIDE
#define ROWS 12
#define VL32 16
#define VL64 8
#else
/* 16-byte vectors, the baseline's own width: 32-byte GNU vectors on a 16-byte ISA were split
 * by GCC through memory, many times slower than the AVX2 build */
#define ROWS 6
#define VL32 4
#define VL64 2
#endif
#include "dp_gemm_inst.h"

#ifdef DP_HAVE_X86_FAST
#define TGT __attribute__((target("avx2,fma")))
#define ISFX _avx2
#define ROWS 6
#define VL32 8
#define VL64 4
#include "dp_gemm_inst.h"

#define TGT __attribute__((target(DP_TARGET_AVX512)))
#define ISFX _avx512
#define PERFECT_SHUFFLE 1
#define ROWS 12
#define VL32 16
#define VL64 8
#include "dp_gemm_inst.h"
#endif

/* ---- the bfloat16 dot-product path (dp_gemm_dot_tmpl.h): float32 GEMMs with bfloat16 inputs
 * on a CPU with AVX512_BF16, while the AVX-512 build is the active one. Compilers with the
 * intrinsic only (DP_CC_AVX512BF16, dp_common.h); with an older one the path is left out and
 * the rounding path (float micro-kernel) runs everywhere. */
#if defined(DP_HAVE_X86_FAST) && defined(DP_CC_AVX512BF16)
#define DP_HAVE_BF16DOT 1
#include <immintrin.h>
#endif

typedef struct {
    void (*pair_a)(float *, int, int);
    void (*pair_b)(float *, int, int);
    void (*macro)(float *, ptrdiff_t, const float *, ptrdiff_t, const float *, ptrdiff_t, int, int,
                  int, float, float);
    /* packing, rounding and pairing in one pass where the source's rows are contiguous:
     * (dst, A, csa, mc, kc) for a transposed A (rsa == 1), (dst, B, rsb, kc, nc) for a
     * row-major B (csb == 1) */
    void (*pack_pair_a)(float *, const float *, ptrdiff_t, int, int);
    void (*pack_pair_b)(float *, const float *, ptrdiff_t, int, int);
    /* the same where the source's columns are contiguous (dp_gemm_dot_tmpl.h's
     * dot_tpack_pair): (dst, A, rsa, mc, kc) for a row-major A (csa == 1), (dst, B, csb, kc,
     * nc) for a transposed B (rsb == 1) */
    void (*tpack_pair_a)(float *, const float *, ptrdiff_t, int, int);
    void (*tpack_pair_b)(float *, const float *, ptrdiff_t, int, int);
} dp_gemm_dot_fns;

#ifdef DP_HAVE_BF16DOT
#define DSFX _avx512bf16
#define DOT_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,avx512bf16")))
#define DOT_HW 1
#define DOT_VF vec_t_f32_avx512
#define DOT_STORE store_tile_f32_avx512
#define DOT_TRANSPOSE transpose_f32_avx512
#include "dp_gemm_dot_tmpl.h"
#endif
#ifdef DP_GEMM_EMULATE_WIDE
#define DSFX _emul
#define DOT_TGT
#define DOT_HW 0
#define DOT_VF vec_t_f32_generic
#define DOT_STORE store_tile_f32_generic
#define DOT_TRANSPOSE transpose_f32_generic
#include "dp_gemm_dot_tmpl.h"
#endif

/* The dot path's setting (dp_gemm_set_bf16_dot): DP_BF16_DOT_AUTO until set. The CPU's
 * AVX512_BF16: -1 until first asked (CPUID is slow under a hypervisor, and this is asked once
 * per GEMM). Auto's measurement: the vdpbf16ps / float32 FMA flop ratio, < 0 until measured. */
static int bf16_dot_mode = DP_BF16_DOT_AUTO;
#ifdef DP_HAVE_BF16DOT
static int bf16_dot_cpu = -1;
#endif
static double bf16_dot_ratio = -1.0;

/* 1 if this CPU can run the vdpbf16ps build (AVX-512 and AVX512_BF16, the OS saving zmm) */
static int cpu_has_bf16dot(void)
{
#ifdef DP_HAVE_BF16DOT
    int have = __atomic_load_n(&bf16_dot_cpu, __ATOMIC_RELAXED);
    if (have < 0) {
        dp_cpu_features f;
        dp_cpu_detect(&f);
        have = dp_cpu_has_isa(&f, DP_ISA_AVX512) && f.avx512_bf16;
        __atomic_store_n(&bf16_dot_cpu, have, __ATOMIC_RELAXED);
    }
    return have;
#else
    return 0;
#endif
}

int dp_gemm_bf16_dot_available(void)
{
#ifdef DP_GEMM_EMULATE_WIDE
    return 1; /* the emulation, in the generic slot, on any CPU */
#else
    return cpu_has_bf16dot();
#endif
}

/* a path's setting: DP_BF16_DOT_AUTO, or any other value as 0 / 1 */
static void set_mode(int *slot, int mode)
{
    if (mode != DP_BF16_DOT_AUTO) mode = mode != 0;
    __atomic_store_n(slot, mode, __ATOMIC_RELAXED);
}

void dp_gemm_set_bf16_dot(int mode) { set_mode(&bf16_dot_mode, mode); }

int dp_gemm_bf16_dot_setting(void) { return __atomic_load_n(&bf16_dot_mode, __ATOMIC_RELAXED); }

double dp_gemm_bf16_dot_ratio(void)
{
    double r;
    __atomic_load(&bf16_dot_ratio, &r, __ATOMIC_RELAXED);
    if (r >= 0 || !dp_gemm_bf16_dot_available()) return r;
    /* measured once per process: 2 x 3 ms, the two loops interleaved, the best of each (as
     * dp_fma_peak: a moment of time-sharing is not a property of the core) */
    double dot = 0, fma = 0;
#ifdef DP_GEMM_EMULATE_WIDE
    dot = 2, fma = 1; /* the emulation stands for a CPU where the path pays */
#else
    for (int i = 0; i < 2; i++) {
        double d = 0, f = 0;
        if (dp_bf16dot_peak(0.003, &d) != DP_OK ||
            dp_fma_peak_f32(DP_ISA_AVX512, 0.003, &f) != DP_OK)
            break;
        if (d > dot) dot = d;
        if (f > fma) fma = f;
    }
#endif
    r = fma > 0 ? dot / fma : 0.0;
    __atomic_store(&bf16_dot_ratio, &r, __ATOMIC_RELAXED);
    return r;
}

/* The dot path's functions for a float GEMM with bfloat16 inputs now, or NULL: the float
 * path's rounding then runs. Auto takes the dot path where vdpbf16ps was measured to do at
 * least DP_BF16_DOT_GAIN times the float32 FMA's flop: its pairing pass costs what the
 * rounding pass costs, and more, so a smaller gain would not show. */
static const dp_gemm_dot_fns *dot_pick(void)
{
    int mode = __atomic_load_n(&bf16_dot_mode, __ATOMIC_RELAXED);
    if (mode == 0) return NULL;
    const dp_gemm_dot_fns *fns = NULL;
#ifdef DP_GEMM_EMULATE_WIDE
    if (dp_isa_active() == DP_ISA_GENERIC) fns = &dot_fns_emul;
#endif
#ifdef DP_HAVE_BF16DOT
    if (dp_isa_active() == DP_ISA_AVX512 && cpu_has_bf16dot()) fns = &dot_fns_avx512bf16;
#endif
    if (fns && mode == DP_BF16_DOT_AUTO && dp_gemm_bf16_dot_ratio() < DP_BF16_DOT_GAIN) fns = NULL;
    return fns;
}

int dp_gemm_bf16_dot(void) { return dot_pick() != NULL; }

const char *dp_gemm_bf16_dot_name(void)
{
#ifdef DP_GEMM_EMULATE_WIDE
    if (dp_isa_active() == DP_ISA_GENERIC || !cpu_has_bf16dot())
        return "vdpbf16ps on AVX-512 with AVX512_BF16, emulated in the generic slot";
#endif
    return "vdpbf16ps micro-kernel (AVX512_BF16), bfloat16 pairs, float32 accumulation";
}

void dp_round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            u |= 0x00400000u; /* NaN: quiet it, keep sign and payload */
        else
            u += 0x7fffu + ((u >> 16) & 1u); /* ties to even; carries into the exponent */
        u &= 0xffff0000u;
        memcpy(&x[i], &u, sizeof u);
    }
}

/* ---- the bfloat16 AMX path (dp_gemm_amx_tmpl.h, instantiated after the float drivers, whose
 * helpers it shares): its settings and the OS's permission. */
#if defined(DP_HAVE_BF16DOT) && defined(DP_CC_AMX)
#define DP_HAVE_AMX 1
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int bf16_amx_mode = DP_BF16_DOT_AUTO;
#ifdef DP_HAVE_AMX
static int amx_state = -1; /* 1: tiles lent to this process, 0: not; -1 until first asked */
#endif
static const char *amx_why = "this build's compiler has no AMX intrinsics, or the OS is not Linux";

/* 1 if this process can run tdpbf16ps: AMX-BF16 and AVX512_BF16 (its packing converts with
 * vcvtne2ps2bf16) on an AVX-512 CPU, the OS saving the tile state, and Linux lending the tile
 * data to the process (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once; a
 * fork inherits it). Linux refuses where a thread's signal stack is too small for the 8 KB of
 * tile data (ENOSPC), or is older than 5.16 (EINVAL): the path is then not taken, and
 * dp_gemm_amx_why says why. */
static int amx_ready(void)
{
#ifdef DP_HAVE_AMX
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        dp_cpu_features f;
        dp_cpu_detect(&f);
        s = 0;
        if (!(dp_cpu_has_isa(&f, DP_ISA_AVX512) && f.avx512_bf16 && f.amx_bf16)) {
            amx_why = "this CPU has no AMX-BF16 (with AVX-512 and AVX512_BF16), or its OS does not "
                      "save the tile state";
        } else if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) !=
                   0) {
            amx_why =
                errno == ENOSPC ? "Linux refused the tile state (arch_prctl: ENOSPC, a thread's "
                                  "signal stack is too small for it)"
                : errno == EINVAL
                    ? "Linux refused the tile state (arch_prctl: EINVAL, a kernel before 5.16)"
                    : "Linux refused the tile state (arch_prctl failed)";
        } else {
            amx_why = NULL;
            s = 1;
        }
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s;
#else
    return 0;
#endif
}

int dp_gemm_bf16_amx_available(void)
{
#ifdef DP_GEMM_EMULATE_WIDE
    return 1; /* the emulation, in the generic slot, on any CPU */
#else
    return amx_ready();
#endif
}

const char *dp_gemm_bf16_amx_why(void) { return dp_gemm_bf16_amx_available() ? NULL : amx_why; }

void dp_gemm_set_bf16_amx(int mode) { set_mode(&bf16_amx_mode, mode); }

int dp_gemm_bf16_amx_setting(void) { return __atomic_load_n(&bf16_amx_mode, __ATOMIC_RELAXED); }

/* C = alpha A B + beta C on the AMX path (dp_gemm_amx_tmpl.h, instantiated below the drivers):
 * the instructions' build and the emulation's (csrc/tests' wide build) */
typedef int (*amx_gemm_fn)(dp_ctx *, float *, ptrdiff_t, const float *, ptrdiff_t, ptrdiff_t,
                           const float *, ptrdiff_t, ptrdiff_t, int, int, int, float, float);
#ifdef DP_HAVE_AMX
static int amx_gemm_amx(dp_ctx *, float *, ptrdiff_t, const float *, ptrdiff_t, ptrdiff_t,
                        const float *, ptrdiff_t, ptrdiff_t, int, int, int, float, float);
#endif
#ifdef DP_GEMM_EMULATE_WIDE
static int amx_gemm_amxemul(dp_ctx *, float *, ptrdiff_t, const float *, ptrdiff_t, ptrdiff_t,
                            const float *, ptrdiff_t, ptrdiff_t, int, int, int, float, float);
#endif

/* The AMX build a float GEMM with bfloat16 inputs takes now, or NULL: the instructions where
 * this process can run them and the avx512 ISA is active, the emulation in the wide build's
 * generic slot. Auto takes it wherever it can run. */
static amx_gemm_fn amx_pick(void)
{
    if (__atomic_load_n(&bf16_amx_mode, __ATOMIC_RELAXED) == 0) return NULL;
#ifdef DP_GEMM_EMULATE_WIDE
    if (dp_isa_active() == DP_ISA_GENERIC) return amx_gemm_amxemul;
#endif
#ifdef DP_HAVE_AMX
    if (dp_isa_active() == DP_ISA_AVX512 && amx_ready()) return amx_gemm_amx;
#endif
    return NULL;
}

int dp_gemm_bf16_amx(void) { return amx_pick() != NULL; }

const char *dp_gemm_bf16_amx_name(void)
{
#ifdef DP_GEMM_EMULATE_WIDE
    if (dp_isa_active() == DP_ISA_GENERIC || !amx_ready())
        return "AMX tiles (tdpbf16ps), emulated in the generic slot";
#endif
    return "AMX tiles (tdpbf16ps), bfloat16 inputs, float32 accumulation";
}

/* The least work (flop) a GEMM gives each of its threads: waking the pool and meeting at its
 * end costs tens of microseconds on a shared machine. At a tenth of this, softmax
 * regression's two 2 Mflop GEMMs a step (784->10, batch 128) ran slower on 2 threads than on
 * 1; at this it runs them on one thread, and the MLP and CNN steps keep their speedup. */
#ifndef GEMM_THREAD_FLOPS
#define GEMM_THREAD_FLOPS 2000000LL
#endif

/* Blocking (elements): an MC x KC block of A stays in L2, a KC x NC panel of B in L3. */
#define KC_F32 320
#define MC_F32 120
#define NC_F32 3072
#define KC_F64 256
#define MC_F64 96
#define NC_F64 2048

#define T float
#define DSUF _f32
#define KC KC_F32
#define MC MC_F32
#define NC NC_F32
#include "dp_gemm_drv.h"
#undef NC
#undef MC
#undef KC
#undef DSUF
#undef T

#define T double
#define DSUF _f64
#define KC KC_F64
#define MC MC_F64
#define NC NC_F64
#include "dp_gemm_drv.h"
#undef NC
#undef MC
#undef KC
#undef DSUF
#undef T

/* ---- the AMX path's builds ---- */
#ifdef DP_HAVE_AMX
#define ASFX _amx
#define AMX_TGT     \
    __attribute__(( \
        target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,avx512bf16")))
#define AMX_HW 1
#define AMX_PACKB pack_b_f32_avx512
#define AMX_VF vec_t_f32_avx512
#define AMX_STORE store_tile_f32_avx512
#include "dp_gemm_amx_tmpl.h"
#endif
#ifdef DP_GEMM_EMULATE_WIDE
#define ASFX _amxemul
#define AMX_TGT
#define AMX_HW 0
#define AMX_PACKB pack_b_f32_generic
#define AMX_VF vec_t_f32_generic
#define AMX_STORE store_tile_f32_generic
#include "dp_gemm_amx_tmpl.h"
#endif

const char *dp_gemm_isa(void)
{
#ifdef DP_GEMM_EMULATE_WIDE
    if (dp_isa_active() == DP_ISA_GENERIC) return "generic (the avx512 shape, emulated)";
#endif
    switch (dp_isa_active()) {
    case DP_ISA_AVX512: return "avx512";
    case DP_ISA_AVX2: return "avx2+fma";
    default: break;
    }
#if defined(__aarch64__)
    return "generic (NEON)";
#else
    return "generic";
#endif
}

void dp_gemm_blocking(int dtype_bytes, int *mr, int *nr, int *kc, int *mc, int *nc)
{
    int isa = dp_isa_active(), wide = isa == DP_ISA_AVX512;
#ifdef DP_GEMM_EMULATE_WIDE
    wide = wide || isa == DP_ISA_GENERIC;
#endif
    *mr = wide ? 12 : 6;
    *nr = 2 * ((wide ? 64 : isa == DP_ISA_AVX2 ? 32 : 16) / dtype_bytes);
    *kc = dtype_bytes == 4 ? KC_F32 : KC_F64;
    *mc = dtype_bytes == 4 ? MC_F32 : MC_F64;
    *nc = dtype_bytes == 4 ? NC_F32 : NC_F64;
}

int dp_ctx_init(dp_ctx *ctx, int threads)
{
    memset(ctx, 0, sizeof *ctx);
    if (threads < 1) threads = 1;
    if (threads > DP_MAX_THREADS) threads = DP_MAX_THREADS;
    ctx->threads = threads;
    if (threads > 1) {
        int rc = dp_threads_create(&ctx->team, threads);
        if (rc) return rc;
    }
    return DP_OK;
}

void dp_ctx_free(dp_ctx *ctx)
{
    dp_threads_destroy(ctx->team);
    ctx->team = NULL;
    /* only the buffers a GEMM took: a call into free() for each of the 512 (most of them
     * NULL) was a fifth of a 10x128x128 GEMM without a context (_core.gemm's default) */
    for (int i = 0; i < 2 * DP_MAX_THREADS; i++)
        if (ctx->pack[i].ptr) dp_scratch_free(&ctx->pack[i]);
    dp_scratch_free(&ctx->ct);
}

/* dp_ctx_default's key: its value is the thread's context, which default_ctx_end frees */
static pthread_key_t default_ctx_key;
static int default_ctx_key_ok;
static pthread_once_t default_ctx_once = PTHREAD_ONCE_INIT;

static void default_ctx_end(void *p)
{
    dp_ctx_free(p);
    free(p);
}

static void default_ctx_key_make(void)
{ default_ctx_key_ok = pthread_key_create(&default_ctx_key, default_ctx_end) == 0; }

dp_ctx *dp_ctx_default(void)
{
    pthread_once(&default_ctx_once, default_ctx_key_make);
    if (!default_ctx_key_ok) return NULL;
    dp_ctx *c = pthread_getspecific(default_ctx_key);
    if (c) return c;
    if (!(c = malloc(sizeof *c))) return NULL;
    if (dp_ctx_init(c, 1) != DP_OK || pthread_setspecific(default_ctx_key, c) != 0) {
        dp_ctx_free(c);
        free(c);
        return NULL;
    }
    return c;
}
