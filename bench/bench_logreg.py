"""Logistic regression on 1,000,000 x 20 float64: dptrain against plain NumPy, one thread.

The workload: `dptrain.data.synthetic_binary(1_000_000, 20, seed=0, dtype=float64)`, 8 epochs
of mini-batch SGD, batch 8192 (the last batch of an epoch has 576 rows), lr 0.1, no momentum,
no shuffling: every batch is a contiguous slice of x, read in order, on both sides.

- dptrain: LogisticRegression + SGD; per batch `zero_grad(); loss_grad(xb, yb); step()`.
- NumPy: exactly the same mini-batch SGD, written the plain way: z = xb @ w + b, a stable
  sigmoid, g = (s - y) / B, w -= lr * xb^T g, b -= lr * sum(g). It also sums the loss, as
  dptrain's fused kernel does, so both do the same work (dptrain also counts correct
  predictions, which NumPy skips: that is extra work on our side only).

Both start from dptrain's initial weights; before timing, one run of each must end with the
same weights (rtol 1e-6) and the same last-epoch loss.

x starts on a cache line, as every data set dptrain builds does (dptrain/_aligned.py); both
sides read the same array.

Bandwidth: x is 160 MB, five times the 32 MB L3, so every epoch streams it from memory (each
batch, 1.3 MB, is then re-read from L2 for the gradient). Effective bandwidth =
n * d * 8 bytes * epochs / seconds, compared with this machine's one-thread read bandwidth
measured in the same run: the best of the medians of np.add.reduce and np.dot(a, a) (OpenBLAS
ddot, one stream) over a 400 MB float64 array.

NumPy's loop and np.dot(a, a) run on OpenBLAS (dgemv, ddot). They are timed in this process
(the targets' reference: the kernel this machine's environment gives OpenBLAS) and again in
a child process whose environment lacks OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (the "OB best"
column: OpenBLAS's own kernel for this CPU; the footer names both, as threadpoolctl does).

Targets: seconds ours / NumPy <= 0.5; effective bandwidth >= 80 % of the read bandwidth (issue
12's; the first version's was 60 %).

Run: python bench/bench_logreg.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import numpy as np  # noqa: E402

import dptrain  # noqa: E402
from dptrain.data import synthetic_binary  # noqa: E402

N, D = 1_000_000, 20
EPOCHS = 8
BATCH = 8192
LR = 0.1
TIME_TARGET = 0.5  # ours / NumPy seconds
BANDWIDTH_TARGET = 0.80  # ours effective GB/s / machine read GB/s
BW_ARRAY_BYTES = 400 * 10**6


def train_dptrain(x, y, *, epochs, batch, lr, cached=False):
    """dptrain's loop; returns (model, last epoch's loss sum). cached: every step takes the
    first batch (in cache), as many steps as the epochs have."""
    model = dptrain.LogisticRegression(x.shape[1], seed=0, dtype="float64", threads=1)
    opt = dptrain.SGD(model, lr=lr)
    n = len(x)
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for start in range(0, n, batch):
            model.zero_grad()
            s0 = 0 if cached else start
            batch_loss, _ = model.loss_grad(x[s0 : s0 + batch], y[s0 : s0 + batch])
            opt.step()
            loss_sum += batch_loss
    return model, loss_sum


def train_numpy(x, y_float, w0, b0, *, epochs, batch, lr, cached=False):
    """The same mini-batch SGD in plain NumPy; returns (w, b, last epoch's loss sum). cached:
    as train_dptrain's.

    y_float is the labels as float64, converted once outside the timed region (dptrain
    reads its int64 labels directly: both read 8 bytes per label).
    """
    w = w0.copy()
    b = float(b0)
    n = len(x)
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for start in range(0, n, batch):
            s0 = 0 if cached else start
            xb = x[s0 : s0 + batch]
            yb = y_float[s0 : s0 + batch]
            z = xb @ w
            z += b
            # Stable sigmoid and softplus from e = exp(-|z|) in (0, 1]: exp never overflows.
            e = np.exp(-np.abs(z))
            r = 1.0 / (1.0 + e)
            s = np.where(z >= 0.0, r, e * r)
            # The loss sum, as dptrain's sigmoid_bce returns it: softplus(z) - y z.
            loss_sum += float(np.sum(np.maximum(z, 0.0) + np.log1p(e) - yb * z))
            g = (s - yb) / len(xb)
            w -= lr * (xb.T @ g)
            b -= lr * float(g.sum())
    return w, b, loss_sum


def workload():
    """(x, y, y as float64, w0, b0): the data set and dptrain's initial weights."""
    ds = synthetic_binary(N, D, seed=0, dtype=np.float64)
    x, y = ds.x_train, ds.y_train
    assert x.flags.c_contiguous and x.dtype == np.float64 and x.shape == (N, D)
    init = dptrain.LogisticRegression(D, seed=0, dtype="float64")
    ((w0, b0),) = init.layers()
    return ds, x, y, y.astype(np.float64), w0[0].copy(), float(b0[0])  # W (1, D), b (1,)


def blas_best_helper(args, repeats):
    """--blas-best-helper mode (a child of main, OpenBLAS's forcing variables removed): the
    NumPy loop and np.dot(a, a), timed as main times them."""
    _, x, _, y_float, w0, b0 = workload()
    big = np.full(BW_ARRAY_BYTES // 8, 1.0)
    times = _util.interleaved(
        {
            "numpy": lambda: train_numpy(x, y_float, w0, b0, epochs=EPOCHS, batch=BATCH, lr=LR),
            "dot": lambda: np.dot(big, big),
        },
        repeats=repeats,
        number=1,
        warmup=1,
    )
    _util.write_helper_json(args.blas_best_helper, {"seconds": times})


def main(argv=None):
    args = _util.parse_args(
        "logistic regression epochs: dptrain vs NumPy, and bandwidth", argv=argv
    )
    repeats = 3 if args.quick else 5
    if args.blas_best_helper:
        return blas_best_helper(args, repeats)
    env = _util.environment()
    _util.print_environment(env)

    ds, x, y, y_float, w0, b0 = workload()

    # Same weights from the same SGD (this run is also the warm-up of both loops).
    model, loss_ours = train_dptrain(x, y, epochs=EPOCHS, batch=BATCH, lr=LR)
    w_np, b_np, loss_np = train_numpy(x, y_float, w0, b0, epochs=EPOCHS, batch=BATCH, lr=LR)
    ((w_ours, b_ours),) = model.layers()
    np.testing.assert_allclose(
        w_ours[0], w_np, rtol=1e-6, atol=1e-12, err_msg="final weights: dptrain vs NumPy"
    )
    np.testing.assert_allclose(
        b_ours[0], b_np, rtol=1e-6, atol=1e-12, err_msg="final bias: dptrain vs NumPy"
    )
    np.testing.assert_allclose(
        loss_ours, loss_np, rtol=1e-6, err_msg="last epoch's loss sum: dptrain vs NumPy"
    )
    max_rel = float(np.max(np.abs(w_ours[0] - w_np) / np.abs(w_np)))
    accuracy = model.evaluate(ds.x_test, ds.y_test)[1]

    big = np.full(BW_ARRAY_BYTES // 8, 1.0)  # written once: every page is touched
    fns = {
        "ours": lambda: train_dptrain(x, y, epochs=EPOCHS, batch=BATCH, lr=LR),
        "numpy": lambda: train_numpy(x, y_float, w0, b0, epochs=EPOCHS, batch=BATCH, lr=LR),
        "ours cached": lambda: train_dptrain(x, y, epochs=EPOCHS, batch=BATCH, lr=LR, cached=True),
        "numpy cached": lambda: train_numpy(
            x, y_float, w0, b0, epochs=EPOCHS, batch=BATCH, lr=LR, cached=True
        ),
        "add.reduce": lambda: np.add.reduce(big),
        "dot": lambda: np.dot(big, big),
    }
    times = _util.interleaved(fns, repeats=repeats, number=1, warmup=1)
    med = {k: _util.median(v) for k, v in times.items()}

    x_bytes = N * D * 8 * EPOCHS
    bw_reduce = BW_ARRAY_BYTES / med["add.reduce"] / 1e9
    bw_dot = BW_ARRAY_BYTES / med["dot"] / 1e9
    machine_bw = max(bw_reduce, bw_dot)
    bw_ours = x_bytes / med["ours"] / 1e9
    bw_numpy = x_bytes / med["numpy"] / 1e9
    time_ratio = med["ours"] / med["numpy"]
    bw_ratio = bw_ours / machine_bw

    big = None  # 400 MB released (the lambdas above hold the name): the child allocates its own
    best = _util.run_blas_best_child(__file__, ["--quick"] if args.quick else [])
    env["openblas_best"] = best["blas"]
    med_best = {k: _util.median(v) for k, v in best["seconds"].items()}
    bw_dot_best = BW_ARRAY_BYTES / med_best["dot"] / 1e9

    rows = [
        {
            "metric": f"seconds for {EPOCHS} epochs",
            "ours": med["ours"],
            "reference": med["numpy"],
            "reference_name": "numpy",
            "ratio": time_ratio,
            "target": TIME_TARGET,
            "met": _util.verdict(time_ratio, TIME_TARGET, False),
            "ours_seconds": times["ours"],
            "reference_seconds": times["numpy"],
            "reference_best": med_best["numpy"],
            "ratio_best": med["ours"] / med_best["numpy"],
            "reference_best_seconds": best["seconds"]["numpy"],
        },
        {
            "metric": "x read bandwidth GB/s",
            "ours": bw_ours,
            "reference": machine_bw,
            "reference_name": "machine read bandwidth (best of add.reduce, ddot)",
            "ratio": bw_ratio,
            "target": BANDWIDTH_TARGET,
            "met": _util.verdict(bw_ratio, BANDWIDTH_TARGET, True),
            "numpy_effective_gbs": bw_numpy,
            "add_reduce_gbs": bw_reduce,
            "ddot_gbs": bw_dot,
            "add_reduce_seconds": times["add.reduce"],
            "ddot_seconds": times["dot"],
            "ddot_best_gbs": bw_dot_best,
            "ddot_best_seconds": best["seconds"]["dot"],
        },
    ]
    print()
    _util.print_table(
        ["metric", "ours", "reference", "ratio", "target", "met", "OB best", "r. best", "noise"],
        [
            [
                rows[0]["metric"],
                f"{med['ours']:.3f}",
                f"{med['numpy']:.3f} (NumPy)",
                f"{time_ratio:.2f}",
                f"<= {TIME_TARGET:.2f}",
                rows[0]["met"],
                f"{med_best['numpy']:.3f} (NumPy)",
                f"{rows[0]['ratio_best']:.2f}",
                f"{100 * max(_util.spread(times['ours']), _util.spread(times['numpy'])):.0f}%",
            ],
            [
                rows[1]["metric"],
                f"{bw_ours:.1f}",
                f"{machine_bw:.1f} (machine)",
                f"{100 * bw_ratio:.0f}%",
                f">= {100 * BANDWIDTH_TARGET:.0f}%",
                rows[1]["met"],
                f"{bw_dot_best:.1f} (ddot)",
                f"{100 * bw_ours / bw_dot_best:.0f}%",
                f"{100 * max(_util.spread(times['add.reduce']), _util.spread(times['dot'])):.0f}%",
            ],
        ],
        align="lrrrrlrrr",
        title=f"Logistic regression, {N:,} x {D} float64, {EPOCHS} epochs, batch {BATCH}, "
        f"lr {LR}, 1 thread, median of {repeats} interleaved repeats",
    )
    print(
        f"read bandwidth over {BW_ARRAY_BYTES // 10**6} MB: np.add.reduce {bw_reduce:.1f} GB/s, "
        f"np.dot(a, a) {bw_dot:.1f} GB/s; NumPy's loop reads x at {bw_numpy:.1f} GB/s"
    )
    ns_row = {
        k: 1e9 * med[k] / (N * EPOCHS) for k in ("ours", "ours cached", "numpy", "numpy cached")
    }
    print(
        f"ns a row: ours {ns_row['ours']:.1f} streaming x, {ns_row['ours cached']:.1f} with "
        f"every step on the first batch (in cache: the kernel and the step's own cost), "
        f"NumPy {ns_row['numpy']:.1f} / {ns_row['numpy cached']:.1f}; x from memory alone "
        f"would take {1e9 * D * 8 / (machine_bw * 1e9):.1f}"
    )
    print(f"reference = NumPy in this process: {_util.describe_openblas(env)}")
    print(
        f"OB best = the NumPy loop and np.dot(a, a) in a child process without "
        f"{' / '.join(_util.OPENBLAS_FORCING_VARS)}: {_util.describe_openblas(best['blas'])}"
    )
    print(
        f"final weights agree (max relative difference {max_rel:.1e}); last-epoch mean loss "
        f"{loss_ours / N:.5f}; test accuracy {accuracy:.4f}"
    )
    _util.write_json(
        args.json,
        "logreg",
        env,
        {
            "n": N,
            "d": D,
            "epochs": EPOCHS,
            "batch": BATCH,
            "lr": LR,
            "repeats": repeats,
            "quick": args.quick,
            "bandwidth_array_bytes": BW_ARRAY_BYTES,
            "max_relative_weight_difference": max_rel,
            "last_epoch_loss_sum": {"ours": loss_ours, "numpy": loss_np},
            "test_accuracy": accuracy,
            "ns_per_row": ns_row,
            "cached_seconds": {"ours": times["ours cached"], "numpy": times["numpy cached"]},
        },
        rows,
    )
    return rows


if __name__ == "__main__":
    main()
