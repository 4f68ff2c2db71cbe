"""``llm-bench power``: power-limit sweeps that always restore the limits (``limits.py``), what is measured
at each limit (``measure.py``), and the command's flow from settings to results file (``command.py``)."""
