"""What the test suite and ``benchmarks/`` both run, kept out of the wheel: the soak
(``tests/faults/test_soak.py`` short, ``benchmarks/soak.py`` long), launching under
``mpiexec`` so that one machine looks like several (``tests/mpi``,
``benchmarks/mpi_collectives.py``) and the NCCL probe (``benchmarks/device_check.py``).
The benchmarks put the checkout's root on ``sys.path`` to import them."""
