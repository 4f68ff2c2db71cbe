"""The boilerplate every chart shares: a file type check, a headless backend, saving, closing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FORMATS = (".png", ".svg")


class ChartError(ValueError):
    """A chart cannot be drawn (wrong file type, nothing to draw); the message says why."""


def check_chart_path(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise ChartError(f"chart file {path} must end in .png or .svg")


@contextmanager
def figure(path: Path, *, dpi: int = 110, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``plt.subplots(**subplots)`` on the headless backend; the figure is written to ``path``
    (PNG at ``dpi``, or SVG) when the block ends without an error, and always closed."""
    check_chart_path(path)
    import matplotlib  # noqa: PLC0415 - charts are optional; keep the CLI quick to start

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi if path.suffix.lower() == ".png" else None)
    finally:
        plt.close(fig)
