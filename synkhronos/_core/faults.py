"""Named points where a test can make a process fail on purpose (``synkhronos.testing``).

The library passes a few points in every command; a test arms one of them in chosen
processes (``synkhronos.testing.fault_at``), and the next time such a process passes it,
it breaks in the way asked, once:

========================  ====================================================
point                     where
========================  ====================================================
``"unpickle"``            a worker, before it unpickles distributed functions
``"gather"``              a rank, before it gathers its rows of a call
``"function"``            a rank, before it runs its PyTensor function
``"reply"``               a worker, after its part, before it writes its reply
``"collective"``          a rank, inside any collective, before it moves data
``"exchange"``            a rank, inside a collective, after its first barrier
                          (or, without one, after it moved its data)
========================  ====================================================

Unarmed, a point costs one truth test of a module global. A command replayed from
what an earlier one kept (``synkhronos/_replay.py``: a kept plan, a lane) passes the
same points as the general path, where it does the same work, so that a failure there
is reported as it would be without replay.
"""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["POINTS", "HOWS", "SLOW_SECONDS", "ARMED", "PENDING", "arm", "activate", "disarm", "hit",
           "break_process"]

POINTS = ("unpickle", "gather", "function", "reply", "collective", "exchange")
HOWS = ("raise", "sys_exit", "exit", "kill", "segv", "abort", "stop", "slow")
SLOW_SECONDS = 0.3  # how long a "slow" process lags, then goes on

ARMED: dict[str, tuple[str, int]] = {}  # point -> (how, exit code), in this process
PENDING: dict[str, tuple[str, int]] = {}  # armed from the next command on (see ``arm``)


def arm(point: str, how: str, code: int = 3, now: bool = True) -> None:
    """Arm ``point``; ``now=False`` (arming inside a command) takes effect from the next
    command, so the arming command itself never passes an armed point."""
    if point not in POINTS:
        raise ValueError(f"point must be one of {', '.join(POINTS)}; got {point!r}")
    if how not in HOWS:
        raise ValueError(f"how must be one of {', '.join(HOWS)}; got {how!r}")
    (ARMED if now else PENDING)[point] = (how, code)


def activate() -> None:
    """At the start of a command: points armed during the last one take effect."""
    ARMED.update(PENDING)
    PENDING.clear()


def disarm() -> None:
    ARMED.clear()
    PENDING.clear()


def hit(point: str) -> None:
    """Break here if ``point`` is armed in this process (once)."""
    armed = ARMED.pop(point, None)
    if armed is not None:
        break_process(*armed)


def break_process(how: str, code: int) -> None:
    """Fail now: raise, ``sys.exit``, ``os._exit``, or a signal to this process; or
    (``"slow"``) lag behind the others, then go on."""
    if how == "slow":
        time.sleep(SLOW_SECONDS)
        return
    if how == "raise":
        raise RuntimeError("synkhronos.testing: raised on purpose")
    if how == "sys_exit":
        sys.exit(code)
    if how == "exit":
        os._exit(code)
    number = {"kill": signal.SIGKILL, "segv": signal.SIGSEGV, "abort": signal.SIGABRT,
              "stop": signal.SIGSTOP}[how]
    os.kill(os.getpid(), number)
