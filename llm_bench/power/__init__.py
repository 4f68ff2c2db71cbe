"""``llm-bench power``: power-limit sweeps that always restore the limits (``limits.py``), and what is
measured at each limit (``measure.py``)."""
