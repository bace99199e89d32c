/* bench_model.c - dp_model (the one network engine) on the studies' models: milliseconds per
 * loss_grad call and the GFLOP/s of its GEMM and conv work, at 1 thread and at N, in one process.
 *
 * Cases (B the batch): the MLP 784-256-128-10 (ReLU) B=128 in float32 and float64; the studies'
 * CNN [conv(3->32, 3x3) ReLU pool conv(32->64, 3x3) ReLU pool flatten dense 128 ReLU dense 10]
 * on 3x32x32 B=128 in float32 and float64; softmax regression 784->10 B=128 float32; logistic
 * regression (IN=100, one output, sigmoid BCE: the fused dp_logistic_grad path) B=8192 float32.
 *
 * Method: each row times two models, A and B, on the same parameters, batch and labels (each
 * accumulating into its own gradient): a warm-up call each, then the step count that takes A
 * about 20 ms; then `repeats` repeats, each timing `steps` calls of one model and then of the
 * other (which goes first alternates; short blocks, so that both of a pair see the same load on
 * a shared machine). A case row is the model at 1 thread (A) against the same model at N
 * threads (B); a control row is a model against a second instance of itself (A and B at the
 * same thread count): its B/A is the harness's noise floor (load, where the buffers landed).
 *
 * Reported per model: the median repeat's wall ms per call, the spread of the repeats (the
 * interquartile range as a percentage of the median), GFLOP/s (the flops below over the median
 * time), and the median repeat's process CPU ms per call (all threads; on a shared machine it
 * leaves out the waits for a core, and with several threads it counts the pool's spinning);
 * per row, B/A = the median of the per-pair quotients of wall time (the most robust to a busy
 * machine; on a case row, 1 / the speedup from threads). Gradients accumulate across calls as
 * in a training loop without zero_grad (the work per call does not depend on the values).
 *
 * Flops: 2 per multiply-add of the GEMMs and convolutions of one loss_grad call: forward
 * Y = X W^T, backward dW = dY^T X and dX = dY W, no dX for the first parameterized layer (the
 * engine computes none); a conv counts the block of its output that is computed (a fused pool
 * reads 2 (OH/2) x 2 (OW/2) of it). Bias, activations, pooling and the loss are left out: they
 * are memory-bound and small next to the GEMMs, except in the logistic case (a GEMV).
 *
 * Build and run: make -C csrc/tests bench && csrc/tests/build/bench_model [repeats] [threads]
 * [only: a substring of the case names to run]
 * A benchmark, not a test: nothing here fails.
 */
#define _POSIX_C_SOURCE 199309L
#include "dp_model.h"

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

/* One model's loss_grad on fixed buffers. */
typedef struct {
    dp_model *model;
    int f64;
    void *grads, *params, *x;
    int64_t *labels;
    int B;
} runner;

static int run_once(runner *r)
{
    double loss;
    int64_t correct;
    double gs = 1.0 / r->B;
    if (r->f64)
        return dp_model_loss_grad_f64(r->model, r->grads, &loss, &correct, r->params, r->x,
                                      r->labels, NULL, r->B, gs);
    return dp_model_loss_grad_f32(r->model, r->grads, &loss, &correct, r->params, r->x, r->labels,
                                  NULL, r->B, (float)gs);
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

/* The q-quantile of v[0..n) (sorts v in place): the element at rank q (n - 1), rounded. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[(int)(q * (n - 1) + 0.5)];
}

/* 2 x the multiply-adds of one loss_grad call's GEMMs and convolutions (see the banner). */
static double loss_grad_flops(const dp_plan *p, int B)
{
    double f = 0;
    for (int k = 0; k < p->n_param_layers; k++) {
        const dp_stage *st = &p->stage[p->param_stage[k]];
        double macs = st->op == DP_STAGE_DENSE ? (double)st->in_width * st->out_width
                                               : (double)st->g.OC * st->g.C * st->g.KH * st->g.KW *
                                                     st->conv_h * st->conv_w;
        f += 2.0 * B * macs * (k ? 3 : 2); /* forward, dW, and dX after the first layer */
    }
    return f;
}

/* Only the rows whose name contains this (argv[3]); NULL: all. */
static const char *only;

/* Times A and B interleaved; prints one row. */
static void time_pair(const char *name, runner *a, runner *b, int repeats)
{
    time_steps(a, 1, NULL);
    time_steps(b, 1, NULL);
    double once[3];
    for (int k = 0; k < 3; k++) once[k] = time_steps(a, 1, NULL);
    double one = quantile(once, 3, 0.5);
    int steps = one > 0 ? (int)(0.02 / one) : 100;
    if (steps < 1) steps = 1;
    if (steps > 2000) steps = 2000;
    double t[2][MAX_REPEATS], cpu[2][MAX_REPEATS], quot[MAX_REPEATS];
    runner *r[2] = {a, b};
    for (int k = 0; k < repeats; k++) {
        for (int j = 0; j < 2; j++) {
            int w = k % 2 ? 1 - j : j;
            t[w][k] = time_steps(r[w], steps, &cpu[w][k]);
        }
        quot[k] = t[1][k] / t[0][k];
    }
    printf("%-30s %5d", name, steps);
    for (int w = 0; w < 2; w++) {
        double med = quantile(t[w], repeats, 0.5);
        double iqr = quantile(t[w], repeats, 0.75) - quantile(t[w], repeats, 0.25);
        double flops = loss_grad_flops(&r[w]->model->plan, r[w]->B);
        printf(" | %2d %8.3f %5.1f %7.2f", r[w]->model->threads, 1e3 * med, 100 * iqr / med,
               1e-9 * flops / med);
    }
    printf(" | %6.3f | %8.3f %8.3f\n", quantile(quot, repeats, 0.5),
           1e3 * quantile(cpu[0], repeats, 0.5), 1e3 * quantile(cpu[1], repeats, 0.5));
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
        if (f64)
            ((double *)p)[i] = unif(lo, hi);
        else
            ((float *)p)[i] = (float)unif(lo, hi);
    }
    return p;
}

/* A layer list on its input shape, with its loss and batch size */
typedef struct {
    dp_layer l[10];
    int n, ndim, shape[3];
    dp_loss loss;
    int B;
} model_case;

/* One row: the case's model at threads_a (A) and at threads_b (B), two instances. */
static void bench_pair(const char *row, const model_case *c, int f64, int threads_a, int threads_b,
                       int repeats)
{
    if (only && !strstr(row, only)) return;
    dp_model ma, mb;
    if (dp_model_init(&ma, c->l, c->n, c->shape, c->ndim, c->loss, threads_a) ||
        dp_model_init(&mb, c->l, c->n, c->shape, c->ndim, c->loss, threads_b)) {
        fprintf(stderr, "bench_model: init failed for %s\n", row);
        exit(1);
    }
    const dp_plan *p = &ma.plan;
    int classes = c->loss == DP_LOSS_SIGMOID_BCE ? 2 : p->out_width;
    void *params = buf(f64, p->n_params, -0.05, 0.05);
    void *x = buf(f64, (ptrdiff_t)c->B * p->in_width, -1, 1);
    void *ga = buf(f64, p->n_params, 0, 0), *gb = buf(f64, p->n_params, 0, 0);
    int64_t *lab = calloc((size_t)c->B, sizeof(int64_t));
    if (!lab) {
        fprintf(stderr, "bench_model: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < c->B; i++) lab[i] = (int64_t)(unif(0, 1) * classes);
    runner a = {&ma, f64, ga, params, x, lab, c->B}, b = {&mb, f64, gb, params, x, lab, c->B};
    time_pair(row, &a, &b, repeats);
    free(params);
    free(x);
    free(ga);
    free(gb);
    free(lab);
    dp_model_free(&ma);
    dp_model_free(&mb);
}

#define DENSE(n) {DP_LAYER_DENSE, (n), 0, 0, 1, 0.0}
#define CONV(oc, k, p) {DP_LAYER_CONV, (oc), (k), (p), 1, 0.0}
#define POOL {DP_LAYER_MAXPOOL2, 0, 0, 0, 1, 0.0}
#define RELU {DP_LAYER_RELU, 0, 0, 0, 1, 0.0}
#define FLAT {DP_LAYER_FLATTEN, 0, 0, 0, 1, 0.0}

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 41;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    only = argc > 3 ? argv[3] : NULL;
    if (repeats < 1) repeats = 1;
    if (repeats > MAX_REPEATS) repeats = MAX_REPEATS;
    if (threads < 1) threads = 1;
    if (threads > DP_MAX_THREADS) threads = DP_MAX_THREADS;
    const model_case mlp = {
        {DENSE(256), RELU, DENSE(128), RELU, DENSE(10)}, 5, 1, {784}, DP_LOSS_SOFTMAX_XENT, 128};
    const model_case cnn = {
        {CONV(32, 3, 0), RELU, POOL, CONV(64, 3, 0), RELU, POOL, FLAT, DENSE(128), RELU, DENSE(10)},
        10,
        3,
        {3, 32, 32},
        DP_LOSS_SOFTMAX_XENT,
        128};
    const model_case softreg = {{DENSE(10)}, 1, 1, {784}, DP_LOSS_SOFTMAX_XENT, 128};
    const model_case logreg = {{DENSE(1)}, 1, 1, {100}, DP_LOSS_SIGMOID_BCE, 8192};

    printf("bench_model: dp_model loss_grad, median of %d interleaved repeats; A = 1 thread, "
           "B = %d threads (control rows: B is a second instance of A)\n",
           repeats, threads);
    printf("%-30s %5s | %2s %8s %5s %7s | %2s %8s %5s %7s | %6s | %8s %8s\n", "case", "steps", "A",
           "ms", "iqr%", "GFLOP/s", "B", "ms", "iqr%", "GFLOP/s", "B/A", "A cpu ms", "B cpu ms");
    bench_pair("mlp 784-256-128-10 f32", &mlp, 0, 1, threads, repeats);
    bench_pair("cnn (3,32,32) B=128 f32", &cnn, 0, 1, threads, repeats);
    bench_pair("softmax reg 784-10 f32", &softreg, 0, 1, threads, repeats);
    bench_pair("logistic 100-1 B=8192 f32", &logreg, 0, 1, threads, repeats);
    bench_pair("mlp 784-256-128-10 f64", &mlp, 1, 1, threads, repeats);
    bench_pair("cnn (3,32,32) B=128 f64", &cnn, 1, 1, threads, repeats);
    /* controls: a model against a second instance of itself */
    for (int pass = 0; pass < 2; pass++) {
        int t = pass ? threads : 1;
        if (pass && threads == 1) break;
        bench_pair(t == 1 ? "control: mlp f32 1 thread" : "control: mlp f32 N threads", &mlp, 0, t,
                   t, repeats);
        bench_pair(t == 1 ? "control: mlp f64 1 thread" : "control: mlp f64 N threads", &mlp, 1, t,
                   t, repeats);
        bench_pair(t == 1 ? "control: cnn f32 1 thread" : "control: cnn f32 N threads", &cnn, 0, t,
                   t, repeats);
    }
    printf(
        "columns: per model its threads, the median wall ms per call, the interquartile range of "
        "the repeats in %% of the median, GFLOP/s of its GEMM/conv work at the median; B/A = "
        "median of the per-pair quotients of wall time; the median process CPU ms per call of "
        "each (all threads)\n");
    return 0;
}
