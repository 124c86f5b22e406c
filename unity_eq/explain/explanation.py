"""The explain report as records: :class:`Explanation` (what ``render`` prints and ``--json`` writes), one
:class:`OpRow` per compute step and one :class:`TrafficRow` per step that communicates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from unity_eq.planfile import (
    AxisRecord,
    BaselineRecord,
    CostRecord,
    ExtractionRecord,
    MemoryUsageRecord,
    MeshSearchRecord,
    ParallelismRecord,
)


@dataclass(frozen=True)
class OpInput:
    tensor: str
    placement: Mapping[str, str]  # mesh axis -> placement


@dataclass(frozen=True)
class OpRow:
    """One compute step: its op, the tensor it makes (with the source model's name) and their placements."""

    step: int
    op: str
    output: str
    source: str | None
    placement: Mapping[str, str]
    shape: tuple[int, ...] | None
    local_shape: tuple[int, ...] | None
    inputs: tuple[OpInput, ...]
    compute_s: float | None
    node: str = ""  # the source model's node (ONNX name) this op is, when it is one: what Netron shows

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "op": self.op,
            "node": self.node,
            "output": self.output,
            "source": self.source,
            "placement": dict(self.placement),
            "shape": None if self.shape is None else list(self.shape),
            "local_shape": None if self.local_shape is None else list(self.local_shape),
            "inputs": [{"tensor": i.tensor, "placement": dict(i.placement)} for i in self.inputs],
            "compute_s": self.compute_s,
        }


@dataclass(frozen=True)
class TrafficRow:
    """One step that communicates: the collective, its mesh axis, the tensor it moves and its time."""

    step: int
    kind: str
    axis: str | None
    tensor: str | None
    of: str  # the source model's tensor it moves (a piece of)
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # the fields in order, all plain values


@dataclass(frozen=True)
class Explanation:
    """The explain report: what :func:`render` prints and ``--json`` writes (:meth:`to_json`)."""

    model: str
    machine: str | None
    objective: str | None
    mesh_label: str  # ``x=2,y=4``, and `` on devices 0-3`` when the plan leaves devices idle
    axis_names: tuple[str, ...]
    axes: tuple[AxisRecord, ...]  # how the mesh axes sit on the machine (none when plan.json has no machine)
    cost: CostRecord | None
    memory: MemoryUsageRecord | None
    baselines: tuple[tuple[str, BaselineRecord], ...]  # in BASELINE_ORDER
    mesh_search: MeshSearchRecord | None
    parallelism: ParallelismRecord | None
    extraction: ExtractionRecord | None
    ops: tuple[OpRow, ...]
    communication: tuple[TrafficRow, ...]
    pcg: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def total_s(self) -> float | None:
        return self.cost.total_s if self.cost else None

    @property
    def compute_s(self) -> float | None:
        return self.cost.compute_s if self.cost else None

    @property
    def communication_s(self) -> float | None:
        return self.cost.communication_s if self.cost else None

    def to_json(self) -> dict[str, Any]:
        axes = [a.to_json() for a in self.axes] if self.axes else [{"name": a} for a in self.axis_names]
        return {
            "model": self.model,
            "machine": self.machine,
            "objective": self.objective,
            "mesh": {"label": self.mesh_label, "axes": axes},
            "cost": self.cost.to_json() if self.cost else {},
            "memory": self.memory.to_json() if self.memory else {},
            "baselines": [{"name": name, **b.to_json()} for name, b in self.baselines],
            "plan_vs_baselines": {name: b.ratio for name, b in self.baselines},
            "mesh_search": self.mesh_search.to_json() if self.mesh_search else {},
            "parallelism": self.parallelism.to_json() if self.parallelism else {},
            "extraction": self.extraction.to_json() if self.extraction else {},
            "ops": [op.to_json() for op in self.ops],
            "communication": [row.to_json() for row in self.communication],
            "pcg": list(self.pcg),
            "notes": list(self.notes),
        }
