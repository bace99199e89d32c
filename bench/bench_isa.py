"""Each kernel on each ISA build this CPU has, side by side from one run, one thread.

The C core holds a generic, an AVX2+FMA and an AVX-512 build of the GEMM and of every vector
kernel (csrc/dp_vec.h); `_core.set_isa` picks the build for the calls that follow. Here every
kernel below is timed on every build the CPU has, interleaved (generic, avx2, ..., then in
reverse order the next repeat), and compared:
- GEMM (float32 unless named): the MLP 784-256-128-10's shapes at batch 128 (forward NT,
  weight gradient TN, input gradient NN), a skinny output layer (N = 10), the 3x3x3 conv as
  im2col (K = 27), the forward in float64; GFLOP/s and % of the FMA peak of THAT ISA, measured
  here (`_core.fma_peak`), so each build is held to its own vector width;
- conv2d_forward (im2col + GEMM) of the CIFAR CNN's first layer, batch 128;
- vector kernels on 2**20 float32 values (4 MiB: in L2/L3, so they show the instruction
  set rather than DRAM): relu_forward, sgd_step (momentum 0.9), sum_buffers of 2 inputs,
  maxpool2_forward (128 x 32 x 32 x 32), softmax_xent (8192 x 10); GB/s of the bytes each
  must read and write.
A build the CPU lacks is a column of "-" (named in the header); `speedup` is the widest
build's against generic. Each result is first checked against the generic build's.

Run: python bench/bench_isa.py [--quick] [--json PATH]
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import numpy as np  # noqa: E402

from dptrain import _core  # noqa: E402

ISAS = ("generic", "avx2", "avx512")
F32, F64 = np.float32, np.float64


def gemm_case(rng, m, n, k, trans, dtype):
    """(fn, flop, result): C (m, n) = op(A) op(B) as a training step calls it."""
    ta, tb = trans[0] == "T", trans[1] == "T"
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    c = np.empty((m, n), dtype)

    def fn():
        _core.gemm(a, b, c, trans_a=ta, trans_b=tb)

    return fn, 2.0 * m * n * k, lambda: c.copy()


def vector_cases(rng, n):
    """[(name, shape label, fn, bytes moved, result)]"""
    x = rng.standard_normal(n).astype(F32)
    y = np.empty_like(x)
    p, v, g = (rng.standard_normal(n).astype(F32) for _ in range(3))
    ins = [rng.standard_normal(n).astype(F32) for _ in range(2)]
    out = np.empty(n, F32)
    img = rng.standard_normal((128, 32, 32, 32)).astype(F32)
    pooled = np.empty((128, 32, 16, 16), F32)
    idx = np.empty((128, 32, 16, 16), np.uint8)
    logits = rng.standard_normal((8192, 10)).astype(F32)
    labels = rng.integers(0, 10, 8192)
    dlogits = np.empty_like(logits)
    p0, v0 = p.copy(), v.copy()

    def sgd():
        p[:] = p0  # the same step each call (a copy: 8 MiB more traffic, on every build)
        v[:] = v0
        _core.sgd_step(p, g, v, lr=0.01, momentum=0.9)

    return [
        ("relu_forward", f"{n:,}", lambda: _core.relu_forward(x, y), 8 * n, lambda: y.copy()),
        ("sgd_step (+2 copies)", f"{n:,}", sgd, 5 * 4 * n + 16 * n, lambda: p.copy()),
        (
            "sum_buffers k=2",
            f"{n:,}",
            lambda: _core.sum_buffers(out, ins),
            12 * n,
            lambda: out.copy(),
        ),
        (
            "maxpool2_forward",
            "128x32x32x32",
            lambda: _core.maxpool2_forward(img, pooled, idx),
            img.nbytes + pooled.nbytes + idx.nbytes,
            lambda: pooled.copy(),
        ),
        (
            "softmax_xent",
            "8192x10",
            lambda: _core.softmax_xent(logits, labels, dlogits),
            2 * logits.nbytes + labels.nbytes,
            lambda: dlogits.copy(),
        ),
    ]


def main(argv=None):
    args = _util.parse_args("every kernel on every ISA build this CPU has, one thread", argv=argv)
    have = _core.build_info()["isas_available"]
    repeats = 3 if args.quick else 9
    target_s = 0.01 if args.quick else 0.03
    env = _util.environment(isas_available=have)
    _util.print_environment(env)
    peaks = {isa: _core.fma_peak(isa, "float32", _util.PEAK_SECONDS) for isa in have}
    peaks64 = {isa: _core.fma_peak(isa, "float64", _util.PEAK_SECONDS) for isa in have}
    print(
        "# ISA builds on this CPU: "
        + ", ".join(have)
        + "".join(f"; {i}: not on this CPU" for i in ISAS if i not in have)
    )
    print(
        "# FMA peak of each, one thread, measured: "
        + ", ".join(f"{i} {peaks[i]:.1f} GFLOP/s float32 ({peaks64[i]:.1f} float64)" for i in have)
    )
    rng = np.random.default_rng(0)
    previous = _core.isa()
    rows, records = [], []
    cases = []
    for m, n, k, trans, dtype, label in (
        (128, 256, 784, "NT", F32, "gemm fwd 784->256"),
        (256, 784, 128, "TN", F32, "gemm dW 256x784"),
        (128, 784, 256, "NN", F32, "gemm dX 256->784"),
        (128, 10, 128, "NT", F32, "gemm out layer N=10"),
        (6272, 32, 27, "NT", F32, "gemm conv im2col K=27"),
        (128, 256, 784, "NT", F64, "gemm fwd 784->256 f64"),
    ):
        fn, flop, result = gemm_case(rng, m, n, k, trans, dtype)
        cases.append((label, f"{m}x{n}x{k} {trans}", fn, ("flop", flop, dtype), result))
    x = rng.standard_normal((128, 3, 32, 32)).astype(F32)
    w = rng.standard_normal((32, 3, 3, 3)).astype(F32)
    bias = rng.standard_normal(32).astype(F32)
    yconv = np.empty((128, 32, 32, 32), F32)
    cases.append(
        (
            "conv2d_forward 3->32 3x3",
            "B=128 32x32 pad 1",
            lambda: _core.conv2d_forward(x, w, bias, yconv, padding=1),
            ("flop", 2.0 * 128 * 32 * 32 * 32 * 27, F32),
            lambda: yconv.copy(),
        )
    )
    for name, shape, fn, nbytes, result in vector_cases(rng, 1 << 20):
        cases.append((name, shape, fn, ("bytes", nbytes, F32), result))
    try:
        for name, shape, fn, (unit, amount, dtype), result in cases:
            # the builds agree first (FMA contraction differs from generic: a few ulps)
            outs = {}
            for isa in have:
                _core.set_isa(isa)
                fn()
                outs[isa] = result()
            for isa in have:
                ref = outs["generic"]
                tol = 1e-3 if dtype == F32 else 1e-9
                err = np.max(np.abs(outs[isa] - ref)) / max(1.0, float(np.max(np.abs(ref))))
                assert err <= tol, f"{name} on {isa} differs from generic by {err:.3g}"
            _core.set_isa(have[-1])
            number = _util.calibrate(fn, target_s)
            fns = {isa: fn for isa in have}
            times = _util.interleaved(
                fns, repeats=repeats, number=number, setup=lambda isa: _core.set_isa(isa)
            )
            med = {isa: _util.median(times[isa]) for isa in have}
            row = [name, shape]
            rec = {"kernel": name, "shape": shape, "unit": unit}
            for isa in ISAS:
                if isa not in have:
                    row.append("-")
                    continue
                rate = amount / med[isa] / 1e9
                if unit == "flop":
                    peak = (peaks if dtype == F32 else peaks64)[isa]
                    row.append(
                        f"{med[isa] * 1e6:9.1f} us {rate:6.1f} GF/s ({100 * rate / peak:3.0f}%)"
                    )
                else:
                    row.append(f"{med[isa] * 1e6:9.1f} us {rate:6.1f} GB/s")
                rec[isa] = {"seconds": med[isa], "rate": rate}
            speedup = med["generic"] / med[have[-1]]
            noise = max(_util.spread(times[isa]) for isa in have)
            row += [f"{speedup:.2f}", f"{100 * noise:.0f}%"]
            rec.update(speedup=speedup, noise=noise)
            rows.append(row)
            records.append(rec)
    finally:
        _core.set_isa(previous)
    _util.print_table(
        ["kernel", "shape"] + [f"{isa}" for isa in ISAS] + [f"speedup {have[-1]}/generic", "noise"],
        rows,
        title=f"Kernels on each ISA build, 1 thread, median of {repeats} interleaved repeats "
        f"(% = of that ISA's own FMA peak)",
    )
    print(
        "GF/s: GEMM flop (2 M N K; conv: its im2col GEMM); GB/s: the bytes the kernel must read "
        "and write; noise = largest (max - min) / median"
    )
    _util.write_json(
        args.json,
        "isa",
        env,
        {"repeats": repeats, "peaks_f32": peaks, "peaks_f64": peaks64},
        records,
    )


if __name__ == "__main__":
    main()
