"""Shared test fixtures, and the tiers: which tests run where.

Every test leaves no child process, no segment, no open session. A test that forks a
session must close it (the fixtures below do): one left open would make the next
test's ``fork()`` fail. The autouse check closes such a session and fails the test
that left it, not the next one.

Unit tests (``tests/unit``) exercise one private module each and never fork; every
other test uses only public modules (``synkhronos``, ``synkhronos.testing``,
``synkhronos.extensions``, ...): ``tests/unit/test_layering.py`` checks it.

Tiers. Every test gets its markers here, from where it lives (``TIERS`` below, read
by ``pytest_collection_modifyitems``) and from the session size it forks at
(:func:`sizes_to_run`), so that a new test file has its tier without a decorator.
The markers are registered, each with what it means, in ``pyproject.toml``. ``python
-m pytest`` alone (no path, no ``-m``, no ``-k``) runs the default tier,
``DEFAULT_TIER``: every public feature once, at one session size, in a few minutes;
``python -m pytest tests`` runs every test this environment can run; CI
(``.ci/run``) selects each of its steps by marker (``docs/internals.rst`` has the
table).
"""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest

# PyMC imports pandas, which loads pyarrow, whose jemalloc starts a background thread:
# every later fork() of the run would then fork a multi-threaded process, and Python
# 3.12 warns at each (harmless: jemalloc has fork handlers). Off before any import.
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")

import synkhronos as synk
from synkhronos.testing import child_pids, leftover_segments, program_prefix, session_open

__all__ = ["child_pids", "segments_of", "session_fixture", "DEVICE", "sizes_to_run",
           "CORE_SIZE", "DEFAULT_TIER", "TIERS"]

segments_of = leftover_segments  # the name the tests use

# The device the sessions of this run fork on. CI runs the function, collective and
# training suites a second time with SYNKHRONOS_TEST_DEVICE=gpu on JAX's CPU platform
# (SYNKHRONOS_GPU_PLATFORM=cpu, PYTENSOR_FLAGS=mode=JAX so the tests' plain reference
# functions read device values too), one pytest process per session size
# (SYNKHRONOS_TEST_SIZES): a master that ran JAX cannot fork again.
DEVICE = os.environ.get("SYNKHRONOS_TEST_DEVICE", "cpu")
# Whether repeated work is replayed in this run: CI runs the function, collective,
# step, data and failure suites a second time with SYNK_REPLAY=0, where every command
# takes the general path; the tests of replay itself then check that nothing replays.
REPLAY = os.environ.get("SYNK_REPLAY", "").strip() != "0"
# Limits every session fixture of this process to these sizes (comma-separated): the
# device suites run one size per pytest process, since a master that ran JAX cannot
# fork again. To leave out sizes otherwise, deselect the marker "sizes".
_SIZES = os.environ.get("SYNKHRONOS_TEST_SIZES")

# The session size of the core tier: 3 has workers and splits rows unevenly on two
# cores. A test forked at any other size is marked "sizes".
CORE_SIZE = 3

# What "python -m pytest" runs with no path, -m or -k: every public feature once.
DEFAULT_TIER = "not (sizes or slow or demo or mpi)"

# Markers by where a test lives: (pattern, markers). A pattern is matched against the
# test's path under tests/, "::" and its name with its parameters, "*" standing for any
# text: "faults/*" names a folder, "integration/test_cli.py::*" a module,
# "integration/test_demos.py::test_resnet_*" some of its tests and
# "faults/test_group_kill.py::*[3-in_command]" one. Every matching row adds its
# markers; a marker written "-name" takes away one that an earlier row added.
# What each marker means, and the steps of CI that select it: pyproject.toml.
_STACK_MODULES = ["test_pymc*", "test_tutorials", "test_function", "test_rows",
                  "test_function_errors", "test_distribute_opfromgraph",
                  "test_distribute_ops", "test_checkpoint", "test_gpu", "test_chunks"]
_DEVICE_MODULES = ["test_function", "test_function_errors", "test_data", "test_collectives",
                   "test_steps", "test_train", "test_shares", "test_checkpoint"]
_REPLAY_MODULES = ["test_function", "test_collectives", "test_steps", "test_data",
                   "test_rows", "test_chunks"]
TIERS: list[tuple[str, set[str]]] = [
    # the area: by folder; programs run as users run them are "demo"
    ("unit/*", {"unit"}),
    ("unit/mpi/*", {"-unit", "mpi"}),
    ("mpi/*", {"mpi"}),
    ("integration/*", {"core"}),
    ("integration/test_demos.py::*", {"-core", "demo"}),
    ("integration/test_docs_examples.py::*", {"-core", "demo"}),
    ("clients/*", {"demo"}),
    ("integration/test_device_check.py::*", {"-core", "demo", "slow", "once"}),
    ("faults/*", {"faults", "replay", "once"}),
    # what else depends on the stack: CI runs these on PyMC 5's older PyTensor too
    *((f"integration/{m}.py::*", {"stack"}) for m in _STACK_MODULES),
    ("unit/test_pymc_*", {"stack"}),
    ("unit/test_rows.py::*", {"stack"}),  # PyTensor's shape inference and rewrites
    ("unit/test_chunks_unit.py::*", {"stack"}),  # DotInto's gemm on each backend
    # the docs' PyMC examples; the others take the library paths of the stack suites
    # above (functions, collectives, steps) and run on the two newer PyTensors
    ("integration/test_docs_examples.py::test_docs_example_runs[pymc_*", {"stack"}),
    # run again on device="gpu" (the stand-in; a GPU in benchmarks/device_check.py)
    *((f"integration/{m}.py::*", {"device"}) for m in _DEVICE_MODULES),
    ("unit/test_nccl.py::*", {"nccl"}),
    # run again with replay off (SYNK_REPLAY=0)
    *((f"integration/{m}.py::*", {"replay"}) for m in _REPLAY_MODULES),
    # the command line: run again from the installed wheel
    ("integration/test_cli.py::*", {"cli"}),
    ("unit/test_report.py::*", {"cli"}),
    # faults whose outcome depends on the stack: PyTensor's input checks (random shapes
    # and dtypes), fork() from threads (Python 3.12 warns)
    ("faults/test_fuzz.py::*", {"-once"}),
    ("faults/test_thread_misuse.py::*", {"-once"}),
    # whole programs beside their serial twins: the library paths they take are the
    # core suites'
    *((f"integration/test_demos.py::{name}*", {"slow", "once"}) for name in (
        "test_run_lasagne_demos", "test_cpu_data_demo_with_dropout_on_an_mnist_file",
        "test_resnet_demo_and_serial_twin",
        "test_deep_learning_tutorials_print_the_serial_numbers",
        "test_logistic_sgd_on_an_mnist_file", "test_lenet_port_prints_the_serial_numbers")),
    # left out of the default tier for time, which checks the same failures once in the
    # crash table: the soak, a fault at every phase, isolation between programs, misuse
    # from threads and children, Ctrl-C inside compiled kernels, every way the master
    # can die or end, states moved between session sizes
    ("faults/test_soak.py::*", {"slow"}),
    ("faults/test_phases.py::*", {"slow"}),
    ("faults/test_isolation.py::*", {"slow"}),
    ("faults/test_thread_misuse.py::*", {"slow"}),
    ("faults/test_interrupt.py::*", {"slow"}),
    ("faults/test_group_kill.py::test_group_sigkill_leaves_nothing*", {"slow"}),
    ("faults/test_group_kill.py::test_group_sigkill_leaves_nothing[3-in_command]", {"-slow"}),
    ("faults/test_crash_table.py::test_master_death*", {"slow"}),
    ("faults/test_crash_table.py::test_master_death[sigkill-in_command-*", {"-slow"}),
    ("faults/test_crash_table.py::test_program_ends_without_close*", {"slow"}),
    ("faults/test_crash_table.py::test_program_ends_without_close[no_close]", {"-slow"}),
    ("faults/test_crash_table.py::test_signal_reaches_an_idle_master_*", {"slow"}),
    ("faults/test_crash_table.py::test_master_sigkilled_workers_sweep_*", {"slow"}),
    ("integration/test_checkpoint_sizes.py::*", {"slow"}),
    ("integration/test_gpu.py::test_a_whole_session_on_the_cpu_stand_in[1]", {"slow"}),
    # PyMC once (when it is installed): logp and its gradient, pm.sample's signature
    # on one model; the model zoo (whose fixture compiles every model: four minutes
    # on a cold cache), the chains, and the sampling demo are left out
    ("integration/test_pymc_zoo.py::*", {"slow"}),
    ("integration/test_pymc_chains.py::*", {"slow"}),
    ("integration/test_pymc.py::test_sample_matches_pm_sample[hierarchical_model]", {"slow"}),
    ("integration/test_pymc.py::test_pymc_sampling_demo", {"slow"}),
]
_TESTS = Path(__file__).resolve().parent


def _matcher(pattern: str) -> re.Pattern:
    return re.compile(".*".join(map(re.escape, pattern.split("*"))))


_MATCHERS = [(_matcher(pattern), given) for pattern, given in TIERS]


def tier_markers(where: str) -> set[str]:
    """The markers ``TIERS`` gives the test at ``where`` ("folder/module.py::name[id]")."""
    markers: set[str] = set()
    for pattern, given in _MATCHERS:
        if pattern.fullmatch(where):
            markers |= {m for m in given if not m.startswith("-")}
            markers -= {m[1:] for m in given if m.startswith("-")}
    return markers


def sizes_to_run(sizes):
    """``sizes`` as parameters of session fixtures, limited to those
    SYNKHRONOS_TEST_SIZES names (all when unset); each but ``CORE_SIZE`` is marked
    "sizes"."""
    wanted = {int(n) for n in _SIZES.split(",")} if _SIZES else set(sizes)
    return [pytest.param(n, marks=() if n == CORE_SIZE else pytest.mark.sizes)
            for n in sizes if n in wanted]


def pytest_configure(config: pytest.Config) -> None:
    """No path, no -m, no -k: the default tier."""
    if (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.option.markexpr and not config.option.keyword):
        config.option.markexpr = DEFAULT_TIER


def pytest_report_header(config: pytest.Config) -> str:
    tier = ("the default tier" if config.option.markexpr == DEFAULT_TIER else
            f"-m {config.option.markexpr!r}" if config.option.markexpr else "every tier")
    return (f"tests: {tier}; markers by place in tests/conftest.py (TIERS); "
            f"`python -m pytest tests` runs every tier")


@pytest.hookimpl(tryfirst=True)  # before pytest selects by -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve().relative_to(_TESTS).as_posix()
        for marker in sorted(tier_markers(f"{path}::{item.name}")):
            item.add_marker(marker)


def _open_prefix() -> str | None:
    return program_prefix() if session_open() else None


@pytest.fixture(autouse=True)
def no_leaks():
    """After each test: no session it opened is left open; with none open, no worker
    and no segment of this process remains."""
    before = _open_prefix()
    yield
    after = _open_prefix()
    if after is not None and after != before:
        synk.close()
        pytest.fail("the test left a synkhronos session open (closed it now)")
    if after is None:
        assert child_pids() == [], "a test left child processes behind"
        assert segments_of() == [], "a test left shared-memory segments behind"


@pytest.fixture
def no_cyclic_gc():
    """No garbage collection of reference cycles inside the test: a test that counts
    which calls replay must not see the epoch moved on by the release of a ``Data``
    left in a cycle by an earlier test of the same session (that is correct, but it
    would make the count depend on when the collector runs). Earlier garbage waits for
    a later collection (collecting it first would cost about 2 s: see
    ``gc_of_this_test``)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def gc_of_this_test():
    """Inside the test (and the teardown of fixtures set up after this one),
    ``gc.collect()`` looks only at what the test made: every older object is frozen
    (``gc.freeze``) until the test ends. Late in a run a full collection takes about
    2 s (the compiled functions the tests share are millions of objects), and a test
    that collects to release its own objects needs no more. Older garbage is left to a
    later collection."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(params=sizes_to_run([1, 2, 3]), ids=lambda n: f"n{n}")
def forked(request):
    """A fresh session at n_parallel 1, 2 and 3 (3 gives uneven splits on 2 cores)."""
    n = synk.fork(request.param, device=DEVICE)
    try:
        yield n
    finally:
        synk.close()


@pytest.fixture(params=sizes_to_run([2, 3]), ids=lambda n: f"n{n}")
def forked_workers(request):
    """A fresh session that has workers (n_parallel 2 and 3)."""
    n = synk.fork(request.param, device=DEVICE)
    try:
        yield n
    finally:
        synk.close()


def session_fixture(build, sizes=(1, 2, 3)):
    """A module-scoped fixture: fork at each size, yield ``build()``, close.

    Compiling a graph costs seconds on a cold cache, so a module builds its functions
    once per size and its tests share them.
    """

    @pytest.fixture(scope="module", params=sizes_to_run(sizes), ids=lambda n: f"n{n}")
    def fixture(request):
        synk.fork(request.param, device=DEVICE)
        try:
            yield build()
        finally:
            synk.close()

    return fixture
