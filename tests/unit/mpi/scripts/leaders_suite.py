"""Run under mpiexec: every primitive of the leaders' layer, 2 local processes per machine.

Each leader forks one child before MPI starts (init after fork). Every process's
piece of the reductions is generated from its global rank, so the test can build the
reference itself. Each leader writes ``leader<rank>.npz`` and each child
``proc<global rank>.npy`` into ``--out``; the test compares.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
from pathlib import Path

import numpy as np
from _machine import LocalMachine

from synkhronos._machines import mpi

LOCAL = 2
N = 100_003  # odd: uneven chunks between machines


def piece(global_rank: int, n: int = N, dtype=np.float32) -> np.ndarray:
    """Process ``global_rank``'s value: large magnitudes so summation order shows."""
    rng = np.random.default_rng(1000 + global_rank)
    return (rng.standard_normal(n) * 1e3).astype(dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    launch = mpi.detect_launch()
    item = np.dtype(np.float32).itemsize

    def child_main(index, shared, channel):
        machine = launch.rank
        me = machine * LOCAL + index
        view = np.frombuffer(shared, np.float32, count=(LOCAL + 1) * N).reshape(LOCAL + 1, N)
        view[index] = piece(me)
        channel.signal()  # my piece is in
        channel.wait()  # the result is in
        np.save(out / f"proc{me}.npy", view[LOCAL].copy())
        # the child was forked before MPI started and never touched it
        (out / f"proc{me}.json").write_text(json.dumps({
            "mpi_imported": "mpi4py.MPI" in sys.modules, "ppid": os.getppid()}))
        channel.signal()

    mpi.check_not_initialized()
    machine = LocalMachine(LOCAL, (LOCAL + 1) * N * item, child_main)
    leaders = mpi.start(LOCAL, liveness=machine.check, timeout=60,
                        expected_rank=launch.rank)
    me = leaders.offsets[leaders.rank]
    saved: dict[str, object] = {
        "launch": np.array(json.dumps([launch.kind, launch.size, launch.rank])),
        "table": np.array(json.dumps({
            "rank": leaders.rank, "size": leaders.size, "hosts": leaders.hosts,
            "local_sizes": leaders.local_sizes, "offsets": leaders.offsets,
            "pids": leaders.pids, "total": leaders.total, "host": socket.gethostname(),
            "pid": os.getpid(), "library": leaders.library,
            "host_of": [leaders.host_of(g) for g in range(leaders.total)]})),
    }

    # commands: a short one (one broadcast) and a long one (two)
    short = {"opcode": "call", "function": 7, "rows": [0, 10]}
    long = {"opcode": "distribute", "blob": bytes(range(256)) * 400}
    got_short = leaders.broadcast_object(short if leaders.is_master else None)
    got_long = leaders.broadcast_object(long if leaders.is_master else None, spin=0.002)
    saved["short"] = np.frombuffer(pickle.dumps(got_short), np.uint8)
    saved["long_ok"] = np.array(got_long == long)
    replies = leaders.gather_objects({"rank": leaders.rank, "host": socket.gethostname()})
    if leaders.is_master:
        saved["replies"] = np.array(json.dumps(replies))

    # variable-size arrays, a different dtype on every machine
    mine = (np.arange(3 * leaders.rank + 1) * (leaders.rank + 1)).astype(
        [np.float32, np.int16, np.float64, np.uint8][leaders.rank % 4])
    gathered = leaders.gather(mine.reshape(1, -1))
    if gathered is not None:
        for r, a in enumerate(gathered):
            saved[f"gather{r}"] = a
    for r, a in enumerate(leaders.all_gather(mine)):
        saved[f"all_gather{r}"] = a
    sent = ([np.full((r + 1, 2), r, np.int64) for r in range(leaders.size)]
            if leaders.is_master else None)
    saved["scatter"] = leaders.scatter(sent)
    buffer = np.arange(5.0) if leaders.is_master else np.zeros(5)
    saved["broadcast"] = leaders.broadcast(buffer)

    # reductions: this machine's pieces, the child's through shared memory
    view = np.frombuffer(machine.shared, np.float32, count=(LOCAL + 1) * N).reshape(
        LOCAL + 1, N)
    view[0] = piece(me)
    machine.gather()
    pieces = view[:LOCAL].copy()
    flat_exact = leaders.all_reduce_pieces(pieces, "sum")
    local_fold = pieces[0].copy()
    for p in pieces[1:]:
        local_fold += p
    saved["machine_exact"] = leaders.all_reduce(local_fold.copy(), "sum", mode="exact")
    saved["machine_fast"] = leaders.all_reduce(local_fold.copy(), "sum", mode="fast")
    saved["flat_exact"] = flat_exact
    for op in ("sum", "prod", "max", "min"):
        small = (piece(me, 37) / 1e3).astype(np.float64)
        saved[f"{op}_exact"] = leaders.all_reduce(small.copy(), op, mode="exact")
        saved[f"{op}_fast"] = leaders.all_reduce(small.copy(), op, mode="fast")
    big = piece(me, 300_001, np.float64)  # 2.4 MB: fast mode's chunk-owner path
    saved["big_fast"] = leaders.all_reduce(big.copy(), "sum", mode="fast")
    saved["big_exact"] = leaders.all_reduce(big.copy(), "sum", mode="exact")
    saved["int_sum"] = leaders.all_reduce(np.arange(10, dtype=np.int32) * (me + 1), "sum")
    saved["half_sum"] = leaders.all_reduce(np.ones(9, np.float16) * (me + 1), "sum")
    saved["empty_pieces"] = leaders.all_reduce_pieces(
        pieces[:0] if leaders.rank == 1 else pieces, "max")
    view[LOCAL] = flat_exact
    machine.release()
    machine.gather()
    leaders.barrier()
    machine.join()
    np.savez(out / f"leader{leaders.rank}.npz", **saved)
    leaders.close()


if __name__ == "__main__":
    main()
