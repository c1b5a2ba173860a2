"""Every primitive of the leaders' layer, under mpiexec: 2 machines x 2 local processes.

One launch per transport (shared memory, TCP over loopback, two network namespaces)
runs ``scripts/leaders_suite.py``; the tests compare what each leader and each child
wrote with references built here from the same per-process seeds.
"""

from __future__ import annotations

import json
import pickle
import socket
import sys

import numpy as np
import pytest

from tests.mpi.harness import NETNS_HOSTS

from .conftest import SCRIPTS, TRANSPORTS

sys.path.insert(0, str(SCRIPTS))
from leaders_suite import LOCAL, piece  # noqa: E402

sys.path.remove(str(SCRIPTS))

MACHINES = 2


@pytest.fixture(scope="module", params=TRANSPORTS)
def suite(request, tmp_path_factory):
    launch = request.getfixturevalue("launcher")
    out = tmp_path_factory.mktemp(f"suite_{request.param}")
    result = launch("leaders_suite.py", transport=request.param, out=out, timeout=120)
    assert result.returncode == 0, result.describe()
    assert result.stragglers == [], result.describe()
    leaders = [dict(np.load(out / f"leader{r}.npz")) for r in range(MACHINES)]
    processes = {g: np.load(out / f"proc{g}.npy") for g in range(1, MACHINES * LOCAL, LOCAL)}
    children = {g: json.loads((out / f"proc{g}.json").read_text()) for g in processes}
    return request.param, leaders, processes, children


def reference_fold(op=np.add, pieces=None):
    pieces = pieces if pieces is not None else [piece(g) for g in range(MACHINES * LOCAL)]
    acc = pieces[0].copy()
    for p in pieces[1:]:
        op(acc, p, out=acc)
    return acc


def test_table_of_machines(suite, library):
    transport, leaders, _, _ = suite
    for rank, saved in enumerate(leaders):
        kind, size, launch_rank = json.loads(str(saved["launch"]))
        assert (kind, size, launch_rank) == (library, MACHINES, rank)
        table = json.loads(str(saved["table"]))
        assert table["rank"] == rank and table["size"] == MACHINES
        assert table["local_sizes"] == [LOCAL] * MACHINES
        assert table["offsets"] == [0, LOCAL] and table["total"] == MACHINES * LOCAL
        assert table["pids"][rank] == table["pid"]
        expected = list(NETNS_HOSTS) if transport == "netns" else [socket.gethostname()] * 2
        assert table["hosts"] == expected
        assert table["host_of"] == [expected[0]] * LOCAL + [expected[1]] * LOCAL
        assert table["host"] == expected[rank]


def test_commands_reach_every_machine_and_replies_come_back(suite):
    transport, leaders, _, _ = suite
    for saved in leaders:
        assert pickle.loads(saved["short"].tobytes()) == {"opcode": "call", "function": 7,
                                                          "rows": [0, 10]}
        assert bool(saved["long_ok"])
    hosts = NETNS_HOSTS if transport == "netns" else (socket.gethostname(),) * 2
    assert json.loads(str(leaders[0]["replies"])) == [
        {"rank": r, "host": hosts[r]} for r in range(MACHINES)]


def expected_array(rank):
    dtype = [np.float32, np.int16, np.float64, np.uint8][rank % 4]
    return (np.arange(3 * rank + 1) * (rank + 1)).astype(dtype)


def test_variable_size_gathers_keep_dtype_and_shape(suite):
    _, leaders, _, _ = suite
    for r in range(MACHINES):
        got = leaders[0][f"gather{r}"]
        assert got.dtype == expected_array(r).dtype and got.shape == (1, 3 * r + 1)
        np.testing.assert_array_equal(got[0], expected_array(r))
        for saved in leaders:
            np.testing.assert_array_equal(saved[f"all_gather{r}"], expected_array(r))
            assert saved[f"all_gather{r}"].dtype == expected_array(r).dtype
        np.testing.assert_array_equal(leaders[r]["scatter"], np.full((r + 1, 2), r))
        np.testing.assert_array_equal(leaders[r]["broadcast"], np.arange(5.0))
    assert "gather0" not in leaders[1]


def test_exact_all_reduce_is_bit_identical_to_the_rank_order_fold(suite):
    _, leaders, processes, _ = suite
    flat = reference_fold()
    for saved in leaders:
        assert np.array_equal(saved["flat_exact"], flat)
    for g, copy in processes.items():
        assert np.array_equal(copy, flat), f"local process {g} got another result"
    machine_sums = [reference_fold(pieces=[piece(m * LOCAL + i) for i in range(LOCAL)])
                    for m in range(MACHINES)]
    by_machine = reference_fold(pieces=machine_sums)
    for saved in leaders:
        assert np.array_equal(saved["machine_exact"], by_machine)


def test_fast_all_reduce_is_within_rounding(suite):
    _, leaders, _, _ = suite
    flat = reference_fold()
    for saved in leaders:
        np.testing.assert_allclose(saved["machine_fast"], flat, rtol=1e-4, atol=1e-2)
        np.testing.assert_array_equal(saved["machine_fast"], leaders[0]["machine_fast"])


@pytest.mark.parametrize("op, ufunc", [("sum", np.add), ("prod", np.multiply),
                                       ("max", np.maximum), ("min", np.minimum)])
def test_every_op_in_both_modes(suite, op, ufunc):
    _, leaders, _, _ = suite
    small = [(piece(m * LOCAL, 37) / 1e3).astype(np.float64) for m in range(MACHINES)]
    expected = reference_fold(ufunc, small)
    for saved in leaders:
        assert np.array_equal(saved[f"{op}_exact"], expected)
        np.testing.assert_allclose(saved[f"{op}_fast"], expected, rtol=1e-12)


def test_integer_half_and_empty_pieces(suite):
    _, leaders, _, _ = suite
    for saved in leaders:
        np.testing.assert_array_equal(saved["int_sum"], np.arange(10) * (1 + 3))
        assert saved["int_sum"].dtype == np.int32
        np.testing.assert_array_equal(saved["half_sum"], np.full(9, 4.0, np.float16))
        first = [piece(g) for g in range(LOCAL)]
        np.testing.assert_array_equal(saved["empty_pieces"], np.maximum(*first))


def test_large_buffers_take_the_chunk_owner_path_in_both_modes(suite):
    _, leaders, _, _ = suite
    bigs = [piece(m * LOCAL, 300_001, np.float64) for m in range(MACHINES)]
    expected = reference_fold(pieces=bigs)
    for saved in leaders:
        assert np.array_equal(saved["big_exact"], expected)
        np.testing.assert_allclose(saved["big_fast"], expected, rtol=1e-12)


def test_local_processes_were_forked_before_mpi_started(suite):
    _, leaders, _, children = suite
    for g, child in children.items():
        machine = g // LOCAL
        assert not child["mpi_imported"], f"local process {g} saw mpi4py.MPI"
        assert child["ppid"] == json.loads(str(leaders[machine]["table"]))["pid"]
