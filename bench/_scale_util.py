"""Shared plumbing of the data-parallel scaling benchmarks (bench_scaling.py, bench_scale.py):
dptrain runs in this process and under mpiexec, the uncoupled ceiling, and PyTorch's runs.

- `run_summary`: what a benchmark keeps of a dptrain result (its training loop's seconds,
  steps, samples, final loss, phases and straggler verdict).
- `run_mpi_train`: `mpiexec -n N python -m dptrain train ARGS --backend mpi --out FILE`.
- `run_ceiling`: N independent 1-worker runs started together as N processes ('spawn'); each
  loads its data, then all wait at a multiprocessing.Barrier placed in front of dptrain's
  training loop (a wrapper around engine.run.train_worker), so that the loops really run at
  the same time; optionally each pinned to its own core (os.sched_setaffinity).
- `run_torch`: PyTorch's reference, the same MLP or CNN: DistributedDataParallel over gloo
  with N ranks of one thread each, or one process on N threads (torch.set_num_threads). Its
  processes fork from a forkserver that imported torch once (this process never imports
  torch), and each run times its loop between barriers after warm-up steps.

Every group of processes is started back to back after all of them exist; one that fails or
does not report in time fails the run with its message, and none is left behind.
"""

from __future__ import annotations

import _util  # noqa: F401  (first: pins BLAS/OpenMP threads before numpy loads)

import importlib.metadata
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

SUBPROCESS_TIMEOUT = 120  # a group of processes that has not reported by then hangs
TORCH_WARMUP_STEPS = 3  # untimed steps of each PyTorch run (dptrain's runs leave none out)
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ what is installed
def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_mpiexec() -> tuple[str | None, str]:
    """(mpiexec's path, '') where mpi4py is installed and an mpiexec is on PATH or beside this
    Python (a venv holding the mpich wheel); else (None, the reason)."""
    if package_version("mpi4py") is None:
        return None, "mpi4py is not installed"
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    return (found, "") if found else (None, "no mpiexec on PATH or beside this Python")


# ------------------------------------------------------------------ dptrain's runs
def run_summary(result: dict) -> dict:
    """What a benchmark keeps of a dptrain result dict (TrainResult or its JSON)."""
    b = result["breakdown"]
    s = b.get("stragglers") or {}
    return {
        "train_seconds": result["train_seconds"],
        "steps": result["steps"],
        "samples": result["samples"],
        "train_loss": result["train_loss"][-1],
        "phase_seconds": result["phase_seconds"],
        "source": result["dataset"]["source"],
        "stragglers": {
            k: s.get(k) for k in ("pattern", "straggler", "wait_share", "wait_seconds_per_step")
        },
    }


def run_mpi_train(mpiexec: str, ranks: int, args, timeout: float = SUBPROCESS_TIMEOUT) -> dict:
    """`mpiexec -n ranks python -m dptrain train ARGS --out FILE --quiet` (ARGS with
    `--backend mpi`); the run_summary of its result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = mpi_command(mpiexec, ranks, args) + ["--out", out, "--quiet"]
        proc = subprocess.run(
            cmd,
            cwd=_util.REPO_ROOT,
            env=_util.child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                f"mpiexec -n {ranks} exited with {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        with open(out) as f:
            return run_summary(json.load(f))


def mpi_command(mpiexec: str, ranks: int, args) -> list[str]:
    return [mpiexec, "-n", str(ranks), sys.executable, "-m", "dptrain", "train", *args]


# ------------------------------------------------------------------ groups of processes
def run_members(ctx, target, member_args: list, timeout: float = SUBPROCESS_TIMEOUT) -> list:
    """Starts one process of context `ctx` per entry of member_args, each running
    target(index, barrier, conn, *args) (barrier: a Barrier of all of them; conn: the end of
    a pipe on which it sends ("ok", payload) or ("error", text)), back to back after all of
    them exist; returns the payloads by index."""
    barrier = ctx.Barrier(len(member_args))
    procs, conns = [], []
    try:
        for i, args in enumerate(member_args):
            parent_end, child_end = ctx.Pipe(duplex=False)
            procs.append(
                ctx.Process(
                    target=target,
                    args=(i, barrier, child_end, *args),
                    name=f"bench-member-{i}",
                    daemon=True,
                )
            )
            conns.append(parent_end)
        for p in procs:
            p.start()
        out = []
        deadline = time.monotonic() + timeout
        for i, c in enumerate(conns):
            if not c.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"process {i} of {len(procs)} did not report in {timeout} s")
            status, payload = c.recv()
            if status != "ok":
                raise RuntimeError(f"process {i} of {len(procs)} failed: {payload}")
            out.append(payload)
        return out
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(1)


def _report_failure(barrier, conn, exc: BaseException) -> None:
    from dptrain.comm import describe

    barrier.abort()  # the others stop waiting for this one
    conn.send(("error", describe(exc)))


def _ceiling_member(index, barrier, conn, config, npz, core) -> None:
    """One of the uncoupled runs ('spawn' entry point): `config` (a TrainConfig of 1 worker)
    on the data of `npz` (None: the config's named data set), on core `core` (None: where
    the scheduler puts it), its training loop held at `barrier` until all have loaded."""
    from dptrain.data import from_npz
    from dptrain.engine import run

    original = run.train_worker

    def synchronized_train_worker(*args, **kwargs):
        barrier.wait(SUBPROCESS_TIMEOUT)
        return original(*args, **kwargs)

    try:
        if core is not None:
            os.sched_setaffinity(0, {core})
        run.train_worker = synchronized_train_worker
        data = from_npz(npz) if npz else None
        conn.send(("ok", run_summary(run.run(config, data=data))))
    except BaseException as exc:  # sent to the parent, which reports it
        _report_failure(barrier, conn, exc)
    finally:
        conn.close()


def run_ceiling(config, n: int, *, npz: str | None = None, cores=None) -> dict:
    """n uncoupled runs of `config` (1 worker each, see _ceiling_member) started together;
    cores: one core per member (pinned), or None. Returns the slowest member's run_summary
    with every member's train_seconds."""
    if cores is not None and len(cores) < n:
        raise ValueError(f"{n} pinned members need {n} cores, got {len(cores)}")
    members = run_members(
        mp.get_context("spawn"),
        _ceiling_member,
        [(config, npz, None if cores is None else cores[i]) for i in range(n)],
    )
    slow = max(members, key=lambda m: m["train_seconds"])
    return {**slow, "member_seconds": [m["train_seconds"] for m in members]}


# ------------------------------------------------------------------ PyTorch's runs
_TORCH_CONTEXT = None


def torch_context():
    """The forkserver context PyTorch's processes fork from: its server imports torch, what
    torch imports on first use, dptrain and this module once, so that a run's processes start
    in milliseconds instead of 1.3-2 s each (measured on the 2-core VM). The server finds this
    module through PYTHONPATH (Python 3.11's forkserver does not take the parent's
    sys.path)."""
    global _TORCH_CONTEXT
    if _TORCH_CONTEXT is None:
        paths = [BENCH_DIR, _util.REPO_ROOT] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
        ]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        _TORCH_CONTEXT = mp.get_context("forkserver")
        # torch._dynamo: torch.optim's first optimizer imports it (1.7 of the 2 s)
        _TORCH_CONTEXT.set_forkserver_preload(
            ["_scale_util", "torch", "torch._dynamo", "torch.distributed", "dptrain.sampler"]
        )
    return _TORCH_CONTEXT


def torch_net(torch, kind: str, n_features: int):
    """The benchmarks' MLP (784-256-128-10) or the studies' CNN on 3x32x32 images."""
    if kind == "mlp":
        sizes = (n_features, 256, 128, 10)
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers += ([torch.nn.ReLU()] if i else []) + [torch.nn.Linear(a, b)]
        return torch.nn.Sequential(*layers)
    side = int(round((n_features // 3) ** 0.5))
    if kind != "cnn" or 3 * side * side != n_features:
        raise ValueError(f"no PyTorch net for {kind!r} on {n_features} features")
    pooled = ((side - 2) // 2 - 2) // 2  # conv 3x3, pool 2, conv 3x3, pool 2: 32 -> 6
    return _util.torch_cnn(torch, 3, 64 * pooled * pooled)


def _torch_member(index, barrier, conn, spec: dict, port: int) -> None:
    """One PyTorch process (forkserver entry point): rank `index` of spec["world"] ranks
    (DDP over gloo, 1 thread each) or, with world 1 and spec["threads"], one process on
    that many threads; rank 0 sends the timing."""
    import torch

    try:
        world = spec["world"]
        if world > 1:
            import torch.distributed as dist

            _util.pin_torch(torch)
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=world
            )
            sync = dist.barrier
        else:
            torch.set_num_threads(spec["threads"])

            def sync():
                pass

        try:
            out = _torch_loop(torch, spec, index, sync)
        finally:
            if world > 1:
                dist.destroy_process_group()
        conn.send(("ok", out))
    except BaseException as exc:
        _report_failure(barrier, conn, exc)
    finally:
        conn.close()


def _torch_data(spec: dict) -> tuple:
    """(x, y) of the first spec["limit"] training rows: of spec["npz"], else of the named data
    set load_dataset(**spec["load"]) reads."""
    if spec.get("npz"):
        with np.load(spec["npz"]) as f:
            return f["x_train"][: spec["limit"]], f["y_train"][: spec["limit"]]
    from dptrain.data import load_dataset

    ds = load_dataset(**spec["load"], limit=spec["limit"], announce=None)
    return ds.x_train, ds.y_train


def _torch_loop(torch, spec: dict, rank: int, sync) -> dict:
    """spec's steps (epochs x the first steps_per_epoch batches of global_batch samples, each
    rank its contiguous share of a seeded order) after TORCH_WARMUP_STEPS untimed ones, timed
    between two sync() calls."""
    from dptrain import sampler

    x, y = _torch_data(spec)
    if len(x) != spec["limit"]:
        raise ValueError(f"the data holds {len(x)} training rows, the run needs {spec['limit']}")
    x = torch.from_numpy(np.ascontiguousarray(x))
    y = torch.from_numpy(y.astype(np.int64))
    if spec["kind"] == "cnn":
        side = int(round((x.shape[1] // 3) ** 0.5))
        x = x.reshape(len(x), 3, side, side)
    torch.manual_seed(0)
    net = torch_net(torch, spec["kind"], spec["n_features"])
    world = spec["world"]
    model = net
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=spec["momentum"])
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(x)
    bounds = sampler.batch_bounds(n, spec["global_batch"])[: spec["steps_per_epoch"]]
    shards = []
    for epoch in range(spec["epochs"]):
        order = torch.from_numpy(sampler.epoch_order(n, epoch, 0))
        shards += [order[slice(*sampler.shard(s, e, rank, world))] for s, e in bounds]

    def step(idx):
        opt.zero_grad()
        loss = loss_fn(model(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()
        opt.step()
        return loss

    for idx in shards[:TORCH_WARMUP_STEPS]:
        step(idx)
    sync()
    t0 = time.perf_counter()
    loss_sum = 0.0
    for idx in shards:
        loss_sum += float(step(idx).detach())
    sync()
    seconds = time.perf_counter() - t0
    return {
        "train_seconds": seconds,
        "steps": len(shards),
        "samples": spec["epochs"] * sum(e - s for s, e in bounds),
        "train_loss": loss_sum / len(shards),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(spec: dict) -> dict:
    """One PyTorch run of `spec` (see _torch_member and _torch_loop): its rank 0's timing."""
    world = spec["world"]
    port = free_port() if world > 1 else 0
    return run_members(torch_context(), _torch_member, [(spec, port)] * world)[0]
