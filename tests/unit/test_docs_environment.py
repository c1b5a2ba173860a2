"""docs/environment.rst names every environment variable the package reads or sets.

The names are found in the source (``os.environ`` lookups, assignments and membership
tests, the launcher table's ``_int(environ, NAME)``), plus the tables that hold them
as data (the thread-count variables each worker sets), so a variable added to the
code without a line on the reference page fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import synkhronos
from synkhronos._runtime import processes

ROOT = Path(synkhronos.__file__).resolve().parent
PAGE = ROOT.parent / "docs" / "environment.rst"

_NAME = r"""["']([A-Z][A-Za-z0-9_]{2,})["']"""
PATTERNS = [
    re.compile(r"environ(?:\.get|\.setdefault|\.pop)?\(\s*" + _NAME),  # environ.get("X")
    re.compile(r"environ\[\s*" + _NAME + r"\s*\]"),  # environ["X"]
    re.compile(_NAME + r"\s+(?:not\s+)?in\s+environ\b"),  # "X" in environ
    re.compile(r"\(\s*environ\s*,\s*" + _NAME),  # _int(environ, "X")
    re.compile(r"for\s+name\s+in\s+\(([^)]*)\)\s*:\s*\n\s*if\s+name\s+in\s+environ"),
]


def variables_in_source() -> set[str]:
    found: set[str] = set(processes.THREAD_ENV)
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        for pattern in PATTERNS:
            for match in pattern.finditer(text):
                found.update(re.findall(r"[A-Z][A-Za-z0-9_]{2,}", match.group(1)))
    # A name kept in a module constant (NAME_ENV = "X") and looked up through it.
    for path in ROOT.rglob("*.py"):
        for match in re.finditer(r"^[A-Z_]+_ENV\s*=\s*" + _NAME, path.read_text(), re.M):
            found.add(match.group(1))
    return found


def test_the_scan_finds_known_variables():
    found = variables_in_source()
    assert {"SYNK_TIMEOUT", "SYNK_REDUCTION", "OMP_NUM_THREADS", "PMI_RANK",
            "SLURM_STEP_NUM_TASKS", "NUMBA_THREADING_LAYER"} <= found


def test_environment_page_names_every_variable():
    page = PAGE.read_text()
    missing = sorted(name for name in variables_in_source() if f"``{name}``" not in page)
    assert missing == [], f"docs/environment.rst does not name: {missing}"
