"""NCCL on a GPU, probed one step below a session: one rank alone, and two ranks on one
device (run as ``python tests/support/nccl_probe.py``; it prints one JSON line).

A session hides which collectives layer it runs on; these probes call the NCCL layer
(``synkhronos._runtime.nccl``) directly, to time a one-rank all-reduce and broadcast
and to learn whether NCCL accepts two ranks on one GPU. ``benchmarks/device_check.py``
runs them in subprocesses (a hung NCCL call is killed with its process)::

    python tests/support/nccl_probe.py time NBYTES TRIALS  # one-rank all_reduce, broadcast
    python tests/support/nccl_probe.py rank R UID_JSON     # one rank of a two-rank probe
    python tests/support/nccl_probe.py uid                 # a communicator id for them

Needs JAX and CuPy with NCCL (the ``gpu`` extra) and a CUDA GPU.
"""

from __future__ import annotations

import json
import sys
import time

__all__ = ["time_one_rank", "one_rank_of_two", "main"]


def time_one_rank(nbytes: int, trials: int) -> dict:
    """Seconds of each one-rank ``all_reduce`` (sum) and ``broadcast`` of ``nbytes``."""
    import jax
    import jax.numpy as jnp

    from synkhronos._runtime import nccl

    comm = nccl.Communicator(1, 0, nccl.unique_id())
    x = jnp.ones(nbytes // 4, dtype=jnp.float32) * 3
    jax.block_until_ready(x)
    result: dict = {"device": str(x.devices().pop())}
    try:
        for name, call in (("all_reduce_sum", lambda: comm.all_reduce([x], "sum")),
                           ("broadcast", lambda: comm.broadcast([x], 0))):
            if not bool(jnp.all(call()[0] == 3)):
                raise AssertionError(f"one-rank {name} changed the values")
            times = []
            for _ in range(trials):
                start = time.perf_counter()
                jax.block_until_ready(call())
                times.append(time.perf_counter() - start)
            result[name] = times
    finally:
        comm.close()
    return result


def one_rank_of_two(rank: int, uid: list[int]) -> dict:
    """Rank ``rank`` of a two-rank communicator: one all_reduce of 1024 floats."""
    import jax
    import jax.numpy as jnp

    from synkhronos._runtime import nccl

    comm = nccl.Communicator(2, rank, uid)
    try:
        (got,) = comm.all_reduce([jnp.full(1024, rank + 1.0, dtype=jnp.float32)], "sum")
        jax.block_until_ready(got)
        return {"rank": rank, "sum_ok": bool(jnp.all(got == 3.0))}
    finally:
        comm.close()


def main(argv: list[str]) -> None:
    """Run the probe ``argv`` names (``time``, ``rank`` or ``uid``); print its JSON line."""
    if argv[0] == "time":
        out = time_one_rank(int(argv[1]), int(argv[2]))
    elif argv[0] == "rank":
        out = one_rank_of_two(int(argv[1]), json.loads(argv[2]))
    elif argv[0] == "uid":
        from synkhronos._runtime import nccl

        out = {"uid": list(nccl.unique_id())}
    else:
        raise SystemExit(f"unknown command {argv[0]!r}")
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
