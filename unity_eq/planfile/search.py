"""What the search found (mesh_search, baselines, extraction, blocks, parallelism, memory, cost: gathered in
:class:`PlanReport`) and how it went (:class:`StatsRecord`: saturation, wall-clock timings, the profile used)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from unity_eq.planfile.checks import OBJECT, bad
from unity_eq.planfile.codec import Record, decode
from unity_eq.planfile.sections import AxisRecord, CostRecord


@dataclass(frozen=True, kw_only=True)
class TrialSecondsRecord(Record):
    saturate: float
    extract: float


@dataclass(frozen=True, kw_only=True)
class TriedRecord(Record):
    """One mesh the search tried (unity_eq.search.trial.MeshTrial) and what became of it."""

    mesh: str
    axes: tuple[AxisRecord, ...]
    status: str  # ok, infeasible (nothing fits), failed
    devices: str | None = None  # a mesh over part of the machine: its devices (``0-3``), count and kind
    device_count: int | None = None
    device_kind: str | None = None
    reason: str = ""
    cost_s: float | None = None  # its plan's cost
    compute_s: float | None = None
    communication_s: float | None = None
    extraction: str | None = None
    memory_bytes: float | None = None
    min_memory_bytes: float | None = None  # infeasible: the smallest plan found
    enodes: int | None = None
    stop_reason: str | None = None
    penalty_rounds: int | None = None
    seconds: TrialSecondsRecord | None = None
    egraph_of: str = ""  # the mesh whose e-graph it reuses (the one-device plan)
    baseline_only: bool = False  # evaluated only for a baseline (under `--mesh`)


@dataclass(frozen=True, kw_only=True)
class RunnerUpRecord(Record):
    mesh: str
    cost_s: float


@dataclass(frozen=True, kw_only=True)
class SkippedRecord(Record):
    mesh: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class MeshSearchRecord(Record):
    """``mesh_search``: the mesh chosen, those tried and skipped, and the cheapest other one."""

    chosen: str
    tried: tuple[TriedRecord, ...]
    runner_up: RunnerUpRecord | None
    skipped: tuple[SkippedRecord, ...]


@dataclass(frozen=True, kw_only=True)
class BaselineRecord(Record):
    """A hand-made strategy priced under the same cost model; ``ratio`` is its cost over the plan's."""

    description: str
    mesh: str
    devices: int
    devices_used: int  # devices doing distinct work (the rest repeat them)
    total_s: float
    compute_s: float
    communication_s: float
    memory_bytes: float
    fits: bool
    sharded: bool
    ratio: float | None


@dataclass(frozen=True, kw_only=True)
class CheapestRecord(Record):
    mesh: str
    extraction: str
    total_s: float
    communication_s: float


@dataclass(frozen=True, kw_only=True)
class TieBreakRecord(Record):
    """A tie (within ``tolerance``) went to a plan that communicates less than the cheapest."""

    tolerance: float
    cheapest: CheapestRecord
    reason: str
    note: str


@dataclass(frozen=True, kw_only=True)
class CheaperBaselineRecord(Record):
    name: str
    total_s: float
    note: str


@dataclass(frozen=True, kw_only=True)
class PlanChoiceRecord(Record):
    """How the plan relates to the baselines: the baseline it is, or a cheaper one out of the search's reach."""

    baseline: str | None
    note: str | None = None
    cheaper_baseline: CheaperBaselineRecord | None = None


@dataclass(frozen=True, kw_only=True)
class IlpProgramRecord(Record):
    """What HiGHS said about one program (unity_eq.extract.ilp.IlpReport)."""

    status: str
    objective_s: float
    lower_bound_s: float
    gap: float
    seconds: float
    variables: int
    rows: int
    greedy_objective_s: float


@dataclass(frozen=True, kw_only=True)
class IlpRecord(Record):
    """``--extractor ilp``: the exact extraction against the greedy one, and which plan was kept."""

    greedy_total_s: float
    ilp_total_s: float
    kept: str
    programs: tuple[IlpProgramRecord, ...]
    max_gap: float
    all_optimal: bool


@dataclass(frozen=True, kw_only=True)
class DifferentiableRecord(Record):
    """``--extractor differentiable`` (and ``ilp``, which runs it before the program): the relaxed search
    (unity_eq.extract.differentiable) on the chosen mesh against greedy's plan."""

    greedy_total_s: float
    differentiable_total_s: float  # its plan's cost (greedy's when no rounded plan was cheaper)
    improvement: float  # (greedy − differentiable) / greedy
    fits: bool  # its plan fits in device memory
    programs: int  # fragments searched (1 for a whole e-graph)
    improved_programs: int  # of which the rounded plan beat greedy's
    starts: int
    steps: int
    seconds: float
    device: str


@dataclass(frozen=True, kw_only=True)
class ExtractionRecord(Record):
    """``extraction``: how the plan was extracted and how memory was handled."""

    method: str
    restriction: str
    memory_penalty_rounds: int
    memory_penalty_s_per_byte: float
    memory_handling: str
    tie_break: TieBreakRecord | None
    plan_choice: PlanChoiceRecord
    ilp: IlpRecord | None = None
    differentiable: DifferentiableRecord | None = None
    #: with ``--extractor differentiable`` or ``ilp``: the extractor whose plan was kept (greedy, differentiable
    #: or ilp) and its saving over greedy's plan, (greedy − kept) / greedy
    winner: str | None = None
    winner_saving: float | None = None


@dataclass(frozen=True, kw_only=True)
class BlocksRecord(Record):
    """``blocks``: the pieces of a model optimized block by block (unity_eq.split.BlockSplit)."""

    pieces: int
    distinct: int
    nodes_per_piece: tuple[int, ...]
    cuts: tuple[str, ...]
    copies: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ParallelismRecord(Record):
    """``parallelism``: the mesh axes the plan uses and how many devices do distinct work (unity_eq.report)."""

    used_axes: tuple[str, ...]
    unused_axes: tuple[str, ...]
    devices: int
    devices_used: int
    copies: int
    machine_devices: int
    idle_devices: int | None = None  # the plan runs on part of the machine
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryUsageRecord(Record):
    """Bytes per device of a plan (unity_eq.memory.MemoryUsage)."""

    weight_bytes: float
    weight_state_bytes: float
    activation_bytes: float
    total_bytes: float
    capacity_bytes: float
    fits: bool
    #: training: the bytes of the gradients (trainable weights only, each source parameter once: docs/training.md)
    gradient_bytes: float | None = None


_USAGE_KEYS = tuple(f.name for f in dataclasses.fields(MemoryUsageRecord))


@dataclass(frozen=True, kw_only=True)
class PlanMemoryRecord(Record):
    """``memory``: the memory per device the search predicted (absent for a plan lowered without a search),
    and the weight bytes written for each rank, in one object."""

    usage: MemoryUsageRecord | None
    weight_bytes_per_rank: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**(self.usage.to_json() if self.usage else {}), "weight_bytes_per_rank": self.weight_bytes_per_rank}

    @classmethod
    def from_json(cls, raw: Any, path: Path, where: str) -> Self:
        if not isinstance(raw, dict):
            raise bad(path, where, OBJECT, raw)
        usage = MemoryUsageRecord.from_json(raw, path, where) if any(k in raw for k in _USAGE_KEYS) else None
        per_rank = raw.get("weight_bytes_per_rank", [])
        return cls(
            usage=usage,
            weight_bytes_per_rank=decode(tuple[int, ...], per_rank, path, f"{where}.weight_bytes_per_rank"),
        )


@dataclass(frozen=True, kw_only=True)
class TrainingSearchRecord(Record):
    """``optimize --objective training`` chose this SPMD plan over the best pipeline (docs/pipeline.md, "One
    planner for training"): both steps priced alike, and why the pipelines were limited or not considered."""

    step_s: float  # this plan's step as the stage search prices one (passes, the optimizer's update)
    passes: int = 1  # passes per step: a static batch smaller than the step's is accumulated
    pipeline_step_s: float | None = None  # the best pipeline of 2+ stages (None: none considered or none fits)
    pipeline: str | None = None  # its configuration, in words
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanReport:
    """What the search found besides the plan (plan.json sections of the same names; see unity_eq.search)."""

    mesh_search: MeshSearchRecord | None = None
    baselines: Mapping[str, BaselineRecord] = field(default_factory=dict)
    blocks: BlocksRecord | None = None
    extraction: ExtractionRecord | None = None
    parallelism: ParallelismRecord | None = None
    memory: MemoryUsageRecord | None = None
    cost: CostRecord | None = None
    training_search: TrainingSearchRecord | None = None


@dataclass(frozen=True, kw_only=True)
class SaturationRecord(Record):
    stop_reason: str
    iterations: int
    enodes: int
    seconds: float
    worker_peak_mib: float


@dataclass(frozen=True, kw_only=True)
class ProfileStatsRecord(Record):
    """How many op prices came from a measured profile and how many from the roofline."""

    device: str | None
    measured: int
    roofline: int


@dataclass(frozen=True, kw_only=True)
class StatsRecord(Record):
    """``stats``: how the search went (the chosen mesh's saturation, wall-clock timings, the profile used)."""

    ilp: IlpProgramRecord | None = None  # a plan of unity_eq.extract.ilp.extract_ilp
    saturation: SaturationRecord | None = None
    timings: Mapping[str, float] | None = None
    profile: ProfileStatsRecord | None = None
