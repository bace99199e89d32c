"""MPI ranks that share memory inside their node (dptrain.comm.hier): the collectives on
1, 2 and 4 (simulated) nodes against the exact sums, training equal to one worker, the same
bits in deterministic mode whatever the split of ranks into nodes, the abort and the
breakdown. Run under mpiexec; the nodes are simulated on this machine (DPTRAIN_MPI_NODES /
--mpi-nodes), so the inter-node path runs here."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from _runs import SMALL_FLAGS

import dptrain
from dptrain.comm.mpi import find_mpiexec

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.mpi  # MPI ranks under mpiexec (conftest skips without)

# tests/_runs.py's SMALL, as CLI flags, under MPI
CLI = [*SMALL_FLAGS, "--backend", "mpi"]


def _run(ranks, args, env=None, timeout=300):
    # outside the checkout (its dptrain/ has no built extension), in a directory removed after
    with tempfile.TemporaryDirectory(prefix="dptrain-hier-") as cwd:
        return subprocess.run(
            [MPIEXEC, "-n", str(ranks), sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )


def _train(ranks, tmp_path, *extra, env=None):
    """SMALL under mpiexec -n ranks (plus CLI flags): (saved weights, the result JSON)."""
    weights, out = tmp_path / "w.npz", tmp_path / "run.json"
    r = _run(
        ranks,
        ["-m", "dptrain", "train", *CLI, "--save-weights", str(weights), "--out", str(out), *extra],
        env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return dptrain.load_model(weights).params, json.loads(out.read_text())


COLLECTIVES = textwrap.dedent("""
    import sys
    import time
    import numpy as np
    from mpi4py import MPI
    from dptrain.comm import HierComm
    w = MPI.COMM_WORLD
    c = HierComm(w, nodes=int(sys.argv[1]))
    r, p = c.rank, c.size
    assert (r, p) == (w.Get_rank(), w.Get_size())
    for alg in ("native", "ring", "tree"):
        for dt in (np.float32, np.float64):
            for n in (1, 7, 1000, 70001):
                a = c.zeros(n, dt, algorithm=alg)
                a[:] = np.random.default_rng(r + 10 * n).standard_normal(n)
                every = w.allgather(a.copy())
                c.allreduce_sum_(a, scale=0.5)
                exact = np.sum(np.array(every, np.float64), axis=0) * 0.5
                tol = 1e-5 if dt == np.float32 else 1e-12
                assert np.allclose(a, exact, rtol=tol, atol=tol), (alg, dt, n)
                bits = w.allgather(a.tobytes())
                assert all(b == bits[0] for b in bits), ("ranks differ", alg, dt, n)
                a[:] = r + 1
                stop = max(1, n // 2)
                c.allreduce_sum_(a, start=1, stop=stop)
                assert np.all(a[1:stop] == p * (p + 1) / 2) and (n == 1 or a[0] == r + 1)
    for dt in (np.float32, np.float64):              # overlap: on the comm thread
        a = c.zeros(5000, dt)
        a[:] = r + 1
        handles = [c.allreduce_async_(a, 2000, 5000), c.allreduce_async_(a, 0, 2000)]
        c.wait_(handles)
        assert np.all(a == p * (p + 1) / 2), ("async", dt)
    # a collective, and a new array's set-up, while an exchange is in flight (the last rank
    # late): each waits for it first, and every sum is whole
    # (different values: a message matched to the wrong collective shows)
    a, b = c.zeros(300, np.float64), c.zeros(300, np.float64)
    a[:], b[:] = r + 1, 100 * (r + 1)
    if r == p - 1:
        time.sleep(0.3)
    first = c.allreduce_async_(a)
    s = np.full(300, 10.0 * (r + 1))
    c.allreduce_sum_(s)
    second = c.allreduce_async_(b)
    c.wait_([first, second])
    whole = p * (p + 1) / 2
    assert np.all(a == whole) and np.all(s == 10 * whole) and np.all(b == 100 * whole), (
        "in flight", a[0], s[0], b[0])
    plain = np.full(5, float(r))                    # not from zeros: staged
    c.allreduce_sum_(plain)
    assert np.all(plain == p * (p - 1) / 2)
    for root in range(p):
        x = c.zeros(9, np.float64)
        x[:] = r
        c.broadcast_(x, root)
        assert np.all(x == root), (root, x)
    x = c.zeros(9, np.float32)
    x[:] = r + 1
    total = c.reduce_sum_(x, 0)
    assert r != 0 or np.all(total == p * (p + 1) / 2), total
    chunks = c.shared_zeros(8, 33, np.float64)
    out = c.shared_zeros(1, 33, np.float64)[0]
    for i in range(r * 8 // p, (r + 1) * 8 // p):
        chunks[i][:] = i + 1
    c.sum_into_(out, chunks, scale=2.0)
    assert np.all(out == 72), out
    c.barrier()
    seen = w.gather((c.nodes, c.node_members))
    if r == 0:
        print("layouts", *{str(v) for v in seen})
    c.close_windows()
""")


@pytest.mark.parametrize(
    "ranks,nodes,layout",
    [
        (4, 1, [[0, 1, 2, 3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (4, 4, [[0], [1], [2], [3]]),
        (3, 2, [[0, 1], [2]]),
    ],
)
def test_collectives_on_simulated_nodes_give_the_exact_sums(tmp_path, ranks, nodes, layout):
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    r = _run(ranks, [str(script), str(nodes)], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"layouts {(nodes, layout)}", r.stdout


@pytest.mark.parametrize(
    "extra",
    [
        ("--mpi-nodes", "2"),
        ("--mpi-nodes", "2", "--allreduce", "ring"),
        ("--mpi-nodes", "2", "--allreduce", "ps"),
        ("--mpi-nodes", "2", "--bucket-kb", "0.25", "--overlap"),
    ],
)
def test_four_ranks_as_two_nodes_equal_sequential(sequential, tmp_path, extra):
    params, res = _train(4, tmp_path, *extra)
    np.testing.assert_allclose(params, sequential["params"], rtol=0, atol=1e-5)
    assert res["config"]["mpi_layout"] == [[0, 1], [2, 3]]


def test_two_ranks_on_one_node_equal_sequential(sequential, tmp_path):
    params, res = _train(2, tmp_path)
    np.testing.assert_allclose(params, sequential["params"], rtol=0, atol=1e-5)
    assert res["config"]["mpi_layout"] == [[0, 1]]


def test_no_mpi_shm_is_the_flat_mpi_all_reduce(sequential, tmp_path):
    params, res = _train(2, tmp_path, "--no-mpi-shm")
    np.testing.assert_allclose(params, sequential["params"], rtol=0, atol=1e-5)
    assert res["config"]["mpi_layout"] is None and res["config"]["mpi_shm"] is False


def test_deterministic_weights_are_the_same_bits_for_every_layout(deterministic_one, tmp_path):
    one = deterministic_one["params"]
    layouts = {
        "4 ranks, 2 nodes": (4, ("--mpi-nodes", "2"), None),
        "4 ranks, 4 nodes": (4, (), {"DPTRAIN_MPI_NODES": "4"}),
        "4 ranks, 1 node": (4, (), None),
        "4 ranks, flat MPI": (4, ("--no-mpi-shm",), None),
        "2 ranks, 2 nodes": (2, ("--mpi-nodes", "2"), None),
    }
    for name, (ranks, extra, env) in layouts.items():
        params, _ = _train(ranks, tmp_path, "--deterministic", *extra, env=env)
        assert np.array_equal(params, one), f"{name}: max difference {np.abs(params - one).max()}"


def test_the_breakdown_has_every_rank_and_the_straggler_is_waited_for(tmp_path):
    trace = tmp_path / "trace.json"
    _, res = _train(4, tmp_path, "--mpi-nodes", "2", "--trace", str(trace), "--straggle", "3:3")
    ranks = res["rank_phase_seconds"]
    assert len(ranks) == 4
    # rank 3 (node 1) straggles: its node partner waits inside the node, the other node's
    # leader across nodes (rank 1 waits for its own leader's transfer, counted as such)
    assert min(ranks[2]["sync_wait"], ranks[0]["sync_wait"]) > 0.5 * 0.003 * res["steps"]
    assert ranks[3]["sync_wait"] < ranks[2]["sync_wait"]
    assert {e["tid"] for e in json.loads(trace.read_text())["traceEvents"]} == {0, 1, 2, 3}


def test_a_failing_rank_on_another_node_stops_every_rank_and_is_named(mpich_leftovers):
    r = _run(
        4,
        ["-m", "dptrain", "train", *CLI, "--mpi-nodes", "2", "--inject-fault", "3:3:raise"],
        timeout=60,
    )
    assert r.returncode != 0
    assert "worker rank 3 failed: RuntimeError: injected fault on rank 3 at step 3" in r.stderr


def test_bad_node_counts_are_refused_with_the_value(tmp_path):
    with pytest.raises(ValueError, match="mpi_nodes must be an integer >= 0, got -1"):
        dptrain.TrainConfig(mpi_nodes=-1)
    r = _run(2, ["-m", "dptrain", "train", *CLI], env={"DPTRAIN_MPI_NODES": "two"}, timeout=60)
    assert r.returncode != 0 and "DPTRAIN_MPI_NODES is 'two'" in r.stderr
    r = _run(2, ["-m", "dptrain", "train", *CLI, "--mpi-nodes", "3"], timeout=60)
    assert (
        r.returncode != 0
        and "nodes is 3, expected 0 (the real nodes) to the world size 2" in r.stderr
    )


def test_a_timeout_inside_a_node_names_the_world_ranks(mpich_leftovers):
    # a timeout well above the start-up skew of 4 ranks on 2 cores (a tight one can fire at
    # the first broadcast on a loaded machine, naming whichever rank was late there)
    r = _run(
        4,
        [
            "-m",
            "dptrain",
            "train",
            *CLI,
            "--mpi-nodes",
            "2",
            "--timeout",
            "2",
            "--straggle",
            "3:20000",
        ],
        timeout=120,
    )
    assert r.returncode != 0
    assert "worker rank 2 failed: TimeoutError" in r.stderr, r.stderr
    assert (
        "rank 1 did not arrive (ranks of node 1, numbered in it: 0...1 are world ranks 2, 3)"
    ) in r.stderr, r.stderr


def test_a_rank_waiting_for_its_leader_says_so(mpich_leftovers):
    """Rank 3 alone on its node straggles: nobody of its node can time out, its leader-peers
    wait in MPI (no timeout), and rank 1 waits twice the timeout for its leader's result."""
    r = _run(
        4,
        [
            "-m",
            "dptrain",
            "train",
            *CLI,
            "--mpi-nodes",
            "3",
            "--timeout",
            "2",
            "--straggle",
            "3:20000",
        ],
        timeout=120,
    )
    assert r.returncode != 0
    assert (
        "worker rank 1 failed: LeaderWaitTimeout: rank 1 waited 4 s for its node's leader "
        "(world rank 0) to finish the exchange between nodes"
    ) in r.stderr, r.stderr


def test_deterministic_bfloat16_weights_are_the_same_bits_under_mpi(train_small, tmp_path):
    """The bfloat16 exchange (uint16 chunks gathered between nodes, summed over shared memory
    or after MPI's all-gather) gives the single worker's bits."""
    one = train_small(dtype="bfloat16", comm_dtype="bfloat16", deterministic=True)["params"]
    for name, (ranks, extra) in {
        "2 ranks, 2 nodes": (2, ("--mpi-nodes", "2")),
        "2 ranks, flat MPI": (2, ("--no-mpi-shm",)),
    }.items():
        params, res = _train(
            ranks,
            tmp_path,
            "--deterministic",
            "--dtype",
            "bfloat16",
            "--comm-dtype",
            "bfloat16",
            *extra,
        )
        assert res["config"]["comm_dtype"] == "bfloat16"
        assert np.array_equal(params, one), f"{name}: max difference {np.abs(params - one).max()}"


def test_the_bfloat16_exchange_runs_under_mpi(tmp_path, sequential):
    params, res = _train(
        2, tmp_path, "--dtype", "bfloat16", "--comm-dtype", "bfloat16", "--mpi-nodes", "2"
    )
    assert res["config"]["comm_dtype"] == "bfloat16"
    # the float32 single worker's model, to bfloat16's precision
    assert np.abs(params - sequential["params"]).max() <= 0.02 * np.abs(sequential["params"]).max()
