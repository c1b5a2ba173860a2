"""Failures between machines end in a clear error or a quick end of the job, never a hang.

Each case launches ``scripts/leaders_failures.py`` (2 machines x 2 local processes) and reads
what every side recorded. Times (detection delays, job durations) are printed, not
asserted: the launch's timeout is what catches a hang. Run with ``-s`` to see them.
"""

from __future__ import annotations

import socket

import pytest

from tests.mpi.harness import NETNS_HOSTS

from .conftest import TRANSPORTS


def hosts_for(transport):
    return NETNS_HOSTS if transport == "netns" else (socket.gethostname(),) * 2


def launched(launcher, tmp_path, transport, case, ft=False):
    result = launcher("leaders_failures.py", "--case", case, transport=transport,
                      out=tmp_path / case, ft=ft, timeout=60)
    assert result.stragglers == [], result.describe()
    return result


def report(case, transport, **figures):
    shown = ", ".join(f"{k}={v:.3f}s" for k, v in figures.items())
    print(f"\n[{case} over {transport}] {shown}")  # noqa: T201 (figures for the report, -s)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_remote_worker_death_names_its_host(launcher, tmp_path, transport):
    result = launched(launcher, tmp_path, transport, "kill_worker")
    assert result.returncode != 0, "the job must end after the failure"
    master = result.json("master.json")
    victim = result.json("victim.json")
    assert master["error"] == "RemoteFailureError", result.describe()
    assert master["hosts"] == [hosts_for(transport)[1]]
    assert f"machine 1 ({hosts_for(transport)[1]})" in master["message"]
    assert "killed by SIGKILL" in master["message"]
    assert result.json("leader1.json")["error"] == "ChildDied"
    report("kill_worker", transport, detected=master["time"] - victim["time"],
           job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_lost_leader_with_ulfm_names_its_host(library, launcher, tmp_path, transport):
    if library != "openmpi":
        pytest.skip(f"ULFM (mpiexec --with-ft ulfm) is Open MPI's; this is {library}")
    result = launched(launcher, tmp_path, transport, "kill_leader", ft=True)
    master = result.json("master.json")
    victim = result.json("victim.json")
    assert master["error"] == "PeerLostError", result.describe()
    assert master["hosts"] == [hosts_for(transport)[1]]
    assert f"lost machine 1 ({hosts_for(transport)[1]})" in master["message"]
    report("kill_leader+ulfm", transport, detected=master["time"] - victim["time"],
           job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_lost_leader_without_ulfm_ends_the_job(library, launcher, tmp_path, transport):
    result = launched(launcher, tmp_path, transport, "kill_leader")
    assert result.returncode != 0, result.describe()
    victim = result.json("victim.json")
    recorded = (result.out / "master.json").exists()
    if library == "mpich":
        # MPICH SIGKILLs every process at once: the master's Python never runs again
        assert not recorded, result.describe()
    elif transport == "shm":
        # Open MPI's runtime SIGTERMs the survivors; the wait adds a note saying why
        assert recorded, result.describe()
    if recorded:
        # (over TCP Open MPI's transport may abort the job itself first, on the closed
        # socket: "MPI_ERRORS_ARE_FATAL"; then the master records nothing)
        master = result.json("master.json")
        assert master["error"] == "SystemExit" and master["message"] == "143"
        assert any("--with-ft ulfm" in note for note in master["notes"])
        report("kill_leader", transport, sigterm=master["time"] - victim["time"],
               job=result.elapsed)
    else:
        report("kill_leader", transport, job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_timeout_between_machines(launcher, tmp_path, transport):
    result = launched(launcher, tmp_path, transport, "timeout")
    master = result.json("master.json")
    assert master["error"] == "LeaderTimeoutError", result.describe()
    assert "did not finish within 1 s" in master["message"]
    assert result.returncode != 0
    report("timeout", transport, job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_master_abort_reaches_the_other_leaders(launcher, tmp_path, transport):
    result = launched(launcher, tmp_path, transport, "abort_notice")
    master = result.json("master.json")
    other = result.json("leader1.json")
    assert other["error"] == "JobAbortedError", result.describe()
    assert f"the master ({hosts_for(transport)[0]}) ends the job" in other["message"]
    assert "local process 1" in other["message"]
    assert result.returncode != 0
    report("abort_notice", transport, seen=other["time"] - master["time"], job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ctrl_c_in_the_master_stops_every_machine(launcher, tmp_path, transport):
    result = launched(launcher, tmp_path, transport, "interrupt")
    master = result.json("master.json")
    other = result.json("leader1.json")
    assert master["error"] == "KeyboardInterrupt", result.describe()
    assert other["error"] == "JobAbortedError", result.describe()
    assert "KeyboardInterrupt" in other["message"]
    assert result.returncode != 0
    report("interrupt", transport, seen=other["time"] - master["time"], job=result.elapsed)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_lost_master_ends_the_other_machines(library, launcher, tmp_path, transport):
    ft = library == "openmpi"  # with ULFM the other leader hears of it and cleans up
    result = launched(launcher, tmp_path, transport, "kill_master", ft=ft)
    victim = result.json("victim.json")
    if ft:
        other = result.json("leader1.json")
        assert other["error"] == "PeerLostError", result.describe()
        assert f"lost machine 0 ({hosts_for(transport)[0]})" in other["message"]
        report("kill_master+ulfm", transport, detected=other["time"] - victim["time"],
               job=result.elapsed)
    else:
        assert result.returncode != 0, result.describe()
        report("kill_master", transport, job=result.elapsed)
