"""``llm-bench capacity``: how many concurrent sessions (closed loop) or how many requests per minute
(open loop) a preset carries while every request still decodes at least Y t/s and gets its first token
within X seconds.

``settings.py`` (the objective and the bounds, ``[capacity]`` in a plan), ``prompts.py`` (the plan's prompt
or a session's turns), ``loops.py`` (the two load generators, one level each), ``search.py`` (doubling, then
bisection), ``records.py`` (per-request records, a level's verdict), ``slots.py`` (the server's own view of
its slots), ``answer.py`` (the sentence and the table), ``chart.py`` (the curve), ``session.py`` (one
capacity run end to end, its results file), ``report.py`` (a results file read back for ``llm-bench report``).
"""
