"""Which samples each step uses: seeded epoch permutations, batch boundaries, and each
worker's share of a batch.

These are the semantics of a distributed sampler, kept in one place so that sequential and
data-parallel training draw exactly the same global batches: epoch e of a run with seed s
visits ``epoch_order(n, e, s)`` in consecutive batches of ``batch_size`` (the last one may
be smaller; it is kept, not dropped or padded), and worker r of N takes
``shard(start, stop, r, N)`` of each. ``BatchRows`` gathers a share's rows, and
deterministic mode cuts each global batch into ``CHUNKS`` fixed chunks.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._aligned import aligned_empty

# Deterministic mode cuts every global batch into this many fixed chunks (by position, not by
# worker): each chunk's gradient is computed alone, and the chunks are summed in chunk order.
# Nothing then depends on which worker computed what, so any world size up to CHUNKS gives
# bitwise-identical weights.
CHUNKS = 8


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """The sample order of one epoch (int64): a permutation seeded by (seed, epoch), or 0..n-1."""
    if n < 0 or epoch < 0:
        raise ValueError(f"n={n} and epoch={epoch} must be >= 0")
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n).astype(np.int64)


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """[(start, stop), ...] covering 0..n in steps of batch_size; the last may be shorter."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Batches per epoch: ceil(n / batch_size) (the last batch is kept, not dropped)."""
    return -(-n // batch_size)


def shard(start: int, stop: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's contiguous share of positions [start, stop) of an epoch order (sizes differ by
    at most one; no padding, no duplicates)."""
    n = stop - start
    q, r = divmod(n, world)
    lo = start + rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


class BatchRows:
    """(x, y) of positions [lo, hi) of an epoch's order: gathered into reused buffers
    (``_core.gather_rows``, GIL released, so thread workers gather at the same time), or
    contiguous slices (no copy) when the order is the data set's own."""

    def __init__(self, x, y, rows: int, shuffle: bool, augment: dict | None = None):
        self.x, self.y, self.shuffle = x, y, shuffle
        self.xb = aligned_empty((rows,) + x.shape[1:], x.dtype)
        self.yb = aligned_empty((rows,) + y.shape[1:], y.dtype)
        self.order = None
        # augment: _core.augment_images' shape, pad, flip and seed; the epoch is set by the
        # loop (``epoch``); each row is drawn by its sample's index in the data set
        self.augment, self.epoch = augment, 0
        self.xa = aligned_empty(self.xb.shape, x.dtype) if augment else None

    def __call__(self, lo: int, hi: int):
        if self.shuffle:
            bx, by = self.xb[: hi - lo], self.yb[: hi - lo]
            _core.gather_rows(self.x, self.order[lo:hi], bx)
            _core.gather_rows(self.y, self.order[lo:hi], by)
        else:
            bx, by = self.x[lo:hi], self.y[lo:hi]
        if self.augment:
            ids = self.order[lo:hi] if self.shuffle else np.arange(lo, hi, dtype=np.int64)
            out = self.xa[: hi - lo]
            _core.augment_images(
                bx.reshape(len(bx), -1),
                out.reshape(len(bx), -1),
                ids,
                epoch=self.epoch,
                **self.augment,
            )
            bx = out
        return bx, by
