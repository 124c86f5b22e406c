"""``unity-eq explain --format dot|svg|html``: the plan drawn, checked against the plan.json it is drawn from.

The plan under test is the transformer example on two 8-GPU nodes with a forced 2×2×4 mesh, trained: it has
forward all-gathers and an all-reduce, backward (gradient) collectives, four placements and ranks on two
nodes, so every part of the picture has something to draw.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from unity_eq import optimize
from unity_eq.cli import main
from unity_eq.explain import load_plan, report_of, tensor_bytes
from unity_eq.picture import BACKWARD, FORWARD, REPLICATED, cost_chart_svg, html_page, pcg_dot, placement_colours
from unity_eq.planfile import ExplainRecord

DOT = shutil.which("dot")
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def plan_dir(examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("picture") / "plan"
    machine = examples / "machines" / "dgx-h100x2.toml"
    optimize(examples / "transformer.onnx", machine=machine, mesh="2x2x4", objective="training", output_dir=out)
    return out


@pytest.fixture(scope="module")
def meta(plan_dir: Path) -> dict[str, Any]:
    return json.loads((plan_dir / "plan.json").read_text())


@pytest.fixture(scope="module")
def plan(plan_dir: Path) -> ExplainRecord:
    return load_plan(plan_dir)


def _nodes(dot: str) -> dict[str, str]:
    """Node id -> its attribute text, for the ``opN``/``input …``/``output …`` nodes of the DOT text."""
    return {m[1]: m[2] for m in re.finditer(r'^\t+(op\d+|"(?:input|output) [^"]+") \[(.*)\]$', dot, re.M)}


def _edges(dot: str) -> list[tuple[str, str, str]]:
    return [(m[1], m[2], m[3]) for m in re.finditer(r'^\t+(\S+|"[^"]+") -> (\S+|"[^"]+") \[(.*)\]$', dot, re.M)]


def _fill(attrs: str) -> str:
    found = re.search(r'fillcolor="(#[0-9a-f]{6})"', attrs)
    assert found, attrs
    return found[1]


def test_every_op_is_a_node_filled_by_its_placement(meta: dict[str, Any], plan: ExplainRecord) -> None:
    report = report_of(plan)
    nodes = _nodes(pcg_dot(plan))
    colours = placement_colours(report.ops)
    assert len(report.ops) == sum(1 for s in meta["steps"] if s["kind"] == "compute") > 20
    sharded: dict[str, str] = {}  # placement -> fill of the ops sharded somewhere
    for op in report.ops:
        attrs = nodes[f"op{op.step}"]
        key = " ".join(f"{a}:{p}" for a, p in op.placement.items())
        assert key in attrs and op.op in attrs, attrs
        assert _fill(attrs) == colours[key]
        if any(p != "R" for p in op.placement.values()):
            sharded[key] = _fill(attrs)
    assert len(sharded) >= 3, "the plan should mix placements, or the colouring is not exercised"
    assert len(set(sharded.values())) == len(sharded) and REPLICATED not in sharded.values()


def test_the_legend_names_every_placement_with_its_colour(plan: ExplainRecord) -> None:
    dot = pcg_dot(plan)
    legend = next(line for line in dot.splitlines() if line.strip().startswith("legend ["))
    for key, colour in placement_colours(report_of(plan).ops).items():
        assert f'BGCOLOR="{colour}"' in legend and key in legend


def test_every_collective_is_a_marked_edge_with_kind_axis_bytes_and_time(
    meta: dict[str, Any], plan: ExplainRecord
) -> None:
    edges = _edges(pcg_dot(plan))
    forward = [attrs for _, _, attrs in edges if f'color="{FORWARD}"' in attrs]
    steps = [s for s in meta["steps"] if s["kind"] in ("combine", "reduce")]
    # at least two forward collectives, so the check below is not vacuous (with attention fused the layer's
    # plan has two: the MLP's all-reduce on y and the output's all-gather on z)
    assert len(steps) == len(meta["collectives"]) >= 2
    for step in steps:
        kind = "all-gather" if step["kind"] == "combine" else "all-reduce"
        size = tensor_bytes(plan.tensors[step["out"]]) / 2**20
        label = f"{kind} on {step['axis']}\\n{size:.2f} MiB, {step['communication_s'] * 1e6:.1f} µs"
        assert any(label in attrs for attrs in forward), (label, forward)
    backward = [attrs for _, _, attrs in edges if f'color="{BACKWARD}"' in attrs]
    axes = plan.mesh.axes  # the plan's weight gradients are all-reduced on its mesh axes (y and, fused, z)
    assert backward and all(
        any(f"gradient all-reduce on {a}" in attrs for a in axes) and "style=dashed" in attrs for attrs in backward
    )


def test_edges_follow_the_plan_from_input_to_output(meta: dict[str, Any], plan: ExplainRecord) -> None:
    edges = _edges(pcg_dot(plan))
    ends = {(a, b) for a, b, _ in edges}
    first = next(i for i, s in enumerate(meta["steps"]) if s["kind"] == "compute" and s["op"] == "LayerNormalization")
    assert ('"input X"', f"op{first}") in ends
    gather = next(s for s in meta["steps"] if s.get("out") == meta["model"]["outputs"]["Y"]["tensor"])
    assert gather["kind"] == "combine" and gather["axis"] == "z"
    last = next(i for i, s in enumerate(meta["steps"]) if s["kind"] == "compute" and gather["src"] in s["outputs"])
    assert any(a == f"op{last}" and b == '"output Y"' and "all-gather on z" in attrs for a, b, attrs in edges)


@pytest.mark.skipif(DOT is None, reason="graphviz's `dot` is not installed")
def test_dot_parses_the_graph_with_every_op_and_the_mesh(plan: ExplainRecord) -> None:
    assert DOT is not None
    drawn = json.loads(subprocess.run([DOT, "-Tjson"], input=pcg_dot(plan), capture_output=True, text=True).stdout)
    names = {o["name"] for o in drawn["objects"]}
    assert {f"op{op.step}" for op in report_of(plan).ops} <= names
    assert {"node 0", "node 1"} <= names  # the two machine nodes of the mesh drawing
    mesh = next(o for o in drawn["objects"] if o["name"] == "node 1")
    assert all(f"rank {r}" in mesh["label"] for r in range(8, 16))


def test_large_graphs_are_capped_with_a_note(plan: ExplainRecord) -> None:
    dot = pcg_dot(plan, max_ops=5)
    assert sum(1 for n in _nodes(dot) if n.startswith("op")) == 5
    total = len(report_of(plan).ops)
    assert f"… {total - 5} more ops not drawn" in dot and f"--max-ops {total}" in dot


def test_the_html_page_is_self_contained(plan: ExplainRecord) -> None:
    page, drawn = html_page(plan)
    assert drawn == (DOT is not None)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert page.count("<svg") >= (3 if DOT else 2)  # cost chart, mesh, and the PCG when dot draws it
    for rank in range(16):
        assert f">rank {rank}<" in page
    for name in ("this plan", "one_device", "data_parallel", "tensor_parallel", "memory per device"):
        assert name in page
    assert "x=2,y=2,z=4" in page and "dgx0" in page and "dgx1" in page


def test_the_cost_chart_draws_every_time_to_one_scale(meta: dict[str, Any], plan: ExplainRecord) -> None:
    chart = cost_chart_svg(report_of(plan))
    bars = {m[2]: float(m[1]) for m in re.finditer(r'<rect [^>]*width="([\d.]+)"[^>]*><title>([^<]*)</title>', chart)}
    compute = {name: width for name, width in bars.items() if name.startswith("compute: ")}
    assert len(compute) == 1 + len(meta["baselines"])  # this plan and each baseline
    seconds = [meta["cost"]["compute_s"]] + [b["compute_s"] for b in meta["baselines"].values()]
    widths = [bars[f"compute: {s * 1e3:.3f} ms"] for s in seconds]
    for s, w in zip(seconds, widths, strict=True):
        assert w / widths[0] == pytest.approx(s / seconds[0], rel=0.01)
    by_axis = meta["cost"]["communication_by_axis"]
    for axis, parts in by_axis.items():
        for phase in ("forward", "backward", "gradient"):
            if parts[f"{phase}_s"] > 0:
                assert f"{phase} communication on {axis}: {parts[f'{phase}_s'] * 1e3:.3f} ms" in bars
    memory = meta["memory"]
    assert f"usable capacity {memory['capacity_bytes'] / 2**30:.2f} GiB" in bars


def test_cli_writes_each_format_in_the_plan_folder(
    plan_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plan_dir, plan)
    for fmt in ("dot", "html") + (("svg",) if DOT else ()):
        assert main(["explain", str(plan), "--format", fmt]) == 0
        assert capsys.readouterr().out.strip() == f"wrote {plan / f'plan.{fmt}'}"
    assert (plan / "plan.dot").read_text().startswith("// unity-eq plan of transformer\ndigraph plan {")
    assert sorted(p.name for p in plan.iterdir() if p.name.startswith(".")) == []  # no temporary file left
    if DOT:
        assert "<svg" in (plan / "plan.svg").read_text()
    target = tmp_path / "picture.html"
    assert main(["explain", str(plan), "-f", "html", "-o", str(target)]) == 0
    assert target.read_text().startswith("<!DOCTYPE html>")


def test_without_dot_svg_falls_back_to_dot_text_with_one_message(
    plan_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no `dot` on it
    target = tmp_path / "out" / "plan.svg"
    target.parent.mkdir()
    assert main(["explain", str(plan_dir), "--format", "svg", "-o", str(target)]) == 0
    captured = capsys.readouterr()
    assert not target.exists()
    assert (target.parent / "plan.dot").read_text().startswith("// unity-eq plan of transformer\ndigraph plan {")
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "`dot`" in lines[0] and "apt install graphviz" in lines[0], captured.err
    assert captured.out.strip() == f"wrote {target.parent / 'plan.dot'}"

    assert main(["explain", str(plan_dir), "--format", "html", "-o", str(target.with_suffix(".html"))]) == 0
    page = target.with_suffix(".html").read_text()
    assert "digraph plan {" in page and "apt install graphviz" in page
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--format", "png"], "`--format`: expected text, json, dot, svg or html; got 'png'"),
        (["--json", "--format", "svg"], "`--json` and `--format svg` disagree"),
        (["--format", "html", "-o", "/nonexistent-dir/x.html"], "/nonexistent-dir does not exist"),
    ],
    ids=["bad-format", "json-and-svg", "bad-output"],
)
def test_bad_options_are_one_error_line_exit_2(
    plan_dir: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(plan_dir), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err


def test_a_missing_plan_is_named_before_the_default_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "such" / "plan"
    assert main(["explain", str(missing), "--format", "html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{missing}: no plan.json" in err[0], err
    assert not (tmp_path / "no").exists()


def test_text_and_json_keep_their_behaviour(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(plan_dir), "--json"]) == 0
    by_flag = json.loads(capsys.readouterr().out)
    assert main(["explain", str(plan_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == by_flag
    assert main(["explain", str(plan_dir)]) == 0
    assert "PCG (=> forward collective" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------
# The page in a real browser


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    step = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * step, [], bytearray(width * step)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - step] if x >= step else 0
            b, c = prev[x], prev[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, step, rows


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to open the page in (Debian: apt install chromium)")
def test_the_html_page_renders_in_a_headless_browser(plan_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "plan.html"
    assert main(["explain", str(plan_dir), "--format", "html", "-o", str(page)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1400,1000",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    width, step, rows = _png_pixels(shot)
    assert (width, len(rows)) == (1400, 1000)
    pixels = [row[x : x + 3] for row in rows[::4] for x in range(0, width * step, 4 * step)]
    ink = sum(1 for p in pixels if min(p) < 200) / len(pixels)
    colours = {p for p in pixels if max(p) - min(p) > 60}  # saturated: the chart's bars, not grey text
    assert ink > 0.03, f"only {ink:.1%} of the screenshot is drawn"
    assert len(colours) >= 4, colours  # compute and communication bars, memory split
