"""Isolation and security: programs side by side, private segments, no sockets, no writes.

- Programs running at once on one machine (``scripts/isolation_program.py`` as
  subprocess masters) never remove each other's segments: not when one crashes, not
  when one closes, not when a third program sweeps up after dead programs. Two more
  sweepers that cannot see a live program as alive run against a private
  ``/dev/shm`` in their own mount namespace (``scripts/foreign_sweep.py``): one in
  another PID namespace (a container sharing ``/dev/shm``), one as another user.
- Every segment and semaphore of a session is mode 0600, owned by the current user,
  named with a random 64-bit token, and created exclusively: a squatter on a name
  gets neither attached to nor removed (for the names ``fork()`` makes, whose random
  token a test can only predict by patching the generator, see
  ``tests/unit/test_squatted_names.py``).
- No process of a session listens on a socket, or opens one.
- A small program works with the package copied to a read-only directory, and writes
  nothing into its working directory, HOME, TMPDIR or the package
  (``scripts/private_program.py``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos.testing import (
    child_pids,
    leftover_segments,
    program_prefix,
    run_on_ranks,
    session_open,
)

from ..processes import SHM, leader_alive, poll, shm_entries, squat, squatter_intact, sweep

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
PACKAGE = Path(synk.__file__).parent
BALLAST = 2 << 20  # a message larger than the control block's 1 MiB mailbox
GONE_S = 10.0  # workers of a killed master must be gone within this
PREFIX_FORM = re.compile(r"^synk_(\d+)_([0-9a-f]{16,})_$")  # 64 random bits at least
ROOT = os.getuid() == 0


# ---------------------------------------------------------------- helpers


class Program:
    """``scripts/isolation_program.py`` as a subprocess master, driven through stdin."""

    def __init__(self, stderr: Path):
        self._stderr = open(stderr, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "isolation_program.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, start_new_session=True,
        )
        self.pid = self.proc.pid
        self.workers: list[int] = []
        self.prefix: str | None = None
        self.segment = ""

    def read_info(self) -> None:
        line = self.proc.stdout.readline()
        assert line, f"program {self.pid} failed to start"
        info = json.loads(line)
        assert info["master"] == self.pid
        self.workers, self.prefix, self.segment = info["workers"], info["prefix"], info["segment"]

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"program {self.pid} gave no answer to {command!r}"
        return json.loads(line)

    def cleanup(self) -> None:
        for pid in [self.pid, *self.workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            stream.close()
        if self.prefix is not None:
            sweep(self.prefix)


@pytest.fixture
def program(tmp_path):
    """Start isolation programs; kill and sweep whatever is left of them afterwards."""
    started: list[Program] = []

    def start() -> Program:
        p = Program(tmp_path / f"program{len(started)}.err")
        started.append(p)
        return p

    yield start
    for p in started:
        p.cleanup()


def _assert_untouched(programs: list[Program], before: dict[str, list[str]]) -> None:
    for p in programs:
        assert shm_entries(p.prefix) == before[p.prefix], f"program {p.pid} lost segments"
        assert p.ask("check") == {"ok": True}


def _in_private_shm(mode: str) -> dict:
    """Run ``scripts/foreign_sweep.py MODE`` in a mount namespace with its own /dev/shm."""
    driver = f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPTS / 'foreign_sweep.py'))}"
    inner = f"mount -t tmpfs -o mode=1777 synk-test /dev/shm && exec {driver} {mode}"
    namespaces = ["unshare", "--mount"] if ROOT else ["unshare", "--user", "--map-root-user",
                                                      "--mount"]
    proc = subprocess.run(namespaces + ["sh", "-c", inner], capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


# ---------------------------------------------------------------- programs side by side


def test_programs_running_together_leave_each_other_alone(program):
    programs = [program() for _ in range(3)]  # started together
    for p in programs:
        p.read_info()
    tokens = [PREFIX_FORM.match(p.prefix) for p in programs]
    assert all(tokens) and len({m.group(2) for m in tokens}) == 3
    assert [int(m.group(1)) for m in tokens] == [p.pid for p in programs]
    before = {p.prefix: shm_entries(p.prefix) for p in programs}
    for p in programs:
        assert p.segment in before[p.prefix]
    _assert_untouched(programs, before)

    # a fourth program sweeps up after dead programs (and forks, which sweeps again)
    sweeper = subprocess.run(
        [sys.executable, str(SCRIPTS / "isolation_program.py"), "--sweep-only"],
        capture_output=True, text=True, timeout=30,
    )
    assert sweeper.returncode == 0, sweeper.stderr
    _assert_untouched(programs, before)

    # the first crashes: its workers take its segments, and only its segments
    crashed, rest = programs[0], programs[1:]
    os.kill(crashed.pid, signal.SIGKILL)
    assert crashed.proc.wait(GONE_S) == -signal.SIGKILL
    assert poll(lambda: not any(leader_alive(pid) for pid in crashed.workers), GONE_S)
    assert poll(lambda: shm_entries(crashed.prefix) == [], 1.0), shm_entries(crashed.prefix)
    _assert_untouched(rest, before)

    # the second closes
    closing, last = rest
    assert closing.ask("close") == {"closed": True}
    assert closing.proc.wait(GONE_S) == 0
    assert shm_entries(closing.prefix) == []
    _assert_untouched([last], before)
    assert last.ask("close") == {"closed": True}
    assert last.proc.wait(GONE_S) == 0
    assert shm_entries(last.prefix) == []


def test_a_sweeper_in_another_pid_namespace_leaves_a_live_program_alone():
    """A program in another container that shares /dev/shm sees no process by our pid.

    Its ``sweep_dead_programs()`` (run by every ``fork()``) must still leave a live
    program's segments alone.
    """
    seen = _in_private_shm("pid-namespace")
    assert seen["sweeper_rc"] == 0, seen["sweeper_stderr"]
    assert seen["before"], "the live program had no segment to lose"
    assert seen["after"] == seen["before"], "the sweeper removed a live program's segments"
    assert seen["check"] == {"ok": True}
    assert seen["live_rc"] == 0


def test_fork_survives_another_users_leftovers():
    """Another user's dead program left a segment: ``fork()`` must work regardless.

    The sweeping program runs as ``nobody``; the leftover belongs to root, so nobody
    may not remove it (``/dev/shm`` is sticky) and must leave it.
    """
    if not ROOT:
        pytest.skip("staging another user's leftover needs root (setpriv to nobody)")
    seen = _in_private_shm("other-user")
    assert seen["sweeper_rc"] == 0, seen["sweeper_stderr"]
    assert seen["stale_left"]


# ---------------------------------------------------------------- private segments


def _shm_files(prefix: str, ballast: bytes) -> dict:
    """In one process, during a command: stat every shared-memory file it can see.

    Named entries of the session in /dev/shm, and every /dev/shm file the process maps
    (through /proc/self/map_files, which also reaches files already unlinked: the
    control block, the semaphores, collective buffers).
    """
    named = {}
    for entry in os.listdir(SHM):
        if entry.startswith((prefix, "sem." + prefix)):
            st = os.stat(os.path.join(SHM, entry))
            named[entry] = (st.st_mode, st.st_uid)
    mapped = {}
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith(SHM + "/"):
                st = os.stat(f"/proc/self/map_files/{fields[0]}")
                mapped[fields[5].strip()] = (st.st_mode, st.st_uid)
    return {"named": named, "mapped": mapped}


def test_every_segment_and_semaphore_is_private():
    synk.fork(3)
    try:
        prefix = program_prefix()
        assert PREFIX_FORM.match(prefix)
        x = pt.dmatrix("x")
        w = pytensor.shared(np.zeros(10_000), name="w")
        f = synk.function([x], [(x, "gather"), (x.sum() + w.sum(), "sum")],
                          mode="FAST_COMPILE")
        synk.distribute()
        rows = np.arange(12.0).reshape(6, 2)
        xd = synk.data(rows)
        assert f(xd, batch=[5, 1, 3])[0].tolist() == rows[[5, 1, 3]].tolist()
        f(rows, batch=[0, 2])  # numpy inputs and indices: staging segments
        synk.all_reduce(w)  # collective buffers
        ballast = b"b" * BALLAST  # a payload segment during the command
        seen = run_on_ranks(_shm_files, prefix, ballast)
        names = set()
        for rank, files in enumerate(seen):
            for name, (mode, uid) in {**files["named"], **files["mapped"]}.items():
                assert stat.S_ISREG(mode), name
                assert stat.S_IMODE(mode) == 0o600, f"rank {rank}: {name} has mode {mode:o}"
                assert uid == os.getuid(), f"rank {rank}: {name} is owned by uid {uid}"
                names.add(name)
            # glibc names a semaphore's file at random until it links it; earlier
            # sessions of this test process may still be mapped, hence ">="
            semaphores = [n for n in files["mapped"] if os.path.basename(n).startswith("sem.")]
            assert len(semaphores) >= 3, files["mapped"]
            # the control block: mapped by every process, its name unlinked at once
            unlinked = [n for n in files["mapped"]
                        if n.startswith(f"{SHM}/{prefix}") and n.endswith(" (deleted)")]
            assert unlinked, files["mapped"]
        named = {n for files in seen for n in files["named"]}
        assert xd.ref().segment in named  # the Data's segment
        # the one-off payload segment of that command: named during it, gone after it
        assert named - set(leftover_segments()), named
        assert len([n for n in names if n.startswith(f"{SHM}/{prefix}")]) >= 2, names
    finally:
        synk.close()


def test_two_sessions_get_different_random_prefixes():
    prefixes = []
    for _ in range(2):
        synk.fork(2)
        prefixes.append(program_prefix())
        synk.close()
    matches = [PREFIX_FORM.match(p) for p in prefixes]
    assert all(matches)
    assert matches[0].group(2) != matches[1].group(2)
    assert {int(m.group(1)) for m in matches} == {os.getpid()}


def test_data_never_takes_over_a_squatted_name():
    """A Data's segment name is predictable once the prefix shows in /dev/shm: the
    arena numbers its segments ``<prefix>s<id in hex>``, one after the other."""
    synk.fork(2)
    try:
        prefix = program_prefix()
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        probe = synk.data(np.ones(3))  # its name shows how the next ones are made
        match = re.fullmatch(re.escape(prefix) + r"s([0-9a-f]+)", probe.ref().segment)
        assert match, probe.ref().segment
        squatted = f"{prefix}s{int(match.group(1), 16) + 1:x}"
        squat(squatted)
        try:
            xd = synk.data(np.arange(4.0))
        except Exception as exc:  # a clean failure, and the session goes on
            assert "exist" in str(exc).lower(), exc
            xd = synk.data(np.arange(4.0))
        assert xd.ref().segment != squatted
        assert squatter_intact(squatted)
        assert f(xd) == 6.0
        assert f(probe) == 3.0
    finally:
        synk.close()


# ---------------------------------------------------------------- no sockets


def _socket_inodes(pid: int | str = "self") -> set[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def _listening_inodes() -> set[int]:
    """Inodes of every listening TCP socket, bound UDP socket and listening Unix socket."""
    listening = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if table.startswith("udp") or fields[3] == "0A":  # 0A: TCP_LISTEN
                listening.add(int(fields[9]))
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[3], 16) & 0x10000:  # __SO_ACCEPTCON: listening
                listening.add(int(fields[6]))
    return listening


def _sockets_now() -> tuple[int, list[int], list[int]]:
    """In one process, during a command: (pid, its sockets, those listening)."""
    mine = _socket_inodes()
    return os.getpid(), sorted(mine), sorted(mine & _listening_inodes())


def test_no_process_listens_on_or_opens_a_socket():
    before = _socket_inodes()  # whatever the test process itself holds
    synk.fork(3)
    try:
        x = pt.dmatrix("x")
        w = pytensor.shared(np.zeros(4), name="w")
        f = synk.function([x], (x.sum() + w.sum(), "sum"), mode="FAST_COMPILE")
        synk.distribute()
        assert f(np.ones((5, 2))) == 10.0
        synk.all_reduce(w)
        during = run_on_ranks(_sockets_now)
        pids = run_on_ranks(os.getpid)
        assert pids[0] == os.getpid()
        assert [pid for pid, _, _ in during] == pids
        for pid, sockets, listening in during:
            assert listening == [], f"pid {pid} listens on sockets {listening}"
            assert set(sockets) <= before, f"pid {pid} opened sockets {set(sockets) - before}"
        listening = _listening_inodes()  # between commands, seen from outside
        for pid in pids:
            sockets = _socket_inodes(pid)
            assert not sockets & listening
            assert sockets <= before
    finally:
        synk.close()


# ---------------------------------------------------------------- read-only install, temp files


def _tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size and modification time."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    """``scripts/private_program.py`` run once with a read-only copy of the package.

    The copy is ``chmod -R a-w``; as root, which ignores write permission, it is also
    bind-mounted read-only in a mount namespace of its own. HOME, TMPDIR and the working
    directory are fresh empty directories; PyTensor's compile directory is under TMPDIR.
    """
    base = tmp_path_factory.mktemp("private")
    install, home, tmp, cwd = (base / name for name in ("install", "home", "tmp", "cwd"))
    for d in (home, tmp, cwd):
        d.mkdir()
    shutil.copytree(PACKAGE, install / "synkhronos",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in [install, *install.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    tree = _tree(install)
    compiledir = tmp / "pytensor"
    env = dict(
        os.environ, PYTHONPATH=str(install), PYTHONDONTWRITEBYTECODE="1", HOME=str(home),
        TMPDIR=str(tmp), PYTENSOR_FLAGS=f"base_compiledir={compiledir}",
    )
    command = [sys.executable, str(SCRIPTS / "private_program.py")]
    if ROOT:
        where = shlex.quote(str(install))
        command = ["unshare", "--mount", "sh", "-c",
                   f"mount --bind {where} {where} && mount -o remount,bind,ro {where} {where} "
                   f"&& exec {shlex.join(command)}"]
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=50)
    yield {"proc": proc, "install": install, "tree": tree, "home": home, "tmp": tmp,
           "cwd": cwd, "compiledir": compiledir}
    for path in [install, *install.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


def test_works_with_the_package_installed_read_only(private_run):
    proc = private_run["proc"]
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["ok"] is True
    assert Path(result["module"]).parent == private_run["install"] / "synkhronos"
    assert _tree(private_run["install"]) == private_run["tree"]
    assert shm_entries(result["prefix"]) == []


def test_writes_nothing_outside_pytensors_compile_directory(private_run):
    proc = private_run["proc"]
    assert proc.returncode == 0, proc.stderr
    assert list(private_run["cwd"].iterdir()) == []
    assert list(private_run["home"].iterdir()) == []
    left = [p for p in private_run["tmp"].iterdir() if p != private_run["compiledir"]]
    assert left == [], f"left in TMPDIR: {left}"
    assert proc.stdout.count("\n") == 1  # the library wrote nothing on stdout


@pytest.mark.parametrize("entry", ["control", "sem.wake1"])
def test_fork_never_takes_over_a_squatted_name(entry, monkeypatch):
    """Someone created a name fork() is about to use: fork fails cleanly or picks another.

    A session's names carry a random token (``synk_<pid>_<token>_``), so no other program
    can predict them; this test can, by fixing the token for one fork.
    """
    import secrets

    tokens = iter(["5ad5ad5ad5ad5ad5"])
    real = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(tokens, None) or real(n))
    squatted_prefix = f"synk_{os.getpid()}_5ad5ad5ad5ad5ad5_"
    squatted = (f"sem.{squatted_prefix}{entry[4:]}" if entry.startswith("sem.")
                else squatted_prefix + entry)
    squat(squatted)
    try:
        try:
            synk.fork(3)
        except Exception as exc:  # a clean failure: nothing of the session is left
            assert "exist" in str(exc).lower(), exc
            assert not session_open()
            assert child_pids() == []
        else:
            assert program_prefix() != squatted_prefix
            assert run_on_ranks(os.getpid)[0] == os.getpid()
            synk.close()
        assert squatter_intact(squatted)
        assert shm_entries(squatted_prefix) == [squatted]
    finally:
        sweep(squatted_prefix)
        synk.close()
