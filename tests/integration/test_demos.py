"""Smoke runs of every demo, each as its own Python process, at tiny sizes.

Each demo checks its own results against the plain PyTensor function (or numpy) and
exits with a non-zero status if a check fails, so a run passes when the process
exits with 0, prints its closing line, and leaves no shared-memory segment behind.

- ``demo_1.py`` .. ``demo_5.py`` at 2 or 3 processes (3: uneven splits);
- ``lasagne_mnist/run_lasagne_demos.py`` runs the serial program and both
  data-parallel ones with a small dropout-free MLP, for which ``train_mnist_cpu_data``
  must follow the serial program to float32 rounding; ``train_mnist_cpu_data`` also
  runs an MLP with dropout on a small ``mnist.npz`` written here (the digits upscaled
  to 28x28; no test downloads);
- ``tutorials/logistic_sgd.py``, ``mlp.py`` and ``convolutional_mlp.py`` (the Deep
  Learning Tutorials' ports) against their serial twins, line for line, on the digits
  and on an ``mnist.npz``; and each differs from its twin only by synkhronos's lines
  (LeNet also by the reshape that reads the rows' count from ``x.shape[0]``); the
  tutorials' LSTM (``tutorials/lstm.py``: time-major sequences scattered with
  ``in_axes``, ADADELTA's gradients all-reduced) likewise, on synthetic data. LeNet
  runs on PyTensor's C backend (``PYTENSOR_FLAGS=linker=cvm``): Numba's first
  compilation of its gradient takes minutes on two cores, the C backend's well under
  one, and what is checked is the port, not the backend;
- ``resnet/train_resnet.py`` and its serial twin: a two-stage ResNet with JAX, a few
  steps (the default four-stage net takes JAX a minute to compile);
- the MNIST programs and the ResNet again with ``--device gpu`` on the CPU stand-in
  (``SYNKHRONOS_GPU_PLATFORM=cpu``: JAX's CPU platform in every process), with the
  checks of their CPU runs: the exact run follows the serial program (here also on
  JAX), parameters are equal in every process, validation equals the plain function;
- the Lasagne-style layers (``demos/lasagne_like``) against numpy, and the data
  loader, in this process (no fork, no compilation: PyTensor's Python mode).

The training demos need scikit-learn and the ResNet needs jax: both are in the
``test`` extra, and a run without them skips those tests and says why.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import segments_of

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
DEMOS = ROOT / "demos"


def needs(*modules: str) -> None:
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if absent:
        pytest.skip(f"needs {', '.join(absent)}, not installed here "
                    "(pip install -e .[test] installs it)")


STAND_IN = {"SYNKHRONOS_GPU_PLATFORM": "cpu"}  # device="gpu" on JAX's CPU platform


def run_demo(script: str, *flags: str, timeout: int = 420, stderr: list | None = None,
             env: dict | None = None) -> str:
    """Run ``demos/<script> <flags>`` (with ``env`` added to the environment); return its
    stdout after checking it succeeded (its stderr, where the progress bars go, is
    appended to ``stderr`` if given)."""
    process = subprocess.Popen([sys.executable, str(DEMOS / script), *flags], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, **(env or {})))
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # its workers exit by themselves when their master dies
        out, err = process.communicate()
        pytest.fail(f"demos/{script} ran past {timeout} s\nstdout:\n{out}\n"
                    f"stderr:\n{err[-3000:]}")
    assert process.returncode == 0, (
        f"demos/{script} {' '.join(flags)} exited with {process.returncode}\n"
        f"stdout:\n{out}\nstderr:\n{err[-3000:]}")
    assert segments_of(process.pid) == [], f"demos/{script} left shared memory behind"
    if stderr is not None:
        stderr.append(err)
    return out


def closing_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def result_of(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("result: ")]
    assert lines, f"no result line in:\n{out}"
    return json.loads(lines[-1].removeprefix("result: "))


@pytest.mark.parametrize(("number", "n"), [(1, 3), (2, 2), (3, 3), (4, 3), (5, 2)])
def test_tutorial_demo(number: int, n: int) -> None:
    out = run_demo(f"demo_{number}.py", "--n-parallel", str(n))
    assert closing_line(out) == f"demo {number} passed on {n} processes"


def test_run_lasagne_demos_matches_serial() -> None:
    needs("sklearn")
    err: list[str] = []
    out = run_demo("lasagne_mnist/run_lasagne_demos.py", "custom_mlp:1,64,0,0", "48", "3",
                   "--n-parallel", "3", "--min-accuracy", "0.8", "--quiet", stderr=err)
    assert "run_lasagne_demos passed" in closing_line(out), out
    assert "epoch 1/3" not in err[0]  # --quiet reached the three programs: no bar
    assert re.search(r"^train_mnist_cpu_data +3 .* exact$", out, flags=re.MULTILINE), out
    assert re.search(r"^train_mnist_gpu_data +3 .* by accuracy$", out, flags=re.MULTILINE)
    pids = [int(pid) for pid in re.findall(r"exit status 0, pid (\d+)", out)]
    assert len(pids) == 3, out
    for pid in pids:
        assert segments_of(pid) == [], f"program {pid} left shared memory behind"
    results = {r["script"]: r for r in map(json.loads, re.findall(r"^result: (.*)$", out,
                                                                   flags=re.MULTILINE))}
    serial, parallel = results["train_mnist_pytensor"], results["train_mnist_cpu_data"]
    assert parallel["n_parallel"] == 3
    np.testing.assert_allclose(parallel["val_loss"], serial["val_loss"], rtol=1e-3)


def test_run_lasagne_demos_on_the_gpu_stand_in() -> None:
    needs("sklearn", "jax")
    out = run_demo("lasagne_mnist/run_lasagne_demos.py", "custom_mlp:1,32,0,0", "48", "2",
                   "--n-parallel", "2", "--device", "gpu", "--min-accuracy", "0.6",
                   env=STAND_IN)
    assert "run_lasagne_demos passed" in closing_line(out), out
    assert re.search(r"^train_mnist_cpu_data +2 .* exact$", out, flags=re.MULTILINE), out
    assert re.search(r"^train_mnist_gpu_data +2 .* by accuracy$", out, flags=re.MULTILINE)
    assert "Checked: parameters equal in all processes" in out  # train_mnist_cpu_data
    assert "Checked: scattered rows, parameters equal in all processes" in out  # gpu_data
    results = {r["script"]: r for r in map(json.loads, re.findall(r"^result: (.*)$", out,
                                                                   flags=re.MULTILINE))}
    serial, parallel = results["train_mnist_pytensor"], results["train_mnist_cpu_data"]
    assert parallel["n_parallel"] == results["train_mnist_gpu_data"]["n_parallel"] == 2
    np.testing.assert_allclose(parallel["val_loss"], serial["val_loss"], rtol=1e-3)


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


def test_cpu_data_demo_with_dropout_on_an_mnist_file(tmp_path: Path) -> None:
    """With a progress bar (on stderr) and --plot: the curves as PNG, and beside them
    the same numbers and the printed result as JSON."""
    needs("sklearn", "tqdm", "matplotlib")
    mnist = write_mnist_npz(tmp_path / "mnist.npz")
    err: list[str] = []
    png = tmp_path / "plots" / "run.png"
    out = run_demo("lasagne_mnist/train_mnist_cpu_data.py", "custom_mlp:1,64,0.2,0.5", "60",
                   "2", "--n-parallel", "2", "--mnist", str(mnist), "--min-accuracy", "0.5",
                   "--plot", str(png), stderr=err)
    assert out.startswith("MNIST: 1280 training, 320 validation and 197 test images of 28x28")
    assert "Checked: parameters equal in all processes" in out
    result = result_of(out)
    assert result["epochs"] == 2
    # the bar counts each epoch's 1280 // 60 = 21 steps
    assert "epoch 1/2" in err[0] and "epoch 2/2" in err[0] and "/21" in err[0], err[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads(png.with_suffix(".json").read_text())
    assert record["result"] == result
    assert [row["epoch"] for row in record["epochs"]] == [1, 2]
    assert record["epochs"][-1]["val_acc"] == pytest.approx(result["val_acc"])


def test_resnet_demo_and_serial_twin(tmp_path: Path) -> None:
    needs("sklearn", "jax", "tqdm", "matplotlib")
    tiny = ["--epochs", "1", "--max-steps", "3", "--blocks", "1,1", "--width", "4",
            "--image-size", "16"]  # two stages: JAX compiles it in seconds
    err: list[str] = []
    out = run_demo("resnet/train_resnet.py", "--n-parallel", "2", *tiny,
                   "--plot", str(tmp_path / "resnet.png"), stderr=err)
    assert re.fullmatch(r"train_resnet passed on 2 processes: validation accuracy "
                        r"\d+\.\d+% after 1 epochs; .*", closing_line(out)), out
    assert "Checked: parameters and running averages equal" in out
    assert "epoch 0/1" in err[0] and "/3" in err[0], err[0]  # the bar stops at --max-steps
    record = json.loads((tmp_path / "resnet.json").read_text())
    assert record["result"]["n_parallel"] == 2 and len(record["epochs"]) == 1
    assert (tmp_path / "resnet.png").stat().st_size > 0
    # the twin at one stage: its own lines do not depend on the depth, and the stages'
    # code (demos/resnet/common.py, shared) ran above at two; JAX compiles half the net
    one_stage = ["--epochs", "1", "--max-steps", "2", "--blocks", "1", "--width", "2",
                 "--image-size", "16"]
    out = run_demo("resnet/train_resnet_pytensor.py", *one_stage, "--quiet", stderr=err)
    assert closing_line(out).startswith("train_resnet_pytensor passed"), out
    assert "epoch 0/1" not in err[1]


TUTORIAL_RUNS = [("logistic_sgd", ("--n-epochs", "2"), 2),
                 ("logistic_sgd", ("--n-epochs", "1"), 3),
                 ("mlp", ("--n-epochs", "1", "--n-hidden", "30"), 2)]


@pytest.mark.parametrize(("script", "flags", "n"), TUTORIAL_RUNS,
                         ids=[f"{s}-n{n}" for s, _, n in TUTORIAL_RUNS])
def test_deep_learning_tutorials_print_the_serial_numbers(script, flags, n) -> None:
    """The minibatches (600 and 20 rows) split evenly: the same lines, digit for digit."""
    needs("sklearn")
    serial = run_demo(f"tutorials/{script}_serial.py", *flags)
    parallel = run_demo(f"tutorials/{script}.py", *flags, "--n-parallel", str(n))
    assert "validation error" in serial and "Optimization complete" in serial, serial
    assert parallel.splitlines() == serial.splitlines()


def test_logistic_sgd_on_an_mnist_file(tmp_path: Path) -> None:
    needs("sklearn")
    mnist = str(write_mnist_npz(tmp_path / "mnist.npz"))
    flags = ("--n-epochs", "2", "--batch-size", "160", "--dataset", mnist)
    serial = run_demo("tutorials/logistic_sgd_serial.py", *flags)
    parallel = run_demo("tutorials/logistic_sgd.py", *flags, "--n-parallel", "2")
    assert "minibatch 8/8, validation error" in serial, serial  # 1280 rows of 28x28
    assert parallel.splitlines() == serial.splitlines()


def test_lenet_port_prints_the_serial_numbers(tmp_path: Path) -> None:
    """The tutorials' LeNet on 1280 training rows of 28x28 (the digits enlarged, as
    an ``mnist.npz``), minibatches of 40 (20 per process), small layers, two epochs:
    the same lines, digit for digit, the cost to 12 decimals (the two runs differ
    around the 16th)."""
    needs("sklearn")
    import pytensor

    if not pytensor.config.cxx:
        pytest.skip("needs a C compiler for PyTensor's C backend (Numba's first "
                    "compilation of LeNet's gradient takes minutes)")
    mnist = str(write_mnist_npz(tmp_path / "mnist.npz"))
    flags = ("--n-epochs", "2", "--batch-size", "40", "--nkerns", "4,8", "--dataset", mnist)
    flags_env = os.environ.get("PYTENSOR_FLAGS", "")
    env = {"PYTENSOR_FLAGS": f"{flags_env},linker=cvm" if flags_env else "linker=cvm"}
    serial = run_demo("tutorials/convolutional_mlp_serial.py", *flags, env=env)
    parallel = run_demo("tutorials/convolutional_mlp.py", *flags, "--n-parallel", "2",
                        env=env)
    assert "epoch 2, minibatch 32/32, validation error" in serial, serial
    assert "Optimization complete." in serial, serial
    assert parallel.splitlines() == serial.splitlines()


def test_tutorial_data_enlarges_the_digits_for_lenet() -> None:
    """LeNet's default data: each digit's pixel repeated 3x3 inside a blank border of 2,
    the same images in the same order as the 8x8 set."""
    needs("sklearn")
    sys.path.insert(0, str(DEMOS / "tutorials"))
    try:
        import tutorial_data
    finally:
        sys.path.remove(str(DEMOS / "tutorials"))
    small, n_small = tutorial_data.load_data()
    large, n_large = tutorial_data.load_data(side=28)
    assert (n_small, n_large) == (64, 784)
    for (x8, y8), (x28, y28) in zip(small, large, strict=True):
        images = x28.get_value().reshape(-1, 28, 28)
        np.testing.assert_array_equal(images[:, 2:26:3, 2:26:3],
                                      x8.get_value().reshape(-1, 8, 8))
        assert images[:, :2].max() == images[:, 26:].max() == 0.0
        assert images[:, :, :2].max() == images[:, :, 26:].max() == 0.0
        labels = [y.owner.inputs[0].get_value() for y in (y28, y8)]  # under the int cast
        np.testing.assert_array_equal(*labels)


@pytest.mark.parametrize("script", ["logistic_sgd", "mlp", "convolutional_mlp"])
def test_tutorial_ports_differ_from_their_serial_twins_by_synk_lines(script) -> None:
    """Apart from the docstring, the data-parallel program is the serial one plus
    ``import synkhronos``, ``fork``, ``distribute``, ``all_reduce`` and ``synk.function``
    for ``pytensor.function`` (and the ``--n-parallel`` flag): eight lines at most.
    mlp.py and convolutional_mlp.py import the layers of the other ports from their
    data-parallel files; LeNet's reshape reads the rows' count from ``x`` where the
    tutorial wrote ``batch_size`` (the comment above it says why)."""
    import difflib

    def code(name: str) -> list[str]:
        text = (DEMOS / "tutorials" / name).read_text()
        return text.split('"""', 2)[2].splitlines()  # after the module docstring

    serial, parallel = code(f"{script}_serial.py"), code(f"{script}.py")
    changed = [line for line in difflib.unified_diff(serial, parallel, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    synk_line = re.compile(r"^[+-](import synkhronos as synk|.*\bsynk\.\w+\(.*"
                           r"|.*= pytensor\.function\(|.*\"--n-parallel\".*)$")
    layers = re.compile(r"^[+-]from (logistic_sgd|mlp)(_serial)? import "
                        r"(LogisticRegression|HiddenLayer)$")
    reshape = {"-    layer0_input = x.reshape((batch_size, 1, 28, 28))",
               "+    layer0_input = x.reshape((x.shape[0], 1, 28, 28))"}
    other = [line for line in changed if not (
        synk_line.match(line) or layers.match(line) or not line[1:].strip()
        or line[1:].lstrip().startswith("#") or line in reshape)]
    assert other == []
    added = [line for line in changed if line.startswith("+") and synk_line.match(line)]
    assert len(added) <= 8, added
    if script == "convolutional_mlp":
        assert reshape <= set(changed)


# Validation every 30 updates of 16 sequences, two epochs (238 updates) of the synthetic
# IMDB: the LSTM learns in the second, and its best validation (update 150) is not its
# last, so the parameters restored at the end are not those the processes hold.
LSTM_FLAGS = ("--n-epochs", "2", "--dim-proj", "16", "--valid-freq", "30",
              "--disp-freq", "30")


def test_deep_learning_tutorials_print_the_serial_numbers_lstm() -> None:
    """The tutorials' LSTM (``lstm.py``) beside its serial twin: time-major minibatches
    scattered along their sequence axis (``in_axes``), the gradients all-reduced
    between ADADELTA's two functions, predictions gathered; 16 sequences split evenly
    over 2: the same lines, digit for digit, the costs to 10 decimals. The closing
    errors are those of the best validation, not the last: the parameters that
    ``zipp`` restores with ``set_value`` in the master reached the worker. On
    PyTensor's C backend where there is a compiler, as LeNet: on a cold cache it
    compiles the two programs in about a minute on two cores, Numba in three and a
    half. (The name puts the test with the tutorials' other runs in
    ``tests/conftest.py``'s ``TIERS``.)"""
    import pytensor

    env = None
    if pytensor.config.cxx:
        flags_env = os.environ.get("PYTENSOR_FLAGS", "")
        env = {"PYTENSOR_FLAGS": f"{flags_env},linker=cvm" if flags_env else "linker=cvm"}
    serial = run_demo("tutorials/lstm_serial.py", *LSTM_FLAGS, env=env)
    parallel = run_demo("tutorials/lstm.py", *LSTM_FLAGS, "--n-parallel", "2", env=env)
    assert parallel.splitlines() == serial.splitlines()
    errors = [line for line in serial.splitlines() if line.startswith("Train ")]
    assert len(errors) == 238 // 30 + 1, serial  # each validation, then the closing line
    assert min(float(line.split()[1]) for line in errors) < 0.1, serial  # it learned
    *validations, closing = errors
    assert closing in validations and closing != validations[-1], serial


def _lstm_serial_form(tree):
    """``lstm.py``'s syntax tree with synkhronos's lines taken out: ``import
    synkhronos``, the statements ``synk.fork/distribute/all_reduce(...)``, the
    ``--n-parallel`` flag; each ``synk.function(inputs, outputs, bcast_inputs=b,
    in_axes=a, ...)`` as ``pytensor.function(inputs + b, outputs, ...)``, an output
    ``(out, "gather")`` as ``out``."""
    class Serial(ast.NodeTransformer):
        def visit_Import(self, node):
            return None if [a.name for a in node.names] == ["synkhronos"] else node

        def visit_Expr(self, node):
            call = node.value
            if isinstance(call, ast.Call):
                text = ast.unparse(call)
                if text.startswith("synk.") or "'--n-parallel'" in text:
                    return None
            return self.generic_visit(node)

        def visit_Call(self, node):
            self.generic_visit(node)
            if ast.unparse(node.func) != "synk.function":
                return node
            node.func = ast.parse("pytensor.function", mode="eval").body
            keywords = {k.arg: k for k in node.keywords}
            if "bcast_inputs" in keywords:
                node.args[0].elts += keywords["bcast_inputs"].value.elts
            node.keywords = [k for k in node.keywords
                             if k.arg not in ("bcast_inputs", "in_axes")]
            out = node.args[1]
            if (isinstance(out, ast.Tuple) and len(out.elts) == 2
                    and isinstance(out.elts[1], ast.Constant) and out.elts[1].value == "gather"):
                node.args[1] = out.elts[0]
            return node

    return Serial().visit(tree)


def test_lstm_port_differs_from_its_serial_twin_by_synk_lines() -> None:
    """Apart from the docstring, ``lstm.py`` is ``lstm_serial.py`` with synkhronos's
    lines added (``_lstm_serial_form`` takes them out again): ``import synkhronos``,
    ``fork``, ``distribute``, ``all_reduce``, ``synk.function`` for
    ``pytensor.function`` with ``in_axes``, ``bcast_inputs`` and ``"gather"``, and the
    ``--n-parallel`` flag. The syntax trees are compared, so line breaks do not count."""

    def tree(name: str) -> ast.Module:
        module = ast.parse((DEMOS / "tutorials" / name).read_text())
        module.body = module.body[1:]  # the docstring
        return module

    parallel = tree("lstm.py")
    text = ast.unparse(parallel)
    assert text.count("synk.function(") == 4 and text.count("in_axes=") == 3
    for line in ("synk.fork(", "synk.distribute()", "synk.all_reduce(gshared, op='sum')"):
        assert line in text
    assert ast.dump(_lstm_serial_form(parallel)) == ast.dump(tree("lstm_serial.py"))


def test_resnet_demo_on_the_gpu_stand_in() -> None:
    needs("sklearn", "jax")
    tiny = ["--epochs", "1", "--max-steps", "2", "--blocks", "1", "--width", "2",
            "--image-size", "16"]  # one stage: the smallest net the demo builds
    out = run_demo("resnet/train_resnet.py", "--n-parallel", "2", "--device", "gpu", *tiny,
                   env=STAND_IN)
    assert re.fullmatch(r"train_resnet passed on 2 processes: validation accuracy "
                        r"\d+\.\d+% after 1 epochs; .*", closing_line(out)), out
    assert "Checked: parameters and running averages equal" in out


def _import_from_demos(name: str):
    """A module of ``demos/`` (``lasagne_like``, ``data``), imported under a private name."""
    path = DEMOS / name / "__init__.py" if (DEMOS / name).is_dir() else DEMOS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"demos_{name}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _conv_reference(x, W, stride, pad, flip):
    if flip:
        W = W[:, :, ::-1, ::-1]
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = W.shape[2:]
    oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], W.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,fchw->nf", patch, W)
    return out


def test_lasagne_like_layers_against_numpy() -> None:
    import pytensor
    import pytensor.tensor as pt

    lasagne = _import_from_demos("lasagne_like")
    layers = lasagne.layers
    rng = np.random.default_rng(0)
    x = pt.tensor4("x", dtype="float64")
    x_dat = rng.normal(size=(3, 2, 7, 7))
    l_in = layers.InputLayer((None, 2, 7, 7), x)

    def run(output):
        return pytensor.function([x], output, mode="FAST_COMPILE")(x_dat)

    for size, stride, pad, flip in [(3, 1, 0, True), (3, 2, 1, False), (1, 2, 0, False)]:
        conv = layers.Conv2DLayer(l_in, 4, size, stride=stride, pad=pad, b=None,
                                  nonlinearity=None, flip_filters=flip)
        got = run(layers.get_output(conv))
        assert got.shape[1:] == conv.output_shape[1:]
        want = _conv_reference(x_dat, conv.W.get_value(), stride, pad, flip)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    x8 = rng.normal(size=(3, 2, 8, 8))
    l_in8 = layers.InputLayer((None, 2, 8, 8), x)
    pool = layers.Pool2DLayer(l_in8, 3, stride=2, ignore_border=False, mode="max")
    got = pytensor.function([x], layers.get_output(pool), mode="FAST_COMPILE")(x8)
    assert got.shape == (3, 2, 4, 4) == (3, *pool.output_shape[1:])  # windows at 0, 2, 4, 6
    np.testing.assert_array_equal(got[:, :, 3, 3], x8[:, :, 6:, 6:].max(axis=(2, 3)))  # partial
    np.testing.assert_array_equal(got[:, :, 1, 0], x8[:, :, 2:5, :3].max(axis=(2, 3)))
    mean = layers.Pool2DLayer(l_in8, 3, stride=2, ignore_border=False, mode="average_exc_pad")
    got = pytensor.function([x], layers.get_output(mean), mode="FAST_COMPILE")(x8)
    np.testing.assert_allclose(got[:, :, 3, 2], x8[:, :, 6:, 4:7].mean(axis=(2, 3)))
    bn = layers.BatchNormLayer(l_in)
    got = run(layers.get_output(bn))  # training: the batch's statistics per channel
    mu = x_dat.mean(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(got, (x_dat - mu) / np.sqrt(x_dat.var(axis=(0, 2, 3),
                                                                     keepdims=True) + 1e-4))
    np.testing.assert_allclose(bn.mean.get_value(), 0.1 * mu.ravel())  # running average
    run(layers.get_output(bn, deterministic=True))  # validation: no update
    np.testing.assert_allclose(bn.mean.get_value(), 0.1 * mu.ravel())


def test_data_loader(tmp_path: Path) -> None:
    needs("sklearn")
    data = _import_from_demos("data")
    x_train, y_train, x_val, y_val, x_test, y_test = data.load_dataset()
    assert [len(a) for a in (x_train, x_val, x_test)] == [1197, 300, 300]
    assert x_train.shape[1:] == (1, 8, 8) and x_train.dtype == np.float32
    assert y_train.dtype == np.uint8 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    big = data.load_dataset(image_size=32)
    assert big[2].shape == (300, 1, 32, 32)
    np.testing.assert_array_equal(big[2][:, :, ::4, ::4], x_val)  # nearest neighbour
    np.testing.assert_array_equal(big[3], y_val)
    mnist = data.load_dataset(str(write_mnist_npz(tmp_path / "mnist.npz")))
    assert [len(a) for a in mnist[0::2]] == [1280, 320, 197]
    assert mnist[0].shape[1:] == (1, 28, 28) and mnist[0].max() == 1.0
