/* test_core.c - plain-C tests of the kernels in csrc/ (no Python anywhere).
 *
 * Every optimized kernel is checked against its naive twin or against a straightforward
 * double-precision computation written here, for float and double, over odd sizes
 * (1, 7, 33, 129, ...), for the GEMM on every ISA path the CPU has (dp_isa_select forces the
 * portable one) and with a context of 1 and 3 threads and with none. The convolution is
 * checked against a loop written here and pooling against its rule; the networks built from
 * these kernels (dp_model) are tested by test_model.c.
 *
 * Tolerances are rounding-error bounds, not fudge factors: (terms + slack) * epsilon of the
 * dtype times the magnitude of what was summed (sum |a_k b_k| for a dot product). A missing or
 * wrong term is far outside them.
 *
 * Output: one "FAIL ..." line per failed check naming function, sizes, dtype and the error,
 * then exactly one summary line "N passed, M failed"; the exit status is 1 if any failed.
 * Build and run with `make -C csrc/tests check` (AddressSanitizer, LeakSanitizer, UBSan) or
 * `check-O3` (optimized, no sanitizers). The GEMM and the vector kernels (dp_vec.h) run on
 * every ISA this CPU has (dp_isa_select), the others are named as skipped on the first line;
 * `check` also builds this file with -DDP_GEMM_EMULATE_WIDE, whose generic GEMM has the AVX-512
 * build's shape, and the generic loss and GEMV kernels with the AVX-512 build's 64-byte vectors
 * (csrc/tests/Makefile).
 *
 * Leaves out on purpose: timings (bench/), the Python boundary (the tests/ directory), and two
 * callers sharing one context (documented as unsupported).
 */
#include "dp_common.h"
#include "dp_conv.h"
#include "dp_pool.h"
#include "dp_cpu.h"
#include "dp_gemm.h"
#include "dp_act.h"
#include "dp_buffers.h"
#include "dp_dense.h"
#include "dp_loss.h"
#include "dp_sgd.h"
#include "dp_adam.h"
#include "dp_math.h"
#include "test_watchdog.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- bookkeeping ---------------------------------------------------------------------- */

static volatile sig_atomic_t n_passed, n_failed;

/* Records one check; a failure prints "FAIL <what>". */
static int expect(int ok, const char *fmt, ...)
{
    if (ok) {
        n_passed++;
        return 1;
    }
    n_failed++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL [isa %s] ", dp_isa_name(dp_isa_active()));
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    fflush(stdout);
    return 0;
}

/* Element-wise comparison of one output array, reported as one check. */
typedef struct {
    ptrdiff_t n, bad, at;         /* elements compared, out of tolerance, index of the worst */
    double got, want, tol, ratio; /* at the worst element */
} diff;

static void diff_add(diff *d, ptrdiff_t i, double got, double want, double tol)
{
    double err = fabs(got - want);
    d->n++;
    if (err <= tol) return; /* false for NaN */
    double ratio = (isnan(err) || tol <= 0) ? INFINITY : err / tol;
    if (d->bad++ == 0 || ratio > d->ratio) {
        d->at = i;
        d->got = got;
        d->want = want;
        d->tol = tol;
        d->ratio = ratio;
    }
}

/* cols > 0 prints the worst element as [row,col] of a row-major array with that row stride. */
static void expect_diff(const diff *d, ptrdiff_t cols, const char *fmt, ...)
{
    if (!d->bad) {
        n_passed++;
        return;
    }
    n_failed++;
    char what[512], where[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (cols > 0)
        snprintf(where, sizeof where, "[%td,%td]", d->at / cols, d->at % cols);
    else
        snprintf(where, sizeof where, "[%td]", d->at);
    printf("FAIL [isa %s] %s: %td of %td elements off, worst %s got %.10g expected %.10g "
           "(|err| %.3g > tol %.3g)\n",
           dp_isa_name(dp_isa_active()), what, d->bad, d->n, where, d->got, d->want,
           fabs(d->got - d->want), d->tol);
    fflush(stdout);
}

/* A hang (a deadlocked thread team) fails the run instead of stalling CI. Only write(2) in here. */
static void put_uint(char **p, unsigned v)
{
    char tmp[16];
    int k = 0;
    do tmp[k++] = (char)('0' + v % 10);
    while ((v /= 10) && k < 16);
    while (k) *(*p)++ = tmp[--k];
}

static void on_watchdog(int sig)
{
    (void)sig;
    char buf[160], *p = buf;
    const char *msg = "FAIL watchdog: test_core still running after its time limit (a hang?)\n";
    while (*msg) *p++ = *msg++;
    put_uint(&p, (unsigned)n_passed);
    for (msg = " passed, "; *msg;) *p++ = *msg++;
    put_uint(&p, (unsigned)n_failed + 1);
    for (msg = " failed\n"; *msg;) *p++ = *msg++;
    ssize_t w = write(STDOUT_FILENO, buf, (size_t)(p - buf));
    (void)w;
    _exit(1);
}

/* ---- deterministic data ---------------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t xorshift64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double unif(double lo, double hi)
{ return lo + (hi - lo) * ((double)(xorshift64() >> 11) * 0x1.0p-53); }

static int randint(int n) { return (int)(xorshift64() % (uint64_t)n); }

/* ---- one test body for both dtypes: typed buffers behind void* --------------------------- */

typedef enum { F32, F64 } dtype;

static const char *dtn(dtype dt) { return dt == F32 ? "f32" : "f64"; }
static size_t dts(dtype dt) { return dt == F32 ? sizeof(float) : sizeof(double); }
static double deps(dtype dt) { return dt == F32 ? FLT_EPSILON : DBL_EPSILON; }

static void *xalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        puts("test_core: out of memory");
        exit(2);
    }
    return p;
}

static void *talloc(dtype dt, ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * dts(dt)); }
static double *dalloc(ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }
static int64_t *ialloc(ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t)); }

static double tget(dtype dt, const void *p, ptrdiff_t i)
{ return dt == F32 ? (double)((const float *)p)[i] : ((const double *)p)[i]; }

static void tset(dtype dt, void *p, ptrdiff_t i, double v)
{
    if (dt == F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* Rounds to the dtype. One float + or * done in double and rounded once is exactly the float
 * operation (53 >= 2 * 24 + 2), so trnd(a + b) emulates float arithmetic bit for bit. */
static double trnd(dtype dt, double v) { return dt == F32 ? (double)(float)v : v; }

static void tfill(dtype dt, void *p, ptrdiff_t n, double lo, double hi)
{
    for (ptrdiff_t i = 0; i < n; i++) tset(dt, p, i, unif(lo, hi));
}

static void tconst(dtype dt, void *p, ptrdiff_t n, double v)
{
    for (ptrdiff_t i = 0; i < n; i++) tset(dt, p, i, v);
}

/* ---- the kernels, called by dtype ------------------------------------------------------- */

static int gemm_t(dtype dt, dp_ctx *ctx, void *C, ptrdiff_t ldc, const void *A, ptrdiff_t rsa,
                  ptrdiff_t csa, const void *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                  double alpha, double beta)
{
    if (dt == F32)
        return dp_gemm_f32(ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, (float)alpha,
                           (float)beta);
    return dp_gemm_f64(ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
}

static void gemm_naive_t(dtype dt, void *C, ptrdiff_t ldc, const void *A, ptrdiff_t rsa,
                         ptrdiff_t csa, const void *B, ptrdiff_t rsb, ptrdiff_t csb, int M, int N,
                         int K, double alpha, double beta)
{
    if (dt == F32)
        dp_gemm_naive_f32(C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, (float)alpha, (float)beta);
    else
        dp_gemm_naive_f64(C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
}

static int dense_forward_t(dtype dt, dp_ctx *ctx, void *y, const void *x, const void *w,
                           const void *b, int B, int IN, int OUT)
{
    return dt == F32 ? dp_dense_forward_f32(ctx, y, x, w, b, B, IN, OUT)
                     : dp_dense_forward_f64(ctx, y, x, w, b, B, IN, OUT);
}

static int dense_backward_t(dtype dt, dp_ctx *ctx, void *dw, void *db, void *dx, const void *dy,
                            const void *x, const void *w, int B, int IN, int OUT)
{
    return dt == F32 ? dp_dense_backward_f32(ctx, dw, db, dx, dy, x, w, B, IN, OUT)
                     : dp_dense_backward_f64(ctx, dw, db, dx, dy, x, w, B, IN, OUT);
}

static void relu_forward_t(dtype dt, void *y, const void *x, ptrdiff_t n)
{
    if (dt == F32)
        dp_relu_forward_f32(y, x, n);
    else
        dp_relu_forward_f64(y, x, n);
}

static void relu_backward_t(dtype dt, void *dx, const void *dy, const void *y, ptrdiff_t n)
{
    if (dt == F32)
        dp_relu_backward_f32(dx, dy, y, n);
    else
        dp_relu_backward_f64(dx, dy, y, n);
}

static int softmax_xent_t(dtype dt, void *dlogits, double *loss, const void *logits,
                          const int64_t *labels, int B, int C, double gs)
{
    return dt == F32 ? dp_softmax_xent_f32(dlogits, loss, logits, labels, B, C, (float)gs)
                     : dp_softmax_xent_f64(dlogits, loss, logits, labels, B, C, gs);
}

static int sigmoid_bce_t(dtype dt, void *dlogits, double *loss, const void *logits,
                         const int64_t *labels, int B, double gs)
{
    return dt == F32 ? dp_sigmoid_bce_f32(dlogits, loss, logits, labels, B, (float)gs)
                     : dp_sigmoid_bce_f64(dlogits, loss, logits, labels, B, gs);
}

static int logistic_grad_t(dtype dt, void *dw, void *db, double *loss, int64_t *correct,
                           const void *x, const void *w, const void *b, const int64_t *labels,
                           int B, int IN, double gs)
{
    return dt == F32
               ? dp_logistic_grad_f32(dw, db, loss, correct, x, w, b, labels, B, IN, (float)gs)
               : dp_logistic_grad_f64(dw, db, loss, correct, x, w, b, labels, B, IN, gs);
}

static void argmax_t(dtype dt, int64_t *out, const void *x, int B, int C)
{
    if (dt == F32)
        dp_argmax_f32(out, x, B, C);
    else
        dp_argmax_f64(out, x, B, C);
}

/* The count, or -1 when the kernel rejected a label. */
static int64_t count_correct_t(dtype dt, const void *logits, const int64_t *labels, int B, int C)
{
    int64_t n = 0;
    int rc = dt == F32 ? dp_count_correct_f32(&n, logits, labels, B, C)
                       : dp_count_correct_f64(&n, logits, labels, B, C);
    return rc == DP_OK ? n : -1;
}

static void sgd_step_t(dtype dt, void *p, void *v, const void *g, ptrdiff_t n, double lr,
                       double momentum, double dampening, double wd, int nesterov, int first)
{
    if (dt == F32)
        dp_sgd_step_f32(p, v, g, n, (float)lr, (float)momentum, (float)dampening, (float)wd,
                        nesterov, first);
    else
        dp_sgd_step_f64(p, v, g, n, lr, momentum, dampening, wd, nesterov, first);
}

/* One Adam step (step number t) with the scalars dp_adam_prepare_* makes; team NULL: alone. */
static void adam_step_t(dtype dt, dp_threads *team, void *p, void *m, void *v, void *vmax,
                        const void *g, ptrdiff_t n, double lr, double wd, int decoupled, int t)
{
    if (dt == F32) {
        dp_adam_hyper_f32 h;
        dp_adam_prepare_f32(&h, lr, 0.9, 0.999, 1e-8, wd, decoupled, t);
        dp_adam_step_team_f32(team, p, m, v, vmax, g, n, &h);
    } else {
        dp_adam_hyper_f64 h;
        dp_adam_prepare_f64(&h, lr, 0.9, 0.999, 1e-8, wd, decoupled, t);
        dp_adam_step_team_f64(team, p, m, v, vmax, g, n, &h);
    }
}

static void sum_buffers_t(dtype dt, void *out, void *const *ins, int k, ptrdiff_t start,
                          ptrdiff_t stop, double scale)
{
    if (dt == F32) {
        const float *in[8] = {0};
        for (int q = 0; q < k; q++) in[q] = ins[q];
        dp_sum_buffers_f32(out, in, k, start, stop, (float)scale);
    } else {
        const double *in[8] = {0};
        for (int q = 0; q < k; q++) in[q] = ins[q];
        dp_sum_buffers_f64(out, in, k, start, stop, scale);
    }
}

static void scale_t(dtype dt, void *buf, ptrdiff_t n, double alpha)
{
    if (dt == F32)
        dp_scale_f32(buf, n, (float)alpha);
    else
        dp_scale_f64(buf, n, alpha);
}

/* ---- contexts and ISA paths ------------------------------------------------------------ */

/* Lets a new team's helper threads reach their wait loop before the first job. Works around
 * the startup race that test_threads_startup checks for; harmless once that is fixed. */
static void let_helpers_start(void)
{
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

typedef struct {
    const char *name;
    dp_ctx *ctx;
} ctx_case;

static dp_ctx ctx1, ctx3;
static ctx_case ctxs[3] = {{"NULL", NULL}, {"1", &ctx1}, {"3", &ctx3}};

/* Makes `isa` the kernels' ISA (DP_ISA_*); returns the GEMM's name for it, or NULL where the
 * CPU lacks it (those cases are skipped: the start of main lists what runs here). */
static const char *use_isa(int isa) { return dp_isa_select(isa) == DP_OK ? dp_gemm_isa() : NULL; }

static int widest_isa(void)
{
    dp_cpu_features f;
    dp_cpu_detect(&f);
    return dp_cpu_widest_isa(&f);
}

/* ---- GEMM ------------------------------------------------------------------------------ */

/* An operand (rows x cols) as strides: 'N' row-major, 'T' stored transposed (cols x rows),
 * 'S' neither stride 1 (every other element of rows 2 * cols + 1 long). *len: elements spanned. */
static void layout(char l, int rows, int cols, ptrdiff_t *rs, ptrdiff_t *cs, ptrdiff_t *len)
{
    if (l == 'N') {
        *rs = cols;
        *cs = 1;
    } else if (l == 'T') {
        *rs = 1;
        *cs = rows;
    } else {
        *rs = 2 * (ptrdiff_t)cols + 1;
        *cs = 2;
    }
    *len = (ptrdiff_t)(rows - 1) * *rs + (ptrdiff_t)(cols - 1) * *cs + 1;
}

/* C = alpha A B + beta C0 in double (ref, M x N) and the magnitude that bounds the rounding
 * error of any summation order: |alpha| sum_k |a_ik b_kj| + |beta c_ij|. */
static void gemm_ref(double *ref, double *mag, dtype dt, const void *C0, ptrdiff_t ldc,
                     const void *A, ptrdiff_t rsa, ptrdiff_t csa, const void *B, ptrdiff_t rsb,
                     ptrdiff_t csb, int M, int N, int K, double alpha, double beta)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double p = tget(dt, A, i * rsa + k * csa) * tget(dt, B, k * rsb + j * csb);
                s += p;
                m += fabs(p);
            }
            double c = beta == 0 ? 0 : tget(dt, C0, i * ldc + j);
            ref[(ptrdiff_t)i * N + j] = alpha * s + beta * c;
            mag[(ptrdiff_t)i * N + j] = fabs(alpha) * m + fabs(beta * c);
        }
}

/* C (M rows of ldc) against want (a T array like C, or NULL: the double ref) within rel * mag;
 * the columns N..ldc-1 must still hold what C0 held. */
static void diff_gemm(diff *d, dtype dt, const void *C, const void *C0, ptrdiff_t ldc, int M, int N,
                      const void *want, const double *ref, const double *mag, double rel)
{
    for (int i = 0; i < M; i++)
        for (ptrdiff_t j = 0; j < ldc; j++) {
            ptrdiff_t at = i * ldc + j;
            if (j < N)
                diff_add(d, at, tget(dt, C, at), want ? tget(dt, want, at) : ref[i * N + j],
                         rel * mag[i * N + j]);
            else
                diff_add(d, at, tget(dt, C, at), tget(dt, C0, at), 0);
        }
}

#define PAD_SENTINEL 777.0

/* bfloat16 inputs (dp_ctx.bf16_inputs): on every ISA and both contexts, the GEMM must equal
 * the naive twin run on A and B rounded by dp_round_bf16 (the scalar twin of the builds'
 * vector rounding), within the float summation bound of the rounded operands. */
/* GEMM cases that ran the bfloat16 dot path (dp_gemm_dot_tmpl.h) and the AMX path
 * (dp_gemm_amx_tmpl.h), for the summary line */
static int bf16_dot_cases, bf16_amx_cases;

static void gemm_case_bf16(const float *A, ptrdiff_t na, ptrdiff_t rsa, ptrdiff_t csa,
                           const float *B, ptrdiff_t nb, ptrdiff_t rsb, ptrdiff_t csb,
                           const float *C0, ptrdiff_t ldc, int M, int N, int K, double alpha,
                           double beta, const char *what)
{
    ptrdiff_t nc = (ptrdiff_t)M * ldc;
    float *Ar = talloc(F32, na), *Br = talloc(F32, nb), *Cn = talloc(F32, nc), *C = talloc(F32, nc);
    double *ref = dalloc((ptrdiff_t)M * N), *mag = dalloc((ptrdiff_t)M * N);
    memcpy(Ar, A, (size_t)na * sizeof *A);
    memcpy(Br, B, (size_t)nb * sizeof *B);
    dp_round_bf16(Ar, (size_t)na);
    dp_round_bf16(Br, (size_t)nb);
    gemm_ref(ref, mag, F32, C0, ldc, Ar, rsa, csa, Br, rsb, csb, M, N, K, alpha, beta);
    memcpy(Cn, C0, (size_t)nc * sizeof *C0);
    dp_gemm_naive_f32(Cn, ldc, Ar, rsa, csa, Br, rsb, csb, M, N, K, (float)alpha, (float)beta);
    double rel = 2 * (K + 16) * deps(F32);
    float *Cr = talloc(F32, nc);
    for (int g = 0; g < DP_ISA_COUNT; g++) {
        const char *isa = use_isa(g);
        for (int c = 1; isa && c < 3; c++) {
            /* the rounding path (float micro-kernel), then the dot path and the AMX path
             * where they run: each against the reference, and the dot path's bits against
             * the rounding path's (dp_gemm_dot_tmpl.h: the same sums in the same order; the
             * data has no denormals, which only the dot path flushes), and so the AMX
             * emulation's; the AMX instructions sum otherwise, within the same bound */
            for (int dot = 0; dot < 3; dot++) {
                dp_gemm_set_bf16_dot(dot == 1);
                dp_gemm_set_bf16_amx(dot == 2);
                if (dot == 1 && !dp_gemm_bf16_dot()) continue;
                if (dot == 2 && (!dp_gemm_bf16_amx() || K < DP_GEMM_AMX_MIN_K)) break;
                int amx_hw = dot == 2 && !strstr(dp_gemm_bf16_amx_name(), "emulated");
                memcpy(C, C0, (size_t)nc * sizeof *C0);
                ctxs[c].ctx->bf16_inputs = 1;
                int rc = dp_gemm_f32(ctxs[c].ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K,
                                     (float)alpha, (float)beta);
                ctxs[c].ctx->bf16_inputs = 0;
                const char *path = dot == 2 ? "AMX" : dot ? "dot" : "rounding";
                expect(rc == DP_OK, "dp_gemm_%s bf16 isa=%s ctx=%s %s path: returned %d", what, isa,
                       ctxs[c].name, path, rc);
                diff e = {0};
                diff_gemm(&e, F32, C, C0, ldc, M, N, Cn, ref, mag, rel);
                expect_diff(&e, ldc,
                            "dp_gemm_%s bf16 inputs isa=%s ctx=%s %s path vs naive on rounded",
                            what, isa, ctxs[c].name, path);
                if (!dot) {
                    memcpy(Cr, C, (size_t)nc * sizeof *C);
                    continue;
                }
                if (dot == 2) {
                    bf16_amx_cases++;
                    if (amx_hw) continue;
                } else {
                    bf16_dot_cases++;
                }
                int differ = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        float x = C[(ptrdiff_t)i * ldc + j], y = Cr[(ptrdiff_t)i * ldc + j];
                        differ += !(x == y || (isnan(x) && isnan(y)));
                    }
                expect(differ == 0,
                       "dp_gemm_%s bf16 isa=%s ctx=%s: the %s path differs from the "
                       "rounding path in %d of %d values",
                       what, isa, ctxs[c].name, path, differ, M * N);
            }
            dp_gemm_set_bf16_dot(DP_BF16_DOT_AUTO);
            dp_gemm_set_bf16_amx(DP_BF16_DOT_AUTO);
        }
    }
    free(Ar);
    free(Br);
    free(Cn);
    free(C);
    free(Cr);
    free(ref);
    free(mag);
}

/* dp_round_bf16 on the values that decide it, then each ISA build's vector rounding through
 * the GEMM: C = round(a) * 1 for a column of such values (K = N = 1; bfloat16 inputs pack
 * both operands, so the packed path's rounding runs). */
static void test_round_bf16(void)
{
    static const uint32_t cases[][2] = {
        {0x3f800000u, 0x3f800000u}, /* 1 */
        {0x3f808000u, 0x3f800000u}, /* 1 + 2^-8: a tie, to the even 1 */
        {0x3f818000u, 0x3f820000u}, /* a tie, up to the even neighbour */
        {0x3f808001u, 0x3f810000u}, /* above the tie: up */
        {0x3f807fffu, 0x3f800000u}, /* below the tie: down */
        {0xbf818000u, 0xbf820000u}, /* negative: the same on |x| */
        {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX: above bfloat16's largest, to +inf */
        {0x7f7f0000u, 0x7f7f0000u}, /* bfloat16's largest stays */
        {0x7f800000u, 0x7f800000u}, /* +inf */
        {0xff800000u, 0xff800000u}, /* -inf */
        {0x00000000u, 0x00000000u}, /* +0 */
        {0x80000000u, 0x80000000u}, /* -0 */
        {0x00008000u, 0x00000000u}, /* denormal tie: to the even 0 */
        {0x00018000u, 0x00020000u}, /* denormal tie: up */
        {0x007fffffu, 0x00800000u}, /* the largest denormal rounds to FLT_MIN */
        {0x7fc00000u, 0x7fc00000u}, /* quiet NaN */
        {0x7f800001u, 0x7fc00000u}, /* signalling NaN, payload in the low bits: quiet NaN */
        {0xffc12345u, 0xffc10000u}, /* negative NaN keeps its sign and high payload */
    };
    enum { NC = sizeof cases / sizeof cases[0] };
    float x[NC], want[NC];
    for (int i = 0; i < NC; i++) {
        memcpy(&x[i], &cases[i][0], 4);
        memcpy(&want[i], &cases[i][1], 4);
    }
    float r[NC];
    memcpy(r, x, sizeof x);
    dp_round_bf16(r, NC);
    for (int i = 0; i < NC; i++) {
        uint32_t got;
        memcpy(&got, &r[i], 4);
        expect(got == cases[i][1], "dp_round_bf16(0x%08x) = 0x%08x, expected 0x%08x", cases[i][0],
               got, cases[i][1]);
    }
    /* x times 1 with K = 1 (the dot or the rounding path), then with K = DP_GEMM_AMX_MIN_K
     * (x in column 0 of A, zeros beside it; B's row 0 is 1, the rest 0): the AMX path where
     * it runs */
    enum { KA = DP_GEMM_AMX_MIN_K };
    float *xa = calloc((size_t)NC * KA, sizeof(float)), ones[KA] = {1.0f};
    for (int i = 0; i < NC; i++) xa[(ptrdiff_t)i * KA] = x[i];
    for (int g = 0; g < DP_ISA_COUNT; g++) {
        const char *isa = use_isa(g);
        for (int c = 1; isa && c < 3; c++)
            for (int kk = 1; kk <= KA; kk += KA - 1) {
                float C[NC];
                ctxs[c].ctx->bf16_inputs = 1;
                int rc = dp_gemm_f32(ctxs[c].ctx, C, 1, kk == 1 ? x : xa, kk, 1, ones, 1, 1, NC, 1,
                                     kk, 1.0f, 0.0f);
                ctxs[c].ctx->bf16_inputs = 0;
                expect(rc == DP_OK, "bf16 GEMM isa=%s K=%d: returned %d", isa, kk, rc);
                /* the dot path (vdpbf16ps) and AMX's tdpbf16ps read a denormal as 0, and the
                 * AMX path's packing (vcvtne2ps2bf16) a denormal float before it rounds it
                 * (not the AMX emulation, whose bits are the rounding path's) */
                int amx = kk >= DP_GEMM_AMX_MIN_K && dp_gemm_bf16_amx() &&
                          !strstr(dp_gemm_bf16_amx_name(), "emulated");
                int daz =
                    amx || (!dp_gemm_bf16_amx() || kk < DP_GEMM_AMX_MIN_K ? dp_gemm_bf16_dot() : 0);
                for (int i = 0; i < NC; i++) {
                    uint32_t got;
                    memcpy(&got, &C[i], 4);
                    /* a NaN times 1 is a NaN; the hardware may set other payload bits. -0:
                     * the accumulator starts at +0, and +0 + -0 is +0 */
                    int ok = isnan(want[i]) ? isnan(C[i]) && signbit(C[i]) == signbit(want[i])
                             : want[i] == 0 ? C[i] == 0
                                            : got == cases[i][1];
                    if (daz && fpclassify(want[i]) == FP_SUBNORMAL) ok = ok || C[i] == 0;
                    if (amx && fpclassify(x[i]) == FP_SUBNORMAL) ok = ok || C[i] == 0;
                    expect(ok,
                           "bf16 GEMM isa=%s ctx=%s K=%d: round(0x%08x) * 1 = 0x%08x, expected "
                           "0x%08x",
                           isa, ctxs[c].name, kk, cases[i][0], got, cases[i][1]);
                }
            }
    }
    free(xa);
    use_isa(widest_isa());
}

/* One GEMM shape: the naive twin against the double reference, then the optimized GEMM on
 * both ISA paths and every context against the naive twin. */
static void gemm_case(dtype dt, char la, char lb, int M, int N, int K, double alpha, double beta,
                      int pad)
{
    ptrdiff_t rsa, csa, na, rsb, csb, nb, ldc = N + pad;
    layout(la, M, K, &rsa, &csa, &na);
    layout(lb, K, N, &rsb, &csb, &nb);
    ptrdiff_t nc = (ptrdiff_t)M * ldc;
    void *A = talloc(dt, na), *B = talloc(dt, nb);
    void *C0 = talloc(dt, nc), *Cn = talloc(dt, nc), *C = talloc(dt, nc);
    double *ref = dalloc((ptrdiff_t)M * N), *mag = dalloc((ptrdiff_t)M * N);
    tfill(dt, A, na, -1, 1);
    tfill(dt, B, nb, -1, 1);
    /* beta == 0 must not read C: fill it with NaN, which would propagate if it did */
    for (ptrdiff_t i = 0; i < nc; i++)
        tset(dt, C0, i, i % ldc >= N ? PAD_SENTINEL : beta == 0 ? NAN : unif(-1, 1));
    gemm_ref(ref, mag, dt, C0, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
    /* any summation order is within (K + slack) eps of the exact result (Higham, 3.1);
     * the slack covers alpha, beta and the per-KC-slice updates of C */
    double rel = (K + 16) * deps(dt);
    char what[200];
    snprintf(what, sizeof what, "%s M=%d N=%d K=%d A=%c B=%c alpha=%g beta=%g ldc=%td", dtn(dt), M,
             N, K, la, lb, alpha, beta, ldc);

    memcpy(Cn, C0, (size_t)nc * dts(dt));
    gemm_naive_t(dt, Cn, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
    diff d = {0};
    diff_gemm(&d, dt, Cn, C0, ldc, M, N, NULL, ref, mag, rel);
    expect_diff(&d, ldc, "dp_gemm_naive_%s vs double", what);

    for (int g = 0; g < DP_ISA_COUNT; g++) {
        const char *isa = use_isa(g);
        for (int c = 0; isa && c < 3; c++) {
            memcpy(C, C0, (size_t)nc * dts(dt));
            int rc =
                gemm_t(dt, ctxs[c].ctx, C, ldc, A, rsa, csa, B, rsb, csb, M, N, K, alpha, beta);
            expect(rc == DP_OK, "dp_gemm_%s isa=%s ctx=%s: returned %d", what, isa, ctxs[c].name,
                   rc);
            diff e = {0};
            diff_gemm(&e, dt, C, C0, ldc, M, N, Cn, ref, mag, 2 * rel);
            expect_diff(&e, ldc, "dp_gemm_%s isa=%s ctx=%s vs naive", what, isa, ctxs[c].name);
        }
    }
    if (dt == F32)
        gemm_case_bf16(A, na, rsa, csa, B, nb, rsb, csb, C0, ldc, M, N, K, alpha, beta, what);
    use_isa(widest_isa());
    free(A);
    free(B);
    free(C0);
    free(Cn);
    free(C);
    free(ref);
    free(mag);
}

static void test_gemm(dtype dt)
{
    static const int sz[] = {1, 2, 7, 16, 33, 129};
    static const double ab[][2] = {{1, 0}, {1, 1}, {0.5, -2}, {-1.25, 0.75}, {2, 0}, {1, -1}};
    static const char lay[] = "NT";
    int n = 0;
    /* every shape in every layout; alpha/beta and ldc > N cycle with coprime periods */
    for (int la = 0; la < 2; la++)
        for (int lb = 0; lb < 2; lb++)
            for (int m = 0; m < 6; m++)
                for (int nn = 0; nn < 6; nn++)
                    for (int k = 0; k < 6; k++, n++)
                        gemm_case(dt, lay[la], lay[lb], sz[m], sz[nn], sz[k], ab[n % 6][0],
                                  ab[n % 6][1], n % 7 < 3 ? 0 : 3);
    /* neither stride 1 (the generic packing paths with full micro-panels) */
    static const int st[][3] = {{7, 33, 7}, {33, 17, 33}, {1, 1, 1}, {129, 7, 33}, {6, 16, 5}};
    for (int s = 0; s < 5; s++) {
        gemm_case(dt, 'S', 'N', st[s][0], st[s][1], st[s][2], 1, 0, 1);
        gemm_case(dt, 'T', 'S', st[s][0], st[s][1], st[s][2], 0.5, 1, 0);
        gemm_case(dt, 'S', 'S', st[s][0], st[s][1], st[s][2], -1, 0.75, 2);
    }
    /* the layer shape (x w^T with MNIST-like sizes): several KC slices and MC blocks */
    gemm_case(dt, 'N', 'T', 128, 256, 784, 1, 1, 0);
    /* narrow C (dp_gemm_tmpl.h's one-vector tile where N <= VL): the output layer's N = 10
     * (one vector on AVX-512 float), forward (beta 1: the bias); N = 5 into ldc > N */
    gemm_case(dt, 'N', 'T', 128, 10, 128, 1, 1, 0);
    gemm_case(dt, 'N', 'N', 100, 5, 30, -0.5, 0.75, 3);
    /* small K (dp_gemm_tmpl.h's ukernel_smallk on whole panels): K <= 32 with beta 0 in two
     * passes over C (K = 27: the im2col product of a 3x3 convolution of 3 channels), K <= 16
     * with beta 0 or 1; beta 1 past 16 and a general alpha or beta stay on the tile kernel */
    gemm_case(dt, 'N', 'T', 100, 64, 27, 1, 0, 0);
    gemm_case(dt, 'N', 'T', 100, 64, 27, 1, 1, 0);
    gemm_case(dt, 'N', 'N', 37, 96, 17, 1, 0, 3);
    gemm_case(dt, 'T', 'N', 25, 32, 32, 1, 0, 1);
    gemm_case(dt, 'S', 'T', 30, 70, 23, 1, 0, 2);
    gemm_case(dt, 'T', 'T', 13, 33, 12, 1, 1, 0);
    /* K in three slices of an odd depth (643 = 215 + 215 + 213): the bfloat16 pairs' zero
     * halves at each slice's end, accumulated across slices (beta 1 after the first) */
    gemm_case(dt, 'N', 'T', 30, 40, 643, 1, 0.5, 0);
    /* more than one NC panel of B, more than one KC slice with a thin C */
    gemm_case(dt, 'N', 'N', 7, 3100, 5, 1, 0, 3);
    gemm_case(dt, 'T', 'T', 9, 17, 700, 1, 0, 0);
    gemm_case(dt, 'N', 'T', 9, 17, 700, -0.5, 1, 1);
    /* matrix-vector shapes: logistic regression's forward and gradient, with 45 columns
     * (the 8- and 16-lane builds' masked tail) and more rows than one block of dp_gemv_cols;
     * a column of outputs (N = 1) takes dp_gemm_drv.h's gemv, a row of them (M = 1) the
     * blocked path (batch invariance) */
    gemm_case(dt, 'N', 'T', 300, 1, 45, 1, 0, 0);
    gemm_case(dt, 'T', 'N', 1, 45, 300, -0.5, 1, 0);
    gemm_case(dt, 'T', 'T', 300, 1, 45, 2, 0, 3);
    gemm_case(dt, 'N', 'T', 1, 300, 45, 1, 0.5, 0);
    /* one row of outputs wider than one chunk of either dtype (once dp_gemv_cols's
     * row-streaming pass, now the blocked path's), an odd number of rows of B */
    gemm_case(dt, 'T', 'N', 1, 2100, 151, 1, 0, 0);
    gemm_case(dt, 'N', 'N', 1, 2100, 151, -0.5, 1, 2);
}

/* A row of C = A B must not depend on where the row sits in A, nor a column on where it sits
 * in B: each (M = 37, N = 1) and (M = 1, N = 37) product in every layout, again with A's rows
 * (B's columns) reversed, must give the same bits reversed (a prediction must not depend on
 * the order of the samples; dp_gemm_drv.h's gemv sums the last rows % lanes of x in the same
 * order as the others). */
static void test_gemm_order_invariance(dtype dt)
{
    enum { R = 37, K = 45 };
    void *A = talloc(dt, R * K), *Ar = talloc(dt, R * K), *v = talloc(dt, K);
    void *C = talloc(dt, R), *Cr = talloc(dt, R);
    tfill(dt, A, R * K, -1, 1);
    tfill(dt, v, K, -1, 1);
    /* A holds the R vectors of length K as rows (rs = K) or as columns (rs = 1) */
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        const char *name = use_isa(isa);
        for (int c = 0; name && c < 8; c++) {
            int m1 = c & 1, trans = (c >> 1) & 1, vstride = (c >> 2) & 1 ? 3 : 1;
            ptrdiff_t rs = trans ? 1 : K, cs = trans ? R : 1;
            for (int i = 0; i < R; i++)
                for (int k = 0; k < K; k++)
                    tset(dt, Ar, (R - 1 - i) * rs + k * cs, tget(dt, A, i * rs + k * cs));
            void *vs = talloc(dt, K * vstride);
            for (int k = 0; k < K; k++) tset(dt, vs, k * vstride, tget(dt, v, k));
            int rc;
            if (m1) { /* C (1, R) = v (1, K) A^T: B (K, R) is A's vectors as columns */
                rc = gemm_t(dt, NULL, C, R, vs, K * vstride, vstride, A, cs, rs, 1, R, K, 1, 0);
                rc |= gemm_t(dt, NULL, Cr, R, vs, K * vstride, vstride, Ar, cs, rs, 1, R, K, 1, 0);
            } else { /* C (R, 1) = A (R, K) v (K, 1) */
                rc = gemm_t(dt, NULL, C, 1, A, rs, cs, vs, vstride, 1, R, 1, K, 1, 0);
                rc |= gemm_t(dt, NULL, Cr, 1, Ar, rs, cs, vs, vstride, 1, R, 1, K, 1, 0);
            }
            diff d = {0};
            for (int i = 0; i < R; i++) diff_add(&d, i, tget(dt, Cr, R - 1 - i), tget(dt, C, i), 0);
            expect(rc == DP_OK, "dp_gemm_%s order invariance: returned %d", dtn(dt), rc);
            expect_diff(&d, 0,
                        "dp_gemm_%s isa=%s %s, vectors as %s, stride %d: reversed order "
                        "changes the bits",
                        dtn(dt), name, m1 ? "M=1" : "N=1", trans ? "columns" : "rows", vstride);
            free(vs);
        }
    }
    use_isa(widest_isa());
    free(A);
    free(Ar);
    free(v);
    free(C);
    free(Cr);
}

/* X^T v sums each column in the same order whether X's rows are long (streamed in order,
 * dp_gemv_cols) or short (block_gemv_t): a window of 45 columns of a 151 x 2101 X (more
 * columns than one 8 KB chunk of either dtype), taken as a matrix of its own, must give the
 * same bits as those columns of the whole product (one thread may get such a window of a
 * long-row product). */
static void test_gemv_cols_window(dtype dt)
{
    enum { R = 151, L = 2101, W = 45 };
    static const int starts[] = {0, 3, 1020, 2040, L - W};
    void *X = talloc(dt, R * L), *v = talloc(dt, R), *C = talloc(dt, L), *Cw = talloc(dt, W);
    tfill(dt, X, R * L, -1, 1);
    tfill(dt, v, R, -1, 1);
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        const char *name = use_isa(isa);
        if (!name) continue;
        /* C (1, L) = v (1, R) X (R, L) */
        int rc = gemm_t(dt, NULL, C, L, v, R, 1, X, L, 1, 1, L, R, 1, 0);
        for (int s = 0; s < 5; s++) {
            rc |= gemm_t(dt, NULL, Cw, W, v, R, 1, (char *)X + (size_t)starts[s] * dts(dt), L, 1, 1,
                         W, R, 1, 0);
            diff d = {0};
            for (int j = 0; j < W; j++)
                diff_add(&d, j, tget(dt, Cw, j), tget(dt, C, starts[s] + j), 0);
            expect_diff(&d, 0,
                        "dp_gemm_%s isa=%s: X^T v columns %d..%d alone differ from the "
                        "whole product's",
                        dtn(dt), name, starts[s], starts[s] + W - 1);
        }
        expect(rc == DP_OK, "dp_gemm_%s isa=%s X^T v window: returned %d", dtn(dt), name, rc);
    }
    use_isa(widest_isa());
    free(X);
    free(v);
    free(C);
    free(Cw);
}

/* An element of C must not depend on which micro-tile computes it (a whole NR-wide one, the
 * one-vector tile of a panel <= VL wide, a partial one) nor on M: a window of rows and
 * columns of a 29 x 80 product, taken as a product of its own, must give the same bits as
 * the whole product's (a worker's shard of the batch, a thread's part of the columns; the
 * data-parallel result must not depend on the world size). K = 700: several KC slices;
 * K = 10, 20 and 27: whole panels take the small-K kernel (K = 20 and 27 in two passes), the
 * last 16 columns the tile kernel. */
static void test_gemm_tile_window(dtype dt, int K)
{
    enum { M = 29, N = 80 };
    static const int win[][4] = {{0, 0, M, 16},   {3, 64, 17, 16}, {0, 70, 12, 10},
                                 {5, 16, 24, 48}, {1, 47, 13, 33}, {0, 3, 2, 5}};
    void *A = talloc(dt, M * K), *B = talloc(dt, K * N), *C = talloc(dt, M * N);
    void *Cw = talloc(dt, M * N);
    tfill(dt, A, M * K, -1, 1);
    tfill(dt, B, K * N, -1, 1);
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        const char *name = use_isa(isa);
        for (int nt = 0; name && nt < 2; nt++) {
            /* B is (K, N) row-major, or (nt) W (N, K) row-major with B = W^T */
            ptrdiff_t rsb = nt ? 1 : N, csb = nt ? K : 1;
            int rc = gemm_t(dt, NULL, C, N, A, K, 1, B, rsb, csb, M, N, K, 1, 0);
            for (int w = 0; w < 6; w++) {
                int i0 = win[w][0], j0 = win[w][1], mw = win[w][2], nw = win[w][3];
                rc |= gemm_t(dt, NULL, Cw, nw, (char *)A + (size_t)i0 * K * dts(dt), K, 1,
                             (char *)B + (size_t)j0 * (nt ? K : 1) * dts(dt), rsb, csb, mw, nw, K,
                             1, 0);
                diff d = {0};
                for (int i = 0; i < mw; i++)
                    for (int j = 0; j < nw; j++)
                        diff_add(&d, i * nw + j, tget(dt, Cw, i * nw + j),
                                 tget(dt, C, (i0 + i) * N + j0 + j), 0);
                expect_diff(&d, nw,
                            "dp_gemm_%s isa=%s %s K=%d: rows %d..%d x columns %d..%d "
                            "alone differ from the whole product's",
                            dtn(dt), name, nt ? "NT" : "NN", K, i0, i0 + mw - 1, j0, j0 + nw - 1);
            }
            expect(rc == DP_OK, "dp_gemm_%s isa=%s K=%d tile window: returned %d", dtn(dt), name, K,
                   rc);
        }
    }
    use_isa(widest_isa());
    free(A);
    free(B);
    free(C);
    free(Cw);
}

/* K == 0 or alpha == 0: C = beta C without reading A, B (beta == 0 writes zeros over NaN);
 * M == 0 or N == 0: nothing is written. */
static void test_gemm_degenerate(dtype dt)
{
    const int M = 7, N = 5, K = 3;
    const ptrdiff_t ldc = N + 2, nc = M * ldc;
    static const double cases[][3] = {{0, 1, 0}, {0, 1, 0.5}, {K, 0, 0}, {K, 0, -2}};
    void *A = talloc(dt, M * K), *B = talloc(dt, K * N), *C0 = talloc(dt, nc), *C = talloc(dt, nc);
    tfill(dt, A, M * K, -1, 1);
    tfill(dt, B, K * N, -1, 1);
    for (int c = 0; c < 4; c++) {
        int k = (int)cases[c][0];
        double alpha = cases[c][1], beta = cases[c][2];
        for (ptrdiff_t i = 0; i < nc; i++)
            tset(dt, C0, i, i % ldc >= N ? PAD_SENTINEL : beta == 0 ? NAN : unif(-1, 1));
        for (int naive = 0; naive < 2; naive++) {
            memcpy(C, C0, (size_t)nc * dts(dt));
            int rc = DP_OK;
            if (naive)
                gemm_naive_t(dt, C, ldc, A, K, 1, B, N, 1, M, N, k, alpha, beta);
            else
                rc = gemm_t(dt, NULL, C, ldc, A, K, 1, B, N, 1, M, N, k, alpha, beta);
            diff d = {0};
            for (ptrdiff_t i = 0; i < nc; i++) {
                double c0 = tget(dt, C0, i);
                diff_add(&d, i, tget(dt, C, i),
                         i % ldc >= N ? c0
                         : beta == 0  ? 0
                                      : trnd(dt, beta * c0),
                         0);
            }
            expect(rc == DP_OK, "dp_gemm_%s M=%d N=%d K=%d alpha=%g beta=%g: returned %d", dtn(dt),
                   M, N, k, alpha, beta, rc);
            expect_diff(&d, ldc, "dp_gemm%s_%s M=%d N=%d K=%d alpha=%g beta=%g",
                        naive ? "_naive" : "", dtn(dt), M, N, k, alpha, beta);
        }
    }
    /* empty C: returns OK and writes nothing */
    for (int c = 0; c < 2; c++) {
        int m = c ? M : 0, n = c ? 0 : N;
        tconst(dt, C, nc, PAD_SENTINEL);
        int rc = gemm_t(dt, &ctx3, C, ldc, A, K, 1, B, N, 1, m, n, K, 1, 0);
        diff d = {0};
        for (ptrdiff_t i = 0; i < nc; i++) diff_add(&d, i, tget(dt, C, i), PAD_SENTINEL, 0);
        expect(rc == DP_OK, "dp_gemm_%s M=%d N=%d K=%d: returned %d", dtn(dt), m, n, K, rc);
        expect_diff(&d, ldc, "dp_gemm_%s M=%d N=%d K=%d (nothing to write)", dtn(dt), m, n, K);
    }
    free(A);
    free(B);
    free(C0);
    free(C);
}

/* dp_threads: a job issued right after dp_ctx_init must reach every helper even if a helper has
 * not started running yet. Runs in a child process with a deadline, so that a deadlock is a
 * failure and not a hung test. */
static void test_threads_startup(void)
{
    const int trials = 5, deadline_ms = 3000, n = 129;
    int hung = 0, crashed = 0, t;
    for (t = 0; t < trials && !hung && !crashed; t++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            expect(0, "test_threads_startup: fork failed");
            return;
        }
        if (pid == 0) {
            float *A = calloc((size_t)n * n, sizeof(float)),
                  *B = calloc((size_t)n * n, sizeof(float));
            float *C = calloc((size_t)n * n, sizeof(float));
            int rc = !A || !B || !C;
            for (int r = 0; r < 3 && !rc; r++) {
                dp_ctx c;
                rc = dp_ctx_init(&c, 3);
                if (!rc) rc = dp_gemm_f32(&c, C, n, A, n, 1, B, n, 1, n, n, n, 1, 0);
                dp_ctx_free(&c);
            }
            _exit(rc ? 3 : 0);
        }
        int status = 0, waited = 0;
        pid_t r;
        while ((r = waitpid(pid, &status, WNOHANG)) == 0 && waited < deadline_ms) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            waited += 10;
        }
        if (r == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            hung++;
        } else if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            crashed++;
        }
    }
    expect(!hung && !crashed,
           "dp_threads_run via dp_gemm_f32 M=N=K=129 issued right after dp_ctx_init(ctx, 3): "
           "trial %d of %d %s",
           t, trials,
           hung ? "deadlocked (no return within 3 s; a helper thread that starts after the "
                  "first job missed its generation bump)"
                : "failed (nonzero exit or signal)");
}

/* ---- dense layer ------------------------------------------------------------------------ */

static void test_dense(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129};
    const double eps = deps(dt);
    for (int bi = 0; bi < 4; bi++)
        for (int ii = 0; ii < 4; ii++)
            for (int oi = 0; oi < 4; oi++) {
                int B = sz[bi], IN = sz[ii], OUT = sz[oi];
                ptrdiff_t nx = (ptrdiff_t)B * IN, nw = (ptrdiff_t)OUT * IN, ny = (ptrdiff_t)B * OUT;
                void *x = talloc(dt, nx), *w = talloc(dt, nw), *b = talloc(dt, OUT);
                void *dy = talloc(dt, ny), *dw0 = talloc(dt, nw), *db0 = talloc(dt, OUT);
                void *y = talloc(dt, ny), *dw = talloc(dt, nw), *db = talloc(dt, OUT);
                void *dx = talloc(dt, nx);
                double *yr = dalloc(ny), *ym = dalloc(ny), *dwr = dalloc(nw), *dwm = dalloc(nw);
                double *dbr = dalloc(OUT), *dbm = dalloc(OUT), *dxr = dalloc(nx), *dxm = dalloc(nx);
                tfill(dt, x, nx, -1, 1);
                tfill(dt, w, nw, -1, 1);
                tfill(dt, b, OUT, -1, 1);
                tfill(dt, dy, ny, -1, 1);
                tfill(dt, dw0, nw, -1, 1);
                tfill(dt, db0, OUT, -1, 1);
                /* y = x w^T + b; dw = dw0 + dy^T x; db = db0 + sum_rows dy; dx = dy w */
                for (int i = 0; i < B; i++)
                    for (int o = 0; o < OUT; o++) {
                        double s = tget(dt, b, o), m = fabs(s);
                        for (int k = 0; k < IN; k++) {
                            double p = tget(dt, x, i * IN + k) * tget(dt, w, o * IN + k);
                            s += p;
                            m += fabs(p);
                        }
                        yr[i * OUT + o] = s;
                        ym[i * OUT + o] = m;
                    }
                for (int o = 0; o < OUT; o++) {
                    for (int k = 0; k < IN; k++) {
                        double s = tget(dt, dw0, o * IN + k), m = fabs(s);
                        for (int i = 0; i < B; i++) {
                            double p = tget(dt, dy, i * OUT + o) * tget(dt, x, i * IN + k);
                            s += p;
                            m += fabs(p);
                        }
                        dwr[o * IN + k] = s;
                        dwm[o * IN + k] = m;
                    }
                    double s = tget(dt, db0, o), m = fabs(s);
                    for (int i = 0; i < B; i++) {
                        s += tget(dt, dy, i * OUT + o);
                        m += fabs(tget(dt, dy, i * OUT + o));
                    }
                    dbr[o] = s;
                    dbm[o] = m;
                }
                for (int i = 0; i < B; i++)
                    for (int k = 0; k < IN; k++) {
                        double s = 0, m = 0;
                        for (int o = 0; o < OUT; o++) {
                            double p = tget(dt, dy, i * OUT + o) * tget(dt, w, o * IN + k);
                            s += p;
                            m += fabs(p);
                        }
                        dxr[i * IN + k] = s;
                        dxm[i * IN + k] = m;
                    }
                for (int c = 0; c < 4; c++) {
                    /* c == 3: dx == NULL (the first layer), on a 3-thread context */
                    ctx_case cc = c < 3 ? ctxs[c] : ctxs[2];
                    char what[128];
                    snprintf(what, sizeof what, "%s B=%d IN=%d OUT=%d ctx=%s%s", dtn(dt), B, IN,
                             OUT, cc.name, c == 3 ? " dx=NULL" : "");
                    tconst(dt, y, ny, NAN);
                    int rc = dense_forward_t(dt, cc.ctx, y, x, w, b, B, IN, OUT);
                    expect(rc == DP_OK, "dp_dense_forward_%s: returned %d", what, rc);
                    diff d = {0};
                    for (ptrdiff_t i = 0; i < ny; i++)
                        diff_add(&d, i, tget(dt, y, i), yr[i], (IN + 16) * eps * ym[i]);
                    expect_diff(&d, OUT, "dp_dense_forward_%s y", what);

                    memcpy(dw, dw0, (size_t)nw * dts(dt));
                    memcpy(db, db0, (size_t)OUT * dts(dt));
                    tconst(dt, dx, nx, NAN); /* dx is overwritten, never read */
                    rc = dense_backward_t(dt, cc.ctx, dw, db, c == 3 ? NULL : dx, dy, x, w, B, IN,
                                          OUT);
                    expect(rc == DP_OK, "dp_dense_backward_%s: returned %d", what, rc);
                    diff ew = {0}, eb = {0}, ex = {0};
                    for (ptrdiff_t i = 0; i < nw; i++)
                        diff_add(&ew, i, tget(dt, dw, i), dwr[i], (B + 16) * eps * dwm[i]);
                    for (int o = 0; o < OUT; o++)
                        diff_add(&eb, o, tget(dt, db, o), dbr[o], (B + 16) * eps * dbm[o]);
                    expect_diff(&ew, IN, "dp_dense_backward_%s dw (accumulated)", what);
                    expect_diff(&eb, 0, "dp_dense_backward_%s db (accumulated)", what);
                    if (c < 3) {
                        for (ptrdiff_t i = 0; i < nx; i++)
                            diff_add(&ex, i, tget(dt, dx, i), dxr[i], (OUT + 16) * eps * dxm[i]);
                        expect_diff(&ex, IN, "dp_dense_backward_%s dx", what);
                    }
                }
                free(x);
                free(w);
                free(b);
                free(dy);
                free(dw0);
                free(db0);
                free(y);
                free(dw);
                free(db);
                free(dx);
                free(yr);
                free(ym);
                free(dwr);
                free(dwm);
                free(dbr);
                free(dbm);
                free(dxr);
                free(dxm);
            }
}

/* ---- element-wise kernels ---------------------------------------------------------------- */

static void test_relu(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129};
    for (int s = 0; s < 4; s++) {
        int n = sz[s];
        void *x = talloc(dt, n), *y = talloc(dt, n), *dy = talloc(dt, n), *dx = talloc(dt, n);
        tfill(dt, x, n, -1, 1);
        tfill(dt, dy, n, -1, 1);
        for (int i = 0; i < n; i += 5) tset(dt, x, i, i % 10 ? -0.0 : 0.0); /* relu'(0) = 0 */
        for (int inplace = 0; inplace < 2; inplace++) {
            diff d = {0}, e = {0};
            if (inplace) {
                memcpy(y, x, (size_t)n * dts(dt));
                relu_forward_t(dt, y, y, n);
            } else {
                tconst(dt, y, n, NAN);
                relu_forward_t(dt, y, x, n);
            }
            for (int i = 0; i < n; i++) {
                double xi = tget(dt, x, i);
                diff_add(&d, i, tget(dt, y, i), xi > 0 ? xi : 0, 0);
            }
            expect_diff(&d, 0, "dp_relu_forward_%s n=%d%s", dtn(dt), n, inplace ? " in place" : "");
            if (inplace) {
                memcpy(dx, dy, (size_t)n * dts(dt));
                relu_backward_t(dt, dx, dx, y, n);
            } else {
                tconst(dt, dx, n, NAN);
                relu_backward_t(dt, dx, dy, y, n);
            }
            for (int i = 0; i < n; i++)
                diff_add(&e, i, tget(dt, dx, i), tget(dt, x, i) > 0 ? tget(dt, dy, i) : 0, 0);
            expect_diff(&e, 0, "dp_relu_backward_%s n=%d%s", dtn(dt), n,
                        inplace ? " in place" : "");
        }
        free(x);
        free(y);
        free(dy);
        free(dx);
    }
}

/* dp_math.h: the vectorizable exp (x <= 0) and log1p (0 <= e <= 1) inside the loss kernels,
 * against libm in double. Measured worst case ~2 eps; 4 allowed. Near and below the smallest
 * normal the result may flush to 0 (exp cuts off at x < -708 for double, x < -87 for float,
 * where exp(x) is below 4 * DBL_MIN / 4 * FLT_MIN). */
static void test_math(void)
{
    diff e64 = {0}, e32 = {0}, l64 = {0}, l32 = {0};
    const int n = 20000;
    for (int i = 0; i <= n; i++) {
        double x = -750.0 * i / n, r = exp(x);
        diff_add(&e64, i, dp_expneg_f64(x), r,
                 r >= 4 * DBL_MIN ? 4 * DBL_EPSILON * r : 4 * DBL_MIN);
        float xf = (float)(-110.0 * i / n);
        double rf = exp((double)xf);
        diff_add(&e32, i, dp_expneg_f32(xf), rf,
                 rf >= 4 * FLT_MIN ? 4 * FLT_EPSILON * rf : 4 * FLT_MIN);
        /* e on [0, 1] plus tiny e, where log1p must stay accurate in relative terms */
        double e = i < n / 2 ? (double)i / (n / 2) : ldexp(1.0, -(i - n / 2) % 1000);
        diff_add(&l64, i, dp_log1p01_f64(e), log1p(e), 4 * DBL_EPSILON * log1p(e));
        float ef = i < n / 2 ? (float)e : (float)ldexp(1.0, -(i - n / 2) % 120);
        diff_add(&l32, i, dp_log1p01_f32(ef), log1p((double)ef),
                 4 * FLT_EPSILON * log1p((double)ef));
    }
    expect_diff(&e64, 0, "dp_expneg_f64 at x = -750 i / %d", n);
    expect_diff(&e32, 0, "dp_expneg_f32 at x = -110 i / %d", n);
    expect_diff(&l64, 0, "dp_log1p01_f64 on [0, 1] and 2^-k");
    expect_diff(&l32, 0, "dp_log1p01_f32 on [0, 1] and 2^-k");
}

static void test_scale(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129};
    static const double alphas[] = {0.5, -3, 1.0 / 3.0, 0};
    for (int s = 0; s < 4; s++)
        for (int a = 0; a < 4; a++) {
            int n = sz[s];
            double alpha = trnd(dt, alphas[a]);
            void *buf = talloc(dt, n), *orig = talloc(dt, n);
            tfill(dt, orig, n, -2, 2);
            memcpy(buf, orig, (size_t)n * dts(dt));
            scale_t(dt, buf, n, alpha);
            diff d = {0};
            for (int i = 0; i < n; i++)
                diff_add(&d, i, tget(dt, buf, i), trnd(dt, tget(dt, orig, i) * alpha), 0);
            expect_diff(&d, 0, "dp_scale_%s n=%d alpha=%g", dtn(dt), n, alpha);
            free(buf);
            free(orig);
        }
}

/* dp_to_bf16 against dp_round_bf16 (the GEMM's scalar twin) on random bit patterns and the
 * deciding values, dp_from_bf16 exact, dp_sum_bf16 = float sum in order, scaled, rounded
 * (and sliced calls bit-identical to one); the ISA is the caller's. */
static void test_bf16_buffers(void)
{
    enum { N = 4099, K = 3 }; /* past two chunks of 2048 */
    static float x[N], r[N], back[N];
    static uint16_t b[N], ins[K][N], whole[N], sliced[N];
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(st >> 32);
        if (i < 8) {
            static const uint32_t special[8] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u,
                                                0xff800000u, 0x00008000u, 0x007fffffu, 0x80000000u};
            u = special[i];
        }
        memcpy(&x[i], &u, 4);
    }
    memcpy(r, x, sizeof x);
    dp_round_bf16(r, N);
    dp_to_bf16(b, x, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        uint32_t ru;
        memcpy(&ru, &r[i], 4);
        if (isnan(x[i]) ? (b[i] & 0x7f80u) != 0x7f80u || !(b[i] & 0x7fu)
                        : b[i] != (uint16_t)(ru >> 16))
            bad++;
    }
    expect(bad == 0, "dp_to_bf16: %d of %d values differ from dp_round_bf16", bad, N);
    dp_from_bf16(back, b, N);
    bad = 0;
    for (int i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &back[i], 4);
        if (u != (uint32_t)b[i] << 16) bad++;
    }
    expect(bad == 0, "dp_from_bf16: %d of %d values are not the bits << 16", bad, N);
    for (int q = 0; q < K; q++)
        for (int i = 0; i < N; i++) {
            float v = (float)unif(-4, 4);
            dp_to_bf16(&ins[q][i], &v, 1);
        }
    const uint16_t *pins[K] = {ins[0], ins[1], ins[2]};
    dp_sum_bf16(whole, pins, K, 0, N, 0.5f);
    bad = 0;
    for (int i = 0; i < N; i++) {
        float acc = 0;
        for (int q = 0; q < K; q++) {
            uint32_t u = (uint32_t)ins[q][i] << 16;
            float f;
            memcpy(&f, &u, 4);
            acc += f;
        }
        acc *= 0.5f;
        uint16_t want;
        dp_to_bf16(&want, &acc, 1);
        if (whole[i] != want) bad++;
    }
    expect(bad == 0, "dp_sum_bf16 k=3 scale=0.5: %d of %d differ from the float sum rounded", bad,
           N);
    ptrdiff_t cut[4] = {0, 1001, 2049, N};
    for (int c = 0; c < 3; c++) dp_sum_bf16(sliced, pins, K, cut[c], cut[c + 1], 0.5f);
    expect(memcmp(whole, sliced, sizeof whole) == 0,
           "dp_sum_bf16: sliced calls differ from one call");
    /* out may be one of the inputs */
    memcpy(sliced, ins[0], sizeof sliced);
    const uint16_t *alias[K] = {sliced, ins[1], ins[2]};
    dp_sum_bf16(sliced, alias, K, 0, N, 0.5f);
    expect(memcmp(whole, sliced, sizeof whole) == 0, "dp_sum_bf16: out = ins[0] differs");
}

static void test_sum_buffers(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129, 4099}; /* 4099: three SUM_CHUNKs of 2048 */
    static const int ks[] = {0, 1, 2, 3, 5};
    static const double scales[] = {1, 0.5, 1.0 / 3.0};
    for (int s = 0; s < 5; s++)
        for (int kk = 0; kk < 5; kk++)
            for (int sc = 0; sc < 3; sc++) {
                int n = sz[s], k = ks[kk];
                double scale = trnd(dt, scales[sc]);
                void *ins[5];
                for (int q = 0; q < k; q++) {
                    ins[q] = talloc(dt, n);
                    tfill(dt, ins[q], n, -1, 1);
                }
                /* left to right in T arithmetic, then the scale: bit-exact */
                double *ref = dalloc(n);
                for (int i = 0; i < n; i++) {
                    double acc = k ? tget(dt, ins[0], i) : 0;
                    for (int q = 1; q < k; q++) acc = trnd(dt, acc + tget(dt, ins[q], i));
                    ref[i] = trnd(dt, acc * scale);
                }
                void *whole = talloc(dt, n), *sliced = talloc(dt, n), *part = talloc(dt, n);
                char what[96];
                snprintf(what, sizeof what, "dp_sum_buffers_%s n=%d k=%d scale=%g", dtn(dt), n, k,
                         scale);

                tconst(dt, whole, n, PAD_SENTINEL);
                sum_buffers_t(dt, whole, ins, k, 0, n, scale);
                diff d = {0};
                for (int i = 0; i < n; i++) diff_add(&d, i, tget(dt, whole, i), ref[i], 0);
                expect_diff(&d, 0, "%s [0,%d)", what, n);

                /* odd slices covering [0, n): bit-identical to one call */
                ptrdiff_t cut[4] = {0, n / 3, n / 3 + (n - n / 3) / 2 + 1, n};
                if (cut[2] > n) cut[2] = n;
                tconst(dt, sliced, n, PAD_SENTINEL);
                for (int c = 0; c < 3; c++)
                    sum_buffers_t(dt, sliced, ins, k, cut[c], cut[c + 1], scale);
                expect(memcmp(whole, sliced, (size_t)n * dts(dt)) == 0,
                       "%s: slices [0,%td) [%td,%td) [%td,%d) differ from one call over [0,%d)",
                       what, cut[1], cut[1], cut[2], cut[2], n, n);

                /* one inner slice: nothing outside it is written */
                ptrdiff_t lo = n / 3, hi = n - n / 5;
                tconst(dt, part, n, PAD_SENTINEL);
                sum_buffers_t(dt, part, ins, k, lo, hi, scale);
                diff e = {0};
                for (int i = 0; i < n; i++)
                    diff_add(&e, i, tget(dt, part, i), i >= lo && i < hi ? ref[i] : PAD_SENTINEL,
                             0);
                expect_diff(&e, 0, "%s [%td,%td) (elements outside untouched)", what, lo, hi);

                for (int q = 0; q < k; q++) free(ins[q]);
                free(ref);
                free(whole);
                free(sliced);
                free(part);
            }
}

/* torch.optim.SGD, written out: d = g + wd p; v = d on the first step, else m v + (1 - damp) d;
 * step = d + m v if nesterov else v (momentum 0: no velocity given, step = d, v untouched);
 * p -= lr step. */
static void test_sgd(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129};
    const double eps = deps(dt);
    for (int s = 0; s < 4; s++)
        for (int cfg = 0; cfg < 16; cfg++) {
            int n = sz[s], nesterov = cfg >> 3 & 1;
            double lr = trnd(dt, 0.1), m = trnd(dt, cfg & 1 ? 0.9 : 0);
            double damp = trnd(dt, cfg & 2 ? 0.25 : 0), wd = trnd(dt, cfg & 4 ? 0.01 : 0);
            void *p = talloc(dt, n), *v = talloc(dt, n), *g = talloc(dt, n);
            double *p0 = dalloc(n), *v0 = dalloc(n);
            tfill(dt, p, n, -1, 1);
            if (m == 0)
                tconst(dt, v, n, PAD_SENTINEL);
            else
                tconst(dt, v, n, NAN); /* the first step must not read v */
            for (int step = 0; step < 3; step++) {
                int first = step == 0;
                tfill(dt, g, n, -1, 1);
                for (int i = 0; i < n; i++) {
                    p0[i] = tget(dt, p, i);
                    v0[i] = tget(dt, v, i);
                }
                sgd_step_t(dt, p, m == 0 ? NULL : v, g, n, lr, m, damp, wd, nesterov, first);
                diff dp_ = {0}, dv = {0};
                for (int i = 0; i < n; i++) {
                    double gi = tget(dt, g, i), d = gi + wd * p0[i], vn, st;
                    if (m == 0) {
                        vn = v0[i];
                        st = d;
                    } else {
                        vn = first ? d : m * v0[i] + (1 - damp) * d;
                        st = nesterov ? d + m * vn : vn;
                    }
                    double vmag =
                        fabs(gi) + fabs(wd * p0[i]) + (first || m == 0 ? 0 : fabs(m * v0[i]));
                    double pmag = fabs(p0[i]) + lr * (vmag + fabs(d) + fabs(m * vn) + fabs(vn));
                    diff_add(&dp_, i, tget(dt, p, i), p0[i] - lr * st, 8 * eps * pmag);
                    diff_add(&dv, i, tget(dt, v, i), vn, m == 0 ? 0 : 8 * eps * vmag);
                }
                char what[160];
                snprintf(what, sizeof what,
                         "dp_sgd_step_%s n=%d lr=%g momentum=%g dampening=%g weight_decay=%g "
                         "nesterov=%d step=%d first_step=%d",
                         dtn(dt), n, lr, m, damp, wd, nesterov, step, first);
                expect_diff(&dp_, 0, "%s p", what);
                expect_diff(&dv, 0, "%s v%s", what, m == 0 ? " (must be untouched)" : "");
            }
            free(p);
            free(v);
            free(g);
            free(p0);
            free(v0);
        }
}

/* dp_adam_step_team on `team` (of teamsize threads): the same bits as the caller alone at sizes
 * around one part (DP_SGD_MIN_PART) and a unit (DP_SGD_UNIT), every configuration. */
static void check_adam_team(dtype dt, dp_threads *team, int teamsize)
{
    const ptrdiff_t P = DP_SGD_MIN_PART, U = DP_SGD_UNIT;
    const ptrdiff_t sz[] = {1, P - 1, 2 * P + U + 1, 3 * P + 7};
    const size_t es = dts(dt);
    for (int s = 0; s < 4; s++)
        for (int cfg = 0; cfg < 8; cfg++) {
            ptrdiff_t n = sz[s];
            int ams = cfg & 1, decoupled = cfg >> 1 & 1;
            double wd = cfg & 4 ? 0.05 : 0;
            void *buf[2][4], *g = talloc(dt, n); /* [alone, team][p, m, v, vmax] */
            tfill(dt, g, n, -1, 1);
            for (int k = 0; k < 4; k++) {
                buf[0][k] = talloc(dt, n);
                buf[1][k] = talloc(dt, n);
                tfill(dt, buf[0][k], n, k ? 0 : -1, 1);
                memcpy(buf[1][k], buf[0][k], (size_t)n * es);
            }
            for (int who = 0; who < 2; who++)
                adam_step_t(dt, who ? team : NULL, buf[who][0], buf[who][1], buf[who][2],
                            ams ? buf[who][3] : NULL, g, n, 0.01, wd, decoupled, 5);
            int same = 1;
            for (int k = 0; k < 4; k++) {
                same &= memcmp(buf[0][k], buf[1][k], (size_t)n * es) == 0;
                free(buf[0][k]);
                free(buf[1][k]);
            }
            expect(same,
                   "dp_adam_step_team_%s threads=%d n=%td amsgrad=%d decoupled=%d "
                   "weight_decay=%g: differs from the caller alone",
                   dtn(dt), teamsize, n, ams, decoupled, wd);
            free(g);
        }
}

/* dp_sgd_step_team and dp_zero_team on teams of 2 and 3 threads: the same bits as the caller
 * alone (dp_sgd_step / memset) at sizes around one part (DP_SGD_MIN_PART) and a unit
 * (DP_SGD_UNIT), every configuration; the zero clears its n elements and nothing past them.
 * dp_adam_step_team, which splits the same way, on the same teams (check_adam_team). */
static void test_sgd_team(dtype dt)
{
    const ptrdiff_t P = DP_SGD_MIN_PART, U = DP_SGD_UNIT;
    const ptrdiff_t sz[] = {1, P - 1, 2 * P - 1, 2 * P + U + 1, 3 * P + 7};
    const size_t es = dts(dt);
    for (int teamsize = 2; teamsize <= 3; teamsize++) {
        dp_threads *team = NULL;
        if (dp_threads_create(&team, teamsize) != DP_OK) {
            expect(0, "dp_threads_create(%d) failed", teamsize);
            return;
        }
        for (int s = 0; s < 5; s++)
            for (int cfg = 0; cfg < 16; cfg++) {
                ptrdiff_t n = sz[s];
                int nesterov = cfg >> 3 & 1, mom = cfg & 1;
                double lr = 0.1, m = mom ? 0.9 : 0, damp = cfg & 2 ? 0.25 : 0;
                double wd = cfg & 4 ? 0.01 : 0;
                if (nesterov && (!mom || damp != 0)) continue;
                void *p = talloc(dt, n), *v = talloc(dt, n), *g = talloc(dt, n);
                void *p1 = talloc(dt, n), *v1 = talloc(dt, n);
                tfill(dt, p, n, -1, 1);
                tfill(dt, v, n, -1, 1);
                tfill(dt, g, n, -1, 1);
                memcpy(p1, p, (size_t)n * es);
                memcpy(v1, v, (size_t)n * es);
                for (int first = 0; first <= 1; first++) {
                    if (dt == F32) {
                        dp_sgd_step_f32(p1, mom ? v1 : NULL, g, n, (float)lr, (float)m, (float)damp,
                                        (float)wd, nesterov, first);
                        dp_sgd_step_team_f32(team, p, mom ? v : NULL, g, n, (float)lr, (float)m,
                                             (float)damp, (float)wd, nesterov, first);
                    } else {
                        dp_sgd_step_f64(p1, mom ? v1 : NULL, g, n, lr, m, damp, wd, nesterov,
                                        first);
                        dp_sgd_step_team_f64(team, p, mom ? v : NULL, g, n, lr, m, damp, wd,
                                             nesterov, first);
                    }
                    expect(memcmp(p, p1, (size_t)n * es) == 0 && memcmp(v, v1, (size_t)n * es) == 0,
                           "dp_sgd_step_team_%s threads=%d n=%td momentum=%g dampening=%g "
                           "weight_decay=%g nesterov=%d first_step=%d: differs from "
                           "dp_sgd_step",
                           dtn(dt), teamsize, n, m, damp, wd, nesterov, first);
                }
                free(p);
                free(v);
                free(g);
                free(p1);
                free(v1);
            }
        for (int s = 0; s < 5; s++) {
            size_t nb = (size_t)sz[s] * es;
            unsigned char *b = xalloc(nb + 64);
            memset(b, 0xAB, nb + 64);
            dp_zero_team(team, b, sz[s], es);
            size_t bad = 0;
            for (size_t i = 0; i < nb + 64; i++) bad += b[i] != (i < nb ? 0 : 0xAB);
            expect(bad == 0,
                   "dp_zero_team threads=%d n=%td size=%zu: %zu bytes wrong (cleared "
                   "range or the 64 after it)",
                   teamsize, sz[s], es, bad);
            free(b);
        }
        check_adam_team(dt, team, teamsize);
        dp_threads_destroy(team);
    }
}

/* torch.optim.Adam / AdamW, written out in double (betas 0.9, 0.999, eps 1e-8): g += wd p
 * (Adam) or p *= 1 - lr wd (AdamW); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; with
 * AMSGrad vmax = max(vmax, v) replaces v; p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t)
 * + eps). Three steps from zero moments; without AMSGrad vmax is NULL (a NaN-filled buffer
 * beside it must stay so). */
static void test_adam(dtype dt)
{
    static const int sz[] = {1, 7, 33, 129};
    const double eps = deps(dt), b1 = 0.9, b2 = 0.999;
    for (int s = 0; s < 4; s++)
        for (int cfg = 0; cfg < 8; cfg++) {
            int n = sz[s], ams = cfg & 1, decoupled = cfg >> 1 & 1;
            double lr = 0.01, wd = cfg & 4 ? 0.05 : 0;
            void *p = talloc(dt, n), *m = talloc(dt, n), *v = talloc(dt, n);
            void *vm = talloc(dt, n), *g = talloc(dt, n);
            double *p0 = dalloc(n), *m0 = dalloc(n), *v0 = dalloc(n), *vm0 = dalloc(n);
            tfill(dt, p, n, -1, 1);
            tconst(dt, m, n, 0);
            tconst(dt, v, n, 0);
            tconst(dt, vm, n, ams ? 0 : NAN);
            for (int t = 1; t <= 3; t++) {
                tfill(dt, g, n, -1, 1);
                for (int i = 0; i < n; i++) {
                    p0[i] = tget(dt, p, i);
                    m0[i] = tget(dt, m, i);
                    v0[i] = tget(dt, v, i);
                    vm0[i] = tget(dt, vm, i);
                }
                adam_step_t(dt, NULL, p, m, v, ams ? vm : NULL, g, n, lr, wd, decoupled, t);
                diff dp_ = {0}, dm = {0}, dv = {0}, dvm = {0};
                double step_size = lr / (1 - pow(b1, t)), bias2_sqrt = sqrt(1 - pow(b2, t));
                for (int i = 0; i < n; i++) {
                    double pi = decoupled && wd != 0 ? p0[i] * (1 - lr * wd) : p0[i];
                    double gi = tget(dt, g, i) + (decoupled ? 0 : wd * p0[i]);
                    double mi = b1 * m0[i] + (1 - b1) * gi, vi = b2 * v0[i] + (1 - b2) * gi * gi;
                    double vmi = ams ? fmax(vm0[i], vi) : vm0[i];
                    double upd = step_size * mi / (sqrt(ams ? vmi : vi) / bias2_sqrt + 1e-8);
                    double gmag = fabs(tget(dt, g, i)) + wd * fabs(p0[i]);
                    diff_add(&dp_, i, tget(dt, p, i), pi - upd, 16 * eps * (fabs(pi) + fabs(upd)));
                    diff_add(&dm, i, tget(dt, m, i), mi, 8 * eps * (fabs(m0[i]) + gmag));
                    diff_add(&dv, i, tget(dt, v, i), vi, 8 * eps * (v0[i] + gmag * gmag));
                    if (ams)
                        diff_add(&dvm, i, tget(dt, vm, i), vmi, 8 * eps * (vm0[i] + gmag * gmag));
                    else
                        diff_add(&dvm, i, isnan(tget(dt, vm, i)) ? 0 : 1, 0, 0);
                }
                char what[160];
                snprintf(what, sizeof what,
                         "dp_adam_step_%s n=%d amsgrad=%d decoupled=%d weight_decay=%g step=%d",
                         dtn(dt), n, ams, decoupled, wd, t);
                expect_diff(&dp_, 0, "%s p", what);
                expect_diff(&dm, 0, "%s m", what);
                expect_diff(&dv, 0, "%s v", what);
                expect_diff(&dvm, 0, "%s vmax%s", what, ams ? "" : " (must be untouched)");
            }
            free(p);
            free(m);
            free(v);
            free(vm);
            free(g);
            free(p0);
            free(m0);
            free(v0);
            free(vm0);
        }
}

/* ---- losses ------------------------------------------------------------------------------ */

static void test_softmax_xent(dtype dt)
{
    static const int Bs[] = {1, 7, 33}, Cs[] = {1, 2, 7, 33, 129};
    const double eps = deps(dt);
    for (int bi = 0; bi < 3; bi++)
        for (int ci = 0; ci < 5; ci++)
            for (int var = 0; var < 3; var++) {
                /* var 0: grad_scale 1/B, 1: grad_scale 2.5, 2: loss only (dlogits NULL) */
                int B = Bs[bi], C = Cs[ci];
                ptrdiff_t n = (ptrdiff_t)B * C;
                double gs = trnd(dt, var == 1 ? 2.5 : 1.0 / B);
                void *z = talloc(dt, n), *dz = talloc(dt, n);
                int64_t *lab = ialloc(B);
                double *dref = dalloc(n), *spread = dalloc(B), ltol = 0, lref = 0;
                for (int i = 0; i < B; i++) {
                    /* rows far from 0 and a single huge logit: exp overflows unless shifted */
                    double off = i % 4 == 1 ? 800 : i % 4 == 3 ? -800 : 0;
                    for (int j = 0; j < C; j++) tset(dt, z, i * C + j, off + unif(-5, 5));
                    if (i % 4 == 2) tset(dt, z, i * C + randint(C), 90);
                    lab[i] = randint(C);
                }
                for (int i = 0; i < B; i++) {
                    double mx = -INFINITY, mn = INFINITY, s = 0;
                    for (int j = 0; j < C; j++) {
                        mx = fmax(mx, tget(dt, z, i * C + j));
                        mn = fmin(mn, tget(dt, z, i * C + j));
                    }
                    for (int j = 0; j < C; j++) s += exp(tget(dt, z, i * C + j) - mx);
                    double lse = log(s) + mx, zy = tget(dt, z, i * C + lab[i]);
                    lref += lse - zy;
                    /* exp of (z - max), off by eps |z - max|, summed over C terms; the terms
                     * of magnitude |max| are added in double */
                    spread[i] = mx - mn;
                    ltol += (C + 16) * eps * (2 + spread[i] + log(C + 1.0)) +
                            8 * DBL_EPSILON * (fabs(mx) + fabs(zy) + B * fabs(lse - zy));
                    for (int j = 0; j < C; j++)
                        dref[i * C + j] =
                            gs * (exp(tget(dt, z, i * C + j) - mx) / s - (j == lab[i]));
                }
                char what[96];
                snprintf(what, sizeof what, "dp_softmax_xent_%s B=%d C=%d grad_scale=%g%s", dtn(dt),
                         B, C, gs, var == 2 ? " dlogits=NULL" : "");
                tconst(dt, dz, n, NAN);
                double loss = NAN;
                int rc = softmax_xent_t(dt, var == 2 ? NULL : dz, &loss, z, lab, B, C, gs);
                expect(rc == DP_OK, "%s: returned %d", what, rc);
                expect(fabs(loss - lref) <= ltol,
                       "%s: loss_sum %.12g expected %.12g (|err| %.3g > tol %.3g)", what, loss,
                       lref, fabs(loss - lref), ltol);
                if (var < 2) {
                    diff d = {0};
                    for (ptrdiff_t i = 0; i < n; i++) {
                        /* p_j is off by (C + spread) eps relative (see the loss), then a few
                         * roundings of grad_scale */
                        double p = dref[i] / gs + ((int)(i % C) == lab[i / C]);
                        diff_add(&d, i, tget(dt, dz, i), dref[i],
                                 fabs(gs) * eps * ((C + 16 + spread[i / C]) * p + 4));
                    }
                    expect_diff(&d, C, "%s dlogits", what);
                }
                /* a label out of range is an error, not a read out of bounds */
                int64_t keep = lab[B - 1];
                lab[B - 1] = C;
                rc = softmax_xent_t(dt, var == 2 ? NULL : dz, &loss, z, lab, B, C, gs);
                expect(rc == DP_ELABEL, "%s label=%d (== C): returned %d, expected DP_ELABEL", what,
                       C, rc);
                lab[B - 1] = -1;
                rc = softmax_xent_t(dt, var == 2 ? NULL : dz, &loss, z, lab, B, C, gs);
                expect(rc == DP_ELABEL, "%s label=-1: returned %d, expected DP_ELABEL", what, rc);
                lab[B - 1] = keep;
                free(z);
                free(dz);
                free(lab);
                free(dref);
                free(spread);
            }
}

/* softplus(z) - y z and sigmoid(z), in double, without overflow */
static double bce_ref(double z, double y, double *sig)
{
    double e = exp(-fabs(z));
    *sig = z >= 0 ? 1 / (1 + e) : e / (1 + e);
    return fmax(z, 0) - y * z + log1p(e);
}

static void test_sigmoid_bce(dtype dt)
{
    static const int Bs[] = {1, 7, 33, 129};
    static const double special[] = {0, 50, -50, 200, -200, 1000, -1000, 1e-3};
    const double eps = deps(dt);
    for (int bi = 0; bi < 4; bi++)
        for (int var = 0; var < 4; var++) { /* 3: in place, dlogits = logits */
            int B = Bs[bi];
            double gs = trnd(dt, var == 1 ? -1.5 : 1.0 / B);
            void *z = talloc(dt, B), *dz = talloc(dt, B);
            int64_t *lab = ialloc(B);
            double lref = 0, ltol = 0;
            for (int i = 0; i < B; i++) {
                tset(dt, z, i, i % 3 == 1 ? special[(i / 3) % 8] : unif(-8, 8));
                lab[i] = randint(2);
            }
            char what[96];
            snprintf(what, sizeof what, "dp_sigmoid_bce_%s B=%d grad_scale=%g%s", dtn(dt), B, gs,
                     var == 2   ? " dlogits=NULL"
                     : var == 3 ? " in place"
                                : "");
            tconst(dt, dz, B, NAN);
            if (var == 3) memcpy(dz, z, (size_t)B * dts(dt));
            double loss = NAN;
            int rc = sigmoid_bce_t(dt, var == 2 ? NULL : dz, &loss, var == 3 ? dz : z, lab, B, gs);
            expect(rc == DP_OK, "%s: returned %d", what, rc);
            diff d = {0};
            for (int i = 0; i < B; i++) {
                double s, zi = tget(dt, z, i), l = bce_ref(zi, (double)lab[i], &s);
                lref += l;
                ltol += 8 * eps * (1 + 2 * fabs(zi)) + B * DBL_EPSILON * l;
                if (var != 2)
                    diff_add(&d, i, tget(dt, dz, i), gs * (s - lab[i]), 8 * eps * fabs(gs));
            }
            expect(fabs(loss - lref) <= ltol,
                   "%s: loss_sum %.12g expected %.12g (|err| %.3g > tol %.3g)", what, loss, lref,
                   fabs(loss - lref), ltol);
            if (var != 2) expect_diff(&d, 0, "%s dlogits", what);
            int64_t keep = lab[B / 2];
            lab[B / 2] = 2;
            rc = sigmoid_bce_t(dt, var == 2 ? NULL : dz, &loss, z, lab, B, gs);
            expect(rc == DP_ELABEL, "%s label=2: returned %d, expected DP_ELABEL", what, rc);
            lab[B / 2] = -1;
            rc = sigmoid_bce_t(dt, var == 2 ? NULL : dz, &loss, z, lab, B, gs);
            expect(rc == DP_ELABEL, "%s label=-1: returned %d, expected DP_ELABEL", what, rc);
            lab[B / 2] = keep;
            free(z);
            free(dz);
            free(lab);
        }
}

/* A logit's gradient does not depend on where it sits: the gradients of z[0 .. k) for every
 * k up to 2 blocks (a last block of every length, 1 to 32 values) equal, bit for bit, the
 * first k of the gradients of all 64, for 40 random sets. (Until the loops ran over whole
 * blocks, a partial block's values went through a remainder loop, which rounded some 1 ulp
 * otherwise: 8 to 30 of the 2,560 prefixes differed on avx2 and avx512.) */
static void test_sigmoid_bce_position(dtype dt)
{
    enum { N = 64 };
    void *z = talloc(dt, N), *all = talloc(dt, N), *part = talloc(dt, N);
    int64_t *lab = ialloc(N);
    int bad = 0;
    for (int set = 0; set < 40; set++) {
        for (int i = 0; i < N; i++) {
            tset(dt, z, i, unif(-6, 6));
            lab[i] = randint(2);
        }
        sigmoid_bce_t(dt, all, &(double){0}, z, lab, N, 1.0);
        for (int k = 1; k <= N; k++) {
            sigmoid_bce_t(dt, part, &(double){0}, z, lab, k, 1.0);
            bad += memcmp(part, all, (size_t)k * dts(dt)) != 0;
        }
    }
    expect(bad == 0,
           "dp_sigmoid_bce_%s: the gradients of a prefix of %d logits differ from "
           "theirs in the whole batch for %d of 40 x %d prefixes",
           dtn(dt), N, bad, N);
    free(z);
    free(all);
    free(part);
    free(lab);
}

/* dp_sigmoid_bce densely over z, with y = (z > 0): each loss is then log1p(exp(-|z|)) alone,
 * which must stay accurate in relative terms down to exp(-|z|) far below eps, and dlogits is
 * sigmoid(z) (z <= 0, relative) or sigmoid(z) - 1 (z > 0, absolute: 1 - sigmoid is not
 * computed alone). The random z of test_sigmoid_bce are a few dozen points. */
static void test_sigmoid_bce_dense(dtype dt)
{
    const int n = 4001;
    const double zmax = dt == F32 ? 30 : 300, eps = deps(dt);
    void *z = talloc(dt, n), *dz = talloc(dt, n);
    int64_t *lab = ialloc(n);
    for (int i = 0; i < n; i++) {
        tset(dt, z, i, zmax * (2.0 * i / (n - 1) - 1));
        lab[i] = tget(dt, z, i) > 0;
    }
    int rc = sigmoid_bce_t(dt, dz, &(double){0}, z, lab, n, 1.0);
    expect(rc == DP_OK, "dp_sigmoid_bce_%s dense: returned %d", dtn(dt), rc);
    diff dl = {0}, dg = {0};
    for (int i = 0; i < n; i++) {
        double zi = tget(dt, z, i), s, l = bce_ref(zi, (double)lab[i], &s), loss = NAN;
        const void *zi_p = (const char *)z + (size_t)i * dts(dt);
        rc = sigmoid_bce_t(dt, NULL, &loss, zi_p, lab + i, 1, 1.0);
        expect(rc == DP_OK, "dp_sigmoid_bce_%s z=%g: returned %d", dtn(dt), zi, rc);
        diff_add(&dl, i, loss, l, 6 * eps * l);
        diff_add(&dg, i, tget(dt, dz, i), s - (double)lab[i], 4 * eps * (zi > 0 ? 1 : s));
    }
    expect_diff(&dl, 0, "dp_sigmoid_bce_%s loss at z = %g (2 i / %d - 1), y = (z > 0)", dtn(dt),
                zmax, n - 1);
    expect_diff(&dg, 0, "dp_sigmoid_bce_%s dlogits at z = %g (2 i / %d - 1), y = (z > 0)", dtn(dt),
                zmax, n - 1);
    free(z);
    free(dz);
    free(lab);
}

/* The fused logistic-regression kernel against its naive computation: z = x w + b, BCE,
 * dw += grad_scale sum_r (sigmoid(z_r) - y_r) x_r, db likewise, correct = #[(z > 0) == y]. */
static void test_logistic_grad(dtype dt)
{
    /* IN: below and above each build's lanes, and 20 / 45, whose last 4 / 5 or 13 columns are
     * the 8- and 16-lane builds' masked tail */
    static const int Bs[] = {1, 7, 33, 129, 200}, INs[] = {1, 7, 20, 33, 45, 129};
    const double eps = deps(dt);
    for (int bi = 0; bi < 5; bi++)
        for (int ii = 0; ii < 6; ii++) {
            int B = Bs[bi], IN = INs[ii];
            ptrdiff_t nx = (ptrdiff_t)B * IN;
            double gs = trnd(dt, 1.0 / B);
            void *x = talloc(dt, nx), *w = talloc(dt, IN), *b = talloc(dt, 1);
            void *dw0 = talloc(dt, IN), *db0 = talloc(dt, 1), *dw = talloc(dt, IN),
                 *db = talloc(dt, 1);
            int64_t *lab = ialloc(B);
            double *g = dalloc(B), *gtol = dalloc(B);
            tfill(dt, x, nx, -1, 1);
            tfill(dt, w, IN, -2, 2);
            tfill(dt, b, 1, -1, 1);
            tfill(dt, dw0, IN, -1, 1);
            tfill(dt, db0, 1, -1, 1);
            for (int i = 0; i < B; i++) lab[i] = randint(2);
            double lref = 0, ltol = 0, dbr = tget(dt, db0, 0), dbm = fabs(dbr), dbt = 0;
            int64_t cref = 0, ambiguous = 0;
            for (int r = 0; r < B; r++) {
                double z = tget(dt, b, 0), zm = fabs(z), s;
                for (int j = 0; j < IN; j++) {
                    double p = tget(dt, x, r * IN + j) * tget(dt, w, j);
                    z += p;
                    zm += fabs(p);
                }
                double ztol = (IN + 8) * eps * zm, l = bce_ref(z, (double)lab[r], &s);
                lref += l;
                ltol += ztol + 8 * eps * (1 + 2 * fabs(z)) + B * DBL_EPSILON * l;
                if (fabs(z) <= ztol)
                    ambiguous++;
                else
                    cref += (z > 0) == (lab[r] == 1);
                g[r] = gs * (s - lab[r]);
                gtol[r] = fabs(gs) * (ztol / 4 + 8 * eps); /* sigmoid' <= 1/4 */
                dbr += g[r];
                dbm += fabs(g[r]);
                dbt += gtol[r];
            }
            char what[96];
            snprintf(what, sizeof what, "dp_logistic_grad_%s B=%d IN=%d", dtn(dt), B, IN);
            memcpy(dw, dw0, (size_t)IN * dts(dt));
            memcpy(db, db0, dts(dt));
            double loss = NAN;
            int64_t correct = -1;
            int rc = logistic_grad_t(dt, dw, db, &loss, &correct, x, w, b, lab, B, IN, gs);
            expect(rc == DP_OK, "%s: returned %d", what, rc);
            expect(fabs(loss - lref) <= ltol,
                   "%s: loss_sum %.12g expected %.12g (|err| %.3g > tol %.3g)", what, loss, lref,
                   fabs(loss - lref), ltol);
            expect(correct >= cref && correct <= cref + ambiguous,
                   "%s: correct %" PRId64 " expected %" PRId64 " (+ up to %" PRId64
                   " rows with z ~ 0)",
                   what, correct, cref, ambiguous);
            diff d = {0}, e = {0};
            for (int j = 0; j < IN; j++) {
                double s = tget(dt, dw0, j), m = fabs(s), t = 0;
                for (int r = 0; r < B; r++) {
                    double xv = tget(dt, x, r * IN + j);
                    s += g[r] * xv;
                    m += fabs(g[r] * xv);
                    t += gtol[r] * fabs(xv);
                }
                diff_add(&d, j, tget(dt, dw, j), s, t + (B + 8) * eps * m);
            }
            diff_add(&e, 0, tget(dt, db, 0), dbr, dbt + (B + 8) * eps * dbm);
            expect_diff(&d, 0, "%s dw (accumulated)", what);
            expect_diff(&e, 0, "%s db (accumulated)", what);
            lab[B - 1] = 2;
            rc = logistic_grad_t(dt, dw, db, &loss, &correct, x, w, b, lab, B, IN, gs);
            expect(rc == DP_ELABEL, "%s label=2: returned %d, expected DP_ELABEL", what, rc);
            free(x);
            free(w);
            free(b);
            free(dw0);
            free(db0);
            free(dw);
            free(db);
            free(lab);
            free(g);
            free(gtol);
        }
}

static void test_argmax_count(dtype dt)
{
    static const int Bs[] = {1, 7, 33}, Cs[] = {1, 2, 7, 33, 129};
    for (int bi = 0; bi < 3; bi++)
        for (int ci = 0; ci < 5; ci++) {
            int B = Bs[bi], C = Cs[ci];
            ptrdiff_t n = (ptrdiff_t)B * C;
            void *x = talloc(dt, n);
            int64_t *out = ialloc(B), *lab = ialloc(B), *ref = ialloc(B);
            /* small integers: ties everywhere; row 0 all equal; the first maximum wins */
            for (ptrdiff_t i = 0; i < n; i++) tset(dt, x, i, i < C ? -1 : randint(7) - 3);
            int64_t cref = 0;
            for (int i = 0; i < B; i++) {
                int best = 0;
                for (int j = 1; j < C; j++)
                    if (tget(dt, x, i * C + j) > tget(dt, x, i * C + best)) best = j;
                ref[i] = best;
                lab[i] = C == 1 ? randint(2) : randint(C);
                /* C == 1 is a binary logit: predicted 1 when z > 0 (z == 0 predicts 0) */
                int64_t pred = C == 1 ? tget(dt, x, i) > 0 : best;
                cref += pred == lab[i];
                out[i] = -7;
            }
            argmax_t(dt, out, x, B, C);
            diff d = {0};
            for (int i = 0; i < B; i++) diff_add(&d, i, (double)out[i], (double)ref[i], 0);
            expect_diff(&d, 0, "dp_argmax_%s B=%d C=%d", dtn(dt), B, C);
            int64_t got = count_correct_t(dt, x, lab, B, C);
            expect(got == cref, "dp_count_correct_%s B=%d C=%d: %" PRId64 " expected %" PRId64,
                   dtn(dt), B, C, got, cref);
            free(x);
            free(out);
            free(lab);
            free(ref);
        }
}

/* ---- dp_sync and dp_allreduce_slice: the shared-memory group's barrier and slice reduction, on
 * real threads */

#include <pthread.h>

#include "dp_allreduce.h"
#include "dp_sync.h"

typedef struct {
    dp_barrier *bar;
    float **bufs;
    int n, rank, rounds, len, failed;
} sync_arg;

static void *sync_worker(void *p)
{
    sync_arg *a = p;
    dp_wait_policy pol = {1e-4, 1e-3, 20.0, NULL, NULL, 0};
    uint32_t code;
    for (int round = 0; round < a->rounds; round++) {
        for (int i = 0; i < a->len; i++) a->bufs[a->rank][i] = (float)(a->rank + round + i % 7);
        ptrdiff_t lo, hi;
        dp_slice(0, a->len, a->rank, a->n, 4, &lo, &hi);
        if (dp_barrier_wait(a->bar, &pol, &code)) {
            a->failed = 1;
            return NULL;
        }
        dp_allreduce_slice_f32(a->bufs, a->n, lo, hi, 1.0f);
        if (dp_barrier_wait(a->bar, &pol, &code)) {
            a->failed = 1;
            return NULL;
        }
        for (int i = 0; i < a->len; i++) {
            float want = 0;
            for (int r = 0; r < a->n; r++) want += (float)(r + round + i % 7);
            if (a->bufs[a->rank][i] != want) {
                a->failed = 2;
                break;
            }
        }
        if (dp_barrier_wait(a->bar, &pol, &code)) {
            a->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

/* dp_ctx_default: each thread's own context, reused by its calls without one and freed when
 * the thread ends (LeakSanitizer, at the end of `make check`, reports one that is not). Four
 * threads at once, each a run of GEMMs of growing and shrinking sizes without a context (its
 * packing buffers grown and reused), checked against the naive GEMM; each thread's context
 * must be the same on every call and another than the other threads'. */
typedef struct {
    int seed, failed;
    dp_ctx *ctx;
} default_ctx_arg;

static void *default_ctx_worker(void *p)
{
    default_ctx_arg *a = p;
    static const int sz[] = {3, 150, 17, 400, 1, 64, 129};
    float *A = malloc(sizeof(float) * 400 * 400), *B = malloc(sizeof(float) * 400 * 400);
    float *C = malloc(sizeof(float) * 400 * 400), *R = malloc(sizeof(float) * 400 * 400);
    for (int i = 0; i < 400 * 400; i++) {
        A[i] = (float)((i * 7 + a->seed) % 13) - 6; /* small integers: exact sums */
        B[i] = (float)((i * 5 + 3 * a->seed) % 11) - 5;
    }
    a->ctx = dp_ctx_default();
    for (int round = 0; round < 3 && !a->failed; round++)
        for (int s = 0; s < 7 && !a->failed; s++) {
            int m = sz[s], n = sz[(s + 2 + a->seed) % 7], k = sz[(s + 4 + round) % 7];
            if (dp_gemm_f32(NULL, C, n, A, k, 1, B, n, 1, m, n, k, 1.0f, 0.0f) != DP_OK)
                a->failed = 1;
            dp_gemm_naive_f32(R, n, A, k, 1, B, n, 1, m, n, k, 1.0f, 0.0f);
            if (memcmp(C, R, sizeof(float) * (size_t)m * (size_t)n)) a->failed = 2;
            if (dp_ctx_default() != a->ctx) a->failed = 3;
        }
    free(A);
    free(B);
    free(C);
    free(R);
    return NULL;
}

static void test_default_ctx(void)
{
    pthread_t th[4];
    default_ctx_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (default_ctx_arg){t, 0, NULL};
        pthread_create(&th[t], NULL, default_ctx_worker, &args[t]);
    }
    int bad = 0;
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        bad |= args[t].failed;
    }
    expect(!bad, "dp_gemm_f32 without a context from 4 threads: failure %d", bad);
    int distinct = 1;
    for (int t = 0; t < 4; t++)
        for (int u = 0; u < t; u++) distinct &= args[t].ctx && args[t].ctx != args[u].ctx;
    expect(distinct, "dp_ctx_default: threads shared a context (or had none)");
    dp_ctx *mine = dp_ctx_default();
    expect(mine && mine == dp_ctx_default() && mine->threads == 1 && !mine->bf16_inputs,
           "dp_ctx_default: the main thread's context is not one reusable single-thread context");
}

static void test_sync(void)
{
    for (int n = 1; n <= 4; n++) {
        int len = 1000 + 37 * n;
        dp_barrier *bar = dp_aligned_alloc(sizeof *bar);
        float *bufs[4];
        pthread_t th[4];
        sync_arg args[4];
        dp_barrier_init(bar, n);
        for (int r = 0; r < n; r++) bufs[r] = malloc(sizeof(float) * (size_t)len);
        for (int r = 0; r < n; r++) {
            args[r] = (sync_arg){bar, bufs, n, r, 200, len, 0};
            pthread_create(&th[r], NULL, sync_worker, &args[r]);
        }
        int bad = 0;
        for (int r = 0; r < n; r++) {
            pthread_join(th[r], NULL);
            bad |= args[r].failed;
        }
        expect(!bad, "dp_allreduce_slice_f32 / dp_barrier_wait n=%d: worker failure %d", n, bad);
        /* an abort wakes a waiter with the code; a timed-out wait aborts the group */
        uint32_t code = 0;
        dp_wait_policy quick = {1e-5, 1e-5, 0.05, NULL, NULL, 0};
        if (n > 1) {
            int rc = dp_barrier_wait(bar, &quick, &code);
            expect(rc == DP_ETIMEOUT, "dp_barrier_wait alone of %d: returned %d, expected timeout",
                   n, rc);
            rc = dp_barrier_wait(bar, &quick, &code);
            expect(rc == DP_EABORT && code == DP_TIMEOUT_ABORT_CODE,
                   "dp_barrier_wait after a timeout: returned %d code %u, expected abort", rc,
                   code);
        }
        for (int r = 0; r < n; r++) free(bufs[r]);
        dp_aligned_free(bar);
    }
}

/* ---- dp_allreduce: the whole collective of one worker (native, ring, tree), on
 * pthreads, for group sizes 1 to 8 (powers of two and not: the tree folds), both dtypes, the
 * full range, a sub-range and an empty one, and native's parameter-server form (k buffers
 * summed into one shared out). Values are small integers, so every association of the sum
 * is exact and each result is compared with == against the sum written here. */

#define GROUP_ROUNDS 6

typedef struct {
    dp_group g;
    dtype dt;
    int len, failed; /* failed: the first wrong check, 0 when none */
    ptrdiff_t bad_at;
    int bad_round;
} group_arg;

/* The value worker r puts at element i in round `round`. */
static double group_value(int r, int round, int i) { return (double)(r + 2 * round + i % 5 - 2); }

/* Worker: fill its buffer (every buffer, when it has an out), all-reduce a range, check. */
static void *group_worker(void *p)
{
    group_arg *a = p;
    dp_group *g = &a->g;
    const ptrdiff_t ranges[3][2] = {{0, a->len}, {3, a->len - 5}, {7, 7}};
    for (int round = 0; round < GROUP_ROUNDS && !a->failed; round++) {
        ptrdiff_t start = ranges[round % 3][0], stop = ranges[round % 3][1];
        double scale = round % 2 ? 0.5 : 1.0, waited = -1;
        uint32_t code = 0;
        /* with out, worker r fills buffer r (k == n here); the out is shared by all */
        for (int i = 0; i < a->len; i++)
            tset(a->dt, g->bufs[g->rank], i, group_value(g->rank, round, i));
        if (g->out && g->rank == 0) tconst(a->dt, g->out, a->len, -99);
        /* nobody may read a buffer (or find the out unset) before every worker has set its own */
        if (dp_group_barrier(g, &waited, &code)) {
            a->failed = 1;
            return NULL;
        }
        int rc = a->dt == F32 ? dp_allreduce_f32(g, start, stop, (float)scale, &waited, &code)
                              : dp_allreduce_f64(g, start, stop, scale, &waited, &code);
        if (rc || !(waited >= 0)) {
            a->failed = 2;
            a->bad_round = round;
            return NULL;
        }
        const void *res = g->out ? g->out : g->bufs[g->rank];
        for (int i = 0; i < a->len && !a->failed; i++) {
            double want;
            if (i < start || i >= stop) {
                want = g->out ? -99 : group_value(g->rank, round, i); /* untouched */
            } else {
                want = 0;
                for (int r = 0; r < g->k; r++) want += group_value(r, round, i);
                want *= scale;
            }
            if (tget(a->dt, res, i) != want) {
                a->failed = 3;
                a->bad_at = i;
                a->bad_round = round;
            }
        }
        /* with out, the buffers are inputs only */
        for (int i = 0; g->out && i < a->len && !a->failed; i++)
            if (tget(a->dt, g->bufs[g->rank], i) != group_value(g->rank, round, i)) {
                a->failed = 4;
                a->bad_at = i;
                a->bad_round = round;
            }
        /* the next round refills the buffers that others may still be reading */
        if (dp_group_barrier(g, &waited, &code)) {
            a->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

static void group_case(dtype dt, int algorithm, int n, int with_out)
{
    int len = 517 + 64 * n; /* odd, and more than one cache line per worker */
    size_t ctl = dp_group_control_bytes(n);
    dp_barrier *bar = dp_aligned_alloc(ctl);
    memset(bar, 0, ctl);
    dp_barrier_init(bar, n);
    uint32_t *arrivals = dp_group_arrivals(bar, ctl, n);
    void *bufs[8], *out = with_out ? talloc(dt, len) : NULL;
    pthread_t th[8];
    group_arg args[8];
    for (int r = 0; r < n; r++) bufs[r] = talloc(dt, len);
    for (int r = 0; r < n; r++) {
        dp_group g = {bar,
                      arrivals,
                      {1e-4, 1e-3, 20.0, NULL, arrivals, r},
                      n,
                      r,
                      n,
                      algorithm,
                      bufs,
                      out,
                      algorithm == DP_ALLREDUCE_TREE ? talloc(dt, len) : NULL};
        args[r] = (group_arg){g, dt, len, 0, 0, 0};
        pthread_create(&th[r], NULL, group_worker, &args[r]);
    }
    int bad = 0, who = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (args[r].failed && !bad) {
            bad = args[r].failed;
            who = r;
        }
    }
    static const char *const what[] = {"", "a barrier failed", "the call failed", "wrong result",
                                       "an input buffer was modified"};
    expect(!bad, "dp_allreduce_%s %s n=%d%s: rank %d round %d: %s (element %td)", dtn(dt),
           dp_allreduce_name(algorithm), n, with_out ? " with out" : "", who, args[who].bad_round,
           what[bad], args[who].bad_at);
    /* ring and tree leave identical bits in every buffer (checked above against one sum);
     * every worker arrived as often as every other */
    int missing[8];
    expect(dp_group_missing(arrivals, n, 0, missing, 8) == 0 &&
               (n == 1 || arrivals[0] == arrivals[n - 1]),
           "dp_allreduce_%s %s n=%d: arrival counters differ after the run", dtn(dt),
           dp_allreduce_name(algorithm), n);
    for (int r = 0; r < n; r++) {
        free(bufs[r]);
        free(args[r].g.scratch);
    }
    free(out);
    dp_aligned_free(bar);
}

static void test_group_allreduce(void)
{
    static const int sizes[] = {1, 2, 3, 4, 5, 8};
    for (int t = 0; t < 2; t++)
        for (int alg = 0; alg < DP_ALLREDUCE_COUNT; alg++)
            for (int s = 0; s < 6; s++) group_case(t ? F64 : F32, alg, sizes[s], 0);
    for (int s = 0; s < 6; s++) group_case(F32, DP_ALLREDUCE_NATIVE, sizes[s], 1);
    group_case(F64, DP_ALLREDUCE_NATIVE, 3, 1);

    expect(strcmp(dp_allreduce_name(DP_ALLREDUCE_NATIVE), "native") == 0 &&
               strcmp(dp_allreduce_name(DP_ALLREDUCE_RING), "ring") == 0 &&
               strcmp(dp_allreduce_name(DP_ALLREDUCE_TREE), "tree") == 0 &&
               dp_allreduce_name(DP_ALLREDUCE_COUNT) == NULL && dp_allreduce_name(-1) == NULL,
           "dp_allreduce_name: native, ring, tree, then NULL");

    /* a handle that breaks the rules: DP_EVALUE, before any wait (a wait would time out) */
    dp_barrier *bar = dp_aligned_alloc(sizeof *bar);
    dp_barrier_init(bar, 2);
    float b0[8] = {0}, b1[8] = {0}, o[8] = {0};
    void *bufs[2] = {b0, b1};
    double waited;
    uint32_t code = 0;
    dp_group ring_out = {
        bar, NULL, {1e-5, 1e-5, 0.05, NULL, NULL, 0}, 2, 0, 2, DP_ALLREDUCE_RING, bufs, o, NULL};
    dp_group tree_noscratch = {
        bar, NULL, {1e-5, 1e-5, 0.05, NULL, NULL, 0}, 2, 0, 2, DP_ALLREDUCE_TREE, bufs, NULL, NULL};
    dp_group native_short = {
        bar,  NULL, {1e-5, 1e-5, 0.05, NULL, NULL, 0}, 2, 0, 1, DP_ALLREDUCE_NATIVE, bufs,
        NULL, NULL};
    dp_group bad_rank = {
        bar,  NULL, {1e-5, 1e-5, 0.05, NULL, NULL, 0}, 2, 2, 2, DP_ALLREDUCE_NATIVE, bufs,
        NULL, NULL};
    expect(dp_allreduce_f32(&ring_out, 0, 8, 1, &waited, &code) == DP_EVALUE &&
               dp_allreduce_f32(&tree_noscratch, 0, 8, 1, &waited, &code) == DP_EVALUE &&
               dp_allreduce_f32(&native_short, 0, 8, 1, &waited, &code) == DP_EVALUE &&
               dp_allreduce_f32(&bad_rank, 0, 8, 1, &waited, &code) == DP_EVALUE &&
               dp_allreduce_f32(&ring_out, 5, 4, 1, &waited, &code) == DP_EVALUE,
           "dp_allreduce_f32 with ring + out, tree without scratch, k != n without out, "
           "rank n, start > stop: expected DP_EVALUE");
    /* alone in a group of two: the entry barrier times out, the group is aborted, and the
     * next call (of anyone) fails at once with the timeout's abort code */
    dp_group alone = {
        bar,  NULL, {1e-5, 1e-5, 0.05, NULL, NULL, 0}, 2, 0, 2, DP_ALLREDUCE_NATIVE, bufs,
        NULL, NULL};
    int rc = dp_allreduce_f32(&alone, 0, 8, 1, &waited, &code);
    expect(rc == DP_ETIMEOUT && waited >= 0.05,
           "dp_allreduce_f32 alone of 2: returned %d after "
           "%.3f s, expected a timeout after >= 0.05 s",
           rc, waited);
    code = 0;
    alone.rank = 1;
    rc = dp_allreduce_f64(&alone, 0, 8, 1, &waited, &code);
    expect(rc == DP_EABORT && code == DP_TIMEOUT_ABORT_CODE,
           "dp_allreduce_f64 after a "
           "timeout: returned %d code %u, expected the abort",
           rc, code);
    dp_aligned_free(bar);
}

/* ---- convolution and pooling ------------------------------------------------------------- */

static int conv_fwd_t(dtype dt, dp_ctx *ctx, dp_scratch *s, void *y, const void *x, const void *w,
                      const void *b, int B, const dp_conv_geom *g)
{
    return dt == F32 ? dp_conv2d_forward_f32(ctx, s, y, x, w, b, B, g)
                     : dp_conv2d_forward_f64(ctx, s, y, x, w, b, B, g);
}

static int conv_bwd_t(dtype dt, dp_ctx *ctx, dp_scratch *s, void *dw, void *db, void *dx,
                      const void *dy, const void *x, const void *w, int B, const dp_conv_geom *g)
{
    return dt == F32 ? dp_conv2d_backward_f32(ctx, s, dw, db, dx, dy, x, w, B, g)
                     : dp_conv2d_backward_f64(ctx, s, dw, db, dx, dy, x, w, B, g);
}

/* The convolution against a double loop written here (sums of |terms| give the tolerance),
 * through the batch kernels (GEMM) and the naive twins, with dw/db prefilled (they accumulate)
 * and dx prefilled with NaN (it is written). Buffers are malloc'ed to their exact size, so
 * AddressSanitizer sees any read or write past them. */
static void conv_case_s(dtype dt, int B, int C, int H, int W, int OC, int KH, int KW, int pad,
                        int st, dp_ctx *ctx, const char *cname)
{
    dp_conv_geom g = {C, H, W, OC, KH, KW, pad, st};
    int OH, OW;
    if (!expect(dp_conv_out(&g, &OH, &OW) == DP_OK, "dp_conv_out %dx%dx%d k%dx%d p%d", C, H, W, KH,
                KW, pad))
        return;
    ptrdiff_t nx = (ptrdiff_t)B * C * H * W, nw = (ptrdiff_t)OC * C * KH * KW;
    ptrdiff_t ny = (ptrdiff_t)B * OC * OH * OW;
    void *x = talloc(dt, nx), *w = talloc(dt, nw), *b = talloc(dt, OC), *dy = talloc(dt, ny);
    void *y = talloc(dt, ny), *dw = talloc(dt, nw), *db = talloc(dt, OC), *dx = talloc(dt, nx);
    void *dw0 = talloc(dt, nw), *db0 = talloc(dt, OC);
    double *ry = dalloc(ny), *my = dalloc(ny), *rdw = dalloc(nw), *mdw = dalloc(nw);
    double *rdx = dalloc(nx), *mdx = dalloc(nx), rdb[64], mdb[64];
    tfill(dt, x, nx, -1, 1);
    tfill(dt, w, nw, -1, 1);
    tfill(dt, b, OC, -1, 1);
    tfill(dt, dy, ny, -1, 1);
    tfill(dt, dw0, nw, -1, 1);
    tfill(dt, db0, OC, -1, 1);
    for (ptrdiff_t i = 0; i < ny; i++)
        ry[i] = tget(dt, b, (i / ((ptrdiff_t)OH * OW)) % OC), my[i] = fabs(ry[i]);
    for (ptrdiff_t i = 0; i < nw; i++) rdw[i] = tget(dt, dw0, i), mdw[i] = fabs(rdw[i]);
    for (ptrdiff_t i = 0; i < nx; i++) rdx[i] = mdx[i] = 0;
    for (int o = 0; o < OC; o++) rdb[o] = tget(dt, db0, o), mdb[o] = fabs(rdb[o]);
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    ptrdiff_t yi = (((ptrdiff_t)n * OC + o) * OH + i) * OW + j;
                    double d = tget(dt, dy, yi);
                    rdb[o] += d;
                    mdb[o] += fabs(d);
                    for (int c = 0; c < C; c++)
                        for (int u = 0; u < KH; u++)
                            for (int v = 0; v < KW; v++) {
                                int h = i * st + u - pad, q = j * st + v - pad;
                                if (h < 0 || h >= H || q < 0 || q >= W) continue;
                                ptrdiff_t wi = (((ptrdiff_t)o * C + c) * KH + u) * KW + v;
                                ptrdiff_t xi = (((ptrdiff_t)n * C + c) * H + h) * W + q;
                                double xv = tget(dt, x, xi), wv = tget(dt, w, wi);
                                ry[yi] += wv * xv, my[yi] += fabs(wv * xv);
                                rdw[wi] += d * xv, mdw[wi] += fabs(d * xv);
                                rdx[xi] += d * wv, mdx[xi] += fabs(d * wv);
                            }
                }
    const double eps = deps(dt);
    int Kn = C * KH * KW, Pn = B * OH * OW;
    for (int naive = 0; naive < 2; naive++) {
        const char *kn = naive ? "naive" : "gemm";
        dp_scratch s = {0};
        tconst(dt, y, ny, NAN);
        int rc = DP_OK;
        if (naive) {
            if (dt == F32)
                dp_conv2d_forward_naive_f32(y, x, w, b, B, &g);
            else
                dp_conv2d_forward_naive_f64(y, x, w, b, B, &g);
        } else {
            rc = conv_fwd_t(dt, ctx, &s, y, x, w, b, B, &g);
        }
        expect(rc == DP_OK, "dp_conv2d_forward_%s[%s] %s: returned %d", dtn(dt), kn, cname, rc);
        diff d = {0};
        for (ptrdiff_t i = 0; i < ny; i++)
            diff_add(&d, i, tget(dt, y, i), ry[i], (Kn + 4) * eps * my[i]);
        expect_diff(&d, 0, "dp_conv2d_forward_%s[%s] %s B=%d C=%d %dx%d OC=%d k%dx%d p%d ctx=%s y",
                    dtn(dt), kn, cname, B, C, H, W, OC, KH, KW, pad, cname);
        memcpy(dw, dw0, dts(dt) * (size_t)nw);
        memcpy(db, db0, dts(dt) * (size_t)OC);
        tconst(dt, dx, nx, NAN);
        if (naive) {
            if (dt == F32)
                dp_conv2d_backward_naive_f32(dw, db, dx, dy, x, w, B, &g);
            else
                dp_conv2d_backward_naive_f64(dw, db, dx, dy, x, w, B, &g);
        } else {
            rc = conv_bwd_t(dt, ctx, &s, dw, db, dx, dy, x, w, B, &g);
        }
        expect(rc == DP_OK, "dp_conv2d_backward_%s[%s] %s: returned %d", dtn(dt), kn, cname, rc);
        diff ddw = {0}, ddb = {0}, ddx = {0};
        for (ptrdiff_t i = 0; i < nw; i++)
            diff_add(&ddw, i, tget(dt, dw, i), rdw[i], (Pn + 4) * eps * mdw[i]);
        for (int o = 0; o < OC; o++)
            diff_add(&ddb, o, tget(dt, db, o), rdb[o], (Pn + 4) * eps * mdb[o]);
        for (ptrdiff_t i = 0; i < nx; i++)
            diff_add(&ddx, i, tget(dt, dx, i), rdx[i], (OC * KH * KW + 4) * eps * mdx[i] + 1e-300);
        expect_diff(&ddw, 0, "dp_conv2d_backward_%s[%s] %s B=%d C=%d %dx%d OC=%d k%dx%d p%d dw",
                    dtn(dt), kn, cname, B, C, H, W, OC, KH, KW, pad);
        expect_diff(&ddb, 0, "dp_conv2d_backward_%s[%s] %s OC=%d db", dtn(dt), kn, cname, OC);
        expect_diff(&ddx, 0, "dp_conv2d_backward_%s[%s] %s B=%d C=%d %dx%d k%dx%d p%d dx", dtn(dt),
                    kn, cname, B, C, H, W, KH, KW, pad);
        dp_scratch_free(&s);
    }
    free(x);
    free(w);
    free(b);
    free(dy);
    free(y);
    free(dw);
    free(db);
    free(dx);
    free(dw0);
    free(db0);
    free(ry);
    free(my);
    free(rdw);
    free(mdw);
    free(rdx);
    free(mdx);
}

/* dp_conv_direct_forward (one image, no im2col) against the im2col path it stands in for:
 * im2col, then the GEMM, with beta 0 (the model's call) and beta 1 (the batch call's, onto the
 * bias); the same bits where the GEMM is blocked (OC >= 2; a single filter takes its
 * matrix-vector path, which sums in another order: within the summation bound there). Widths
 * around one and two vectors of every build, odd and even counts of vectors (the overlapping
 * last one), filter counts that leave every remainder of the tiles, patches up to 64 and past
 * it. x, w and y are allocated to the byte, so a read or write outside them trips ASan. */
static void test_conv_direct(dtype dt)
{
    static const int shapes[][6] = {
        /* C, H, W, OC, KH, KW (pad 0; B = 1) */
        {3, 32, 32, 32, 3, 3}, {1, 7, 7, 1, 3, 3},   {3, 9, 10, 5, 3, 3},  {2, 6, 18, 13, 3, 3},
        {3, 5, 19, 7, 3, 3},   {1, 4, 34, 2, 3, 3},  {4, 8, 35, 30, 3, 3}, {7, 5, 40, 3, 3, 3},
        {16, 4, 20, 6, 2, 2},  {2, 5, 24, 25, 1, 5}, {1, 9, 9, 4, 5, 5},   {3, 12, 21, 16, 4, 4},
        {65, 4, 20, 3, 1, 1},  {3, 6, 3, 4, 3, 3},
    };
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        const int *sh = shapes[i];
        dp_conv_geom g = {sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], 0, 1};
        int OH, OW, Kd = sh[0] * sh[4] * sh[5];
        if (!expect(dp_conv_out(&g, &OH, &OW) == DP_OK, "conv direct: geometry %d", i)) continue;
        ptrdiff_t P = (ptrdiff_t)OH * OW, nx = (ptrdiff_t)g.C * g.H * g.W, ny = g.OC * P;
        void *x = talloc(dt, nx), *w = talloc(dt, (ptrdiff_t)g.OC * Kd), *y0 = talloc(dt, ny);
        void *y = talloc(dt, ny), *want = talloc(dt, ny);
        void *col = talloc(dt, (ptrdiff_t)dp_conv_col_elems(&g));
        double *ref = dalloc(ny), *mag = dalloc(ny);
        tfill(dt, x, nx, -1, 1);
        tfill(dt, w, (ptrdiff_t)g.OC * Kd, -1, 1);
        tfill(dt, y0, ny, -1, 1);
        int isa = dp_isa_active();
        int vl = (isa == DP_ISA_AVX512 ? 64
                  : isa == DP_ISA_AVX2 ? 32
                                       : dp_conv_generic_vec_bytes()) /
                 (int)dts(dt);
        int fits = dt == F32 && vl >= 8 && OW >= vl && Kd <= 64; /* float, 32 bytes and up */
        for (int beta = 0; beta < 2; beta++) {
            for (int o = 0; o < g.OC; o++)
                for (ptrdiff_t p = 0; p < P; p++) {
                    double s = beta ? tget(dt, y0, o * P + p) : 0, m = fabs(s);
                    for (int k = 0; k < Kd; k++) {
                        int c = k / (g.KH * g.KW), u = k / g.KW % g.KH, v = k % g.KW;
                        ptrdiff_t xi = ((ptrdiff_t)c * g.H + p / OW + u) * g.W + p % OW + v;
                        double t = tget(dt, w, (ptrdiff_t)o * Kd + k) * tget(dt, x, xi);
                        s += t, m += fabs(t);
                    }
                    ref[o * P + p] = s, mag[o * P + p] = m;
                }
            memcpy(want, y0, dts(dt) * (size_t)ny);
            int rc;
            if (dt == F32) {
                dp_im2col_f32(col, P, x, &g, OH, OW);
                rc = dp_gemm_f32(&ctx1, want, P, w, Kd, 1, col, P, 1, g.OC, (int)P, Kd, 1,
                                 (float)beta);
            } else {
                dp_im2col_f64(col, P, x, &g, OH, OW);
                rc = dp_gemm_f64(&ctx1, want, P, w, Kd, 1, col, P, 1, g.OC, (int)P, Kd, 1, beta);
            }
            memcpy(y, y0, dts(dt) * (size_t)ny);
            int got = dt == F32 ? dp_conv_direct_forward_f32(y, x, w, &g, OH, OW, (float)beta)
                                : dp_conv_direct_forward_f64(y, x, w, &g, OH, OW, beta);
            expect(rc == DP_OK && got == !fits,
                   "conv direct %s isa %s geometry %d beta %d: "
                   "returned %d (gemm %d), expected %d",
                   dtn(dt), dp_isa_name(dp_isa_active()), i, beta, got, rc, !fits);
            diff d = {0};
            for (ptrdiff_t q = 0; q < ny; q++) {
                if (!fits)
                    diff_add(&d, q, tget(dt, y, q), tget(dt, y0, q), 0); /* untouched */
                else if (g.OC >= 2)
                    diff_add(&d, q, tget(dt, y, q), tget(dt, want, q), 0); /* the same bits */
                else
                    diff_add(&d, q, tget(dt, y, q), ref[q], (Kd + 4) * deps(dt) * mag[q]);
            }
            expect_diff(&d, 0, "conv direct %s isa %s C=%d %dx%d OC=%d k%dx%d beta %d: %s", dtn(dt),
                        dp_isa_name(dp_isa_active()), g.C, g.H, g.W, g.OC, g.KH, g.KW, beta,
                        !fits       ? "y changed where it does not apply"
                        : g.OC >= 2 ? "bits differ from im2col + GEMM"
                                    : "y");
        }
        /* the weight gradient, dwt (K, OC) += col(x) dy^T (64-byte vectors): within the bound of
         * a sum of P products (it sums in another order than the GEMM), dwt untouched where it
         * does not apply */
        int fits_dw = fits && vl * (int)dts(dt) == 64;
        void *dy = talloc(dt, ny), *dwt0 = talloc(dt, (ptrdiff_t)Kd * g.OC);
        void *dwt = talloc(dt, (ptrdiff_t)Kd * g.OC);
        double *rw = dalloc((ptrdiff_t)Kd * g.OC), *mw = dalloc((ptrdiff_t)Kd * g.OC);
        tfill(dt, dy, ny, -1, 1);
        tfill(dt, dwt0, (ptrdiff_t)Kd * g.OC, -1, 1);
        for (int k = 0; k < Kd; k++)
            for (int o = 0; o < g.OC; o++) {
                int c = k / (g.KH * g.KW), u = k / g.KW % g.KH, v = k % g.KW;
                double s = tget(dt, dwt0, (ptrdiff_t)k * g.OC + o), m = fabs(s);
                for (ptrdiff_t p = 0; p < P; p++) {
                    ptrdiff_t xi = ((ptrdiff_t)c * g.H + p / OW + u) * g.W + p % OW + v;
                    double t = tget(dt, dy, o * P + p) * tget(dt, x, xi);
                    s += t, m += fabs(t);
                }
                rw[k * g.OC + o] = s, mw[k * g.OC + o] = m;
            }
        memcpy(dwt, dwt0, dts(dt) * (size_t)Kd * g.OC);
        int got = dt == F32 ? dp_conv_direct_dwt_f32(dwt, dy, x, &g, OH, OW)
                            : dp_conv_direct_dwt_f64(dwt, dy, x, &g, OH, OW);
        expect(got == !fits_dw, "conv direct dwt %s isa %s geometry %d: returned %d, expected %d",
               dtn(dt), dp_isa_name(isa), i, got, !fits_dw);
        diff dd = {0};
        for (ptrdiff_t q = 0; q < (ptrdiff_t)Kd * g.OC; q++)
            diff_add(&dd, q, tget(dt, dwt, q), fits_dw ? rw[q] : tget(dt, dwt0, q),
                     fits_dw ? (P + 4) * deps(dt) * mw[q] : 0);
        expect_diff(&dd, 0, "conv direct dwt %s isa %s C=%d %dx%d OC=%d k%dx%d: %s", dtn(dt),
                    dp_isa_name(isa), g.C, g.H, g.W, g.OC, g.KH, g.KW,
                    fits_dw ? "dwt" : "dwt changed where it does not apply");
        free(dy);
        free(dwt0);
        free(dwt);
        free(rw);
        free(mw);
        free(x);
        free(w);
        free(y0);
        free(y);
        free(want);
        free(col);
        free(ref);
        free(mag);
    }
}

/* dp_gemm_patch, the weight gradient's GEMM reading col(x) in place, against im2col + dp_gemm
 * on one thread: the same bits, over output blocks narrower and shorter than the output, K
 * (positions) past one KC slice, M (patch entries) past one MC block and not a multiple of MR,
 * N (filters) from 2 to several NR panels, beta 0 and 1 (N = 1 is dp_gemm's matrix-vector
 * path, another order of sums, which dp_conv_image_backward keeps for one filter). */
static void test_gemm_patch(dtype dt)
{
    static const int shapes[][8] = {
        /* C, H, W, OC, KH, KW, oh, ow (the output block) */
        {32, 15, 15, 64, 3, 3, 12, 12}, {3, 32, 32, 32, 3, 3, 30, 30},  {1, 7, 7, 2, 3, 3, 5, 5},
        {16, 9, 11, 5, 3, 3, 7, 9},     {2, 24, 24, 70, 5, 5, 20, 19},  {4, 6, 40, 33, 2, 3, 5, 3},
        {1, 1, 1, 3, 1, 1, 1, 1},       {15, 10, 10, 17, 1, 1, 10, 10}, {3, 8, 30, 12, 4, 1, 5, 30},
    };
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        const int *sh = shapes[i];
        dp_conv_geom g = {sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], 0, 1};
        int oh = sh[6], ow = sh[7], Kd = g.C * g.KH * g.KW, P = oh * ow;
        ptrdiff_t nx = (ptrdiff_t)g.C * g.H * g.W, nc = (ptrdiff_t)Kd * g.OC;
        void *x = talloc(dt, nx), *dy = talloc(dt, (ptrdiff_t)g.OC * P), *c0 = talloc(dt, nc);
        void *want = talloc(dt, nc), *got = talloc(dt, nc);
        void *col = talloc(dt, (ptrdiff_t)dp_conv_col_elems(&g));
        ptrdiff_t *aoff = malloc(sizeof(ptrdiff_t) * (size_t)Kd);
        ptrdiff_t *koff = malloc(sizeof(ptrdiff_t) * (size_t)P);
        for (int p = 0; p < P; p++) koff[p] = (ptrdiff_t)(p / ow) * g.W + p % ow;
        tfill(dt, x, nx, -1, 1);
        tfill(dt, dy, (ptrdiff_t)g.OC * P, -1, 1);
        tfill(dt, c0, nc, -1, 1);
        for (int k = 0; k < Kd; k++)
            aoff[k] = ((ptrdiff_t)(k / (g.KH * g.KW)) * g.H + k / g.KW % g.KH) * g.W + k % g.KW;
        for (int beta = 0; beta < 2; beta++) {
            int rw, rg;
            memcpy(want, c0, dts(dt) * (size_t)nc);
            memcpy(got, c0, dts(dt) * (size_t)nc);
            if (dt == F32) {
                dp_im2col_f32(col, P, x, &g, oh, ow);
                rw = dp_gemm_f32(&ctx1, want, g.OC, col, P, 1, dy, 1, P, Kd, g.OC, P, 1,
                                 (float)beta);
                rg = dp_gemm_patch_f32(&ctx1, got, g.OC, x, aoff, koff, dy, 1, P, Kd, g.OC, P, 1,
                                       (float)beta);
            } else {
                dp_im2col_f64(col, P, x, &g, oh, ow);
                rw = dp_gemm_f64(&ctx1, want, g.OC, col, P, 1, dy, 1, P, Kd, g.OC, P, 1, beta);
                rg = dp_gemm_patch_f64(&ctx1, got, g.OC, x, aoff, koff, dy, 1, P, Kd, g.OC, P, 1,
                                       beta);
            }
            expect(rw == DP_OK && rg == DP_OK, "dp_gemm_patch %s: returned %d (dp_gemm %d)",
                   dtn(dt), rg, rw);
            diff d = {0};
            for (ptrdiff_t q = 0; q < nc; q++)
                diff_add(&d, q, tget(dt, got, q), tget(dt, want, q), 0);
            expect_diff(&d, 0,
                        "dp_gemm_patch %s isa %s C=%d %dx%d OC=%d k%dx%d block %dx%d beta "
                        "%d: bits differ from im2col + dp_gemm",
                        dtn(dt), dp_isa_name(dp_isa_active()), g.C, g.H, g.W, g.OC, g.KH, g.KW, oh,
                        ow, beta);
        }
        /* and through dp_conv_image_backward (its tables in col's space): one thread takes
         * dp_gemm_patch, three take im2col + dp_gemm (each sum on one thread: the same bits) */
        memcpy(want, c0, dts(dt) * (size_t)nc);
        memcpy(got, c0, dts(dt) * (size_t)nc);
        int r1 =
            dt == F32
                ? dp_conv_image_backward_f32(&ctx1, col, got, NULL, dy, x, NULL, NULL, &g, oh, ow)
                : dp_conv_image_backward_f64(&ctx1, col, got, NULL, dy, x, NULL, NULL, &g, oh, ow);
        int r3 =
            dt == F32
                ? dp_conv_image_backward_f32(&ctx3, col, want, NULL, dy, x, NULL, NULL, &g, oh, ow)
                : dp_conv_image_backward_f64(&ctx3, col, want, NULL, dy, x, NULL, NULL, &g, oh, ow);
        diff d = {0};
        for (ptrdiff_t q = 0; q < nc; q++) diff_add(&d, q, tget(dt, got, q), tget(dt, want, q), 0);
        expect(r1 == DP_OK && r3 == DP_OK, "conv image backward %s: returned %d and %d", dtn(dt),
               r1, r3);
        expect_diff(&d, 0,
                    "conv image backward %s isa %s C=%d %dx%d OC=%d k%dx%d block %dx%d: "
                    "dwt on 1 thread differs from 3",
                    dtn(dt), dp_isa_name(dp_isa_active()), g.C, g.H, g.W, g.OC, g.KH, g.KW, oh, ow);
        free(x);
        free(dy);
        free(c0);
        free(want);
        free(got);
        free(col);
        free(aoff);
        free(koff);
    }
}

static void test_conv(dtype dt)
{
    int entry_isa = dp_isa_active();
    test_conv_direct(dt);
    test_gemm_patch(dt);
    static const int shapes[][9] = {
        /* B, C, H, W, OC, KH, KW, pad, stride */
        {1, 1, 1, 1, 1, 1, 1, 0, 1},
        {3, 1, 7, 7, 1, 3, 3, 0, 1},
        {1, 3, 7, 3, 7, 3, 3, 1, 1},
        {7, 3, 3, 7, 3, 1, 3, 0, 1},
        {3, 7, 7, 7, 3, 3, 1, 1, 1},
        {1, 3, 7, 7, 3, 7, 7, 0, 1},
        {2, 2, 5, 6, 3, 2, 3, 2, 1},
        {2, 3, 9, 33, 5, 3, 3, 1, 1},
        {1, 1, 1, 1, 2, 5, 5, 2, 1},
        {1, 2, 20, 5, 2, 17, 2, 1, 1},
        /* no padding, rows narrower than a vector (dp_im2col's permutes on 64-byte vectors):
         * conv2's 12-value rows (3 patterns for float, 3 for double), 13-value rows (13
         * patterns each), both ending in the image's last values (the copy loop's tail) */
        {2, 3, 14, 14, 2, 3, 3, 0, 1},
        {1, 4, 15, 15, 3, 3, 3, 0, 1},
        /* strides (im2col and col2im one value at a time; the direct, in-place and patch
         * paths declined or strided): odd maps, padding, a 1x1 projection, a stride past the
         * kernel */
        {2, 3, 9, 9, 4, 3, 3, 1, 2},
        {1, 2, 8, 7, 3, 1, 1, 0, 2},
        {2, 3, 11, 10, 2, 3, 3, 0, 3},
        {1, 4, 16, 16, 8, 3, 3, 1, 2},
        {1, 1, 7, 9, 2, 2, 2, 0, 4},
        /* the plane path (float, 32- and 64-byte vectors): ResNet's 3x3 layers (16 maps of
         * 32 x 32, stride 1 and 2; 64 maps of 8 x 8, rows narrower than a vector, Winograd's
         * forward and input gradient), filter and
         * channel counts off the multiple of 8, odd maps wide enough for stride 2's vector
         * permutes, a 5x5 kernel with padding 2, padding past a 2x2 kernel's reach */
        {1, 16, 32, 32, 16, 3, 3, 1, 1},
        {1, 16, 32, 32, 32, 3, 3, 1, 2},
        {2, 32, 8, 8, 64, 3, 3, 1, 1},
        {1, 33, 10, 14, 40, 3, 3, 1, 1}, /* Winograd: tile rows of 7, counts off 8 */
        {1, 8, 6, 4, 36, 3, 3, 1, 1},    /* Winograd's input gradient alone */
        {1, 32, 4, 34, 33, 3, 3, 1, 1},  /* Winograd: tile rows of 17 (whole-vector stores) */
        {1, 16, 12, 16, 20, 3, 3, 1, 1}, /* Winograd: tile rows of 8, half a 16-lane vector */
        {1, 16, 16, 16, 8, 3, 3, 1, 1},  /* Winograd at 24 channels in all: 72-tile passes */
        {1, 8, 16, 16, 16, 3, 3, 1, 1},  /* the same for the input gradient alone */
        {2, 5, 35, 34, 13, 3, 3, 1, 2},
        {1, 3, 20, 21, 9, 5, 5, 2, 1},
        {1, 2, 6, 7, 3, 2, 2, 3, 1},
    };
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        const int *s = shapes[i];
        for (int c = 0; c < 3; c++)
            conv_case_s(dt, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], ctxs[c].ctx,
                        ctxs[c].name);
    }
    for (int isa = 0; isa < DP_ISA_COUNT; isa++)
        if (isa != widest_isa() && use_isa(isa)) {
            conv_case_s(dt, 2, 3, 9, 33, 5, 3, 3, 1, 1, &ctx1, dp_isa_name(isa));
            conv_case_s(dt, 2, 3, 9, 9, 4, 3, 3, 1, 2, &ctx1, dp_isa_name(isa));
        }
    /* back to the ISA the caller's loop is testing (the widest, which this left active, ran
     * the float64 kernels after it in every pass) */
    use_isa(entry_isa);
    /* the fourth: a padding near INT_MAX makes OH and OW near 2^32 each (their product
     * overflowed a long long; found by the fuzzer under UBSan); the last: a negative stride */
    dp_conv_geom bad[] = {{0, 3, 3, 1, 1, 1, 0, 1},
                          {1, 3, 3, 1, 6, 1, 1, 1},
                          {1, 3, 3, 1, 1, 1, -1, 1},
                          {2, 4, 6, 1, 3, 1, INT_MAX, 1},
                          {2, 4, 6, 1, 3, 1, 0, -1}};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        int OH, OW;
        expect(dp_conv_out(&bad[i], &OH, &OW) == DP_EVALUE, "dp_conv_out bad geometry %d accepted",
               i);
    }
}

/* Pooling against the rule written out (first maximum, a NaN wins), on exact-size buffers
 * (the kernels read and write whole vectors past a row's end inside the arrays: AddressSanitizer
 * checks that they never leave them). */
static void test_maxpool(dtype dt)
{
    static const int shapes[][3] = {{1, 2, 2},   {3, 7, 7},  {2, 7, 3},   {1, 3, 7}, {2, 30, 30},
                                    {5, 13, 13}, {1, 2, 41}, {3, 33, 18}, {2, 4, 34}};
    for (int s = 0; s < 9; s++) {
        int P = shapes[s][0], H = shapes[s][1], W = shapes[s][2], OH = H / 2, OW = W / 2;
        ptrdiff_t nx = (ptrdiff_t)P * H * W, ny = (ptrdiff_t)P * OH * OW;
        void *x = talloc(dt, nx), *y = talloc(dt, ny), *dy = talloc(dt, ny), *dx = talloc(dt, nx);
        uint8_t *idx = xalloc((size_t)ny);
        for (ptrdiff_t i = 0; i < nx; i++) {
            double r = unif(0, 1);
            tset(dt, x, i, r < 0.03 ? NAN : floor(unif(-3, 3))); /* ties and NaNs */
        }
        tfill(dt, dy, ny, -1, 1);
        if (dt == F32)
            dp_maxpool2_forward_f32(y, idx, x, P, H, W);
        else
            dp_maxpool2_forward_f64(y, idx, x, P, H, W);
        tconst(dt, dx, nx, NAN);
        if (dt == F32)
            dp_maxpool2_backward_f32(dx, dy, idx, P, H, W);
        else
            dp_maxpool2_backward_f64(dx, dy, idx, P, H, W);
        int bad_y = 0, bad_i = 0, bad_dx = 0;
        for (int p = 0; p < P; p++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    int best = 0;
                    double m = tget(dt, x, ((ptrdiff_t)p * H + 2 * i) * W + 2 * j);
                    for (int k = 1; k < 4; k++) {
                        double a =
                            tget(dt, x, ((ptrdiff_t)p * H + 2 * i + k / 2) * W + 2 * j + k % 2);
                        if (!isnan(m) && (a > m || isnan(a))) m = a, best = k;
                    }
                    ptrdiff_t yi = ((ptrdiff_t)p * OH + i) * OW + j;
                    double got = tget(dt, y, yi);
                    bad_y += !(got == m || (isnan(got) && isnan(m)));
                    bad_i += idx[yi] != best;
                }
        for (int p = 0; p < P; p++)
            for (int h = 0; h < H; h++)
                for (int q = 0; q < W; q++) {
                    double want = 0;
                    int i = h / 2, j = q / 2;
                    if (i < OH && j < OW) {
                        ptrdiff_t yi = ((ptrdiff_t)p * OH + i) * OW + j;
                        if (idx[yi] == (h % 2) * 2 + q % 2) want = tget(dt, dy, yi);
                    }
                    bad_dx += tget(dt, dx, ((ptrdiff_t)p * H + h) * W + q) != want;
                }
        expect(!bad_y && !bad_i, "dp_maxpool2_forward_%s %dx%dx%d: %d values, %d codes wrong",
               dtn(dt), P, H, W, bad_y, bad_i);
        expect(!bad_dx, "dp_maxpool2_backward_%s %dx%dx%d: %d values wrong", dtn(dt), P, H, W,
               bad_dx);
        free(x);
        free(y);
        free(dy);
        free(dx);
        free(idx);
    }
}

/* dp_gather_rows against memcpy row by row: rows shorter and longer than its prefetch span,
 * fewer and more rows than it prefetches ahead, repeated indices; the bytes after dst's rows
 * stay as they were. */
static void test_gather_rows(void)
{
    static const size_t widths[] = {1, 8, 160, 3136, 5000, 12288};
    static const int counts[] = {0, 1, 5, 31, 32, 33, 100};
    for (int wi = 0; wi < 6; wi++)
        for (int ci = 0; ci < 7; ci++) {
            size_t rb = widths[wi];
            int rows = 50, n = counts[ci];
            unsigned char *src = malloc(rb * (size_t)rows), *dst = malloc(rb * (size_t)n + 64);
            unsigned char *want = malloc(rb * (size_t)n + 64);
            int64_t *ix = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
            for (size_t b = 0; b < rb * (size_t)rows; b++) src[b] = (unsigned char)randint(256);
            for (int i = 0; i < n; i++) ix[i] = randint(i % 3 ? rows : 3); /* repeats */
            memset(dst, 0xA5, rb * (size_t)n + 64);
            memset(want, 0xA5, rb * (size_t)n + 64);
            for (int i = 0; i < n; i++) memcpy(want + (size_t)i * rb, src + (size_t)ix[i] * rb, rb);
            dp_gather_rows(dst, src, ix, n, rb);
            expect(
                memcmp(dst, want, rb * (size_t)n + 64) == 0,
                "dp_gather_rows rows of %zu bytes, n=%d: differs from the rows copied one by one",
                rb, n);
            free(src);
            free(dst);
            free(want);
            free(ix);
        }
}

/* Detection and the peak loops: a smoke check (timings live in bench/). What must hold on any
 * CPU: the AVX-512 sub-features imply AVX-512F, FMA and AVX2 imply AVX; every ISA the CPU has
 * gives a positive finite rate, every other one DP_ENOTSUP without touching the output; bad
 * arguments give DP_EVALUE. */
static void test_cpu(void)
{
    dp_cpu_features f;
    dp_cpu_detect(&f);
    printf("test_core: cpu %s / %s: avx %d fma %d avx2 %d avx512 f %d bw %d vl %d dq %d vnni %d "
           "bf16 %d; widest FMA %s\n",
           f.vendor, f.brand, f.avx, f.fma, f.avx2, f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq,
           f.avx512_vnni, f.avx512_bf16, dp_isa_name(dp_cpu_widest_isa(&f)));
    expect(f.avx512f || !(f.avx512bw || f.avx512vl || f.avx512dq || f.avx512_vnni || f.avx512_bf16),
           "dp_cpu_detect: an AVX-512 sub-feature without avx512f");
    expect(f.avx || !(f.fma || f.avx2), "dp_cpu_detect: fma %d / avx2 %d without avx", f.fma,
           f.avx2);
    expect(dp_cpu_has_isa(&f, DP_ISA_GENERIC) && dp_cpu_has_isa(&f, dp_cpu_widest_isa(&f)),
           "dp_cpu_has_isa: generic or the widest isa (%d) refused", dp_cpu_widest_isa(&f));
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        for (int f64 = 0; f64 < 2; f64++) {
            double g = -1.0;
            int rc = f64 ? dp_fma_peak_f64(isa, 0.01, &g) : dp_fma_peak_f32(isa, 0.01, &g);
            if (dp_cpu_has_isa(&f, isa))
                expect(rc == DP_OK && g > 0 && isfinite(g), "dp_fma_peak_%s(%s): rc %d, %g GFLOP/s",
                       f64 ? "f64" : "f32", dp_isa_name(isa), rc, g);
            else
                expect(rc == DP_ENOTSUP && g == -1.0,
                       "dp_fma_peak_%s(%s) on a CPU without it: "
                       "rc %d, %g",
                       f64 ? "f64" : "f32", dp_isa_name(isa), rc, g);
        }
    }
    double g = -1.0;
    expect(dp_fma_peak_f32(DP_ISA_COUNT, 0.01, &g) == DP_EVALUE &&
               dp_fma_peak_f32(-1, 0.01, &g) == DP_EVALUE,
           "dp_fma_peak_f32: an unknown isa was accepted");
    expect(dp_fma_peak_f32(DP_ISA_GENERIC, 0.0, &g) == DP_EVALUE &&
               dp_fma_peak_f64(DP_ISA_GENERIC, NAN, &g) == DP_EVALUE &&
               dp_fma_peak_f64(DP_ISA_GENERIC, INFINITY, &g) == DP_EVALUE && g == -1.0,
           "dp_fma_peak: seconds 0, NaN or inf accepted (or the output written: %g)", g);
    /* vdpbf16ps's rate: where the CPU has AVX-512 and AVX512_BF16 (and this compiler the
     * intrinsic, which the CI compilers have), else DP_ENOTSUP with nothing written */
    {
        double d = -1.0;
        int rc = dp_bf16dot_peak(0.01, &d);
        if (dp_cpu_has_isa(&f, DP_ISA_AVX512) && f.avx512_bf16)
            expect(rc == DP_OK && d > 0 && isfinite(d), "dp_bf16dot_peak: rc %d, %g GFLOP/s", rc,
                   d);
        else
            expect(rc == DP_ENOTSUP && d == -1.0, "dp_bf16dot_peak on a CPU without it: rc %d, %g",
                   rc, d);
        expect(dp_bf16dot_peak(0.0, &d) == DP_EVALUE && dp_bf16dot_peak(NAN, &d) == DP_EVALUE,
               "dp_bf16dot_peak: seconds 0 or NaN accepted");
    }
    expect(dp_isa_name(DP_ISA_COUNT) == NULL && dp_isa_bits(DP_ISA_AVX512) == 512 &&
               dp_isa_bits(DP_ISA_AVX2) == 256,
           "dp_isa_name / dp_isa_bits");
}

/* ---- main -------------------------------------------------------------------------------- */

int main(void)
{
    signal(SIGALRM, on_watchdog);
    alarm(watchdog_seconds(120));
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("test_core: kernels' ISA on this CPU: %s (GEMM %s); tested:",
           dp_isa_name(dp_isa_active()), dp_gemm_isa());
    for (int isa = 0; isa < DP_ISA_COUNT; isa++)
        if (dp_isa_select(isa) == DP_OK)
            printf(" %s (GEMM %s)", dp_isa_name(isa), dp_gemm_isa());
        else
            printf(" %s (skipped: not on this CPU)", dp_isa_name(isa));
    printf("\n");
    use_isa(widest_isa());

    test_threads_startup(); /* before this process has any threads of its own */
    test_cpu();
    test_gather_rows();
    test_math();
    test_sync();
    test_default_ctx();

    int rc = dp_ctx_init(&ctx1, 1);
    if (!rc) rc = dp_ctx_init(&ctx3, 3);
    if (!expect(rc == DP_OK, "dp_ctx_init: returned %d", rc)) {
        printf("%d passed, %d failed\n", (int)n_passed, (int)n_failed);
        return 1;
    }
    let_helpers_start();
    expect(ctx3.threads == 3 && ctx1.threads == 1,
           "dp_ctx_init: threads %d and %d, expected 1 and 3", ctx1.threads, ctx3.threads);
    /* "generic", or "generic (NEON)" where the portable vectors are NEON's (ARM) */
    expect(strncmp(use_isa(DP_ISA_GENERIC), "generic", 7) == 0, "dp_gemm_isa with isa generic: %s",
           dp_gemm_isa());
    expect(dp_isa_select(DP_ISA_COUNT) == DP_EVALUE && dp_isa_select(-1) == DP_EVALUE &&
               dp_isa_active() == DP_ISA_GENERIC,
           "dp_isa_select: an unknown isa was accepted");
    expect(dp_isa_from_name("avx2") == DP_ISA_AVX2 && dp_isa_from_name("avx512") == DP_ISA_AVX512 &&
               dp_isa_from_name("generic") == DP_ISA_GENERIC && dp_isa_from_name("AVX2") == -1 &&
               dp_isa_from_name("") == -1,
           "dp_isa_from_name");
    use_isa(widest_isa());
    expect(dp_isa_active() == widest_isa(), "dp_isa_select(widest): active %d", dp_isa_active());

    test_round_bf16();
    for (int t = 0; t < 2; t++) {
        dtype dt = t ? F64 : F32;
        test_gemm(dt); /* every ISA inside; float: also with bfloat16 inputs */
        test_gemm_degenerate(dt);
        test_gemm_order_invariance(dt);
        test_gemv_cols_window(dt);
        for (int k = 0; k < 4; k++) test_gemm_tile_window(dt, (const int[]){700, 10, 20, 27}[k]);
        test_dense(dt);
        test_argmax_count(dt);
    }
    printf("bfloat16 dot path: %s; %d GEMM cases ran it against the rounding path; vdpbf16ps / "
           "float32 FMA flop, measured: %.2f (the default takes it from %.2f)\n",
           dp_gemm_bf16_dot_available() ? dp_gemm_bf16_dot_name() : "not on this CPU",
           bf16_dot_cases, dp_gemm_bf16_dot_ratio(), DP_BF16_DOT_GAIN);
    printf("bfloat16 AMX path: %s; %d GEMM cases ran it\n",
           dp_gemm_bf16_amx_available() ? dp_gemm_bf16_amx_name() : dp_gemm_bf16_amx_why(),
           bf16_amx_cases);
    /* the vector kernels (dp_vec.h), on every ISA this CPU has */
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        if (!use_isa(isa)) continue;
        for (int t = 0; t < 2; t++) {
            dtype dt = t ? F64 : F32;
            test_relu(dt);
            test_scale(dt);
            test_sum_buffers(dt);
            if (dt == F32) test_bf16_buffers();
            test_sgd(dt);
            test_sgd_team(dt);
            test_adam(dt);
            test_softmax_xent(dt);
            test_sigmoid_bce(dt);
            test_sigmoid_bce_dense(dt);
            test_sigmoid_bce_position(dt);
            test_logistic_grad(dt);
            test_maxpool(dt);
            test_conv(dt); /* im2col and col2im */
        }
        test_group_allreduce();
    }
    use_isa(widest_isa());

    dp_ctx_free(&ctx1);
    dp_ctx_free(&ctx3);
    printf("%d passed, %d failed\n", (int)n_passed, (int)n_failed);
    return n_failed ? 1 : 0;
}
