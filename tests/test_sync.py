"""The shared-memory group of the C core (csrc/dp_sync.h): its barrier, abort, timeout and
control block, and ShmGroup's arguments, on thread workers (the process backend's tests cover
the same group across processes). The all-reduce over it: test_allreduce.py.
"""

import numpy as np
import pytest
from _core_helpers import control_block, run_workers

from dptrain import _core


def test_abort_wakes_every_waiter_with_its_code():
    n = 3
    bufs = [np.zeros(8) for _ in range(n)]
    ctrl = control_block()
    _core.init_group_control(ctrl, n)
    groups = [_core.ShmGroup(ctrl, bufs, r) for r in range(n)]

    def work(r):
        if r == 2:
            groups[r].abort(7)  # rank 2 fails instead of arriving
            return "aborted"
        with pytest.raises(_core.GroupAborted) as info:
            groups[r].allreduce()
        return info.value.args[1]

    assert run_workers(n, work) == [7, 7, "aborted"]
    assert groups[0].aborted == 7
    with pytest.raises(_core.GroupAborted):  # and later calls fail at once
        groups[0].barrier()


def test_timeout_names_the_rank():
    ctrl = control_block()
    _core.init_group_control(ctrl, 2)
    bufs = [np.zeros(4), np.zeros(4)]
    g = _core.ShmGroup(ctrl, bufs, 1, timeout=0.2)
    with pytest.raises(TimeoutError, match="allreduce on rank 1 timed out after 0.2 s"):
        g.allreduce()


@pytest.mark.parametrize("algorithm", ["native", "ring", "tree"])
def test_a_rank_late_inside_a_collective_is_named(algorithm):
    """Issue 37: a rank that met the first barrier of a collective, then stopped (stalled
    inside the reduction), used to leave its peer saying "yet no rank is missing": arrivals
    were counted at a collective's first barrier only. Every barrier counts now."""
    n = 2
    nbytes = _core.group_control_bytes(n)
    raw = np.zeros(nbytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    ctrl = raw[off : off + nbytes]
    _core.init_group_control(ctrl, n)
    bufs = [np.ones(64) for _ in range(n)]
    groups = [_core.ShmGroup(ctrl, bufs, r, timeout=0.3, algorithm=algorithm) for r in range(n)]

    def work(r):
        if r == 1:
            groups[1].barrier()  # rank 0's all-reduce passes its entry; rank 1 goes no further
            return None
        with pytest.raises(TimeoutError) as info:
            groups[0].allreduce()
        return str(info.value)

    message = run_workers(n, work)[0]
    assert "rank 1 did not arrive" in message, message


def test_bad_group_arguments():
    ctrl = control_block()
    bufs = [np.zeros(4), np.zeros(4)]
    with pytest.raises(ValueError, match="not initialized"):
        _core.ShmGroup(ctrl, bufs, 0)
    _core.init_group_control(ctrl, 2)
    with pytest.raises(ValueError, match="buffers has 3 arrays, but the group has 2 workers"):
        _core.ShmGroup(ctrl, bufs + [np.zeros(4)], 0)
    with pytest.raises(ValueError, match="rank must be in"):
        _core.ShmGroup(ctrl, bufs, 2)
    with pytest.raises(ValueError, match=r"buffers\[1\] has shape \(5,\), expected \(4,\)"):
        _core.ShmGroup(ctrl, [np.zeros(4), np.zeros(5)], 0)
    with pytest.raises(TypeError, match=r"buffers\[1\] has dtype float32"):
        _core.ShmGroup(ctrl, [np.zeros(4), np.zeros(4, np.float32)], 0)
    with pytest.raises(ValueError, match="shares memory"):
        _core.ShmGroup(ctrl, [bufs[0], bufs[0]], 0)
    with pytest.raises(ValueError, match="64-byte aligned"):
        _core.init_group_control(np.zeros(100, np.uint8)[1:], 2)
    g = _core.ShmGroup(ctrl, bufs, 0)
    with pytest.raises(ValueError, match="start=3, stop=9 is not a range"):
        g.allreduce(start=3, stop=9)


def test_a_timed_out_wait_aborts_the_group_instead_of_leaving_a_stale_arrival():
    ctrl = control_block()
    _core.init_group_control(ctrl, 2)
    g = _core.ShmGroup(ctrl, [np.zeros(4), np.zeros(4)], 0, timeout=0.1)
    with pytest.raises(TimeoutError):
        g.barrier()
    with pytest.raises(_core.GroupAborted):
        g.barrier()  # not a barrier that opens one worker short


def test_a_foreign_control_block_is_rejected_not_trusted():
    ctrl = control_block()
    _core.init_group_control(ctrl, 2)
    ctrl[16:20] = np.frombuffer(np.uint32(5000).tobytes(), np.uint8)  # n = 5000
    with pytest.raises(ValueError, match="group of 5000 workers"):
        _core.ShmGroup(ctrl, [np.zeros(1) for _ in range(5000)], 0)


def test_init_group_control_writes_its_block_and_nothing_past_it():
    """The barrier and n arrival counters (group_control_bytes(n)) are zeroed and set; a
    control array that is part of a larger buffer keeps the rest as it was."""
    from dptrain.comm.base import aligned_zeros

    mem = aligned_zeros(512, np.uint8)
    mem[:] = 0xAB
    block = _core.group_control_bytes(3)
    _core.init_group_control(mem, 3)
    words = mem[:64].view(np.uint32)
    assert words[4] == 3 and words[5] != 0  # n and the magic
    assert not mem[24:block].any() and not mem[:16].any()  # the rest of the block: zero
    assert (mem[block:] == 0xAB).all()
    mem[:] = 0xAB  # a block with no room for the
    _core.init_group_control(mem[:64], 3)  # counters: 64 bytes only
    assert (mem[64:] == 0xAB).all()
