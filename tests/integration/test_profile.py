"""synk.profile(): per-call phases are recorded while active, nothing otherwise."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos import profile, steps
from synkhronos.testing import fault_at

from ..conftest import REPLAY

PHASES = ("compute", "gather", "update", "exchange", "wait", "other")  # SPEC 11


@pytest.mark.parametrize("n", [1, 3])
def test_profile_records_every_phase(n):
    synk.fork(n)
    try:
        x = pt.dmatrix("x")
        f = synk.function([x], [(x.sum(axis=0), "sum"), (x.sum(axis=1), "gather")], name="sums")
        synk.distribute()
        data = synk.data(np.arange(60.0).reshape(20, 3))
        f(data)
        with profile() as prof:
            for _ in range(3):
                got = f(data, batch=np.arange(19, -1, -2))
            np.testing.assert_array_equal(got[1], data.data[19::-2].sum(axis=1))
            with pytest.raises(RuntimeError, match="cannot be nested"):
                with profile():
                    pass
        f(data)  # outside the block: not recorded
        summary = prof.summary()
        assert summary["calls"] == 3 and len(prof.records) == 3
        record = prof.records[0]
        assert record.kind == "call" and record.name == "sums"
        assert len(record.function) == len(record.gather) == n
        assert all(t > 0 for t in record.function)
        for phase in ("stage", "gather", "function", "reduce", "total"):
            assert summary[phase] > 0, phase
        assert summary["total"] >= summary["stage"] + summary["reduce"]
        assert summary["function_max"] >= summary["function"]
        f(data)  # profiling off again: plain replies
        assert len(prof.records) == 3
    finally:
        synk.close()


@pytest.mark.parametrize("n", [1, 3])
def test_profiled_repeated_calls_take_the_path_they_take_unprofiled(n, monkeypatch):
    """A call that repeats an earlier one skips validation and staging (its inputs are
    refilled where the earlier call's went); under synk.profile() it must too, or the
    profile would time a path the program does not take."""
    synk.fork(n)
    try:
        x, w = pt.dmatrix("x"), pt.dvector("w")
        f = synk.function([x], ((x * w).sum(axis=0), "sum"), bcast_inputs=[w])
        synk.distribute()
        rng = np.random.default_rng(3)
        values = [(rng.normal(size=(7, 2)), rng.normal(size=2)) for _ in range(4)]
        prepared = []
        original = f.prepare
        monkeypatch.setattr(f, "prepare", lambda *a, **k: prepared.append(1) or original(*a, **k))
        for xs, ws in values[:2]:  # unprofiled: the first prepares, the second repeats
            np.testing.assert_allclose(f(xs, ws), (xs * ws).sum(axis=0))
        if not REPLAY:  # SYNK_REPLAY=0: every call prepares, profiled or not
            assert len(prepared) == 2
            return
        assert len(prepared) == 1
        with profile() as prof:
            for xs, ws in values:  # the first profiled call prepares (its replies are
                np.testing.assert_allclose(f(xs, ws), (xs * ws).sum(axis=0))  # timed)
        assert len(prepared) == 2
        assert [r.kind for r in prof.records] == ["call"] * 4
        assert all(len(r.function) == n and r.stage > 0 for r in prof.records)
        xs, ws = values[0]
        for _ in range(2):  # unprofiled again: ending the block moved the epoch on, so
            np.testing.assert_allclose(f(xs, ws), (xs * ws).sum(axis=0))  # the first
        assert len(prepared) == 3 and len(prof.records) == 4  # prepares, the next replays
    finally:
        synk.close()


@pytest.mark.parametrize("n", [1, 3])
def test_a_step_is_one_record_and_each_of_its_calls_another(n):
    """A step of two calls in one command: a "step" record holding the command, then a
    "call" record per call, named, with every rank's phases; a step that fails under
    the profile raises its own error."""
    synk.fork(n)
    try:
        x = pt.dvector("x")
        f = synk.function([x], (x.sum(), "sum"), name="total")
        synk.distribute()
        two = [steps.call(f, np.ones(4)), steps.call(f, np.ones(6))]
        with profile() as prof:
            assert steps.run(two) == [4.0, 6.0]
            if n > 1:
                with fault_at("function", "raise", ranks=[n - 1]), pytest.raises(
                        synk.WorkerError, match="raised on purpose"):
                    steps.run(two)
        assert [r.kind for r in prof.records[:3]] == ["step", "call", "call"]
        assert prof.records[0].total > 0
        for record in prof.records[1:3]:
            assert record.name == "total" and len(record.function) == n
            assert all(t > 0 for t in record.function)
        assert steps.run(two) == [4.0, 6.0]
    finally:
        synk.close()


@pytest.mark.parametrize("n", [1, 3])
def test_a_training_step_has_every_ranks_phases(n):
    """A profiled training step: per rank, its compute and update are its calls' function
    times, an exchange where there is one, every phase non-negative, the master's
    phases within the command; the steps' losses those of the serial program."""
    import pytensor

    from synkhronos.extensions import make_train_function, make_train_function_pytensor

    rng = np.random.default_rng(3)
    values = rng.normal(size=(5, 2))
    xs, ys = rng.normal(size=(11, 5)), rng.normal(size=(11, 2))
    synk.fork(n)
    try:
        x, y = pt.dmatrix("x"), pt.dmatrix("y")
        w = pytensor.shared(values.copy(), name="w")
        train = make_train_function(((x @ w - y) ** 2).mean(), [w], [x, y], "sgd",
                                    learning_rate=0.1)
        synk.distribute()
        with profile() as prof:
            losses = [float(train(xs, ys)) for _ in range(3)]
        per_rank = prof.per_rank()
        assert [entry["rank"] for entry in per_rank] == list(range(n))
        assert all(entry["steps"] == 3 for entry in per_rank)
        calls = [r for r in prof.records if r.kind == "call"]
        for entry in per_rank:
            rank = entry["rank"]
            assert all(entry[phase] >= -1e-4 for phase in PHASES), entry
            grad = sum(r.function[rank] for r in calls if r.name.startswith("train_grad"))
            apply = sum(r.function[rank] for r in calls if r.name.startswith("train_apply"))
            assert entry["compute"] == pytest.approx(grad, abs=1e-9)
            assert entry["update"] == pytest.approx(apply, abs=1e-9)
            assert (entry["exchange"] > 0) == (n > 1)
            assert entry["cpu"] > 0
        master = per_rank[0]
        spent = sum(master[phase] for phase in PHASES)
        assert spent <= sum(r.total for r in prof.records if r.kind == "step") + 1e-4
        assert len(prof.step_phases()) == 3
        summary = prof.summary()  # the same phases, averaged over the ranks
        for phase in PHASES:
            assert summary[f"step_{phase}"] == pytest.approx(
                sum(entry[phase] for entry in per_rank) / n, abs=1e-12), phase
        assert summary["step_compute"] > 0 and (summary["step_exchange"] > 0) == (n > 1)
        assert summary["step_compute_max"] >= summary["step_compute"] - 1e-12
    finally:
        synk.close()
    w_plain = pytensor.shared(values.copy(), name="w")
    xp, yp = pt.dmatrix("x"), pt.dmatrix("y")
    plain = make_train_function_pytensor(((xp @ w_plain - yp) ** 2).mean(), [w_plain],
                                         [xp, yp], "sgd", learning_rate=0.1)
    np.testing.assert_allclose(losses, [float(plain(xs, ys)) for _ in range(3)], rtol=1e-12)
