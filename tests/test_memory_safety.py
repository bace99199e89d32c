"""Memory safety at the C boundary: each case below was a segfault, a use after free, a heap
overflow or a silently wrong result in dptrain 0.1 (found by a review; the fuzzer in
fuzz_core.py closes the class). Every reproducer that could crash runs in a child process,
so a regression fails one test instead of killing the suite."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from _core_helpers import cnn_spec, mlp_spec

from dptrain import _core as core
from dptrain import reference as ref

# also run under ASan (test_asan_extension); in-process, safe beside other tests
pytestmark = [pytest.mark.boundary, pytest.mark.kernels]


def run_isolated(code: str) -> str:
    """Runs code in a fresh interpreter; returns its stdout, failing the test (with the
    signal) when it crashes."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, (
        f"exit {r.returncode} (negative: killed by that signal)\n{r.stdout}\n{r.stderr}"
    )
    return r.stdout


def net(sizes=(10, 8, 3), loss="softmax_xent", dtype=np.float32):
    p = ref.model_init_params(*mlp_spec(sizes, loss), 0, np.dtype(dtype))
    g = np.zeros(p.size, dtype)
    return core.Model(*mlp_spec(sizes, loss), p, g), p, g


# ---------------------------------------------------------------- 1. the sweep's held input
@pytest.mark.parametrize("case", ["logistic fast path", "empty batch"])
def test_a_fused_call_ends_the_sweep_and_backward_refuses(case):
    out = run_isolated(f"""
        import numpy as np
        from dptrain import _core as core, reference as ref
        case = {case!r}
        layers = ([("dense", 1)] if case == "logistic fast path"
                  else [("dense", 8), "relu", ("dense", 3)])
        loss = "sigmoid_bce" if case == "logistic fast path" else "softmax_xent"
        p = ref.model_init_params(layers, (10,), loss, 0, np.dtype(np.float64))
        net = core.Model(layers, (10,), loss, p, np.zeros(p.size))
        labels = np.zeros(200_000, np.int64)
        net.forward_loss(np.ones((200_000, 10)), labels)
        rows = 4 if case == "logistic fast path" else 0
        net.loss_grad(np.ones((rows, 10)), labels[:rows])      # drops the held x
        try:
            net.backward_layer(net.n_param_layers - 1)
        except RuntimeError as exc:
            print("refused:", exc)
        """)
    assert "refused: backward_layer" in out and "no forward_loss to go back from" in out


def test_a_resized_sweep_input_is_refused():
    n, p, g = net()
    x = np.ones((40, 10), np.float32)
    n.forward_loss(x, np.zeros(40, np.int64))
    x.resize((4, 10), refcheck=False)  # frees the memory the sweep read
    with pytest.raises(ValueError, match=r"x given to forward_loss was resized or moved"):
        n.backward_layer(1)


# ---------------------------------------------------------------- 2. outputs aliasing inputs
def test_softmax_xent_refuses_labels_that_share_dlogits():
    buf = np.zeros(16, np.float64)
    logits = np.zeros((8, 2))
    dlogits = buf.reshape(8, 2)
    labels = buf[:8].view(np.int64)
    with pytest.raises(ValueError, match=r"dlogits shares memory with labels"):
        core.softmax_xent(logits, labels, dlogits)
    with pytest.raises(ValueError, match=r"dlogits shares memory with labels"):
        core.sigmoid_bce(np.zeros(8), buf[:8].view(np.int64), buf[:8])


def test_gather_rows_refuses_an_index_that_shares_out():
    x = np.arange(20.0).reshape(10, 2)
    out = np.zeros((4, 2))
    index = out.reshape(-1)[:4].view(np.int64)
    with pytest.raises(ValueError, match=r"out shares memory with index"):
        core.gather_rows(x, index, out)


def test_argmax_refuses_an_out_that_overlaps_x():
    x = np.random.default_rng(0).standard_normal((8, 4))
    before = x.copy()
    with pytest.raises(ValueError, match=r"out shares memory with x"):
        core.argmax(x, x.reshape(-1)[:8].view(np.int64))
    np.testing.assert_array_equal(x, before)


def test_model_grads_must_not_overlap_its_batch():
    n, p, g = net()
    x = g[:40].reshape(4, 10)  # the batch is a view of the gradient
    with pytest.raises(ValueError, match=r"grads shares memory with x"):
        n.loss_grad(x, np.zeros(4, np.int64))


# ---------------------------------------------------------------- 3. references in copied rows
@pytest.mark.parametrize("dtype", [object, "U3", "S2", [("a", "f4"), ("b", object)], "V8"])
def test_gather_rows_copies_only_numeric_rows(dtype):
    x = np.empty((4, 2), dtype=dtype)
    out = np.empty((2, 2), dtype=dtype)
    with pytest.raises(TypeError, match=r"gather_rows copies rows of a numeric dtype"):
        core.gather_rows(x, np.array([0, 3]), out)


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int8, np.uint16, np.int64, np.float16, np.float32, np.complex128]
)
def test_gather_rows_copies_every_numeric_dtype(dtype):
    x = (np.arange(12) % 5).astype(dtype).reshape(6, 2)
    out = np.empty((3, 2), dtype)
    core.gather_rows(x, np.array([5, 0, 2]), out)
    np.testing.assert_array_equal(out, x[[5, 0, 2]])


# ---------------------------------------------------------------- 4. held arrays changed in place
@pytest.mark.parametrize(
    "held, change",
    [(held, change) for held in ("params", "grads") for change in ("retype", "reshape", "resize")]
    + [("grads", "read-only")],
)  # params are only read: read-only is fine
def test_a_model_refuses_held_arrays_changed_after_it_was_built(held, change):
    n, p, g = net((10, 8, 2))  # an even parameter count: it can be re-typed
    a = {"params": p, "grads": g}[held]
    if change == "retype":
        a.dtype = np.float64  # NumPy allows it: half as many elements
    elif change == "reshape":
        a.shape = (1, a.size)
    elif change == "resize":
        a.resize(a.size * 4, refcheck=False)  # new memory; the old is freed
    else:
        a.flags.writeable = False
    wide = held == "params" and change == "retype"
    x, y = np.ones((4, 10), np.float64 if wide else np.float32), np.zeros(4, np.int64)
    message = (
        r"grads is read-only, but it is written to \(Model\.grads was made read-only"
        if change == "read-only"
        else rf"Model\.{held} was changed after the Model "
        rf"was built"
    )
    calls = [lambda: n.loss_grad(x, y), lambda: n.forward_loss(x, y), lambda: n.backward_layer(1)]
    if held == "params":
        calls.append(lambda: n.evaluate(x, y))
    else:  # forward-only calls never touch grads
        n.evaluate(x.astype(p.dtype), y)
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()


def test_a_model_with_conv_blocks_refuses_retyped_params():
    spec = cnn_spec((1, 8, 8), [2], [2])  # 58 parameters: re-typeable
    size = ref.model_plan(*spec)["n_params"]
    p, g = np.zeros(size, np.float32), np.zeros(size, np.float32)
    cnet = core.Model(*spec, p, g)
    p.dtype = np.float64
    with pytest.raises(ValueError, match=r"Model\.params was changed after"):
        cnet.loss_grad(np.ones((2, 32)), np.zeros(2, np.int64))


def test_a_shm_group_refuses_a_retyped_buffer():
    control = np.zeros(256 + 64, np.uint8)
    control = control[(-control.ctypes.data) % 64 :][:256]
    core.init_group_control(control, 1)
    buf = np.zeros(8, np.float32)
    group = core.ShmGroup(control, [buf], 0)
    group.allreduce()
    buf.dtype = np.float64
    with pytest.raises(ValueError, match=r"buffers\[0\] was changed after the ShmGroup was built"):
        group.allreduce()
    group.abort(3)  # aborting needs only the control block
    assert group.aborted == 3


def test_a_shm_group_buffer_must_not_overlap_its_control_block():
    mem = np.zeros(1024, np.uint8)
    mem = mem[(-mem.ctypes.data) % 64 :][:512]
    core.init_group_control(mem[:256], 1)
    with pytest.raises(ValueError, match=r"buffers\[0\] shares memory with control"):
        core.ShmGroup(mem[:256], [mem[:64].view(np.float32)], 0)


# ---------------------------------------------------------------- 5. silently wrong results
@pytest.mark.parametrize(
    "sizes, error",
    [
        ([2**32, 2**32], ValueError),
        ([2**31, 3], ValueError),
        ([2**63, 3], ValueError),
        ([2**31 - 1] * 17, ValueError),
        ([3, 2.0], TypeError),
        ([0, 3], ValueError),
    ],
)
def test_model_plan_refuses_sizes_that_do_not_fit(sizes, error):
    with pytest.raises(error):
        core.model_plan(*mlp_spec(sizes))


def test_model_plan_accepts_numpy_integers():
    assert core.model_plan(*mlp_spec(np.array([784, 256, 10])))["n_params"] == 256 * 785 + 10 * 257


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_naive_convolution_pads_with_zeros_like_the_reference(dtype):
    x = np.ones((1, 1, 3, 3), dtype)
    w = np.zeros((1, 1, 3, 3), dtype)
    w[0, 0, 0, 0] = np.inf  # over the padding at output (0, 0)
    b = np.zeros(1, dtype)
    want = np.empty((1, 1, 3, 3), dtype)
    with np.errstate(invalid="ignore"):  # inf * 0: the NaN is the point
        ref.conv2d_forward(x, w, b, want, padding=1)
    assert np.isnan(want[0, 0, 0, 0])
    for fn in (core.conv2d_forward_naive, core.conv2d_forward):
        y = np.empty((1, 1, 3, 3), dtype)
        fn(x, w, b, y, padding=1)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))


# ---------------------------------------------------------------- 6. the split API and threads
def test_a_sweep_belongs_to_the_thread_that_started_it():
    n, p, g = net()
    x, y = np.ones((6, 10), np.float32), np.zeros(6, np.int64)
    n.forward_loss(x, y)
    errors = []

    def other():
        for call in (
            lambda: n.forward_loss(x, y),
            lambda: n.backward_layer(1),
            lambda: n.loss_grad(x, y),
            lambda: n.evaluate(x, y),
        ):
            try:
                call()
            except RuntimeError as exc:
                errors.append(str(exc))

    t = threading.Thread(target=other)
    t.start()
    t.join(60)
    assert len(errors) == 4 and all("started by another thread" in e for e in errors)
    n.backward_layer(1)  # the owner finishes its sweep undisturbed
    n.backward_layer(0)
    got = g.copy()
    g[:] = 0
    n.loss_grad(x, y)
    np.testing.assert_array_equal(got, g)


def test_a_sweep_left_by_a_thread_that_ended_is_taken_back():
    """Issue 37: a thread that starts a sweep and ends without finishing it used to lock the
    object for good (every other thread's call refused). Its sweep can never be finished, so
    the next call takes it back: loss_grad, evaluate and a new sweep of this thread run, and
    backward_layer says there is no forward_loss to go back from."""
    n, p, g = net()
    x, y = np.ones((6, 10), np.float32), np.zeros(6, np.int64)
    g[:] = 0
    n.loss_grad(x, y)
    want = g.copy()
    for call in (
        lambda: n.loss_grad(x, y),
        lambda: n.evaluate(x, y),
        lambda: n.forward_loss(x, y),
        lambda: n.backward_layer(1),
    ):
        t = threading.Thread(target=lambda: n.forward_loss(x, y))
        t.start()
        t.join(60)
        g[:] = 0
        try:
            call()
        except RuntimeError as exc:
            assert "no forward_loss to go back from" in str(exc), exc
    n.forward_loss(x, y)  # this thread's own sweep, whole
    g[:] = 0
    n.backward_layer(1)
    n.backward_layer(0)
    np.testing.assert_array_equal(g, want)
    # a thread that is alive still owns its sweep
    started, finish = threading.Event(), threading.Event()

    def owner():
        n.forward_loss(x, y)
        started.set()
        finish.wait(60)
        n.backward_layer(1)
        n.backward_layer(0)

    t = threading.Thread(target=owner)
    t.start()
    started.wait(60)
    with pytest.raises(RuntimeError, match="started by another thread"):
        n.loss_grad(x, y)
    finish.set()
    t.join(60)
    n.loss_grad(x, y)


def test_interleaved_sweeps_never_give_a_wrong_gradient():
    """Two threads run forward_loss + backward_layer sweeps on one object: every sweep either
    completes with exactly the fused loss_grad's gradient, or is refused with an error."""
    sizes = (12, 16, 4)
    n, p, g = net(sizes)
    rng = np.random.default_rng(1)
    batches = [
        (rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(2)
    ]
    want = []
    for x, y in batches:
        g[:] = 0
        n.loss_grad(x, y)
        want.append(g.copy())
    wrong, done, refused = [], [0, 0], [0, 0]
    lock = threading.Lock()

    def worker(k):
        x, y = batches[k]
        mine = np.zeros_like(g)
        for _ in range(400):
            mine[:] = 0
            try:
                n.forward_loss(x, y)
                n.backward_layer(1, mine)
                n.backward_layer(0, mine)
            except RuntimeError as exc:
                assert "another thread" in str(exc) or "no forward_loss" in str(exc), exc
                refused[k] += 1
                continue
            with lock:
                if not np.array_equal(mine, want[k]):
                    wrong.append(k)
            done[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not wrong and sum(done) > 0 and sum(done) + sum(refused) == 800
