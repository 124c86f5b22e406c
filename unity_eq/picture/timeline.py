"""A pipeline plan's schedule as a picture (SVG, or an HTML page around it): one row per stage, a box per
microbatch's forward (blue) and backward (green), time to the right (``explain --format svg|html`` of a plan
written by ``optimize --pipeline``)."""

from __future__ import annotations

from html import escape

from unity_eq.explain.pipeline import SHOWN_MICROBATCHES, summary_rows
from unity_eq.planfile.pipeline import PipelinePlanRecord
from unity_eq.stages.timeline import simulate

__all__ = ["timeline_html", "timeline_svg"]

ROW = 22
LEFT = 90
WIDTH = 900
MAX_ROWS = 64


def timeline_svg(record: PipelinePlanRecord) -> str:
    c = record.chosen
    shown = min(c.microbatches, SHOWN_MICROBATCHES)
    stages = record.stages[:MAX_ROWS]
    slots = simulate([st.seconds for st in record.stages], shown, c.schedule, record.objective == "training")
    end = max(s.end for s in slots)
    height = ROW * (len(stages) + 2)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="4" y="14">first {shown} of {c.microbatches} microbatches, {c.schedule}: '
        f"{end * 1e3:.1f} ms shown (blue forward, green backward)</text>",
    ]
    for row, st in enumerate(stages):
        y = ROW * (row + 1)
        parts.append(f'<text x="4" y="{y + 15}">stage {st.index}</text>')
        parts.append(f'<rect x="{LEFT}" y="{y + 2}" width="{WIDTH}" height="{ROW - 4}" fill="#f2f2f2"/>')
    for slot in slots:
        if slot.stage >= MAX_ROWS:
            continue
        x = LEFT + slot.start / end * WIDTH
        w = max(0.5, (slot.end - slot.start) / end * WIDTH)
        y = ROW * (slot.stage + 1) + 2
        colour = "#5aa469" if slot.backward else "#4a78c2"
        kind = "backward" if slot.backward else "forward"
        parts.append(
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 4}" fill="{colour}" stroke="white" '
            f'stroke-width="0.5"><title>stage {slot.stage}, microbatch {slot.microbatch} {kind}: '
            f"{slot.start * 1e3:.2f}-{slot.end * 1e3:.2f} ms</title></rect>"
        )
    if len(record.stages) > MAX_ROWS:
        parts.append(f'<text x="4" y="{height - 4}">({len(record.stages) - MAX_ROWS} more stages not drawn)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def timeline_html(record: PipelinePlanRecord) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(record))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>pipeline plan for {escape(record.model)}</title>"
        "<style>body{font-family:sans-serif}th{text-align:left;padding-right:1em}</style></head><body>"
        f"<h1>pipeline plan for {escape(record.model)}</h1><table>{rows}</table>{timeline_svg(record)}</body></html>"
    )
