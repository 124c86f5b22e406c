"""The whole plan.json as lowering writes it (:class:`PlanRecord`, :func:`write_plan_json`), and the part
``explain`` reads (:class:`ExplainRecord`, :func:`read_explain_record`: checked, with the steps' tensors)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import assert_never

from unity_eq.planfile.checks import bad, read_plan_json
from unity_eq.planfile.codec import Record
from unity_eq.planfile.manifest import manifest_of
from unity_eq.planfile.run import CollectiveRecord
from unity_eq.planfile.search import (
    BaselineRecord,
    BlocksRecord,
    ExtractionRecord,
    MeshSearchRecord,
    ParallelismRecord,
    PlanMemoryRecord,
    StatsRecord,
    TrainingSearchRecord,
)
from unity_eq.planfile.sections import (
    CostRecord,
    MachineRecord,
    MeshRecord,
    ModelRecord,
    TensorRecord,
    WeightRecord,
)
from unity_eq.planfile.steps import (
    CollectiveStepRecord,
    ComputeStepRecord,
    InputStepRecord,
    StepRecord,
    WeightStepRecord,
)


def write_plan_json(path: Path, plan: PlanRecord) -> None:
    """Write ``plan.json`` (indent 1, as every plan so far: plan hashes and diffs stay comparable) into the
    folder the plan was built in, with the manifest of what it wrote there (``written``, see
    :func:`~unity_eq.planfile.manifest.manifest_of`)."""
    plan = dataclasses.replace(plan, written=manifest_of(path.parent))
    path.write_text(json.dumps(plan.to_json(), indent=1, default=json_default))


def json_default(value: Any) -> Any:
    """What ``json.dumps`` writes for a value it has no rule for: numpy scalars as numbers, tuples as lists,
    anything else as its text."""
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return str(value)


@dataclass(frozen=True, kw_only=True)
class PlanRecord(Record):
    """The content of plan.json (docs/plan-format.md)."""

    format_version: int
    unity_eq_version: str
    model: ModelRecord
    objective: str
    mesh: MeshRecord
    machine: MachineRecord
    cost: CostRecord
    files: tuple[str, ...]
    #: true when ``optimize --plan-only`` wrote plan.json alone: ``files`` names the device files a full
    #: optimize writes, none of which exists; ``run`` and ``check`` refuse the plan, ``explain`` reads it
    plan_only: bool = False
    tensors: Mapping[str, TensorRecord]
    steps: tuple[StepRecord, ...]
    collectives: tuple[CollectiveRecord, ...]
    shardings: Mapping[str, tuple[str, ...]]
    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    extraction: ExtractionRecord | None = None
    blocks: BlocksRecord | None = None
    parallelism: ParallelismRecord | None = None
    stats: StatsRecord
    plan_hash: str
    memory: PlanMemoryRecord
    training_search: TrainingSearchRecord | None = None
    #: every weight the plan loads: trainable or a constant, and the source parameters it is made of
    weights: Mapping[str, WeightRecord] = field(default_factory=dict)
    #: every file the plan wrote, relative to its folder (plan.json included): what a later ``optimize`` into
    #: the folder replaces (the user's other files stay), and what ``run --outputs`` may not overwrite
    written: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ExplainRecord(Record):
    """What ``explain`` and its pictures read: every section but model, mesh, tensors and steps may be absent
    (a plan lowered without a search has no mesh_search, baselines, extraction or parallelism)."""

    model: ModelRecord
    objective: str | None = None
    mesh: MeshRecord
    plan_only: bool = False
    machine: MachineRecord | None = None
    cost: CostRecord | None = None
    tensors: Mapping[str, TensorRecord]
    steps: tuple[StepRecord, ...]
    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    extraction: ExtractionRecord | None = None
    parallelism: ParallelismRecord | None = None
    memory: PlanMemoryRecord | None = None
    training_search: TrainingSearchRecord | None = None
    weights: Mapping[str, WeightRecord] = field(default_factory=dict)

    @property
    def training(self) -> bool:
        return self.objective == "training"


def read_explain_record(meta_path: Path) -> ExplainRecord:
    """Read plan.json for ``explain``: the checks `run` makes, then every field explain reads with its type,
    and that the steps name tensors the plan has; or one PlanError naming the file and the field."""
    meta = read_plan_json(meta_path, need=("steps", "tensors"))
    record = ExplainRecord.from_json(meta, meta_path, "")
    mesh = record.mesh
    if len(mesh.sizes) != len(mesh.axes):
        raise bad(meta_path, "mesh.sizes", f"{len(mesh.axes)} sizes (one per axis)", list(mesh.sizes))
    tensors = record.tensors
    for i, step in enumerate(record.steps):
        names: list[tuple[str, str]]  # (field, tensor)
        match step:
            case ComputeStepRecord():
                names = [("outputs", out) for out in step.outputs if out]
            case WeightStepRecord():
                names = []  # its tensor may be gone: folded into what it makes at lowering
            case InputStepRecord():
                names = [("out", step.out)]
            case CollectiveStepRecord():
                names = [("out", step.out), ("src", step.src)]
            case _:
                assert_never(step)
        for key, name in names:
            if name not in tensors:
                what = "tensors named in 'tensors'" if key == "outputs" else "a tensor named in 'tensors'"
                raise bad(meta_path, f"steps[{i}].{key}", what, name)
    return record
