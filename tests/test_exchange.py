"""The gradient exchange strategies (dptrain.engine.exchange): deterministic chunks, the
parameter server, the ring and tree schedules, buckets and overlap, each equal to one worker
on every transport (deterministic mode bit for bit)."""

import time

import numpy as np
import pytest

from dptrain import comm as parallel


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_deterministic_weights_are_bitwise_identical_for_any_world_size(
    train_small, deterministic_one, backend, workers
):
    r = train_small(deterministic=True, workers=workers, backend=backend)
    assert np.array_equal(r["params"], deterministic_one["params"]), (
        f"{backend} x {workers}: max difference "
        f"{np.abs(r['params'] - deterministic_one['params']).max()}"
    )


def test_deterministic_mode_is_still_the_same_model(sequential, deterministic_one):
    np.testing.assert_allclose(deterministic_one["params"], sequential["params"], atol=1e-5)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_deterministic_mpi_ranks_are_bitwise_identical(mpi_weights, deterministic_one, ranks):
    got = mpi_weights(ranks, "--deterministic")
    assert np.array_equal(got, deterministic_one["params"])


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_parameter_server_on_shared_memory_equals_one_worker(train_small, sequential, backend):
    r = train_small(workers=3, backend=backend, allreduce="ps")
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_point_to_point_schedules_on_shared_memory_equal_one_worker(
    train_small, sequential, backend, algorithm, workers
):
    r = train_small(workers=workers, backend=backend, allreduce=algorithm)
    np.testing.assert_allclose(
        r["params"],
        sequential["params"],
        rtol=0,
        atol=1e-5,
        err_msg=f"{algorithm} on {backend} x {workers}",
    )


def test_ring_and_tree_with_buckets_and_an_unknown_algorithm(train_small):
    a = train_small(workers=2, backend="thread", allreduce="ring", bucket_kb=0.25)
    b = train_small(workers=2, backend="thread", allreduce="tree", bucket_kb=0.25)
    np.testing.assert_allclose(a["params"], b["params"], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="allreduce is 'butterfly'"):
        train_small(allreduce="butterfly")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "ring", "tree", "ps"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_mpi_algorithm_equals_one_worker(mpi_weights, sequential, algorithm, ranks):
    got = mpi_weights(ranks, "--allreduce", algorithm)
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)


def test_buckets_cover_the_gradient_last_layer_first():
    from dptrain.engine import gradient_buckets

    assert gradient_buckets(10, 4, 0) == [(0, 10)]
    b = gradient_buckets(1000, 4, 1.0)  # 256 floats per bucket
    assert b[0] == (744, 1000) and b[-1] == (0, 232)
    assert all(x[0] == y[1] for x, y in zip(b, b[1:]))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_bucketed_exchange_equals_one_worker(train_small, sequential, backend):
    r = train_small(workers=2, backend=backend, bucket_kb=0.25)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("bucket_kb", [0, 0.25])
def test_overlapped_exchange_equals_one_worker(train_small, sequential, backend, bucket_kb):
    r = train_small(workers=2, backend=backend, bucket_kb=bucket_kb, overlap=True)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


def test_overlap_with_a_failing_worker_still_stops_promptly(train_small):
    t0 = time.monotonic()
    with pytest.raises(parallel.WorkerError, match="worker rank 1 failed"):
        train_small(
            workers=3, backend="thread", bucket_kb=0.25, overlap=True, fault=(1, 4, "raise")
        )
    assert time.monotonic() - t0 < 10


@pytest.mark.mpi
def test_overlapped_mpi_equals_one_worker(mpi_weights, sequential):
    got = mpi_weights(2, "--bucket-kb", "0.25", "--overlap")
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)
