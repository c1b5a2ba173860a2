"""The snippet on the front page: a serial PyTensor function, run on every core."""

import numpy as np
import pytensor
import pytensor.tensor as pt

import synkhronos as synk

synk.fork()                                 # first: one process per core
x = pt.dmatrix("x")
z = (x**2).sum(axis=1).mean()               # the mean over rows of each row's sum of squares
f = synk.function(inputs=[x], outputs=z)    # was: pytensor.function([x], z)
synk.distribute()                           # ship f to the workers

x_value = np.arange(12.0).reshape(6, 2)
result = f(x_value)                         # each process takes its rows; "avg" combines them
plain = pytensor.function([x], z)(x_value)  # the serial function, for comparison
print(f"parallel {result:.4f}, serial {plain:.4f}")
assert np.allclose(result, plain)
synk.close()                                # also runs at interpreter exit
