"""The master's SIGINT and SIGTERM while a session runs.

While a session is open the master turns Ctrl-C into ``KeyboardInterrupt`` and
SIGTERM into ``SystemExit(143)`` (only where the program kept Python's defaults). A
waiting loop that sees SIGTERM closes the session and ``atexit`` runs: nothing is left
behind. Ctrl-C abandons the command in the master only; the session stays usable and
the next command waits for the workers (``_core/session.py``).

Two traps make this more than ``signal.signal``:

- posix_ipc runs Python's handlers during a blocked semaphore wait and then replaces
  the exception they raised with its own ``SignalError``. The handler therefore also
  notes the signal, and the waiting loop calls ``reraise_lost()``.
- A process-directed signal may go to any thread that does not block it; Python runs
  handlers only in the main thread, and a blocking call there returns early only if
  the kernel chose the main thread. Pools started by the library (OpenBLAS rebuilds
  its threads when their count changes) are started inside ``blocked()``, so they
  inherit a mask that leaves these signals to the main thread.
- A handler that raises while the master runs its own share inside compiled code
  (a Numba kernel, PyTensor's C code, JAX) may see its exception dropped, or hidden
  any number of exceptions deep behind another one (Numba's dispatcher turns it into
  ``SystemError: ... returned a result with an exception set``). So the interruption
  is recognised where it happens rather than looked for in the exception:
  ``reraise_interruption`` takes a failure of this process's share, during a command
  in which the handler ran (it noted the signal), for the interruption itself.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["install", "restore", "reraise_lost", "forget", "blocked",
           "reraise_interruption", "hold", "release", "held"]

_TERMINATING = {signal.SIGINT, signal.SIGTERM}
_DEFAULTS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
_lost: list[int] = []
_holder: int | None = None  # the thread whose Ctrl-C waits for ``release`` (``hold``)
_held_since: float | None = None  # when the first Ctrl-C held so far arrived


def _exception_for(signum: int) -> BaseException:
    """What Python's default handling of ``signum`` would raise."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return SystemExit(128 + signum)


def _raise_for(signum: int):
    raise _exception_for(signum)


def _on_signal(signum, frame):
    global _held_since
    _lost.append(signum)
    if signum == signal.SIGINT and _holder is not None:
        if _held_since is None:
            _held_since = time.monotonic()
        if _holder == threading.get_ident():  # (handlers run in the main thread)
            return  # raised by ``release``
    _raise_for(signum)


def hold() -> None:
    """From now on a Ctrl-C waits in this thread: noted, not raised (neither by the
    handler, if this is the main thread, nor by ``reraise_lost``), until ``release``.
    SIGTERM is not held. One thread holds at a time (commands run one at a time)."""
    global _holder, _held_since
    _held_since = None
    _holder = threading.get_ident()


def release(raise_held: bool = True) -> None:
    """Stop holding Ctrl-C; raise ``KeyboardInterrupt`` if one arrived meanwhile
    (``raise_held``: else it is dropped, the caller raising its own)."""
    global _holder, _held_since
    since = _held_since
    _holder = None
    _held_since = None
    if since is not None and raise_held:
        _lost.clear()
        raise KeyboardInterrupt


def held() -> float | None:
    """When the first Ctrl-C held since ``hold`` arrived (``time.monotonic()``), or
    None."""
    return _held_since


def install() -> dict[int, Any]:
    """Take over SIGINT/SIGTERM where they have Python's defaults; return the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old: dict[int, Any] = {}
    for signum, default in _DEFAULTS.items():
        if signal.getsignal(signum) is default:
            old[signum] = signal.signal(signum, _on_signal)
    return old


def restore(old: dict[int, Any]) -> None:
    """Put back the handlers ``install`` replaced.

    Only the main thread may set handlers: from another thread (a session closed by a
    Ctrl-C its command saw there) ours stay, which behave as Python's defaults do for
    SIGINT (``KeyboardInterrupt``) and nearly so for SIGTERM (``SystemExit(143)``).
    """
    global _holder, _held_since
    _lost.clear()
    _holder = _held_since = None
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in old.items():
        signal.signal(signum, handler)


#: Drop signals noted earlier: only one that arrives from now on is re-raised. (The
#: list's own ``clear``: every command calls it, and a function around it costs more.)
forget: Callable[[], None] = _lost.clear


def reraise_interruption(exc: BaseException) -> None:
    """Raise the interruption behind ``exc`` (a failure of this process's share of a
    command), if there is one.

    If one of our handlers ran since the command began (``forget``), the failure is the
    interruption, whatever compiled code made of the handler's exception: this raises
    ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM) from ``exc``.
    Otherwise a ``KeyboardInterrupt`` anywhere in the chain of ``exc`` (causes,
    contexts and the members of exception groups, each looked at once, at any depth)
    is one that a handler other than ours raised: ``KeyboardInterrupt`` is raised from
    ``exc``. A ``SystemExit`` from ``sys.exit()`` in user code is not an interruption.
    """
    if _lost:
        signum = signal.SIGTERM if signal.SIGTERM in _lost else _lost[-1]
        _lost.clear()
        raise _exception_for(signum) from exc
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    if _hides_interrupt(exc):
        raise KeyboardInterrupt from exc


def _hides_interrupt(exc: BaseException) -> bool:
    """Whether a ``KeyboardInterrupt`` is in the chain of ``exc``."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:  # a chain may loop back on itself
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return True
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            pending += current.exceptions
    return False


def reraise_lost() -> None:
    """Raise again a signal whose exception posix_ipc swallowed (not a Ctrl-C this
    thread holds: ``hold``)."""
    if _lost:
        if _holder is not None and signal.SIGTERM not in _lost \
                and _holder == threading.get_ident():
            return
        signum = _lost.pop()
        _lost.clear()
        _raise_for(signum)


def blocked(action: Callable[[], object]) -> object:
    """Run ``action`` with SIGINT and SIGTERM blocked in the calling thread.

    Threads started meanwhile inherit the blocked mask, so the kernel delivers these
    signals to the main thread, never to a pool thread where they would wait unseen.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINATING)
    try:
        return action()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
