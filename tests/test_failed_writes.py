"""A write that fails (a full disk, a file-size limit) names the file and the cause, keeps the
previous file whole and leaves no temporary behind: Model.save, and each of the command
line's outputs (--save-weights, --out, --steps-csv, --trace)."""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

import dptrain.models
from dptrain import MLP, load_model

# runs the command line under a file-size limit (RLIMIT_FSIZE, what `ulimit -f` sets): a
# write past it fails with EFBIG, as on a full disk. mpi4py is kept out: MPI's start-up
# writes shared-memory files of its own, which the limit would refuse first.
_LIMITED_CLI = """
import resource, sys
sys.modules["mpi4py"] = None
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), hard))
from dptrain import cli
sys.exit(cli.main(sys.argv[2:]))
"""
_LIMIT = 300  # bytes: less than each output of the run below writes


def test_a_failed_save_names_the_file_and_the_cause(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    old = MLP((4, 3, 2), seed=1)
    old.save(path)
    before = path.read_bytes()

    def too_large(f, **arrays):
        f.write(b"PK\x03\x04 part of a file")
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(dptrain.models, "savez", too_large)
    with pytest.raises(OSError) as info:
        MLP((4, 3, 2), seed=2).save(path)
    assert str(info.value) == (
        f"cannot write {path}: File too large (errno 27); the previous w.npz is kept"
    )
    assert info.value.errno == errno.EFBIG
    with pytest.raises(
        OSError,
        match=rf"cannot write {tmp_path / 'new.npz'}: File too large .*"
        "nothing was written to new.npz",
    ):
        MLP((4, 3, 2)).save(tmp_path / "new.npz")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]
    assert np.array_equal(load_model(path).params, old.params)


@pytest.mark.parametrize(
    "option, name",
    [
        ("--save-weights", "w.npz"),
        ("--out", "run.json"),
        ("--steps-csv", "steps.csv"),
        ("--trace", "trace.json"),
    ],
)
def test_cli_output_past_a_file_size_limit_is_one_line_naming_it(tmp_path, option, name):
    pytest.importorskip("resource")
    data = tmp_path / "d.csv"
    data.write_text("a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    target = tmp_path / name
    target.write_bytes(b"the previous file")
    flags = ["--model", "softmax", "--epochs", "1", "--batch-size", "2", "--quiet"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _LIMITED_CLI,
            str(_LIMIT),
            "train",
            *flags,
            "--backend",
            "thread",
            "--data",
            str(data),
            option,
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"dptrain: error: cannot write {target}: File too large (errno 27); "
        f"the previous {name} is kept\n"
    )
    assert target.read_bytes() == b"the previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d.csv", name])


def _figure(path):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from dptrain.measure.plots import save_figure

    save_figure(matplotlib.figure.Figure(), path)


def _summary_csv(path):
    from dptrain.measure.summary import write_csv

    write_csv([{"workers": 1, "time": {"median": 2.0}}], path)


@pytest.mark.parametrize("write, name", [(_summary_csv, "summary.csv"), (_figure, "speedup.png")])
def test_the_sweep_and_plot_outputs_name_a_failed_write(tmp_path, monkeypatch, write, name):
    """sweep's tables and plot's figures go through the same writer (a file-size limit
    here: the flush to disk fails)."""
    target = tmp_path / name
    target.write_bytes(b"the previous file")

    def too_large(fd):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(os, "fsync", too_large)
    with pytest.raises(OSError) as info:
        write(target)
    assert str(info.value) == (
        f"cannot write {target}: File too large (errno 27); the previous {name} is kept"
    )
    assert target.read_bytes() == b"the previous file"
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.mpi
def test_an_output_refused_under_mpi_ends_every_rank_with_one_line(mpiexec, tmp_path):
    """Rank 0 alone checks the outputs it will write: a refusal ended rank 0 and left the
    others waiting for it in their first collective, forever (a new user's trial). Now
    every rank leaves with it, and each node says it once."""
    r = subprocess.run(
        [mpiexec, "-n", "3", sys.executable, "-m", "dptrain", "train", "--dataset", "synthetic"]
        + ["--n-samples", "512", "--n-features", "8", "--epochs", "1", "--quiet"]
        + ["--checkpoint", str(tmp_path / "missing" / "ck.npz")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    ours = [x for x in r.stderr.splitlines() if x.startswith("dptrain")]
    assert r.returncode == 1, r.stderr
    assert len(ours) == 1 and "--checkpoint" in ours[0] and "does not exist" in ours[0], r.stderr
