"""``unity-eq explain``: a plan directory as a text or JSON report, or as a picture (dot, svg, html).

Separate from the commands that make and run plans: it only reads one.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from unity_eq.cli.shared import err, out
from unity_eq.errors import OptionError
from unity_eq.files import check_output_file

__all__ = ["explain"]


def explain(
    plan_dir: Path = typer.Argument(..., help="A plan directory written by `unity-eq optimize`."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (same as `--format json`)."),
    fmt: str = typer.Option(
        "text", "--format", "-f", help="text or json (printed), or a picture: dot, svg or html (written to a file)."
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="File to write (default for a picture: plan.FORMAT in the plan directory)."
    ),
    max_ops: int = typer.Option(
        None, "--max-ops", help="Ops to show: text report 60 (PCG lines twice that), pictures 150 (the rest noted)."
    ),
) -> None:
    """Explain a plan: shardings, cost split, memory, baselines with their ratio to the plan, and the PCG.

    `--format svg|html|dot` draws it: the parallel computation graph coloured by placement, the mesh on the
    machine's nodes and the cost split as a chart."""
    import json

    from unity_eq.explain import explain as build_report
    from unity_eq.explain import reading_plan, render

    if as_json and fmt not in ("text", "json"):
        raise OptionError(f"`--json` and `--format {fmt}` disagree: pass one of them.")
    if output is not None:  # never over a file of the plan, the model it was made from or its data
        from unity_eq.runtime.plandir import refuse_plan_output

        refuse_plan_output(output, plan_dir, "`-o`")
    fmt = "json" if as_json else fmt
    from unity_eq.planfile.pipeline import is_pipeline_plan

    if is_pipeline_plan(plan_dir / "plan.json"):
        _explain_pipeline(plan_dir, fmt, output)
        return
    if fmt in ("dot", "svg", "html"):
        from unity_eq.picture import write_picture

        picture = write_picture(plan_dir, fmt, output, max_ops=150 if max_ops is None else max_ops)
        if picture.note:
            err.print(f"[yellow]{escape(picture.note)}[/yellow]")
        out.print(f"wrote {picture.path}", markup=False)
        return
    if fmt not in ("text", "json"):
        raise OptionError(f"`--format`: expected text, json, dot, svg or html; got {fmt!r}.")
    if output is not None:
        check_output_file(output, "`-o`")
    report = build_report(plan_dir)
    with reading_plan(plan_dir):
        text = (
            json.dumps(report.to_json(), indent=1)
            if fmt == "json"
            else render(report, max_ops=60 if max_ops is None else max_ops)
        )
    if output is None:
        out.print(text, markup=False)
        return
    from unity_eq.files import write_file_atomic

    write_file_atomic(output, text + "\n", "`-o`")
    out.print(f"wrote {output}", markup=False)


def _explain_pipeline(plan_dir: Path, fmt: str, output: Path | None) -> None:
    """A pipeline plan: its report as text or JSON, or its schedule as a picture (svg, html)."""
    import json

    from unity_eq.explain.pipeline import render_pipeline
    from unity_eq.files import write_file_atomic
    from unity_eq.planfile.pipeline import read_pipeline_record

    record = read_pipeline_record(plan_dir / "plan.json")
    if fmt in ("svg", "html"):
        from unity_eq.picture.page import check_picture_output, output_option
        from unity_eq.picture.timeline import timeline_html, timeline_svg

        target = output if output is not None else plan_dir / f"plan.{fmt}"
        what = output_option(output)
        check_picture_output(target, output)
        write_file_atomic(target, timeline_svg(record) if fmt == "svg" else timeline_html(record, plan_dir), what)
        out.print(f"wrote {target}", markup=False)
        return
    if fmt == "dot":
        raise OptionError("a pipeline plan has no parallel computation graph to draw as DOT: use `--format svg|html`.")
    if fmt not in ("text", "json"):
        raise OptionError(f"`--format`: expected text, json, svg or html for a pipeline plan; got {fmt!r}.")
    text = json.dumps(record.to_json(), indent=1) if fmt == "json" else render_pipeline(record)
    if output is None:
        out.print(text, markup=False)
        return
    check_output_file(output, "`-o`")
    write_file_atomic(output, text + "\n", "`-o`")
    out.print(f"wrote {output}", markup=False)
