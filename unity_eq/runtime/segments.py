"""A rank's program: its device model cut into onnxruntime sessions at the collectives (the stages of plan.json)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from unity_eq.errors import PlanError, RuntimeBackendError
from unity_eq.lower.onnxrt import make_session, missing_kernel
from unity_eq.planfile import CollectiveRecord
from unity_eq.runtime.plandir import PlanDir, check_external_data, check_identity


@dataclass
class Segment:
    inputs: list[str]
    outputs: list[str]
    session: Any = None


@dataclass
class RankProgram:
    """One rank's device graph, cut into segments, with the collectives after each segment."""

    rank: int
    segments: list[Segment]
    collectives_after: list[list[CollectiveRecord]]
    outputs: list[str]
    providers_in_use: list[str] = field(default_factory=list)


def _segment_models(model: onnx.ModelProto, collectives: Sequence[CollectiveRecord]) -> list[onnx.ModelProto | None]:
    """Split a device graph by stage: a node runs in the stage of its latest collective input."""
    graph = model.graph
    stage_of: dict[str, int] = {}
    for c in collectives:
        stage_of[c.dst] = c.stage + 1
    node_stage: list[int] = []
    for node in graph.node:
        stage = max((stage_of.get(name, 0) for name in node.input if name), default=0)
        node_stage.append(stage)
        for out in node.output:
            if out:
                stage_of[out] = stage
    last = max([*node_stage, *(c.stage for c in collectives), 0])
    needed_later: dict[str, int] = {}  # tensor -> latest stage that reads it
    for node, stage in zip(graph.node, node_stage, strict=True):
        for name in node.input:
            if name:
                needed_later[name] = max(needed_later.get(name, -1), stage)
    for c in collectives:  # a collective reads its source right after its stage
        needed_later[c.src] = max(needed_later.get(c.src, -1), c.stage + 1)
    model_outputs = {o.name for o in graph.output} - {c.src for c in collectives}
    infos = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    segments: list[onnx.ModelProto | None] = []
    for s in range(last + 1):
        nodes = [n for n, st in zip(graph.node, node_stage, strict=True) if st == s]
        produced = {o for n in nodes for o in n.output if o}
        outputs = [name for name in produced if name in model_outputs or needed_later.get(name, -1) > s]
        consumed = {i for n in nodes for i in n.input if i}
        inputs = sorted(name for name in consumed - produced if name not in initializers)
        inits = [initializers[name] for name in sorted(consumed & set(initializers))]
        if not nodes:
            segments.append(None)
            continue
        missing = [name for name in inputs if name not in infos and name not in graph_inputs]
        if missing:
            raise PlanError(f"device graph {graph.name}: no type recorded for {missing[0]}; re-run `unity-eq optimize`")
        seg_graph = helper.make_graph(
            nodes,
            f"{graph.name}.stage{s}",
            [infos[name] for name in inputs],
            [infos[name] for name in sorted(outputs)],
            initializer=inits,
        )
        segments.append(
            helper.make_model(seg_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        )
    return segments


def build_rank_program(plan: PlanDir, rank: int, providers: list[Any], threads: int = 0) -> RankProgram:
    """Load a rank's device model and open one onnxruntime session per segment.

    External weights (``device_<rank>.onnx.data``) are not loaded here: the segments point at them and
    onnxruntime reads them from the plan folder, so no copy of a weight passes through Python."""
    path = plan.model_path(rank)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf/IO errors of a damaged plan file
        raise PlanError(f"{path}: cannot load device model ({exc}). Re-run `unity-eq optimize`.") from None
    check_identity(plan, rank, model, path)
    check_external_data(model, path, plan.record.plan_hash or "", rank)
    collectives = plan.record.collectives
    segment_models = _segment_models(model, collectives)
    segments: list[Segment] = []
    in_use: list[str] = []
    for seg_model in segment_models:
        if seg_model is None:
            segments.append(Segment([], []))
            continue
        try:
            session = make_session(seg_model, providers, threads, external_folder=path.parent)
        except Exception as exc:  # onnxruntime rejects the segment
            missing = missing_kernel(exc, seg_model)
            if missing is not None:  # bfloat16 arithmetic on the CPU: the file is valid, this provider lacks the op
                where = "CPU" if all(p == "CPUExecutionProvider" for p in providers) else "CUDA"
                raise RuntimeBackendError(
                    f"rank {rank}: {path.name}: {missing.describe(where)}; run the plan where the op is implemented "
                    "(`--device cuda`)."
                ) from None
            raise RuntimeBackendError(f"rank {rank}: onnxruntime cannot load {path.name}: {exc}") from None
        in_use = session.get_providers()
        segments.append(
            Segment([i.name for i in seg_model.graph.input], [o.name for o in seg_model.graph.output], session)
        )
    after: list[list[CollectiveRecord]] = [[] for _ in segments]
    for c in collectives:
        after[c.stage].append(c)
    return RankProgram(rank, segments, after, plan.output_names, in_use)
