"""The exchange algorithms: their names, the bytes each one sends, and the point-to-point
all-reduce schedules over MPI messages (for comparing with MPI_Allreduce).

``ALGORITHMS`` is the one list of the gradient exchanges a run can ask for: 'native' (the
transport's own all-reduce), 'ring' and 'tree' (the schedules below, also run over shared
memory by the C core, csrc/dp_sync.c) and 'ps' (a parameter server: a reduce to rank 0, the
update there, a broadcast; an exchange of the training engine, dptrain.engine.exchange).

Each function sums a flat NumPy buffer in place over all ranks of an mpi4py communicator,
with buffer-based ``Sendrecv`` on contiguous views (never pickled objects):

- ``ring_allreduce``: reduce-scatter then all-gather around a ring. Each rank sends
  2 (p - 1) / p of the buffer in 2 (p - 1) messages: bandwidth-optimal, latency 2 (p - 1) alpha.
- ``tree_allreduce``: recursive doubling. log2(p) rounds, each exchanging the whole buffer:
  latency-optimal (log2(p) alpha), bandwidth log2(p) M beta. A world that is not a power of
  two first folds its extra ranks into the others and sends them the result at the end.

Every rank ends with bitwise the same values: a ring chunk is summed along one chain and then
copied, and a doubling round computes x + y on one side and y + x on the other (addition is
commutative, only its association varies, and both partners associate alike).
"""

from __future__ import annotations

import numpy as np

# the all-reduce schedules of an array (the C core runs them over shared memory too)
ALLREDUCE_SCHEDULES = ("native", "ring", "tree")
ALGORITHMS = ALLREDUCE_SCHEDULES + ("ps",)


def bytes_sent(algorithm: str, p: int, nbytes: int, rank: int = 0, root: int = 0) -> int:
    """Bytes worker `rank` of p sends in one collective on nbytes per worker, by schedule:

    - 'native' / 'ring': 2 (p - 1) / p * nbytes (reduce-scatter + all-gather; the shared-memory
      one-pass reduce moves the same: it reads p - 1 slices of nbytes / p and writes its summed
      slice into p - 1 buffers; MPICH and Open MPI use the same volume for large buffers);
    - 'tree': log2(pof2) * nbytes (recursive doubling), plus nbytes for the fold's sender and
      for the receiver that sends the result back, when p is not a power of two;
    - 'reduce': nbytes from every rank but root (a flat reduce, as the parameter server);
    - 'broadcast': (p - 1) * nbytes from root, nothing from the others;
    - 'barrier': 0.
    """
    if p <= 1 or algorithm == "barrier":
        return 0
    if algorithm in ("native", "ring"):
        return int(round(2 * (p - 1) / p * nbytes))
    if algorithm == "tree":
        pof2 = 1 << (p.bit_length() - 1)
        extra = p - pof2
        if rank >= pof2:
            return nbytes
        return (pof2.bit_length() - 1) * nbytes + (nbytes if rank < extra else 0)
    if algorithm == "reduce":
        return 0 if rank == root else nbytes
    if algorithm == "broadcast":
        return (p - 1) * nbytes if rank == root else 0
    raise ValueError(
        f"algorithm is {algorithm!r}, expected native, ring, tree, reduce, broadcast or barrier"
    )


def _bounds(n: int, p: int) -> list[tuple[int, int]]:
    q, r = divmod(n, p)
    out, lo = [], 0
    for i in range(p):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def ring_allreduce(comm, buf: np.ndarray) -> None:
    """buf (1-D, contiguous) = the sum of every rank's buf, by reduce-scatter + all-gather."""
    p, r = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    parts = _bounds(len(buf), p)
    right, left = (r + 1) % p, (r - 1) % p
    tmp = np.empty(max(hi - lo for lo, hi in parts), dtype=buf.dtype)
    # reduce-scatter: after p - 1 steps rank r holds the full sum of part (r + 1) % p
    for s in range(p - 1):
        slo, shi = parts[(r - s) % p]
        rlo, rhi = parts[(r - s - 1) % p]
        recv = tmp[: rhi - rlo]
        comm.Sendrecv(buf[slo:shi], dest=right, recvbuf=recv, source=left)
        buf[rlo:rhi] += recv
    # all-gather: pass the finished parts around the ring
    for s in range(p - 1):
        slo, shi = parts[(r - s + 1) % p]
        rlo, rhi = parts[(r - s) % p]
        comm.Sendrecv(buf[slo:shi], dest=right, recvbuf=buf[rlo:rhi], source=left)


def tree_allreduce(comm, buf: np.ndarray) -> None:
    """buf (1-D, contiguous) = the sum of every rank's buf, by recursive doubling."""
    p, r = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return
    pof2 = 1 << (p.bit_length() - 1)
    extra = p - pof2
    tmp = np.empty_like(buf)
    # fold: ranks pof2.. send to rank - pof2, which adds (rank < extra are the receivers)
    if r >= pof2:
        comm.Send(buf, dest=r - pof2)
        comm.Recv(buf, source=r - pof2)
        return
    if r < extra:
        comm.Recv(tmp, source=r + pof2)
        buf += tmp
    mask = 1
    while mask < pof2:
        partner = r ^ mask
        comm.Sendrecv(buf, dest=partner, recvbuf=tmp, source=partner)
        buf += tmp
        mask <<= 1
    if r < extra:
        comm.Send(buf, dest=r + pof2)
