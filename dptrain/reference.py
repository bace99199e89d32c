"""Pure-NumPy reference of the C core (dptrain._core): the readable spec and the test oracle.

Every function here has the name, argument order, keywords and in-place semantics of its C
twin in docs/core_api.md, so a test can hand both the same arrays and compare the outputs:
results are written into the output arrays the contract names, gradients are accumulated
(``+=``) where it says so, and the same value is returned. ``ctx`` arguments (the C core's
scratch context) are accepted and ignored.

Dimension letters: B batch, IN/OUT features of a dense layer, C classes, M/N/K of a GEMM.

Arithmetic is done in the arrays' own dtype (float32 or float64), so the reference rounds
the way a straightforward C kernel would; only the returned loss sums are accumulated in
float64. Scalars (alpha, lr, ...) are converted to that dtype first, so NumPy's promotion
rules (which changed in NumPy 2, NEP 50) never silently widen a float32 computation. uint16
arrays hold bfloat16 values (to_bf16, from_bf16, sum_buffers), computed in float32.

Left out on purpose: speed (this is the spec, not a fallback), and the C boundary's full
validation (C-contiguity, writeability). Shapes, float dtypes and label ranges are checked,
raising ValueError/TypeError in the contract's words, because a wrong-shaped oracle call
that NumPy broadcasts into "agreement" would be a test that cannot fail.

The model-level part at the end (model_plan, model_unflatten, model_init_params,
model_loss_grad, model_evaluate, model_logits) is the reference of the Model contract (any
list of dense, conv, maxpool2, relu, tanh, sigmoid, gelu and flatten layers; losses
MODEL_LOSSES), written layer by layer in the list's order with the functions above and the
twins of the activations and of the MSE loss the C core runs inside Model (tanh_*,
sigmoid_*, gelu_*, mse): conv -> ReLU -> 2x2 max-pool is computed in the textbook order
ReLU-then-pool, where the C core pools first, which gives the same values and gradients.
model_init_params also *defines* the parameter initialisation the models use.
"""
import math
import operator

import numpy as np

__all__ = [
    "gemm", "dense_forward", "dense_backward", "relu_forward", "relu_backward",
    "softmax_xent", "sigmoid_bce", "argmax", "count_correct", "sgd_step", "sum_buffers",
    "to_bf16", "from_bf16", "scale_", "allreduce", "allreduce_slice", "ALLREDUCE_ALGORITHMS",
    "conv2d_forward", "conv2d_backward", "maxpool2_forward",
    "maxpool2_backward",
    "tanh_forward", "tanh_backward", "sigmoid_forward", "sigmoid_backward", "gelu_forward",
    "gelu_backward", "mse", "model_plan", "model_unflatten", "model_init_params",
    "model_loss_grad", "model_evaluate", "model_logits",
    "MODEL_LOSSES", "LAYER_SIZES", "MODEL_MAX_LAYERS",
]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# ---------------------------------------------------------------------------------------
# validation helpers: light, but with messages that name the argument and the values


def _check_shape(name, arr, expected):
    if arr.shape != tuple(expected):
        raise ValueError(f"{name} has shape {arr.shape}, expected {tuple(expected)}")


def _check_ndim(name, arr, ndims):
    if arr.ndim not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{name} has shape {arr.shape}, expected a {want} array")


def _common_float_dtype(**arrays):
    """The one float dtype shared by all given arrays (None values are skipped)."""
    dtype = None
    first = None
    for name, arr in arrays.items():
        if arr is None:
            continue
        if arr.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {arr.dtype}, expected float32 or float64")
        if dtype is None:
            dtype, first = arr.dtype, name
        elif arr.dtype != dtype:
            raise TypeError(f"{name} has dtype {arr.dtype}, expected {dtype} "
                            f"(the dtype of {first})")
    return dtype


def _check_labels(labels, batch, n_classes):
    """labels: integer (B,), every value in [0, n_classes)."""
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels has dtype {labels.dtype}, expected int64")
    _check_shape("labels", labels, (batch,))
    if batch:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"labels contains {bad}, expected values in [0, {n_classes})")


def _range(name, n, start, stop):
    """slice(start, stop) after checking 0 <= start <= stop <= n (no negative indexing)."""
    stop = n if stop is None else stop
    if not 0 <= start <= stop <= n:
        raise ValueError(f"{name} range [{start}, {stop}) is not inside [0, {n}]")
    return slice(start, stop)


# ---------------------------------------------------------------------------------------
# the C entry points


def gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, ctx=None):
    """c[:] = alpha * op(a) @ op(b) + beta * c; op(a) (M, K), op(b) (K, N), c (M, N).

    beta == 0 never reads c, so NaN/Inf garbage in an uninitialised c does not leak
    into the result (BLAS convention).
    """
    dt = _common_float_dtype(a=a, b=b, c=c)
    _check_ndim("a", a, (2,))
    _check_ndim("b", b, (2,))
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    (m, k), (k_b, n) = op_a.shape, op_b.shape
    if k_b != k:
        raise ValueError(f"b has shape {b.shape} (op(b) {op_b.shape}), expected op(b) to have "
                         f"{k} rows to match op(a) {op_a.shape}")
    _check_shape("c", c, (m, n))
    prod = np.matmul(op_a, op_b)  # computed before c is written: c may alias a or b
    prod *= dt.type(alpha)
    if beta != 0:
        prod += dt.type(beta) * c
    c[...] = prod


def dense_forward(x, w, b, y, *, ctx=None):
    """y[:] = x @ w.T + b; x (B, IN), w (OUT, IN), b (OUT,), y (B, OUT)."""
    _common_float_dtype(x=x, w=w, b=b, y=y)
    _check_ndim("w", w, (2,))
    out_f, in_f = w.shape
    _check_ndim("x", x, (2,))
    batch = x.shape[0]
    _check_shape("x", x, (batch, in_f))
    _check_shape("b", b, (out_f,))
    _check_shape("y", y, (batch, out_f))
    y[...] = x @ w.T + b


def dense_backward(dy, x, w, dw, db, dx=None, *, ctx=None):
    """dw += dy.T @ x; db += dy.sum(0); if dx is given, dx[:] = dy @ w.

    dy (B, OUT), x (B, IN) the forward input, w (OUT, IN), dw like w, db (OUT,), dx like x.
    """
    _common_float_dtype(dy=dy, x=x, w=w, dw=dw, db=db, dx=dx)
    _check_ndim("w", w, (2,))
    out_f, in_f = w.shape
    _check_ndim("x", x, (2,))
    batch = x.shape[0]
    _check_shape("x", x, (batch, in_f))
    _check_shape("dy", dy, (batch, out_f))
    _check_shape("dw", dw, (out_f, in_f))
    _check_shape("db", db, (out_f,))
    if dx is not None:
        _check_shape("dx", dx, (batch, in_f))
    dw += dy.T @ x
    db += dy.sum(axis=0)
    if dx is not None:
        dx[...] = dy @ w


def relu_forward(x, y):
    """y[:] = maximum(x, 0); y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    np.maximum(x, x.dtype.type(0), out=y)


def relu_backward(dy, y, dx):
    """dx[:] = dy * (y > 0); y is the forward *output*; dx may be dy."""
    _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    # where() rather than a multiply: a masked entry is exactly 0 even where dy is inf.
    dx[...] = np.where(y > 0, dy, dy.dtype.type(0))


def softmax_xent(logits, labels, dlogits=None, grad_scale=None):
    """Softmax cross-entropy summed over the batch; logits (B, C), labels int64 (B,).

    Returns float(sum_i logsumexp(z_i) - z_i[y_i]). If dlogits is given, writes
    dlogits[:] = (softmax(z) - onehot(y)) * grad_scale, grad_scale defaulting to 1/B.
    Stable form: with m_i = max_j z_ij and s = z - m, logsumexp(z_i) - z_i[y] =
    log(sum_j exp(s_ij)) - s_i[y], and every exp() argument is <= 0.
    """
    dt = _common_float_dtype(logits=logits, dlogits=dlogits)
    _check_ndim("logits", logits, (2,))
    batch, n_classes = logits.shape
    if n_classes < 1:
        raise ValueError(f"logits has shape {logits.shape}, expected at least one class")
    _check_labels(labels, batch, n_classes)
    if dlogits is not None:
        _check_shape("dlogits", dlogits, logits.shape)
    if batch == 0:
        return 0.0
    rows = np.arange(batch)
    shifted = logits - logits.max(axis=1, keepdims=True)  # (B, C), each row's max is 0
    exps = np.exp(shifted)
    sum_exp = exps.sum(axis=1)  # (B,), in [1, C]
    losses = np.log(sum_exp) - shifted[rows, labels]  # (B,) per-sample losses, dtype dt
    if dlogits is not None:
        scale = dt.type(1.0 / batch if grad_scale is None else grad_scale)
        grad = exps / sum_exp[:, None]  # softmax
        grad[rows, labels] -= dt.type(1)
        grad *= scale
        dlogits[...] = grad
    return float(losses.sum(dtype=np.float64))


def _sigmoid(z):
    """Stable logistic: exp() is only ever taken of -|z| <= 0, so it never overflows."""
    e = np.exp(-np.abs(z))
    one = z.dtype.type(1)
    return np.where(z >= 0, one / (one + e), e / (one + e))


def sigmoid_bce(logits, labels, dlogits=None, grad_scale=None):
    """Binary cross-entropy on logits, summed over the batch.

    logits (B,) or (B, 1), labels int64 (B,) in {0, 1}. Returns
    float(sum_i softplus(z_i) - y_i z_i), computed stably as
    max(z, 0) - y z + log1p(exp(-|z|)). If dlogits (shaped like logits) is given, writes
    dlogits[:] = (sigmoid(z) - y) * grad_scale, grad_scale defaulting to 1/B.
    """
    dt = _common_float_dtype(logits=logits, dlogits=dlogits)
    _check_ndim("logits", logits, (1, 2))
    batch = logits.shape[0]
    if logits.ndim == 2:
        _check_shape("logits", logits, (batch, 1))
    _check_labels(labels, batch, 2)
    if dlogits is not None:
        _check_shape("dlogits", dlogits, logits.shape)
    if batch == 0:
        return 0.0
    z = logits.reshape(batch)
    y = labels.astype(dt)
    losses = np.maximum(z, dt.type(0)) - y * z + np.log1p(np.exp(-np.abs(z)))
    if dlogits is not None:
        scale = dt.type(1.0 / batch if grad_scale is None else grad_scale)
        dlogits[...] = ((_sigmoid(z) - y) * scale).reshape(logits.shape)
    return float(losses.sum(dtype=np.float64))


def argmax(x, out):
    """out[:] = x.argmax(1) (the first maximum); x (B, C), out int64 (B,)."""
    _check_ndim("x", x, (2,))
    batch, n_classes = x.shape
    if n_classes < 1:
        raise ValueError(f"x has shape {x.shape}, expected at least one column")
    _check_shape("out", out, (batch,))
    if out.dtype != np.int64:
        raise TypeError(f"out has dtype {out.dtype}, expected int64")
    out[...] = np.argmax(x, axis=1)


def count_correct(logits, labels):
    """Correct predictions in the batch, as an int.

    logits (B, C) with C >= 2: (argmax == labels).sum();
    logits (B,) or (B, 1) (one logit, the BCE case): ((z > 0) == labels).sum().
    """
    _check_ndim("logits", logits, (1, 2))
    batch = logits.shape[0]
    if logits.ndim == 1 or logits.shape[1] == 1:
        _check_labels(labels, batch, 2)
        predicted = (logits.reshape(batch) > 0).astype(np.int64)
    else:
        _check_labels(labels, batch, logits.shape[1])
        predicted = np.argmax(logits, axis=1)
    return int(np.count_nonzero(predicted == labels))


def sgd_step(params, grads, velocity, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, first_step=False):
    """One torch.optim.SGD step on flat buffers, in place on params (and velocity).

    Follows torch.optim.sgd._single_tensor_sgd (maximize=False) line by line:
        g = grad + weight_decay * p                  (only if weight_decay != 0)
        if momentum != 0:
            v = g                                    on the first step (PyTorch clones g
                                                     into the fresh buffer: no dampening)
            v = momentum * v + (1 - dampening) * g   afterwards
            g = g + momentum * v  if nesterov  else  v
        p -= lr * g
    velocity may be None when momentum == 0 (it is then neither read nor written).
    grads are not modified. PyTorch's constructor also rejects nesterov with
    momentum <= 0 or dampening != 0; the update rule itself is well defined there, so it is
    applied as written rather than refused.
    """
    dt = _common_float_dtype(params=params, grads=grads, velocity=velocity)
    _check_shape("grads", grads, params.shape)
    if momentum != 0:
        if velocity is None:
            raise ValueError(f"velocity is None, expected an array of shape {params.shape} "
                             f"when momentum is {momentum}")
        _check_shape("velocity", velocity, params.shape)
    g = grads
    if weight_decay != 0:
        g = g + dt.type(weight_decay) * params  # a new array: grads stay untouched
    if momentum != 0:
        if first_step:
            velocity[...] = g
        else:
            velocity *= dt.type(momentum)
            velocity += dt.type(1 - dampening) * g
        if nesterov:
            g = g + dt.type(momentum) * velocity
        else:
            g = velocity
    params -= dt.type(lr) * g


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
                raise TypeError(f"inputs[{i}] has dtype {getattr(arr, 'dtype', type(arr))}, "
                                f"expected uint16")
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
            raise TypeError(f"{name} has dtype {getattr(arr, 'dtype', type(arr))}, expected "
                            f"{np.dtype(dt).name}")
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


# ---------------------------------------------------------------------------------------
# the shared-memory all-reduce (ShmGroup.allreduce; csrc/dp_allreduce.h)

ALLREDUCE_ALGORITHMS = ("native", "ring", "tree")     # dp_allreduce_name's


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
            result[lo - sl.start:hi - sl.start] = acc * scale
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


# ---------------------------------------------------------------------------------------
# convolution and pooling (NCHW, stride 1; see csrc/dp_conv.h)


def _conv_shapes(x, w, padding):
    """(B, C, H, W, OC, KH, KW, OH, OW) after checking x (B, C, H, W) and w (OC, C, KH, KW)."""
    _check_ndim("x", x, (4,))
    _check_ndim("w", w, (4,))
    batch, c, h, wd = x.shape
    oc, wc, kh, kw = w.shape
    if wc != c:
        raise ValueError(f"w has shape {w.shape}, but x has shape {x.shape}: w.shape[1] must be "
                         f"x's channel count {c}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    oh, ow = h + 2 * padding - kh + 1, wd + 2 * padding - kw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"w has shape {w.shape}: its {kh}x{kw} kernel is larger than the "
                         f"{h}x{wd} input of x {x.shape} with padding {padding}")
    return batch, c, h, wd, oc, kh, kw, oh, ow


def _windows(x, kh, kw, padding):
    """(B, C, OH, OW, KH, KW) view of x's zero-padded patches: [n, c, i, j, u, v] is
    x[n, c, i + u - padding, j + v - padding]."""
    p = padding
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
    return np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))


def conv2d_forward(x, w, b, y, *, padding=0, ctx=None):
    """y[:] = conv(x, w) + b, stride 1, zero padding; x (B, C, H, W), w (OC, C, KH, KW),
    b (OC,), y (B, OC, OH, OW) with OH = H + 2 padding - KH + 1 (likewise OW):
    y[n, o, i, j] = b[o] + sum_{c,u,v} w[o, c, u, v] x[n, c, i + u - padding, j + v - padding].
    """
    _common_float_dtype(x=x, w=w, b=b, y=y)
    batch, _, _, _, oc, kh, kw, oh, ow = _conv_shapes(x, w, padding)
    _check_shape("b", b, (oc,))
    _check_shape("y", y, (batch, oc, oh, ow))
    out = np.einsum("ncijuv,ocuv->noij", _windows(x, kh, kw, padding), w, optimize=True)
    y[...] = out + b[None, :, None, None]


def conv2d_backward(dy, x, w, dw, db, dx=None, *, padding=0, ctx=None):
    """dw += d/dw and db += d/db of sum(dy * conv(x, w)); if dx is given, dx[:] = d/dx.

    dy (B, OC, OH, OW), x and dx (B, C, H, W), w and dw (OC, C, KH, KW), db (OC,).
    """
    _common_float_dtype(dy=dy, x=x, w=w, dw=dw, db=db, dx=dx)
    batch, c, h, wd, oc, kh, kw, oh, ow = _conv_shapes(x, w, padding)
    _check_shape("dy", dy, (batch, oc, oh, ow))
    _check_shape("dw", dw, w.shape)
    _check_shape("db", db, (oc,))
    if dx is not None:
        _check_shape("dx", dx, x.shape)
    dw += np.einsum("noij,ncijuv->ocuv", dy, _windows(x, kh, kw, padding), optimize=True)
    db += dy.sum(axis=(0, 2, 3))
    if dx is not None:
        p = padding
        dxp = np.zeros((batch, c, h + 2 * p, wd + 2 * p), dtype=dx.dtype)
        for u in range(kh):          # x[.., i + u, j + v] took part in y[.., i, j] via w[.., u, v]
            for v in range(kw):
                dxp[:, :, u:u + oh, v:v + ow] += np.einsum("noij,oc->ncij", dy, w[:, :, u, v])
        dx[...] = dxp[:, :, p:p + h, p:p + wd]


def _pool_windows(x):
    """(B, C, OH, OW, 4) copy of the 2x2 windows, positions in the order 2 du + dv."""
    batch, c, h, wd = x.shape
    oh, ow = h // 2, wd // 2
    win = x[:, :, :2 * oh, :2 * ow].reshape(batch, c, oh, 2, ow, 2)
    return win.transpose(0, 1, 2, 4, 3, 5).reshape(batch, c, oh, ow, 4)


def _pooled_shape(name, a):
    _check_ndim(name, a, (4,))
    if a.shape[2] < 2 or a.shape[3] < 2:
        raise ValueError(f"{name} has shape {a.shape}: 2x2 pooling needs H >= 2 and W >= 2")
    return a.shape[0], a.shape[1], a.shape[2] // 2, a.shape[3] // 2


def maxpool2_forward(x, y, idx):
    """2x2 max-pooling, stride 2: y[n, c, i, j] = max of x[n, c, 2i:2i+2, 2j:2j+2] (an odd
    last row/column is dropped); idx (uint8) = the maximum's window position 2 du + dv, the
    first maximum as np.argmax picks it (a NaN counts as the maximum)."""
    _common_float_dtype(x=x, y=y)
    shape = _pooled_shape("x", x)
    _check_shape("y", y, shape)
    _check_shape("idx", idx, shape)
    if idx.dtype != np.uint8:
        raise TypeError(f"idx has dtype {idx.dtype}, expected uint8")
    win = _pool_windows(x)
    k = np.argmax(win, axis=-1)
    y[...] = np.take_along_axis(win, k[..., None], axis=-1)[..., 0]
    idx[...] = k


def maxpool2_backward(dy, idx, dx):
    """dx[:] = 0, then dy[n, c, i, j] at the window position idx[n, c, i, j] of each window."""
    _common_float_dtype(dy=dy, dx=dx)
    shape = _pooled_shape("dx", dx)
    _check_shape("dy", dy, shape)
    _check_shape("idx", idx, shape)
    if idx.dtype != np.uint8:
        raise TypeError(f"idx has dtype {idx.dtype}, expected uint8")
    if idx.size and int(idx.max()) > 3:
        raise ValueError(f"idx holds {int(idx.max())}: a window position is 0..3")
    batch, c, oh, ow = shape
    win = np.zeros((batch, c, oh, ow, 4), dtype=dx.dtype)
    np.put_along_axis(win, idx[..., None].astype(np.intp), dy[..., None], axis=-1)
    dx[...] = 0
    dx[:, :, :2 * oh, :2 * ow] = (win.reshape(batch, c, oh, ow, 2, 2).transpose(0, 1, 2, 4, 3, 5)
                                  .reshape(batch, c, 2 * oh, 2 * ow))


# ---------------------------------------------------------------------------------------
# activations and the MSE loss of the general model (twins of csrc/dp_act.h; they have no
# binding of their own: the C core runs them inside Model)


def tanh_forward(x, y):
    """y[:] = tanh(x); y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    np.tanh(x, out=y)


def tanh_backward(dy, y, dx):
    """dx[:] = dy * (1 - y^2); y is the forward *output* (as PyTorch's tanh_backward)."""
    dt = _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    dx[...] = dy * (dt.type(1) - y * y)


def sigmoid_forward(x, y):
    """y[:] = 1 / (1 + exp(-x)), taken as 1 / (1 + e) or e / (1 + e) with e = exp(-|x|) so
    that no exp overflows; y may be x."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    y[...] = _sigmoid(x)


def sigmoid_backward(dy, y, dx):
    """dx[:] = dy * y * (1 - y); y is the forward *output*."""
    dt = _common_float_dtype(dy=dy, y=y, dx=dx)
    _check_shape("y", y, dy.shape)
    _check_shape("dx", dx, dy.shape)
    dx[...] = dy * y * (dt.type(1) - y)


_erfc = np.frompyfunc(math.erfc, 1, 1)   # libm's erfc, element by element (NumPy has none)


def _normal_cdf(x):
    """Phi(x) = 0.5 erfc(-x / sqrt 2) in float64 (the erfc form has no cancellation for
    x << 0, where 0.5 (1 + erf(x / sqrt 2)) has)."""
    return 0.5 * _erfc(-np.asarray(x, np.float64) * math.sqrt(0.5)).astype(np.float64)


def gelu_forward(x, y):
    """y[:] = x Phi(x), Phi the standard normal CDF: PyTorch's nn.GELU() (the erf form, not
    the tanh approximation). GELU(-inf) = -inf * 0 = NaN, as in IEEE arithmetic and the C
    core. Phi is taken in float64 and the product rounded once to the dtype: transcendental
    functions cannot round as a C kernel does anyway (the C core is within a few ulp)."""
    _common_float_dtype(x=x, y=y)
    _check_shape("y", y, x.shape)
    x64 = x.astype(np.float64)
    y[...] = x64 * _normal_cdf(x64)


def gelu_backward(dy, x, dx):
    """dx[:] = dy * (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi); x is the forward
    *input* (GELU's derivative cannot be had from its output). NaN at x = +-inf (inf * 0)."""
    _common_float_dtype(dy=dy, x=x, dx=dx)
    _check_shape("x", x, dy.shape)
    _check_shape("dx", dx, dy.shape)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        slope = _normal_cdf(x64) + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    dx[...] = dy * slope.astype(dx.dtype)


def mse(outputs, targets, doutputs=None, grad_scale=None):
    """Squared error summed over the rows and outputs (PyTorch's MSELoss(reduction='sum'),
    no 1/2); outputs and targets (B, OUT) of one float dtype. Returns float(sum (y - t)^2).
    If doutputs is given, writes doutputs[:] = 2 grad_scale (y - t), grad_scale defaulting to
    1/B (pass 1 / (B OUT) for the gradient of MSELoss()'s mean)."""
    dt = _common_float_dtype(outputs=outputs, targets=targets, doutputs=doutputs)
    _check_ndim("outputs", outputs, (2,))
    _check_shape("targets", targets, outputs.shape)
    if doutputs is not None:
        _check_shape("doutputs", doutputs, outputs.shape)
    batch = outputs.shape[0]
    if batch == 0:
        return 0.0
    diff = outputs - targets                      # (B, OUT), in the dtype
    if doutputs is not None:
        scale = 1.0 / batch if grad_scale is None else grad_scale
        doutputs[...] = dt.type(2) * dt.type(scale) * diff
    d64 = diff.astype(np.float64)
    return float(np.sum(d64 * d64))


# ---------------------------------------------------------------------------------------
# model level: the Model contract (any layer list; docs/core_api.md, "Model", and the
# header comment of csrc/dp_model.h)

# The loss names a Model takes.
MODEL_LOSSES = ("softmax_xent", "sigmoid_bce", "mse")
# Layer kinds and how many sizes each takes: (fewest, most); conv's padding may be left out.
LAYER_SIZES = {"dense": (1, 1), "conv": (2, 3), "maxpool2": (0, 0), "relu": (0, 0),
               "tanh": (0, 0), "sigmoid": (0, 0), "gelu": (0, 0), "flatten": (0, 0)}
MODEL_MAX_LAYERS = 64           # DP_MODEL_MAX_LAYERS (csrc/dp_model.h)
_INT_MAX = 2 ** 31 - 1          # every count the C kernels index with is a C int
_PTRDIFF_MAX = 2 ** 63 - 1      # the flat parameter offsets are ptrdiff_t

_ACTIVATIONS = {  # kind -> (forward, backward, whether backward takes the input (else output))
    "relu": (relu_forward, relu_backward, False),
    "tanh": (tanh_forward, tanh_backward, False),
    "sigmoid": (sigmoid_forward, sigmoid_backward, False),
    "gelu": (gelu_forward, gelu_backward, True),
}


def _is_sequence(obj):
    """What the C parser takes as a sequence (PySequence_Check, a __getitem__ that is not a
    dict's), and not a str."""
    return hasattr(type(obj), "__getitem__") and not isinstance(obj, (str, dict))


def _model_layer(spec, i):
    """One layer spec normalized: ('dense', out), ('conv', out_channels, kernel, padding) or
    (kind,); TypeError/ValueError naming layers[i]."""
    if isinstance(spec, str):
        items = (spec,)
    elif _is_sequence(spec):
        items = tuple(spec)
    else:
        raise TypeError(f"layers[{i}] must be a layer name or a tuple (name, sizes...), got "
                        f"{type(spec).__name__}")
    if not items or not isinstance(items[0], str):
        raise TypeError(f"layers[{i}] = {spec!r}: the first entry must be the layer's name")
    kind = items[0]
    if kind not in LAYER_SIZES:
        raise ValueError(f"layers[{i}]: unknown layer {kind!r} (known: "
                         f"{', '.join(LAYER_SIZES)})")
    fewest, most = LAYER_SIZES[kind]
    if not fewest <= len(items) - 1 <= most:
        takes = {"dense": "one size: ('dense', out_features)",
                 "conv": "('conv', out_channels, kernel) or ('conv', out_channels, kernel, "
                         "padding)"}.get(kind, "no sizes")
        raise ValueError(f"layers[{i}] = {spec!r}: {kind!r} takes {takes}")
    sizes = []
    for j, v in enumerate(items[1:], start=1):
        try:
            v = operator.index(v)                 # int, bool, NumPy integers; not float
        except TypeError:
            raise TypeError(f"layers[{i}] = {spec!r}: sizes must be ints, got "
                            f"{type(v).__name__}") from None
        lowest = 0 if (kind, j) == ("conv", 3) else 1
        if not lowest <= v <= _INT_MAX:
            what = ("the output size", "the kernel size", "padding")[j - 1]
            raise ValueError(f"layers[{i}] = {spec!r}: {what} must be {lowest}..{_INT_MAX}")
        sizes.append(int(v))
    if kind == "conv" and len(sizes) == 2:
        sizes.append(0)
    return (kind, *sizes)


def _model_input_shape(input_shape):
    if not _is_sequence(input_shape):
        raise TypeError(f"input_shape must be a tuple (F,) or (C, H, W), got "
                        f"{type(input_shape).__name__}")
    shape = tuple(input_shape)
    if len(shape) not in (1, 3):
        raise ValueError(f"input_shape {input_shape!r} has {len(shape)} entries, expected (F,) or "
                         f"(C, H, W)")
    try:
        shape = tuple(operator.index(v) for v in shape)
    except TypeError:
        raise TypeError(f"input_shape {input_shape!r}: sizes must be ints") from None
    if not all(1 <= v <= _INT_MAX for v in shape):
        raise ValueError(f"input_shape {input_shape!r}: sizes must be positive ints")
    if math.prod(shape) > _INT_MAX:
        raise ValueError(f"input_shape {input_shape!r}: the input size does not fit an int")
    return tuple(int(v) for v in shape)


def _layer_output(kind, sizes, shape):
    """(output shape, weight shape or None), or the reason the layer refuses its input
    shape as a str (the words of csrc/dp_model.c)."""
    if kind == "dense":
        return (sizes[0],), (sizes[0], math.prod(shape))
    if kind == "conv":
        if len(shape) != 3:
            return "conv needs a (C, H, W) input"
        (oc, k, pad), (c, h, w) = sizes, shape
        if 2 * pad + max(h, w) > _INT_MAX:
            return "conv padding does not fit an int"
        if min(h, w) + 2 * pad < k:
            return "conv kernel larger than the padded input"
        oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
        if max(oh, ow, c * k * k, oh * ow, oc * oh * ow) > _INT_MAX:
            return "conv sizes do not fit an int"
        return (oc, oh, ow), (oc, c, k, k)
    if kind == "maxpool2":
        if len(shape) != 3:
            return "max-pooling needs a (C, H, W) input"
        if min(shape[1:]) < 2:
            return "max-pooling needs a map of at least 2x2"
        return (shape[0], shape[1] // 2, shape[2] // 2), None
    if kind == "flatten":
        return (math.prod(shape),), None
    return shape, None                            # an activation


def model_plan(layers, input_shape, loss="softmax_xent"):
    """_core.model_plan: what Model(layers, input_shape, loss, ...) builds, without the C
    engine's fused 'stages' (its own business): a dict of
      'layers'       the specs normalized: ('dense', out), ('conv', OC, K, padding), (kind,);
      'input_shape'  (F,) or (C, H, W);
      'shapes'       each layer's output shape ((C, H, W) or (F,); flatten and dense give F);
      'n_params'     the length of the flat parameter array;
      'params'       per dense/conv layer, in list order: {'layer': its index, 'weight': the
                     offset of W, 'weight_shape': dense (OUT, IN) / conv (OC, C, K, K),
                     'bias': the offset of b, 'bias_shape': (OUT,)}; W then b, layer by layer;
      'loss'         the loss name.
    TypeError/ValueError naming the layer at fault (the C core's words), the input shape or
    the loss: a dense layer flattens its input, conv and maxpool2 need a (C, H, W) one, the
    kernel must fit the padded input, pooling a map of at least 2x2; at least one dense or
    conv layer; softmax_xent needs >= 2 outputs, sigmoid_bce exactly 1.
    """
    if not isinstance(loss, str):
        raise TypeError(f"loss must be a str, got {type(loss).__name__}")
    if loss not in MODEL_LOSSES:
        raise ValueError(f"loss must be one of {MODEL_LOSSES}, got {loss!r}")
    shape = in_shape = _model_input_shape(input_shape)
    if not _is_sequence(layers):
        raise TypeError(f"layers must be a list of layer specs, got {type(layers).__name__}")
    specs = list(layers)
    if not 1 <= len(specs) <= MODEL_MAX_LAYERS:
        raise ValueError(f"layers has {len(specs)} entries, expected 1 to {MODEL_MAX_LAYERS}")
    specs = [_model_layer(spec, i) for i, spec in enumerate(specs)]
    shapes, params, offset = [], [], 0
    for i, (kind, *sizes) in enumerate(specs):
        out = _layer_output(kind, sizes, shape)
        if not isinstance(out, str) and out[1] is not None:
            n_weights = math.prod(out[1])
            if offset + n_weights + out[1][0] > _PTRDIFF_MAX:
                out = "parameter count overflows"
        if isinstance(out, str):
            raise ValueError(f"layers[{i}] ('{kind}') gets a {shape} input: {out}")
        shape, weight_shape = out
        if weight_shape is not None:        # W, then b
            params.append({"layer": i, "weight": offset, "weight_shape": weight_shape,
                           "bias": offset + n_weights, "bias_shape": (weight_shape[0],)})
            offset += n_weights + weight_shape[0]
        shapes.append(shape)
    if not params:
        raise ValueError("layers has no dense or conv layer: nothing to train")
    n_out = math.prod(shape)
    need = {"softmax_xent": (n_out >= 2, "softmax cross-entropy needs >= 2 outputs"),
            "sigmoid_bce": (n_out == 1, "sigmoid BCE needs exactly 1 output"),
            "mse": (True, "")}[loss]
    if not need[0]:
        last = len(specs) - 1
        raise ValueError(f"loss '{loss}' on this model: {need[1]}, but layers[{last}] "
                         f"('{specs[last][0]}') gives {shape}")
    return {"layers": specs, "input_shape": in_shape, "shapes": shapes, "n_params": offset,
            "params": params, "loss": loss}


def _model_check(plan, params, x):
    """The rows of x (B, in_width), after checking params (n_params,) and x of one dtype."""
    _common_float_dtype(params=params, x=x)
    _check_shape("params", params, (plan["n_params"],))
    _check_ndim("x", x, (2,))
    in_width = math.prod(plan["input_shape"])
    _check_shape("x", x, (x.shape[0], in_width))
    return x.shape[0]


def _model_param_views(plan, flat):
    """{layer index: (W, b)}: views into the flat buffer, in model_plan's layout."""
    views = {}
    for e in plan["params"]:
        w = flat[e["weight"]:e["weight"] + math.prod(e["weight_shape"])]
        views[e["layer"]] = (w.reshape(e["weight_shape"]), flat[e["bias"]:e["bias"] + e["bias_shape"][0]])
    return views


def model_unflatten(layers, input_shape, loss, flat):
    """[(W, b), ...] per dense/conv layer, in list order: views (not copies) into the 1-D
    flat buffer in model_plan's layout, dense W (OUT, IN) row-major, conv W (OC, C, K, K)."""
    plan = model_plan(layers, input_shape, loss)
    _check_shape("flat", flat, (plan["n_params"],))
    views = _model_param_views(plan, flat)
    return [views[e["layer"]] for e in plan["params"]]


def model_init_params(layers, input_shape, loss, seed, dtype=np.float32):
    """PyTorch's default init of nn.Linear and nn.Conv2d in the flat layout (the one
    dptrain.models uses); returns a new 1-D array.

    kaiming_uniform_(a=sqrt(5)) for W is the bound gain * sqrt(3 / fan_in) with gain =
    sqrt(2 / (1 + 5)), which is 1 / sqrt(fan_in), and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
    b; fan_in = IN for a dense layer, C K K for a conv. Draws come from
    np.random.default_rng(seed), layer by layer, W (in row-major order) then b, in float64,
    then are rounded to dtype.
    """
    dtype = np.dtype(dtype)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"dtype is {dtype}, expected float32 or float64")
    rng = np.random.default_rng(seed)
    flat = np.empty(model_plan(layers, input_shape, loss)["n_params"], dtype=dtype)
    for w, b in model_unflatten(layers, input_shape, loss, flat):
        bound = 1.0 / math.sqrt(math.prod(w.shape[1:]))
        w[...] = rng.uniform(-bound, bound, size=w.shape)
        b[...] = rng.uniform(-bound, bound, size=b.shape)
    return flat


def _rows(a):
    """a (B, ...) as (B, features): reshape(B, -1) cannot tell the width of an empty batch."""
    return a.reshape(len(a), math.prod(a.shape[1:]))


def _model_forward(plan, params, x):
    """(acts, codes): acts[l] is layer l's input and acts[l + 1] its output, each
    (B, *shape); codes[l] a maxpool2 layer's argmax codes. Written layer by layer, in the
    list's order (the C core fuses some, with the same values; see csrc/dp_model.h)."""
    batch, dt = x.shape[0], params.dtype
    weights = _model_param_views(plan, params)
    acts, codes = [x.reshape((batch, *plan["input_shape"]))], {}
    for i, (kind, *sizes) in enumerate(plan["layers"]):
        h = acts[-1]
        y = np.empty((batch, *plan["shapes"][i]), dt)
        if kind == "dense":
            dense_forward(_rows(h), *weights[i], y)
        elif kind == "conv":
            conv2d_forward(h, *weights[i], y, padding=sizes[2])
        elif kind == "maxpool2":
            codes[i] = np.empty(y.shape, np.uint8)
            maxpool2_forward(h, y, codes[i])
        elif kind == "flatten":
            y = h.reshape(y.shape)
        else:
            _ACTIVATIONS[kind][0](h, y)
        acts.append(y)
    return acts, codes


def _model_backward(plan, params, grads, acts, codes, dout):
    """ACCUMULATES d(loss)/d(params) into grads from dout = d(loss)/d(outputs), last layer
    first, down to the first dense/conv layer (nothing below it has a parameter)."""
    weights, grad_views = _model_param_views(plan, params), _model_param_views(plan, grads)
    first = plan["params"][0]["layer"]
    d = dout
    for i in range(len(plan["layers"]) - 1, first - 1, -1):
        kind, *sizes = plan["layers"][i]
        h, y = acts[i], acts[i + 1]
        d = d.reshape(y.shape)
        dx = np.empty_like(h) if i > first else None
        if kind == "dense":
            dense_backward(d, _rows(h), weights[i][0], *grad_views[i],
                           None if dx is None else _rows(dx))
        elif kind == "conv":
            conv2d_backward(d, h, weights[i][0], *grad_views[i], dx, padding=sizes[2])
        elif kind == "maxpool2":
            maxpool2_backward(d, codes[i], dx)
        elif kind == "flatten":
            dx = d.reshape(h.shape)
        else:
            forward, backward, from_input = _ACTIVATIONS[kind]
            backward(d, h if from_input else y, dx)
        d = dx


def _model_loss(plan, outputs, labels, doutputs=None, grad_scale=None):
    """(loss_sum, n_correct) of the (B, OUT) outputs; labels are int64 class labels, or the
    (B, OUT) targets for 'mse' (n_correct is then 0)."""
    if plan["loss"] == "mse":
        return mse(outputs, labels, doutputs, grad_scale), 0
    fn = softmax_xent if plan["loss"] == "softmax_xent" else sigmoid_bce
    return fn(outputs, labels, doutputs, grad_scale), count_correct(outputs, labels)


def model_loss_grad(layers, input_shape, loss, params, grads, x, labels, grad_scale=None):
    """Model.loss_grad: forward and backward on one batch -> (loss_sum, n_correct).

    x is (B, in_width) flat rows (a (C, H, W) input in C, H, W order); labels are int64 (B,)
    class labels for softmax_xent / sigmoid_bce, or the (B, OUT) float targets of the
    params' dtype for mse (loss_sum = sum of squared errors, n_correct = 0). The gradient of
    grad_scale * loss_sum is ACCUMULATED into grads (grad_scale defaults to 1/B). An empty
    batch gives (0.0, 0) and leaves grads as they are.
    """
    plan = model_plan(layers, input_shape, loss)
    batch = _model_check(plan, params, x)
    _common_float_dtype(params=params, grads=grads)
    _check_shape("grads", grads, params.shape)
    acts, codes = _model_forward(plan, params, x)
    outputs = _rows(acts[-1])
    dout = np.empty_like(outputs)
    result = _model_loss(plan, outputs, labels, dout, grad_scale)
    if batch:
        _model_backward(plan, params, grads, acts, codes, dout)
    return result


def model_evaluate(layers, input_shape, loss, params, x, labels):
    """Model.evaluate: forward only -> (loss_sum, n_correct) (labels as in model_loss_grad)."""
    plan = model_plan(layers, input_shape, loss)
    _model_check(plan, params, x)
    return _model_loss(plan, _rows(_model_forward(plan, params, x)[0][-1]), labels)


def model_logits(layers, input_shape, loss, params, x, out):
    """Model.logits: forward only, writes the (B, OUT) outputs into out."""
    plan = model_plan(layers, input_shape, loss)
    batch = _model_check(plan, params, x)
    _common_float_dtype(params=params, out=out)
    _check_shape("out", out, (batch, math.prod(plan["shapes"][-1])))
    out[...] = _rows(_model_forward(plan, params, x)[0][-1])
