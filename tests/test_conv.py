"""The convolution (csrc/dp_conv.h): dptrain._core.conv2d_forward / conv2d_backward and their
loop twins against dptrain.reference.conv2d_forward / conv2d_backward over odd shapes (sizes
1, 3, 7; padding 0 and 1; float32 and float64; every kernel ISA this CPU has, conftest.isa),
with a tolerance relative to the magnitude of the summed terms (|got - want| <= RTOL sqrt(K) *
sum of |terms|), with a Context, against central finite differences; and their boundary.
"""

import numpy as np
import pytest
from _core_helpers import (
    BAD_CALLS,
    DTYPES,
    assert_close_terms,
    check_bad_kernel_arguments_are_named,
    conv_data,
    conv_gil_cases,
    dname,
    family_tests,
    numeric_grad,
    rng_for,
)

from dptrain import _core as core
from dptrain import reference as ref

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests

# (B, C, H, W, OC, KH, KW): sizes 1, 3, 7 mixed, non-square images and kernels, a kernel as
# large as the image, 1x1 (no im2col copy), and the two layers of the studies' CNN
CONV_SHAPES = [
    (1, 1, 1, 1, 1, 1, 1),
    (3, 1, 7, 7, 1, 3, 3),
    (1, 3, 7, 3, 7, 3, 3),
    (7, 3, 3, 7, 3, 1, 3),
    (3, 7, 7, 7, 3, 3, 1),
    (1, 3, 7, 7, 3, 7, 7),
    (3, 7, 3, 3, 7, 1, 1),
    (1, 7, 3, 7, 1, 3, 7),
    (2, 3, 32, 32, 32, 3, 3),
    (2, 32, 15, 15, 64, 3, 3),
]


def conv_cases(max_work=None):
    """(shape, padding) pairs whose kernel fits; max_work bounds B C OC H W (the loop twin)."""
    for shape in CONV_SHAPES:
        for pad in (0, 1):
            b, c, h, w, oc, kh, kw = shape
            if max_work and b * c * oc * h * w > max_work:
                continue
            if h + 2 * pad >= kh and w + 2 * pad >= kw:
                yield pytest.param(shape, pad, id="x".join(map(str, shape)) + f"-p{pad}")


def conv_magnitudes(x, w, b, dy, pad):
    """Sums of |terms| of every output of forward and backward (the reference on |.|)."""
    ax, aw, ab, ady = (np.abs(a).astype(np.float64) for a in (x, w, b, dy))
    y = np.empty(dy.shape)
    ref.conv2d_forward(ax, aw, ab, y, padding=pad)
    dw, db, dx = np.zeros(aw.shape), np.zeros(ab.shape), np.empty(ax.shape)
    ref.conv2d_backward(ady, ax, aw, dw, db, dx, padding=pad)
    return y, dw, db, dx


def check_conv(fwd, bwd, shape, pad, dtype, what, **kw):
    x, w, b, dy = conv_data(shape, pad, dtype)
    inputs = [a.copy() for a in (x, w, b, dy)]
    y_mag, dw_mag, db_mag, dx_mag = conv_magnitudes(x, w, b, dy, pad)
    k_fwd = w[0].size
    what = f"{what} shape={shape} padding={pad} dtype={dname(dtype)}"

    y, y_ref = np.full(dy.shape, np.nan, dtype), np.empty(dy.shape, dtype)
    fwd(x, w, b, y, padding=pad, **kw)
    ref.conv2d_forward(x, w, b, y_ref, padding=pad)
    assert_close_terms(y, y_ref, y_mag, dtype=dtype, k=k_fwd, what=f"{what}: y")

    # dw, db accumulate onto what is there; dx is written over NaN
    start_w = rng_for("start", shape).standard_normal(w.shape).astype(dtype)
    start_b = rng_for("start_b", shape).standard_normal(b.shape).astype(dtype)
    dw, db, dx = start_w.copy(), start_b.copy(), np.full(x.shape, np.nan, dtype)
    dw_ref, db_ref, dx_ref = start_w.copy(), start_b.copy(), np.empty(x.shape, dtype)
    bwd(dy, x, w, dw, db, dx, padding=pad, **kw)
    ref.conv2d_backward(dy, x, w, dw_ref, db_ref, dx_ref, padding=pad)
    positions = dy[0, 0].size * dy.shape[0]
    assert_close_terms(
        dw, dw_ref, dw_mag + np.abs(start_w), dtype=dtype, k=positions, what=f"{what}: dw"
    )
    assert_close_terms(
        db, db_ref, db_mag + np.abs(start_b), dtype=dtype, k=positions, what=f"{what}: db"
    )
    assert_close_terms(
        dx, dx_ref, dx_mag, dtype=dtype, k=w.shape[0] * w[0, 0].size, what=f"{what}: dx"
    )
    # without dx, dw and db are the same
    dw2, db2 = start_w.copy(), start_b.copy()
    bwd(dy, x, w, dw2, db2, padding=pad, **kw)
    np.testing.assert_array_equal(dw2, dw, err_msg=f"{what}: dw without dx")
    for before, after, name in zip(inputs, (x, w, b, dy), ("x", "w", "b", "dy")):
        np.testing.assert_array_equal(after, before, err_msg=f"{what}: input {name} modified")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape,pad", list(conv_cases()))
def test_conv2d_matches_reference(isa, shape, pad, dtype):
    check_conv(core.conv2d_forward, core.conv2d_backward, shape, pad, dtype, f"conv2d[{isa}]")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("shape,pad", list(conv_cases(max_work=20000)))
def test_conv2d_naive_twin_matches_reference(shape, pad, dtype):
    check_conv(
        core.conv2d_forward_naive, core.conv2d_backward_naive, shape, pad, dtype, "conv2d_naive"
    )


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_conv2d_with_a_context(threads, dtype):
    ctx = core.Context(threads=threads)
    for shape, pad in [((3, 7, 7, 7, 3, 3, 1), 1), ((2, 32, 15, 15, 64, 3, 3), 0)]:
        check_conv(
            core.conv2d_forward,
            core.conv2d_backward,
            shape,
            pad,
            dtype,
            f"conv2d[Context(threads={threads})]",
            ctx=ctx,
        )


@pytest.mark.parametrize("pad", [0, 1])
def test_conv2d_backward_matches_finite_differences(pad):
    rng = np.random.default_rng(pad)
    x = rng.standard_normal((2, 2, 5, 4))
    w = rng.standard_normal((3, 2, 3, 2))
    b = rng.standard_normal(3)
    oh, ow = 5 + 2 * pad - 2, 4 + 2 * pad - 1
    g = rng.standard_normal((2, 3, oh, ow))

    def loss():
        y = np.empty(g.shape)
        core.conv2d_forward(x, w, b, y, padding=pad)
        return float((g * y).sum())

    dw, db, dx = np.zeros_like(w), np.zeros_like(b), np.empty_like(x)
    core.conv2d_backward(g, x, w, dw, db, dx, padding=pad)
    for name, analytic, arr in (("dw", dw, w), ("db", db, b), ("dx", dx, x)):
        numeric = numeric_grad(loss, arr)
        err = np.abs(analytic - numeric).max() / np.abs(numeric).max()
        assert err < 1e-8, f"conv2d_backward padding={pad}: {name} relative error {err:.2e}"


# ---------------------------------------------------------------------------------------
# boundary


@pytest.mark.parametrize("name", [n for n in BAD_CALLS if not n.startswith("pool")])
def test_bad_kernel_arguments_are_named(name):
    check_bad_kernel_arguments_are_named(name)


# ---------------------------------------------------------------------------------------
# the boundary table's checks on this family's kernels (_core_helpers.family_tests)

globals().update(
    family_tests(
        ("conv2d_forward", "conv2d_backward"),
        gil=("conv2d_forward", "conv2d_backward"),
        cases=conv_gil_cases,
    )
)


def _plane_cases(n=48):
    """Random geometries the plane path takes (float32 with padding or a stride): strides 1-4,
    padding past the kernel's reach, maps narrower than a vector, channel counts off 8."""
    rng = np.random.default_rng(36)
    cases = []
    while len(cases) < n:
        c, oc = int(rng.integers(1, 20)), int(rng.integers(1, 70))
        h, w = int(rng.integers(1, 36)), int(rng.integers(1, 36))
        k, pad, stride = int(rng.integers(1, 6)), int(rng.integers(0, 4)), int(rng.integers(1, 5))
        if h + 2 * pad >= k and w + 2 * pad >= k and (pad or stride > 1):
            cases.append((c, h, w, oc, k, pad, stride))
    return cases


def _winograd_cases():
    """Geometries whose forward (16 channels or more) or input gradient (16 filters or more)
    is Winograd's F(2x2, 3x3) (3x3, padding 1, stride 1, even maps): one 2x2 tile, a tile row
    narrower than a vector, rows of whole vectors and not, counts off 8, more tiles than a
    chunk holds (its tile rows split between chunks); both, the forward alone, the input
    gradient alone; ResNet's first stage (16 maps of 32 x 32), tile rows of half a vector and
    of 5 (the output transform's whole, half and scalar stores); 24 channels in all, whose
    passes on AVX2 (72 tiles) are longer than on AVX-512 (48)."""
    return [
        (16, 32, 32, 16, 3, 1, 1),
        (16, 12, 16, 20, 3, 1, 1),
        (20, 10, 10, 16, 3, 1, 1),
        (16, 8, 8, 8, 3, 1, 1),
        (16, 16, 16, 8, 3, 1, 1),
        (8, 16, 16, 16, 3, 1, 1),
        (16, 6, 8, 48, 3, 1, 1),
        (3, 2, 2, 33, 3, 1, 1),
        (32, 2, 2, 5, 3, 1, 1),
        (37, 4, 6, 1, 3, 1, 1),
        (32, 8, 8, 64, 3, 1, 1),
        (64, 8, 8, 13, 3, 1, 1),
        (33, 10, 14, 40, 3, 1, 1),
        (32, 16, 16, 32, 3, 1, 1),
        (40, 30, 8, 9, 3, 1, 1),
        (32, 2, 34, 8, 3, 1, 1),
    ]


@pytest.mark.parametrize(
    "case",
    _plane_cases() + _winograd_cases(),
    ids=lambda c: "c{}-{}x{}-oc{}-k{}-p{}-s{}".format(*c),
)
def test_the_plane_path_matches_float64s_im2col_path(isa, case):
    """A network's conv on the plane path (float32 on the AVX2 and AVX-512 builds: forward,
    Winograd's where it takes it, weight gradient and, the conv not being first, input
    gradient, phase by phase) against the same network in float64 (im2col + GEMM): the loss
    and every gradient agree to float32's rounding (the generic build: im2col in both)."""
    from dptrain import nn

    c, h, w, oc, k, pad, stride = case
    layers = [nn.Conv2d(c, 1), nn.Conv2d(oc, k, padding=pad, stride=stride), nn.Flatten()]
    layers.append(nn.Dense(3))
    m64 = nn.Sequential(layers, input_shape=(2, h, w), dtype="float64", seed=5)
    m32 = nn.Sequential(layers, input_shape=(2, h, w), dtype="float32", seed=5)
    m32.params[:] = m64.params
    m64.params[:] = m32.params  # the float32 values, exactly
    rng = rng_for("plane", case)
    x = rng.standard_normal((5, 2 * h * w))
    y = rng.integers(0, 3, 5)
    g64, g32 = np.zeros_like(m64.grads), np.zeros_like(m32.grads)
    l64 = m64.loss_grad(x, y, grads=g64)[0]
    l32 = m32.loss_grad(x.astype(np.float32), y, grads=g32)[0]
    assert abs(l32 - l64) <= 1e-4 * max(1.0, abs(l64)), (l32, l64)
    scale = np.abs(g64).max()
    worst = np.abs(g32 - g64).max()
    assert worst <= 1e-4 * scale + 1e-6, f"gradient off by {worst:.3g} (largest {scale:.3g})"
