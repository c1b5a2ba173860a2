"""The session's watcher: a tiny process that removes the session's ``/dev/shm`` names
once every process of the session is gone, however they ended.

Why a process of its own. ``close()`` sweeps the session's prefix, and workers whose
master died sweep it too; but a SIGKILL to the whole process group (Jupyter restarting
a busy kernel, ``kill -9 -PGID``, a batch system's kill) ends every process at once and
leaves nobody to clean up: every ``synk.data`` would stay in ``/dev/shm``, which is RAM,
until the next ``fork()`` on the machine or a reboot. Unlinking each name as soon as
every process has mapped it cannot cover it: workers map a ``Data`` by name when they
first need it, a pickled ``Data`` handle maps it later still, other machines replicate
segments by name, and the program lock must keep its name for other programs' sweeps.

How it is built, and why:

- **Outside the group and not a child.** The master runs ``/bin/sh -c 'python ... &'``
  in a new session (``setsid``): the shell starts the watcher in the background and
  exits at once, so the watcher is in no process group of the program (a group kill
  does not reach it), and it is not the master's child (it never shows among the
  master's children, and no ``wait()`` of the program reaps it).
- **A fresh interpreter** (``python -I -S`` on this file, which imports only the
  standard library): a forked copy of the master would keep the master's memory pages
  alive as the master writes them; this one shares nothing, holds no descriptor of the
  program (``close_fds``; its standard streams are ``/dev/null``) and runs in ``/``.
- **The program lock tells it when.** Every process of the session holds one ``flock``
  on ``<prefix>lock`` through the same open file description (``shmem.ProgramLock``).
  The watcher opens the entry itself and blocks in ``flock(LOCK_EX)``: the kernel grants
  it once the last process holding the session's description has exited or closed it.
  No polling and no pids, so pid reuse and PID namespaces do not matter. It then
  unlinks every entry under the prefix that this user owns (segments, semaphores, the
  lock), and exits.
- **Normal close.** ``close()`` sweeps the prefix and closes the lock last: the watcher
  wakes within milliseconds, finds nothing, and exits. It never outlives its session
  for longer than that, except while a process forked from the master later (a
  ``multiprocessing`` child) still holds the lock: that process still maps the
  session's memory, and the watcher sweeps when it ends.
- **If the watcher is killed too** (``kill -9 -1``, a container stopped while its
  ``/dev/shm`` is shared), the next ``fork()`` on the machine sweeps what is left
  (``shmem.sweep_dead_programs``), as before.

Cost: one ``/bin/sh`` spawned and waited for at ``fork()`` (a few milliseconds); the
interpreter starts in the background.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys

__all__ = ["start", "sweep", "ENABLED"]

SHM_DIR = "/dev/shm"
ENABLED = True  # False: fork() starts no watcher (synkhronos.testing's switch)


def start(prefix: str) -> bool:
    """Start the watcher of the session ``prefix``, whose lock entry exists and is held.

    Returns whether one was started; ``False`` (logged by the caller) where there is no
    interpreter or shell to run it, which leaves the sweep at the next ``fork()``.
    """
    if not ENABLED:
        return False
    if not sys.executable or not os.path.exists("/bin/sh"):
        _not_started(prefix, "no Python executable or /bin/sh to run it")
        return False
    command = " ".join(shlex.quote(part) for part in (
        sys.executable, "-I", "-S", os.path.abspath(__file__), prefix)) + " &"
    try:
        subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                       start_new_session=True, cwd="/", check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        _not_started(prefix, str(exc))
        return False
    return True


def _not_started(prefix: str, why: str) -> None:
    import logging

    logging.getLogger("synkhronos").warning(
        "synkhronos: no watcher for %s (%s): if every process of the session is killed "
        "at once, its /dev/shm segments stay until the next synk.fork() on this machine",
        prefix, why)


def sweep(prefix: str) -> int:
    """Unlink every entry of ``/dev/shm`` under ``prefix`` that this user owns."""
    removed = 0
    uid = os.getuid()
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for entry in entries:
        if not entry.startswith((prefix, "sem." + prefix)):
            continue
        path = os.path.join(SHM_DIR, entry)
        try:
            if os.stat(path).st_uid == uid:
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


def watch(prefix: str) -> None:
    """The watcher's life: wait for the session's lock, then sweep its prefix."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        fd = os.open(os.path.join(SHM_DIR, prefix + "lock"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # closed already (or never opened): nothing to wait for
        sweep(prefix)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # granted once no process of the session holds it
        sweep(prefix)
    finally:
        os.close(fd)


def _is_prefix(text: str) -> bool:
    """``synk_<pid>_<hex token>_``, as ``shmem.new_session_prefix`` makes them."""
    parts = text.split("_")
    return (len(parts) == 4 and parts[0] == "synk" and parts[1].isdigit() and parts[3] == ""
            and len(parts[2]) > 0 and all(c in "0123456789abcdef" for c in parts[2]))


if __name__ == "__main__":
    if len(sys.argv) == 2 and _is_prefix(sys.argv[1]):
        watch(sys.argv[1])
