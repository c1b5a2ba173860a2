"""Instructions per command in the master, counted by valgrind's callgrind: a measure of
the fixed cost of small work that the machine's load does not change.

Timings of a few microseconds move by tens of percent with the load of a shared
machine; the number of instructions a process executes for one command does not. Each
operation runs in a session of ``--n`` processes under ``valgrind --tool=callgrind``
with counting off; after a warm-up the script turns counting on for this process
(``callgrind_control``), runs the operation ``k`` times, and turns it off. Two runs,
``k = --calls`` and ``k = 3 * --calls``, and their difference divided by
``2 * --calls`` is the count per operation, free of the start and stop.

At ``n=1`` that is the whole cost of a command; at ``n=2`` the master's count includes
its wait for the worker (spinning), so only ``n=1`` is meaningful here. The
operations:

- ``nothing``: the loop alone (subtract it from the others);
- ``ping``: the empty command (``Session.run``);
- ``plain``: a tiny plain PyTensor function (4 x 3 rows, ``(x * 2).sum(axis=0)``);
- ``call``: the same graph as a ``synk.function`` with a ``"sum"`` output, a repeated
  numpy input;
- ``data_call``: that call with a ``synk.Data`` input (nothing copied in).

Needs ``valgrind`` (Debian: ``apt-get install valgrind``); prints JSON.

``--bytecodes`` counts instead, without valgrind, the Python bytecodes each process
executes for one operation (``sys.settrace`` with opcode events), per function: in the
master and in worker 1 alike (at ``n=2`` the worker's share of a command is on the
critical path), leaving out the waiting loops (``WAITS``), whose count is the time
spent waiting. Python bytecodes are not instructions (one may cost a few nanoseconds
or a microsecond), but their count is exact, and per function it says where the
Python glue of a command is. With more processes than cores the ranks sleep between
commands and each command wakes them (work that free cores never do); ``--spin 5``
keeps them spinning instead, so that the count is the one of a machine with a core per
process.

    python benchmarks/instructions.py [--ops ping,plain,call] [--calls 1000] [--n 1]
    python benchmarks/instructions.py --bytecodes [--n 2] [--ops ping,call,all_reduce]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OPS = ("nothing", "ping", "plain", "call", "data_call", "all_reduce")
WAITS = frozenset({"wait_done", "next_command", "wait", "ready", "<lambda>",  # control.py
                   "arrived", "_spin_arrivals", "_peer_failed"})
_COUNTS: collections.Counter = collections.Counter()  # (function, file, line) -> bytecodes


def operations(n: int, warm: list[str], spin: float | None = None) -> dict:
    """A session of ``n`` (``spin``: ``synk.fork``'s) and each operation's callable
    (those in ``warm`` run 300 times first)."""
    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    import synkhronos as synk
    from synkhronos import testing

    synk.fork(n, spin=spin)
    x = pt.matrix("x", dtype="float64")
    out = (x * 2.0).sum(axis=0)
    plain = pytensor.function([x], out)
    parallel = synk.function([x], (out, "sum"))
    value = pytensor.shared(np.ones(1, "float32"), name="value")
    synk.function([x], (x.sum() * value[0], "sum"))  # (collectives need it distributed)
    synk.distribute()
    a = np.ones((4, 3))
    shared = synk.data(a)
    ops = {
        "nothing": lambda: None,
        "ping": testing.ping,
        "plain": lambda: plain(a),
        "call": lambda: parallel(a),
        "data_call": lambda: parallel(shared),
        "all_reduce": lambda: synk.all_reduce([value], "max"),
    }
    for name in warm:
        for _ in range(300):
            ops[name]()
    return ops


def _trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        code = frame.f_code
        _COUNTS[(code.co_name, code.co_filename, code.co_firstlineno)] += 1
    return _trace


def _start_counting() -> None:
    _COUNTS.clear()
    sys.settrace(_trace)


def _stop_counting() -> dict:
    sys.settrace(None)
    return dict(_COUNTS)


def _per_call(counts: dict, calls: int) -> dict:
    """Bytecodes per call outside the waits, and the functions that ran most."""
    work = {key: c for key, c in counts.items() if key[0] not in WAITS}
    top = sorted(work.items(), key=lambda item: -item[1])[:12]
    return {"bytecodes": round(sum(work.values()) / calls, 1),
            "waiting": round(sum(counts.values()) / calls - sum(work.values()) / calls, 1),
            "top": [[f"{Path(file).name}:{line} {name}", round(c / calls, 1)]
                    for (name, file, line), c in top]}


def bytecodes(names: list[str], n: int, calls: int, spin: float | None = None) -> dict:
    """Per operation: the master's and (``n > 1``) worker 1's bytecodes per call."""
    import synkhronos as synk
    from synkhronos import testing

    ops = operations(n, names, spin)
    report = {}
    try:
        for name in names:
            run = ops[name]
            if n > 1:  # (a command of its own: counted in neither process's operation)
                testing.run_on_ranks(_start_counting, ranks=[1])
            _start_counting()
            for _ in range(calls):
                run()
            master = _stop_counting()
            entry = {"master": _per_call(master, calls)}
            if n > 1:
                worker = testing.run_on_ranks(_stop_counting, ranks=[1])[1]
                entry["worker"] = _per_call(worker, calls)
            report[name] = entry
    finally:
        synk.close()
    return report


def child(op: str, n: int, calls: int) -> None:
    """Under valgrind: build a session, warm up, count ``calls`` runs of ``op``."""
    import synkhronos as synk

    run = operations(n, [op])[op]
    me = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", me], capture_output=True, check=True)
    for _ in range(calls):
        run()
    subprocess.run(["callgrind_control", "-i", "off", me], capture_output=True, check=True)
    synk.close()


def counted(op: str, n: int, calls: int) -> int:
    """Instructions callgrind counted with ``calls`` runs of ``op``."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={tmp}/out", sys.executable, __file__, "--child", op,
             "--n", str(n), "--calls", str(calls)],
            capture_output=True, text=True, check=False)
    found = re.findall(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{op}: valgrind failed:\n{proc.stderr[-2000:]}")
    return int(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--bytecodes", action="store_true",
                        help="count Python bytecodes per function in the master and worker 1")
    parser.add_argument("--spin", type=float, default=None,
                        help="synk.fork's spin (seconds); a long one keeps every rank "
                             "spinning, as on free cores, where n oversubscribes these")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.calls)
        return
    if args.bytecodes:
        names = [op for op in args.ops.split(",") if op in OPS]
        print(json.dumps({"n": args.n, "calls": args.calls, "spin": args.spin,
                          "python": sys.version.split()[0],
                          "bytecodes_per_op": bytecodes(names, args.n, args.calls, args.spin)},
                         indent=1))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print(json.dumps({"absent": "valgrind (and its callgrind_control) not installed"}))
        return
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {list(OPS)}")
    per_op = {}
    for op in ops:
        low = counted(op, args.n, args.calls)
        high = counted(op, args.n, 3 * args.calls)
        per_op[op] = round((high - low) / (2 * args.calls))
    print(json.dumps({"n": args.n, "calls": args.calls, "instructions_per_op": per_op,
                      "python": sys.version.split()[0]}, indent=1))


if __name__ == "__main__":
    main()
