"""``llm-bench history``: results files followed over time, each step judged against the build before it
(points.py: reading and what a configuration is; steps.py: the verdicts; table.py, chart.py, html.py: the
outputs; command.py: the flow, pruning and skip records)."""
