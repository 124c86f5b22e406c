"""A pipeline stage's SPMD plan, stitched from the piece plans the stage search priced.

The stage search (:mod:`.search`) prices every piece by one of its intra-op plans (:class:`.pieces.PieceCost`,
extracted on the tensor group's one-axis mesh and chosen by the configuration's policy). Lowering writes those
plans, not new ones: each stage's plan is its pieces' chosen plans in a row (renamed from the piece's
representative to the copy, as :mod:`unity_eq.extract.blocks` stitches a split model), so the files are the
plan that was priced and plan.json reports, memory policy included. Pieces enter and leave replicated on
their group, so a piece's incoming tensor is the previous piece's outgoing one as it stands.

Side tensors (``split``: an attention mask every layer reads) are made by the first piece. In stage 0 the
pieces that read one get the first piece's tensor; a later stage loads each side tensor it reads once, as an
input of the stage (stage 0 sends it, point to point), and its pieces share it.
"""

from __future__ import annotations

from collections.abc import Sequence

from unity_eq.cost import ZERO, Cost
from unity_eq.errors import InternalError
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import Machine
from unity_eq.memory import plan_memory
from unity_eq.plan import (
    LoadInput,
    Plan,
    PlanTensor,
    Step,
    renamed_step,
)
from unity_eq.planfile import PlanReport
from unity_eq.report import cost_breakdown
from unity_eq.split import Piece
from unity_eq.stages.pieces import PieceCost

__all__ = ["stitch_stage"]


class _StagePlan:
    """The stage's plan as it is stitched: tensors, steps and their prices, the stream between pieces."""

    def __init__(self, first: int) -> None:
        self.first = first  # the stage's first piece (its incoming tensor is a stage input)
        self.tensors: dict[str, PlanTensor] = {}
        self.steps: list[Step] = []
        self.step_costs: list[Cost] = []
        self.stream: str | None = None  # the tensor the previous piece sent on, replicated
        self.side: dict[str, str] = {}  # a side tensor of the model → its tensor in this stage's plan
        self.outputs: dict[str, str] = {}

    def add(self, piece: Piece, rep: Piece, plan: Plan) -> None:
        """Append ``plan`` (of ``rep``, the representative of ``piece``'s signature) as ``piece``."""
        names = rep.instance_names(piece)
        rename: dict[str, str] = {}

        def name_of(tid: str) -> str:
            if tid not in rename:
                tensor = plan.tensors[tid]
                new = names.get(tid) if tid == tensor.source else None
                if new is None or new in self.tensors:  # a plan's own name, or a constant another piece made too
                    new = f"b{piece.index}.{tid}"
                rename[tid] = new
                source = names.get(tensor.source, tensor.source) if tensor.source else None
                value = names.get(tensor.value, tensor.value) if tensor.value else None
                self.tensors[new] = PlanTensor(new, tensor.shape, tensor.dtype, tensor.placement, source, value)
            return rename[tid]

        costs = plan.step_costs if len(plan.step_costs) == len(plan.steps) else [ZERO] * len(plan.steps)
        for step, cost in zip(plan.steps, costs, strict=True):
            if isinstance(step, LoadInput) and step.name == rep.stream_in and piece.index != self.first:
                assert self.stream is not None
                rename[step.out] = self.stream  # the previous piece's output, replicated as this piece reads it
                continue
            if isinstance(step, LoadInput) and step.name in rep.side_in:
                side = names[step.name]
                if side in self.side:
                    rename[step.out] = self.side[side]
                    continue
                self.side[side] = name_of(step.out)  # a later stage: stage 0 sends it, loaded once
                self.steps.append(LoadInput(self.side[side], side))
                self.step_costs.append(cost)
                continue
            self.steps.append(renamed_step(step, name_of, names, names))
            self.step_costs.append(cost)
        if piece.stream_out is None:
            self.outputs.update((name, name_of(plan.outputs[name])) for name in plan.outputs)
        else:
            assert rep.stream_out is not None
            self.stream = name_of(plan.outputs[rep.stream_out])
        for made, name in zip(rep.side_out, piece.side_out, strict=True):
            self.side[name] = name_of(plan.outputs[made])


def stitch_stage(
    pieces: Sequence[Piece],
    reps: dict[str, Piece],
    chosen: Sequence[PieceCost],
    graph: Graph,
    side_out: Sequence[str],
    machine: Machine,
    tensor: int,
) -> Plan:
    """The plan of a stage of ``pieces`` (consecutive; ``graph`` is the stage's own model: ``lower.pipeline``),
    each by its chosen plan (``chosen``, one per piece, of the representative ``reps[signature]``), on a
    one-axis mesh of ``tensor`` devices of ``machine`` (the stage's tensor group). ``side_out``: the side
    tensors the stage sends on (stage 0, to the later stages that read them)."""
    stage = _StagePlan(pieces[0].index)
    for piece, option in zip(pieces, chosen, strict=True):
        if option.plan is None:
            raise InternalError(f"piece {piece.index} was priced without its plan ({option.extraction})")
        stage.add(piece, reps[piece.signature], option.plan)
    last = pieces[-1]
    if last.stream_out is not None:
        assert stage.stream is not None
        stage.outputs[last.stream_out] = stage.stream
        stage.outputs.update((name, stage.side[name]) for name in side_out)
    first = chosen[0].plan
    assert first is not None
    total = ZERO
    for step_cost in stage.step_costs:
        total = total + step_cost
    plan = Plan(
        model=graph.name,
        mesh=Mesh(("x",), (tensor,)),
        machine=machine,
        objective=first.objective,
        tensors=stage.tensors,
        steps=stage.steps,
        inputs=list(graph.inputs),
        outputs={name: stage.outputs[name] for name in graph.outputs},
        cost=total,
        step_costs=stage.step_costs,
        weight_origins=graph.weight_origins(),
    )
    plan.report = PlanReport(memory=plan_memory(plan).to_record(), cost=cost_breakdown(plan))
    return plan
