"""``python -m synkhronos`` and the ``synkhronos`` console script (SPEC 10).

The command line only: it parses the arguments, asks ``_report`` for the environment
report and (with ``--check``) the self-check, and prints them as text or as one JSON
object. Exit status: 0, or 1 when the check found something wrong.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import _report

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="synkhronos",
        description="Say what synk.fork() would use on this machine; with --check, "
                    "fork a session and check that it computes correctly.",
    )
    parser.add_argument(
        "--check", action="store_true",
        help="fork a session (SYNK_N_PARALLEL processes, else one per usable core), run "
             "a function and an all_reduce, compare them with numpy, close; exit 1 if "
             "anything is wrong",
    )
    parser.add_argument("-n", "--n-parallel", type=int, default=None, metavar="N",
                        help="processes for --check (default: what fork() chooses)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of text")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    report = _report.gather()
    result = _report.check(args.n_parallel) if args.check else None
    if args.json:
        if result is not None:
            report["check"] = result
        print(json.dumps(report, indent=2))
    else:
        print(_report.format_report(report))
        if result is not None:
            print(_report.format_check(result))
    return 0 if result is None or result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
