"""A pipeline plan's plan.json (``optimize --pipeline``): the stage search's choice, its stages and how it
compares, as :class:`PipelinePlanRecord`; written and read here like every plan.json record.

It is marked by ``"plan": "pipeline"``. Lowered (``optimize --pipeline`` without ``--plan-only``), each stage
names its own plan directory (``stage<s>/``: an ordinary SPMD plan of the stage on its tensor group) and the
global ranks of each of its replicas; a plan-only pipeline plan has neither, and ``run`` and ``check`` say so
instead of failing on a missing field (docs/pipeline.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unity_eq.errors import PlanError
from unity_eq.planfile.checks import PLAN_FORMAT_VERSION, REDO, bad
from unity_eq.planfile.codec import Record
from unity_eq.planfile.manifest import manifest_of

__all__ = [
    "PIPELINE_PLAN",
    "ConfigRecord",
    "PipelinePlanRecord",
    "SpmdRecord",
    "StageRecord",
    "StageSearchRecord",
    "check_lowered_stages",
    "is_lowered_pipeline",
    "is_pipeline_plan",
    "read_pipeline_record",
    "refuse_pipeline_plan",
    "write_pipeline_json",
]

PIPELINE_PLAN = "pipeline"
REDO_PIPELINE = "Restore the plan's own files or re-run `unity-eq optimize --pipeline`."


@dataclass(frozen=True, kw_only=True)
class ConfigRecord(Record):
    """A configuration of the stage search and its predicted step (unity_eq.stages.StagePlan)."""

    tensor: int  # devices per tensor group (t)
    stages: int  # pipeline stages (p)
    data: int  # data-parallel replicas of each stage (d)
    microbatch: int  # samples per microbatch on one replica
    microbatches: int  # per step (m): batch = d · m · microbatch
    schedule: str  # 1f1b or gpipe
    recompute: str  # none, full, or stage (each stage recomputes only when keeping would not fit)
    zero: int  # ZeRO level over the data axis (0-3)
    order: str  # rank order, slowest axis first (pdt: stages across data replicas; dpt: the other way)
    policy: str  # which intra-op plan of each piece (fastest, sharded, smallest)
    step_s: float
    pipeline_s: float
    sync_s: float
    bubble: float
    peak_bytes: float
    fits: bool


@dataclass(frozen=True, kw_only=True)
class StageRecord(Record):
    """One pipeline stage: its pieces and nodes, devices, time per microbatch and memory per device."""

    index: int
    pieces: tuple[int, ...]  # [first, end) in the model's pieces
    first_node: str
    last_node: str
    receives: str | None  # the activation it gets from the previous stage (None: the model inputs)
    sends: str | None  # the activation it passes on (None: the model outputs)
    #: side tensors (an attention mask every layer reads) it receives from stage 0, point to point, per microbatch
    side_receives: tuple[str, ...] = ()
    #: stage 0: the side tensors it makes and sends to every later stage that reads them (``side_receives``)
    side_sends: tuple[str, ...] = ()
    ranks: str  # its devices, e.g. "0-63" or "0-7, 64-71" (rank = device)
    device: str  # their kind
    recomputes: bool = False  # whether it keeps its pieces' inputs only and runs their forwards again
    seconds: float  # forward (and backward) of one microbatch, sends included
    weight_bytes: float
    weight_state_bytes: float
    activation_bytes: float
    total_bytes: float
    directory: str | None = None  # its plan directory, relative to the pipeline plan's (lowered plans only)
    #: the global ranks of each data-parallel replica of the stage, in tensor-rank order: rank
    #: ``replicas[r][k]`` runs tensor rank k of replica r (lowered plans only)
    replicas: tuple[tuple[int, ...], ...] = ()
    #: the plan hash of its plan directory (its plan.json's ``plan_hash``, lowered plans only): ``run`` and
    #: ``check`` refuse a stage directory whose plan is not the one lowered with this pipeline plan
    plan_hash: str | None = None


@dataclass(frozen=True, kw_only=True)
class StageSearchRecord(Record):
    """How the stage search went."""

    evaluated: int
    fitting: int
    saturations: int  # (tensor-group size, microbatch) pairs whose pieces were saturated
    enodes: int
    pieces: int
    distinct_pieces: int
    microbatch_sizes: tuple[int, ...]
    group_sizes: tuple[int, ...]
    seconds: float
    static_batch: int | None = None  # the model's own batch when static: the only microbatch it allows


@dataclass(frozen=True, kw_only=True)
class SpmdRecord(Record):
    """The SPMD search's best plan on the same workload (``optimize --objective training``: the one-stage case
    of the training search), its step priced as the stage search prices one."""

    mesh: str | None  # None: the SPMD search found no plan that fits (``note`` says why)
    step_s: float | None  # its cost over ``passes`` passes plus the optimizer's update
    cost_s: float | None  # its plan's own cost: one forward and backward pass with its gradient all-reduces
    passes: int = 1  # passes per step: a model with a static batch accumulates batch / its batch
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class PipelinePlanRecord(Record):
    """plan.json of a pipeline plan (docs/plan-format.md, "Pipeline plans")."""

    format_version: int
    plan: str  # always "pipeline"
    unity_eq_version: str
    model: str
    source: str | None
    objective: str
    batch: int
    machine: str
    devices: int
    nodes: int
    capacity_bytes: float
    chosen: ConfigRecord
    stages: tuple[StageRecord, ...]
    without_pipeline: ConfigRecord | None  # the best configuration with one stage
    search: StageSearchRecord
    fingerprint: str | None = None  # of what the model computes (frontends.onnx_read.model_fingerprint)
    spmd: SpmdRecord | None = None  # the SPMD search's best on the same workload (the training search)
    written: tuple[str, ...] = ()  # every file the plan wrote, relative to its folder (planfile.manifest)

    @property
    def lowered(self) -> bool:
        """Whether every stage has its plan directory (``optimize --pipeline`` without ``--plan-only``)."""
        return all(stage.directory for stage in self.stages)


def write_pipeline_json(path: Path, record: PipelinePlanRecord) -> None:
    """Write plan.json into the folder the plan was built in, with the manifest of every file written there
    (``written``: its stage directories' files included)."""
    record = dataclasses.replace(record, written=manifest_of(path.parent))
    path.write_text(json.dumps(record.to_json(), indent=1))


def _raw(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: unreadable plan.json ({exc}). {REDO}") from None


def is_pipeline_plan(path: Path) -> bool:
    """Whether ``path`` (a plan.json) holds a pipeline plan; False when unreadable (the reader says why)."""
    try:
        raw = _raw(path)
    except PlanError:
        return False
    return isinstance(raw, dict) and raw.get("plan") == PIPELINE_PLAN


def is_lowered_pipeline(path: Path) -> bool:
    """Whether ``path`` (a plan.json) holds a pipeline plan whose stages have their plan directories."""
    if not is_pipeline_plan(path):
        return False
    stages = _raw(path).get("stages")
    return isinstance(stages, list) and bool(stages) and all(isinstance(s, dict) and s.get("directory") for s in stages)


def refuse_pipeline_plan(path: Path, command: str) -> None:
    """An SPMD reader (``run_plan``, ``load_plan_dir``) given a pipeline plan: one PlanError saying what it is and
    what runs it."""
    if not is_pipeline_plan(path):
        return
    if not is_lowered_pipeline(path):
        raise PlanError(
            f"{path}: a plan-only pipeline plan (`optimize --pipeline --plan-only`) has no stage directories: it is "
            f"planned and explained, not lowered, so `{command}` cannot run it. `unity-eq explain {path.parent}` "
            "shows it; `unity-eq optimize --pipeline` without `--plan-only` writes one that runs."
        )
    raise PlanError(
        f"{path}: a pipeline plan, run stage by stage: the local backend runs it (`unity-eq run {path.parent}`, "
        "`unity-eq check MODEL DIR`, `unity_eq.runtime.pipeline.run_pipeline`) and the MPI backend run it; "
        "`run_plan` runs SPMD plans only."
    )


def read_pipeline_record(path: Path) -> PipelinePlanRecord:
    raw = _raw(path)
    if not isinstance(raw, dict) or raw.get("plan") != PIPELINE_PLAN:
        raise PlanError(f'{path}: not a pipeline plan (no "plan": "pipeline"). {REDO}')
    if raw.get("format_version") != PLAN_FORMAT_VERSION:
        raise PlanError(
            f"{path}: plan format version {raw.get('format_version')!r}, this unity-eq reads {PLAN_FORMAT_VERSION}. "
            f"{REDO}"
        )
    record = PipelinePlanRecord.from_json(raw, path, "")
    _check_consistent(record, path)
    return record


def check_lowered_stages(record: PipelinePlanRecord, path: Path) -> None:
    """What running a lowered pipeline plan relies on: one stage per stage of the chosen configuration (the
    stage count is ``chosen.stages``), each with its own plan directory inside the plan and its plan hash,
    the first reading the model inputs and the last making the model outputs, ``chosen.data`` replicas of
    ``chosen.tensor`` ranks each, no rank twice. A stage list edited by hand (a stage deleted: the run would
    write an intermediate tensor as the model's output) is one PlanError naming the stage."""
    chosen, stages = record.chosen, record.stages
    if len(stages) < chosen.stages:
        raise PlanError(
            f"{path}: stage {len(stages)} is missing: the chosen configuration has {chosen.stages} stages, "
            f"'stages' lists {len(stages)}. {REDO_PIPELINE}"
        )
    if len(stages) > chosen.stages:
        raise PlanError(
            f"{path}: stage {chosen.stages} is one too many: the chosen configuration has {chosen.stages} stages, "
            f"'stages' lists {len(stages)}. {REDO_PIPELINE}"
        )
    seen: set[int] = set()
    directories: set[str] = set()
    for stage in stages:
        where = f"stage {stage.index} ({stage.directory}/)"
        directory = str(stage.directory)
        if Path(directory).name != directory or directory in (".", "..") or directory in directories:
            raise bad(path, f"stages[{stage.index}].directory", "a folder of its own in the plan folder", directory)
        directories.add(directory)
        if not stage.plan_hash:
            raise PlanError(f"{path}: {where} records no plan hash (an older unity-eq wrote it). {REDO_PIPELINE}")
        _check_ends(path, where, stage, chosen.stages)
        if len(stage.replicas) != chosen.data or any(len(r) != chosen.tensor for r in stage.replicas):
            raise bad(
                path,
                f"stages[{stage.index}].replicas",
                f"{chosen.data} replica(s) of {chosen.tensor} rank(s) (the chosen configuration)",
                [list(r) for r in stage.replicas],
            )
        ranks = [rank for replica in stage.replicas for rank in replica]
        if seen & set(ranks) or len(set(ranks)) != len(ranks):
            raise bad(
                path, f"stages[{stage.index}].replicas", "ranks no other stage runs", [list(r) for r in stage.replicas]
            )
        seen.update(ranks)


def _check_ends(path: Path, where: str, stage: StageRecord, count: int) -> None:
    """The first stage reads the model inputs and only it; the last makes the model outputs and only it."""
    first, last = stage.index == 0, stage.index == count - 1
    if first != (stage.receives is None):
        got = "the model inputs" if stage.receives is None else f"the activation {stage.receives!r}"
        rule = "first stage reads the model inputs" if first else "stages after the first receive an activation"
        raise PlanError(f"{path}: {where} receives {got}; the {rule}. {REDO_PIPELINE}")
    if last != (stage.sends is None):
        got = "the model outputs" if stage.sends is None else f"the activation {stage.sends!r}"
        rule = "last stage makes the model outputs" if last else "stages before the last send an activation"
        raise PlanError(f"{path}: {where} makes {got}; the {rule}. {REDO_PIPELINE}")


def _check_consistent(record: PipelinePlanRecord, path: Path) -> None:
    """What explain relies on beyond the fields' types: stages in order over the pieces, times that are
    finite and not negative, at least one microbatch."""
    if not record.stages:
        raise bad(path, "stages", "at least one stage", [])
    if record.chosen.microbatches < 1:
        raise bad(path, "chosen.microbatches", "a positive integer", record.chosen.microbatches)
    end = 0
    for k, stage in enumerate(record.stages):
        if stage.index != k:
            raise bad(path, f"stages[{k}].index", f"{k} (stages in order)", stage.index)
        if len(stage.pieces) != 2 or stage.pieces[0] != end or stage.pieces[1] <= stage.pieces[0]:
            raise bad(path, f"stages[{k}].pieces", f"[{end}, end) with end > {end}", list(stage.pieces))
        end = stage.pieces[1]
        if not (math.isfinite(stage.seconds) and stage.seconds >= 0):
            raise bad(path, f"stages[{k}].seconds", "a finite number of seconds, not negative", stage.seconds)
    if not sum(stage.seconds for stage in record.stages) > 0:
        raise bad(path, "stages[].seconds", "some stage taking time", 0)
    for name, config in (("chosen", record.chosen), ("without_pipeline", record.without_pipeline)):
        if config is not None and not (math.isfinite(config.step_s) and config.step_s > 0):
            raise bad(path, f"{name}.step_s", "a positive number of seconds", config.step_s)
