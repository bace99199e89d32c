"""Up-scaling: nearest-neighbour enlargement of square single-channel images (28x28 ->
56x56, 112x112), to make the per-sample compute larger for scaling experiments."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .dataset import Dataset, _check_count
from .mnist import MNIST_SIDE

_UPSCALE_CHUNK_ROWS = 1024  # images per chunk: the temporary stays cache-sized


def upscale_images(x: np.ndarray, factor: int, side: int = MNIST_SIDE) -> np.ndarray:
    """Nearest-neighbour up-scaling: (n, side*side) -> (n, (side*factor)**2), same dtype.

    Each pixel becomes a factor x factor block: viewed as images,
    out[k, r, c] == x[k, r // factor, c // factor]. Works in chunks of rows, so besides the
    output only a chunk-sized temporary is allocated. factor == 1 returns a copy.
    """
    factor = _check_count(factor, "factor")
    side = _check_count(side, "side")
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != side * side:
        raise ValueError(
            f"x has shape {getattr(x, 'shape', None)}, expected (n, {side * side}) for side={side}"
        )
    n = x.shape[0]
    wide = side * factor
    # out viewed as (n, side, factor, wide): source row r fills output rows r*factor + a.
    out = np.empty((n, side, factor, wide), dtype=x.dtype)
    chunk = _UPSCALE_CHUNK_ROWS
    for start in range(0, n, chunk):
        block = out[start : start + chunk]
        # repeat each pixel along the row, into the first of the factor copies of the row ...
        block[:, :, 0, :] = np.repeat(
            x[start : start + chunk].reshape(-1, side, side), factor, axis=2
        )
        # ... then duplicate that widened row factor - 1 times
        block[:, :, 1:, :] = block[:, :, :1, :]
    return out.reshape(n, wide * wide)


def upscale_dataset(ds: Dataset, factor: int) -> Dataset:
    """`ds` with both splits up-scaled by `factor`; a sample must be one square image.

    That is input_shape (1, side, side), which stays an image, or flat features that form
    a square, which stay flat. Several channels (CIFAR-10) are not supported.
    """
    factor = _check_count(factor, "factor")
    side = math.isqrt(ds.n_features)
    if side * side != ds.n_features:
        raise ValueError(
            f"cannot upscale {ds.name}: n_features={ds.n_features} is not a "
            f"square image (side * side)"
        )
    if ds.input_shape not in ((1, side, side), (ds.n_features,)):
        raise ValueError(
            f"cannot upscale {ds.name}: input_shape={ds.input_shape} is not a "
            f"single-channel square image"
        )
    if factor == 1:
        return ds
    wide = side * factor
    return dataclasses.replace(
        ds,
        x_train=upscale_images(ds.x_train, factor, side),
        x_test=upscale_images(ds.x_test, factor, side),
        input_shape=(1, wide, wide) if len(ds.input_shape) == 3 else (wide * wide,),
        name=f"{ds.name}-x{factor}",
        source=f"{ds.source}, upscaled x{factor}",
    )
