"""A parallel plan: the extracted PCG as an ordered list of steps over tensors with placements.

Steps are frozen dataclasses forming one closed union, :data:`Step`; every stage that consumes a plan
(cost, lower, runtime, explain) handles them with an exhaustive ``match`` so that adding a step kind is a
type error until each stage handles it. The collectives are one member of the union, :class:`CollectiveStep`:
each kind's step class lives in its module of :mod:`unity_eq.collectives`, and stages ask ``step.kind`` (its
price, placement change, lowering, runtime op, labels) rather than naming kinds, so a new kind adds no case here.

=================  ===========================  =====================================================
step               parallel op (DESIGN.md)      what each device does
=================  ===========================  =====================================================
``LoadInput``      Input                        reads a model input (whole)
``LoadWeight``     Weight                       reads an initializer (whole; slices come from ``Slice``)
``Compute``        any ONNX op                  runs the op on its local pieces
``Slice``          Partition(x, dim, axis)      keeps its chunk along ``dim`` (free for weights/inputs)
``AllGather``      Combine(x, dim, axis)        concatenates the chunks of its axis group along ``dim``
``AllReduce``      Reduce(x, axis)              sums the pieces of its axis group
``Replicated``     Replicate(x, axis)           nothing in the forward pass (marks a gradient all-reduce)
=================  ===========================  =====================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from typing_extensions import assert_never

from unity_eq.collectives import AllGather, AllReduce, CollectiveStep, Replicated, Slice
from unity_eq.cost import Cost, Objective
from unity_eq.ir import Mesh, Placement, Replicate, Shard, WeightOrigin, default_origin
from unity_eq.machine import Machine
from unity_eq.planfile import PlanReport, StatsRecord

__all__ = [
    "AllGather",
    "AllReduce",
    "CollectiveStep",
    "Compute",
    "Const",
    "LoadInput",
    "LoadWeight",
    "Plan",
    "PlanTensor",
    "Replicated",
    "Slice",
    "Step",
    "renamed_step",
    "step_inputs",
    "step_outputs",
]


@dataclass(frozen=True)
class PlanTensor:
    """One tensor of the plan: its global shape and dtype, and its placement on each mesh axis."""

    id: str
    shape: tuple[int, ...]
    dtype: str
    placement: tuple[Placement, ...]
    source: str | None = None  # the ONNX tensor of the original model it equals, if any
    value: str | None = None  # the ONNX tensor whose (global) value it holds, sharded or not (for reports)

    def local_shape(self, mesh: Mesh) -> tuple[int, ...]:
        """The shape of each device's piece: sharded dims divided by their axis sizes."""
        shape = list(self.shape)
        for placement, size in zip(self.placement, mesh.sizes, strict=True):
            if isinstance(placement, Shard):
                shape[placement.dim] //= size
        return tuple(shape)

    def local_bytes(self, mesh: Mesh) -> int:
        return math.prod(self.local_shape(mesh)) * np.dtype(self.dtype).itemsize if self.dtype != "none" else 0

    def placement_str(self) -> list[str]:
        return [str(p) for p in self.placement]


@dataclass(frozen=True)
class Const:
    """A literal integer-list input of an op (Reshape's shape, Slice's starts…)."""

    values: tuple[int, ...]


InputRef = str | Const | None  # a tensor id, a literal, or an absent optional input


@dataclass(frozen=True)
class _Load:  # a step that loads a named tensor of the model as ``out`` (one kind per source, to match on)
    out: str
    name: str


@dataclass(frozen=True)
class LoadInput(_Load):
    """Load the model input ``name``."""


@dataclass(frozen=True)
class LoadWeight(_Load):
    """Load the weight (an initializer) ``name``."""


@dataclass(frozen=True)
class Compute:
    outputs: tuple[str, ...]  # "" for an output nobody reads
    op_type: str
    inputs: tuple[InputRef, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""
    node: str = ""  # the original node's name, when known


#: The closed union of steps: a collective of any kind is a :class:`CollectiveStep` (``Slice``, ``AllGather``,
#: ``AllReduce``, ``Replicated``…, one per module of :mod:`unity_eq.collectives`), handled through its ``kind``.
Step = LoadInput | LoadWeight | Compute | CollectiveStep


def step_outputs(step: Step) -> tuple[str, ...]:
    match step:
        case Compute(outputs=outputs):
            return tuple(o for o in outputs if o)
        case LoadInput(out=out) | LoadWeight(out=out) | CollectiveStep(out=out):
            return (out,)
        case _:
            assert_never(step)


def renamed_step(
    step: Step, rename: Callable[[str], str], weights: Mapping[str, str], inputs: Mapping[str, str]
) -> Step:
    """``step`` with its tensors renamed by ``rename``, the weights it loads by ``weights`` and the model inputs
    it loads by ``inputs`` (names absent from either stay): a piece's plan put into a whole model's or a
    pipeline stage's (``extract.blocks``, ``stages.stitch``)."""
    match step:
        case LoadInput(out=out, name=name):
            return LoadInput(rename(out), inputs.get(name, name))
        case LoadWeight(out=out, name=name):
            return LoadWeight(rename(out), weights.get(name, name))
        case Compute(outputs=outputs, op_type=op, inputs=sources, attrs=attrs, domain=domain, node=node):
            return Compute(
                tuple(rename(o) if o else "" for o in outputs),
                op,
                tuple(rename(i) if isinstance(i, str) else i for i in sources),
                attrs,
                domain,
                node,
            )
        case CollectiveStep():
            return step.renamed(rename)
        case _:
            assert_never(step)


def step_inputs(step: Step) -> tuple[str, ...]:
    match step:
        case Compute(inputs=inputs):
            return tuple(i for i in inputs if isinstance(i, str))
        case CollectiveStep(src=src):
            return (src,)
        case LoadInput() | LoadWeight():
            return ()
        case _:
            assert_never(step)


@dataclass
class Plan:
    """The chosen parallel computation graph with its predicted cost."""

    model: str
    mesh: Mesh
    machine: Machine
    objective: Objective
    tensors: dict[str, PlanTensor]
    steps: list[Step]
    inputs: list[str]
    outputs: dict[str, str]  # model output name -> tensor id
    cost: Cost
    step_costs: list[Cost] = field(default_factory=list)
    stats: StatsRecord = field(default_factory=StatsRecord)  # how the search went (saturation, timings)
    # What the search found besides the plan, as plan.json fields: the memory per device, the meshes tried,
    # the baselines and how extraction handled memory (see unity_eq.search and docs/plan-format.md).
    report: PlanReport = field(default_factory=PlanReport)
    #: where each weight it loads comes from (``Graph.weight_origins``): which are trainable, of which source
    #: parameters; a weight missing here is judged by its dtype and rank (``ir.default_origin``)
    weight_origins: Mapping[str, WeightOrigin] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.objective = Objective.parse(self.objective)  # a name is accepted (hand-made plans in tests)

    def origin(self, step: LoadWeight) -> WeightOrigin:
        """Where the weight ``step`` loads comes from (trainable or a constant; its source parameters)."""
        found = self.weight_origins.get(step.name)
        if found is not None:
            return found
        tensor = self.tensors[step.out]
        return default_origin(step.name, tensor.dtype, len(tensor.shape))

    # ------------------------------------------------------------------------------------------------
    def collectives(self) -> list[CollectiveStep]:
        """The steps that communicate in the forward pass (plan.json's ``collectives``), in plan order."""
        return [s for s in self.steps if isinstance(s, CollectiveStep) and s.kind.communicates]

    def is_replicated(self) -> bool:
        """True when no tensor is sharded or partial: the plan is the original graph on every device."""
        return (
            all(isinstance(p, Replicate) for t in self.tensors.values() for p in t.placement) and not self.collectives()
        )

    def validate(self) -> list[str]:
        """Check the placement transitions of every step; returns problems (empty when valid)."""
        problems: list[str] = []
        defined: set[str] = set()
        for index, step in enumerate(self.steps):
            for name in step_inputs(step):
                if name not in defined:
                    problems.append(f"step {index} ({type(step).__name__}) reads {name} before it is defined")
            problems.extend(self._check_transition(index, step))
            defined.update(step_outputs(step))
        for out, tid in self.outputs.items():
            if any(not isinstance(p, Replicate) for p in self.tensors[tid].placement):
                problems.append(f"output {out} is not replicated: {self.tensors[tid].placement_str()}")
        return problems

    def _check_transition(self, index: int, step: Step) -> list[str]:
        """A collective's placement change on its axis (its kind's ``placement``); other steps have none."""
        if not isinstance(step, CollectiveStep):
            return []
        i = self.mesh.axes.index(step.axis)
        src_state = str(self.tensors[step.src].placement[i])
        out_state = str(self.tensors[step.out].placement[i])
        if (src_state, out_state) != step.kind.states(step.dims()):
            return [f"step {index} ({type(step).__name__} on {step.axis}): {src_state} -> {out_state}"]
        return []

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[type(step).__name__] = counts.get(type(step).__name__, 0) + 1
        sharded = sum(1 for t in self.tensors.values() if any(not isinstance(p, Replicate) for p in t.placement))
        return {"steps": counts, "tensors": len(self.tensors), "sharded_tensors": sharded}
