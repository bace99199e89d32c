/* dp_gemm.c - instantiates the GEMM for float and double, each built twice (AVX2+FMA and
 * generic), and picks the build once per process from what the CPU reports.
 * Leaves out on purpose: AVX-512 (on the Zen cores we measure on it has the same FMA
 * throughput as AVX2), complex types, and any BLAS fallback. */
#include "dp_gemm.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define DP_HAVE_X86_FAST 1
#include <stdlib.h>
/* DPTRAIN_GEMM_ISA=generic forces the portable build (tests run both paths on one machine). */
static int dp_cpu_fast(void)
{
    const char *force = getenv("DPTRAIN_GEMM_ISA");
    if (force && strcmp(force, "generic") == 0) return 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* ---- instantiations ---- */
#define T float
#define VL 8
#define TGT
#define SUF _f32_generic
#include "dp_gemm_tmpl.h"
#undef SUF
#undef TGT
#undef VL
#undef T

#define T double
#define VL 4
#define TGT
#define SUF _f64_generic
#include "dp_gemm_tmpl.h"
#undef SUF
#undef TGT
#undef VL
#undef T

#ifdef DP_HAVE_X86_FAST
#define T float
#define VL 8
#define TGT __attribute__((target("avx2,fma")))
#define SUF _f32_avx2
#include "dp_gemm_tmpl.h"
#undef SUF
#undef TGT
#undef VL
#undef T

#define T double
#define VL 4
#define TGT __attribute__((target("avx2,fma")))
#define SUF _f64_avx2
#include "dp_gemm_tmpl.h"
#undef SUF
#undef TGT
#undef VL
#undef T
#define ISA_FAST _avx2
#endif
#define ISA_GENERIC _generic

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

const char *dp_gemm_isa(void)
{
#ifdef DP_HAVE_X86_FAST
    if (dp_cpu_fast()) return "avx2+fma";
#endif
#if defined(__aarch64__)
    return "generic (NEON)";
#else
    return "generic";
#endif
}

void dp_gemm_blocking(int dtype_bytes, int *mr, int *nr, int *kc, int *mc, int *nc)
{
    *mr = 6;
    *nr = 2 * (32 / dtype_bytes);
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
    for (int i = 0; i < 2 * DP_MAX_THREADS; i++) dp_scratch_free(&ctx->pack[i]);
}
