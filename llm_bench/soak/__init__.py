"""``llm-bench soak``: bounded mixed traffic against one model (``traffic.py``), its request kinds beyond
a plain streamed prompt (``requests.py``)."""
