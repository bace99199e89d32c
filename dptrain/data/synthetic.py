"""Synthetic workloads: deterministic, learnable stand-ins with known shapes.

`synthetic_binary` (the logistic-regression workload), `synthetic_classification` (MNIST's
shapes) and `synthetic_cifar10` (CIFAR-10's shapes and spatial structure). Every function is
deterministic given its arguments, so all ranks draw identical arrays.
"""

from __future__ import annotations

import math

import numpy as np

from .._aligned import aligned_empty
from .cifar10 import (
    CIFAR10_CLASSES,
    CIFAR10_FEATURES,
    CIFAR10_SHAPE,
    CIFAR10_TEST_SIZE,
    CIFAR10_TRAIN_SIZE,
)
from .dataset import Dataset, _check_count, _float_dtype

_CHUNK_ROWS = 16_384  # rows per chunk: bounds temporaries to a few MiB whatever n is


def synthetic_binary(
    n: int, d: int, *, seed: int = 0, n_test: int | None = None, dtype=np.float64
) -> Dataset:
    """The logistic-regression workload: x ~ N(0, 1) of shape (n, d), y = 1[x . w* > 0].

    w* ~ N(0, 1) of shape (d,) is drawn first (returned as `true_weights`, float64); train
    and test come from independent streams of one SeedSequence(seed), so the training set
    does not depend on n_test (default max(1000, n // 10)). x is drawn directly in `dtype`
    (no float64 copy when float32 is asked for); labels are computed from the stored x with
    float64 dot products, chunk by chunk, so they agree exactly with the returned data.
    """
    n = _check_count(n, "n")
    d = _check_count(d, "d")
    n_test = max(1000, n // 10) if n_test is None else _check_count(n_test, "n_test")
    dt = _float_dtype(dtype)
    w_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    w = np.random.default_rng(w_seq).standard_normal(d)

    def draw(count: int, seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seq)
        x = aligned_empty((count, d), dt)
        rng.standard_normal(out=x, dtype=dt)  # fills in place, in the final dtype
        y = np.empty(count, dtype=np.int64)
        for start in range(0, count, _CHUNK_ROWS):
            stop = min(start + _CHUNK_ROWS, count)
            margin = x[start:stop].astype(np.float64) @ w
            np.greater(margin, 0.0, out=y[start:stop], casting="unsafe")
        return x, y

    x_train, y_train = draw(n, train_seq)
    x_test, y_test = draw(n_test, test_seq)
    return Dataset(
        x_train,
        y_train,
        x_test,
        y_test,
        name="synthetic",
        n_classes=2,
        source=f"synthetic_binary(n={n}, d={d}, seed={seed})",
        true_weights=w,
    )


def synthetic_classification(
    n_train: int,
    n_features: int = 784,
    n_classes: int = 10,
    seed: int = 0,
    *,
    n_test: int | None = None,
    dtype=np.float32,
    noise: float = 2.0,
) -> Dataset:
    """A learnable multi-class set shaped like MNIST: class prototypes plus Gaussian noise.

    Each class has a sparse "ink" prototype p_c (about 20% of the features lit with values
    in [0.5, 1)); a sample of class c is clip(p_c + noise * (N(0, 1) - 1), 0, 1). The shift
    by -noise keeps the background mostly at 0, so with the default noise=2 the pixel
    statistics resemble MNIST's (mean about 0.13, about 18% of pixels non-zero). The classes
    overlap: a linear softmax model trained by SGD (batch 64, lr 0.1) starts at chance and
    reaches about 90% test accuracy within one epoch, so a demo shows accuracy rising.
    n_test defaults to max(1000, n_train // 6) (MNIST's ratio). Deterministic given the
    arguments; x is drawn directly in `dtype`.
    """
    n_train = _check_count(n_train, "n_train")
    n_features = _check_count(n_features, "n_features")
    n_classes = _check_count(n_classes, "n_classes", minimum=2)
    n_test = max(1000, n_train // 6) if n_test is None else _check_count(n_test, "n_test")
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise ValueError(f"noise={noise!r} must be a number >= 0")
    dt = _float_dtype(dtype)
    proto_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    prng = np.random.default_rng(proto_seq)
    lit = prng.random((n_classes, n_features)) < 0.2
    prototypes = (lit * prng.uniform(0.5, 1.0, (n_classes, n_features))).astype(dt)

    def draw(count: int, seq: np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seq)
        y = rng.integers(0, n_classes, size=count, dtype=np.int64)
        x = aligned_empty((count, n_features), dt)
        rng.standard_normal(out=x, dtype=dt)
        for start in range(0, count, _CHUNK_ROWS):
            block = x[start : start + _CHUNK_ROWS]
            block -= 1.0
            block *= noise  # noise * (N(0, 1) - 1): mostly-dark background after clipping
            block += prototypes[y[start : start + _CHUNK_ROWS]]
            np.clip(block, 0.0, 1.0, out=block)
        return x, y

    x_train, y_train = draw(n_train, train_seq)
    x_test, y_test = draw(n_test, test_seq)
    return Dataset(
        x_train,
        y_train,
        x_test,
        y_test,
        name="synthetic-mnist",
        n_classes=n_classes,
        source=f"synthetic_classification(n_train={n_train}, "
        f"n_features={n_features}, n_classes={n_classes}, seed={seed})",
    )


_SYNTH_GRID = 4  # a pattern: per channel, a 4x4 grid of random levels, interpolated to 32x32
_SYNTH_SHIFT = 3  # class patterns move by up to 3 pixels each way (wrapping around)
_SYNTH_CHUNK = 2048  # rows per independently seeded chunk


def _bilinear(levels: np.ndarray, side: int) -> np.ndarray:
    """(..., G, G) grids of levels -> (..., side, side) planes, by linear interpolation along
    each axis from G evenly spread points to `side` points.

    Written as element-wise products and sums (two terms per output value), never as a
    matrix product: a BLAS call may block its reduction by the number of rows, so its
    rounding would depend on how many samples are drawn at once. This way every value is
    the same whatever the batch, on any machine.
    """
    g = levels.shape[-1]
    pos = np.linspace(0.0, g - 1.0, side)
    lo = np.minimum(np.floor(pos).astype(np.int64), g - 2)
    frac = pos - lo
    w0, w1 = (1.0 - frac).astype(levels.dtype), frac.astype(levels.dtype)
    rows = levels[..., lo, :] * w0[:, None] + levels[..., lo + 1, :] * w1[:, None]
    return rows[..., lo] * w0 + rows[..., lo + 1] * w1


def synthetic_cifar10(
    n_train: int = CIFAR10_TRAIN_SIZE,
    n_test: int = CIFAR10_TEST_SIZE,
    *,
    seed: int = 0,
    dtype=np.float32,
    distractor: float = 0.6,
    noise: float = 0.2,
) -> Dataset:
    """A learnable 10-class set shaped like CIFAR-10: x (n, 3072) in CHW order, in [0, 1].

    A "pattern" is, per channel, a 4x4 grid of uniform random levels bilinearly interpolated
    to 32x32: smooth colour blobs. Each class has one pattern p_c; a sample of class c is
        clip((1 - distractor) * shift(p_c) + distractor * q + noise * u, 0, 1)
    where shift rolls p_c by up to 3 pixels each way, q is a fresh random pattern (clutter
    the model must learn to ignore) and u is uniform noise with mean 0 and variance 1. The
    pixel mean is about 0.50 and the standard deviation about 0.24 (CIFAR-10: 0.47, 0.25).
    With the defaults a nearest-class-mean classifier scores about 88 % and softmax
    regression trained by SGD goes from chance to about 89 % in one pass over 20,000
    samples, so a demo shows accuracy rising; the shifts favour convolutions.
    Rows are drawn in chunks of 2048 from streams seeded by SeedSequence(seed,
    spawn_key=(split, chunk, role)), so the first k rows do not depend on n_train (or
    n_test): a set of k rows is the first k rows of a larger one. Deterministic given the
    arguments.
    """
    n_train = _check_count(n_train, "n_train")
    n_test = _check_count(n_test, "n_test")
    for arg, value, hi in (("distractor", distractor, 1.0), ("noise", noise, math.inf)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= hi:
            raise ValueError(f"{arg}={value!r} must be a number in [0, {hi}]")
    dt = _float_dtype(dtype)
    channels, side, _ = CIFAR10_SHAPE
    plane = side * side
    grid = (_SYNTH_GRID, _SYNTH_GRID)
    prng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    patterns = _bilinear(prng.random((CIFAR10_CLASSES, channels) + grid, dtype=dt), side)
    # every class pattern at every shift, pre-scaled: a sample starts as one row of this
    offsets = range(-_SYNTH_SHIFT, _SYNTH_SHIFT + 1)
    shifted = np.stack(
        [
            np.roll(p, (dy, dx), axis=(1, 2)).reshape(-1)
            for p in patterns
            for dy in offsets
            for dx in offsets
        ]
    )
    shifted *= 1.0 - distractor
    n_shifts = len(offsets) ** 2
    uniform_scale = noise * math.sqrt(12.0)  # U(-1/2, 1/2) has variance 1/12

    def draw(count: int, split: int) -> tuple[np.ndarray, np.ndarray]:
        x = aligned_empty((count, CIFAR10_FEATURES), dt)
        y = np.empty(count, dtype=np.int64)
        for k, start in enumerate(range(0, count, _SYNTH_CHUNK)):
            # one stream per role, each consumed row by row: a short chunk draws a prefix
            # of what a full one would, whatever the other streams hold
            label_rng, shift_rng, noise_rng, clutter_rng = (
                np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(split, k, role)))
                for role in range(4)
            )
            block = x[start : start + _SYNTH_CHUNK]
            m = len(block)
            labels = label_rng.integers(0, CIFAR10_CLASSES, size=m, dtype=np.int64)
            which = labels * n_shifts + shift_rng.integers(0, n_shifts, size=m)
            noise_rng.random(out=block, dtype=dt)  # uniform noise, drawn in place
            block -= 0.5
            block *= uniform_scale
            block += shifted[which]
            clutter = _bilinear(clutter_rng.random((m, channels) + grid, dtype=dt), side)
            clutter *= distractor
            block += clutter.reshape(m, channels * plane)
            np.clip(block, 0.0, 1.0, out=block)
            y[start : start + m] = labels
        return x, y

    x_train, y_train = draw(n_train, 1)
    x_test, y_test = draw(n_test, 2)
    return Dataset(
        x_train,
        y_train,
        x_test,
        y_test,
        name="synthetic-cifar10",
        n_classes=CIFAR10_CLASSES,
        input_shape=CIFAR10_SHAPE,
        source=f"synthetic_cifar10(n_train={n_train}, n_test={n_test}, seed={seed})",
    )
