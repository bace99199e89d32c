"""Names an MPI rank that ends without a word (killed, or gone in C code) under MPICH's Hydra.

Hydra ends every rank of a job at once when one of them dies, with SIGKILL: no rank's own
handler runs, and Hydra's own message names a process id, not always the first to end. This
watcher, one per node, outside the job, does: the first rank of the node to get there starts
it (``comm.mpi.watch_node``: a separate Python process in a session of its own, so that the
launcher's kill does not reach it), and every rank of the node connects to it, says its rank
and pid, and before it ends says ``done`` (a normal end) or ``said`` (it named its own failure
or interrupt; ``armed``: a C timer may end it with a line of its own, ``disarmed``: no more).
A connection that closes without one of them is a rank gone without a word. The first one,
while other ranks of the node still run (mpiexec ends them after it, a moment later), is named
in one line on the node's stderr, with how it ended where /proc still shows it (a watcher
that wakes late, on a busy machine, sees a few end at once, and names them all as such); when
every rank of the node ends at once, the job was ended from outside the node, and the watcher
says nothing. It exits when every rank of the node has closed its connection.

Run as a script (``python -S -I watch.py FD``: no site, no package import, a few milliseconds),
FD: the listening socket, inherited.
"""

import select
import signal
import socket
import sys
import time

# how long the watcher waits for a first connection, and (after the first) for the rest
START_S = 60.0


def _how(pid: int) -> str:
    """How the process ended, from /proc/PID/stat while its parent has not reaped it (the
    exit status's 52nd field), or a guess when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        status = int(fields[49])  # field 52: the exit status, as waitpid gives it
    except (OSError, ValueError, IndexError):
        return "killed, or ended in C code: no Python error"
    if status & 0x7F:
        sig = status & 0x7F
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by signal {sig} ({name})"
    return f"exited with code {status >> 8} and no Python error"


def _line(silent: list) -> str:
    """The line that names the first ranks gone without a word."""
    host = socket.gethostname()
    if len(silent) == 1:
        _, rank, pid, _, _ = silent[0]
        return (
            f"dptrain: MPI rank {rank} (pid {pid}, {host}) ended first, without a word: "
            f"{_how(pid)}; mpiexec ends the other ranks of the job\n"
        )
    silent = sorted(silent, key=lambda e: e[1])
    who = ", ".join(f"{e[1]} (pid {e[2]})" for e in silent)
    return (
        f"dptrain: MPI ranks {who} on {host} ended at once, without a word: "
        f"{_how(silent[0][2])}; one of them ended first (this node's watcher woke too late to "
        f"tell which), and mpiexec ends the other ranks of the job\n"
    )


def watch(listener: socket.socket, out) -> None:
    listener.setblocking(False)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    conns: dict = {}  # fd -> [socket, rank, pid, last word, bytes pending]
    seen = spoke = False
    began = time.monotonic()
    while conns or (not seen and time.monotonic() - began < START_S):
        ready = poller.poll(1000)
        closed = []
        for fd, _ in ready:
            if fd == listener.fileno():
                try:
                    sock, _ = listener.accept()
                except OSError:
                    continue
                conns[sock.fileno()] = [sock, None, None, None, b""]
                poller.register(sock, select.POLLIN)
                seen = True
                continue
            entry = conns[fd]
            try:
                data = entry[0].recv(4096)
            except OSError:
                data = b""
            if not data:
                closed.append(entry)
                continue
            entry[4] += data
            *lines, entry[4] = entry[4].split(b"\n")
            for line in lines:
                words = line.decode(errors="replace").split()
                if words[:1] == ["rank"] and len(words) == 4:
                    entry[1], entry[2] = int(words[1]), int(words[3])
                elif words:
                    entry[3] = words[0]
        silent = [e for e in closed if e[3] not in ("done", "said", "armed") and e[1] is not None]
        # a rank said why the job ends (its error, Ctrl-C; or its C timer may end it with a
        # line): the others' silent ends that follow are the launcher's doing
        hushed = any(e[3] == "said" for e in conns.values()) or any(
            e[3] in ("said", "armed") for e in closed
        )
        # the first ranks gone without a word, while others of the node still run: named (one,
        # or the few seen to end at once when this watcher woke late)
        if not spoke and not hushed and silent and len(conns) > len(closed):
            out.write(_line(silent))
            out.flush()
        spoke = spoke or hushed
        spoke = spoke or bool(silent)  # one line at most, for the first loss
        for entry in closed:
            poller.unregister(entry[0])
            del conns[entry[0].fileno()]
            entry[0].close()


def main() -> None:
    listener = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the ranks' to say
    try:
        watch(listener, sys.stderr)
    except BrokenPipeError:  # the launcher stopped reading the node's output
        pass
    finally:
        listener.close()


if __name__ == "__main__":
    main()
