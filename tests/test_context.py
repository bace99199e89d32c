"""dptrain._core.Context (csrc/mod_context.c; its threads are csrc/dp_threads.h's team): the
threads attribute, its arguments, contexts and their pools freed, two Python threads sharing
one, a fresh pool used at once, and a threaded model in a forked child.
"""

import os
import sys
import threading
import time

import numpy as np
import pytest
from _core_helpers import (
    assert_rejected,
    gemm_job,
    make_calls,
    mlp_spec,
    run_gemm,
    run_threads,
    small_net,
)

from dptrain import MLP
from dptrain import _core as core

pytestmark = pytest.mark.kernels  # the C core's, in-process: safe beside other tests


def test_context_threads_attribute():
    assert core.Context().threads == 1
    assert core.Context(threads=3).threads == 3


@pytest.mark.boundary
def test_context_arguments_rejected():
    with pytest.raises(ValueError, match="threads"):
        core.Context(threads=0)
    with pytest.raises(ValueError, match="threads"):
        core.Context(threads=100000)
    call = make_calls()["gemm"]
    call.kwargs["ctx"] = "not a context"
    assert_rejected(call, TypeError, "ctx", what="gemm(ctx='not a context')")


@pytest.mark.boundary
def test_context_objects_are_freed():
    """Context with a thread pool: create, use and drop many; the helper threads exit."""
    a, b, c = np.ones((64, 128)), np.ones((128, 128)), np.empty((64, 128))
    start_threads = threading.active_count()
    for _ in range(50):
        ctx = core.Context(threads=3)
        core.gemm(a, b, c, ctx=ctx)
        assert sys.getrefcount(ctx) == 2
        del ctx
    assert threading.active_count() == start_threads


@pytest.mark.boundary
def test_two_threads_sharing_one_context():
    ctx = core.Context(threads=2)
    jobs = [gemm_job(s, ctx) for s in (3, 4)]
    seq = [run_gemm(j, 1)[0] for j in jobs]
    results = run_threads([lambda j=j: run_gemm(j, 10) for j in jobs])
    for i, outs in enumerate(results):
        for c in outs:
            np.testing.assert_array_equal(c, seq[i], err_msg=f"thread {i} gemm with shared ctx")


@pytest.mark.boundary
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_fresh_thread_pool_used_at_once_does_not_deadlock(threads):
    """Regression: a helper thread that started after the first job was posted used to
    skip that job and leave the caller waiting forever. Create-and-use, many times."""
    a, b, c = np.ones((64, 256)), np.ones((256, 256)), np.empty((64, 256))
    params, grads, x, labels = small_net(sizes=(6, 64, 3), batch=256)

    def churn():
        for _ in range(100):
            core.gemm(a, b, c, ctx=core.Context(threads=threads))
            core.Model(*mlp_spec((6, 64, 3)), params, grads, threads=threads).loss_grad(x, labels)
        return True

    assert run_threads([churn]) == [True]
    np.testing.assert_array_equal(c, np.full((64, 256), 256.0))


# ---------------------------------------------------------------------------------------
# behaviour fixed after review


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_threaded_model_keeps_working_in_a_forked_child():
    m = MLP((64, 256, 10), threads=2)
    x = np.random.default_rng(0).random((128, 64), dtype=np.float32)
    y = np.zeros(128, np.int64)
    expected = m.loss_grad(x, y)[0]
    pid = os.fork()
    if pid == 0:  # the child: its pool has no threads; must not hang
        try:
            ok = abs(m.loss_grad(x, y)[0] - expected) < 1e-4
            del m
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in a threaded kernel")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
