"""Time-major sequences, per-row outputs and set_value in the master (three processes).

A recurrence over ``(time, batch)`` data: each process must run whole sequences, so
the inputs are split along their batch axis (``in_axes=1``); the prediction for each
sequence comes back gathered in order; a flag set in the master reaches every process.
"""

import warnings

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(3)
x, mask = pt.dmatrix("x"), pt.dmatrix("mask")  # (time, batch)
scale = pytensor.shared(np.float64(1.0), name="scale")


def step(x_t, m_t, h):  # one time step of every sequence
    return m_t * pt.tanh(scale * x_t + 0.5 * h) + (1 - m_t) * h


# (PyTensor 2 returns (outputs, updates); PyTensor 3 warns that it will stop)
warnings.filterwarnings("ignore", "Scan return signature", DeprecationWarning)
h = pytensor.scan(step, sequences=[x, mask], outputs_info=[pt.zeros_like(x[0])])
h = h[0] if isinstance(h, (list, tuple)) else h
last = h[-1]  # the final state of each sequence: one entry per row
try:
    synk.function([x, mask], last)  # split along time: each process would run some steps
except ValueError as exc:
    print("refused:", str(exc)[:76], "...")
f = synk.function([x, mask], [last, (last.sum(), "sum")], in_axes=1)  # rows: the batch
serial = pytensor.function([x, mask], [last, last.sum()])
synk.distribute()

rng = np.random.default_rng(0)
data = rng.normal(size=(6, 8))  # 6 time steps of 8 sequences
lengths = np.array([6, 3, 5, 1, 6, 2, 4, 6])
masks = (np.arange(6)[:, None] < lengths).astype(float)
states, total = f(data, masks)
print("per-sequence output:", states.shape, "gathered in order:",
      np.allclose(states, serial(data, masks)[0]))
scale.set_value(2.0)  # in the master only: sent to every process before the next call
states, total = f(data, masks)
print("after set_value:", np.isclose(total, serial(data, masks)[1]))
synk.close()
