"""``llm-bench tune``: find the fastest preset that keeps its answers, and print the Nix that adopts it.

``plan.py`` (what to tune: base preset, axes, budget, quality thresholds), ``grid.py`` (axes ->
candidate presets), ``serve.py`` (a temporary router for them; the main router freed and restored),
``search.py`` (screen, rounds, quality gate, resume), ``report.py`` (ranked table, Pareto chart),
``adopt.py`` (the Nix snippet and the re-measuring command).
"""
