"""The exceptions synkhronos raises, and what each one promises about the session.

``SynkhronosError`` is a ``RuntimeError``; its children say whether the session is
still usable:

- ``WorkerError``: user code raised inside some process. Every process finished the
  command and is back in step, so the next call works.
- ``WorkerDiedError``: a process died (killed, segfault, ``os._exit``). The session is
  broken: every later call raises this again until ``close()``.
- ``WorkerTimeoutError``: a process did not finish within the configured timeout
  (e.g. stopped with SIGSTOP). Its state is unknown, so the session is broken too.

On several machines (``mpiexec``) both name the host of the process (``host``); a
machine that is lost altogether is reported as its leader's death.

Misuse (``fork`` twice, a collective before ``distribute``) is a plain ``RuntimeError``;
bad arguments are ``TypeError`` / ``ValueError``.
"""

from __future__ import annotations

__all__ = ["SynkhronosError", "WorkerError", "WorkerDiedError", "WorkerTimeoutError"]


class SynkhronosError(RuntimeError):
    """Base class of the errors that come from running a command on the processes."""


class WorkerError(SynkhronosError):
    """User code raised an exception in process ``rank``; the session stays usable.

    Attributes
    ----------
    rank : int
        The process that raised (the master's own rank included).
    exc_type : str
        The qualified name of the original exception's class.
    message : str
        The original exception's message.
    remote_traceback : str
        The formatted traceback from that process.
    """

    def __init__(self, rank: int, exc_type: str, message: str, remote_traceback: str):
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(f"{exc_type} in rank {rank}: {message}")

    def __reduce__(self):
        return type(self), (self.rank, self.exc_type, self.message, self.remote_traceback)


def _on(host: str | None) -> str:
    return f" on host {host}" if host else ""


class WorkerDiedError(SynkhronosError):
    """Process ``rank`` (``pid``) died; the session is broken until ``close()``.

    Attributes
    ----------
    rank, pid : int
        The dead worker.
    reason : str
        How it ended, e.g. ``"killed by SIGKILL"`` or ``"exited with code 3"``.
    host : str or None
        The machine it ran on, in a session over several machines (else None).
    """

    def __init__(self, rank: int, pid: int, reason: str, host: str | None = None):
        self.rank = rank
        self.pid = pid
        self.reason = reason
        self.host = host
        super().__init__(
            f"worker rank {rank} (pid {pid}){_on(host)} died: {reason}; the session is "
            "broken, call synk.close() (and synk.fork() again to continue)"
        )

    def __reduce__(self):
        return type(self), (self.rank, self.pid, self.reason, self.host)


class WorkerTimeoutError(SynkhronosError, TimeoutError):
    """Process ``rank`` did not finish a command within ``timeout`` seconds.

    Also a ``TimeoutError``. The session is broken until ``close()``.

    Attributes
    ----------
    rank, pid : int
        The first worker that had not finished.
    timeout : float
        The limit set by ``fork(timeout=...)`` or ``SYNK_TIMEOUT``.
    host : str or None
        The machine it ran on, in a session over several machines (else None).
    """

    def __init__(self, rank: int, pid: int, timeout: float, host: str | None = None):
        self.rank = rank
        self.pid = pid
        self.timeout = timeout
        self.host = host
        super().__init__(
            f"worker rank {rank} (pid {pid}){_on(host)} did not finish within the "
            f"{timeout:g} s timeout (stopped or stuck?); the session is broken, call "
            "synk.close()"
        )

    def __reduce__(self):
        return type(self), (self.rank, self.pid, self.timeout, self.host)
