"""The package's layers, read from its imports (nothing is imported or run here).

``DESIGN.md``'s direction: ``extensions, pymc -> public names``; ``lifecycle -> worker ->
handlers -> _core -> _runtime``; ``_runtime -> stdlib + numpy (+ posix_ipc, mpi4py)``.
Checked here:

- ``_runtime`` imports the standard library, numpy, posix_ipc (and mpi4py, for
  ``_runtime/mpi*``) only;
- ``_core`` imports those and ``_runtime`` and ``errors`` only: never PyTensor, never
  a layer above it;
- ``extensions`` and ``pymc`` reach the rest of the package through its public names
  only (``from .. import fork``, ``synkhronos.steps``), never a private module;
- no import cycle between the package's modules (imports at module level);
- tests other than unit tests, benchmarks, demos and the docs' examples import only
  public modules; the one exception is the MPI layer's own suite, which runs that
  private layer under ``mpiexec`` as unit tests run the others (``tests/mpi``:
  ``test_leaders*.py`` and ``scripts/leaders_*.py``, ``scripts/_machine.py``), and may
  import ``synkhronos._runtime.mpi`` only.
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
    "synkhronos.pymc", "synkhronos.data",
}
THIRD_PARTY_OF_RUNTIME = {"numpy", "posix_ipc"}


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


@pytest.mark.parametrize("path", sorted((PACKAGE / "_runtime").glob("*.py")), ids=lambda p: p.name)
def test_runtime_imports_only_stdlib_numpy_posix_ipc(path):
    allowed = set(THIRD_PARTY_OF_RUNTIME)
    if path.stem.startswith("mpi"):
        allowed.add("mpi4py")
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


def _outside_files() -> list[Path]:
    roots = [ROOT / "tests" / "integration", ROOT / "tests" / "faults", ROOT / "tests" / "mpi",
             ROOT / "benchmarks", ROOT / "demos", ROOT / "docs" / "examples"]
    files = [ROOT / "tests" / "conftest.py"]
    for root in roots:
        if root.exists():
            files += sorted(root.rglob("*.py"))
    return files


def _tests_the_mpi_layer(path: Path) -> bool:
    mpi = ROOT / "tests" / "mpi"
    return (path.parent == mpi and path.name.startswith("test_leaders")) or (
        path.parent == mpi / "scripts" and path.name.startswith(("leaders_", "_machine")))


@pytest.mark.parametrize("path", _outside_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_benchmarks_and_demos_use_public_modules_only(path):
    allowed = set(PUBLIC)
    if _tests_the_mpi_layer(path):
        allowed |= {"synkhronos._runtime", "synkhronos._runtime.mpi"}
    for name in _imports(path, top_level_only=False):
        if name.startswith("synkhronos"):
            assert name in allowed, f"{path.relative_to(ROOT)} imports the private {name}"
