"""Running a lowered pipeline plan on the local backend: the forward pass of its microbatch schedule.

A pipeline plan (``optimize --pipeline``) holds one SPMD plan directory per stage (``stage<s>/``). The batch
(dimension 0 of every input) is split into ``d`` replicas × ``m`` microbatches of ``b`` samples; each
microbatch runs stage 0's ranks (the existing local runtime, :func:`~unity_eq.runtime.execute.execute_local`),
its output feeds stage 1, and so on (the side tensors stage 0 makes, an attention mask, feed every later stage
that reads them); the last stage's outputs are put back together along dimension 0 in
replica-then-microbatch order. Replicas are independent and the stages of one microbatch run in order, so
running the microbatches one after the other computes what the schedule computes (forward only: the runtime
runs inference, as for SPMD plans).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unity_eq.errors import PlanError, RuntimeBackendError
from unity_eq.planfile import InputRecord, RunRecord
from unity_eq.planfile.pipeline import (
    REDO_PIPELINE,
    PipelinePlanRecord,
    StageRecord,
    check_lowered_stages,
    is_lowered_pipeline,
    read_pipeline_record,
)
from unity_eq.runtime.devices import choose_device, device_notes, threads_per_rank
from unity_eq.runtime.execute import execute_local
from unity_eq.runtime.plandir import PlanDir, check_inputs, load_plan_dir
from unity_eq.runtime.segments import RankProgram, build_rank_program

__all__ = [
    "PipelinePlan",
    "is_pipeline_dir",
    "load_pipeline_dir",
    "read_plan",
    "run_pipeline",
    "run_programs",
    "stage_programs",
]

Feeds = dict[str, np.ndarray]


@dataclass
class PipelinePlan:
    """A lowered pipeline plan: its record, each stage's plan directory, and the plan as one model (``whole``:
    its inputs at the full batch and the last stage's outputs, for checking inputs as an SPMD plan's are)."""

    path: Path
    record: PipelinePlanRecord
    stages: list[PlanDir]
    whole: PlanDir

    @property
    def replicas(self) -> int:
        return self.record.chosen.data

    @property
    def microbatches(self) -> int:
        return self.record.chosen.microbatches

    @property
    def microbatch(self) -> int:
        return self.record.chosen.microbatch

    @property
    def world_size(self) -> int:
        """Processes the plan runs on: stages × replicas × tensor ranks (every backend's one count)."""
        return sum(len(ranks) for stage in self.record.stages for ranks in stage.replicas)

    def place_of(self, rank: int) -> tuple[int, int, int]:
        """(stage, replica, tensor rank) of global ``rank``: the placement every backend (MPI, torch) uses."""
        for stage in self.record.stages:
            for r, ranks in enumerate(stage.replicas):
                if rank in ranks:
                    return stage.index, r, list(ranks).index(rank)
        raise PlanError(f"{self.path}: no stage runs on rank {rank}; the plan has {self.world_size} ranks.")

    def describe(self) -> str:
        c = self.record.chosen
        return f"{c.stages} stage(s) × {c.tensor} rank(s), {c.data} replica(s) × {c.microbatches} microbatch(es)"


def is_pipeline_dir(path: str | Path) -> bool:
    """Whether ``path`` is a lowered pipeline plan directory (its stages have their plan directories)."""
    return is_lowered_pipeline(Path(path) / "plan.json")


def read_plan(path: str | Path, check_files: bool = True) -> PlanDir | PipelinePlan:
    """A plan directory of either kind, read once: a lowered pipeline plan (every stage's directory read and
    checked) or an SPMD plan (:func:`load_plan_dir`, which refuses a plan-only pipeline plan saying what runs
    it; ``check_files=False``: an MPI rank checks its own device file only). ``run``, ``check`` and the MPI
    backend read plans here and dispatch on the type they get."""
    if is_pipeline_dir(path):
        return load_pipeline_dir(path)
    return load_plan_dir(path, check_files)


def _whole(path: Path, record: PipelinePlanRecord, first: PlanDir, last: PlanDir) -> PlanDir:
    samples = record.chosen.data * record.chosen.microbatches
    inputs = {
        name: InputRecord((spec.shape[0] * samples, *spec.shape[1:]), spec.dtype)
        for name, spec in first.input_specs.items()
    }
    run = RunRecord(
        model_name=record.model,
        source=record.source,
        fingerprint=record.fingerprint,
        inputs=inputs,
        outputs=tuple(last.output_names),
        files=(),
        collectives=(),
        plan_hash=None,
    )
    return PlanDir(path, run)


def load_pipeline_dir(path: str | Path) -> PipelinePlan:
    """Read a lowered pipeline plan and every stage's plan directory (the SPMD checks of each)."""
    root = Path(path)
    record = read_pipeline_record(root / "plan.json")
    if not record.lowered:
        raise PlanError(
            f"{root}: a plan-only pipeline plan (`optimize --pipeline --plan-only`) has no stage directories: it is "
            f"planned and explained, not lowered, so it cannot run. `unity-eq optimize --pipeline` without "
            "`--plan-only` writes one that runs."
        )
    check_lowered_stages(record, root / "plan.json")
    stages = [_load_stage(root, stage, record.chosen.tensor) for stage in record.stages]
    for name, spec in stages[0].input_specs.items():
        if not spec.shape or spec.shape[0] != record.chosen.microbatch:
            raise PlanError(
                f"{root}: stage 0 ({record.stages[0].directory}/) reads {name!r} of shape {list(spec.shape)}, a "
                f"microbatch of {spec.shape[0] if spec.shape else 'no'} sample(s); plan.json's `chosen.microbatch` "
                f"is {record.chosen.microbatch}. {REDO_PIPELINE}"
            )
    made = set(record.stages[0].side_sends)
    for before, after, stage in zip(stages, stages[1:], record.stages[1:], strict=False):
        wanted = [stage.receives, *stage.side_receives]
        if list(after.input_specs) != wanted or before.output_names[:1] != [stage.receives]:
            raise PlanError(
                f"{root}: stage {stage.index} does not read what stage {stage.index - 1} sends ({stage.receives!r}). "
                "Re-run `unity-eq optimize --pipeline`."
            )
        if not made.issuperset(stage.side_receives) or not set(stage.side_receives) <= set(stages[0].output_names):
            raise PlanError(
                f"{root}: stage {stage.index} reads side tensors {list(stage.side_receives)} that stage 0 does not "
                "send. Re-run `unity-eq optimize --pipeline`."
            )
    return PipelinePlan(root, record, stages, _whole(root, record, stages[0], stages[-1]))


def _load_stage(root: Path, stage: StageRecord, tensor: int) -> PlanDir:
    """A stage's plan directory, refused when it is not the one lowered with this pipeline plan: its plan hash
    is not the one plan.json records for the stage (a ``stage<s>/`` copied from another plan, even of the same
    architecture), or it runs on another number of ranks than the chosen tensor group."""
    where = f"{root}: stage {stage.index} ({stage.directory}/)"
    if not (root / str(stage.directory)).is_dir():
        raise PlanError(f"{where} is missing. {REDO_PIPELINE}")
    directory = load_plan_dir(root / str(stage.directory))
    found = directory.record.plan_hash
    if found != stage.plan_hash:
        shown = f"{found[:12]}…" if found else "none"
        raise PlanError(
            f"{where} belongs to another plan (its plan hash {shown}, plan.json records "
            f"{str(stage.plan_hash)[:12]}… for it). {REDO_PIPELINE}"
        )
    if directory.world_size != tensor:
        raise PlanError(
            f"{where} runs on {directory.world_size} rank(s), the chosen tensor group on {tensor}. {REDO_PIPELINE}"
        )
    return directory


def stage_programs(
    plan: PipelinePlan, device: str = "cpu", on_note: Callable[[str], None] | None = None
) -> list[list[RankProgram]]:
    """Each stage's rank programs (one replica's tensor group: every replica runs the same files).
    ``on_note`` hears each device note once (CUDA asked for and not usable: the CPU runs them), as
    ``run_plan``'s does."""
    programs = []
    notes: list[str] = []
    for stage in plan.stages:
        world = stage.world_size
        choices = [choose_device(device, rank) for rank in range(world)]
        notes += [note for note in device_notes(choices) if note not in notes]
        threads = threads_per_rank(world)
        programs.append([build_rank_program(stage, r, choices[r].providers, threads) for r in range(world)])
    if on_note is not None:
        for note in notes:
            on_note(note)
    return programs


def _microbatches(plan: PipelinePlan, feeds: Mapping[str, np.ndarray]) -> list[Feeds]:
    """The inputs cut along dimension 0: replica by replica, each replica's microbatches in schedule order."""
    b = plan.microbatch
    count = plan.replicas * plan.microbatches
    return [{name: value[k * b : (k + 1) * b] for name, value in feeds.items()} for k in range(count)]


def run_programs(
    plan: PipelinePlan,
    programs: list[list[RankProgram]],
    feeds: Mapping[str, np.ndarray],
    timeout: float | None = None,
    on_microbatch: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run checked inputs (``check_inputs(plan.whole, …)``) through the stages, microbatch by microbatch."""
    results: list[Feeds] = []
    parts = _microbatches(plan, feeds)
    for done, part in enumerate(parts):
        values: Feeds = part
        side: Feeds = {}  # what stage 0 sends to the later stages that read it (an attention mask)
        for stage, (directory, ranks) in enumerate(zip(plan.stages, programs, strict=True)):
            available = {**side, **values}
            try:
                values = execute_local(ranks, {name: available[name] for name in directory.input_specs}, timeout)
            except RuntimeBackendError as exc:
                raise RuntimeBackendError(f"stage {stage}, microbatch {done}: {exc}") from None
            if stage == 0:
                side = {name: values[name] for name in plan.record.stages[0].side_sends}
        results.append(values)
        if on_microbatch is not None:
            on_microbatch(done + 1, len(parts))
    return {name: np.concatenate([r[name] for r in results], axis=0) for name in plan.whole.output_names}


def run_pipeline(
    plan_dir: str | Path | PipelinePlan,
    inputs: Mapping[str, np.ndarray],
    device: str = "cpu",
    timeout: float | None = None,
    on_microbatch: Callable[[int, int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run a lowered pipeline plan on ``inputs`` (the full batch) in this process and return its outputs;
    ``on_note`` hears the device notes (:func:`stage_programs`)."""
    plan = plan_dir if isinstance(plan_dir, PipelinePlan) else load_pipeline_dir(plan_dir)
    feeds = check_inputs(plan.whole, inputs)
    return run_programs(plan, stage_programs(plan, device, on_note), feeds, timeout, on_microbatch)
