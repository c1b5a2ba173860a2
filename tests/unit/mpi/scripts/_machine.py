"""A stand-in for one machine's local processes, for scripts run under mpiexec.

The node leader forks ``local - 1`` children *before* MPI starts; they share an
anonymous ``mmap`` (inherited across fork, so nothing appears in /dev/shm) and talk
to the leader through two pipes each (one byte = "your turn"). Children never import
MPI and leave with ``os._exit``; they ask the kernel for SIGKILL when the leader dies.
This mimics what the library's core does with its control block, in a few lines.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1


class ChildDied(RuntimeError):
    def __init__(self, index: int, pid: int, how: str):
        super().__init__(f"local process {index} (pid {pid}) {how}")
        self.index, self.pid, self.how = index, pid, how


@dataclass
class Channel:
    """The child's end: wait for the leader's byte, send one back."""

    read_fd: int
    write_fd: int

    def wait(self) -> None:
        if os.read(self.read_fd, 1) == b"":
            os._exit(3)  # the leader is gone

    def signal(self) -> None:
        os.write(self.write_fd, b"x")


@dataclass
class Child:
    index: int
    pid: int
    write_fd: int
    read_fd: int
    status: int | None = None


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


class LocalMachine:
    """The leader's view of its machine: shared memory and its forked children."""

    def __init__(self, local: int, nbytes: int,
                 child_main: Callable[[int, mmap.mmap, Channel], None]):
        self.shared = mmap.mmap(-1, max(nbytes, 1))
        self.children: list[Child] = []
        for index in range(1, local):
            down_r, down_w = os.pipe()
            up_r, up_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                    if os.getppid() == 1:
                        os._exit(3)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    os.close(down_w)
                    os.close(up_r)
                    child_main(index, self.shared, Channel(down_r, up_w))
                except BaseException:
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            os.close(down_r)
            os.close(up_w)
            self.children.append(Child(index, pid, down_w, up_r))

    def check(self) -> None:
        """Raise ChildDied if a child has ended (the leader's liveness callback)."""
        for child in self.children:
            if child.status is None:
                pid, status = os.waitpid(child.pid, os.WNOHANG)
                if pid:
                    child.status = status
                    if status != 0:  # a child that finished its part is not a death
                        raise ChildDied(child.index, child.pid, _how(status))

    def release(self) -> None:
        """Tell every child to go on."""
        for child in self.children:
            os.write(child.write_fd, b"x")

    def gather(self, liveness: Callable[[], None] | None = None) -> None:
        """Wait for one byte from every child, checking liveness every 10 ms."""
        pending = {c.read_fd for c in self.children}
        while pending:
            ready, _, _ = select.select(list(pending), [], [], 0.01)
            for fd in ready:
                if os.read(fd, 1) == b"":
                    (liveness or self.check)()
                    raise RuntimeError("a local process closed its pipe")
                pending.discard(fd)
            (liveness or self.check)()

    def join(self) -> None:
        for child in self.children:
            if child.status is None:
                _, child.status = os.waitpid(child.pid, 0)
            if child.status != 0:
                raise ChildDied(child.index, child.pid, _how(child.status))
