"""One figure of ``report.html``: a PNG with its caption, drawn the same way every time.

Purpose: the ``ReportFigure`` record, the figure size, the SIMULATED/measured labels, the message-size axis
and the PNG encoding without a date or version chunk (the same study gives the same bytes).

Non-goals: what a figure shows (``figures``, ``knobs``) and the page around it (``page``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MEASURED = "measured"
FIG_W, FIG_H = 6.2, 3.5  # inches at 90 dpi: two figures side by side on a laptop screen
SIMULATED = "SIMULATED"


@dataclass(frozen=True)
class ReportFigure:
    """One PNG of the report: its file name under ``plots/``, its caption, and its bytes."""

    name: str
    caption: str
    png: bytes
    section: str  # speedup | busbw | knobs | history | topology


def encode_png(fig: Figure) -> bytes:
    # Here, not at the top: the page's records load without the drawing library (a second of start-up that
    # the controller would pay for every table it renders); whoever made ``fig`` has loaded it already.
    import matplotlib.pyplot as plt  # noqa: PLC0415

    buffer = io.BytesIO()
    fig.tight_layout()
    # No "Software"/date chunk: the same study gives the same bytes.
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def size_label(size: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size:g}"


def size_axis(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415 - see encode_png

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
    ax.set_xlabel("message size (bytes)")
