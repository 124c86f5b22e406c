"""Lowering a pipeline plan: each stage becomes an ordinary SPMD plan directory of its tensor group.

A stage of a pipeline plan (:mod:`unity_eq.stages`) is a contiguous range of the model's pieces
(:func:`unity_eq.split.split_graph`) run by ``t`` devices, the same in every data-parallel replica. Lowered, it
is a model of its own — the activation it receives (or the model inputs) in, the activation it sends (or the
model outputs) out, the weights it reads, at the microbatch size — planned on a one-axis mesh of ``t``
devices like any model, so the existing runtime runs it unchanged. The pipeline's plan.json gains, per stage,
its directory (``stage<s>/``) and the global ranks of each replica (:func:`stage_replicas`).

Planning a stage's graph is the caller's (``unity_eq.pipeline`` passes ``optimize``): the search sits above
lowering in the layers, so it comes in as :data:`PlanStage`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from unity_eq.errors import PlanError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph, Mesh
from unity_eq.lower.stage import refuse_missing_weights
from unity_eq.machine import Machine
from unity_eq.planfile import read_run_record
from unity_eq.planfile.pipeline import PipelinePlanRecord, write_pipeline_json
from unity_eq.split import Piece, piece_graph, split_graph
from unity_eq.stages.search import StagePlan

__all__ = ["PlanStage", "lower_pipeline", "stage_directory", "stage_graph", "stage_machine", "stage_replicas"]

#: Plans a stage's graph on a machine of ``t`` devices over a one-axis mesh and writes its plan directory there.
PlanStage = Callable[[Graph, Machine, Mesh, Path], None]
Say = Callable[[str], None]


def stage_directory(index: int) -> str:
    """The stage's plan directory, relative to the pipeline plan's (plan.json's manifest lists its files)."""
    return f"stage{index}"


def stage_graph(graph: Graph, pieces: Sequence[Piece], index: int) -> Graph:
    """Pieces ``pieces`` (consecutive) as one model: the first's incoming tensor (or the model inputs) in, the
    last's outgoing tensor (or the model outputs) out, the weights they read.

    A constant-computing node copied into several pieces (``split``) appears once, where it first appears."""
    seen: set[str] = set()
    nodes = []
    for piece in pieces:
        for node in piece.nodes:
            if node.name not in seen:
                seen.add(node.name)
                nodes.append(node)
    whole = Piece(index, tuple(nodes), pieces[0].stream_in, pieces[-1].stream_out, "")
    return dataclasses.replace(piece_graph(graph, whole), name=f"{graph.name}.stage{index}")


def stage_machine(machine: Machine, devices: Sequence[int]) -> Machine:
    """The machine of one tensor group: ``devices`` (a stage's first replica), renumbered 0…t-1 with their nodes,
    so the stage's plan is priced on the devices and links it runs on (a tensor group sits inside one node)."""
    nodes = sorted({machine.node_of[d] for d in devices})
    index = {node: k for k, node in enumerate(nodes)}
    return dataclasses.replace(
        machine,
        name=f"{machine.name}[{','.join(map(str, devices))}]",
        devices=tuple(machine.devices[d] for d in devices),
        node_of=tuple(index[machine.node_of[d]] for d in devices),
        nodes=tuple(machine.nodes[n] for n in nodes) if machine.nodes else (),
    )


def stage_replicas(plan: StagePlan, stage: int) -> tuple[tuple[int, ...], ...]:
    """The global ranks of each replica of ``stage``, in tensor-rank order (the stage's devices are listed
    replica by replica, the tensor rank fastest)."""
    ranks = plan.devices[stage]
    t = plan.config.tensor
    return tuple(tuple(ranks[r * t : (r + 1) * t]) for r in range(plan.config.data))


def lower_pipeline(
    record: PipelinePlanRecord,
    best: StagePlan,
    graph: Graph,
    machine: Machine,
    output_dir: Path,
    plan_stage: PlanStage,
    say: Say | None = None,
) -> PipelinePlanRecord:
    """Write the pipeline plan directory: ``stage<s>/`` for every stage (``plan_stage`` of its graph at the
    microbatch ``graph``), then plan.json with each stage's directory and ranks, all atomically.

    Raises ModelError when a weight's data is absent (weightless planning: pass ``--plan-only``)."""
    say = say or (lambda _m: None)
    check_output_dir(output_dir)
    refuse_missing_weights(graph)
    split = split_graph(graph)
    if split is None or len(split.pieces) != record.search.pieces:
        found = 0 if split is None else len(split.pieces)
        raise PlanError(
            f"internal error: the model splits into {found} pieces at microbatch {best.config.microbatch}, the "
            f"stage search found {record.search.pieces}"
        )
    t = best.config.tensor
    mesh = Mesh(("x",), (t,))
    stages = []
    with plan_tempdir(output_dir) as tmp:
        for s, (first, end) in enumerate(best.cuts):
            say(f"stage {s}: pieces {first}-{end - 1} on {t} device(s)")
            sub = stage_machine(machine, best.devices[s][:t])
            plan_stage(stage_graph(graph, split.pieces[first:end], s), sub, mesh, tmp / stage_directory(s))
            written = read_run_record(tmp / stage_directory(s) / "plan.json").plan_hash
            stages.append(
                dataclasses.replace(
                    record.stages[s], directory=stage_directory(s), replicas=stage_replicas(best, s), plan_hash=written
                )
            )
        lowered = dataclasses.replace(record, stages=tuple(stages))
        write_pipeline_json(tmp / "plan.json", lowered)
        replace_plan_files(tmp, output_dir)
    return lowered
