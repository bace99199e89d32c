"""python -m dptrain: the command line (see dptrain.cli)."""

import signal
import sys

from .cli import main
from .comm.mpi import mpi_world_size

code = main()
if (mpi_world_size() or 1) > 1:
    # one of several MPI ranks, its work done: a Ctrl-C now (the launcher forwards it to
    # every rank) would kill it by SIGINT in MPI's finalization, and turn the finished job's
    # exit status into a signal's
    signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.exit(code)
