"""Twin of the shared-memory all-reduce (csrc/dp_allreduce.h): dptrain._core.ShmGroup.allreduce,
as the result of the whole group's collective, in each algorithm's order of summation."""

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype, _range
from .buffers import sum_buffers

__all__ = ["allreduce", "allreduce_slice", "ALLREDUCE_ALGORITHMS"]


ALLREDUCE_ALGORITHMS = ("native", "ring", "tree")  # dp_allreduce_name's


def allreduce_slice(start, stop, rank, n, elem_bytes):
    """dp_slice: worker `rank`'s share [lo, hi) of [start, stop) cut in n parts of whole
    64-byte lines (the last part may be short, the parts past the end empty)."""
    length, line = stop - start, 64 // elem_bytes
    q, r = divmod((length + line - 1) // line, n)
    l0 = rank * q + min(rank, r)
    l1 = l0 + q + (1 if rank < r else 0)
    return min(start + l0 * line, stop), min(start + l1 * line, stop)


def allreduce(bufs, *, scale=1.0, start=0, stop=None, out=None, algorithm="native"):
    """ShmGroup.allreduce of a whole group (each of the n workers calling it once, with the
    same arguments): bufs are the workers' 1-D buffers of one dtype and length, in rank order.

    native: scale * (bufs[0] + bufs[1] + ...)[start:stop], added in rank order, written into
    every buffer, or only into out (then any number of buffers; uint16 buffers and out hold
    bfloat16 values, summed as ``sum_buffers`` sums them). ring (reduce-scatter, then
    all-gather) and tree (recursive doubling, the extra workers of a group that is not a power
    of two folded in first): one buffer per worker, no out; each sums in the order of its
    schedule, the bits every worker of the C core ends with:
    - ring: part j of the range (allreduce_slice(..., j, n, ...)) is summed along the ring
      from worker j on, ((b[j] + b[j+1]) + ...) + b[j-1], the last sum times scale;
    - tree: worker r < extra first adds b[r + pof2]; each round adds the partner's (r ^ mask)
      running sum; the last round's sum times scale.
    A group of one worker only scales (when scale != 1).
    """
    bufs = list(bufs)
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm is {algorithm!r}, expected one of {ALLREDUCE_ALGORITHMS}")
    if not bufs:
        raise ValueError("bufs is empty, expected one buffer per worker")
    if algorithm == "native" and out is not None:
        sum_buffers(out, bufs, scale=scale, start=start, stop=stop)
        return
    if out is not None:
        raise ValueError(f"out is only for the native algorithm, not {algorithm!r}")
    dt = _common_float_dtype(**{f"bufs[{i}]": b for i, b in enumerate(bufs)})
    _check_ndim("bufs[0]", bufs[0], (1,))
    for i, b in enumerate(bufs):
        _check_shape(f"bufs[{i}]", b, bufs[0].shape)
    sl = _range("allreduce", bufs[0].shape[0], start, stop)
    n, scale = len(bufs), dt.type(scale)
    if algorithm == "native" or n == 1:
        result = np.empty(sl.stop - sl.start, dt)
        sum_buffers(result, [b[sl] for b in bufs], scale=scale)
    elif algorithm == "ring":
        result = np.empty(sl.stop - sl.start, dt)
        for j in range(n):
            lo, hi = allreduce_slice(sl.start, sl.stop, j, n, dt.itemsize)
            acc = bufs[j][lo:hi].copy()
            for q in range(1, n):
                acc = acc + bufs[(j + q) % n][lo:hi]
            result[lo - sl.start : hi - sl.start] = acc * scale
    else:
        pof2 = 1 << (n.bit_length() - 1)
        run = [b[sl].copy() for b in bufs[:pof2]]
        for r in range(n - pof2):
            run[r] = run[r] + bufs[r + pof2][sl]
        mask = 1
        while mask < pof2:
            run = [run[r] + run[r ^ mask] for r in range(pof2)]
            mask <<= 1
        result = run[0] * scale
    for b in bufs:
        b[sl] = result
