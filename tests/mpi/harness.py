"""Launching the test scripts under ``mpiexec`` from pytest, each rank standing for a
machine.

The command line of a launch, the three transports (``"shm"``, ``"tcp"``, ``"netns"``)
and the network namespaces are ``tests/support/mpiexec.py``'s, which the MPI
benchmark shares; this module runs a script of ``scripts/`` through them and cleans
up after it. Every launch runs in its own process group with a timeout; on expiry the
group is SIGKILLed and the test fails with the output so far. After every launch,
stragglers of the group are reported and killed, and the files the MPI library leaves
in /dev/shm after a killed job (MPICH's ``mpich_shm_*``, Open MPI's ``sm_segment.*``)
are removed: only entries that appeared during the launch and match those names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..support.mpiexec import (  # noqa: F401 (the tests take them from here too)
    BIN,
    MPI_SHM_PREFIXES,
    NETNS_HOSTS,
    Netns,
    command,
    mpi_library,
    unavailable_reason,
)

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    """What one launch did."""

    returncode: int
    stdout: str
    stderr: str
    elapsed: float  # seconds from start to mpiexec's exit
    out: Path  # the folder the scripts wrote into
    stragglers: list[int]  # processes of the launch still alive after mpiexec exited

    def json(self, name: str = "result.json") -> dict:
        path = self.out / name
        if not path.exists():  # the launch's output says why: put it in the failure
            raise AssertionError(f"{name} was not written\n{self.describe()}")
        return json.loads(path.read_text())

    def describe(self) -> str:
        return (f"exit code {self.returncode} after {self.elapsed:.1f} s\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}")


def _mpi_shm_entries() -> set[str]:
    return {e for e in os.listdir("/dev/shm") if e.startswith(MPI_SHM_PREFIXES)}


def _group_members(pgid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def run(library: str, script: str, *args: str, n: int = 2, transport: str = "shm",
        timeout: float = 60, ft: bool = False, netns: Netns | None = None,
        out: Path, env: dict[str, str] | None = None) -> Result:
    """Run ``tests/mpi/scripts/<script>`` under mpiexec; fail the test on timeout.

    The script gets ``--out <folder>`` first, then ``args``.
    """
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(SCRIPTS / script), "--out", str(out), *args]
    line, extra = command(library, n, argv, transport, ft=ft, netns=netns)
    full_env = dict(os.environ)
    full_env.update(extra)
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), full_env.get("PYTHONPATH")) if p)
    full_env["TMPDIR"] = str(out)  # Open MPI's session files die with the test's folder
    full_env.update(env or {})
    before = _mpi_shm_entries()
    start = time.monotonic()
    process = subprocess.Popen(line, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=full_env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        _clean_shm(before)
        raise AssertionError(f"mpiexec did not finish within {timeout} s (killed)\n"
                             f"--- stdout ---\n{stdout[-4000:]}\n"
                             f"--- stderr ---\n{stderr[-4000:]}") from None
    elapsed = time.monotonic() - start
    stragglers: list[int] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stragglers = _group_members(process.pid)
        if not stragglers:
            break
        time.sleep(0.05)
    if stragglers:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _clean_shm(before)
    return Result(process.returncode, stdout, stderr, elapsed, out, stragglers)


def _clean_shm(before: set[str]) -> None:
    for entry in _mpi_shm_entries() - before:
        try:
            os.unlink(os.path.join("/dev/shm", entry))
        except FileNotFoundError:
            pass


def alone(script: str, *args: str, out: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``tests/mpi/scripts/<script>`` without MPI (one machine), as the reference of
    a run over machines; the script gets ``--out <folder>`` first, then ``args``."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{script} alone failed ({done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def leftovers(pids: list[int]) -> list[str]:
    """Entries in /dev/shm of the synkhronos programs of ``pids`` (each machine's names
    carry its first process's pid)."""
    marks = tuple(f"synk_{pid}_" for pid in pids) + tuple(f"sem.synk_{pid}_" for pid in pids)
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(marks))


def alive(pids: list[int], wait: float = 5.0) -> list[int]:
    """Those of ``pids`` still running after up to ``wait`` seconds (a job's workers
    leave the launcher's process group, so the launch's straggler check misses them);
    any found are killed."""
    deadline = time.monotonic() + wait
    running = list(pids)
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if _running(pid)]
        if running:
            time.sleep(0.05)
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return running


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
