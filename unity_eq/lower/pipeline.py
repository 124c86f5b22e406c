"""Lowering a pipeline plan: each stage becomes an ordinary SPMD plan directory of its tensor group.

A stage of a pipeline plan (:mod:`unity_eq.stages`) is a contiguous range of the model's pieces
(:func:`unity_eq.split.split_graph`) run by ``t`` devices, the same in every data-parallel replica. Lowered, it
is a model of its own — the activation it receives (or the model inputs) and the side tensors it reads in, the
activation it sends (or the model outputs) and, for stage 0, the side tensors later stages read out, the
weights it reads, at the microbatch size — and its plan is the stage search's own: the piece plans it priced,
stitched (:func:`unity_eq.stages.stitch.stitch_stage`), not a second search, so the files are the plan that
plan.json's predicted step prices. The existing runtime runs each stage unchanged. The pipeline's plan.json
gains, per stage, its directory (``stage<s>/``) and the global ranks of each replica (:func:`stage_replicas`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from unity_eq.errors import InternalError
from unity_eq.files import check_output_dir, plan_tempdir, replace_plan_files
from unity_eq.ir import Graph
from unity_eq.lower.stage import lower, refuse_missing_weights, write_plan_dir
from unity_eq.machine import Machine
from unity_eq.planfile import read_run_record
from unity_eq.planfile.pipeline import PipelinePlanRecord, write_pipeline_json
from unity_eq.split import BlockSplit, Piece, piece_graph
from unity_eq.stages.evaluate import StagePlan, side_receives
from unity_eq.stages.stitch import stitch_stage

__all__ = ["lower_pipeline", "stage_directory", "stage_graph", "stage_machine", "stage_replicas"]

Say = Callable[[str], None]


def stage_directory(index: int) -> str:
    """The stage's plan directory, relative to the pipeline plan's (plan.json's manifest lists its files)."""
    return f"stage{index}"


def stage_graph(
    graph: Graph, pieces: Sequence[Piece], index: int, side_in: Sequence[str] = (), side_out: Sequence[str] = ()
) -> Graph:
    """Pieces ``pieces`` (consecutive) as one model: the first's incoming tensor (or the model inputs) and the
    side tensors ``side_in`` in, the last's outgoing tensor (or the model outputs) and the side tensors
    ``side_out`` out, the weights they read.

    A constant-computing node copied into several pieces (``split``) appears once, where it first appears."""
    seen: set[str] = set()
    nodes = []
    for piece in pieces:
        for node in piece.nodes:
            if node.name not in seen:
                seen.add(node.name)
                nodes.append(node)
    whole = Piece(index, tuple(nodes), pieces[0].stream_in, pieces[-1].stream_out, "", tuple(side_in), tuple(side_out))
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
    split: BlockSplit,
    machine: Machine,
    output_dir: Path,
    say: Say | None = None,
) -> PipelinePlanRecord:
    """Write the pipeline plan directory: ``stage<s>/`` for every stage (its piece plans as the search chose
    them, stitched, on the model ``split`` at the microbatch), then plan.json with each stage's directory and
    ranks, all atomically.

    Raises ModelError when a weight's data is absent (weightless planning: pass ``--plan-only``)."""
    say = say or (lambda _m: None)
    check_output_dir(output_dir)
    graph = split.graph
    refuse_missing_weights(graph)
    if len(split.pieces) != record.search.pieces or len(best.pieces) != len(split.pieces):
        raise InternalError(
            f"the model splits into {len(split.pieces)} pieces at microbatch "
            f"{best.config.microbatch}, the stage search found {record.search.pieces}"
        )
    t = best.config.tensor
    reps = split.distinct
    receives = side_receives(split.pieces, best.cuts)
    later = set().union(*receives)
    stages = []
    with plan_tempdir(output_dir) as tmp:
        for s, (first, end) in enumerate(best.cuts):
            say(f"stage {s}: pieces {first}-{end - 1} on {t} device(s)")
            pieces = split.pieces[first:end]
            sends = tuple(name for name in pieces[0].side_out if name in later) if s == 0 else ()
            sub = stage_graph(graph, pieces, s, receives[s], sends)
            chosen = best.pieces[first:end]
            plan = stitch_stage(pieces, reps, chosen, sub, sends, stage_machine(machine, best.devices[s][:t]), t)
            write_plan_dir(lower(plan, sub), tmp / stage_directory(s))
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
