"""The sharded update (engine.exchange.ShardedUpdate, TrainConfig's shard_update): workers
sharing memory hold the parameters and the optimizer's state once and each sums and updates
its own slice of them.

- it takes the bits of every worker updating everything (AllReduce): parameters, velocity and
  the optimizer's own state, for SGD (momentum, Nesterov, weight decay), Adam and AdamW, on
  thread and process workers, 2 and 3 of them, and through a checkpoint and its resume;
- it runs where asked (shard_update=True), and the result says which exchange ran;
- shard_update=True where it cannot apply is refused, naming the options in the way (the CLI
  names the flags);
- the collective under it, reduce_scatter_into_, sums this rank's slice (the others may not
  be summed yet: only a later barrier publishes them).
"""

from __future__ import annotations

import numpy as np
import pytest
from _runs import SMALL

import dptrain
from dptrain.cli import main
from dptrain.comm import WorkerError, launch
from dptrain.comm.base import line_slice

OPTIMIZERS = [
    dict(optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(optimizer="adam"),
    dict(optimizer="adamw", weight_decay=0.05),
]


def _state(r):
    """Everything a run leaves behind that the update writes: the parameters, the velocity
    (the model's) and the optimizer's own arrays."""
    return [r["params"], r.model.velocity] + [
        v for _, v in sorted(r["optimizer_state"].items()) if isinstance(v, np.ndarray)
    ]


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("options", OPTIMIZERS, ids=lambda o: o["optimizer"])
@pytest.mark.filterwarnings("ignore:.*exceeds the")
def test_the_sharded_update_takes_the_bits_of_every_worker_updating_all(backend, workers, options):
    runs = {
        su: dptrain.train(**SMALL, **options, workers=workers, backend=backend, shard_update=su)
        for su in (False, True)
    }
    assert runs[False]["exchange"] == "AllReduce" and runs[True]["exchange"] == "ShardedUpdate"
    assert runs[True]["optimizer_state"]["steps"] == runs[False]["optimizer_state"]["steps"] > 0
    for got, want in zip(_state(runs[True]), _state(runs[False])):
        assert np.array_equal(got, want)
    assert runs[True]["train_loss"] == runs[False]["train_loss"]


def test_it_runs_where_asked_and_the_result_says_which_exchange_ran():
    assert dptrain.train(**SMALL, workers=2, backend="thread")["exchange"] == "AllReduce"
    assert dptrain.train(**SMALL, workers=1, shard_update=True)["exchange"] == "AllReduce"
    for other, name in [
        (dict(overlap=True, bucket_kb=4), "Overlap"),
        (dict(deterministic=True), "Deterministic"),
        (dict(comm_dtype="bfloat16"), "Bf16AllReduce"),
        (dict(shard_update=True), "ShardedUpdate"),
    ]:
        r = dptrain.train(**SMALL, workers=2, backend="thread", **other)
        assert r["exchange"] == name, other


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_sharded_run_resumed_from_its_checkpoint_ends_as_an_unsharded_one(tmp_path, backend):
    """The checkpoint (written by rank 0 from the shared arrays) holds every slice."""
    opts = dict(SMALL, optimizer="adam", workers=2, backend=backend)
    whole = dptrain.train(**opts)
    ckpt = tmp_path / "run.ckpt.npz"
    # 11 steps per epoch: rank 0 fails in the second, after the checkpoint of step 15
    with pytest.raises((WorkerError, RuntimeError), match="injected fault"):
        dptrain.train(
            **opts,
            shard_update=True,
            checkpoint=str(ckpt),
            checkpoint_every=5,
            fault=(0, 17, "raise"),
        )
    resumed = dptrain.train(**opts, shard_update=True, resume=str(ckpt))
    assert resumed["exchange"] == "ShardedUpdate"
    for got, want in zip(_state(resumed), _state(whole)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    "other, named",
    [
        (dict(allreduce="ring"), "allreduce='ring'"),
        (dict(bucket_kb=4), "bucket_kb=4"),
        (dict(deterministic=True), "deterministic=True"),
        (dict(comm_dtype="bfloat16"), "comm_dtype='bfloat16'"),
        (dict(backend="mpi"), "backend='mpi'"),
    ],
)
def test_shard_update_true_where_it_cannot_apply_is_refused_naming_the_options(other, named):
    with pytest.raises(ValueError, match="^shard_update=True needs workers sharing memory") as e:
        dptrain.train(**SMALL, workers=2, shard_update=True, **other)
    assert named in str(e.value)


def test_the_cli_names_the_flags(capsys):
    args = ["train", "--model", "mlp", "--dataset", "synthetic", "--n-samples", "400"]
    args += ["--epochs", "1", "--workers", "2", "--shard-update", "--allreduce", "tree"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("dptrain: error: --shard-update needs workers sharing memory"), err
    assert "--allreduce tree" in err and err.count("\n") == 1


def _scatter(comm):
    """Each rank fills its slot; reduce_scatter_into_ sums its slice; then a barrier, after
    which every slice is there."""
    n = 1000
    slots = comm.shared_zeros(comm.size, n, np.float32)
    out = comm.shared_zeros(1, n, np.float32)[0]
    slots[comm.rank][:] = np.arange(n, dtype=np.float32) * (comm.rank + 1)
    lo, hi = comm.reduce_scatter_into_(out, slots)
    mine = out[lo:hi].copy()
    comm.barrier()
    return (lo, hi), mine, out.copy()


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_reduce_scatter_sums_this_ranks_slice(backend):
    got = launch(_scatter, workers=3, backend=backend)
    n, total = 1000, 1 + 2 + 3
    want = np.arange(n, dtype=np.float32) * total
    slices = [s for s, _, _ in got]
    assert slices == [line_slice(n, 4, r, 3) for r in range(3)]
    assert slices[0][0] == 0 and slices[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # they tile the array
    for (lo, hi), mine, whole in got:
        assert np.array_equal(mine, want[lo:hi]) and np.array_equal(whole, want)
