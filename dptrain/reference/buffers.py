"""Twins of the flat-buffer arithmetic (csrc/dp_buffers.h): dptrain._core.sum_buffers,
scale_, to_bf16, from_bf16. uint16 arrays hold bfloat16 values, computed in float32."""

import numpy as np

from ._common import _check_ndim, _check_shape, _common_float_dtype, _range
from .layers import mix64

__all__ = ["sum_buffers", "to_bf16", "from_bf16", "scale_", "sum_squares", "augment_images"]

SQUARES_LANES = 16  # csrc/dp_buffers.h's DP_SQUARES_LANES


def sum_buffers(out, inputs, *, scale=1.0, start=0, stop=None):
    """out[start:stop] = scale * (inputs[0] + inputs[1] + ...)[start:stop].

    The inputs are added left to right in the order given (float addition is not
    associative, so the order is part of the contract). 1-D arrays of equal length;
    out may be one of the inputs (the sum is formed before out is written). uint16 arrays
    (out and every input) hold bfloat16 values: widened, summed in float32, scaled, and the
    result rounded to bfloat16 (``to_bf16``).
    """
    inputs = list(inputs)
    if not inputs:
        raise ValueError("inputs is empty, expected at least one array")
    bf16 = isinstance(out, np.ndarray) and out.dtype == np.uint16
    if bf16:
        for i, arr in enumerate(inputs):
            if not (isinstance(arr, np.ndarray) and arr.dtype == np.uint16):
                raise TypeError(
                    f"inputs[{i}] has dtype {getattr(arr, 'dtype', type(arr))}, expected uint16"
                )
        dt = np.dtype(np.float32)
    else:
        dt = _common_float_dtype(out=out, **{f"inputs[{i}]": a for i, a in enumerate(inputs)})
    _check_ndim("out", out, (1,))
    for i, arr in enumerate(inputs):
        _check_shape(f"inputs[{i}]", arr, out.shape)
    sl = _range("sum_buffers", out.shape[0], start, stop)
    widen = _bf16_widen if bf16 else np.copy
    acc = widen(inputs[0][sl])
    for arr in inputs[1:]:
        acc += widen(arr[sl])
    if scale != 1.0:  # x * 1 == x exactly, so skipping it changes nothing
        acc *= dt.type(scale)
    out[sl] = _bf16_bits(acc) if bf16 else acc


def _bf16_bits(x) -> np.ndarray:
    """float32 -> the bits (uint16) of its nearest bfloat16, ties to even: a NaN stays a quiet
    NaN, a float above bfloat16's largest becomes inf. The constants are typed: under NumPy
    1.x a 0-d uint64 array and a Python int would be cast to float64."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    c = np.uint64
    nan = (u & c(0x7FFFFFFF)) > c(0x7F800000)
    rne = u + c(0x7FFF) + ((u >> c(16)) & c(1))
    return (np.where(nan, u | c(0x400000), rne) >> c(16)).astype(np.uint16)


def _bf16_widen(b) -> np.ndarray:
    """bfloat16 bits (uint16) -> the float32 values they hold, exactly (a new array)."""
    return (np.asarray(b, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _check_bf16_pair(x, x_dt, out, out_dt):
    for name, arr, dt in (("x", x, x_dt), ("out", out, out_dt)):
        if not isinstance(arr, np.ndarray) or arr.dtype != dt:
            raise TypeError(
                f"{name} has dtype {getattr(arr, 'dtype', type(arr))}, expected {np.dtype(dt).name}"
            )
    _check_shape("out", out, x.shape)


def to_bf16(x, out):
    """out (uint16, x's shape) = the bits of float32 x rounded to the nearest bfloat16, ties to
    even (a NaN stays a quiet NaN, a float above bfloat16's largest becomes inf)."""
    _check_bf16_pair(x, np.float32, out, np.uint16)
    out[...] = _bf16_bits(x)


def from_bf16(x, out):
    """out (float32, x's shape) = the bfloat16 values whose bits x (uint16) holds, exactly."""
    _check_bf16_pair(x, np.uint16, out, np.float32)
    out[...] = _bf16_widen(x)


def scale_(buf, alpha, *, start=0, stop=None):
    """buf[start:stop] *= alpha; buf 1-D."""
    dt = _common_float_dtype(buf=buf)
    _check_ndim("buf", buf, (1,))
    sl = _range("scale_", buf.shape[0], start, stop)
    buf[sl] *= dt.type(alpha)


def sum_squares(x) -> float:
    """The sum of x**2 in float64 as csrc's dp_sum_squares takes it: lane j of 16 sums the
    elements i with i % 16 == j in order, then the lanes are added in order (for float32
    inputs the same bits; each square is exact in float64)."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {x.shape}")
    _common_float_dtype(x=x)
    v = x.astype(np.float64)
    acc = np.zeros(SQUARES_LANES)
    whole = len(v) // SQUARES_LANES * SQUARES_LANES
    for row in (v[:whole] * v[:whole]).reshape(-1, SQUARES_LANES):  # in order, per lane
        acc += row
    tail = v[whole:]
    acc[: len(tail)] += tail * tail
    total = 0.0
    for a in acc:
        total += float(a)
    return total


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's output for the state z (csrc/dp_common.h's dp_mix64), on Python ints mod
    2^64."""
    return int(mix64(np.uint64(z)))


def augment_draw(seed: int, epoch: int, sample: int, pad: int) -> tuple[int, int, int]:
    """(oy, ox, flipped) of a sample: csrc's dp_augment_draw."""
    r = _mix(_mix(_mix(seed & _MASK) ^ (epoch & _MASK)) ^ (sample & _MASK))
    span = 2 * pad + 1
    return (r & 0xFFFF) % span, ((r >> 16) & 0xFFFF) % span, (r >> 32) & 1


def augment_images(x, out, ids, *, shape, pad, flip=False, seed, epoch):
    """out[i] = image x[i] (flat rows of shape (C, H, W)) cropped from its copy zero-padded
    by `pad` at (oy, ox), then mirrored left-right where flip and the sample's coin say so:
    torchvision's RandomCrop(padding) then RandomHorizontalFlip, drawn by augment_draw."""
    C, H, W = shape
    _common_float_dtype(x=x, out=out)
    _check_shape("out", out, x.shape)
    for i, sample in enumerate(np.asarray(ids)):
        oy, ox, flipped = augment_draw(seed, epoch, int(sample), pad)
        padded = np.zeros((C, H + 2 * pad, W + 2 * pad), x.dtype)
        padded[:, pad : pad + H, pad : pad + W] = x[i].reshape(C, H, W)
        img = padded[:, oy : oy + H, ox : ox + W]
        if flip and flipped:
            img = img[:, :, ::-1]
        out[i] = img.reshape(-1)
