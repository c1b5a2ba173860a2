"""Local Sphinx extension for the synkhronos docs.

- ``.. benchmark-figure:: NAME``: a benchmark's plots from ``docs/figures/`` (``NAME.png``,
  or the files named by ``:images:``), the directive's content (the sentence that reads
  the figure), the machine the run recorded in ``NAME.json`` and a download link to
  that JSON; a note saying how to produce them when they are absent. A listed plot that
  does not exist is a warning.
- ``.. extras-table::``: the optional extras of ``pyproject.toml`` (read with tomllib)
  and what each installs, beside a purpose written in the directive's content as
  ``name: text`` entries. An extra without a purpose, or a purpose for an extra that
  does not exist, is a warning: the table cannot drift from the packaging.
- Consistency checks, warnings so that ``sphinx -W`` fails:

  * every public name (``synkhronos.__all__``, the ``__all__`` of ``synkhronos.steps``,
    ``synkhronos.testing``, ``synkhronos.pymc`` and of every ``synkhronos.extensions``
    module) is documented somewhere in the site;
  * every PNG in ``docs/figures`` is shown on some page;
  * every script in ``docs/examples`` that prints (it has its output checked in beside
    it as ``NAME.out``, compared with what it prints by
    ``tests/integration/test_docs_examples.py``) is included on some page, and so is
    that output.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import tomllib
import zlib
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the repository: docs/_ext/ -> ..


def machine_line(record: object) -> str | None:
    """The machine a benchmark's JSON records, in words, or None if it records none."""
    if isinstance(record, list):  # a list of runs on the same machine: the first one's
        record = record[0] if record and isinstance(record[0], dict) else {}
    if not isinstance(record, dict):
        return None
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else record
    cpu = machine.get("cpu") or machine.get("cpu_model")
    cores = machine.get("cores") or machine.get("usable_cores") or machine.get("cpus")
    parts = []
    if cpu:
        parts.append(str(cpu))
    if cores:
        parts.append(f"{cores} usable cores")
    for key, label in (("python", "Python"), ("pytensor", "PyTensor"), ("pymc", "PyMC")):
        if machine.get(key):
            parts.append(f"{label} {machine[key]}")
    mpi = record.get("mpi")
    if isinstance(mpi, dict) and mpi.get("library"):
        version = str(mpi.get("mpiexec", ""))
        found = re.search(r"\d+\.\d+(\.\d+)?", version)
        parts.append(f"{mpi['library']} {found.group(0)}" if found
                     else f"{mpi['library']} (version not recorded)")
    if not cpu and not cores:
        return None
    return ", ".join(parts)


class BenchmarkFigure(SphinxDirective):
    """A benchmark's plots, the sentence reading them, its machine and its JSON."""

    required_arguments = 1
    has_content = True
    option_spec = {"script": directives.unchanged, "images": directives.unchanged}

    def run(self):
        name = self.arguments[0]
        script = self.options.get("script", f"benchmarks/{name}.py")
        folder = Path(self.env.srcdir) / "figures"
        data = folder / f"{name}.json"
        self.env.note_dependency(str(data))
        listed = self.options.get("images")
        images = listed.split() if listed else [f"{name}.png"]
        result: list[nodes.Node] = []
        for image_name in images:
            png = folder / image_name
            self.env.note_dependency(str(png))
            if png.exists():
                image = nodes.image(uri=f"figures/{image_name}", alt=image_name)
                image["candidates"] = {"*": f"figures/{image_name}"}
                result.append(image)
            elif listed:
                log.warning("benchmark-figure %s lists figures/%s, which does not exist",
                            name, image_name, location=self.get_location())
        if self.content:
            result += self.parse_content_to_nodes()
        if data.exists():
            try:
                record = json.loads(data.read_text())
            except ValueError as exc:
                log.warning("figures/%s.json is not valid JSON: %s", name, exc,
                            location=self.get_location())
            else:
                machine = machine_line(record)
                where = (f"Measured on {machine} (as recorded in the JSON)" if machine
                         else "The JSON does not record the machine")
                result += self.parse_text_to_nodes(
                    f"{where}. Data: :download:`{name}.json <figures/{name}.json>`.")
        if not result or (not data.exists() and not any(
                isinstance(n, nodes.image) for n in result)):
            para = nodes.paragraph()
            para += nodes.Text("Not run for these docs yet: run ")
            para += nodes.literal(text=f"python {script}")
            if "--out docs/figures" in script:
                para += nodes.Text(f"; it writes docs/figures/{name}.json and {name}.png.")
            else:
                para += nodes.Text(
                    f" and save what it prints as docs/figures/{name}.json "
                    f"(and its plot, if it draws one, as "
                    f"docs/figures/{name}.png)."
                )
            result.append(nodes.note("", para))
        return result


def _requirement_name(requirement: str) -> str:
    """``jax[cuda12]>=0.4`` -> ``jax[cuda12]``: the name as a reader would pip-install it."""
    return re.split(r"[<>=!~;\s]", requirement, maxsplit=1)[0]


class ExtrasTable(SphinxDirective):
    """The optional extras of pyproject.toml, what each installs and what it is for."""

    has_content = True

    def run(self):
        pyproject = ROOT / "pyproject.toml"
        self.env.note_dependency(str(pyproject))
        extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
        purposes: dict[str, list[str]] = {}
        current = None
        for line in self.content:
            entry = re.match(r"^([A-Za-z0-9][A-Za-z0-9_-]*):\s*(.*)$", line)
            if entry:
                current = entry.group(1)
                purposes[current] = [entry.group(2)]
            elif current is not None and line.strip():
                purposes[current].append(line.strip())
        for extra in purposes:
            if extra not in extras:
                log.warning("extras-table describes extra %r, which pyproject.toml does not "
                            "define", extra, location=self.get_location())
        rows = [".. list-table::", "   :header-rows: 1", "   :widths: 12 40 48", "",
                "   * - extra", "     - installs", "     - for"]
        for extra, requirements in extras.items():
            if extra not in purposes:
                log.warning("extra %r of pyproject.toml has no purpose in extras-table",
                            extra, location=self.get_location())
            installs = ", ".join(f"``{_requirement_name(r)}``" for r in requirements)
            rows += [f"   * - ``{extra}``", f"     - {installs}",
                     f"     - {' '.join(purposes.get(extra, ['(not described)']))}"]
        return self.parse_text_to_nodes("\n".join(rows))


class ReadmeStatus(SphinxDirective):
    """The README's status table (its ``## Status`` section), so the two cannot differ."""

    def run(self):
        readme = ROOT / "README.md"
        self.env.note_dependency(str(readme))
        text = readme.read_text()
        section = text.split("\n## Status\n", 1)[1].split("\n## ", 1)[0]
        lines = [line for line in section.splitlines() if line.startswith("|")]
        if len(lines) < 3:
            log.warning("README.md has no status table under '## Status'",
                        location=self.get_location())
            return []
        rows = [".. list-table::", "   :header-rows: 1", "   :widths: 55 45", ""]
        for line in [lines[0], *lines[2:]]:  # the header, then the rows (not the rule)
            cells = [_markdown_cell(cell) for cell in line.strip().strip("|").split(" | ")]
            rows += [f"   * - {cells[0]}"] + [f"     - {cell}" for cell in cells[1:]]
        return self.parse_text_to_nodes("\n".join(rows))


def _markdown_cell(cell: str) -> str:
    """A markdown table cell as reStructuredText: `code` -> ``code``."""
    return re.sub(r"`([^`]+)`", r"``\1``", cell.strip())


def _public_names() -> list[str]:
    import synkhronos

    names = [f"synkhronos.{name}" for name in synkhronos.__all__]
    for public in ("synkhronos.steps", "synkhronos.testing", "synkhronos.pymc"):
        module = importlib.import_module(public)
        names += [f"{public}.{name}" for name in module.__all__]
    try:
        extensions = importlib.import_module("synkhronos.extensions")
    except ImportError:
        return names
    for info in pkgutil.iter_modules(extensions.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"synkhronos.extensions.{info.name}")
        names += [f"{module.__name__}.{name}" for name in getattr(module, "__all__", [])]
    return names


def check_api_coverage(app, env):
    documented = set(env.get_domain("py").objects)
    for name in _public_names():
        if name not in documented:
            log.warning("public name %s is not documented in the API reference", name)


def _used_files(env) -> set[Path]:
    srcdir = Path(env.srcdir)
    used = set()
    for deps in env.dependencies.values():
        for dep in deps:
            used.add((srcdir / str(dep)).resolve())
    return used


def check_figures_and_examples(app, env):
    srcdir = Path(env.srcdir)
    shown = {(srcdir / str(image)).resolve() for image in env.images}
    for png in sorted((srcdir / "figures").glob("*.png")):
        if png.resolve() not in shown:
            log.warning("figures/%s is not shown on any page", png.name)
    used = _used_files(env)
    for out in sorted((srcdir / "examples").glob("*.out")):
        for path in (out, out.with_suffix(".py")):
            if path.resolve() not in used:
                log.warning("examples/%s is not included on any page", path.name)


def setup(app):
    app.add_directive("benchmark-figure", BenchmarkFigure)
    app.add_directive("extras-table", ExtrasTable)
    app.add_directive("readme-status", ReadmeStatus)
    app.connect("env-check-consistency", check_api_coverage)
    app.connect("env-check-consistency", check_figures_and_examples)
    return {"version": "2", "parallel_read_safe": True, "parallel_write_safe": True}

# -- intersphinx without the network ------------------------------------------------------
# The docs build where nothing leaves the machine, so intersphinx reads inventories
# written here: the objects of Python, numpy and PyTensor the docs link to, at their
# pages on the projects' own sites (the links work for any reader who has a network).
INVENTORIES = {
    "python": ("https://docs.python.org/3/", [
        ("RuntimeError", "py:exception", "library/exceptions.html#RuntimeError"),
        ("ValueError", "py:exception", "library/exceptions.html#ValueError"),
        ("TypeError", "py:exception", "library/exceptions.html#TypeError"),
        ("TimeoutError", "py:exception", "library/exceptions.html#TimeoutError"),
        ("KeyboardInterrupt", "py:exception", "library/exceptions.html#KeyboardInterrupt"),
        ("SystemExit", "py:exception", "library/exceptions.html#SystemExit"),
        ("multiprocessing", "py:module", "library/multiprocessing.html#module-multiprocessing"),
        ("threading", "py:module", "library/threading.html#module-threading"),
        ("pickle", "py:module", "library/pickle.html#module-pickle"),
        ("logging", "py:module", "library/logging.html#module-logging"),
        ("warnings", "py:module", "library/warnings.html#module-warnings"),
        ("collections.abc.Callable", "py:class",
         "library/collections.abc.html#collections.abc.Callable"),
    ]),
    "numpy": ("https://numpy.org/doc/stable/", [
        ("numpy.ndarray", "py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
        ("numpy.dtype", "py:class", "reference/generated/numpy.dtype.html#numpy.dtype"),
        ("numpy.array_split", "py:function",
         "reference/generated/numpy.array_split.html#numpy.array_split"),
    ]),
    "pytensor": ("https://pytensor.readthedocs.io/en/latest/", [
        ("pytensor.function", "py:function",
         "library/compile/function.html#pytensor.compile.function.function"),
        ("pytensor.shared", "py:function",
         "library/compile/shared.html#pytensor.compile.sharedvalue.shared"),
        ("pytensor.grad", "py:function", "library/gradient.html#pytensor.gradient.grad"),
        ("pytensor.compile.sharedvalue.SharedVariable", "py:class",
         "library/compile/shared.html#pytensor.compile.sharedvalue.SharedVariable"),
        ("pytensor.graph.basic.Variable", "py:class",
         "library/graph/graph.html#pytensor.graph.basic.Variable"),
    ]),
}


def write_inventory(path: Path, project: str, objects: list[tuple[str, str, str]]) -> None:
    """An ``objects.inv`` (version 2) listing ``objects`` as (name, domain:role, uri)."""
    lines = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in objects)
    header = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: \n"
              "# The remainder of this file is compressed using zlib.\n")
    path.write_bytes(header.encode() + zlib.compress(lines.encode()))


def intersphinx_mapping(directory: Path) -> dict:
    """Write the inventories into ``directory``; the mapping for ``conf.py``."""
    directory.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for project, (url, objects) in INVENTORIES.items():
        path = directory / f"{project}.inv"
        write_inventory(path, project, objects)
        mapping[project] = (url, str(path))
    return mapping
