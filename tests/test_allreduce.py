"""The shared-memory all-reduce (csrc/dp_allreduce.h): dptrain._core.ShmGroup.allreduce on
thread workers, against its twin dptrain.reference.allreduce (bit for bit) and against the
sums written here: native (rank order), ring and tree, ranges, repeated calls, bfloat16
buffers, what each algorithm refuses, and the wait it returns. (The group's barrier, abort
and timeout: test_sync.py; the process backend's tests cover the same group across
processes.)
"""

import time

import numpy as np
import pytest
from _core_helpers import control_block, run_workers

from dptrain import _core, reference


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length", [1, 17, 1000, 70001])
def test_allreduce_sums_every_buffer_in_rank_order(n, dtype, length):
    rng = np.random.default_rng(n * 1000 + length)
    bufs = [rng.standard_normal(length).astype(dtype) for _ in range(n)]
    expected = bufs[0].copy()
    for b in bufs[1:]:
        expected = expected + b  # rank order, the same rounding as the kernel
    expected = expected * dtype(0.25)
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r) for r in range(n)]
    run_workers(n, lambda r: groups[r].allreduce(0.25))
    for r, b in enumerate(bufs):
        assert np.array_equal(b, expected), f"rank {r}, n={n}, {np.dtype(dtype).name}, {length}"


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length", [1, 5, 1000, 70001])
def test_point_to_point_schedules_sum_and_agree_bitwise(algorithm, n, dtype, length):
    rng = np.random.default_rng(n * 1000 + length)
    bufs = [rng.standard_normal(length).astype(dtype) for _ in range(n)]
    exact = np.sum([b.astype(np.float64) for b in bufs], axis=0) * 0.5
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r, algorithm=algorithm) for r in range(n)]
    run_workers(n, lambda r: groups[r].allreduce(0.5))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for r, b in enumerate(bufs):
        # every worker holds the same bits (a chain sum copied, or x + y against y + x)
        assert np.array_equal(b, bufs[0]), f"{algorithm} n={n}: rank {r} differs from rank 0"
    np.testing.assert_allclose(
        bufs[0],
        exact,
        rtol=tol,
        atol=tol * n,
        err_msg=f"{algorithm} n={n} {np.dtype(dtype).name} {length}",
    )


@pytest.mark.parametrize("algorithm", reference.ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "length,start,stop",
    [(1, 0, None), (17, 0, None), (1000, 3, 997), (70001, 0, None), (70001, 4099, 65000)],
)
def test_allreduce_is_its_twin_bit_for_bit(algorithm, n, dtype, length, start, stop):
    """Every worker's buffer after ShmGroup.allreduce is reference.allreduce's, to the bit:
    the native sum in rank order, and the ring's and the tree's own orders of summation."""
    rng = np.random.default_rng([n, length, start])
    bufs = [rng.standard_normal(length).astype(dtype) for _ in range(n)]
    want = [b.copy() for b in bufs]
    reference.allreduce(want, scale=0.3, start=start, stop=stop, algorithm=algorithm)
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r, algorithm=algorithm) for r in range(n)]
    run_workers(n, lambda r: groups[r].allreduce(0.3, start, stop))
    for r, (got, expected) in enumerate(zip(bufs, want)):
        np.testing.assert_array_equal(
            got,
            expected,
            strict=True,
            err_msg=f"allreduce {algorithm} n={n} rank {r} "
            f"{np.dtype(dtype).name} [{start}:{stop}] of {length}",
        )


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_point_to_point_schedules_of_a_range_and_repeated_calls(algorithm):
    n, length = 3, 4000
    bufs = [np.full(length, r + 1.0, np.float32) for r in range(n)]
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r, algorithm=algorithm) for r in range(n)]

    def work(r):
        waits = [groups[r].allreduce(start=100, stop=3001) for _ in range(20)]
        assert all(isinstance(w, float) and w >= 0 for w in waits)

    run_workers(n, work)
    for r, b in enumerate(bufs):
        assert (b[100:3001] == 6.0 * 3**19).all(), f"rank {r}"
        assert (b[:100] == r + 1).all() and (b[3001:] == r + 1).all(), f"rank {r}: outside range"


def test_allreduce_and_barrier_return_the_entry_wait():
    n = 2
    bufs = [np.ones(64), np.ones(64)]
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r) for r in range(n)]

    def work(r):
        if r == 1:
            time.sleep(0.2)  # rank 0 waits for rank 1 at the entry barrier
        return groups[r].allreduce(), groups[r].barrier()

    (w0, b0), (w1, b1) = run_workers(n, work)
    assert w0 > 0.15 and w1 < 0.1, (w0, w1)
    assert 0 <= b0 < 0.1 and 0 <= b1 < 0.1


def test_point_to_point_schedules_reject_what_they_cannot_do():
    bufs = [np.zeros(8), np.zeros(8)]
    ctrl = control_block()
    _core.init_group_control(ctrl, 2)
    with pytest.raises(ValueError, match="algorithm is 'butterfly'"):
        _core.ShmGroup(ctrl, bufs, 0, algorithm="butterfly")
    with pytest.raises(ValueError, match="one buffer per worker .* and no out array"):
        _core.ShmGroup(ctrl, bufs, 0, algorithm="ring", out=np.zeros(8))
    with pytest.raises(ValueError, match="buffers has 3 arrays, but the group has 2 workers"):
        _core.ShmGroup(ctrl, bufs + [np.zeros(8)], 0, algorithm="tree")


def test_allreduce_of_a_range_leaves_the_rest_alone():
    n, length = 3, 5000
    bufs = [np.full(length, r + 1.0) for r in range(n)]
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r) for r in range(n)]
    run_workers(n, lambda r: groups[r].allreduce(start=1000, stop=2345))
    for r, b in enumerate(bufs):
        assert np.all(b[1000:2345] == 6.0)
        assert np.all(b[:1000] == r + 1) and np.all(b[2345:] == r + 1)


def test_many_back_to_back_collectives_do_not_hang_or_mix_up_phases():
    n = 4
    bufs = [np.zeros(64) for _ in range(n)]
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r) for r in range(n)]

    def work(r):
        for step in range(300):
            bufs[r][:] = r + step
            groups[r].allreduce()
            assert bufs[r][0] == sum(q + step for q in range(n))
            groups[r].barrier()  # nobody overwrites before everyone has read

    run_workers(n, work)


def to_bits(x):
    """float32 -> the bits (uint16) of its nearest bfloat16 (reference.to_bf16)."""
    out = np.empty(np.shape(x), np.uint16)
    reference.to_bf16(np.asarray(x, np.float32), out)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_a_shared_memory_group_sums_bfloat16_buffers_into_bfloat16(n):
    rng = np.random.default_rng(n)
    bufs = [to_bits(rng.standard_normal(70001).astype(np.float32)) for _ in range(n)]
    want = np.empty(70001, np.uint16)
    reference.sum_buffers(want, bufs, scale=0.25)  # float32 sum in rank order, rounded
    out = np.zeros(70001, np.uint16)
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r, out=out) for r in range(n)]
    run_workers(n, lambda r: groups[r].allreduce(0.25))
    assert np.array_equal(out, want)
    with pytest.raises(ValueError, match="bfloat16 buffers \\(uint16\\) are summed into an out"):
        _core.ShmGroup(ctrl, bufs, 0)
    with pytest.raises(TypeError, match="out has dtype float32, expected uint16"):
        _core.ShmGroup(ctrl, bufs, 0, out=np.zeros(70001, np.float32))
