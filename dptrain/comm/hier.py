"""MPI ranks that share memory with the ranks of their node: the hierarchical all-reduce.

Under ``mpiexec`` the ranks of one node (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``) hold
the arrays they exchange in shared memory (MPI-3 shared windows) and reduce them with the same
C group as the process transport (``_core.ShmGroup``: a barrier, each rank sums its slice of
every rank's array in rank order, a barrier). Between nodes one leader per node (its lowest
rank) all-reduces the node's sum with MPI, by the schedule the array was allocated with
(``MPI_Allreduce``, ring or tree), and the node's ranks then read the result from shared
memory:

    node sum (shared memory) -> leaders' all-reduce (MPI) -> every rank reads the total

On one node no MPI message is sent on the hot path at all: the exchange is the process
transport's. ``HierComm`` is a ``ShmComm`` whose sharing group is its node; its ``rank`` and
``size`` are the MPI world's.

Deterministic mode: ``sum_into_`` first gives every node an exact copy of every chunk (the
leaders gather each node's chunks: copies, no arithmetic), then each node sums the chunks in
chunk order over shared memory. The sum is the flat one, bit for bit, whatever the layout.

Simulated nodes: ``nodes=k`` (``DPTRAIN_MPI_NODES=k``, ``--mpi-nodes k``) splits the world's
ranks into k blocks of consecutive ranks, each treated as a node of its own (inside a real
node), so that the inter-node path runs on one machine: ``mpiexec -n 4`` as 2 nodes of 2.

The shared windows are allocated by each node's rank 0 (the others map its memory), in
chunks handed out by a bump pointer that every rank of the node moves alike, because
allocation is collective. They live until MPI finalizes (``close_windows`` frees them
earlier, collectively, once nothing refers to them: ``dptrain.train`` does so).
"""

from __future__ import annotations

import bisect
import functools
import os

import numpy as np

from .algorithms import bytes_sent as _schedule_bytes
from .base import ALIGN, Communicator, check_flat, range_bytes, signature, signature_array
from .mpi import allreduce_in_place, mpi_agree
from .shm import SegmentLayout, ShmComm, WaitPolicy, _round_up

WINDOW_BYTES = 4 << 20  # a window's least size (the arena grows by such chunks)


def env_nodes() -> int:
    """The simulated node count of $DPTRAIN_MPI_NODES (0 when unset: the real nodes)."""
    text = os.environ.get("DPTRAIN_MPI_NODES", "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(
            f"DPTRAIN_MPI_NODES is {text!r}, expected a number of nodes >= 1 "
            f"(or unset: the machine's real nodes)"
        )
    return int(text)


def env_shm() -> bool:
    """False when $DPTRAIN_MPI_SHM is 0/false/off: a flat MPI all-reduce over every rank."""
    return os.environ.get("DPTRAIN_MPI_SHM", "1").strip().lower() not in ("0", "false", "off", "no")


def split_nodes(world, nodes: int = 0):
    """This rank's node communicator: the ranks that share its memory, or with nodes=k > 0
    its block of consecutive ranks out of k (a simulated node, also inside one real node)."""
    from mpi4py import MPI

    size, rank = world.Get_size(), world.Get_rank()
    if nodes < 0 or nodes > size:
        raise ValueError(f"nodes is {nodes}, expected 0 (the real nodes) to the world size {size}")
    if nodes:
        block = world.Split(rank * nodes // size, key=rank)
        node = block.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        block.Free()
        return node
    return world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)


class LeaderWaitTimeout(TimeoutError):
    """A rank waited longer than twice the timeout for its node's leader to finish the
    exchange between nodes (the leader itself waits in MPI, which has no timeout)."""


def _collective(method):
    """A collective of HierComm: across nodes it first waits for this rank's exchanges in
    flight on the communication thread (so that the two threads never use the node's
    barriers or MPI at once), and a timeout of the node's C group (which numbers the node's
    ranks from 0) also says which world ranks those are."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._pending:
            self._settle()
        try:
            return method(self, *args, **kwargs)
        except LeaderWaitTimeout:
            raise
        except TimeoutError as exc:
            members = self.node_members[self._node_id]
            raise TimeoutError(
                f"{exc} (ranks of node {self._node_id}, numbered in it: 0..."
                f"{len(members) - 1} are world ranks "
                f"{', '.join(map(str, members))})"
            ) from None

    return call


class _Windows:
    """One node's shared memory: MPI-3 shared windows allocated by the node's rank 0 (the
    others map its memory), at virtual offsets [base, base + size) of one address space."""

    def __init__(self, MPI, node):
        self._MPI, self._node = MPI, node
        self.bases: list[int] = []
        self.spans: list[tuple[int, np.ndarray, object]] = []  # (end, memory, window)
        self.end = 0

    def grow(self, nbytes: int) -> int:
        """A new window of at least nbytes, zeroed (collective on the node); its base."""
        nbytes = _round_up(max(int(nbytes), 1))
        node = self._node
        mine = nbytes + ALIGN if node.Get_rank() == 0 else 0
        try:
            win = self._MPI.Win.Allocate_shared(mine, 1, comm=node)
        except self._MPI.Exception as exc:
            raise MemoryError(
                f"MPI could not allocate a shared window of {nbytes} bytes for "
                f"the node's ranks ({exc}); run with --no-mpi-shm "
                f"(DPTRAIN_MPI_SHM=0) for a flat MPI all-reduce"
            ) from None
        buf, _ = win.Shared_query(0)
        raw = np.frombuffer(buf, np.uint8, nbytes + ALIGN)
        off = (-raw.ctypes.data) % ALIGN
        mem = raw[off : off + nbytes]
        if node.Get_rank() == 0:
            mem[:] = 0  # MPI does not promise zeroed memory
        node.Barrier()
        base = self.end
        self.bases.append(base)
        self.end = base + nbytes
        self.spans.append((self.end, mem, win))
        return base

    def view(self, off: int, nbytes: int) -> np.ndarray:
        i = bisect.bisect_right(self.bases, off) - 1
        if i < 0 or off + nbytes > self.spans[i][0]:
            raise IndexError(f"[{off}, {off + nbytes}) is not inside one shared window")
        mem = self.spans[i][1]
        lo = off - self.bases[i]
        return mem[lo : lo + nbytes]

    def free(self) -> None:
        for _, _, win in self.spans:
            win.Free()
        self.spans.clear()
        self.bases.clear()


class HierComm(ShmComm):
    """An MPI rank: shared memory with its node's ranks, MPI between nodes' leaders (see the
    module docstring)."""

    def __init__(
        self,
        world=None,
        *,
        nodes: int = 0,
        policy: WaitPolicy | None = None,
        measure_wait: bool = True,
    ):
        """world: an mpi4py communicator (default COMM_WORLD); nodes: 0 for the machine's
        real nodes, k to split the ranks into k simulated nodes of consecutive ranks;
        policy: how the node's ranks wait (default: for the ranks that share this machine);
        measure_wait: leaders enter the inter-node all-reduce through MPI_Barrier and count
        its time as waiting (as MPIComm does)."""
        from mpi4py import MPI

        self._MPI = MPI
        self._mpi = world if world is not None else MPI.COMM_WORLD
        self._measure_wait = measure_wait
        self._node = split_nodes(self._mpi, nodes)
        local, peers = self._node.Get_rank(), self._node.Get_size()
        self._leaders = self._mpi.Split(
            0 if local == 0 else MPI.UNDEFINED, key=self._mpi.Get_rank()
        )
        # each rank's node, numbered as the leaders are (by their world rank)
        leader = self._node.allgather(self._mpi.Get_rank())[0]
        leader_of_rank = self._mpi.allgather(leader)
        leaders = sorted(set(leader_of_rank))
        self._node_of = [leaders.index(lead) for lead in leader_of_rank]
        self.node_members = [
            [r for r, lead in enumerate(leader_of_rank) if lead == first] for first in leaders
        ]
        self.nodes = len(leaders)
        if policy is None:
            policy = machine_policy(self._mpi)
        self._windows = _Windows(MPI, self._node)
        layout = SegmentLayout(peers)
        head = self._windows.view(self._windows.grow(layout.arena), layout.arena)
        if local == 0:
            layout.init(head)
        self._node.Barrier()
        super().__init__(local, layout, head, policy, "mpi")
        self.rank, self.size = self._mpi.Get_rank(), self._mpi.Get_size()
        # rank 0's progress is read by a thread of its own process (the progress bar), which
        # may outlive the windows: process memory
        self.progress = np.zeros(2)
        self._node_id = self._node_of[self.rank]
        self._next = self._windows.end
        self._flat: dict[int, tuple] = {}  # id(arrays[0]) of shared_zeros -> packing plan
        # MPI from the communication thread while the caller computes (overlap across nodes)
        self._threaded_mpi = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        self._pending: list = []  # handles of exchanges posted across nodes
        self._readout: dict[int, object] = {}  # id(shared) -> the group of its read-out wait

    # ---- memory: the node's windows
    @_collective
    def zeros(self, length, dtype="float32", *, algorithm="native"):
        return super().zeros(length, dtype, algorithm=algorithm)

    @_collective
    def shared_zeros(self, count, length, dtype="float32"):
        return super().shared_zeros(count, length, dtype)

    def _alloc(self, nbytes: int) -> int:
        nbytes = _round_up(max(int(nbytes), 1))
        if self._next + nbytes > self._windows.end:
            self._next = self._windows.grow(max(nbytes, WINDOW_BYTES))
        off = self._next
        self._next += nbytes
        return off

    def _view(self, off: int, length: int, dt: np.dtype) -> np.ndarray:
        return self._windows.view(off, length * dt.itemsize).view(dt)

    def free(self) -> None:
        """The node's shared windows and communicators freed (Communicator.free)."""
        self.close_windows()

    def close_windows(self) -> None:
        """Frees the node's shared windows and communicators (collective on the world: every
        rank calls it, after every array from this communicator is gone or copied); the
        communicator is done then."""
        self._settle()
        self.close()
        self._mpi.Barrier()
        self._by_id.clear()
        self._staging.clear()
        self._sums.clear()
        self._world = self._world_patient = None
        self._windows.free()
        self._node.Free()
        if self._leaders != self._MPI.COMM_NULL:
            self._leaders.Free()

    # ---- exchanges in flight on the communication thread
    def _settle(self) -> None:
        """Waits for every exchange this rank posted across nodes (raising the first error)."""
        pending, self._pending = self._pending, []
        super().wait_(pending)

    def wait_(self, handles):
        super().wait_(handles)
        done = {id(h) for h in handles}
        self._pending = [h for h in self._pending if id(h) not in done]

    # ---- the inter-node step of the leaders
    def _leaders_allreduce(
        self, buf: np.ndarray, algorithm: str, sig, measure: bool = True
    ) -> float:
        waited = self._leaders_agree(sig)
        allreduce_in_place(self._leaders, buf, algorithm)
        return waited if measure and self._measure_wait else 0.0

    def _leaders_agree(self, sig) -> float:
        """The leaders' entry to an exchange between nodes, where every node's leader checks
        that its node called what the others did (mpi_agree; the node's ranks checked among
        themselves first, in C). A mismatch raises on the leaders; their nodes' ranks, waiting
        for them, stop with the run. An allocation's offset is its node's: only whether the
        array came from zeros compares."""
        sig = sig.copy() if isinstance(sig, np.ndarray) else signature_array(sig)
        sig[7] = min(sig[7], 0)
        return mpi_agree(self._leaders, sig)

    def _node_sum(self, shared):
        """The group that sums the node's arrays into one shared array (shared.out), set up
        with the group of the wait for the leader's result (twice the timeout: the leader
        waits in MPI for every node, and a late rank is named first by its own node)."""
        if shared.out_group is None:
            buf = shared.arrays[0]
            shared.out = self._view(self._alloc(buf.nbytes), buf.size, buf.dtype)
            shared.out_group = self._group(
                self._alloc(self._layout.control_bytes), shared.arrays, out=shared.out
            )
            self._readout[id(shared)] = self._group(
                self._alloc(self._layout.control_bytes),
                shared.arrays,
                timeout=2 * self._policy.timeout,
            )
        return shared.out_group

    def _await_leader(self, shared) -> None:
        """Returns once the node's leader has written the exchange between nodes into shared
        memory."""
        try:
            self._readout[id(shared)].barrier()
        except TimeoutError:
            if self._local == 0:
                raise
            raise LeaderWaitTimeout(
                f"rank {self.rank} waited {2 * self._policy.timeout:g} s for its node's leader "
                f"(world rank {self.node_members[self._node_id][0]}) to finish the exchange "
                f"between nodes: a rank of another node did not arrive in time, or the network "
                f"stalled"
            ) from None

    # ---- collectives
    @_collective
    def allreduce_sum_(self, array, *, scale=1.0, start=0, stop=None):
        if self.nodes == 1:
            return super().allreduce_sum_(array, scale=scale, start=start, stop=stop)
        sig = self._signature("allreduce_sum_", array, start=start, stop=stop, scale=scale)
        agreed = self._agree(sig)
        if self._peers == 1:  # alone on its node: MPI in place, no copies
            shared = self._by_id.get(id(check_flat(array)))
        else:
            shared, buf = self._shared(array)
            if buf is not array:
                buf[start:stop] = array[start:stop]
        algorithm = shared.algorithm if shared is not None else "native"
        waited = agreed + self._exchange(shared, array, start, stop, scale, sig)
        self._account("allreduce", range_bytes(array, start, stop), algorithm, waited=waited)

    def _exchange(self, shared, array, start, stop, scale, sig, measure=True) -> float:
        """array[start:stop] = scale * the world's sum, the node's arrays (shared.arrays)
        filled; returns the seconds waited for other ranks (measure: the leaders' entry
        barrier, left out on the communication thread, where waiting is not counted)."""
        if self._peers == 1:
            part = array[start:stop]
            waited = self._leaders_allreduce(
                part, shared.algorithm if shared else "native", sig, measure
            )
            if scale != 1.0:
                part *= scale
            return waited
        waited = self._node_sum(shared).allreduce(1.0, start, stop)  # into shared.out
        total = shared.out[start:stop]
        if self._local == 0:
            waited += self._leaders_allreduce(total, shared.algorithm, sig, measure)
        self._await_leader(shared)  # the leader wrote the total
        part = array[start:stop]
        if scale != 1.0:
            np.multiply(total, scale, out=part)
        else:
            part[:] = total
        # nobody writes shared.out again before every rank has passed the next call's entry
        # barrier, i.e. has read it
        return waited

    def allreduce_async_(self, array, start=0, stop=None):
        """Across nodes: the whole exchange (node sum, leaders' MPI, read-out) on the
        communication thread while the caller computes. MPI is then called from that thread
        alone until wait_ (MPI_THREAD_SERIALIZED is enough); below that thread level the
        exchange runs at once, in the caller."""
        if self.nodes == 1:
            return super().allreduce_async_(array, start, stop)
        shared = self._async_shared(array)
        sig = self._signature("allreduce_async_", array, start=start, stop=stop)
        self._agree(sig)  # the node's ranks, here; the leaders in the exchange
        if not self._threaded_mpi:
            self.allreduce_sum_(array, start=start, stop=stop)
            return None
        if self._peers > 1 and shared.out_group is None:
            self._settle()  # set up here, alone: allocation is collective
            self._node_sum(shared)
        handle = self._post(lambda: self._exchange(shared, array, start, stop, 1.0, sig, False))
        self._pending.append(handle)
        self._account("allreduce", range_bytes(array, start, stop), shared.algorithm)
        return handle

    @_collective
    def reduce_sum_(self, array, root=0):
        if self.nodes == 1:
            return super().reduce_sum_(array, root)
        sig = self._signature("reduce_sum_", array, root=root)
        waited = self._agree(sig)
        shared, buf = self._shared(array)
        if buf is not array:
            buf[:] = array
        waited += self._node_sum(shared).allreduce()
        root_node = self._node_of[root]
        if self._local == 0:
            self._leaders_agree(sig)
            if self._node_id == root_node:
                self._leaders.Reduce(
                    self._MPI.IN_PLACE, shared.out, op=self._MPI.SUM, root=root_node
                )
            else:
                self._leaders.Reduce(shared.out, None, op=self._MPI.SUM, root=root_node)
        self._await_leader(shared)
        self._account("reduce", array.nbytes, root=root, waited=waited)
        return shared.out

    @_collective
    def broadcast_(self, array, root=0):
        if self.nodes == 1:
            return super().broadcast_(array, self.node_members[0].index(root))
        root_node = self._node_of[root]
        waited = 0.0
        if self._node_id == root_node:
            waited += self._shared_broadcast(array, self.node_members[root_node].index(root))
        if self._local == 0:
            self._leaders_agree(self._signature("broadcast_", array, root=root))
            self._leaders.Bcast(array, root=root_node)
        if self._node_id != root_node:
            # the wait here is for the leader's transfer from the root's node: not sync wait
            self._shared_broadcast(array, 0)
        self._account("broadcast", array.nbytes, root=root, waited=waited)

    # the whole sum, published, then this rank's slice: the cross-node gather comes first
    reduce_scatter_into_ = Communicator.reduce_scatter_into_

    @_collective
    def sum_into_(self, out, arrays, *, scale=1.0):
        """Every node first holds exact copies of every array (the leaders gather what each
        node's ranks filled: rank r fills arrays [r count / size, (r + 1) count / size)),
        then the node sums them in index order over shared memory."""
        if self.nodes > 1:
            sig = self._sum_signature("sum_into_", out, arrays, scale)
            waited = self._agree(sig)  # the node's ranks filled their arrays
            if self._local == 0:
                self._leaders_agree(sig)
                self._gather_filled(arrays)
            self._world.barrier()
            self.waited += waited
        super().sum_into_(out, arrays, scale=scale)

    def _gather_filled(self, arrays) -> None:
        plan = self._flat.get(id(arrays[0]))
        if plan is None:
            count, size = len(arrays), self.size
            owned = [
                [i for r in members for i in range(r * count // size, (r + 1) * count // size)]
                for members in self.node_members
            ]
            n = arrays[0].size
            counts = [len(o) * n for o in owned]
            displs = list(np.cumsum([0] + counts[:-1]))
            recv = np.empty(sum(counts), arrays[0].dtype)
            plan = self._flat[id(arrays[0])] = (owned, counts, displs, recv)
        owned, counts, displs, recv = plan
        n = arrays[0].size
        mine = owned[self._node_id]
        send = np.concatenate([arrays[i] for i in mine]) if mine else recv[:0]
        mpi_type = {
            np.dtype(np.float32): self._MPI.FLOAT,
            np.dtype(np.float64): self._MPI.DOUBLE,
            np.dtype(np.uint16): self._MPI.UINT16_T,
        }[recv.dtype]  # uint16: bfloat16
        self._leaders.Allgatherv(send, [recv, counts, displs, mpi_type])
        for node_id, idx in enumerate(owned):
            if node_id == self._node_id:
                continue
            base = displs[node_id]
            for j, i in enumerate(idx):
                arrays[i][:] = recv[base + j * n : base + (j + 1) * n]

    @_collective
    def barrier(self):
        super().barrier()

    @_collective
    def barrier_after_work(self, worker=None):
        # every rank's start-up (None) is waited for by rank 0 with the timeout: the ranks
        # met after loading their data (launch's timed start-up arrival), and what is left
        # (the model, a checkpoint's position) is the same work on each, so a rank stalled
        # in it is named instead of holding the job for ever
        super().barrier_after_work(0 if worker is None else worker)

    def _world_barrier(self, group, op, root=-1) -> float:
        # the node's ranks meet, the leaders meet in MPI (no timeout), then the node again:
        # both node waits on the handle given (a patient one waits out the leader's MPI wait);
        # the first two check that every rank called the same barrier
        sig = signature(op, root=root)
        waited = self._agree(sig, group)
        if self.nodes > 1:
            if self._local == 0:
                waited += self._leaders_agree(sig)
            group.barrier()
        return waited

    def _peer_ranks(self):
        return list(self.node_members[self._node_id])

    def abort(self, code=1):
        self._mpi.Abort(code)

    # ---- accounting: bytes over shared memory inside the node, plus a leader's MPI bytes
    def _bytes_of(self, kind, nbytes, algorithm, root):
        if self.nodes == 1:  # the process transport's own schedules
            return super()._bytes_of(kind, nbytes, algorithm, root)
        schedule = algorithm if kind == "allreduce" else kind
        # inside the node: the native sum (whatever the algorithm between nodes), a
        # broadcast from the root on its node and from the leader on the others
        members = self.node_members[self._node_id]
        local_root = members.index(root) if root in members else 0
        inside = _schedule_bytes(
            "native" if kind == "allreduce" else kind, self._peers, nbytes, self._local, local_root
        )
        if self._local:
            return inside
        return inside + _schedule_bytes(
            schedule, self.nodes, nbytes, self._node_id, self._node_of[root]
        )


def mpi_comm(
    world=None,
    *,
    shm: bool | None = None,
    nodes: int | None = None,
    timeout: float = 0.0,
    threads: int = 1,
):
    """The communicator of this MPI rank: a HierComm (shared memory inside each node), or a
    flat MPIComm when shm is False, $DPTRAIN_MPI_SHM is 0, or the world has one rank.
    nodes: k simulated nodes (None or 0: $DPTRAIN_MPI_NODES, else the real nodes). timeout
    and threads: as for launch. Collective: every rank calls it."""
    from .mpi import MPIComm
    from .mpi import world as mpi_world

    world = world if world is not None else mpi_world()
    shm = env_shm() and (shm is None or bool(shm))  # off when either says off
    nodes = int(nodes) if nodes else env_nodes()
    if not shm or world.Get_size() == 1:
        return MPIComm(world)
    return HierComm(world, nodes=nodes, policy=machine_policy(world, threads, timeout))


def machine_policy(world, threads: int = 1, timeout: float = 0.0) -> WaitPolicy:
    """How the ranks of world that run on this rank's machine wait at a barrier: the
    WaitPolicy of as many workers as that (collective on world)."""
    from mpi4py import MPI

    machine = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        return WaitPolicy.for_workers(machine.Get_size(), threads, timeout)
    finally:
        machine.Free()
