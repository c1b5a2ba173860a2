"""The README's status table against the docs, where both state the same fact.

README.md's "Status" table says in one line per part what is done and within which
limits; the pages under ``docs/`` say the same at length, and some of it the code
says too. Each fact below is read from every place that states it (the README's row,
a page's sentence or table row, the source) into a small value, and the values must
be equal. Changing one side alone fails here, naming what each side says; a
statement that can no longer be found fails too, so that a rewording is checked by
whoever makes it. (Issue 47 found the README saying that PyMC chains ran one after
another while docs/likelihoods.rst documented chains x processes, and
docs/troubleshooting.rst saying an interrupt closed the session while
docs/failures.rst said it kept it.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import synkhronos

ROOT = Path(synkhronos.__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def flat(text: str) -> str:
    """Whitespace (line breaks of prose, table cells' indents) as single spaces."""
    return re.sub(r"\s+", " ", text).strip()


def status_rows(readme: str) -> list[str]:
    """The rows of the README's Status table, each ``part | state`` as one string."""
    section = readme.split("\n## Status\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|") for line in section.splitlines()
            if line.startswith("|") and not line.startswith("| ---")]
    return rows[1:]  # without the header


def readme_row(key: str, readme: str | None = None) -> str:
    """The one row of the Status table that contains ``key``."""
    rows = [row for row in status_rows(readme or (ROOT / "README.md").read_text())
            if key in row]
    assert len(rows) == 1, f"README's Status table: {len(rows)} rows contain {key!r}"
    return flat(rows[0])


def list_table(page: str, title: str) -> list[list[str]]:
    """The rows (lists of cells, each flattened) of the first ``list-table`` after the
    line ``title`` in the page's text."""
    text = ("\n" + page).split(f"\n{title}\n", 1)[1]
    lines = text.split(".. list-table::", 1)[1].splitlines()[1:]
    rows: list[list[str]] = []
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break  # the table ended at the next unindented line
        if re.match(r"^\s*\* - ", line):
            rows.append([line.split("* - ", 1)[1]])
        elif re.match(r"^\s*- ", line) and rows:
            rows[-1].append(line.split("- ", 1)[1])
        elif line.strip() and rows and not line.strip().startswith(":"):
            rows[-1][-1] += " " + line.strip()
    return [[flat(cell) for cell in row] for row in rows]


def find(pattern: str, text: str, where: str) -> re.Match:
    match = re.search(pattern, text)
    assert match, f"{where}: no longer says /{pattern}/; reword the test with the page"
    return match


def page(name: str) -> str:
    return (DOCS / name).read_text()


# -- the facts: each ``*_from_*`` reads one place's statement into a value -------------

def interrupt_from_readme(row: str) -> dict[str, str]:
    """``{"one machine": ..., "several machines": ...}``: "keeps", "breaks" or, where
    the row speaks of one machine only, "unsaid"."""
    said = find(r"Ctrl-C (keeps|breaks|closes) the session( on one machine)?"
                r"( and over several)?", row, "README")
    one = "keeps" if said[1] == "keeps" else "breaks"
    if said[3] or not said[2]:  # "... and over several", or unqualified: both alike
        several = one
    else:
        several = _several_machines_clause(row, "unsaid")
    return {"one machine": one, "several machines": several}


def _several_machines_clause(text: str, default: str) -> str:
    """What a text says of an interrupt over several machines, "keeps" or "breaks":
    "over several machines ... an interrupt ... breaks it", or "keeps the session ...,
    over several machines too"; ``default`` where it says neither."""
    match = (re.search(r"(?i)over several machines[^.|]*?(?:Ctrl-C|an interrupt)[^.|]*?"
                       r"\b(keeps|breaks|closes)\b", text)
             or re.search(r"\b(keeps|breaks|closes) the session\b[^.|]*?"
                          r"\bover several machines\b[^.|]*?\btoo\b", text))
    if match is None:
        return default
    return "keeps" if match[1] == "keeps" else "breaks"


def interrupt_from_failures(text: str) -> dict[str, str]:
    rows = {row[0]: row for row in list_table(text, "Failures, signals and clean-up")}
    row = rows.get("Ctrl-C during a command")
    assert row is not None, "docs/failures.rst: no table row 'Ctrl-C during a command'"
    one = "keeps" if row[2].startswith("usable") else "breaks"
    return {"one machine": one, "several machines": _several_machines_clause(flat(text), one)}


def interrupt_from_several_machines(text: str) -> str:
    """The failure table's row for an interrupted master: "keeps" or "breaks"."""
    row = next((row for row in list_table(text, "When something fails")
                if row[0].startswith("the master is interrupted")), None)
    assert row is not None, "docs/several_machines.rst: no row for an interrupted master"
    keeps = "The session stays usable" in row[1] and row[2].startswith("goes on")
    return "keeps" if keeps else "breaks"


def interrupt_from_troubleshooting(text: str) -> dict[str, str]:
    prose = flat(text)
    match = find(r"Interrupting the kernel \(Ctrl-C\) while a command runs [^.]*?"
                 r"\b(keeps|breaks|closes) the session", prose, "docs/troubleshooting.rst")
    one = "keeps" if match[1] == "keeps" else "breaks"
    return {"one machine": one, "several machines": _several_machines_clause(prose, one)}


def chains_from_readme(row: str) -> dict:
    when = find(r"\bchains (at once|one after another)", row, "README")[1]
    layout = find(r"`(\w+)` x `(\w+)`", row, "README")
    return {"chains": when, "layout": (layout[1], layout[2])}


def chains_from_likelihoods(text: str) -> dict:
    after_title = text.split("\nChains and processes\n", 1)[1].split("\n", 1)[1]
    section = flat(after_title.strip().split("\n\n", 1)[0])  # its first paragraph
    when = find(r"``cores`` keeps PyMC's meaning: the chains that run (at once|one after "
                r"another)", section, "docs/likelihoods.rst")[1]
    group = find(r"each running chain gets its own group of ``(\w+)`` processes", section,
                 "docs/likelihoods.rst")[1]
    return {"chains": when, "layout": ("cores", group)}


def chains_layout_in_code() -> tuple[str, str]:
    """The keywords that set the layout: PyMC's ``cores`` (taken through ``**kwargs``
    and documented there) and synkhronos's own parameter."""
    source = (ROOT / "synkhronos" / "pymc" / "_sampling.py").read_text()
    sample = next(node for node in ast.parse(source).body
                  if isinstance(node, ast.FunctionDef) and node.name == "sample")
    own = [arg.arg for arg in sample.args.kwonlyargs if arg.arg.endswith("_per_chain")]
    assert len(own) == 1 and "``cores`` keeps" in (ast.get_docstring(sample) or ""), own
    return ("cores", own[0])


def gpu_from_readme(row: str) -> dict:
    state = row.split("|")[-1].strip()
    tested = find(r"on one (\w+) at (\d+) and (\d+) processes", row, "README")
    cost = find(r"costs ([\d.]+)x the plain JAX function \(target ([\d.]+)\)", row, "README")
    return {"status": "done" if state.startswith("done") else state,
            "gpu": tested[1], "processes": {int(tested[2]), int(tested[3])},
            "several GPUs run": "not run on several GPUs" not in row,
            "sharded step": ("stand-in only" if re.search(
                r"sharded[^;]*tested on the stand-in only", row) else "GPU too"),
            "step cost": float(cost[1]), "target": float(cost[2])}


def gpu_from_gpu_page(text: str) -> dict:
    rows = {row[0]: row[1] for row in list_table(text, "What was verified where")}
    one = next((key for key in rows if key.startswith("one GPU")), None)
    assert one is not None, "docs/gpu.rst: no 'one GPU' row in what was verified where"
    verified = rows[one]
    processes = find(r"at (\d+) process \(.*?\) and at (\d+) \(", verified, "docs/gpu.rst")
    cost = find(r"took ([\d.]+) times the plain JAX function's time", verified, "docs/gpu.rst")
    target = find(r"the target is ([\d.]+)", verified, "docs/gpu.rst")
    stand_in = next(value for key, value in rows.items() if key.startswith("CPU stand-in"))
    several = rows.get("several GPUs", "")
    return {"status": "done", "gpu": find(r"one GPU \(an? (\w+)", one, "docs/gpu.rst")[1],
            "processes": {int(processes[1]), int(processes[2])},
            "several GPUs run": not several.startswith("argued, not run"),
            "sharded step": ("stand-in only" if "sharded" in stand_in
                             and "sharded" not in verified else "GPU too"),
            "step cost": float(cost[1]), "target": float(target[1])}


PLANNED = re.compile(r"GPU[^.]*\bis planned\b|``fork\(device=\"gpu\"\)`` raises until")


def gpu_status_in_docs() -> dict[str, str]:
    """Per page that says the GPU backend is still to come, its sentence."""
    return {path.name: match[0] for path in sorted(DOCS.glob("*.rst"))
            if (match := PLANNED.search(flat(path.read_text())))}


def machines_from_readme(row: str) -> dict:
    state = row.split("|")[-1]
    devices = find(r"\((CPU|CPU and GPU|GPU);", state, "README")[1]
    tested = find(r"tested on one computer, the MPI ranks standing for machines over "
                  r"([^)]*)\)", state, "README")[1]
    return {"devices": devices, "tested over": _ways(tested)}


def machines_from_docs(several: str, gpu: str) -> dict:
    prose = flat(several)
    tested = find(r"This is how synkhronos is tested \([^)]*\): on one computer, the MPI "
                  r"ranks standing for machines over ([^.]*)\.", prose,
                  "docs/several_machines.rst")[1]
    gpu_refused = re.search(r"Under an MPI launcher ``device=\"gpu\"`` raises", flat(gpu))
    cpu_only = re.search(r"Over several machines it runs on CPU cores only", prose)
    return {"devices": "CPU" if gpu_refused and cpu_only else "CPU and GPU",
            "tested over": _ways(tested)}


def _ways(text: str) -> set[str]:
    return {way.strip() for way in re.split(r",| and ", text) if way.strip()}


def tutorials_from_readme(row: str) -> set[str]:
    clause = find(r"the Deep Learning Tutorials' (.*?)( \(|\|)", row, "README")[1]
    return set(re.findall(r"`(\w+\.py)`", clause))


def tutorials_in_docs(text: str) -> set[str]:
    return {name for name in re.findall(r"demos/tutorials/(\w+\.py)", text)
            if not name.endswith("_serial.py")}


def tutorials_in_demos() -> set[str]:
    folder = ROOT / "demos" / "tutorials"
    return {path.name for path in folder.glob("*.py")
            if (folder / f"{path.stem}_serial.py").exists()}


# -- the checks -------------------------------------------------------------------------

def test_interrupt_outcome():
    readme = interrupt_from_readme(readme_row("Ctrl-C"))
    assert readme == interrupt_from_failures(page("failures.rst")), "docs/failures.rst"
    assert readme == interrupt_from_troubleshooting(page("troubleshooting.rst")), (
        "docs/troubleshooting.rst")
    assert readme["several machines"] == interrupt_from_several_machines(
        page("several_machines.rst")), "docs/several_machines.rst"


def test_pymc_chains_and_processes():
    readme = chains_from_readme(readme_row("synkhronos.pymc"))
    assert readme == chains_from_likelihoods(page("likelihoods.rst"))
    assert readme["layout"] == chains_layout_in_code()


def test_gpu_support():
    readme = gpu_from_readme(readme_row('device="gpu"'))
    assert readme == gpu_from_gpu_page(page("gpu.rst"))
    if readme["status"] == "done":
        assert gpu_status_in_docs() == {}, "pages that still say the GPU backend is to come"


def test_several_machines():
    readme = machines_from_readme(readme_row("several machines: the same script"))
    assert readme == machines_from_docs(page("several_machines.rst"), page("gpu.rst"))
    refusal = "device='gpu' runs on one machine for now"
    refused_in_code = refusal in (ROOT / "synkhronos" / "lifecycle.py").read_text()
    assert (readme["devices"] == "CPU") == refused_in_code


def test_ported_tutorials():
    readme = tutorials_from_readme(readme_row("Deep Learning Tutorials"))
    assert readme == tutorials_in_demos()
    assert readme == tutorials_in_docs(page("migrating.rst"))


# -- the parsers read what they claim to: each fact changed on one side is caught -------

ROW = ("| `fork`, `close`, failure handling; Ctrl-C keeps the session on one machine and "
       "over several (but for one case between machines, `docs/failures.rst`) | done |")
BEFORE_47 = ("| `fork`, `close`, failure handling; Ctrl-C keeps the session on one machine "
             "(over several machines an interrupt during a command still breaks it) | done |")


@pytest.mark.parametrize(("row", "want"), [
    (ROW, {"one machine": "keeps", "several machines": "keeps"}),
    (BEFORE_47, {"one machine": "keeps", "several machines": "breaks"}),
    (ROW.replace(" on one machine and over several", ""),
     {"one machine": "keeps", "several machines": "keeps"}),
    (ROW.replace(" and over several", ""),
     {"one machine": "keeps", "several machines": "unsaid"}),
])
def test_readme_interrupt_parser(row, want):
    assert interrupt_from_readme(flat(row)) == want


def test_changed_docs_disagree():
    failures = page("failures.rst")
    changed = failures.replace("Ctrl-C keeps the session\ntoo.", "Ctrl-C still breaks the "
                               "session.")
    assert changed != failures, "the sentence the test changes moved"
    assert interrupt_from_failures(changed)["several machines"] == "breaks"
    troubleshooting = page("troubleshooting.rst").replace(
        "(:doc:`failures`), over\nseveral machines (``mpiexec``) too.",
        "(:doc:`failures`). Over several machines an interrupt breaks it.")
    assert interrupt_from_troubleshooting(troubleshooting)["several machines"] == "breaks"
    several = page("several_machines.rst").replace("The\n       session stays usable",
                                                   "The\n       session is broken")
    assert interrupt_from_several_machines(several) == "breaks"
    likelihoods = page("likelihoods.rst").replace("the chains that run at once",
                                                  "the chains that run one after another")
    assert chains_from_likelihoods(likelihoods)["chains"] == "one after another"
    gpu = page("gpu.rst").replace("took 1.07 times", "took 1.02 times")
    assert gpu_from_gpu_page(gpu)["step cost"] == 1.02
    planned = ("A GPU backend (JAX + NCCL\n       through CuPy) is planned; "
               "``fork(device=\"gpu\")`` raises until then.")
    assert PLANNED.search(flat(planned))  # what docs/migrating.rst said until issue 47
