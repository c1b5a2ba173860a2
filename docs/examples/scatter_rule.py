"""How rows are split across processes, and why "avg" is weighted by rows.

Three processes (on any machine: a process does not need a core of its own).
"""

import numpy as np
import pytensor.tensor as pt

import synkhronos as synk

synk.fork(3)
x = pt.dmatrix("x")
f = synk.function(
    inputs=[x],
    outputs=[
        (x.shape[0], "gather"),  # one number per process that ran: its row count
        (x[:, 0], "gather"),  # the rows themselves, back in their original order
        x[:, 0].mean(),  # "avg": weighted by each process's row count
    ],
)
synk.distribute()

data = synk.data(np.arange(10.0).reshape(10, 1))  # rows 0, 1, ..., 9

counts, rows, mean = f(data)
print("10 rows -> rows per rank:", counts)  # 10 = 3 * 3 + 1: rank 0 gets one extra
assert counts.tolist() == [4, 3, 3]
assert rows.tolist() == list(range(10))
print("weighted avg:", mean)
assert mean == 4.5  # the mean over all rows, as in the serial program

# The original Synkhronos averaged the per-process means with equal weights:
equal_weights = np.mean([np.mean(block) for block in ([0, 1, 2, 3], [4, 5, 6], [7, 8, 9])])
print(f"equal weights would give {equal_weights:.4f}")

counts, rows, mean = f(data, batch=2)  # 2 rows over 3 processes
print("2 rows -> rows per rank:", counts)  # rank 2 has no rows and runs nothing
assert counts.tolist() == [1, 1] and mean == 0.5

shuffled = [7, 2, 9, 0, 5]
counts, rows, mean = f(data, batch=shuffled)  # blocks of the index list: [7, 2] [9, 0] [5]
print("batch", shuffled, "-> gathered", rows)
assert counts.tolist() == [2, 2, 1] and rows.tolist() == shuffled
synk.close()
