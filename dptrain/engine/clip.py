"""Gradient clipping by global norm (TrainConfig's clip_norm; torch.nn.utils.clip_grad_norm_).

The norm is that of the exchanged gradient, the global batch's, so every worker computes the
same one from the same bits (``_core.sum_squares``: one order of summation in every ISA's
build, in float64) and scales alike: N workers clip as one. Where each worker holds only its
slice of the summed gradient (ShardedUpdate), the slices' sums of squares are all-reduced in
rank order first. The coefficient is PyTorch's, max_norm / (norm + 1e-6), applied where it is
below 1; the scaled gradient goes into a buffer of the clipper's own, so an exchanged buffer
that several workers read (the deterministic exchange's) is never written. Local SGD clips
each replica's own gradient, as each replica's own optimizer would.

Every step's norm is kept: the result's ``grad_clip`` (how often it clipped, the norms' median
and maximum) says whether the threshold did anything.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _core
from .._aligned import aligned_zeros

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class GradClip:
    """Clips gradients to max_norm. ``comm``: the run's communicator, for the slices' sum
    (sharded); None where every caller holds the whole gradient."""

    def __init__(self, max_norm: float, comm=None):
        self.max_norm = float(max_norm)
        self.sum = comm.zeros(1, np.float64) if comm is not None else None  # collective
        self.comm = comm
        self.out = None  # the scaled gradient (allocated at the first clip)
        self.norms: list[float] = []
        self.clipped = 0

    def __call__(self, grads: np.ndarray, part=None) -> np.ndarray:
        """The gradient to step with: ``grads`` itself, or its scaled copy where its norm
        exceeds max_norm. part=(lo, hi): this worker holds only that slice (the norm is the
        all-reduced sum of every worker's slice, the copy is of the slice)."""
        lo, hi = part if part is not None else (0, len(grads))
        squares = _core.sum_squares(grads[lo:hi])
        if part is not None:
            self.sum[0] = squares
            self.comm.allreduce_sum_(self.sum)
            squares = float(self.sum[0])
        norm = math.sqrt(squares)
        self.norms.append(norm)
        coef = self.max_norm / (norm + EPS)
        if not coef < 1.0:  # also a NaN norm: the run's loss says it diverged
            return grads
        self.clipped += 1
        if self.out is None or self.out.shape != grads.shape:
            self.out = aligned_zeros(len(grads), grads.dtype)
        np.multiply(grads[lo:hi], grads.dtype.type(coef), out=self.out[lo:hi])
        return self.out

    def record(self) -> dict:
        """The result's ``grad_clip``."""
        norms = np.array(self.norms) if self.norms else np.zeros(1)
        return {
            "max_norm": self.max_norm,
            "steps": len(self.norms),
            "clipped_steps": self.clipped,
            "norm_median": float(np.median(norms)),
            "norm_max": float(np.max(norms)),
        }
