"""Soak: many small calls and many fork/close cycles leave nothing behind.

Runs ``soak`` of ``tests/support/soak.py`` (which the test suite runs short, in
``tests/faults/test_soak.py``) at full length and prints its JSON: after a warm-up
cycle (the baseline) and again at the end, the master's child processes, open file
descriptors, synkhronos entries in /dev/shm and resident set size, whose growth over
the cycles is set beside plain PyTensor building the same graph as often in a fresh
process. The full run (100 000 calls, 50 cycles) takes a minute.

    python benchmarks/soak.py [--calls 100000] [--cycles 50] [--n 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's tests/
from tests.support.soak import soak  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(soak(args.calls, args.cycles, args.n), indent=2))


if __name__ == "__main__":
    main()
