"""The shared cases (``tests/cases.py``), the same on one or several machines.

``python suite.py --out DIR --processes 4`` runs alone (4 processes);
``mpiexec -n 2 python suite.py --out DIR --processes 2 [--reduction exact]`` runs on 2
"machines" of 2 processes each (``--processes`` is per machine, as ``synk.fork``'s
``n_parallel``). The master writes every result into ``DIR/suite.npz`` (arrays by
name), numpy's references into ``DIR/reference.npz``, and ``DIR/suite.json`` (errors'
messages, the session's layout). The test compares a run over machines with the run
alone at the same total number of processes, and each with the references.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import synkhronos as synk
from tests import cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--reduction", default="fast", choices=["fast", "exact"])
    args = parser.parse_args()
    n = synk.fork(args.processes, reduction=args.reduction)
    checks, notes = cases.run_all(n)
    np.savez(args.out / "suite.npz", **{name: np.asarray(check.got)
                                        for name, check in checks.items()})
    np.savez(args.out / "reference.npz", **{name: np.asarray(check.want)
                                            for name, check in checks.items()
                                            if check.want is not None})
    (args.out / "suite.json").write_text(json.dumps(notes))
    synk.close()


if __name__ == "__main__":
    main()
