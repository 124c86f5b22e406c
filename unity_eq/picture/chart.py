"""The cost split as SVG bar charts: compute and communication per axis and phase of this plan next to the
baselines, on one scale, and memory per device against the usable capacity."""

from __future__ import annotations

from unity_eq.explain import Explanation
from unity_eq.picture.style import AXIS_COLOURS, COMPUTE, gib, ms, rect, svg, text


def _time_segments(report: Explanation) -> list[tuple[str, float, str]]:
    """This plan's time per step cut into compute and communication per axis and phase: (name, s, colour)."""
    cost = report.cost
    segments = [("compute", float((cost.compute_s if cost else None) or 0.0), COMPUTE)]
    by_axis = (cost.communication_by_axis if cost else None) or {}
    for i, (axis, parts) in enumerate(by_axis.items()):
        colour = AXIS_COLOURS[i % len(AXIS_COLOURS)]
        phases = (("forward", parts.forward_s, "1"), ("backward", parts.backward_s, "0.65"))
        for phase, value, opacity in (*phases, ("gradient", parts.gradient_s, "0.35")):
            seconds = float(value or 0.0)
            if seconds > 0:
                segments.append((f"{phase} communication on {axis}", seconds, f"{colour}|{opacity}"))
    if not by_axis and cost and cost.communication_s:
        segments.append(("communication", float(cost.communication_s), f"{AXIS_COLOURS[0]}|1"))
    return segments


def _fill(colour: str) -> str:
    base, _, opacity = colour.partition("|")
    return f'{base}" fill-opacity="{opacity or 1}'


def cost_chart_svg(report: Explanation) -> str:
    """The cost split as bar charts: time per step of this plan (compute, then communication per axis and
    phase) and of each baseline (compute, communication), on one scale; memory per device against capacity."""
    left, bar_w, bar_h, gap = 280.0, 520.0, 22.0, 10.0
    width = left + bar_w + 210
    body: list[str] = [text(10, 20, "predicted time per step", size=14, weight="bold")]
    rows = [(f"this plan [{report.mesh_label}]", _time_segments(report), float(report.total_s or 0.0), "")]
    for name, b in report.baselines:
        parts = [
            ("compute", float(b.compute_s or 0.0), COMPUTE),
            ("communication", float(b.communication_s or 0.0), "#999999|1"),
        ]
        ratio = f" = ×{b.ratio:.2f} this plan" if b.ratio is not None else ""
        rows.append((f"{name} [{b.mesh}]", parts, float(b.total_s or 0.0), ratio))
    scale = max([row[2] for row in rows] + [1e-12])
    y = 34.0
    for name, segments, total, ratio in rows:
        body.append(
            text(left - 8, y + bar_h * 0.7, name if len(name) <= 44 else name[:43] + "…", anchor="end", size=11)
        )
        x = left
        for part, seconds, colour in segments:
            w = bar_w * seconds / scale
            body.append(rect(x, y, w, bar_h, _fill(colour), f"{part}: {ms(seconds)}"))
            x += w
        body.append(text(x + 6, y + bar_h * 0.7, ms(total) + ratio, size=11))
        y += bar_h + gap
    y = _chart_key(body, [*_time_segments(report), ("baseline communication", 0.0, "#999999|1")], y, left)

    memory = report.memory
    if memory is not None:
        y += 14
        body.append(text(10, y, "memory per device", size=14, weight="bold"))
        y += 12
        capacity = float(memory.capacity_bytes or 0.0)
        total = float(memory.total_bytes)
        parts = [
            ("weights", float(memory.weight_bytes or 0.0), "#59a14f|1"),
            ("gradients + optimizer", float(memory.weight_state_bytes or 0.0), "#edc948|1"),
            ("activations", float(memory.activation_bytes or 0.0), "#b07aa1|1"),
        ]
        fits = "fits" if memory.fits else "DOES NOT FIT"
        if capacity:
            share = total / capacity
            body.append(text(left - 8, y + bar_h * 0.7, "of usable capacity", anchor="end", size=11))
            body.append(rect(left, y, bar_w, bar_h, "#eeeeee", f"usable capacity {gib(capacity)}", 'stroke="#999"'))
            body.append(
                rect(left, y, max(bar_w * min(share, 1.0), 2), bar_h, "#59a14f" if share <= 1 else "#d62728", fits)
            )
            body.append(text(left + bar_w + 6, y + bar_h * 0.7, f"{share * 100:.2f}% ({fits})", size=11))
            y += bar_h + gap
        body.append(text(left - 8, y + bar_h * 0.7, f"split of {gib(total)}", anchor="end", size=11))
        x = left
        for part, nbytes, colour in parts:
            w = bar_w * nbytes / max(total, 1.0)
            body.append(rect(x, y, w, bar_h, _fill(colour), f"{part}: {gib(nbytes)}"))
            x += w
        body.append(text(left + bar_w + 6, y + bar_h * 0.7, f"of {gib(capacity)}" if capacity else "", size=11))
        y += bar_h + gap
        y = _chart_key(body, parts, y, left)
    return svg(width, y + 6, body, "predicted cost: time per step and memory per device")


def _chart_key(body: list[str], parts: list[tuple[str, float, str]], y: float, left: float) -> float:
    """A key of the bars' colours, wrapped to the chart's width; returns the y below it."""
    x = left
    for name, _, colour in parts:
        w = 18 + 7 * len(name)
        if x + w > left + 600:
            x, y = left, y + 18
        body.append(rect(x, y, 12, 12, _fill(colour)))
        body.append(text(x + 16, y + 10, name, size=11))
        x += w
    return y + 24
