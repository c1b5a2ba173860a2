"""What the training demos share to show a run: a progress bar and the training curves.

- :func:`add_progress_arguments` adds ``--quiet`` and ``--plot PNG`` to a demo's flags;
- :func:`progress` wraps one epoch's minibatches in a tqdm bar on stderr (stdout keeps
  the demo's own lines, which the tests read); ``--quiet`` turns it off, and then
  tqdm is not imported at all;
- :class:`Curves` collects each epoch's numbers; with ``--plot run.png`` it writes
  them, with the run's final result, to ``run.json`` and draws them (matplotlib, no
  display needed) to ``run.png`` beside it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["add_progress_arguments", "progress", "Curves"]


def add_progress_arguments(parser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar during an epoch")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="draw the training curves to PNG (matplotlib) and write their "
                             "numbers and the final result beside it, as JSON")


def progress(minibatches: Iterable, total: int, args, description: str) -> Iterator:
    """``minibatches``, counted on a progress bar unless ``args.quiet``."""
    if args.quiet:
        yield from minibatches
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="step", leave=False, file=sys.stderr,
              dynamic_ncols=True) as bar:
        for minibatch in minibatches:
            yield minibatch
            bar.update()


class Curves:
    """Each epoch's numbers (losses, accuracies, seconds), for ``--plot``."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.epochs: list[dict[str, float]] = []

    def add(self, **numbers: Any) -> None:
        self.epochs.append({"epoch": len(self.epochs) + 1,
                            **{name: float(value) for name, value in numbers.items()}})

    def write(self, png: Path, result: dict | None = None) -> tuple[Path, Path]:
        """The curves to ``png`` and, with ``result``, to ``png`` with ``.json``."""
        png = Path(png)
        record = png.with_suffix(".json")
        png.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"script": self.script, "epochs": self.epochs,
                                      "result": result}, indent=2) + "\n")
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt

        epochs = [row["epoch"] for row in self.epochs]
        figure, (losses, accuracies) = plt.subplots(1, 2, figsize=(9, 3.5))
        for name in self.epochs[0] if self.epochs else ():
            values = [row[name] for row in self.epochs]
            if "loss" in name:
                losses.plot(epochs, values, marker="o", label=name.replace("_", " "))
            elif "acc" in name:
                accuracies.plot(epochs, values, marker="o", label=name.replace("_", " "))
        for axes, label in ((losses, "loss"), (accuracies, "accuracy")):
            axes.set_xlabel("epoch")
            axes.set_ylabel(label)
            axes.grid(alpha=0.3)
            if axes.lines:
                axes.legend()
        figure.suptitle(self.script)
        figure.tight_layout()
        figure.savefig(png, dpi=100)
        plt.close(figure)
        return png, record
