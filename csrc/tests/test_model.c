/* test_model.c - plain-C tests of dp_model (the layer-list engine) and dp_act (tanh, sigmoid,
 * GELU, MSE): no Python anywhere. A second binary next to test_core, built and run by the same
 * `make check` (AddressSanitizer, LeakSanitizer, UBSan) and `make check-O3`.
 *
 * What is checked:
 * - every activation kernel and the MSE against its naive twin and against double libm, for
 *   float and double, over odd sizes (1, 3, 7, 33, 1000) and special values (+-0, tiny, large,
 *   +-inf, NaN: NaN propagates); backward kernels against central differences of the forward;
 * - dp_model_plan: the stages each pattern compiles to, the shapes, the parameter count, and
 *   every refusal (with the index of the bad layer);
 * - dp_model on architectures that together use every layer kind and every loss, and on
 *   dense stacks and conv blocks then a dense stack (the MLP's and CNN's layer lists) at odd
 *   widths and batch sizes: outputs and loss against a forward written here in
 *   double (which also counts the parameters the layout must have), the gradient against
 *   central differences of that forward, 3 threads against 1, float against double, the split
 *   sweep against loss_grad (bit for bit, in both dtypes), evaluate in several chunks (both
 *   dtypes, with and without outputs, labels or targets), B == 0, labels out of range (the
 *   code and the row, from the first chunk and from the last), missing labels or targets,
 *   steps out of order.
 * Tolerances are rounding-error bounds as in test_core.c.
 *
 * Output: one "FAIL ..." line per failed check, then "N passed, M failed"; exit status 1 when
 * any failed. Leaves out on purpose: timings (bench_model.c) and the Python boundary.
 */
#include "dp_act.h"
#include "dp_common.h"
#include "dp_model.h"
#include "dp_cpu.h"
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
#include <time.h>
#include <unistd.h>

/* ---- bookkeeping (as in test_core.c) ------------------------------------------------------- */

static volatile sig_atomic_t n_passed, n_failed;

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

typedef struct {
    ptrdiff_t n, bad, at;
    double got, want, tol, ratio;
} diff;

/* got == want (NaN == NaN, inf == inf) or |got - want| <= tol */
static void diff_add(diff *d, ptrdiff_t i, double got, double want, double tol)
{
    d->n++;
    if (isnan(got) && isnan(want)) return;
    if (isinf(want) && got == want) return;
    double err = fabs(got - want);
    if (err <= tol) return;
    double ratio = (isnan(err) || tol <= 0) ? INFINITY : err / tol;
    if (d->bad++ == 0 || ratio > d->ratio) {
        d->at = i;
        d->got = got;
        d->want = want;
        d->tol = tol;
        d->ratio = ratio;
    }
}

static void expect_diff(const diff *d, const char *fmt, ...)
{
    if (!d->bad) {
        n_passed++;
        return;
    }
    n_failed++;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    printf("FAIL [isa %s] %s: %td of %td elements off, worst [%td] got %.10g expected %.10g "
           "(|err| %.3g > tol %.3g)\n",
           dp_isa_name(dp_isa_active()), what, d->bad, d->n, d->at, d->got, d->want,
           fabs(d->got - d->want), d->tol);
    fflush(stdout);
}

static void on_watchdog(int sig)
{
    (void)sig;
    const char msg[] = "FAIL watchdog: test_model still running after its time limit (a hang?)\n";
    ssize_t w = write(STDOUT_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

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

static void *xalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        puts("test_model: out of memory");
        exit(2);
    }
    return p;
}

static double *dalloc(ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }
static float *falloc(ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }
static int64_t *ialloc(ptrdiff_t n) { return xalloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t)); }

/* A new pool's helper threads reach their wait loop before the first job (test_core.c). */
static void let_helpers_start(void)
{
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* ---- activations and MSE ------------------------------------------------------------------ */

typedef enum { A_TANH, A_SIGMOID, A_GELU } act_id;
static const char *act_name[] = {"tanh", "sigmoid", "gelu"};

/* The reference in long double: in double, erfc(-x / sqrt 2) and exp(-x^2 / 2) are off by up
 * to x^2 eps relative (the rounding of x / sqrt 2 and x^2, amplified by the exponential), which
 * is the naive twins' accuracy but 1e-13 at x = -20. The remaining error of the reference is
 * x^2 LDBL_EPSILON (ref_tol). */
static double ref_act(act_id a, double x)
{
    long double v = x;
    switch (a) {
    case A_TANH: return (double)tanhl(v);
    case A_SIGMOID: return (double)(1 / (1 + expl(-v)));
    default: return (double)(v * 0.5L * erfcl(-v / sqrtl(2.0L)));
    }
}

/* d act / dx at x */
static double ref_dact(act_id a, double x)
{
    long double v = x;
    switch (a) {
    case A_TANH: {
        long double t = tanhl(v);
        return (double)(1 - t * t);
    }
    case A_SIGMOID: {
        long double s = 1 / (1 + expl(-v));
        return (double)(s * (1 - s));
    }
    default:
        return (double)(0.5L * erfcl(-v / sqrtl(2.0L)) +
                        v * expl(-v * v / 2) / sqrtl(2 * 3.14159265358979323846264338327950288L));
    }
}

/* the reference's own relative error bound at x (see ref_act) */
static double ref_tol(double x) { return fabs(x) < 50 ? 4 * (1 + x * x) * LDBL_EPSILON : 0; }

static void act_fwd(act_id a, int naive, int f64, void *y, const void *x, ptrdiff_t n)
{
    static void (*const f32s[2][3])(float *, const float *, ptrdiff_t) = {
        {dp_tanh_forward_f32, dp_sigmoid_forward_f32, dp_gelu_forward_f32},
        {dp_tanh_forward_naive_f32, dp_sigmoid_forward_naive_f32, dp_gelu_forward_naive_f32}};
    static void (*const f64s[2][3])(double *, const double *, ptrdiff_t) = {
        {dp_tanh_forward_f64, dp_sigmoid_forward_f64, dp_gelu_forward_f64},
        {dp_tanh_forward_naive_f64, dp_sigmoid_forward_naive_f64, dp_gelu_forward_naive_f64}};
    if (f64)
        f64s[naive][a](y, x, n);
    else
        f32s[naive][a](y, x, n);
}

/* yx: the forward output (tanh, sigmoid) or input (GELU) the backward takes */
static void act_bwd(act_id a, int naive, int f64, void *dx, const void *dy, const void *yx,
                    ptrdiff_t n)
{
    static void (*const f32s[2][3])(float *, const float *, const float *, ptrdiff_t) = {
        {dp_tanh_backward_f32, dp_sigmoid_backward_f32, dp_gelu_backward_f32},
        {dp_tanh_backward_naive_f32, dp_sigmoid_backward_naive_f32, dp_gelu_backward_naive_f32}};
    static void (*const f64s[2][3])(double *, const double *, const double *, ptrdiff_t) = {
        {dp_tanh_backward_f64, dp_sigmoid_backward_f64, dp_gelu_backward_f64},
        {dp_tanh_backward_naive_f64, dp_sigmoid_backward_naive_f64, dp_gelu_backward_naive_f64}};
    if (f64)
        f64s[naive][a](dx, dy, yx, n);
    else
        f32s[naive][a](dx, dy, yx, n);
}

/* Inputs for the activation tests: uniform on [-8, 8] and [-40, 40], then special values. */
static const double specials[] = {0.0,   -0.0,   1e-30, -1e-30, 1e-8,     -1e-8,     0.5499, 0.55,
                                  -0.55, 0.5501, 1.0,   -1.0,   5.0,      -5.0,      9.0,    -9.0,
                                  13.5,  -13.5,  20.0,  -20.0,  37.0,     -37.0,     40.0,   -40.0,
                                  100.0, -100.0, 1e30,  -1e30,  INFINITY, -INFINITY, NAN};
#define N_SPECIALS ((int)(sizeof specials / sizeof specials[0]))

static void fill_act_inputs(double *x, ptrdiff_t n)
{
    for (ptrdiff_t i = 0; i < n; i++) x[i] = i % 2 ? unif(-8, 8) : unif(-40, 40);
    for (ptrdiff_t i = 0; i < n && i < N_SPECIALS; i++) x[n - 1 - i] = specials[i];
}

/* Relative tolerance k eps of the dtype, and an absolute floor at the dtype's smallest normal
 * (a result below it is subnormal or flushed to 0 by the branch-free exp). */
static double tol_of(int f64, double want, double k)
{
    double eps = f64 ? DBL_EPSILON : FLT_EPSILON, tiny = f64 ? DBL_MIN : FLT_MIN;
    return k * eps * fabs(want) + 4 * tiny;
}

static void test_act_kernels(void)
{
    const ptrdiff_t sizes[] = {1, 3, 7, 33, 1000};
    double worst[3][2] = {{0}}; /* max relative error of the fast kernel vs libm */
    for (int f64 = 0; f64 < 2; f64++)
        for (int a = 0; a < 3; a++)
            for (int si = 0; si < 5; si++) {
                ptrdiff_t n = sizes[si];
                size_t ts = f64 ? sizeof(double) : sizeof(float);
                double *xd = dalloc(n);
                fill_act_inputs(xd, n);
                void *x = xalloc(ts * (size_t)n), *y = xalloc(ts * (size_t)n);
                void *yn = xalloc(ts * (size_t)n), *dy = xalloc(ts * (size_t)n);
                void *dx = xalloc(ts * (size_t)n), *dxn = xalloc(ts * (size_t)n);
                for (ptrdiff_t i = 0; i < n; i++) {
                    if (f64)
                        ((double *)x)[i] = xd[i], ((double *)dy)[i] = unif(-2, 2);
                    else
                        ((float *)x)[i] = (float)xd[i], ((float *)dy)[i] = (float)unif(-2, 2);
                }
#define GET(p, i) (f64 ? ((double *)(p))[i] : (double)((float *)(p))[i])
                act_fwd(a, 0, f64, y, x, n);
                act_fwd(a, 1, f64, yn, x, n);
                diff dl = {0}, dn = {0};
                for (ptrdiff_t i = 0; i < n; i++) {
                    double xi = GET(x, i), want = ref_act(a, xi);
                    /* GELU(-inf) = -inf * 0: NaN, as the formula is in IEEE arithmetic */
                    /* the naive GELU is x^2 eps off (see ref_act): so much the tolerance */
                    double twin = a == A_GELU && isfinite(xi) ? 8 + xi * xi : 8;
                    diff_add(&dl, i, GET(y, i), want,
                             tol_of(f64, want, 8) + ref_tol(xi) * fabs(want));
                    diff_add(&dn, i, GET(y, i), GET(yn, i), tol_of(f64, GET(yn, i), twin));
                    if (isfinite(want) && fabs(want) > (f64 ? DBL_MIN : FLT_MIN) * 4) {
                        double r = fabs(GET(y, i) - want) / fabs(want);
                        if (r > worst[a][f64]) worst[a][f64] = r;
                    }
                }
                expect_diff(&dl, "dp_%s_forward_%s n=%td vs libm in double", act_name[a],
                            f64 ? "f64" : "f32", n);
                expect_diff(&dn, "dp_%s_forward_%s n=%td vs its naive twin", act_name[a],
                            f64 ? "f64" : "f32", n);
                /* in place gives the same */
                void *yy = xalloc(ts * (size_t)n);
                memcpy(yy, x, ts * (size_t)n);
                act_fwd(a, 0, f64, yy, yy, n);
                expect(memcmp(yy, y, ts * (size_t)n) == 0 || n == 0,
                       "dp_%s_forward_%s n=%td in place differs", act_name[a], f64 ? "f64" : "f32",
                       n);
                /* backward: from the output (tanh, sigmoid) or the input (GELU), against the
                 * twin and against the derivative in double */
                const void *yx = a == A_GELU ? x : y;
                act_bwd(a, 0, f64, dx, dy, yx, n);
                act_bwd(a, 1, f64, dxn, dy, a == A_GELU ? x : yn, n);
                diff bl = {0}, bn = {0};
                for (ptrdiff_t i = 0; i < n; i++) {
                    double xi = GET(x, i), g = GET(dy, i), want = g * ref_dact(a, xi);
                    double tol, twin;
                    if (a == A_GELU) {
                        /* Phi + x phi: each term relative-accurate, so eps times their sizes */
                        double sz =
                            fabs(g) * (0.5 * erfc(-xi / sqrt(2.0)) + fabs(xi) * exp(-xi * xi / 2));
                        /* and the flush: the branch-free exp returns 0 below e^-87 (float)
                         * or e^-708 (double), where |x| phi(x) is still up to 14 * 0.4 * e^-87
                         * = 8 FLT_MIN (40 * 0.4 * e^-708 = 24 DBL_MIN); whether x^2 / 2 rounds
                         * below the cut depends on the ISA's FMA (the generic build flushed
                         * at x = -13.2 where the AVX2 build did not) */
                        double flush = 32 * (f64 ? DBL_MIN : FLT_MIN);
                        tol = tol_of(f64, isfinite(sz) ? sz : 0, 16) + ref_tol(xi) * fabs(want) +
                              flush;
                        twin = tol_of(f64, isfinite(sz) ? sz : 0, 16 + 2 * xi * xi) + flush;
                    } else {
                        /* from the rounded output: 1 - y^2 and y (1 - y) lose up to eps / f'
                         * relative when f' is small; bound by eps times |g| */
                        tol = twin = tol_of(f64, g, 8);
                    }
                    if (isnan(xi))
                        want = NAN;
                    else if (isinf(xi))
                        want = a == A_GELU ? NAN : 0.0; /* inf * 0 */
                    diff_add(&bl, i, GET(dx, i), want, tol);
                    diff_add(&bn, i, GET(dx, i), GET(dxn, i), twin);
                }
                expect_diff(&bl, "dp_%s_backward_%s n=%td vs the derivative in double", act_name[a],
                            f64 ? "f64" : "f32", n);
                expect_diff(&bn, "dp_%s_backward_%s n=%td vs its naive twin", act_name[a],
                            f64 ? "f64" : "f32", n);
#undef GET
                free(xd);
                free(x);
                free(y);
                free(yn);
                free(dy);
                free(dx);
                free(dxn);
                free(yy);
            }
    printf("test_model [isa %s]: max relative error vs libm (double reference): tanh %.2g / "
           "%.2g, sigmoid %.2g / %.2g, gelu %.2g / %.2g (f32 / f64)\n",
           dp_isa_name(dp_isa_active()), worst[0][0], worst[0][1], worst[1][0], worst[1][1],
           worst[2][0], worst[2][1]);

    /* the double kernels' derivative against central differences of their own forward */
    for (int a = 0; a < 3; a++) {
        diff d = {0};
        for (int i = 0; i < 400; i++) {
            double x = -7 + 14.0 * i / 399 + 1e-3, h = 1e-6, yp, ym, y0, one = 1, g;
            double xp = x + h, xm = x - h;
            act_fwd(a, 0, 1, &yp, &xp, 1);
            act_fwd(a, 0, 1, &ym, &xm, 1);
            act_fwd(a, 0, 1, &y0, &x, 1);
            act_bwd(a, 0, 1, &g, &one, a == A_GELU ? &x : &y0, 1);
            double fd = (yp - ym) / (2 * h);
            diff_add(&d, i, g, fd, 1e-8 + 1e-7 * fabs(fd));
        }
        expect_diff(&d, "dp_%s_backward_f64 vs central differences of dp_%s_forward_f64 on [-7, 7]",
                    act_name[a], act_name[a]);
    }
}

static void test_mse(void)
{
    const int shapes[][2] = {{1, 1}, {3, 1}, {7, 3}, {33, 7}, {100, 5}};
    for (int f64 = 0; f64 < 2; f64++)
        for (int si = 0; si < 5; si++) {
            int B = shapes[si][0], OUT = shapes[si][1];
            ptrdiff_t n = (ptrdiff_t)B * OUT;
            double gs = 1.0 / B, *yd = dalloc(n), *td = dalloc(n), ref = 0;
            for (ptrdiff_t i = 0; i < n; i++) yd[i] = unif(-3, 3), td[i] = unif(-3, 3);
            size_t ts = f64 ? sizeof(double) : sizeof(float);
            void *y = xalloc(ts * (size_t)n), *t = xalloc(ts * (size_t)n);
            void *dy = xalloc(ts * (size_t)n), *dyn = xalloc(ts * (size_t)n);
            for (ptrdiff_t i = 0; i < n; i++) {
                if (f64)
                    ((double *)y)[i] = yd[i], ((double *)t)[i] = td[i];
                else
                    ((float *)y)[i] = (float)yd[i], ((float *)t)[i] = (float)td[i];
            }
#define GET(p, i) (f64 ? ((double *)(p))[i] : (double)((float *)(p))[i])
            for (ptrdiff_t i = 0; i < n; i++) {
                double d = GET(y, i) - GET(t, i);
                ref += d * d;
            }
            double l = NAN, ln = NAN, l0 = NAN;
            if (f64) {
                dp_mse_f64(dy, &l, y, t, B, OUT, gs);
                dp_mse_naive_f64(dyn, &ln, y, t, B, OUT, gs);
                dp_mse_f64(NULL, &l0, y, t, B, OUT, gs);
            } else {
                dp_mse_f32(dy, &l, y, t, B, OUT, (float)gs);
                dp_mse_naive_f32(dyn, &ln, y, t, B, OUT, (float)gs);
                dp_mse_f32(NULL, &l0, y, t, B, OUT, (float)gs);
            }
            double eps = f64 ? DBL_EPSILON : FLT_EPSILON;
            expect(
                fabs(l - ref) <= 64 * eps * ref && fabs(ln - ref) <= 64 * eps * ref && l0 == l,
                "dp_mse_%s B=%d OUT=%d: loss_sum %.10g, naive %.10g, no-grad %.10g, expected %.10g",
                f64 ? "f64" : "f32", B, OUT, l, ln, l0, ref);
            diff d = {0}, dn = {0};
            for (ptrdiff_t i = 0; i < n; i++) {
                double want = 2 * gs * (GET(y, i) - GET(t, i));
                diff_add(&d, i, GET(dy, i), want, 4 * eps * fabs(want));
                diff_add(&dn, i, GET(dyn, i), want, 4 * eps * fabs(want));
            }
            expect_diff(&d, "dp_mse_%s B=%d OUT=%d dy", f64 ? "f64" : "f32", B, OUT);
            expect_diff(&dn, "dp_mse_naive_%s B=%d OUT=%d dy", f64 ? "f64" : "f32", B, OUT);
            /* in place: dy = y */
            if (f64)
                dp_mse_f64(y, &l0, y, t, B, OUT, gs);
            else
                dp_mse_f32(y, &l0, y, t, B, OUT, (float)gs);
            expect(l0 == l && memcmp(y, dy, ts * (size_t)n) == 0,
                   "dp_mse_%s B=%d OUT=%d in place (dy = y) differs", f64 ? "f64" : "f32", B, OUT);
#undef GET
            free(yd);
            free(td);
            free(y);
            free(t);
            free(dy);
            free(dyn);
        }
    /* NaN propagates into the loss and its gradient */
    double y[3] = {1, NAN, 2}, t[3] = {0, 0, 0}, dy[3], l;
    dp_mse_f64(dy, &l, y, t, 3, 1, 1.0);
    expect(isnan(l) && isnan(dy[1]) && dy[0] == 2 && dy[2] == 4,
           "dp_mse_f64 with a NaN output: loss %g, dy %g %g %g", l, dy[0], dy[1], dy[2]);
}

/* ---- a reference forward in double: the layer list, walked directly ----------------------- */

typedef struct {
    int ndim, c, h, w; /* (c, h, w), or (c,) flat when ndim == 1 */
} shape3;

static int width_of(shape3 s) { return s.ndim == 3 ? s.c * s.h * s.w : s.c; }

/* Forward of rows x (B, width(in)) through the list; returns the output (B, OUT), allocated.
 * *n_params (when not NULL): how many parameters it read, PyTorch's count for the list. */
static double *ref_forward(const dp_layer *L, int n, shape3 in, const double *params,
                           const double *x, int B, int *out_width, ptrdiff_t *n_params)
{
    shape3 s = in;
    int wdt = width_of(s);
    double *h = dalloc((ptrdiff_t)B * wdt);
    memcpy(h, x, sizeof(double) * (size_t)B * (size_t)wdt);
    ptrdiff_t off = 0;
    for (int l = 0; l < n; l++) {
        const dp_layer *ly = &L[l];
        shape3 o = s;
        double *y = NULL;
        if (ly->kind == DP_LAYER_DENSE) {
            int IN = width_of(s), OUT = ly->out;
            const double *W = params + off, *b = W + (ptrdiff_t)OUT * IN;
            off += (ptrdiff_t)OUT * (IN + 1);
            y = dalloc((ptrdiff_t)B * OUT);
            for (int i = 0; i < B; i++)
                for (int j = 0; j < OUT; j++) {
                    double a = b[j];
                    for (int k = 0; k < IN; k++)
                        a += h[(ptrdiff_t)i * IN + k] * W[(ptrdiff_t)j * IN + k];
                    y[(ptrdiff_t)i * OUT + j] = a;
                }
            o.ndim = 1;
            o.c = OUT;
        } else if (ly->kind == DP_LAYER_CONV) {
            int C = s.c, H = s.h, Wd = s.w, OC = ly->out, KK = ly->kernel, P = ly->pad;
            int OH = H + 2 * P - KK + 1, OW = Wd + 2 * P - KK + 1;
            const double *W = params + off, *b = W + (ptrdiff_t)OC * C * KK * KK;
            off += (ptrdiff_t)OC * C * KK * KK + OC;
            y = dalloc((ptrdiff_t)B * OC * OH * OW);
            for (int i = 0; i < B; i++)
                for (int oc = 0; oc < OC; oc++)
                    for (int r = 0; r < OH; r++)
                        for (int q = 0; q < OW; q++) {
                            double a = b[oc];
                            for (int c = 0; c < C; c++)
                                for (int u = 0; u < KK; u++)
                                    for (int v = 0; v < KK; v++) {
                                        int hh = r + u - P, ww = q + v - P;
                                        if (hh < 0 || hh >= H || ww < 0 || ww >= Wd) continue;
                                        a += W[((oc * C + c) * KK + u) * KK + v] *
                                             h[(((ptrdiff_t)i * C + c) * H + hh) * Wd + ww];
                                    }
                            y[(((ptrdiff_t)i * OC + oc) * OH + r) * OW + q] = a;
                        }
            o.c = OC;
            o.h = OH;
            o.w = OW;
        } else if (ly->kind == DP_LAYER_MAXPOOL2) {
            int C = s.c, H = s.h, Wd = s.w, OH = H / 2, OW = Wd / 2;
            y = dalloc((ptrdiff_t)B * C * OH * OW);
            for (int i = 0; i < B; i++)
                for (int c = 0; c < C; c++)
                    for (int r = 0; r < OH; r++)
                        for (int q = 0; q < OW; q++) {
                            const double *p = h + (((ptrdiff_t)i * C + c) * H + 2 * r) * Wd + 2 * q;
                            y[(((ptrdiff_t)i * C + c) * OH + r) * OW + q] =
                                fmax(fmax(p[0], p[1]), fmax(p[Wd], p[Wd + 1]));
                        }
            o.h = OH;
            o.w = OW;
        } else if (ly->kind == DP_LAYER_FLATTEN) {
            o.ndim = 1;
            o.c = width_of(s);
        } else {
            ptrdiff_t m = (ptrdiff_t)B * width_of(s);
            y = dalloc(m);
            for (ptrdiff_t i = 0; i < m; i++) {
                double v = h[i];
                y[i] = ly->kind == DP_LAYER_RELU      ? (v > 0 ? v : 0)
                       : ly->kind == DP_LAYER_TANH    ? ref_act(A_TANH, v)
                       : ly->kind == DP_LAYER_SIGMOID ? ref_act(A_SIGMOID, v)
                                                      : ref_act(A_GELU, v);
            }
        }
        if (y) {
            free(h);
            h = y;
        }
        s = o;
    }
    *out_width = width_of(s);
    if (n_params) *n_params = off;
    return h;
}

/* Loss sum of outputs z (B, OUT), in double. */
static double ref_loss(dp_loss loss, const double *z, const int64_t *lab, const double *tgt, int B,
                       int OUT)
{
    double total = 0;
    for (int i = 0; i < B; i++) {
        const double *r = z + (ptrdiff_t)i * OUT;
        if (loss == DP_LOSS_SOFTMAX_XENT) {
            double mx = r[0], s = 0;
            for (int j = 1; j < OUT; j++) mx = fmax(mx, r[j]);
            for (int j = 0; j < OUT; j++) s += exp(r[j] - mx);
            total += log(s) + mx - r[lab[i]];
        } else if (loss == DP_LOSS_SIGMOID_BCE) {
            double v = r[0];
            total += fmax(v, 0) - (double)lab[i] * v + log1p(exp(-fabs(v)));
        } else {
            for (int j = 0; j < OUT; j++) {
                double d = r[j] - tgt[(ptrdiff_t)i * OUT + j];
                total += d * d;
            }
        }
    }
    return total;
}

/* ---- dp_model calls by dtype ---------------------------------------------------------------- */

static int m_loss_grad(int f64, dp_model *m, void *g, double *l, int64_t *c, const void *p,
                       const void *x, const int64_t *lab, const void *t, int B, double gs)
{
    return f64 ? dp_model_loss_grad_f64(m, g, l, c, p, x, lab, t, B, gs)
               : dp_model_loss_grad_f32(m, g, l, c, p, x, lab, t, B, (float)gs);
}

static int m_forward_loss(int f64, dp_model *m, double *l, int64_t *c, const void *p, const void *x,
                          const int64_t *lab, const void *t, int B, double gs)
{
    return f64 ? dp_model_forward_loss_f64(m, l, c, p, x, lab, t, B, gs)
               : dp_model_forward_loss_f32(m, l, c, p, x, lab, t, B, (float)gs);
}

static int m_backward_layer(int f64, dp_model *m, void *g, const void *p, int layer)
{
    return f64 ? dp_model_backward_layer_f64(m, g, p, layer)
               : dp_model_backward_layer_f32(m, g, p, layer);
}

/* loss_grad as the split sweep: forward_loss, then backward_layer P_L - 1 .. 0 */
static int m_split_sweep(int f64, dp_model *m, void *g, double *l, int64_t *c, const void *p,
                         const void *x, const int64_t *lab, const void *t, int B, double gs)
{
    int rc = m_forward_loss(f64, m, l, c, p, x, lab, t, B, gs);
    for (int k = m->plan.n_param_layers - 1; k >= 0 && rc == DP_OK; k--)
        rc = m_backward_layer(f64, m, g, p, k);
    return rc;
}

static int m_evaluate(int f64, dp_model *m, void *out, double *l, int64_t *c, const void *p,
                      const void *x, const int64_t *lab, const void *t, int B)
{
    return f64 ? dp_model_evaluate_f64(m, out, l, c, p, x, lab, t, B)
               : dp_model_evaluate_f32(m, out, l, c, p, x, lab, t, B);
}

/* a copy of n doubles in the dtype */
static void *to_dtype(int f64, const double *v, ptrdiff_t n)
{
    if (f64) {
        double *o = dalloc(n);
        memcpy(o, v, sizeof(double) * (size_t)(n > 0 ? n : 0));
        return o;
    }
    float *o = falloc(n);
    for (ptrdiff_t i = 0; i < n; i++) o[i] = (float)v[i];
    return o;
}

static double get_t(int f64, const void *p, ptrdiff_t i)
{ return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i]; }

/* ---- plans ------------------------------------------------------------------------------- */

#define DENSE(n) {DP_LAYER_DENSE, (n), 0, 0, 1, 0.0}
#define CONV(oc, k, p) {DP_LAYER_CONV, (oc), (k), (p), 1, 0.0}
#define POOL {DP_LAYER_MAXPOOL2, 0, 0, 0, 1, 0.0}
#define RELU {DP_LAYER_RELU, 0, 0, 0, 1, 0.0}
#define TANH {DP_LAYER_TANH, 0, 0, 0, 1, 0.0}
#define SIGM {DP_LAYER_SIGMOID, 0, 0, 0, 1, 0.0}
#define GELU {DP_LAYER_GELU, 0, 0, 0, 1, 0.0}
#define FLAT {DP_LAYER_FLATTEN, 0, 0, 0, 1, 0.0}
#define NL(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* "op[act][+pool] ..." of a plan's stages, for messages and checks */
static const char *stages_str(const dp_plan *p, char *buf, size_t cap)
{
    static const char *ops[] = {"dense", "conv", "pool", "act"};
    static const char *acts[] = {"", ":relu", ":tanh", ":sigmoid", ":gelu"};
    size_t k = 0;
    buf[0] = 0;
    for (int s = 0; s < p->n_stages && k < cap; s++) {
        const dp_stage *st = &p->stage[s];
        k += (size_t)snprintf(buf + k, cap - k, "%s%s%s%s", s ? " " : "", ops[st->op],
                              st->pool ? "+pool" : "", acts[st->act]);
    }
    return buf;
}

static void test_plans(void)
{
    char buf[256];
    dp_plan p;
    const int img[3] = {3, 32, 32}, flat[1] = {784};
    /* the studies' CNN: two fused blocks, then the dense tail */
    const dp_layer cnn[] = {CONV(32, 3, 0), RELU, POOL,       CONV(64, 3, 0), RELU,
                            POOL,           FLAT, DENSE(128), RELU,           DENSE(10)};
    int rc = dp_model_plan(&p, cnn, NL(cnn), img, 3, DP_LOSS_SOFTMAX_XENT);
    stages_str(&p, buf, sizeof buf);
    expect(rc == DP_OK && strcmp(buf, "conv+pool:relu conv+pool:relu dense:relu dense") == 0 &&
               p.n_param_layers == 4 && p.stage[1].conv_h == 12 && p.stage[1].conv_w == 12 &&
               p.stage[2].in_width == 2304 && p.out_width == 10,
           "dp_model_plan studies' CNN: rc %d, stages '%s', conv2 block %dx%d, dense in %d", rc,
           buf, p.stage[1].conv_h, p.stage[1].conv_w, p.stage[2].in_width);
    /* its layout, PyTorch's: conv1 W (32,3,3,3) b (32,), conv2 W (64,32,3,3) b (64,), dense W
     * (128,2304) b (128,), W (10,128) b (10,): 896 + 18496 + 295040 + 1290 parameters */
    const ptrdiff_t w_at[4] = {0, 896, 19392, 314432}, b_at[4] = {864, 19328, 314304, 315712};
    expect(p.n_params == 315722, "dp_model_plan studies' CNN: n_params %td, expected 315722",
           p.n_params);
    for (int k = 0; k < 4 && rc == DP_OK; k++) {
        const dp_stage *st = &p.stage[p.param_stage[k]];
        expect(st->w_off == w_at[k] && st->b_off == b_at[k],
               "dp_model_plan studies' CNN layer %d: W at %td, b at %td; expected %td, %td", k,
               st->w_off, st->b_off, w_at[k], b_at[k]);
    }
    expect(p.out_ndim[2] == 3 && p.out_shape[2][0] == 32 && p.out_shape[2][1] == 15 &&
               p.out_ndim[6] == 1 && p.out_shape[6][0] == 2304,
           "dp_model_plan studies' CNN shapes: pool1 (%d,%d,%d) flatten (%d)", p.out_shape[2][0],
           p.out_shape[2][1], p.out_shape[2][2], p.out_shape[6][0]);
    /* the MLP: W_l (OUT, IN) then b_l, layer by layer */
    const dp_layer mlp[] = {DENSE(256), RELU, DENSE(128), RELU, DENSE(10)};
    rc = dp_model_plan(&p, mlp, NL(mlp), flat, 1, DP_LOSS_SOFTMAX_XENT);
    const ptrdiff_t mlp_params = (784 + 1) * 256 + (256 + 1) * 128 + (128 + 1) * 10;
    expect(rc == DP_OK &&
               strcmp(stages_str(&p, buf, sizeof buf), "dense:relu dense:relu dense") == 0 &&
               p.n_params == mlp_params && p.stage[2].w_off == mlp_params - 1290,
           "dp_model_plan MLP: rc %d, stages '%s', n_params %td (expected %td), last W at %td", rc,
           buf, p.n_params, mlp_params, p.stage[2].w_off);
    /* the other patterns */
    const int small[3] = {2, 9, 8};
    const struct {
        dp_layer l[8];
        int n;
        const char *want;
    } pats[] = {
        {{CONV(3, 3, 1), POOL, TANH}, 3, "conv+pool:tanh"},
        {{CONV(3, 3, 1), POOL}, 2, "conv+pool"},
        {{CONV(3, 3, 1), POOL, RELU, RELU}, 4, "conv+pool:relu act:relu"},
        {{CONV(3, 3, 1), SIGM, POOL}, 3, "conv:sigmoid pool"},
        {{CONV(3, 3, 1), GELU, POOL}, 3, "conv act:gelu pool"},
        {{CONV(3, 3, 1), FLAT, RELU}, 3, "conv:relu"},
        {{POOL, GELU, CONV(2, 1, 0), FLAT, DENSE(4), GELU, DENSE(3), SIGM},
         8,
         "pool act:gelu conv dense act:gelu dense:sigmoid"},
        {{TANH, DENSE(4), TANH, TANH}, 4, "act:tanh dense:tanh act:tanh"},
    };
    for (int i = 0; i < NL(pats); i++) {
        rc = dp_model_plan(&p, pats[i].l, pats[i].n, small, 3, DP_LOSS_MSE);
        stages_str(&p, buf, sizeof buf);
        expect(rc == DP_OK && strcmp(buf, pats[i].want) == 0,
               "dp_model_plan pattern %d: rc %d (%s), stages '%s', expected '%s'", i, rc,
               p.why ? p.why : "", buf, pats[i].want);
    }
    /* refusals: the layer at fault */
    const int tiny[3] = {1, 3, 3}, huge[3] = {1, 40000, 40000}, bigflat[1] = {INT_MAX};
    const int zero[3] = {1, 0, 3}, over[3] = {70000, 70000, 1}, six[3] = {1, 6, 6};
    const struct {
        dp_layer l[8];
        int n;
        const int *shape;
        int ndim;
        dp_loss loss;
        int bad;
        const char *name;
    } bad[] = {
        {{CONV(2, 3, 0)}, 1, flat, 1, DP_LOSS_MSE, 0, "conv on a flat input"},
        {{DENSE(4), POOL, DENSE(2)}, 3, tiny, 3, DP_LOSS_MSE, 1, "pool after dense"},
        {{CONV(2, 3, 1), FLAT, POOL}, 3, tiny, 3, DP_LOSS_MSE, 2, "pool after flatten"},
        {{POOL, POOL}, 2, tiny, 3, DP_LOSS_MSE, 1, "pool on a 1x1 map"},
        {{CONV(2, 4, 0)}, 1, tiny, 3, DP_LOSS_MSE, 0, "kernel larger than the input"},
        {{RELU, CONV(2, 6, 1)}, 2, tiny, 3, DP_LOSS_MSE, 1, "kernel larger than the padded input"},
        {{CONV(0, 3, 0)}, 1, tiny, 3, DP_LOSS_MSE, 0, "conv channels 0"},
        {{CONV(2, 0, 0)}, 1, tiny, 3, DP_LOSS_MSE, 0, "conv kernel 0"},
        {{CONV(2, 1, -1)}, 1, tiny, 3, DP_LOSS_MSE, 0, "conv padding -1"},
        {{DENSE(3), DENSE(0)}, 2, tiny, 3, DP_LOSS_MSE, 1, "dense width 0"},
        {{DENSE(3), {(dp_layer_kind)99, 1, 1, 1, 1, 0.0}},
         2,
         tiny,
         3,
         DP_LOSS_MSE,
         1,
         "unknown kind"},
        {{CONV(2, 1, 0)}, 1, huge, 3, DP_LOSS_MSE, 0, "conv output over INT_MAX"},
        {{DENSE(INT_MAX), DENSE(INT_MAX), DENSE(INT_MAX), DENSE(INT_MAX)},
         4,
         bigflat,
         1,
         DP_LOSS_MSE,
         2,
         "parameter count overflow"},
        {{RELU, TANH}, 2, tiny, 3, DP_LOSS_MSE, 2, "no dense, conv, layernorm or batchnorm layer"},
        {{DENSE(1)}, 1, tiny, 3, DP_LOSS_SOFTMAX_XENT, 1, "softmax on 1 output"},
        {{DENSE(3)}, 1, tiny, 3, DP_LOSS_SIGMOID_BCE, 1, "bce on 3 outputs"},
        {{DENSE(3)}, 1, tiny, 3, (dp_loss)7, 1, "unknown loss"},
        {{DENSE(3)}, 1, zero, 3, DP_LOSS_MSE, -1, "input size 0"},
        {{DENSE(3)}, 1, over, 3, DP_LOSS_MSE, -1, "input size over INT_MAX"},
        {{DENSE(3)}, 1, tiny, 2, DP_LOSS_MSE, -1, "input of 2 dims"},
        {{DENSE(3)}, 0, tiny, 3, DP_LOSS_MSE, -1, "no layers"},
        {{CONV(3, 3, 0), RELU, POOL, CONV(3, 3, 0), RELU, POOL, FLAT, DENSE(3)},
         8,
         six,
         3,
         DP_LOSS_SOFTMAX_XENT,
         3,
         "conv blocks (1,6,6) conv 3,3 k3 (nothing left for the second block)"},
    };
    /* init refuses the same way, and free is safe after it */
    for (int i = 0; i < NL(bad); i++) {
        rc = dp_model_plan(&p, bad[i].l, bad[i].n, bad[i].shape, bad[i].ndim, bad[i].loss);
        expect(rc == DP_EVALUE && p.bad_layer == bad[i].bad && p.why && p.n_stages == 0,
               "dp_model_plan refuses %s: rc %d, bad_layer %d (expected %d), why '%s'", bad[i].name,
               rc, p.bad_layer, bad[i].bad, p.why ? p.why : "(null)");
        dp_model m;
        rc = dp_model_init(&m, bad[i].l, bad[i].n, bad[i].shape, bad[i].ndim, bad[i].loss, 2);
        expect(rc == DP_EVALUE && m.plan.bad_layer == bad[i].bad,
               "dp_model_init refuses %s: "
               "rc %d, bad_layer %d",
               bad[i].name, rc, m.plan.bad_layer);
        dp_model_free(&m);
    }
    dp_layer many[DP_MODEL_MAX_LAYERS + 1];
    for (int i = 0; i <= DP_MODEL_MAX_LAYERS; i++) many[i] = (dp_layer)DENSE(2);
    rc = dp_model_plan(&p, many, DP_MODEL_MAX_LAYERS + 1, tiny, 3, DP_LOSS_MSE);
    expect(rc == DP_EVALUE && p.bad_layer == -1, "dp_model_plan: %d layers accepted",
           DP_MODEL_MAX_LAYERS + 1);
    rc = dp_model_plan(&p, many, DP_MODEL_MAX_LAYERS, tiny, 3, DP_LOSS_MSE);
    expect(rc == DP_OK && p.n_param_layers == DP_MODEL_MAX_LAYERS,
           "dp_model_plan: %d layers refused (rc %d)", DP_MODEL_MAX_LAYERS, rc);
}

/* ---- dp_model against the reference ----------------------------------------------------------- */

typedef struct {
    const char *name;
    dp_layer l[12];
    int n;
    int ndim, shape[3];
    dp_loss loss;
} arch;

/* Random labels or targets for B rows of OUT outputs. */
static void make_targets(const arch *a, int OUT, int B, int64_t *lab, double *tgt)
{
    for (int i = 0; i < B; i++) lab[i] = a->loss == DP_LOSS_SIGMOID_BCE ? randint(2) : randint(OUT);
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * OUT; i++) tgt[i] = unif(-1, 1);
}

/* correct count of outputs z by the loss's rule (0 for MSE) */
static int64_t count_right(dp_loss loss, const double *z, const int64_t *lab, int B, int OUT)
{
    int64_t right = 0;
    for (int i = 0; i < B && loss != DP_LOSS_MSE; i++) {
        const double *r = z + (ptrdiff_t)i * OUT;
        int best = 0;
        for (int j = 1; j < OUT; j++)
            if (r[j] > r[best]) best = j;
        right += loss == DP_LOSS_SIGMOID_BCE ? (r[0] > 0) == (lab[i] == 1) : best == lab[i];
    }
    return right;
}

static void test_model_case(const arch *a, int B)
{
    dp_model m1, m3;
    int rc1 = dp_model_init(&m1, a->l, a->n, a->shape, a->ndim, a->loss, 1);
    int rc3 = dp_model_init(&m3, a->l, a->n, a->shape, a->ndim, a->loss, 3);
    if (!expect(rc1 == DP_OK && rc3 == DP_OK, "dp_model_init %s: rc %d / %d (%s)", a->name, rc1,
                rc3, m1.plan.why ? m1.plan.why : "")) {
        dp_model_free(&m1);
        dp_model_free(&m3);
        return;
    }
    let_helpers_start();
    const dp_plan *p = &m1.plan;
    const ptrdiff_t P = p->n_params;
    const int IN = p->in_width, OUT = p->out_width, NPL = p->n_param_layers;
    const shape3 in = {a->ndim, a->shape[0], a->shape[1], a->shape[2]};
    double *params = dalloc(P), *g0 = dalloc(P), *g = dalloc(P), *g2 = dalloc(P);
    double *x = dalloc((ptrdiff_t)B * IN), *tgt = dalloc((ptrdiff_t)B * OUT);
    double *zo = dalloc((ptrdiff_t)B * OUT);
    int64_t *lab = ialloc(B);
    for (ptrdiff_t i = 0; i < P; i++) params[i] = unif(-0.5, 0.5), g0[i] = unif(-1, 1);
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * IN; i++) x[i] = unif(-1, 1);
    make_targets(a, OUT, B, lab, tgt);
    const double gs = 1.0 / B;
    int ow;
    ptrdiff_t used;
    double *z = ref_forward(a->l, a->n, in, params, x, B, &ow, &used);
    double lref = ref_loss(a->loss, z, lab, tgt, B, OUT);
    expect(used == P, "dp_model_init %s: n_params %td, the reference forward reads %td", a->name, P,
           used);

    /* outputs and loss (f64) against the reference */
    double l = NAN, l2 = NAN;
    int64_t c = -1, c2 = -1;
    int rc = dp_model_evaluate_f64(&m1, zo, &l, &c, params, x, lab, tgt, B);
    diff dz = {0};
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * OUT; i++)
        diff_add(&dz, i, zo[i], z[i], 1e-12 * (1 + fabs(z[i])));
    expect(rc == DP_OK && ow == OUT, "dp_model_evaluate_f64 %s B=%d: rc %d, width %d vs %d",
           a->name, B, rc, OUT, ow);
    expect_diff(&dz, "dp_model_evaluate_f64 %s B=%d outputs vs the reference forward", a->name, B);
    expect(fabs(l - lref) <= 1e-12 * (1 + fabs(lref)) && c == count_right(a->loss, zo, lab, B, OUT),
           "dp_model_evaluate_f64 %s B=%d: loss %.15g expected %.15g, correct %" PRId64
           " expected %" PRId64,
           a->name, B, l, lref, c, count_right(a->loss, zo, lab, B, OUT));

    /* loss_grad (f64) accumulates the gradient of gs * loss: central differences; its inputs
     * are left as they were */
    memcpy(g, g0, sizeof(double) * (size_t)P);
    double *keep_p = dalloc(P), *keep_x = dalloc((ptrdiff_t)B * IN);
    memcpy(keep_p, params, sizeof(double) * (size_t)P);
    memcpy(keep_x, x, sizeof(double) * (size_t)B * IN);
    rc = dp_model_loss_grad_f64(&m1, g, &l2, &c2, params, x, lab, tgt, B, gs);
    expect(memcmp(keep_p, params, sizeof(double) * (size_t)P) == 0 &&
               memcmp(keep_x, x, sizeof(double) * (size_t)B * IN) == 0,
           "dp_model_loss_grad_f64 %s B=%d: params or x modified", a->name, B);
    free(keep_p);
    free(keep_x);
    /* logistic regression's loss_grad is the fused one-pass kernel: equal to rounding */
    const int fused = p->loss == DP_LOSS_SIGMOID_BCE && p->n_stages == 1 &&
                      p->stage[0].op == DP_STAGE_DENSE && p->stage[0].act == DP_ACT_NONE;
    expect(rc == DP_OK && (fused ? fabs(l2 - l) <= 1e-14 * (1 + fabs(l)) : l2 == l) && c2 == c,
           "dp_model_loss_grad_f64 %s B=%d: rc %d, loss %.15g "
           "vs evaluate's %.15g, correct %" PRId64 " vs %" PRId64,
           a->name, B, rc, l2, l, c2, c);
    diff dg = {0};
    const double h = 1e-6;
    for (ptrdiff_t i = 0; i < P; i++) {
        double old = params[i];
        params[i] = old + h;
        double *zp = ref_forward(a->l, a->n, in, params, x, B, &ow, NULL);
        params[i] = old - h;
        double *zm = ref_forward(a->l, a->n, in, params, x, B, &ow, NULL);
        params[i] = old;
        double fd =
            gs *
            (ref_loss(a->loss, zp, lab, tgt, B, OUT) - ref_loss(a->loss, zm, lab, tgt, B, OUT)) /
            (2 * h);
        free(zp);
        free(zm);
        diff_add(&dg, i, g[i] - g0[i], fd, 1e-7 + 1e-6 * fabs(fd));
    }
    expect_diff(&dg,
                "dp_model_loss_grad_f64 %s B=%d grads (minus the prefill) vs central differences",
                a->name, B);

    /* the split sweep: the same numbers, bit for bit */
    memcpy(g2, g0, sizeof(double) * (size_t)P);
    rc = m_split_sweep(1, &m1, g2, &l2, &c2, params, x, lab, tgt, B, gs);
    diff ds = {0};
    for (ptrdiff_t i = 0; i < P; i++)
        diff_add(&ds, i, g2[i], g[i], fused ? 1e-14 * (1 + fabs(g[i])) : 0);
    expect(rc == DP_OK && (fused ? fabs(l2 - l) <= 1e-14 * (1 + fabs(l)) : l2 == l) && c2 == c,
           "dp_model forward_loss + backward_layer %s B=%d: rc %d, loss %.17g vs loss_grad's %.17g",
           a->name, B, rc, l2, l);
    expect_diff(&ds, "dp_model forward_loss + backward_layer %s B=%d grads vs loss_grad's (%s)",
                a->name, B, fused ? "to rounding" : "bit for bit");
    expect(dp_model_backward_layer_f64(&m1, g2, params, 0) == DP_EORDER,
           "dp_model_backward_layer %s: a step after the sweep ended was accepted", a->name);
    /* out of order, and a sweep ended by loss_grad (B == 0 too) and by evaluate */
    rc = dp_model_forward_loss_f64(&m1, &l2, &c2, params, x, lab, tgt, B, gs);
    if (NPL > 1)
        expect(dp_model_backward_layer_f64(&m1, g2, params, NPL - 2) == DP_EORDER,
               "dp_model_backward_layer %s: step %d before %d accepted", a->name, NPL - 2, NPL - 1);
    dp_model_loss_grad_f64(&m1, g2, &l2, &c2, params, x, lab, tgt, 0, gs);
    expect(dp_model_backward_layer_f64(&m1, g2, params, NPL - 1) == DP_EORDER,
           "dp_model_backward_layer %s: a sweep survived loss_grad with B == 0", a->name);
    rc = dp_model_forward_loss_f64(&m1, &l2, &c2, params, x, lab, tgt, B, gs);
    dp_model_evaluate_f64(&m1, NULL, &l2, &c2, params, x, NULL, NULL, B);
    expect(dp_model_backward_layer_f64(&m1, g2, params, NPL - 1) == DP_EORDER,
           "dp_model_backward_layer %s: a sweep survived evaluate", a->name);

    /* B == 0: nothing accumulated */
    memcpy(g2, g0, sizeof(double) * (size_t)P);
    l2 = NAN;
    c2 = -1;
    rc = dp_model_loss_grad_f64(&m1, g2, &l2, &c2, params, x, lab, tgt, 0, gs);
    expect(rc == DP_OK && l2 == 0 && c2 == 0 && memcmp(g2, g0, sizeof(double) * (size_t)P) == 0,
           "dp_model_loss_grad_f64 %s B=0: rc %d, loss %g, correct %" PRId64 ", grads %s", a->name,
           rc, l2, c2, memcmp(g2, g0, sizeof(double) * (size_t)P) ? "changed" : "unchanged");

    /* 3 threads: the same gradient up to the order of the conv partial sums */
    memcpy(g2, g0, sizeof(double) * (size_t)P);
    rc = dp_model_loss_grad_f64(&m3, g2, &l2, &c2, params, x, lab, tgt, B, gs);
    diff d3 = {0};
    for (ptrdiff_t i = 0; i < P; i++) diff_add(&d3, i, g2[i], g[i], 1e-13 * (1 + fabs(g[i])));
    expect(rc == DP_OK && fabs(l2 - l) <= 1e-13 * (1 + fabs(l)) && c2 == c,
           "dp_model_loss_grad_f64 %s B=%d threads=3: rc %d, loss %.15g vs %.15g", a->name, B, rc,
           l2, l);
    expect_diff(&d3, "dp_model_loss_grad_f64 %s B=%d threads=3 grads vs threads=1", a->name, B);

    /* evaluate in chunks of 2 rows (threads=3) against the whole batch at once (threads=1), in
     * both dtypes: the same outputs, loss and count; with no output array the same loss and
     * count; with no labels / targets the same outputs, loss 0 and count 0 (loss_grad refuses);
     * a label out of range: DP_ELABEL and its row, from the first chunk and from the last, in
     * evaluate and in loss_grad */
    const int keep_rows = m3.eval_rows;
    m3.eval_rows = 2;
    for (int f64 = 1; f64 >= 0; f64--) {
        const char *dn = f64 ? "f64" : "f32";
        const double tol = f64 ? 1e-13 : 1e-5;
        const ptrdiff_t NZ = (ptrdiff_t)B * OUT;
        const size_t zbytes = (size_t)NZ * (f64 ? sizeof(double) : sizeof(float));
        void *pt = to_dtype(f64, params, P), *xt = to_dtype(f64, x, (ptrdiff_t)B * IN);
        void *tt = to_dtype(f64, tgt, NZ), *gt = to_dtype(f64, g0, P);
        void *zw = xalloc(zbytes), *zc = xalloc(zbytes), *zn = xalloc(zbytes);
        double lw = NAN, lc = NAN;
        int64_t cw = -1, cc = -1;
        int rcw = m_evaluate(f64, &m1, zw, &lw, &cw, pt, xt, lab, tt, B);
        rc = m_evaluate(f64, &m3, zc, &lc, &cc, pt, xt, lab, tt, B);
        diff dc = {0};
        for (ptrdiff_t i = 0; i < NZ; i++)
            diff_add(&dc, i, get_t(f64, zc, i), get_t(f64, zw, i),
                     tol * (1 + fabs(get_t(f64, zw, i))));
        expect(rcw == DP_OK && rc == DP_OK && fabs(lc - lw) <= tol * (1 + fabs(lw)) && cc == cw,
               "dp_model_evaluate_%s %s B=%d in chunks of 2 threads=3: rc %d / %d, loss %.15g vs "
               "%.15g, correct %" PRId64 " vs %" PRId64,
               dn, a->name, B, rc, rcw, lc, lw, cc, cw);
        expect_diff(&dc, "dp_model_evaluate_%s %s B=%d in chunks of 2 outputs", dn, a->name, B);
        rc = m_evaluate(f64, &m3, NULL, &l2, &c2, pt, xt, lab, tt, B);
        expect(rc == DP_OK && l2 == lc && c2 == cc,
               "dp_model_evaluate_%s %s without outputs: rc %d, "
               "loss %.15g vs %.15g, correct %" PRId64 " vs %" PRId64,
               dn, a->name, rc, l2, lc, c2, cc);
        rc = m_evaluate(f64, &m3, zn, &l2, &c2, pt, xt, NULL, NULL, B);
        expect(rc == DP_OK && l2 == 0 && c2 == 0 && memcmp(zn, zc, zbytes) == 0,
               "dp_model_evaluate_%s %s without labels/targets: rc %d, loss %g, correct %" PRId64
               ", outputs %s",
               dn, a->name, rc, l2, c2, memcmp(zn, zc, zbytes) ? "differ" : "same");
        rc = m_loss_grad(f64, &m3, gt, &l2, &c2, pt, xt, NULL, NULL, B, gs);
        expect(rc == DP_EVALUE, "dp_model_loss_grad_%s %s without labels/targets: rc %d", dn,
               a->name, rc);
        /* the first chunk's second row (its first when B <= 2), and the last row */
        const int bad_rows[2] = {B > 2, B - 1};
        for (int at = 0; at < (B > 1 ? 2 : 1) && a->loss != DP_LOSS_MSE; at++) {
            const int row = bad_rows[at];
            const int64_t keep = lab[row];
            for (int bad = 0; bad < 2; bad++) {
                lab[row] = bad ? -1 : a->loss == DP_LOSS_SIGMOID_BCE ? 2 : OUT;
                m3.bad_row = m1.bad_row = -1;
                rc = m_evaluate(f64, &m3, NULL, &l2, &c2, pt, xt, lab, tt, B);
                expect(rc == DP_ELABEL && m3.bad_row == row,
                       "dp_model_evaluate_%s %s label %" PRId64
                       " at row %d of %d: rc %d, bad_row %d",
                       dn, a->name, lab[row], row, B, rc, m3.bad_row);
                rc = m_loss_grad(f64, &m1, gt, &l2, &c2, pt, xt, lab, tt, B, gs);
                expect(rc == DP_ELABEL && m1.bad_row == row,
                       "dp_model_loss_grad_%s %s label %" PRId64
                       " at row %d of %d: rc %d, bad_row %d",
                       dn, a->name, lab[row], row, B, rc, m1.bad_row);
            }
            lab[row] = keep;
        }
        free(pt);
        free(xt);
        free(tt);
        free(gt);
        free(zw);
        free(zc);
        free(zn);
    }
    m3.eval_rows = keep_rows;

    /* float: the f32 model on float-rounded inputs against the f64 one on the same values */
    for (ptrdiff_t i = 0; i < P; i++) params[i] = (float)params[i];
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * IN; i++) x[i] = (float)x[i];
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * OUT; i++) tgt[i] = (float)tgt[i];
    float *pf = to_dtype(0, params, P), *xf = to_dtype(0, x, (ptrdiff_t)B * IN);
    float *tf = to_dtype(0, tgt, (ptrdiff_t)B * OUT), *gf = falloc(P),
          *zf = falloc((ptrdiff_t)B * OUT);
    memset(g, 0, sizeof(double) * (size_t)P);
    rc = dp_model_loss_grad_f64(&m1, g, &l, &c, params, x, lab, tgt, B, gs);
    int rcf = dp_model_loss_grad_f32(&m3, gf, &l2, &c2, pf, xf, lab, tf, B, (float)gs);
    expect(rc == DP_OK && rcf == DP_OK && fabs(l2 - l) <= 1e-4 * (1 + fabs(l)),
           "dp_model_loss_grad_f32 %s B=%d threads=3: rc %d, loss %.8g vs %.8g (f64)", a->name, B,
           rcf, l2, l);
    double gmax = 0;
    for (ptrdiff_t i = 0; i < P; i++) gmax = fmax(gmax, fabs(g[i]));
    diff df = {0};
    for (ptrdiff_t i = 0; i < P; i++) diff_add(&df, i, gf[i], g[i], 1e-4 * (gmax + fabs(g[i])));
    expect_diff(&df, "dp_model_loss_grad_f32 %s B=%d grads vs f64", a->name, B);
    /* the split sweep in float: loss_grad's numbers, bit for bit (to rounding: logistic) */
    float *gfs = falloc(P);
    double l3 = NAN;
    int64_t c3 = -1;
    rcf = m_split_sweep(0, &m3, gfs, &l3, &c3, pf, xf, lab, tf, B, gs);
    diff dsf = {0};
    for (ptrdiff_t i = 0; i < P; i++)
        diff_add(&dsf, i, gfs[i], gf[i], fused ? 1e-5 * (1 + fabs(gf[i])) : 0);
    expect(
        rcf == DP_OK && (fused ? fabs(l3 - l2) <= 1e-5 * (1 + fabs(l2)) : l3 == l2) && c3 == c2,
        "dp_model forward_loss_f32 + backward_layer_f32 %s B=%d: rc %d, loss %.9g vs loss_grad's "
        "%.9g",
        a->name, B, rcf, l3, l2);
    expect_diff(&dsf, "dp_model forward_loss_f32 + backward_layer_f32 %s B=%d grads vs loss_grad's",
                a->name, B);
    free(gfs);
    rc = dp_model_evaluate_f64(&m1, zo, &l, &c, params, x, lab, tgt, B);
    rcf = dp_model_evaluate_f32(&m1, zf, &l2, &c2, pf, xf, lab, tf, B);
    diff dzf = {0};
    for (ptrdiff_t i = 0; i < (ptrdiff_t)B * OUT; i++)
        diff_add(&dzf, i, zf[i], zo[i], 1e-5 * (1 + fabs(zo[i])));
    expect(rc == DP_OK && rcf == DP_OK, "dp_model_evaluate_f32 %s: rc %d", a->name, rcf);
    expect_diff(&dzf, "dp_model_evaluate_f32 %s B=%d outputs vs f64", a->name, B);

    free(pf);
    free(xf);
    free(tf);
    free(gf);
    free(zf);
    free(params);
    free(g0);
    free(g);
    free(g2);
    free(x);
    free(tgt);
    free(zo);
    free(lab);
    free(z);
    dp_model_free(&m1);
    dp_model_free(&m3);
}

static void test_models(void)
{
    const arch archs[] = {
        {"mlp relu softmax",
         {DENSE(3), RELU, DENSE(7), RELU, DENSE(3)},
         5,
         1,
         {7},
         DP_LOSS_SOFTMAX_XENT},
        {"tanh sigmoid bce",
         {DENSE(7), TANH, DENSE(3), SIGM, DENSE(1)},
         5,
         1,
         {3},
         DP_LOSS_SIGMOID_BCE},
        {"gelu mse", {GELU, DENSE(7), GELU, DENSE(3), TANH}, 5, 1, {7}, DP_LOSS_MSE},
        {"logistic regression (fast path)", {DENSE(1)}, 1, 1, {7}, DP_LOSS_SIGMOID_BCE},
        {"softmax regression on an image", {FLAT, DENSE(3)}, 2, 3, {1, 3, 3}, DP_LOSS_SOFTMAX_XENT},
        {"conv sigmoid, pool, conv1x1 pool relu",
         {CONV(3, 3, 1), SIGM, POOL, CONV(3, 1, 0), POOL, RELU, FLAT, DENSE(3)},
         8,
         3,
         {1, 9, 7},
         DP_LOSS_SOFTMAX_XENT},
        {"conv relu pool (cropped), gelu, conv p1 tanh, mse",
         {CONV(3, 3, 0), RELU, POOL, GELU, CONV(1, 2, 1), FLAT, TANH, DENSE(1)},
         8,
         3,
         {2, 7, 7},
         DP_LOSS_MSE},
        {"pool first, conv pool tanh, dense sigmoid mse",
         {POOL, CONV(7, 3, 1), POOL, TANH, DENSE(3), SIGM},
         6,
         3,
         {3, 6, 7},
         DP_LOSS_MSE},
        {"conv relu, conv, dense gelu bce",
         {CONV(2, 3, 1), RELU, CONV(3, 3, 0), FLAT, DENSE(3), GELU, DENSE(1)},
         7,
         3,
         {1, 5, 5},
         DP_LOSS_SIGMOID_BCE},
    };
    for (int i = 0; i < NL(archs); i++) {
        test_model_case(&archs[i], 7);
        test_model_case(&archs[i], 1);
    }
}

/* ---- dense stacks and conv blocks --------------------------------------------------------- */

/* Appends [DENSE(widths[0]) RELU DENSE(widths[1]) ... DENSE(widths[n - 1])]: a dense stack
 * (an MLP's layer list), also the tail of conv blocks'. */
static void dense_stack(arch *a, const int *widths, int n)
{
    for (int l = 0; l < n; l++) {
        if (l) a->l[a->n++] = (dp_layer)RELU;
        a->l[a->n++] = (dp_layer)DENSE(widths[l]);
    }
}

/* Dense stacks of the widths sizes and conv blocks (conv(kernel, padding) -> RELU -> POOL per
 * channel count, FLATTEN, then a dense stack) as the cases of test_model_case, at odd widths
 * and batch sizes (a layer of 33, a batch of 11 or 13, kernels 1 and 3 with and without
 * padding, an odd map cropped by the pool). */
static void test_dense_stacks_and_conv_blocks(void)
{
    static const struct {
        const char *name;
        int sizes[3], L;
        dp_loss loss;
        int B;
    } nets[] = {
        {"dense stack {7,33,5} softmax", {7, 33, 5}, 2, DP_LOSS_SOFTMAX_XENT, 11},
        {"dense stack {20,1} bce (logistic regression)", {20, 1}, 1, DP_LOSS_SIGMOID_BCE, 13},
        {"dense stack {20,6,1} bce", {20, 6, 1}, 2, DP_LOSS_SIGMOID_BCE, 13},
        {"dense stack {13,3} softmax regression", {13, 3}, 1, DP_LOSS_SOFTMAX_XENT, 9},
    };
    for (int i = 0; i < NL(nets); i++) {
        arch a = {nets[i].name, {{0}}, 0, 1, {nets[i].sizes[0], 0, 0}, nets[i].loss};
        dense_stack(&a, nets[i].sizes + 1, nets[i].L);
        test_model_case(&a, nets[i].B);
    }
    static const struct {
        const char *name;
        int shape[3], ch[2], nc, kernel, pad, dense[2], nd, B;
    } cnns[] = {
        {"conv blocks (1,12,10) conv 3,4 k3 dense 6,5", {1, 12, 10}, {3, 4}, 2, 3, 0, {6, 5}, 2, 5},
        {"conv blocks (2,9,9) conv 4 k3 p1 dense 5,4", {2, 9, 9}, {4}, 1, 3, 1, {5, 4}, 2, 7},
        {"conv blocks (3,9,7) conv 3,4 k1 dense 3", {3, 9, 7}, {3, 4}, 2, 1, 0, {3}, 1, 4},
        {"conv blocks (3,12,10) conv 4,5 k3 p1 dense 6,5",
         {3, 12, 10},
         {4, 5},
         2,
         3,
         1,
         {6, 5},
         2,
         7},
        {"conv blocks (2,9,9) conv 3 k3 dense 3", {2, 9, 9}, {3}, 1, 3, 0, {3}, 1, 5},
    };
    for (int i = 0; i < NL(cnns); i++) {
        arch a = {cnns[i].name, {{0}}, 0, 3, {0}, DP_LOSS_SOFTMAX_XENT};
        memcpy(a.shape, cnns[i].shape, sizeof a.shape);
        for (int l = 0; l < cnns[i].nc; l++) {
            a.l[a.n++] = (dp_layer)CONV(cnns[i].ch[l], cnns[i].kernel, cnns[i].pad);
            a.l[a.n++] = (dp_layer)RELU;
            a.l[a.n++] = (dp_layer)POOL;
        }
        a.l[a.n++] = (dp_layer)FLAT;
        dense_stack(&a, cnns[i].dense, cnns[i].nd);
        test_model_case(&a, cnns[i].B);
    }
}

int main(void)
{
    signal(SIGALRM, on_watchdog);
    alarm(watchdog_seconds(300));
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_plans();
    /* the vector kernels (dp_vec.h) and the models built on them, on every ISA this CPU has */
    dp_cpu_features f;
    dp_cpu_detect(&f);
    printf("test_model: ISAs tested:");
    for (int isa = 0; isa < DP_ISA_COUNT; isa++)
        printf(" %s%s", dp_isa_name(isa),
               dp_cpu_has_isa(&f, isa) ? "" : " (skipped: not on this CPU)");
    printf("\n");
    for (int isa = 0; isa < DP_ISA_COUNT; isa++) {
        if (dp_isa_select(isa) != DP_OK) continue;
        test_act_kernels();
        test_mse();
        test_models();
        test_dense_stacks_and_conv_blocks();
    }
    dp_isa_select(dp_cpu_widest_isa(&f));
    printf("%d passed, %d failed\n", (int)n_passed, (int)n_failed);
    return n_failed ? 1 : 0;
}
