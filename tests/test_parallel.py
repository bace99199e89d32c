"""The data-parallel engine: N workers equal 1 worker, on every transport; failures stop the
run with the rank named and nothing left behind."""
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dptrain
from dptrain import comm as parallel
from dptrain import sampler
from dptrain.comm.mpi import find_mpiexec

SMALL = dict(model="mlp", hidden=(16,), dataset="synthetic", n_samples=1030, n_features=12,
             epochs=2, batch_size=100, lr=0.05, momentum=0.9, lr_schedule="cosine", quiet=True)


def _train(**kw):
    args = dict(SMALL)
    args.update(kw)
    return dptrain.train(**args)


@pytest.fixture(scope="module")
def sequential():
    return _train()


def _shm_segments():
    return set(glob.glob("/dev/shm/psm_*"))


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_n_workers_equal_one_worker(sequential, backend, workers):
    """Global batch 100 over 1030 samples: the last batch (30) is uneven, and 100 does not
    split evenly over 3 workers either."""
    r = _train(workers=workers, backend=backend)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5,
                               err_msg=f"{backend} x {workers}")
    np.testing.assert_allclose(r["train_loss"], sequential["train_loss"], rtol=1e-5)
    assert r["config"]["workers"] == workers
    assert len(r["rank_phase_seconds"]) == workers


def test_spawned_processes_equal_one_worker(sequential):
    before = _shm_segments()
    r = _train(workers=2, backend="process", start_method="spawn")
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)
    assert _shm_segments() == before


def test_float64_threads_match_tightly():
    a = _train(dtype="float64")
    b = _train(dtype="float64", workers=4, backend="thread")
    np.testing.assert_allclose(b["params"], a["params"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_raising_worker_stops_the_run_and_is_named(backend):
    before = _shm_segments()
    t0 = time.monotonic()
    with pytest.raises(parallel.WorkerError, match=r"worker rank 1 failed: RuntimeError: "
                                                   r"injected fault on rank 1 at step 3") as info:
        _train(workers=3, backend=backend, fault=(1, 3, "raise"))
    assert info.value.rank == 1
    assert time.monotonic() - t0 < 10
    assert _shm_segments() == before


def test_a_killed_worker_process_stops_the_run_and_leaves_nothing_behind():
    import multiprocessing
    before = _shm_segments()
    t0 = time.monotonic()
    with pytest.raises(parallel.WorkerError, match="worker rank 2 failed: killed by signal "
                                                   "SIGKILL") as info:
        _train(workers=3, backend="process", fault=(2, 5, "kill"))
    assert info.value.rank == 2
    assert time.monotonic() - t0 < 10
    assert _shm_segments() == before
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("dptrain")]


@pytest.mark.parametrize("kw, match", [
    (dict(workers=4, batch_size=3), "batch_size=3 is smaller than workers=4"),
    (dict(workers=2, backend="carrier-pigeon"), "backend is 'carrier-pigeon'"),
    (dict(workers=0), "workers must be a positive integer"),
    (dict(fault=(0, 1, "kill"), workers=2, backend="thread"), "use backend='process'"),
    (dict(timeout=-1.0), "timeout must be"),
])
def test_bad_configurations_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        _train(**kw)


def test_oversubscription_warns():
    cores = os.cpu_count() or 1
    with pytest.warns(RuntimeWarning, match="exceeds the"):
        _train(workers=cores + 1, backend="thread", epochs=1)


def test_shard_covers_each_batch_exactly_once():
    for start, stop in [(0, 100), (100, 130), (7, 8)]:
        for world in (1, 2, 3, 4, 8):
            parts = [sampler.shard(start, stop, r, world) for r in range(world)]
            assert parts[0][0] == start and parts[-1][1] == stop
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            sizes = [hi - lo for lo, hi in parts]
            assert max(sizes) - min(sizes) <= 1


# ------------------------------------------------------------------ MPI
def _mpiexec():
    return find_mpiexec()


needs_mpi = pytest.mark.skipif(_mpiexec() is None, reason="mpi4py or mpiexec not installed "
                                                          "(pip install 'dptrain[mpi]')")


def _mpi_weights(ranks, tmp_path, *extra):
    """Trains SMALL's configuration under mpiexec -n ranks (plus extra CLI flags); returns
    the saved weights."""
    weights = tmp_path / "w.npz"
    r = subprocess.run([_mpiexec(), "-n", str(ranks), sys.executable, "-m", "dptrain", "train",
                        "--model", "mlp", "--hidden", "16", "--dataset", "synthetic",
                        "--n-samples", "1030", "--n-features", "12", "--epochs", "2",
                        "--batch-size", "100", "--lr", "0.05", "--momentum", "0.9",
                        "--backend", "mpi", "--quiet", "--save-weights", str(weights), *extra],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return dptrain.load_model(weights).params


@needs_mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_mpi_ranks_equal_one_worker(sequential, ranks, tmp_path):
    got = _mpi_weights(ranks, tmp_path)
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)


@needs_mpi
def test_mpi_ranks_report_their_own_step_breakdown(tmp_path):
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    _mpi_weights(2, tmp_path, "--out", str(out), "--trace", str(trace), "--straggle", "1:3")
    res = json.loads(out.read_text())
    ranks = res["rank_phase_seconds"]
    assert len(ranks) == 2
    # rank 0 waits at the entry barrier for the straggling rank 1
    assert ranks[0]["sync_wait"] > 0.5 * 0.003 * res["steps"] > ranks[1]["sync_wait"]
    tids = {e["tid"] for e in json.loads(trace.read_text())["traceEvents"]}
    assert tids == {0, 1}


@needs_mpi
def test_a_failing_mpi_rank_aborts_every_rank_and_is_named(tmp_path, mpich_leftovers):
    t0 = time.monotonic()
    r = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "dptrain", "train",
                        "--model", "softmax", "--dataset", "synthetic", "--n-samples", "2000",
                        "--epochs", "1", "--backend", "mpi", "--quiet",
                        "--inject-fault", "1:3:raise"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0
    assert "worker rank 1 failed: RuntimeError: injected fault on rank 1 at step 3" in r.stderr
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------ deterministic mode
@pytest.fixture(scope="module")
def deterministic_one():
    return _train(deterministic=True)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_deterministic_weights_are_bitwise_identical_for_any_world_size(deterministic_one,
                                                                        backend, workers):
    r = _train(deterministic=True, workers=workers, backend=backend)
    assert np.array_equal(r["params"], deterministic_one["params"]), (
        f"{backend} x {workers}: max difference "
        f"{np.abs(r['params'] - deterministic_one['params']).max()}")


def test_deterministic_mode_is_still_the_same_model(sequential, deterministic_one):
    np.testing.assert_allclose(deterministic_one["params"], sequential["params"], atol=1e-5)


def test_deterministic_mode_limits_the_world_size():
    with pytest.raises(ValueError, match="up to 8 workers"):
        _train(deterministic=True, workers=9, backend="thread")


@needs_mpi
@pytest.mark.parametrize("ranks", [1, 2])
def test_deterministic_mpi_ranks_are_bitwise_identical(deterministic_one, ranks, tmp_path):
    got = _mpi_weights(ranks, tmp_path, "--deterministic")
    assert np.array_equal(got, deterministic_one["params"])


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("workers, backend, deterministic", [
    (1, "thread", True), (2, "thread", True), (2, "process", False), (4, "thread", False)])
def test_a_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path, workers, backend,
                                                                  deterministic):
    kw = dict(workers=workers, backend=backend, deterministic=deterministic)
    whole = _train(**kw)
    ckpt = tmp_path / "run.ckpt.npz"
    # 11 steps per epoch: die in the second epoch, after the checkpoint of step 15
    with pytest.raises((parallel.WorkerError, RuntimeError), match="injected fault"):
        _train(checkpoint=ckpt, checkpoint_every=5, fault=(0, 17, "raise"), **kw)
    assert ckpt.is_file()
    resumed = _train(resume=ckpt, **kw)
    assert np.array_equal(resumed["params"], whole["params"])
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], rel=1e-6)
    assert [h["epoch"] for h in resumed["epochs"]] == [1, 2]


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    ckpt = tmp_path / "c.npz"
    _train(checkpoint=ckpt, checkpoint_every=3)
    with pytest.raises(ValueError, match="batch_size=100, but this run has batch_size=50"):
        _train(resume=ckpt, batch_size=50)
    with pytest.raises(ValueError, match="no checkpoint file"):
        _train(resume=tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint path"):
        _train(checkpoint_every=3)


# ------------------------------------------------------------------ weak scaling
def test_batch_per_worker_is_the_global_batch_split(sequential):
    r = _train(workers=2, backend="thread", batch_size=None, batch_per_worker=50)
    assert r["config"]["batch_size"] == 100
    np.testing.assert_allclose(r["params"], sequential["params"], atol=1e-5)


def test_scale_lr_and_warmup():
    a = _train(workers=2, backend="thread", lr=0.025, scale_lr=True, lr_schedule="constant")
    b = _train(workers=2, backend="thread", lr=0.05, lr_schedule="constant")
    assert a["config"]["lr"] == pytest.approx(0.05) and a["config"]["base_lr"] == 0.025
    np.testing.assert_array_equal(a["params"], b["params"])
    w = _train(warmup_epochs=1.0, lr_schedule="constant")
    assert w["job"]["warmup_steps"] == 11           # one epoch of 1030 / 100 batches
    assert not np.array_equal(w["params"], b["params"])
    with pytest.raises(ValueError, match="warmup_epochs must be"):
        _train(warmup_epochs=float("nan"))


# ------------------------------------------------------------------ algorithms
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_parameter_server_on_shared_memory_equals_one_worker(sequential, backend):
    r = _train(workers=3, backend=backend, allreduce="ps")
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_point_to_point_schedules_on_shared_memory_equal_one_worker(sequential, backend,
                                                                    algorithm, workers):
    r = _train(workers=workers, backend=backend, allreduce=algorithm)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5,
                               err_msg=f"{algorithm} on {backend} x {workers}")


def test_ring_and_tree_with_buckets_and_an_unknown_algorithm():
    a = _train(workers=2, backend="thread", allreduce="ring", bucket_kb=0.25)
    b = _train(workers=2, backend="thread", allreduce="tree", bucket_kb=0.25)
    np.testing.assert_allclose(a["params"], b["params"], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="allreduce is 'butterfly'"):
        _train(allreduce="butterfly")


@needs_mpi
@pytest.mark.parametrize("algorithm", ["native", "ring", "tree", "ps"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_mpi_algorithm_equals_one_worker(sequential, algorithm, ranks, tmp_path):
    got = _mpi_weights(ranks, tmp_path, "--allreduce", algorithm)
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)


# ------------------------------------------------------------------ buckets
def test_buckets_cover_the_gradient_last_layer_first():
    from dptrain.engine import gradient_buckets
    assert gradient_buckets(10, 4, 0) == [(0, 10)]
    b = gradient_buckets(1000, 4, 1.0)                 # 256 floats per bucket
    assert b[0] == (744, 1000) and b[-1] == (0, 232)
    assert all(x[0] == y[1] for x, y in zip(b, b[1:]))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_bucketed_exchange_equals_one_worker(sequential, backend):
    r = _train(workers=2, backend=backend, bucket_kb=0.25)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


# ------------------------------------------------------------------ overlap
@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("bucket_kb", [0, 0.25])
def test_overlapped_exchange_equals_one_worker(sequential, backend, bucket_kb):
    r = _train(workers=2, backend=backend, bucket_kb=bucket_kb, overlap=True)
    np.testing.assert_allclose(r["params"], sequential["params"], rtol=0, atol=1e-5)


def test_overlap_with_a_failing_worker_still_stops_promptly():
    t0 = time.monotonic()
    with pytest.raises(parallel.WorkerError, match="worker rank 1 failed"):
        _train(workers=3, backend="thread", bucket_kb=0.25, overlap=True, fault=(1, 4, "raise"))
    assert time.monotonic() - t0 < 10


def test_overlap_rejects_combinations_it_cannot_run():
    with pytest.raises(ValueError, match="overlap works with allreduce='native'"):
        _train(workers=2, backend="thread", overlap=True, allreduce="ps")
    with pytest.raises(ValueError, match="overlap works with"):
        _train(overlap=True, deterministic=True)


@needs_mpi
def test_overlapped_mpi_equals_one_worker(sequential, tmp_path):
    got = _mpi_weights(2, tmp_path, "--bucket-kb", "0.25", "--overlap")
    np.testing.assert_allclose(got, sequential["params"], rtol=0, atol=1e-5)


@needs_mpi
def test_mpi_workers_must_match_the_world_size():
    with pytest.raises(ValueError, match="mpiexec -n 2"):
        _train(workers=2, backend="mpi")


# ------------------------------------------------------------------ MPI launch detection
@pytest.mark.parametrize("var", [v for v, _ in parallel.mpi.MPI_LAUNCH_VARIABLES])
def test_backend_follows_the_mpi_launcher(monkeypatch, var):
    for v, _ in parallel.mpi.MPI_LAUNCH_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    assert parallel.resolve_backend(None) == ("thread", None)
    monkeypatch.setenv(var, "1")                        # one rank: nothing to coordinate
    assert parallel.resolve_backend(None) == ("thread", None)
    assert parallel.resolve_backend("process") == ("process", None)
    monkeypatch.setenv(var, "4")
    backend, note = parallel.resolve_backend(None)
    assert backend == "mpi" and f"{var}=4" in note and "4 ranks" in note
    assert parallel.resolve_backend("mpi") == ("mpi", None)
    for explicit in ("thread", "process"):
        with pytest.raises(ValueError, match=rf"one of 4 ranks, but backend='{explicit}' .*"
                                             rf"--backend mpi"):
            parallel.resolve_backend(explicit)
    with pytest.raises(ValueError, match="backend is 'gpu'"):
        parallel.resolve_backend("gpu")


ROOT = Path(__file__).resolve().parent.parent


@needs_mpi
def test_mpiexec_without_backend_runs_one_mpi_training_from_the_clone_root(tmp_path):
    """The README's way in: `mpiexec -n 2 python -m dptrain train` from the clone's root
    (where ./dptrain is first on sys.path) trains once on 2 MPI ranks and says so."""
    out = tmp_path / "run.json"
    r = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "dptrain", "train",
                        "--model", "softmax", "--dataset", "synthetic", "--n-samples", "2000",
                        "--epochs", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert "as one of 2 ranks: using the MPI backend" in first, r.stdout
    assert r.stdout.count("epoch 1/1") == 1              # one training, reported once
    res = json.loads(out.read_text())
    assert res["config"]["backend"] == "mpi" and res["config"]["workers"] == 2


@needs_mpi
def test_mpiexec_with_a_non_mpi_backend_is_refused(tmp_path):
    r = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "dptrain", "train",
                        "--model", "softmax", "--dataset", "synthetic", "--n-samples", "500",
                        "--epochs", "1", "--backend", "thread"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0
    assert "one of 2 ranks, but backend='thread'" in r.stderr and "--backend mpi" in r.stderr
    assert "epoch" not in r.stdout



def _extras_as_seen(comm):
    """A forked worker's view of the launcher's extras: where x lies, its sum, which extras
    the segment holds."""
    x = comm.extra("x")
    return x.ctypes.data, float(x.sum()), sorted(comm.layout.extras)


def test_process_workers_get_the_extras_inherited_or_copied():
    """Under fork a worker reads the launcher's own array, inherited at its address (no copy
    in the segment); under spawn a copy in the segment. Either way the same values. (The
    spawned workers' targets are picklable callables from the standard library: a function
    of this module would have to be imported there, and tests/ is not a package.)"""
    import operator

    from dptrain.comm.shm import run_processes
    x = np.arange(3000, dtype=np.float64).reshape(100, 30)
    for address, total, in_segment in run_processes(2, _extras_as_seen, extras={"x": x},
                                                    start_method="fork"):
        assert address == x.ctypes.data and total == float(x.sum()) and in_segment == []
    for seen in run_processes(2, operator.methodcaller("extra", "x"), extras={"x": x},
                              start_method="spawn"):
        np.testing.assert_array_equal(seen, x)
    for layout in run_processes(2, operator.attrgetter("layout.extras"), extras={"x": x},
                                start_method="spawn"):
        assert sorted(layout) == ["x"]
