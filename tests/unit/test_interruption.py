"""Recognising Ctrl-C (and SIGTERM) behind a failure of the master's own share.

A signal that arrives while the master runs its share inside compiled code comes out
of that code as some other failure: Numba's dispatcher raises ``SystemError: ...
returned a result with an exception set`` with the handler's ``KeyboardInterrupt``
buried in its chain (a user saw it about 90 traceback lines down), and other code may
drop it. ``execute.failed``, which turns a share's exception into its failure, must
give the interruption instead, however deep it is buried or whether it is there at
all, when the session's handler ran during the command; without that, a
``KeyboardInterrupt`` anywhere in the chain still counts, and nothing else does.

The signals are really delivered (``signal.raise_signal``) to the session's handlers,
installed over Python's defaults as ``fork`` installs them, so this passes when the
suite runs with SIGINT ignored (``pytest &``). Nothing forks here.

Over several machines a Ctrl-C that comes while data move between the machines waits
(``signals.hold``) until the move is over (``signals.release``): held in the thread
that moves them, raised at once in the main thread if another one does.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from synkhronos._core.execute import Executor, failed
from synkhronos._core.protocol import RunCallable
from synkhronos._runtime import signals

DISPATCHER = "CPUDispatcher(<function numba_funcified_fgraph>) returned a result with an " \
             "exception set"


@contextmanager
def session_handlers() -> Iterator[None]:
    """The session's SIGINT/SIGTERM handlers, installed as ``fork`` installs them."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    old = signals.install()
    try:
        # (without them a SIGTERM raised below would end the test run)
        assert set(old) == {signal.SIGINT, signal.SIGTERM}
        yield
    finally:
        signals.restore(old)
        for signum, handler in before.items():
            signal.signal(signum, handler)


def deliver(signum: int) -> BaseException:
    """Send ``signum`` to this thread; return what the session's handler raised."""
    expected = KeyboardInterrupt if signum == signal.SIGINT else SystemExit
    with pytest.raises(expected) as raised:
        signal.raise_signal(signum)
        for _ in range(1000):  # (the handler runs between bytecodes: within a few)
            pass
    return raised.value


def buried(inner: BaseException | None, depth: int) -> BaseException:
    """``inner`` behind ``depth`` exceptions, each raised while handling the one
    before, as compiled code that calls back into Python leaves them; the outermost
    is returned. ``inner`` None: the first of them has no context (dropped)."""
    exc = inner
    for k in range(depth):
        try:
            try:
                if exc is not None:
                    raise exc
            finally:
                raise SystemError(f"{DISPATCHER} (level {k})")
        except SystemError as error:
            exc = error
    assert exc is not None
    return exc


def chain_length(exc: BaseException) -> int:
    count, current = 0, exc
    while current is not None:
        count += 1
        current = current.__cause__ or current.__context__
    return count


@pytest.mark.parametrize("depth", [1, 9, 40, 400])
@pytest.mark.parametrize("dropped", [False, True], ids=["buried", "dropped"])
def test_a_share_failing_after_ctrl_c_is_keyboardinterrupt_at_any_depth(depth, dropped):
    with session_handlers():
        handled = deliver(signal.SIGINT)
        exc = buried(None if dropped else handled, depth)
        assert chain_length(exc) == depth + (not dropped)
        with pytest.raises(KeyboardInterrupt) as raised:
            failed(exc, False)
        assert raised.value.__cause__ is exc  # the traceback still shows what happened
        # the signal is used up: a later failure in the same command is a failure
        assert failed(SystemError(DISPATCHER), False).failure.exc_type == "SystemError"


def test_a_share_failing_after_sigterm_is_systemexit_143():
    with session_handlers():
        exc = buried(deliver(signal.SIGTERM), 12)
        with pytest.raises(SystemExit) as raised:
            failed(exc, True)
        assert raised.value.code == 128 + signal.SIGTERM
        assert raised.value.__cause__ is exc


def test_sigterm_wins_over_ctrl_c_in_one_command():
    with session_handlers():
        deliver(signal.SIGTERM)
        deliver(signal.SIGINT)
        with pytest.raises(SystemExit):
            failed(SystemError(DISPATCHER), False)


def test_a_signal_before_the_command_began_is_not_this_commands():
    """Every command forgets the signals noted before it (``signals.forget``)."""
    with session_handlers():
        deliver(signal.SIGINT)
        signals.forget()
        outcome = failed(buried(ValueError("bad shape"), 3), False)
        assert outcome.failure.exc_type == "SystemError"


def test_the_executor_raises_the_interruption_from_the_share():
    """The path the master's share takes: ``Executor.run``."""
    with session_handlers():
        deliver(signal.SIGINT)

        def kernel():
            raise buried(None, 30)

        with pytest.raises(KeyboardInterrupt) as raised:
            Executor({}).run(None, RunCallable(kernel))  # type: ignore[arg-type]
        assert isinstance(raised.value.__cause__, SystemError)


@pytest.mark.parametrize("depth", [0, 9, 400])
def test_keyboardinterrupt_anywhere_in_the_chain_counts_without_our_handler(depth):
    """A program that kept its own SIGINT handler (``fork`` then leaves it) may raise
    ``KeyboardInterrupt`` from it; it is found at any depth."""
    inner = KeyboardInterrupt()
    exc = buried(inner, depth) if depth else inner
    with pytest.raises(KeyboardInterrupt) as raised:
        failed(exc, False)
    if depth:
        assert raised.value.__cause__ is exc
    else:
        assert raised.value is inner


def test_keyboardinterrupt_behind_a_cause_or_in_an_exception_group_counts():
    inner = KeyboardInterrupt()
    try:
        try:
            raise inner
        except KeyboardInterrupt:
            raise RuntimeError("while interrupted") from ValueError("the cause")
    except RuntimeError as error:  # its cause hides its context from a plain walk
        behind_cause = error
    group = BaseExceptionGroup("several", [ValueError("a"), buried(inner, 20)])
    for exc in (behind_cause, group):
        with pytest.raises(KeyboardInterrupt) as raised:
            failed(exc, False)
        assert raised.value.__cause__ is exc


def test_a_chain_that_loops_without_an_interruption_is_a_failure():
    first, second = SystemError("first"), ValueError("second")
    first.__context__ = second
    second.__context__ = first
    assert failed(first, False).failure.exc_type == "SystemError"


def test_sys_exit_in_user_code_is_a_failure_not_an_interruption():
    try:
        sys.exit(5)
    except SystemExit as exc:
        outcome = failed(buried(exc, 3), True)
    assert outcome.failure.exc_type == "SystemError"
    assert failed(SystemExit(5), True).failure.exc_type == "SystemExit"


# -- a Ctrl-C held while data move between machines (signals.hold) -----------------------
def test_a_held_ctrl_c_is_raised_by_release():
    with session_handlers():
        signals.hold()
        try:
            signal.raise_signal(signal.SIGINT)  # noted, not raised
            for _ in range(1000):
                pass
            assert signals.held() is not None
            signals.reraise_lost()  # the waiting loops' check leaves it too
        except KeyboardInterrupt:
            signals.release(raise_held=False)
            raise AssertionError("a held Ctrl-C was raised before release()") from None
        with pytest.raises(KeyboardInterrupt):
            signals.release()
        assert signals.held() is None
        deliver(signal.SIGINT)  # no longer held: raised at once


def test_release_without_a_ctrl_c_raises_nothing_and_can_drop_one():
    with session_handlers():
        signals.hold()
        signals.release()
        signals.hold()
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):
            pass
        signals.release(raise_held=False)  # the caller raises an error of its own
        signals.forget()
        signals.reraise_lost()


def test_sigterm_is_never_held():
    with session_handlers():
        signals.hold()
        try:
            deliver(signal.SIGTERM)
        finally:
            signals.release(raise_held=False)


def test_a_ctrl_c_held_by_another_thread_still_reaches_the_main_thread():
    """The main thread gets it at once (it is not the one moving data); the holding
    thread's waits leave it, and its release raises it there."""
    seen: list[str] = []
    held, delivered = threading.Event(), threading.Event()

    def holder() -> None:
        signals.hold()
        held.set()
        delivered.wait(10)
        signals.reraise_lost()  # a wait's check in the holding thread: nothing
        seen.append("waited")
        try:
            signals.release()
        except KeyboardInterrupt:
            seen.append("raised")

    with session_handlers():
        thread = threading.Thread(target=holder)
        thread.start()
        assert held.wait(10)
        try:
            deliver(signal.SIGINT)  # raised in the main thread
        finally:
            delivered.set()
            thread.join(10)
    assert seen == ["waited", "raised"]
