"""A master that gets Ctrl-C while it waits inside a command, in its main thread or not.

Usage: ``python ctrl_c_in_command.py MODE MARK`` (MODE ``main`` or ``thread``; MARK a
file path this program may write).

Ctrl-C is made deliverable first (Python's default SIGINT handler), whatever this
process inherited: a test suite started in the background has SIGINT ignored.

It forks 3 processes with ``spin=0`` (a waiting master sleeps on its semaphore at
once) and prints ``{"master", "workers", "prefix"}`` as one JSON line. Then it runs one
command in which worker rank 1 waits until the master's thread that runs the command
sleeps (its state in ``/proc``), writes the time (``CLOCK_MONOTONIC``, the same clock in
every process) to MARK, sends SIGINT to the master process (as Ctrl-C does), and sleeps
``BUSY_S`` seconds more; the other ranks return at once.

- ``main``: the main thread runs the command;
- ``thread``: a second thread runs it while the main thread waits for that thread (in
  short joins, as a program waiting for its sampler thread would).

It then prints a second JSON line: ``raised`` (what the command raised in its
thread), ``main`` (what the main thread got, in ``thread`` mode), ``after_signal``
(seconds from the signal to the end of the command), ``state`` (the session's state
afterwards), ``again`` (every rank's reply to the next command, or what it raised),
``waited`` (seconds from the signal to that reply: the next command waits for rank 1
to finish the interrupted one), then closes the session and adds ``children`` and
``left`` (child processes and shared-memory entries of this program).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos import testing  # noqa: E402

BUSY_S = 2.0  # how long rank 1 goes on with the interrupted command


def _state(pid: int, tid: int) -> str:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2]


def signal_when_asleep(master_pid: int, tid: int, mark: str) -> None:
    """In a worker: once thread ``tid`` of the master has slept 20 ms, Ctrl-C it."""
    deadline = time.monotonic() + 10
    asleep_since = None
    while True:
        now = time.monotonic()
        if _state(master_pid, tid) == "S":
            asleep_since = now if asleep_since is None else asleep_since
            if now - asleep_since > 0.02:
                break
        else:
            asleep_since = None
        if now > deadline:
            raise RuntimeError("the master never blocked")
        time.sleep(0.001)
    with open(mark, "w") as f:
        f.write(repr(time.monotonic()))
    os.kill(master_pid, signal.SIGINT)
    time.sleep(BUSY_S)


def command(mark: str, outcome: dict) -> None:
    """The command, from the calling thread; what it raised and when, in ``outcome``."""
    try:
        testing.run_on_ranks(signal_when_asleep, os.getpid(), threading.get_native_id(), mark,
                             ranks=[1])
        outcome["raised"] = None
    except BaseException as exc:  # noqa: BLE001 - reported
        outcome["raised"] = type(exc).__name__
    outcome["ended"] = time.monotonic()


def main() -> None:
    mode, mark = sys.argv[1], sys.argv[2]
    testing.skip_backend_preimport()  # this program compiles nothing
    synk.fork(3, spin=0)
    info = {"master": os.getpid(), "workers": testing.run_on_ranks(os.getpid)[1:],
            "prefix": testing.program_prefix()}
    print(json.dumps(info), flush=True)
    outcome: dict = {}
    main_got = None
    if mode == "main":
        command(mark, outcome)
    else:
        thread = threading.Thread(target=command, args=(mark, outcome))
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.05)
        except KeyboardInterrupt:
            main_got = "KeyboardInterrupt"
        # A join interrupted by Ctrl-C may return early afterwards (CPython): wait for
        # the thread's outcome itself.
        deadline = time.monotonic() + 10
        while "ended" not in outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        thread.join(10)
    with open(mark) as f:
        signalled = float(f.read())
    state = testing.session_state()
    try:
        again = testing.run_on_ranks(testing.this_rank)
    except BaseException as exc:  # noqa: BLE001 - reported
        again = f"{type(exc).__name__}: {exc}"
    waited = time.monotonic() - signalled
    synk.close()
    print(json.dumps({
        "raised": outcome.get("raised"), "main": main_got,
        "after_signal": outcome["ended"] - signalled if "ended" in outcome else None,
        "state": state, "again": again, "waited": waited,
        "children": testing.child_pids(), "left": testing.leftover_segments(),
    }), flush=True)


if __name__ == "__main__":
    main()
