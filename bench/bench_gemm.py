"""GFLOP/s of dptrain's GEMM (`_core.gemm`) against NumPy's matmul (OpenBLAS), one thread.

Shapes are the ones training runs (B=128 batch, MLP 784-256-128-10):
- forward of a dense layer, y = x w^T: op(a) = x (B, IN), op(b) = w^T with w stored (OUT, IN)
  -> "NT" (trans_b);
- weight gradient, dW = dy^T x: a = dy stored (B, OUT), b = x (B, IN) -> "TN" (trans_a);
- input gradient, dX = dy w: a = dy (B, OUT), b = w (OUT, IN) -> "NN";
- a 3x3x3 convolution as im2col: patches (M pixels, K=27) times filters^T (N, 27) -> "NT";
- 1024^3 (no target: the large, square case a GEMM is usually tuned for);
- float32 only, no target: 120 x 256 x 320, one MC x KC block of A against 8 micro-panels of
  B, all of it in L2 (the operands 0.4 MB): the closest a whole GEMM call comes to the
  micro-kernel's own ceiling, against which the % of peak columns read;
- float64 only, no target: the two GEMV-like GEMMs of logistic regression on 20 features
  with batch 8192 (bench_logreg.py's workload), forward N=1 and weight gradient M=1, and the
  same two with rows of 2048 (2048 x 2048, 32 MB: from L3 or memory, the matrix-vector
  path's streaming).
M x N x K below is always C (M, N) = op(A) (M, K) op(B) (K, N); one GEMM is 2*M*N*K flop.

NumPy's side writes into a preallocated output, np.matmul(a, b.T, out=c), so neither side
allocates; the transposes are views, which NumPy hands to BLAS as transpose flags. Every
operand starts on a cache line (dptrain's aligned_empty), in both processes: OpenBLAS's
speed moves with where they start (10x128x128 TN on AMD EPYC (Zen 4): 75-76 GFLOP/s with B
on a line, 70-71 at 4 to 32 bytes past one; ours 96-99 either way), so NumPy's 16-byte
alignment would hand "OB here" and "OB best" different luck, and not OpenBLAS's best.
Both sides are called from Python, so the ~1 us call overhead is in both figures (it shows on
the smallest shapes, which is what a training step sees too).

Each result is checked against NumPy (elementwise, within the K * eps * |A||B| bound of
two float roundings) before it is timed; C is pre-filled with NaN to check that beta == 0
never reads it.

OpenBLAS is measured twice: "OB here", in this process, interleaved with ours, with the
kernel this machine's environment gives it (OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE may force an
older one: what users of the machine get, and what the targets compare with); and "OB best",
the same np.matmul calls timed the same way in a child process whose environment lacks those
two variables (OpenBLAS's own choice for this CPU; the header names both kernels, as
threadpoolctl reports them). % columns: of the measured FMA peaks (bench/_util.peaks).

Run: python bench/bench_gemm.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import numpy as np  # noqa: E402

from dptrain import _core  # noqa: E402
from dptrain._aligned import aligned_empty  # noqa: E402

MLP_TARGET = 0.9  # ours / OpenBLAS on the MLP's large shapes (issue 12's; was 0.85)
SKINNY_TARGET = 1.3  # ours / OpenBLAS where one dimension is tiny (N=10 classes, K=27 im2col)

# (case, M, N, K, trans_a, trans_b, target); the ratio target is ours / OpenBLAS GFLOP/s.
SHAPES_F32 = [
    ("fwd  L1 x w^T", 128, 256, 784, False, True, MLP_TARGET),
    ("fwd  L2 x w^T", 128, 128, 256, False, True, MLP_TARGET),
    ("fwd  L3 x w^T (N=10)", 128, 10, 128, False, True, SKINNY_TARGET),
    ("dW   L1 dy^T x", 256, 784, 128, True, False, MLP_TARGET),
    ("dW   L2 dy^T x", 128, 256, 128, True, False, MLP_TARGET),
    ("dW   L3 dy^T x (M=10)", 10, 128, 128, True, False, SKINNY_TARGET),
    ("dX   L1 dy w (unused*)", 128, 784, 256, False, False, MLP_TARGET),
    ("dX   L2 dy w", 128, 256, 128, False, False, MLP_TARGET),
    ("dX   L3 dy w (K=10)", 128, 128, 10, False, False, SKINNY_TARGET),
    ("conv im2col 16 filt", 1024, 16, 27, False, True, SKINNY_TARGET),
    ("conv im2col 32 filt", 1024, 32, 27, False, True, SKINNY_TARGET),
    ("square 1024^3", 1024, 1024, 1024, False, False, None),
    ("in cache 120x256x320", 120, 256, 320, False, False, None),
]
SHAPES_F64 = [
    ("fwd  L1 x w^T", 128, 256, 784, False, True, MLP_TARGET),
    ("dW   L1 dy^T x", 256, 784, 128, True, False, MLP_TARGET),
    ("conv im2col 32 filt", 1024, 32, 27, False, True, SKINNY_TARGET),
    ("square 1024^3", 1024, 1024, 1024, False, False, None),
    ("logreg fwd x w^T (N=1)", 8192, 1, 20, False, True, None),
    ("logreg dW dz^T x (M=1)", 1, 20, 8192, True, False, None),
    ("X v, long rows (N=1)", 2048, 1, 2048, False, True, None),
    ("v^T X, long rows (M=1)", 1, 2048, 2048, True, False, None),
]


def make_operands(m, n, k, trans_a, trans_b, dtype, rng):
    """a, b as stored (transposed storage where trans_*), and their op() views."""
    a = aligned_copy(rng.uniform(-1.0, 1.0, size=(k, m) if trans_a else (m, k)), dtype)
    b = aligned_copy(rng.uniform(-1.0, 1.0, size=(n, k) if trans_b else (k, n)), dtype)
    return a, b, (a.T if trans_a else a), (b.T if trans_b else b)


def aligned_copy(values, dtype):
    """values as dtype, in an array that starts on a cache line"""
    out = aligned_empty(values.shape, dtype)
    out[...] = values
    return out


def check(case, dtype, ours, ref, op_a, op_b, k):
    """ours == ref within the bound of two differently-ordered float sums, elementwise."""
    eps = np.finfo(dtype).eps
    bound = 2.0 * k * eps * (np.abs(op_a).astype(np.float64) @ np.abs(op_b).astype(np.float64))
    err = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    if not np.all(np.isfinite(ours)) or np.any(err > bound + np.finfo(dtype).tiny):
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(
            f"gemm {case} {dtype.__name__}: ours differs from np.matmul at "
            f"{worst}: {ours[worst]!r} vs {ref[worst]!r} (bound {bound[worst]:.3g})"
        )


def bench_shape(case, m, n, k, trans_a, trans_b, target, dtype, ctx, rng, *, repeats, seconds):
    a, b, op_a, op_b = make_operands(m, n, k, trans_a, trans_b, dtype, rng)
    c_ours = aligned_empty((m, n), dtype)
    c_ours[...] = np.nan  # beta == 0 must not read it
    c_blas = aligned_empty((m, n), dtype)
    gemm = _core.gemm

    def ours():
        gemm(a, b, c_ours, trans_a=trans_a, trans_b=trans_b, ctx=ctx)

    def blas():
        np.matmul(op_a, op_b, out=c_blas)

    ours()
    blas()
    check(case, dtype, c_ours, c_blas, op_a, op_b, k)

    number = calibrate_both(ours, blas, seconds)
    times = _util.interleaved(
        {"ours": ours, "blas": blas}, repeats=repeats, number=number, warmup=max(3, number // 10)
    )
    flop = 2.0 * m * n * k
    gf_ours = flop / _util.median(times["ours"]) / 1e9
    gf_blas = flop / _util.median(times["blas"]) / 1e9
    ratio = gf_ours / gf_blas
    dname = np.dtype(dtype).name
    variant = ("T" if trans_a else "N") + ("T" if trans_b else "N")
    return {
        "case": case,
        "m": m,
        "n": n,
        "k": k,
        "trans_a": trans_a,
        "trans_b": trans_b,
        "variant": variant,
        "dtype": dname,
        "calls_per_repeat": number,
        "repeats": repeats,
        "ours_gflops": gf_ours,
        "openblas_gflops": gf_blas,
        "ratio": ratio,
        "target": target,
        "met": _util.verdict(ratio, target, True),
        "ours_pct_peaks": _util.pct_of_peaks(gf_ours, dname),
        "openblas_pct_peaks": _util.pct_of_peaks(gf_blas, dname),
        "ours_spread": _util.spread(times["ours"]),
        "openblas_spread": _util.spread(times["blas"]),
        "ours_seconds": times["ours"],
        "openblas_seconds": times["blas"],
    }


def blas_best_helper(args, repeats, seconds):
    """--blas-best-helper mode (a child of main, OpenBLAS's forcing variables removed): times
    np.matmul on every shape exactly as main times it, writes {case, dtype: GFLOP/s}."""
    rng = np.random.default_rng(0)
    rows = []
    for dtype, shapes in ((np.float32, SHAPES_F32), (np.float64, SHAPES_F64)):
        for case, m, n, k, trans_a, trans_b, _ in shapes:
            _, _, op_a, op_b = make_operands(m, n, k, trans_a, trans_b, dtype, rng)
            c = aligned_empty((m, n), dtype)

            def blas():
                np.matmul(op_a, op_b, out=c)

            number = _util.calibrate(blas, seconds)
            t = _util.interleaved(
                {"blas": blas}, repeats=repeats, number=number, warmup=max(3, number // 10)
            )["blas"]
            rows.append(
                {
                    "case": case,
                    "dtype": np.dtype(dtype).name,
                    "gflops": 2.0 * m * n * k / _util.median(t) / 1e9,
                    "spread": _util.spread(t),
                    "seconds": t,
                }
            )
    _util.write_helper_json(args.blas_best_helper, {"rows": rows})


def calibrate_both(ours, blas, seconds):
    """One call count for both sides, sized on the slower one."""
    return min(_util.calibrate(ours, seconds), _util.calibrate(blas, seconds))


def call_overhead(ctx, *, repeats, seconds):
    """Microseconds per call of a 1x1x1 GEMM: the fixed cost every small shape pays."""
    a = np.ones((1, 1), np.float32)
    c_ours, c_blas = np.empty((1, 1), np.float32), np.empty((1, 1), np.float32)
    gemm = _core.gemm

    def ours():
        gemm(a, a, c_ours, trans_a=False, trans_b=True, ctx=ctx)

    def blas():
        np.matmul(a, a.T, out=c_blas)

    number = calibrate_both(ours, blas, seconds)
    t = _util.interleaved({"ours": ours, "numpy": blas}, repeats=repeats, number=number, warmup=100)
    return {k + "_us": 1e6 * _util.median(v) for k, v in t.items()}


def main(argv=None):
    args = _util.parse_args("GFLOP/s of _core.gemm vs NumPy/OpenBLAS matmul, one thread", argv=argv)
    repeats, seconds = (3, 0.02) if args.quick else (9, 0.1)
    if args.blas_best_helper:
        return blas_best_helper(args, repeats, seconds)
    env = _util.environment()
    _util.print_environment(env)
    ctx = _core.Context(threads=1)
    rng = np.random.default_rng(0)

    overhead = call_overhead(ctx, repeats=repeats, seconds=seconds)
    rows = []
    for dtype, shapes in ((np.float32, SHAPES_F32), (np.float64, SHAPES_F64)):
        for case, m, n, k, ta, tb, target in shapes:
            rows.append(
                bench_shape(
                    case, m, n, k, ta, tb, target, dtype, ctx, rng, repeats=repeats, seconds=seconds
                )
            )

    best = _util.run_blas_best_child(__file__, ["--quick"] if args.quick else [])
    best_gf = {(b["case"], b["dtype"]): b for b in best["rows"]}
    for r in rows:
        b = best_gf[(r["case"], r["dtype"])]
        r["openblas_best_gflops"] = b["gflops"]
        r["openblas_best_spread"] = b["spread"]
        r["openblas_best_seconds"] = b["seconds"]
        r["ratio_best"] = r["ours_gflops"] / b["gflops"]
        r["openblas_best_pct_peaks"] = _util.pct_of_peaks(b["gflops"], r["dtype"])
    env["openblas_best"] = best["blas"]

    pct_labels = [label for label, _ in _util.peak_columns()]
    wide = pct_labels[0]
    table = []
    for r in rows:
        spread = max(r["ours_spread"], r["openblas_spread"], r["openblas_best_spread"])
        table.append(
            [
                r["case"],
                f"{r['m']}x{r['n']}x{r['k']}",
                f"{r['variant']} f{r['dtype'][5:]}",
                f"{r['ours_gflops']:.1f}",
                f"{r['openblas_gflops']:.1f}",
                f"{r['openblas_best_gflops']:.1f}",
                f"{r['ratio']:.2f}",
                "-" if r["target"] is None else f">= {r['target']:.2f}",
                r["met"],
                f"{r['ratio_best']:.2f}",
                *[f"{r['ours_pct_peaks'][label]:.0f}%" for label in pct_labels],
                f"{r['openblas_best_pct_peaks'][wide]:.0f}%",
                f"{100 * spread:.0f}%",
            ]
        )
    print()
    _util.print_table(
        [
            "case",
            "MxNxK",
            "variant",
            "ours GF/s",
            "OB here",
            "OB best",
            "ratio",
            "target",
            "met",
            "r. best",
            *[f"ours {label}" for label in pct_labels],
            f"best {wide}",
            "noise",
        ],
        table,
        align="llrrrrrrlr" + "r" * (len(pct_labels) + 2),
        title=f"GEMM, 1 thread, median of {repeats} interleaved repeats "
        f"(ratio = ours / OB here, the target's; r. best = ours / OB best)",
    )
    print(f"OB here = np.matmul in this process: {_util.describe_openblas(env)}")
    print(
        f"OB best = np.matmul in a child process without "
        f"{' / '.join(_util.OPENBLAS_FORCING_VARS)}: {_util.describe_openblas(best['blas'])}"
    )
    print(_util.peak_legend(("float32", "float64")))
    print(
        "* dX of layer 1 is not computed in training (the input needs no gradient); "
        "noise = largest (max - min) / median of the three sides' repeats"
    )
    print(
        f"per-call overhead (a 1x1x1 float32 GEMM): ours {overhead['ours_us']:.2f} us, "
        f"np.matmul {overhead['numpy_us']:.2f} us"
    )
    missed = [r for r in rows if r["met"] == "NO"]
    print(
        f"targets met: {sum(r['met'] == 'yes' for r in rows)} of "
        f"{sum(r['target'] is not None for r in rows)}"
        + (
            ""
            if not missed
            else "; missed: "
            + ", ".join(f"{r['case'].strip()} {r['dtype']} ({r['ratio']:.2f})" for r in missed)
        )
    )
    _util.write_json(
        args.json,
        "gemm",
        env,
        {
            "repeats": repeats,
            "seconds_per_repeat": seconds,
            "quick": args.quick,
            "call_overhead_us": overhead,
        },
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
