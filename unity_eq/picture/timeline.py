"""A pipeline plan as a picture (SVG, or an HTML page around it): what runs where, and when.

``explain --format svg|html`` of a plan written by ``optimize --pipeline``. The picture has three parts:

* **the stage list**: per stage its pieces and the ONNX nodes they span, its ranks (replicas × tensor group),
  device kind, time per microbatch, memory per device (and whether it recomputes) and its plan directory;
* **the schedule**: one row per stage, a box per microbatch's forward (blue) or backward (green), each
  labelled with its microbatch number where it is wide enough (every box says it on hover);
* **a time axis** under the schedule, in the unit that suits the step (µs, ms or s).

The HTML page adds the summary and, for a lowered plan, each stage's ops under their ONNX node names (read from
the stage's own plan.json), so a user finds them in Netron.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path

from unity_eq.errors import PlanError
from unity_eq.explain.pipeline import SHOWN_MICROBATCHES, duration, size, stage_ranks, summary_rows
from unity_eq.planfile.pipeline import PipelinePlanRecord, StageRecord
from unity_eq.stages.timeline import Slot, simulate

__all__ = ["timeline_html", "timeline_svg"]

ROW = 22
LEFT = 70
WIDTH = 1000
MAX_ROWS = 64
CHAR = 6.4  # average width of a character at font-size 11 (sans-serif), to shorten what would not fit
FORWARD, BACKWARD, IDLE = "#4a78c2", "#5aa469", "#f2f2f2"
#: the stage list's columns: (heading, x where it starts)
COLUMNS = (
    ("stage", 4),
    ("pieces: ONNX nodes", 52),
    ("ranks", 470),
    ("device", 640),
    ("time / microbatch", 720),
    ("memory / device", 840),
    ("directory", 960),
)


def _fit(text: str, width: float) -> str:
    """``text`` shortened in the middle (``a…z``) to about ``width`` pixels."""
    room = max(4, int(width / CHAR))
    if len(text) <= room:
        return text
    head = (room - 1) // 2
    return f"{text[:head]}…{text[len(text) - (room - 1 - head) :]}"


def _text(x: float, y: float, text: str, title: str = "", **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    hover = f"<title>{escape(title)}</title>" if title else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{hover}{escape(text)}</text>'


def _stage_cells(record: PipelinePlanRecord, st: StageRecord) -> list[tuple[str, str]]:
    """Each column's (shown text, full text) for one stage."""
    first, end = st.pieces
    pieces = f"{first}" if end - first == 1 else f"{first}-{end - 1}"
    nodes = st.first_node if st.first_node == st.last_node else f"{st.first_node} … {st.last_node}"
    memory = size(st.total_bytes) + (" (recomputes)" if st.recomputes else "")
    memory_title = (
        f"weights {size(st.weight_bytes)} + gradients/optimizer state {size(st.weight_state_bytes)} + activations "
        f"{size(st.activation_bytes)}"
    )
    directory = f"{st.directory}/" if st.directory else "(plan-only)"
    ranks = stage_ranks(record, st)
    texts = [f"{st.index}", f"{pieces}: {nodes}", ranks, st.device, duration(st.seconds), memory, directory]
    titles = [f"stage {st.index}", f"pieces {pieces}: {nodes}", ranks, st.device, duration(st.seconds)]
    return list(zip(texts, [*titles, memory_title, directory], strict=True))


def _stage_list(record: PipelinePlanRecord, stages: Sequence[StageRecord], top: float) -> list[str]:
    parts = [_text(x, top + 14, heading, font_weight="bold") for heading, x in COLUMNS]
    widths = [nxt - x - 8 for (_, x), (_, nxt) in zip(COLUMNS, [*COLUMNS[1:], ("", LEFT + WIDTH + 16)], strict=True)]
    for row, st in enumerate(stages):
        y = top + ROW * (row + 1) + 14
        for (_, x), width, (shown, full) in zip(COLUMNS, widths, _stage_cells(record, st), strict=True):
            parts.append(_text(x, y, _fit(shown, width), title=full))
    return parts


def _ticks(end: float) -> tuple[list[float], float, str]:
    """Tick positions (seconds) at a round step giving 5-10 ticks over [0, end], the unit's scale and name."""
    scale, unit = (1e6, "µs") if end < 1e-3 else (1e3, "ms") if end < 1.0 else (1.0, "s")
    span = end * scale
    raw = span / 8 if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = int(span / step + 1e-9)
    return [k * step / scale for k in range(count + 1)], scale, unit


def _schedule(record: PipelinePlanRecord, slots: Sequence[Slot], end: float, top: float, rows: int) -> list[str]:
    """The stage rows with their boxes, then the time axis."""
    parts = []
    for row in range(rows):
        y = top + ROW * row
        parts.append(_text(4, y + 15, f"stage {record.stages[row].index}"))
        parts.append(f'<rect x="{LEFT}" y="{y + 2}" width="{WIDTH}" height="{ROW - 4}" fill="{IDLE}"/>')
    for slot in slots:
        if slot.stage >= rows:
            continue
        x = LEFT + slot.start / end * WIDTH
        w = max(0.5, (slot.end - slot.start) / end * WIDTH)
        y = top + ROW * slot.stage + 2
        kind = "backward" if slot.backward else "forward"
        when = f"{duration(slot.start)} to {duration(slot.end)}"
        title = f"stage {slot.stage}, microbatch {slot.microbatch} {kind}: {when}"
        fill = BACKWARD if slot.backward else FORWARD
        parts.append(
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 4}" fill="{fill}" '
            f'stroke="white" stroke-width="0.5"><title>{escape(title)}</title></rect>'
        )
        label = str(slot.microbatch)
        if w >= CHAR * len(label) + 4:
            parts.append(_text(x + w / 2, y + 13, label, fill="white", text_anchor="middle"))
    axis = top + ROW * rows + 4
    ticks, scale, unit = _ticks(end)
    parts.append(f'<line x1="{LEFT}" y1="{axis}" x2="{LEFT + WIDTH}" y2="{axis}" stroke="#555"/>')
    for tick in ticks:
        x = LEFT + tick / end * WIDTH
        parts.append(f'<line x1="{x:.2f}" y1="{axis}" x2="{x:.2f}" y2="{axis + 4}" stroke="#555"/>')
        parts.append(_text(x, axis + 16, f"{tick * scale:g}", text_anchor="middle"))
    parts.append(_text(LEFT + WIDTH, axis + 30, f"time from the step's start ({unit})", text_anchor="end"))
    return parts


def timeline_svg(record: PipelinePlanRecord) -> str:
    """The stage list, the schedule of the first microbatches and its time axis, as one SVG."""
    c = record.chosen
    shown = min(c.microbatches, SHOWN_MICROBATCHES)
    stages = record.stages[:MAX_ROWS]
    slots = simulate([st.seconds for st in record.stages], shown, c.schedule, record.objective == "training")
    end = max(s.end for s in slots)
    list_top = 26.0
    schedule_title = list_top + ROW * (len(stages) + 1) + 12
    schedule_top = schedule_title + 10
    height = schedule_top + ROW * len(stages) + 60
    bubble = f", bubble {c.bubble:.1%}" if c.stages > 1 else ""
    headline = (
        f"pipeline plan for {record.model}: {c.stages} stages × {c.data} replica{'s' if c.data > 1 else ''} × "
        f"tensor groups of {c.tensor} "
        f"on {record.devices} devices ({record.machine}); {c.microbatches} microbatches of {c.microbatch}, "
        f"{c.schedule}; step {duration(c.step_s)}{bubble}"
    )
    legend = (
        f"schedule of the first {shown} of {c.microbatches} microbatches: boxes are microbatches (their number "
        "inside), forward in blue, backward in green; grey is idle"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height:.0f}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        _text(4, 16, headline, font_size="13", font_weight="bold"),
        *_stage_list(record, stages, list_top),
        _text(4, schedule_title, legend),
        *_schedule(record, slots, end, schedule_top, len(stages)),
    ]
    if len(record.stages) > MAX_ROWS:
        parts.append(_text(4, height - 4, f"({len(record.stages) - MAX_ROWS} more stages not drawn)"))
    parts.append("</svg>")
    return "\n".join(parts)


def _stage_ops(plan_dir: Path, st: StageRecord) -> str:
    """A lowered stage's ops, as its plan.json lists them: ONNX node name, op, output tensor."""
    if not st.directory:
        return ""
    path = plan_dir / st.directory / "plan.json"
    try:
        steps = json.loads(path.read_text())["steps"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"{path}: cannot read stage {st.index}'s plan ({exc}). Re-run `unity-eq optimize`.") from None
    rows = [
        "<tr>"
        f"<td>{escape(str(step.get('node') or '—'))}</td><td>{escape(str(step.get('op', '')))}</td>"
        f"<td>{escape(', '.join(str(o) for o in step.get('outputs', []) if o))}</td></tr>"
        for step in steps
        if step.get("kind") == "compute"
    ]
    return (
        f"<details><summary>stage {st.index}: {len(rows)} ops ({escape(st.directory)}/; "
        f"<code>unity-eq explain {escape(str(plan_dir / st.directory))} --format html</code> draws its graph)"
        "</summary><table><tr><th>ONNX node</th><th>op</th><th>output</th></tr>"
        f"{''.join(rows)}</table></details>"
    )


def timeline_html(record: PipelinePlanRecord, plan_dir: Path | None = None) -> str:
    """The summary, the picture and (for a lowered plan in ``plan_dir``) each stage's ops, as one page."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(record))
    stages = "".join(_stage_ops(plan_dir, st) for st in record.stages) if plan_dir is not None else ""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>pipeline plan for {escape(record.model)}</title>"
        "<style>body{font-family:sans-serif}th{text-align:left;padding-right:1em}td{padding-right:1em}</style>"
        f"</head><body><h1>pipeline plan for {escape(record.model)}</h1><table>{rows}</table>"
        f"{timeline_svg(record)}{stages}</body></html>"
    )
