"""``unity-eq explain PLAN --format dot|svg|html``: ``write_picture`` draws a plan into a file, and the HTML
page holds the three pictures (cost, mesh, parallel computation graph) with the key text, self-contained."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from unity_eq.errors import OptionError
from unity_eq.explain import Explanation, load_plan, reading_plan, render, report_of
from unity_eq.files import check_output_file, write_file_atomic
from unity_eq.picture.chart import cost_chart_svg
from unity_eq.picture.mesh import mesh_svg
from unity_eq.picture.pcg import pcg_graph, render_svg
from unity_eq.picture.style import gib, ms
from unity_eq.planfile import ExplainRecord

FORMATS = ("dot", "svg", "html")
DOT_MISSING = "graphviz's `dot` program was not found on PATH"
INSTALL_DOT = "install it (Debian/Ubuntu: `apt install graphviz`)"


_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.sub { color: #555; margin-top: 0; } table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; } td:first-child, th:first-child
{ text-align: left; } .figure { overflow-x: auto; border: 1px solid #eee; padding: 8px; }
.figure svg { max-width: 100%; height: auto; } pre { font-size: 12px; background: #f7f7f7; padding: 8px;
overflow-x: auto; } .warn { color: #a33; } .note { color: #555; font-size: 13px; }
"""


def _baseline_table(report: Explanation) -> str:
    memory = report.memory
    head = "<tr><th>plan</th><th>total</th><th>compute</th><th>communication</th><th>memory</th><th>×plan</th></tr>"
    rows = [
        f"<tr><td><b>this plan</b> [{html.escape(report.mesh_label)}]</td><td>{ms(report.total_s)}</td>"
        f"<td>{ms(report.compute_s)}</td><td>{ms(report.communication_s)}</td>"
        f"<td>{gib(memory.total_bytes if memory else None)}</td><td>1.00</td></tr>"
    ]
    for name, b in report.baselines:
        ratio = "-" if b.ratio is None else f"{b.ratio:.2f}"
        flag = "" if b.fits else " (does not fit)"
        rows.append(
            f'<tr><td title="{html.escape(b.description)}">{html.escape(name)} '
            f"[{html.escape(b.mesh)}]</td><td>{ms(b.total_s)}</td><td>{ms(b.compute_s)}</td>"
            f"<td>{ms(b.communication_s)}</td><td>{gib(b.memory_bytes)}</td><td>{ratio}{flag}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _strip_xml_prolog(svg: str) -> str:
    """Graphviz's SVG starts with an XML declaration and a DOCTYPE, which do not belong inside HTML."""
    return svg[svg.index("<svg") :] if "<svg" in svg else svg


def html_page(plan: ExplainRecord, *, max_ops: int = 150) -> tuple[str, bool]:
    """One self-contained HTML page of the plan (the three pictures and the key text) and whether ``dot`` drew
    the graph (without it, the page holds the graph's DOT text and says how to draw it)."""
    report = report_of(plan)
    graph = pcg_graph(plan, max_ops=max_ops, mesh=False)
    svg = render_svg(graph)
    if svg is None:
        pcg = (
            f'<p class="warn">{html.escape(DOT_MISSING)}: {html.escape(INSTALL_DOT)} to see the graph; '
            "its DOT text follows.</p><pre>" + html.escape(str(graph.source)) + "</pre>"
        )
    else:
        pcg = _strip_xml_prolog(svg)
    axes = "".join(
        f"<li>axis <b>{html.escape(a.name)}</b>: {a.size} devices, "
        + (f"across {a.nodes} nodes" if a.spans_nodes else "inside a node")
        + f" ({html.escape(str(a.link))}"
        + (f", {a.bandwidth_gbs:g} GB/s" if a.bandwidth_gbs else "")
        + ")</li>"
        for a in report.axes
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    title = f"unity-eq plan: {report.model} on {report.machine}"
    body = f"""<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(str(report.objective))} · mesh <b>{html.escape(report.mesh_label)}</b> ·
predicted {ms(report.total_s)} per step = compute {ms(report.compute_s)} + communication
{ms(report.communication_s)}</p>
<ul>{axes}</ul>
<h2>Cost</h2>
<div class="figure">{cost_chart_svg(report)}</div>
<h2>Baselines (same model, same cost model)</h2>
{_baseline_table(report)}
<h2>Mesh on the machine</h2>
<div class="figure">{mesh_svg(plan)}</div>
<h2>Parallel computation graph</h2>
<p class="note">One box per op, filled by its placement on each mesh axis (S(d): split along dim d, R: whole,
P: partial sums). Red edges cross a forward collective, blue dashed ones a collective of the backward pass;
labels give the kind, mesh axis, bytes per rank and predicted time.</p>
<div class="figure">{pcg}</div>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
<h2>Full report</h2>
<details><summary>text of <code>unity-eq explain</code></summary><pre>{html.escape(render(report))}</pre></details>
"""
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
    return page, svg is not None


@dataclass(frozen=True)
class Picture:
    """What :func:`write_picture` wrote, and a note for the user when it could not draw as asked."""

    path: Path
    note: str | None = None


def default_output(plan_dir: Path, fmt: str) -> Path:
    """``plan.<fmt>`` in the plan folder (beside plan.json when a plan.json is given)."""
    folder = plan_dir if plan_dir.is_dir() else plan_dir.parent
    return folder / f"plan.{fmt}"


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise OptionError(f"`--format`: expected text, json, {', '.join(FORMATS)}; got {fmt!r}.")


def output_option(output: Path | None) -> str:
    """How errors name the file a picture goes to: the user's `-o`, or the default they never typed."""
    return "`-o`" if output is not None else "the default output (no `-o` given)"


def check_picture_output(target: Path, output: Path | None) -> None:
    """Refuse a picture's file before drawing, naming `-o` only when the user passed it: the default place
    (``plan.<fmt>`` in the plan folder) that cannot take the file is fixed with `-o FILE`."""
    if output is None and target.is_dir():
        raise OptionError(f"{target}: the picture's default output is a folder; pass `-o FILE` to write it elsewhere.")
    check_output_file(target, output_option(output))


def write_picture(plan_dir: Path, fmt: str, output: Path | None = None, *, max_ops: int = 150) -> Picture:
    """Draw the plan in ``plan_dir`` as ``fmt`` (dot, svg or html) into ``output`` (default: ``plan.<fmt>`` in
    the plan folder), atomically. The plan is read and the output checked before anything is drawn (a missing
    plan is named as such, not as an unwritable default output). Without ``dot``, ``svg`` writes the DOT text
    to ``<output>.dot`` instead and the returned note says so."""
    check_format(fmt)
    if max_ops < 1:
        raise OptionError(f"`--max-ops`: expected 1 or more, got {max_ops}.")
    plan = load_plan(plan_dir)
    target = output if output is not None else default_output(plan_dir, fmt)
    what = output_option(output)
    check_picture_output(target, output)
    if fmt == "html":
        with reading_plan(plan_dir):
            page, drawn = html_page(plan, max_ops=max_ops)
        write_file_atomic(target, page, what)
        note = None if drawn else f"{DOT_MISSING}: the page holds the graph's DOT text; {INSTALL_DOT} to draw it."
        return Picture(target, note)
    with reading_plan(plan_dir):
        graph = pcg_graph(plan, max_ops=max_ops)
    if fmt == "dot":
        write_file_atomic(target, str(graph.source), what)
        return Picture(target)
    svg = render_svg(graph)
    if svg is not None:
        write_file_atomic(target, svg, what)
        return Picture(target)
    fallback = target.with_suffix(".dot")
    write_file_atomic(fallback, str(graph.source), what)
    return Picture(
        fallback,
        f"{DOT_MISSING}, so no SVG: wrote the DOT text to {fallback} instead; {INSTALL_DOT} "
        f"or run `dot -Tsvg {fallback} -o {target}` where it is.",
    )
