"""Interference during the measured runs (issue 55): what else used the engine's cores, the GPUs and the server
while an alias was measured, and whether that disturbed it.

- ``procs.py``: the /proc edge (snapshots of cores and processes, the engine's process tree, the port's listener);
- ``cpu.py``, ``gpu.py``: pure, a window's foreign CPU time on the engine's cores, foreign GPU processes and
  clock reasons;
- ``requests.py``: requests the server answered that were not ours (its own task or request counters);
- ``window.py``: what a window saw, the limits, and the verdict on it (``disturbed by ...``) put on the records;
- ``watch.py``: the thread that reads all of it from just before an alias's first measured request to after its
  last.
"""
