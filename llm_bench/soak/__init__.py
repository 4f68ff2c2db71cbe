"""``llm-bench soak``: bounded mixed traffic against one model (``traffic.py``: the mix, the sending, the
figures and their drift), its request kinds beyond a plain streamed prompt (``requests.py``), its
report (``report.py``: headline, Markdown, chart) and the command's flow (``command.py``: watches,
the results file kept after every request, what makes it fail)."""
