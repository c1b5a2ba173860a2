"""The package's layers, read from its imports (nothing is imported or run here).

``DESIGN.md``'s direction: ``extensions, pymc -> public names``; ``lifecycle -> worker ->
handlers -> _core -> _runtime``; ``_runtime -> stdlib + numpy (+ posix_ipc, mpi4py)``.
Checked here:

- ``_runtime`` imports the standard library, numpy, posix_ipc (and jax and cupy, for
  the device modules ``placement`` and ``nccl``) only;
- ``_core`` imports those and ``_runtime`` and ``errors`` only: never PyTensor, never
  a layer above it;
- several machines are one package behind the transport and backend interfaces
  (``_machines``): it uses the engine, the mechanism and the collectives' backend
  interface, and only the modules that put a session together (``lifecycle``, the
  handler table, ``testing``, the environment report) import it; its MPI layer
  (``_machines/mpi``) is mechanism, as ``_runtime`` is, and the only importer of
  mpi4py;
- ``extensions`` and ``pymc`` reach the rest of the package through its public names
  only (``from .. import fork``, ``synkhronos.steps``), never a private module;
- no import cycle between the package's modules (imports at module level);
- the modules that must not care how many machines there are, or which collectives
  backend runs, do not *name* them (identifiers and attributes in code, not prose):
  ``collectives/fused.py``, ``ranks.py`` and the one-machine backends name no machine,
  node, leader, MPI or reduction mode between machines, and the first two duck-type
  no backend (no ``getattr``/``hasattr``);
- the session's run path and the modules that only ask for a command to run or memory
  to be shared (``_core/session.py``, ``data.py``, ``_call.py``, ``_staging.py``,
  ``function.py``, ``_core/execute.py``) name no machine, node, leader or MPI: that is the
  transport's (``_core/transport.py``, ``_machines/transport.py``); and no module reaches
  the communicator through an attribute chain (``x.mpi``): ``Machines`` keeps it;
- tests other than unit tests, benchmarks, demos and the docs' examples import only
  public modules, without exception (the MPI layer's own tests, which run that private
  layer under ``mpiexec``, are unit tests: ``tests/unit/mpi``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "synkhronos"
PUBLIC = {
    "synkhronos", "synkhronos.testing", "synkhronos.steps", "synkhronos.errors",
    "synkhronos.extensions", "synkhronos.extensions.updates", "synkhronos.extensions.train",
    "synkhronos.extensions.conv", "synkhronos.pymc", "synkhronos.data",
}
THIRD_PARTY_OF_RUNTIME = {"numpy", "posix_ipc"}
DEVICE_MODULES = {"placement", "nccl"}  # the device libraries live behind these two


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> list[str]:
    """Absolute names of the modules ``path`` imports (``from x import y`` gives ``x``,
    and ``x.y`` when ``y`` is a submodule of the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append(module)
            for alias in node.names:  # a submodule imported by name
                if alias.name in _exported(module):
                    continue  # the package's public name (``from synkhronos import profile``)
                candidate = f"{module}.{alias.name}"
                if (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    ROOT / Path(*candidate.split(".")) / "__init__.py").exists():
                    found.append(candidate)
    return found


def _exported(module: str) -> set[str]:
    """The names a package's ``__init__`` lists in ``__all__`` (read, not imported)."""
    init = ROOT / Path(*module.split(".")) / "__init__.py"
    if not init.exists():
        return set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)}
    return set()


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


@pytest.mark.parametrize("path", sorted((PACKAGE / "_runtime").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE / "_runtime")))
def test_runtime_imports_only_stdlib_numpy_posix_ipc(path):
    allowed = set(THIRD_PARTY_OF_RUNTIME)
    if path.stem in DEVICE_MODULES:
        allowed |= {"jax", "cupy"}
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos."):
            assert name.startswith("synkhronos._runtime"), f"{path.name} imports {name}"
        else:
            assert _is_stdlib(name) or name.split(".")[0] in allowed, (
                f"{path.name} imports {name}")


@pytest.mark.parametrize("path", sorted((PACKAGE / "_core").glob("*.py")), ids=lambda p: p.name)
def test_core_imports_only_runtime_and_errors(path):
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos"):
            assert name.startswith(("synkhronos._runtime", "synkhronos._core",
                                    "synkhronos.errors")), f"_core/{path.name} imports {name}"
        else:
            assert _is_stdlib(name) or name.split(".")[0] == "numpy", (
                f"_core/{path.name} imports {name}")


MACHINES = PACKAGE / "_machines"
# what the several-machines package builds on: the engine, the mechanism, the
# collectives' backend interface and the one-machine backend it wraps, the row math
MACHINES_USE = ("synkhronos._machines", "synkhronos._core", "synkhronos._runtime",
                "synkhronos.errors", "synkhronos.collectives.backend",
                "synkhronos.collectives.cpu", "synkhronos.collectives.rounded",
                "synkhronos._dataref", "synkhronos._reducers", "synkhronos._scatter")
MACHINES_USERS = {"synkhronos.lifecycle", "synkhronos.handlers", "synkhronos.testing",
                  "synkhronos._report"}


@pytest.mark.parametrize("path", sorted(MACHINES.glob("*.py")), ids=lambda p: p.name)
def test_machines_package_uses_the_layers_below_only(path):
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos"):
            assert name.startswith(MACHINES_USE), f"_machines/{path.name} imports {name}"
        else:
            assert _is_stdlib(name) or name.split(".")[0] == "numpy", (
                f"_machines/{path.name} imports {name}")


@pytest.mark.parametrize("path", sorted((MACHINES / "mpi").glob("*.py")), ids=lambda p: p.name)
def test_mpi_layer_imports_only_stdlib_numpy_mpi4py_and_runtime(path):
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos."):
            assert name.startswith(("synkhronos._runtime", "synkhronos._machines.mpi")), (
                f"_machines/mpi/{path.name} imports {name}")
        else:
            assert _is_stdlib(name) or name.split(".")[0] in {"numpy", "mpi4py"}, (
                f"_machines/mpi/{path.name} imports {name}")


def test_only_the_assembly_imports_the_machines_package():
    importers = {}
    for path in _package_files():
        name = _module_name(path)
        if name.startswith("synkhronos._machines"):
            continue
        for imported in _imports(path, top_level_only=False):
            if imported.startswith("synkhronos._machines"):
                importers.setdefault(name, set()).add(imported)
            if imported.split(".")[0] == "mpi4py":
                importers.setdefault(name, set()).add(imported)
    assert set(importers) <= MACHINES_USERS, (
        f"{sorted(set(importers) - MACHINES_USERS)} import several machines' modules or "
        "mpi4py; go through the transport or the backend interface")
    assert not any(name.startswith("mpi4py") for names in importers.values()
                   for name in names), "only _machines/mpi imports mpi4py"


ADD_ONS = sorted((PACKAGE / "extensions").glob("*.py")) + sorted((PACKAGE / "pymc").glob("*.py"))


@pytest.mark.parametrize("path", ADD_ONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_add_ons_use_public_names_only(path):
    own = f"synkhronos.{path.parent.name}"  # an add-on's own modules, private or not
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos"):
            assert name in PUBLIC or name == own or name.startswith(own + "."), (
                f"{path.parent.name}/{path.name} imports the private {name}")


def test_no_import_cycles():
    graph = {}
    for path in _package_files():
        name = _module_name(path)
        graph[name] = {m for m in _imports(path, top_level_only=True)
                       if m.startswith("synkhronos") and m != name}
    # a module importing its own package's __init__ for a sibling is the package's edge
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if node.startswith(nxt + ".") or nxt == "synkhronos":
                continue  # a submodule reading its package's names is not a cycle
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if state.get(nxt) is None:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state.get(node) is None:
            visit(node)


# -- names, not only imports ------------------------------------------------------------
MACHINE_WORDS = {"node", "nodes", "leader", "leaders", "machine", "machines", "mpi",
                 "exact", "hierarchy", "local_barrier", "local_rank", "local_size",
                 "local_sizes", "leader_rank", "machine_of"}  # (FusedLayout has offsets)
BACKEND_BLIND = ["collectives/fused.py", "collectives/ranks.py", "collectives/backend.py",
                 "collectives/cpu.py", "collectives/staged.py", "collectives/nccl.py",
                 "collectives/api.py", "collectives/_checks.py"]


def _code_names(path: Path) -> set[str]:
    """Every identifier the code of ``path`` uses: names, attributes, definitions,
    arguments, imported names (docstrings, comments and strings are prose)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update((node.asname or node.name).split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
    return names


def _words(name: str) -> set[str]:
    lowered = name.lower()
    return {lowered} | set(lowered.strip("_").split("_"))


@pytest.mark.parametrize("relative", BACKEND_BLIND)
def test_one_machine_collectives_name_no_machine(relative):
    named = {name for name in _code_names(PACKAGE / relative)
             if _words(name) & MACHINE_WORDS}
    assert not named, f"{relative} names {sorted(named)}: that belongs to _machines/backend.py"


TRANSPORT_BLIND = ["_core/session.py", "data.py", "_call.py", "_staging.py", "function.py",
                   "_core/execute.py"]
TRANSPORT_WORDS = {"node", "nodes", "leader", "leaders", "machine", "machines", "mpi"}


@pytest.mark.parametrize("relative", TRANSPORT_BLIND)
def test_run_path_names_no_machine(relative):
    named = {name for name in _code_names(PACKAGE / relative)
             if _words(name) & TRANSPORT_WORDS}
    assert not named, (f"{relative} names {sorted(named)}: that belongs to the transport "
                       "(_core/transport.py, _machines/transport.py)")


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_attribute_chain_reaches_the_communicator(path):
    chains = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Attribute) and node.attr == "mpi"]
    assert not chains, (f"{path.relative_to(PACKAGE)} reaches MPI through an attribute "
                        f"(lines {chains}): ask Machines instead")


@pytest.mark.parametrize("name", ["fused.py", "ranks.py"])
def test_fused_duck_types_no_backend(name):
    named = _code_names(PACKAGE / "collectives" / name)
    assert not named & {"getattr", "hasattr"}, (
        f"{name} asks a backend what it has; declare it on backend.Backend instead")


def _outside_files() -> list[Path]:
    roots = [ROOT / "tests" / "integration", ROOT / "tests" / "faults", ROOT / "tests" / "mpi",
             ROOT / "benchmarks", ROOT / "demos", ROOT / "docs" / "examples"]
    # (tests/support/nccl_probe.py drives the private NCCL layer, as the unit tests do)
    files = [ROOT / "tests" / "conftest.py", ROOT / "tests" / "cases.py",
             ROOT / "tests" / "support" / "soak.py", ROOT / "tests" / "support" / "mpiexec.py"]
    for root in roots:
        if root.exists():
            files += sorted(root.rglob("*.py"))
    return files


@pytest.mark.parametrize("path", _outside_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_benchmarks_and_demos_use_public_modules_only(path):
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos"):
            assert name in PUBLIC, f"{path.relative_to(ROOT)} imports the private {name}"
