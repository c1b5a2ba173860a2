"""POSIX shared-memory segments: names, creation, mapping, and sweeping leftovers.

Every segment and semaphore of a program carries one prefix,
``synk_<master pid>_<random token>_``, so that

- two programs never collide (the token is random; creation is exclusive),
- ``close()`` (or a worker that outlives its master) removes everything of one
  program by listing ``/dev/shm`` for that prefix, and
- a program holds an ``flock`` on its ``<prefix>lock`` entry while any of its
  processes lives, so a lock that can be taken means the program is gone (no pid
  is trusted: pids repeat and differ between PID namespaces). The session's watcher
  (``watcher.py``) waits for that lock and sweeps the prefix when every process was
  killed at once; the next ``fork()`` on the machine removes what is left when the
  watcher was killed too (or an older version ran without one).

Only entries owned by the current user are ever removed.

Segments are created with mode 0600 (owner only). A mapping outlives the name:
unlinking only stops new opens, so the owner may unlink as soon as every process
that needs it has mapped it.
"""

from __future__ import annotations

import errno
import fcntl
import math
import mmap
import os
import re
import secrets

import numpy as np
import posix_ipc

__all__ = [
    "PREFIX",
    "SHM_DIR",
    "create_segment",
    "open_segment",
    "unlink_segment",
    "new_session_prefix",
    "sweep_prefix",
    "sweep_dead_programs",
    "array_view",
    "ProgramLock",
    "shm_free",
    "no_space",
]

PREFIX = "synk_"
SHM_DIR = "/dev/shm"
_OWNER = re.compile(r"^(?:sem\.)?" + PREFIX + r"(\d+)_([0-9a-f]+)_")


def new_session_prefix(pid: int | None = None) -> str:
    """Return a fresh prefix ``synk_<pid>_<token>_`` for one program's segments."""
    pid = os.getpid() if pid is None else pid
    return f"{PREFIX}{pid}_{secrets.token_hex(8)}_"


def _posix_name(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def create_segment(name: str, nbytes: int) -> mmap.mmap:
    """Create segment ``name`` exclusively (mode 0600) and map ``nbytes`` of it.

    A zero-byte request maps one page: POSIX cannot map an empty segment.

    Raises
    ------
    OSError
        ``ENOSPC`` when ``/dev/shm`` has too little room, saying how much was asked,
        how much is free and how to get more (``no_space``); nothing is left behind.
    """
    size = max(int(nbytes), 1)
    free = shm_free()
    if free is not None and size > free:  # ask first: the message can say why
        raise no_space(size, free)
    shm = posix_ipc.SharedMemory(
        _posix_name(name), flags=posix_ipc.O_CREX, mode=0o600, size=size
    )
    try:
        # Reserve the pages now: on a full /dev/shm this fails with ENOSPC here,
        # instead of a SIGBUS at the first write (another program may have taken the
        # room since the check above).
        try:
            os.posix_fallocate(shm.fd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise no_space(size, shm_free()) from exc
            raise
        return mmap.mmap(shm.fd, size)
    except BaseException:
        shm.unlink()
        raise
    finally:
        shm.close_fd()


def shm_free() -> int | None:
    """Bytes an unprivileged process may still allocate in ``/dev/shm`` (None if it
    cannot be read)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def no_space(asked: int, free: int | None) -> OSError:
    """The error for a segment of ``asked`` bytes that does not fit in ``/dev/shm``."""
    have = "an unknown amount" if free is None else f"{free} bytes ({_size(free)})"
    return OSError(
        errno.ENOSPC,
        f"{SHM_DIR} has too little room for a shared-memory segment of {asked} bytes "
        f"({_size(asked)}): {have} free. synkhronos keeps every synk.data, staged input "
        f"and collective buffer there (it is RAM). Free some (del Data no longer needed, "
        f"close other sessions) or give {SHM_DIR} more room: Docker's --shm-size (e.g. "
        f"docker run --shm-size=8g), a Kubernetes emptyDir with medium Memory mounted at "
        f"{SHM_DIR}, or as root: mount -o remount,size=8G {SHM_DIR}",
    )


def open_segment(name: str) -> mmap.mmap:
    """Map the whole of an existing segment ``name`` (read and write)."""
    shm = posix_ipc.SharedMemory(_posix_name(name))
    try:
        return mmap.mmap(shm.fd, shm.size)
    finally:
        shm.close_fd()


def unlink_segment(name: str) -> bool:
    """Remove ``name`` from ``/dev/shm``; True if it was there. Mappings stay valid."""
    try:
        posix_ipc.unlink_shared_memory(_posix_name(name))
    except posix_ipc.ExistentialError:
        return False
    return True


def _remove_entry(entry: str) -> None:
    """Unlink one entry of ours; another user's entries are left alone."""
    try:
        if os.stat(os.path.join(SHM_DIR, entry)).st_uid != os.getuid():
            return
        if entry.startswith("sem."):
            posix_ipc.unlink_semaphore("/" + entry[len("sem.") :])
        else:
            posix_ipc.unlink_shared_memory("/" + entry)
    except (OSError, posix_ipc.ExistentialError, posix_ipc.PermissionsError):
        pass


def _entries() -> list[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def sweep_prefix(prefix: str) -> int:
    """Remove every segment and semaphore whose name starts with ``prefix``."""
    removed = 0
    for entry in _entries():
        if entry.startswith(prefix) or entry.startswith("sem." + prefix):
            _remove_entry(entry)
            removed += 1
    return removed


LOCK = "lock"  # the entry, under a program's prefix, that its processes hold locked


class ProgramLock:
    """An exclusive ``flock`` that a program's processes hold while any of them lives.

    The master creates ``<prefix>lock`` and locks it; forked workers inherit the open
    file and so share the lock. Another program judges this one dead only when it can
    take the lock itself: a test that needs no pid, so it holds across PID namespaces
    (containers sharing ``/dev/shm``) and survives pid reuse.
    """

    def __init__(self, prefix: str):
        self.name = prefix + LOCK
        shm = posix_ipc.SharedMemory(
            _posix_name(self.name), flags=posix_ipc.O_CREX, mode=0o600, size=1
        )
        self.fd = shm.fd
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def close(self) -> None:
        unlink_segment(self.name)
        os.close(self.fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _program_alive(prefix: str, pid: int) -> bool:
    """Whether the program that owns ``prefix`` still runs (its lock is held)."""
    try:
        shm = posix_ipc.SharedMemory(_posix_name(prefix + LOCK))
    except posix_ipc.ExistentialError:
        return _alive(pid)  # no lock entry (being created, or already half swept)
    except posix_ipc.PermissionsError:
        return True  # another user's program: never ours to judge
    try:
        fcntl.flock(shm.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        shm.close_fd()  # closing our descriptor releases our lock at once
    return False


def sweep_dead_programs() -> int:
    """Remove the segments of synkhronos programs that no longer run."""
    removed = 0
    verdicts: dict[str, bool] = {}
    for entry in _entries():
        match = _OWNER.match(entry)
        if match is None:
            continue
        prefix = f"{PREFIX}{match.group(1)}_{match.group(2)}_"
        if prefix not in verdicts:
            verdicts[prefix] = _program_alive(prefix, int(match.group(1)))
        if not verdicts[prefix]:
            _remove_entry(entry)
            removed += 1
    return removed


def array_view(
    buffer, dtype, shape: tuple[int, ...], offset: int = 0
) -> np.ndarray:
    """A writable, C-contiguous numpy view of ``buffer`` (no copy)."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
