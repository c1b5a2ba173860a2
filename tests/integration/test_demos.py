"""Smoke runs of every demo, each as its own Python process, at tiny sizes.

Each demo checks its own results against plain PyTensor or numpy and exits with a
non-zero status if a check fails, so a run passes when the process exits with 0,
prints its closing line, and leaves no shared-memory segment behind. The training
demos run a few epochs on scikit-learn's bundled digits and must reach their
default ``--min-accuracy`` (90% on validation); the CNN also runs on a small
``mnist.npz`` written here (digits upscaled to 28x28), since no test downloads
anything.

The deep-learning demos need scikit-learn and tqdm, and the CNN needs jax: all are
in the ``test`` extra, and a run without them skips those tests and says why.
Time on a busy 2-core machine: about 45 s in all on a warm PyTensor compile cache,
about 90 s on a cold one (the MLP demos compile their Numba graphs, about 40 s;
the CNN uses JAX, about 10 s cold or warm).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import segments_of

pytestmark = pytest.mark.timeout(330)

ROOT = Path(__file__).resolve().parents[2]
DEMOS = ROOT / "demos"
DEEP_LEARNING = ("sklearn", "tqdm")
RESULT = r"validation accuracy (\d+\.\d+)%"


def run_demo(script: str, *flags: str, needs: tuple[str, ...] = ()) -> str:
    """Run ``demos/<script> <flags>``; return its stdout after checking it succeeded."""
    absent = [name for name in needs if importlib.util.find_spec(name) is None]
    if absent:
        pytest.skip(f"demos/{script} needs {', '.join(absent)}, not installed here "
                    "(pip install -e .[test] installs it)")
    process = subprocess.Popen([sys.executable, str(DEMOS / script), *flags], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()  # its workers exit by themselves when their master dies
        out, err = process.communicate()
        pytest.fail(f"demos/{script} ran past 300 s\nstdout:\n{out}\nstderr:\n{err[-3000:]}")
    assert process.returncode == 0, (
        f"demos/{script} {' '.join(flags)} exited with {process.returncode}\n"
        f"stdout:\n{out}\nstderr:\n{err[-3000:]}")
    assert segments_of(process.pid) == [], f"demos/{script} left shared memory behind"
    return out


def closing_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize(("script", "n"), [("demo_1.py", 3), ("demo_2.py", 2),
                                           ("demo_3.py", 3)])
def test_tutorial_demo(script: str, n: int) -> None:
    out = run_demo(script, "--n-parallel", str(n))
    number = script.removeprefix("demo_").removesuffix(".py")
    assert closing_line(out) == f"demo {number} passed on {n} processes"


@pytest.mark.parametrize(("script", "n"), [("train_mnist_cpu_data", 3),
                                           ("train_mnist_scattered_data", 2)])
def test_mnist_demo(script: str, n: int) -> None:
    out = run_demo(f"mnist/{script}.py", "--n-parallel", str(n), "--epochs", "3",
                   "--batch-size", "64", needs=DEEP_LEARNING)
    line = closing_line(out)
    match = re.fullmatch(rf"{script} passed on {n} processes: {RESULT} after 3 epochs, "
                         r"[\d,]+ samples/s", line)
    assert match, line
    assert float(match.group(1)) >= 90.0
    assert len(re.findall(r"^epoch +\d+: ", out, flags=re.MULTILINE)) == 3


def test_cnn_demo() -> None:
    out = run_demo("cnn/train_cnn.py", "--n-parallel", "2", "--epochs", "3",
                   "--batch-size", "64", needs=DEEP_LEARNING + ("jax",))
    line = closing_line(out)
    match = re.fullmatch(rf"train_cnn passed on 2 processes: {RESULT} after 3 epochs; "
                         r"first step (\d+\.\d) s after start; [\d,]+ samples/s", line)
    assert match, line
    assert float(match.group(1)) >= 90.0
    assert float(match.group(2)) < 60.0  # JAX compiles the network in seconds


def write_mnist_npz(path: Path) -> Path:
    """An ``mnist.npz`` made of the digits, upscaled to 28x28 uint8 images."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))) * (255 / 16)
    images, labels = images.round().astype(np.uint8), digits.target.astype(np.uint8)
    np.savez(path, x_train=images[:1600], y_train=labels[:1600], x_test=images[1600:],
             y_test=labels[1600:])
    return path


def test_cnn_demo_on_an_mnist_file(tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("writing the test's mnist.npz needs scikit-learn (pip install -e .[test])")
    mnist = write_mnist_npz(tmp_path / "mnist.npz")
    out = run_demo("cnn/train_cnn.py", "--n-parallel", "2", "--epochs", "2", "--mnist",
                   str(mnist), needs=DEEP_LEARNING + ("jax",))
    assert out.startswith("MNIST: 1280 training and 320 validation images of 28x28, float32")
    assert re.match(rf"train_cnn passed on 2 processes: {RESULT} after 2 epochs",
                    closing_line(out))


def test_data_loader(tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("the digits data set needs scikit-learn (pip install -e .[test])")
    spec = importlib.util.spec_from_file_location("demos_data", DEMOS / "data.py")
    module = sys.modules["demos_data"] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["demos_data"]
    load = module.load
    digits = load()
    assert (digits.x_train.shape, digits.x_val.shape) == ((1437, 64), (360, 64))
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert 0.0 <= digits.x_train.min() and digits.x_train.max() <= 1.0
    images = load(images=True, dtype="float64")
    assert images.x_val.shape == (360, 8, 8, 1) and images.x_val.dtype == np.float64
    np.testing.assert_array_equal(images.y_val, digits.y_val)  # the same split
    mnist = load(str(write_mnist_npz(tmp_path / "mnist.npz")))
    assert (mnist.x_train.shape, mnist.x_val.shape) == ((1280, 784), (320, 784))
    assert mnist.image_shape == (28, 28, 1) and mnist.x_train.max() == 1.0
