/* bench_model.c - dp_model (the layer-list engine) against the fixed engines it replaces,
 * dp_net and dp_cnn, on the studies' models: milliseconds per loss_grad call, in one process.
 *
 * Cases (float32 unless named, B the batch): the MLP 784-256-128-10 (ReLU) B=128; the CNN
 * conv(3->32, 3x3) ReLU pool conv(32->64) ReLU pool dense 128 ReLU dense 10 on 3x32x32 B=128;
 * softmax regression 784->10 B=128; logistic regression (IN=100, one output, sigmoid BCE: the
 * fused dp_logistic_grad path) B=8192; and the MLP and CNN in float64. Each with 1 thread and
 * with `threads` (default 2). Control rows time the old engine against a second instance of
 * itself: their spread is the harness's noise floor (load, where the buffers landed).
 *
 * Method: the same parameters, batch and labels for both engines; a warm-up call each, then
 * the step count that takes about 20 ms; then `repeats` repeats, each timing `steps` calls of
 * one engine and then of the other (which goes first alternates; short blocks, so that both
 * of a pair see the same load on a shared machine). Reported: the median repeat's ms per call
 * of each, and three ratios dp_model / old (1.00: the same speed; the target is <= 1.03):
 * of the medians, of the fastest repeats, and the median of the per-pair quotients (the most
 * robust to a busy machine); then the same in process CPU time, which on a shared machine
 * leaves out the waits for a core (with several threads it also counts the pool's spinning). Gradients accumulate across calls as in a training loop without
 * zero_grad (the work per call does not depend on the values).
 *
 * Build and run: make -C csrc/tests bench && csrc/tests/build/bench_model [repeats] [threads]
 * [only: a substring of the case names to run]
 * A benchmark, not a test: nothing here fails.
 */
#define _POSIX_C_SOURCE 199309L
#include "dp_cnn.h"
#include "dp_model.h"
#include "dp_net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x243F6A8885A308D3ull;

static double unif(double lo, double hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * ((double)(rng >> 11) * 0x1.0p-53);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One engine's loss_grad on fixed buffers. */
typedef struct {
    int kind;              /* 0 dp_net, 1 dp_cnn, 2 dp_model */
    int f64;
    void *engine;
    void *grads, *params, *x;
    int64_t *labels;
    int B;
} runner;

static int run_once(runner *r)
{
    double loss;
    int64_t correct;
    double gs = 1.0 / r->B;
    if (r->f64) {
        if (r->kind == 0)
            return dp_net_loss_grad_f64(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, r->B, gs);
        if (r->kind == 1)
            return dp_cnn_loss_grad_f64(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, r->B, gs);
        return dp_model_loss_grad_f64(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, NULL, r->B, gs);
    }
    float g = (float)gs;
    if (r->kind == 0)
        return dp_net_loss_grad_f32(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, r->B, g);
    if (r->kind == 1)
        return dp_cnn_loss_grad_f32(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, r->B, g);
    return dp_model_loss_grad_f32(r->engine, r->grads, &loss, &correct, r->params, r->x, r->labels, NULL, r->B, g);
}

/* Seconds per call: wall clock, and CPU time of the whole process in *cpu (all its threads;
 * on a shared machine it leaves out the time the process waited for a core). */
static double time_steps(runner *r, int steps, double *cpu)
{
    double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t0 = clock_s(CLOCK_MONOTONIC);
    for (int s = 0; s < steps; s++)
        if (run_once(r)) {
            fprintf(stderr, "bench_model: loss_grad failed\n");
            exit(1);
        }
    double t = (clock_s(CLOCK_MONOTONIC) - t0) / steps;
    if (cpu) *cpu = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / steps;
    return t;
}

#define MAX_REPEATS 256

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* Only the cases whose name contains this (argv[3]); NULL: all. */
static const char *only;

/* Times the two runners interleaved; prints one row. */
static void compare(const char *name, int threads, runner *old, runner *model, int repeats)
{
    if (only && !strstr(name, only)) return;
    time_steps(old, 1, NULL);
    time_steps(model, 1, NULL);
    double once[3];
    for (int k = 0; k < 3; k++) once[k] = time_steps(old, 1, NULL);
    int steps = median(once, 3) > 0 ? (int)(0.02 / median(once, 3)) : 100;
    if (steps < 1) steps = 1;
    if (steps > 2000) steps = 2000;
    double to[MAX_REPEATS], tm[MAX_REPEATS], co[MAX_REPEATS], cm[MAX_REPEATS];
    double rw[MAX_REPEATS], rc[MAX_REPEATS];
    for (int k = 0; k < repeats; k++) {
        if (k % 2 == 0) {
            to[k] = time_steps(old, steps, &co[k]);
            tm[k] = time_steps(model, steps, &cm[k]);
        } else {
            tm[k] = time_steps(model, steps, &cm[k]);
            to[k] = time_steps(old, steps, &co[k]);
        }
        rw[k] = tm[k] / to[k];
        rc[k] = cm[k] / co[k];
    }
    double mo = median(to, repeats), mm = median(tm, repeats);
    double cpu_o = median(co, repeats), cpu_m = median(cm, repeats);
    printf("%-34s %3d %5d %9.3f %9.3f %7.3f %7.3f %7.3f %9.3f %9.3f %7.3f %7.3f\n", name, threads,
           steps, 1e3 * mo, 1e3 * mm, mm / mo, tm[0] / to[0], median(rw, repeats),
           1e3 * cpu_o, 1e3 * cpu_m, cpu_m / cpu_o, median(rc, repeats));
    fflush(stdout);
}

static void *buf(int f64, ptrdiff_t n, double lo, double hi)
{
    size_t ts = f64 ? sizeof(double) : sizeof(float);
    void *p = calloc((size_t)(n > 0 ? n : 1), ts);
    if (!p) {
        fprintf(stderr, "bench_model: out of memory\n");
        exit(1);
    }
    for (ptrdiff_t i = 0; i < n && hi > lo; i++) {
        if (f64) ((double *)p)[i] = unif(lo, hi);
        else ((float *)p)[i] = (float)unif(lo, hi);
    }
    return p;
}

/* control: a second dp_net in dp_model's place (the harness's own noise, e.g. from where the
 * two engines' buffers landed) */
static void bench_dense(const char *name, const int *sizes, int L, dp_loss loss, int B,
                        int f64, int threads, int repeats, int control)
{
    dp_layer layers[2 * DP_MAX_LAYERS];
    int n = 0;
    for (int l = 0; l < L; l++) {
        layers[n++] = (dp_layer){DP_LAYER_DENSE, sizes[l + 1], 0, 0};
        if (l + 1 < L) layers[n++] = (dp_layer){DP_LAYER_RELU, 0, 0, 0};
    }
    dp_net net, net2;
    dp_model m;
    if (dp_net_init(&net, sizes, L, loss, threads) || dp_model_init(&m, layers, n, sizes, 1, loss, threads) ||
        dp_net_init(&net2, sizes, L, loss, threads)) {
        fprintf(stderr, "bench_model: init failed for %s\n", name);
        exit(1);
    }
    ptrdiff_t P = net.n_params;
    void *params = buf(f64, P, -0.05, 0.05), *x = buf(f64, (ptrdiff_t)B * sizes[0], -1, 1);
    void *g1 = buf(f64, P, 0, 0), *g2 = buf(f64, P, 0, 0);
    int64_t *lab = calloc((size_t)B, sizeof(int64_t));
    for (int i = 0; i < B; i++) lab[i] = (int64_t)(unif(0, 1) * (loss == DP_LOSS_SIGMOID_BCE ? 2 : sizes[L])) ;
    runner old = {0, f64, &net, g1, params, x, lab, B}, mod = {2, f64, &m, g2, params, x, lab, B};
    runner twin = {0, f64, &net2, g2, params, x, lab, B};
    compare(name, threads, &old, control ? &twin : &mod, repeats);
    free(params); free(x); free(g1); free(g2); free(lab);
    dp_net_free(&net);
    dp_net_free(&net2);
    dp_model_free(&m);
}

static void bench_cnn(const char *name, int f64, int threads, int repeats, int control)
{
    const int C = 3, H = 32, W = 32, ch[2] = {32, 64}, dense[2] = {128, 10}, B = 128;
    const dp_layer layers[] = {
        {DP_LAYER_CONV, 32, 3, 0}, {DP_LAYER_RELU, 0, 0, 0}, {DP_LAYER_MAXPOOL2, 0, 0, 0},
        {DP_LAYER_CONV, 64, 3, 0}, {DP_LAYER_RELU, 0, 0, 0}, {DP_LAYER_MAXPOOL2, 0, 0, 0},
        {DP_LAYER_FLATTEN, 0, 0, 0}, {DP_LAYER_DENSE, 128, 0, 0}, {DP_LAYER_RELU, 0, 0, 0},
        {DP_LAYER_DENSE, 10, 0, 0}};
    const int shape[3] = {C, H, W};
    dp_cnn net, net2;
    dp_model m;
    if (dp_cnn_init(&net, C, H, W, ch, 2, 3, 0, dense, 2, threads) ||
        dp_model_init(&m, layers, 10, shape, 3, DP_LOSS_SOFTMAX_XENT, threads) ||
        dp_cnn_init(&net2, C, H, W, ch, 2, 3, 0, dense, 2, threads)) {
        fprintf(stderr, "bench_model: init failed for %s\n", name);
        exit(1);
    }
    ptrdiff_t P = net.n_params;
    void *params = buf(f64, P, -0.05, 0.05), *x = buf(f64, (ptrdiff_t)B * C * H * W, -1, 1);
    void *g1 = buf(f64, P, 0, 0), *g2 = buf(f64, P, 0, 0);
    int64_t *lab = calloc((size_t)B, sizeof(int64_t));
    for (int i = 0; i < B; i++) lab[i] = (int64_t)(unif(0, 1) * 10);
    runner old = {1, f64, &net, g1, params, x, lab, B}, mod = {2, f64, &m, g2, params, x, lab, B};
    runner twin = {1, f64, &net2, g2, params, x, lab, B};
    compare(name, threads, &old, control ? &twin : &mod, repeats);
    free(params); free(x); free(g1); free(g2); free(lab);
    dp_cnn_free(&net);
    dp_cnn_free(&net2);
    dp_model_free(&m);
}

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 41;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    only = argc > 3 ? argv[3] : NULL;
    if (repeats < 1) repeats = 1;
    if (repeats > MAX_REPEATS) repeats = MAX_REPEATS;
    printf("bench_model: loss_grad, ms per call, median of %d interleaved repeats; ratio = "
           "dp_model / old engine\n", repeats);
    printf("%-34s %3s %5s %9s %9s %7s %7s %7s %9s %9s %7s %7s\n", "case (old engine)", "thr",
           "steps", "old ms", "model ms", "ratio", "min", "med.r", "old cpu", "model cpu",
           "ratio", "med.r");
    const int mlp[] = {784, 256, 128, 10}, softreg[] = {784, 10}, logreg[] = {100, 1};
    for (int pass = 0; pass < 2; pass++) {
        int t = pass ? threads : 1;
        if (pass && threads == 1) break;
        bench_dense("mlp 784-256-128-10 f32 (dp_net)", mlp, 3, DP_LOSS_SOFTMAX_XENT, 128, 0, t, repeats, 0);
        bench_cnn("cnn cifar B=128 f32 (dp_cnn)", 0, t, repeats, 0);
        bench_dense("softmax reg 784-10 f32 (dp_net)", softreg, 1, DP_LOSS_SOFTMAX_XENT, 128, 0, t, repeats, 0);
        bench_dense("logistic 100-1 B=8192 f32 (dp_net)", logreg, 1, DP_LOSS_SIGMOID_BCE, 8192, 0, t, repeats, 0);
        bench_dense("mlp 784-256-128-10 f64 (dp_net)", mlp, 3, DP_LOSS_SOFTMAX_XENT, 128, 1, t, repeats, 0);
        bench_cnn("cnn cifar B=128 f64 (dp_cnn)", 1, t, repeats, 0);
        /* controls: the old engine against a second instance of itself */
        bench_dense("control: mlp f32 dp_net vs dp_net", mlp, 3, DP_LOSS_SOFTMAX_XENT, 128, 0, t, repeats, 1);
        bench_dense("control: mlp f64 dp_net vs dp_net", mlp, 3, DP_LOSS_SOFTMAX_XENT, 128, 1, t, repeats, 1);
        bench_cnn("control: cnn f32 dp_cnn vs dp_cnn", 0, t, repeats, 1);
    }
    printf("columns: old/model ms = median wall ms per call; ratio = their quotient; min = fastest "
           "model repeat / fastest old repeat; med.r = median of the per-pair quotients; then the "
           "same for the process's CPU ms per call (all threads)\n");
    return 0;
}
