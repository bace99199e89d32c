"""Your own training loop on N workers, written the way PyTorch DDP and Horovod users write
one: every worker runs the same function on its share of each batch, and one call averages
the gradient.

    python examples/custom_loop.py --workers 2 --backend thread
    python examples/custom_loop.py --workers 2 --backend process
    mpiexec -n 2 python examples/custom_loop.py              # MPI ranks (one per process)

Every run prints the same final loss and accuracy: the workers split each global batch, and
the summed gradients are the global batch's mean gradient, so N workers train the model one
worker would.
"""

import argparse

import numpy as np

import dptrain
from dptrain.sampler import shard


def make_data(n=4096, d=32, classes=4, seed=0):
    """A learnable toy problem: Gaussian blobs around random class centers."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 0.5, (classes, d))
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.normal(0, 1.5, (n, d))
    return x.astype(np.float32), y.astype(np.int64)


def train_loop(comm, x, y, epochs, batch, lr):
    """One worker's loop. comm: dptrain.comm.Communicator (rank, size, collectives)."""
    # a custom architecture, written as a list of layers (dptrain.nn)
    nn = dptrain.nn
    model = nn.Sequential(
        [
            nn.Dense(128),
            nn.GELU(),
            nn.Dense(64),
            nn.Tanh(),
            nn.Dense(32),
            nn.ReLU(),
            nn.Dense(int(y.max()) + 1),
        ],
        input_shape=(x.shape[1],),
        seed=0,
    )
    comm.broadcast_(model.params, root=0)  # one starting point (seeded here anyway)
    opt = dptrain.SGD(model, lr=lr, momentum=0.9)
    for epoch in range(epochs):
        order = np.random.default_rng([0, epoch]).permutation(len(x))  # the same everywhere
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            lo, hi = shard(0, len(idx), comm.rank, comm.size)
            mine = idx[lo:hi]  # this worker's share of the batch
            model.zero_grad()
            # the gradient of (sum of my samples' losses) / (global batch size) ...
            model.loss_grad(x[mine], y[mine], grad_scale=1.0 / len(idx))
            # ... summed over the workers: the global batch's mean gradient, on every worker
            comm.allreduce_sum_(model.grads)
            opt.step()
    loss, accuracy = model.evaluate(x, y)
    return comm.rank, round(loss, 6), round(accuracy, 4)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--backend", choices=("thread", "process", "mpi"), default=None)
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args()
    x, y = make_data()
    results = dptrain.launch(
        train_loop, x, y, args.epochs, 128, 0.05, workers=args.workers, backend=args.backend
    )
    rank, loss, accuracy = results[0]
    if dptrain.comm.mpi_world_size() in (None, 1) or _mpi_rank() == 0:
        print(f"{len(results)} worker(s): final loss {loss}, accuracy {accuracy}")


def _mpi_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


if __name__ == "__main__":
    main()
