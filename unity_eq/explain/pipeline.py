"""``explain`` of a pipeline plan (``optimize --pipeline``): the configuration, the stages and the schedule as
a text timeline."""

from __future__ import annotations

from unity_eq.planfile.pipeline import ConfigRecord, PipelinePlanRecord, SpmdRecord, StageRecord
from unity_eq.stages.config import static_batch_note
from unity_eq.stages.timeline import Slot, simulate

__all__ = ["duration", "render_pipeline", "size", "stage_ranks", "summary_rows", "timeline_text"]

WIDTH = 96
SHOWN_MICROBATCHES = 12  # the timeline shows the first ones: the rest repeat the steady state


def duration(seconds: float) -> str:
    """Seconds in the unit that shows them with 3 significant digits: ``41.2 µs``, ``3.05 ms``, ``12.4 s``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def size(nbytes: float) -> str:
    """Bytes in the binary unit that shows them best: ``1.50 GiB``, ``96.0 MiB``, ``12.0 KiB``."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def stage_ranks(record: PipelinePlanRecord, stage: StageRecord) -> str:
    """A stage's ranks and how they are used: ``4-7 (2 replicas × 2-rank tensor groups)``."""
    c = record.chosen
    if c.data == 1 and c.tensor == 1:
        return stage.ranks
    replicas = "1 replica" if c.data == 1 else f"{c.data} replicas"
    group = "1 rank" if c.tensor == 1 else f"{c.tensor}-rank tensor groups"
    return f"{stage.ranks} ({replicas} × {group})"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _config_text(c: ConfigRecord) -> str:
    return (
        f"t={c.tensor} × p={c.stages} × d={c.data}: {c.microbatches} microbatches of {c.microbatch}, {c.schedule}, "
        f"recompute {c.recompute}, ZeRO-{c.zero} (ranks {'pipeline, data' if c.order == 'pdt' else 'data, pipeline'}"
        ", tensor fastest)"
    )


def summary_rows(record: PipelinePlanRecord) -> list[tuple[str, str]]:
    """The key facts, as (label, text) rows: the CLI's summary table and the head of the report."""
    c = record.chosen
    rows = [
        ("machine", f"{record.machine}: {record.devices} devices in {record.nodes} node(s)"),
        ("objective", f"{record.objective}, batch {record.batch} per step"),
        ("configuration", _config_text(c)),
        (
            "predicted step",
            f"{c.step_s * 1e3:.1f} ms (pipeline {c.pipeline_s * 1e3:.1f} ms, bubble {c.bubble:.1%}; "
            f"gradient sync and optimizer {c.sync_s * 1e3:.1f} ms)",
        ),
        ("memory per device", f"{_gib(c.peak_bytes)} at the fullest stage of {_gib(record.capacity_bytes)} usable"),
    ]
    flat = record.without_pipeline
    if flat is not None and c.stages > 1:
        rows.append(("without a pipeline", f"{flat.step_s / c.step_s:.2f}× the step ({_config_text(flat)})"))
    elif flat is None and record.spmd is None:
        rows.append(("without a pipeline", "no one-stage configuration fits (or none was searched: --stages)"))
    spmd = record.spmd
    if spmd is not None:
        rows.append(("SPMD search", _spmd_text(spmd, c.step_s)))
    s = record.search
    if s.static_batch is not None:
        rows.append(("static batch", static_batch_note(s.static_batch)))
    rows.append(
        (
            "search",
            f"{s.evaluated} configurations ({s.fitting} fit), {s.pieces} pieces ({s.distinct_pieces} distinct) "
            f"saturated at {s.saturations} (group, microbatch) sizes, {s.enodes} e-nodes, {s.seconds:.1f} s",
        )
    )
    return rows


def _spmd_text(spmd: SpmdRecord, step_s: float) -> str:
    """The SPMD search's best on the same workload, against the pipeline chosen (the training search)."""
    if spmd.mesh is None or spmd.step_s is None:
        return f"no SPMD plan fits ({spmd.note})" if spmd.note else "no SPMD plan fits"
    passes = f" over {spmd.passes} accumulated passes" if spmd.passes > 1 else ""
    return (
        f"{spmd.step_s * 1e3:.1f} ms per step on mesh {spmd.mesh}{passes}, with the optimizer's update: "
        f"{spmd.step_s / step_s:.2f}× the pipeline's"
    )


def timeline_text(record: PipelinePlanRecord, width: int = WIDTH) -> list[str]:
    """One row per stage (the first and last few when there are many): digits are forwards of microbatch
    0-9 (mod 10), letters a-j their backwards, dots idle time."""
    c = record.chosen
    shown = min(c.microbatches, SHOWN_MICROBATCHES)
    slots = simulate([st.seconds for st in record.stages], shown, c.schedule, record.objective == "training")
    end = max(s.end for s in slots)
    rows: dict[int, list[str]] = {st.index: ["."] * width for st in record.stages}
    for slot in slots:
        _paint(rows[slot.stage], slot, end, width)
    stages = [st.index for st in record.stages]
    if len(stages) > 8:
        stages = [*stages[:4], -1, *stages[-3:]]
    lines = [
        f"schedule of the first {shown} of {c.microbatches} microbatches ({c.schedule}; {end * 1e3:.1f} ms shown): "
        "0-9 forward, a-j backward, . idle"
    ]
    for index in stages:
        lines.append("  ⋮" if index < 0 else f"  stage {index:>3} |{''.join(rows[index])}|")
    return lines


def _paint(row: list[str], slot: Slot, end: float, width: int) -> None:
    first = int(slot.start / end * width)
    last = max(first + 1, round(slot.end / end * width))
    mark = "abcdefghij"[slot.microbatch % 10] if slot.backward else str(slot.microbatch % 10)
    for k in range(first, min(last, width)):
        row[k] = mark


def render_pipeline(record: PipelinePlanRecord) -> str:
    """The whole text report."""
    lines = [f"pipeline plan for {record.model}"]
    lines += [f"  {label}: {text}" for label, text in summary_rows(record)]
    lines.append("")
    lines.append("stages (time per microbatch; memory per device: weights + gradients/optimizer state + activations)")
    for st in record.stages:
        lines.append(
            f"  stage {st.index:>3}: pieces {st.pieces[0]}-{st.pieces[1] - 1} ({st.first_node} … {st.last_node}) "
            f"on ranks {stage_ranks(record, st)} ({st.device}): {st.seconds * 1e3:.2f} ms; {_gib(st.weight_bytes)} + "
            f"{_gib(st.weight_state_bytes)} + {_gib(st.activation_bytes)} = {_gib(st.total_bytes)}"
            + ("; recomputes" if st.recomputes else "")
            + (f"; receives {st.receives} from stage {st.index - 1}" if st.receives else "")
            + (f"; receives side tensors {', '.join(st.side_receives)} from stage 0" if st.side_receives else "")
            + (f"; sends {st.sends}" if st.sends else "")
            + (f"; sends side tensors {', '.join(st.side_sends)}" if st.side_sends else "")
            + (f"; in {st.directory}/" if st.directory else "")
        )
    lines.append("")
    lines += timeline_text(record)
    lines.append("")
    if record.lowered:
        where = ", ".join(f"{st.directory}/" for st in record.stages)
        lines.append(
            f"lowered: one plan directory per stage ({where}), each an SPMD plan of its tensor group; `run` and "
            "`check` run them microbatch by microbatch (docs/pipeline.md)"
        )
    else:
        lines.append(
            "not lowered (plan-only): `run` and `check` need it written without `--plan-only` (docs/pipeline.md)"
        )
    return "\n".join(lines)
