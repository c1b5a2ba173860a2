"""A program in a /dev/shm of 64 MiB (Docker's default): what does not fit is refused.

Usage: ``unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && python
small_shm.py'`` (the test runs it so: a private mount namespace, root only).

It forks 2 processes, builds a function and a shared variable, then asks for more
than fits, four ways: a ``synk.data`` of 80 MiB, a ``set_value`` that grows a small one
to 80 MiB, a call with a 70 MiB numpy input (staged in shared memory), and a
``broadcast`` of 70 MiB. Each must raise ``OSError`` (ENOSPC) naming the bytes asked,
the bytes free and ``--shm-size``; after each, a call gives the plain function's value
and ``all_reduce`` works. Prints one JSON line: ``errors`` (what each raised),
``checks`` (failures after them), and ``left`` (entries of /dev/shm after ``close()``).
"""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk
from synkhronos import testing

MIB = 1 << 20


def main() -> None:
    testing.skip_backend_preimport()
    x = pt.dvector("x")
    w = pytensor.shared(np.zeros(4), name="w")
    out = pt.sum(x * 2.0) + w.sum()
    plain = pytensor.function([x], out, mode="FAST_COMPILE")
    synk.fork(2)
    f = synk.function([x], (pt.sum(x * 2.0), "sum"), mode="FAST_COMPILE")
    g = synk.function([], (w.sum(), "sum"), mode="FAST_COMPILE")
    synk.distribute()
    small = synk.data(np.arange(10.0))
    errors: dict[str, list] = {}
    checks: list[str] = []

    def refused(name: str, action) -> None:
        try:
            action()
            errors[name] = ["nothing raised"]
        except OSError as exc:
            errors[name] = [exc.errno == errno.ENOSPC, str(exc)]
        except Exception as exc:  # noqa: BLE001 - reported
            errors[name] = [f"{type(exc).__name__}: {exc}"]
        value = np.linspace(0.0, 1.0, 101)
        if not np.isclose(f(value), plain(value) - 0.0):
            checks.append(f"after {name}: {f(value)} != {plain(value)}")
        testing.set_rank_values(w, [np.full(4, 1.0), np.full(4, 2.0)])
        synk.all_reduce(w, op="sum")
        if not np.isclose(g(), 2 * 12.0):
            checks.append(f"after {name}: g() = {g()}")
        synk.all_reduce(w, op="avg")
        w.set_value(np.zeros(4))
        testing.set_rank_values(w, [np.zeros(4)] * 2)

    refused("data", lambda: synk.data(np.ones(80 * MIB // 8)))
    refused("set_value", lambda: small.set_value(np.ones(80 * MIB // 8)))
    refused("input", lambda: f(np.ones(70 * MIB // 8)))
    refused("broadcast", lambda: synk.broadcast(w, np.ones(70 * MIB // 8)))
    if not np.array_equal(small.data, np.arange(10.0)):
        checks.append(f"the small Data changed: {small.data}")
    synk.close()
    print(json.dumps({"errors": errors, "checks": checks, "left": os.listdir("/dev/shm")}),
          flush=True)


if __name__ == "__main__":
    main()
