"""Local Sphinx extension for the synkhronos docs.

- ``.. benchmark-figure:: NAME``: shows ``docs/figures/NAME.png`` and the JSON report
  ``docs/figures/NAME.json`` when those files exist, and a short note saying how to
  produce them when they do not.
- A consistency check: every name in ``synkhronos.__all__`` (and in the ``__all__`` of
  every ``synkhronos.extensions`` module that exists) must be documented somewhere in
  the site; a missing one is a warning, so ``sphinx -W`` fails.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import zlib
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

log = logging.getLogger(__name__)


class BenchmarkFigure(SphinxDirective):
    """Include a benchmark's PNG and JSON from docs/figures/, if present."""

    required_arguments = 1
    option_spec = {"script": directives.unchanged}

    def run(self):
        name = self.arguments[0]
        script = self.options.get("script", f"benchmarks/{name}.py")
        folder = Path(self.env.srcdir) / "figures"
        png, data = folder / f"{name}.png", folder / f"{name}.json"
        self.env.note_dependency(str(png))
        self.env.note_dependency(str(data))
        result: list[nodes.Node] = []
        if png.exists():
            image = nodes.image(uri=f"figures/{name}.png", alt=name)
            image["candidates"] = {"*": f"figures/{name}.png"}
            result.append(image)
        if data.exists():
            try:
                record = json.loads(data.read_text())
            except ValueError as exc:
                log.warning(
                    "figures/%s.json is not valid JSON: %s", name, exc, location=self.get_location()
                )
            else:
                text = json.dumps(record, indent=1)
                block = nodes.literal_block(text, text)
                block["language"] = "json"
                result.append(block)
        if not result:
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


def _public_names() -> list[str]:
    import synkhronos

    names = [f"synkhronos.{name}" for name in synkhronos.__all__]
    for public in ("synkhronos.steps", "synkhronos.testing"):
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


def setup(app):
    app.add_directive("benchmark-figure", BenchmarkFigure)
    app.connect("env-check-consistency", check_api_coverage)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

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
