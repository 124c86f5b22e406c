"""What the pictures share: their colours, their units (ms, GiB) and the SVG elements the mesh and cost
pictures are written with."""

from __future__ import annotations

import html

#: Light fills that keep black text readable, told apart by colour-blind readers (ColorBrewer Set3).
PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
    "#d9d9d9",
)
REPLICATED = "#f4f4f4"  # an op replicated on every axis: the plain default
FORWARD = "#d62728"  # an edge crossing a forward collective
BACKWARD = "#1f77b4"  # an edge crossing a collective of the backward pass
AXIS_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")  # communication per mesh axis in the chart
COMPUTE = "#4c78a8"
#: Rank fills by coordinate on the mesh's first axis, apart from the placement colours (ColorBrewer Pastel1).
RANK_PALETTE = ("#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec")


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def gib(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**28 else f"{nbytes / 2**20:.1f} MiB"


def text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12, weight: str = "normal") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" font-weight="{weight}">'
        f"{html.escape(text)}</text>"
    )


def rect(x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> str:
    tip = f"<title>{html.escape(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}" {extra}>{tip}</rect>'


def svg(width: float, height: float, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" role="img">'
        f"<title>{html.escape(title)}</title>" + "".join(body) + "</svg>"
    )
