"""Several machines under one MPI launcher: the layer between node leaders.

One MPI rank per machine (the *node leader*) forks that machine's local workers, which
talk through shared memory as on one machine; only leaders call MPI. This package owns
what is specific to MPI and nothing else: it imports the standard library, numpy and,
lazily, mpi4py (the package imports without mpi4py installed).

- ``launch``: was this process started by ``mpiexec``/``srun``? (environment only)
- ``errors``: the errors below, and the probes before MPI starts (is mpi4py there,
  did the script start MPI too early, is fault tolerance on).
- ``leaders``: ``MPI_Init`` after the fork, the machine table, liveness-checked
  waits, failure reports, abort, finalisation (``Leaders``, ``start``).
- ``exchange``: the collectives between leaders that ``Leaders`` inherits: objects,
  arrays of any dtype and shape, and the all-reduces (the chunk-owner scheme).

How the core uses it (master = leader of machine 0)::

    launch = detect_launch(launcher)            # 1. before forking: no MPI yet
    if launch.is_mpi:
        check_not_initialized()                 #    the user did not start MPI early
    workers = fork_workers(n_local - 1)         # 2. local workers, as on one machine
    leaders = start(n_local, liveness=check_local_workers,
                    expected_rank=launch.rank)  # 3. MPI_Init_thread, machine table
    # leaders.rank/size, .hosts, .local_sizes, .offsets (global rank of each
    # machine's first process), .total, .host_of(global_rank)

    # master                                    # every other leader: fork() never returns
    leaders.broadcast_object(command)           cmd = leaders.broadcast_object(spin=0.002)
    ... own machine's share ...                 ... its machine's share ...
    replies = leaders.gather_objects(reply)     leaders.gather_objects(reply)
    leaders.all_reduce(buffer, "sum", mode="fast")   # or mode="exact"
    leaders.all_reduce_pieces(pieces, "sum")    # exact over every local process's piece
    leaders.broadcast(buffer) / .scatter(arrays) / .gather(array) / .all_gather(array)
    leaders.all_gather_fixed(record)            # one collective, same shape everywhere
    leaders.barrier()
    leaders.check_alarms()   # a wait outside MPI (its own workers): reports, abort notices

    leaders.close()          # normal end, every leader, after its workers stopped
    leaders.report_failure(text)  # another leader: a local worker died (master raises
                                  # RemoteFailureError naming the host)
    leaders.abort(reason)    # after any failure, once this machine is cleaned up:
                             # ends the whole job (MPI_Abort), never returns

Errors out of any wait (the leaders are then ``broken``; only ``abort`` remains):
``PeerLostError`` (a leader died, ULFM: ``.ranks``, ``.hosts``), ``RemoteFailureError``
(master: another machine reported; ``.rank``, ``.host``, ``.report``),
``JobAbortedError`` (other leaders: the master aborts), ``LeaderTimeoutError``, or
whatever ``liveness`` raised (or KeyboardInterrupt/SystemExit from a signal).
"""

from __future__ import annotations

from .errors import (
    JobAbortedError,
    LeaderError,
    LeaderTimeoutError,
    MPIUnavailableError,
    PeerLostError,
    RemoteFailureError,
    check_not_initialized,
)
from .exchange import chunk_bounds
from .launch import LAUNCHERS, Launch, detect_launch
from .leaders import CHECK_INTERVAL, Leaders, start

__all__ = [
    "CHECK_INTERVAL",
    "LAUNCHERS",
    "JobAbortedError",
    "Launch",
    "LeaderError",
    "LeaderTimeoutError",
    "Leaders",
    "MPIUnavailableError",
    "PeerLostError",
    "RemoteFailureError",
    "check_not_initialized",
    "chunk_bounds",
    "detect_launch",
    "start",
]
