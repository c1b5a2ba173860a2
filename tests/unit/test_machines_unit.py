"""Unit tests of the pieces of a session over several machines that need no MPI run.

- the arena's journal (master) and its replay on another machine's arena: replicas
  under the other prefix, found by the master's names;
- what a failure between machines means to the master (``Machines.error``);
- the runs of a fused layout that travel between machines as one array;
- the rows each machine takes of a staged input;
- ``fork``'s new arguments, refused before anything is forked.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import synkhronos as synk
from synkhronos._machines import mpi
from synkhronos._machines.backend import _runs, _spans, _whole
from synkhronos._machines.link import Machines
from synkhronos._runtime import epoch, shmem
from synkhronos._runtime.arena import Arena
from synkhronos._scatter import split_bounds
from synkhronos._staging import replica_rows
from synkhronos.collectives.backend import FusedLayout
from synkhronos.errors import WorkerDiedError, WorkerTimeoutError


@pytest.fixture
def prefixes():
    made = [shmem.new_session_prefix(), shmem.new_session_prefix()]
    yield made
    for prefix in made:
        shmem.sweep_prefix(prefix)


def test_journal_replayed_on_another_machine(prefixes):
    master_prefix, other_prefix = prefixes
    master = Arena(master_prefix, 0, True, None)
    master.start_journal()
    first = master.create(4096)
    np.frombuffer(first.buffer, np.uint8)[:6] = np.arange(1, 7)
    second = master.create(8192)
    master.copy(first, second, 6)
    one_off = master.create(100, replicated=False)  # a control block's oversized message
    master.hand_over(one_off)
    master.discard(one_off.name)
    third = master.create(4096)
    master.discard(third.name, replicated=True)  # mapped everywhere: the name goes
    master.release(first.id)
    entries = master.take_journal()
    assert [e[0] for e in entries] == ["create", "create", "copy", "create", "unlink",
                                       "release"]
    assert master.take_journal() == ()

    other = Arena(other_prefix, 0, True, None)
    other.set_alias(master_prefix)
    other.replay(entries[:1])
    # the values reach a replica on their own (a Data write); the copy carries them over
    np.frombuffer(other.map(first.name), np.uint8)[:6] = np.arange(1, 7)
    other.replay(entries[1:])
    assert other.local_name(second.name) == other_prefix + second.name[len(master_prefix):]
    assert other.owns(second.name) and other.owns(other.name_of(second.id))
    replica = other.map(second.name)  # found by the master's name
    assert bytes(replica[:6]) == bytes(range(1, 7))
    assert len(replica) == 8192
    on_disk = set(shmem._entries())
    assert other.name_of(first.id) not in on_disk  # released
    assert other.name_of(third.id) not in on_disk  # unlinked (its mapping stays)
    assert other.name_of(second.id) in on_disk
    assert other.map(third.name) is not None
    before = epoch.current
    other.release(second.id)  # both names of the replica let go
    assert second.name not in other and other.name_of(second.id) not in other
    assert epoch.current > before  # a mapping dropped moves the epoch on
    master.release(second.id)


def _machines(**changes):
    leaders = types.SimpleNamespace(rank=0, size=2, hosts=("a", "b"), pids=(10, 20),
                                    local_sizes=(2, 3), offsets=(0, 2), total=5,
                                    timeout=1.5)
    vars(leaders).update(changes)
    return Machines(leaders)


def test_reports_from_another_machine_name_its_host():
    machines = _machines()
    died = machines.error(mpi.RemoteFailureError(
        1, "b", '{"kind": "died", "rank": 3, "pid": 33, "reason": "killed by SIGKILL"}'))
    assert isinstance(died, WorkerDiedError)
    assert (died.rank, died.pid, died.host) == (3, 33, "b")
    assert "on host b died: killed by SIGKILL" in str(died)
    late = machines.error(mpi.RemoteFailureError(
        1, "b", '{"kind": "timeout", "rank": 4, "pid": 44, "timeout": 2.0}'))
    assert isinstance(late, WorkerTimeoutError) and (late.rank, late.host) == (4, "b")
    leader = machines.error(mpi.RemoteFailureError(1, "b", "not json"))
    assert isinstance(leader, WorkerDiedError) and (leader.rank, leader.pid) == (2, 20)
    assert "not json" in str(leader)


def test_lost_machines_and_timeouts_name_their_hosts():
    machines = _machines()
    lost = machines.error(mpi.PeerLostError("lost machine 1 (b)", [1], ["b"]))
    assert isinstance(lost, WorkerDiedError)
    assert (lost.rank, lost.pid, lost.host) == (2, 20, "b")
    assert "machine 1 was lost" in str(lost)
    late = machines.error(mpi.LeaderTimeoutError("did not finish", ("a", "b")))
    assert isinstance(late, WorkerTimeoutError) and late.host == "b"
    other = RuntimeError("something else")
    assert machines.error(other) is other


def test_one_dtype_travels_as_one_run_with_its_padding():
    layout = FusedLayout(["f4", "f4"], [(3,), (100,)])
    runs = _runs(layout, _whole(layout))
    assert runs == [(np.dtype("f4"), 0, layout.offsets[1] // 4 + 100)]
    buffer = bytearray(4096)
    (span,) = _spans(buffer, layout, 0, _whole(layout))
    views = layout.views(buffer)
    views[0][:] = 1
    views[1][:] = 2
    assert span[:3].tolist() == [1, 1, 1] and span[-100:].tolist() == [2] * 100
    assert not span[3:layout.offsets[1] // 4].any()  # the padding stays zero
    piece = layout.pieces(2)[1]  # a run of pieces starts inside the first variable
    (run,) = _runs(layout, piece)
    assert run[1] >= 0 and run[2] == (layout.offsets[1] // 4 + 100) - run[1] // 4


def test_mixed_dtypes_travel_variable_by_variable():
    layout = FusedLayout(["f4", "f8"], [(5,), (7,)])
    runs = _runs(layout, _whole(layout))
    assert runs == [(np.dtype("f4"), 0, 5), (np.dtype("f8"), layout.offsets[1], 7)]


def test_each_machine_takes_the_rows_of_its_ranks():
    assert replica_rows(None, 5) is None  # one copy of the memory: nothing to split
    split = replica_rows(((0, 2), (2, 3)), 5)
    assert split is not None
    per_rank = split_bounds(23, 5)
    assert split(10, 33) == [(10 + per_rank[0][0], 10 + per_rank[1][1]),
                             (10 + per_rank[2][0], 10 + per_rank[4][1])]
    assert split(0, 3) == [(0, 2), (2, 3)]


def test_fork_refuses_bad_launch_arguments_before_forking(monkeypatch):
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="reduction must be one of 'fast', 'exact'"):
        synk.fork(1, reduction="sloppy")
    monkeypatch.setenv("SYNK_REDUCTION", "approximate")
    with pytest.raises(ValueError, match="SYNK_REDUCTION must be one of"):
        synk.fork(1)
    monkeypatch.delenv("SYNK_REDUCTION")
    with pytest.raises(RuntimeError, match="not started by an MPI launcher"):
        synk.fork(1, launcher="mpi")
    with pytest.raises(ValueError, match="launcher must be one of"):
        synk.fork(1, launcher="ssh")
