"""Gradient clipping by global norm (TrainConfig's clip_norm; torch.nn.utils.clip_grad_norm_).

The norm is that of the exchanged gradient, the global batch's, so every worker computes the
same one from the same bits (``_core.sum_squares``: one order of summation in every ISA's
build, in float64) and scales alike: N workers clip as one. Where each worker updates only its
slice of the summed gradient (ShardedUpdate), the norm is still the whole gradient's (after a
barrier that publishes every slice), and only the worker's slice is scaled. The coefficient is
PyTorch's, max_norm / (norm + 1e-6), applied where it is below 1; the scaled gradient goes
into a buffer of the clipper's own, so an exchanged buffer that several workers read (the
deterministic exchange's) is never written. Local SGD clips each replica's own gradient, as
each replica's own optimizer would.

Every step's norm is kept: the result's ``grad_clip`` (how often it clipped, the norms' median
and maximum) says whether the threshold did anything; under local SGD they are the first
replica's (rank 0 runs it on any number of workers), so the record depends on the replicas,
not on the workers.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _core
from .._aligned import aligned_zeros

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class GradClip:
    """Clips gradients to max_norm."""

    def __init__(self, max_norm: float):
        self.max_norm = float(max_norm)
        self.out = None  # the scaled gradient (allocated at the first clip)
        self.norms: list[float] = []
        self.clipped = 0

    def __call__(self, grads: np.ndarray, part=None, count: bool = True) -> np.ndarray:
        """The gradient to step with: ``grads`` itself, or its scaled copy where its norm
        exceeds max_norm. part=(lo, hi): the caller steps with that slice only (the norm is
        still the whole gradient's; only the slice is copied). count: the step goes into the
        record."""
        lo, hi = part if part is not None else (0, len(grads))
        norm = math.sqrt(_core.sum_squares(grads))
        coef = self.max_norm / (norm + EPS)
        if count:
            self.norms.append(norm)
            self.clipped += coef < 1.0
        if not coef < 1.0:  # also a NaN norm: the run's loss says it diverged
            return grads
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
