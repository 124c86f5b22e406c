"""Choosing the plan among the meshes tried: ties within TIE_TOLERANCE, the ceiling of baselines a plan may not
exceed, and the reasons written to plan.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from unity_eq.cost import TIE_TOLERANCE, within
from unity_eq.extract import Extractor
from unity_eq.extract.blocks import BlockExtractor
from unity_eq.machine import Machine
from unity_eq.memory import infeasible_message
from unity_eq.plan import Plan
from unity_eq.planfile import (
    CheaperBaselineRecord,
    CheapestRecord,
    ExtractionRecord,
    MeshSearchRecord,
    PlanChoiceRecord,
    PlanReport,
    RunnerUpRecord,
    SkippedRecord,
    TieBreakRecord,
)
from unity_eq.report import gradient_overlap, parallelism
from unity_eq.search.baselines import Baseline, uses_axes
from unity_eq.search.runner import THREE_AXIS_NODE_BUDGET
from unity_eq.search.trial import MeshTrial, TrialStatus
from unity_eq.split import BlockSplit


@dataclass
class SearchResult:
    plan: Plan
    trial: MeshTrial
    trials: list[MeshTrial]
    baselines: dict[str, Baseline]
    extractors: dict[str, Extractor | BlockExtractor] = field(default_factory=dict)  # mesh label -> extractor
    tie_break: TieBreakRecord | None = None  # set when a tie went to a plan that communicates less
    split: BlockSplit | None = None  # the pieces, when the model was optimized block by block

    def report(self) -> PlanReport:
        """The plan.json fields of the search: mesh_search, baselines, blocks, memory handling, parallelism."""
        cost = self.plan.cost.total
        return PlanReport(
            mesh_search=MeshSearchRecord(
                chosen=self.trial.label,
                tried=tuple(t.to_record() for t in self.trials if t.status != TrialStatus.SKIPPED),
                runner_up=runner_up(self.trials, self.trial),
                skipped=tuple(
                    SkippedRecord(mesh=t.label, reason=t.reason) for t in self.trials if t.status == TrialStatus.SKIPPED
                ),
            ),
            baselines={name: b.to_record(cost) for name, b in self.baselines.items()},
            blocks=self.split.to_record() if self.split is not None else None,
            extraction=ExtractionRecord(
                method="greedy DAG" + ("" if self.trial.extraction == "greedy" else f", {self.trial.extraction}"),
                restriction=self.trial.extraction,
                memory_penalty_rounds=self.trial.penalty_rounds,
                memory_penalty_s_per_byte=self.trial.penalty,
                memory_handling=memory_handling(self.trial),
                tie_break=self.tie_break,
                plan_choice=plan_choice(self),
            ),
            parallelism=parallelism(self.plan),
        )


def memory_handling(trial: MeshTrial) -> str:
    if trial.penalty_rounds == 0:
        return "the cheapest extraction fits; no memory penalty"
    how = (
        f"the penalized extraction ({trial.penalty:.3g} s per byte) fits"
        if trial.penalty > 0
        else f"the {trial.extraction} extraction was the cheapest that fits"
    )
    return (
        f"the cheapest extraction did not fit; re-extracted {trial.penalty_rounds} time(s) with a growing "
        f"penalty on per-device bytes; {how}"
    )


def runner_up(trials: list[MeshTrial], chosen: MeshTrial) -> RunnerUpRecord | None:
    others = [
        t for t in trials if t is not chosen and t.status == TrialStatus.OK and t.candidate and t.plan is not None
    ]
    if not others:
        return None
    best = min(others, key=lambda t: t.plan.cost.total if t.plan else math.inf)
    assert best.plan is not None
    return RunnerUpRecord(mesh=best.label, cost_s=best.plan.cost.total)


def baseline_ceiling(baselines: dict[str, Baseline]) -> float:
    """The cost the plan may not exceed: the cheapest baseline that fits and that the search could return
    itself (one extracted from a candidate mesh's e-graph)."""
    returnable = [
        b.cost.total
        for b in baselines.values()
        if b.memory.fits and b.extraction is not None and b.trial is not None and b.trial.candidate
    ]
    return min(returnable, default=math.inf)


def exposed_communication(plan: Plan) -> float:
    """The communication a plan cannot hide: in training, its gradient all-reduces less the part that runs on
    their own stream behind the backward pass (report.gradient_overlap); in inference, all of it."""
    if not plan.objective.training:
        return plan.cost.comm
    return plan.cost.comm - gradient_overlap(plan).overlappable_s


def choose_trial(candidates: list[MeshTrial], ceiling: float = math.inf) -> tuple[MeshTrial, TieBreakRecord | None]:
    """The cheapest plan that fits over all meshes and extractions; plans within TIE_TOLERANCE of it are ties,
    and among ties the one with the least exposed communication wins (the least certain part of the model;
    a gradient all-reduce that overlaps the backward pass is counted in full by the cost, so a plan that
    moves traffic there is not the riskier one) — but never one that costs more than ``ceiling``: a plan
    reported next to a cheaper baseline would be a lie."""
    options = [(t, e, m) for t in candidates for e, m in t.extractions if m.fits]
    cheapest = min(options, key=lambda o: (o[1].plan.cost.total, len(o[0].mesh.axes)))
    least = cheapest[1].plan.cost.total
    ceiling = max(ceiling, least)
    ties = [
        o for o in options if within(o[1].plan.cost.total, least, TIE_TOLERANCE) and o[1].plan.cost.total <= ceiling
    ]
    # exact ties go to a mesh over all devices (as on a homogeneous machine), then to the fewest devices
    trial, extraction, memory = min(
        ties,
        key=lambda o: (
            exposed_communication(o[1].plan),
            o[1].plan.cost.total,
            bool(o[0].scope),
            o[0].mesh.size if o[0].scope else 0,
            len(o[0].mesh.axes),
        ),
    )
    trial.plan, trial.memory = extraction.plan, memory
    trial.extraction, trial.penalty = extraction.restriction.name, extraction.penalty
    if extraction is cheapest[1]:
        return trial, None
    reason = (
        f"within {TIE_TOLERANCE:.0%} of the cheapest plan, this one communicates less "
        f"({exposed_communication(extraction.plan) * 1e3:.3f} ms not hidden behind compute instead of "
        f"{exposed_communication(cheapest[1].plan) * 1e3:.3f} ms)"
    )
    cheaper = f"{cheapest[0].label}" + (
        "" if cheapest[1].restriction.name == "greedy" else f" ({cheapest[1].restriction.name})"
    )
    return trial, TieBreakRecord(
        tolerance=TIE_TOLERANCE,
        cheapest=CheapestRecord(
            mesh=cheapest[0].label,
            extraction=cheapest[1].restriction.name,
            total_s=cheapest[1].plan.cost.total,
            communication_s=cheapest[1].plan.cost.comm,
        ),
        reason=reason,
        note=(
            f"{cheaper} is predicted {cheapest[1].plan.cost.total * 1e3:.3f} ms, "
            f"{1 - cheapest[1].plan.cost.total / extraction.plan.cost.total:.1%} less than this plan; {reason}"
        ),
    )


def plan_choice(result: SearchResult) -> PlanChoiceRecord:
    """How the returned plan relates to the baselines (plan.json ``extraction.plan_choice``).

    The baselines' own extractions are among the search's options (the one-device plan is a mesh of its
    own), so a returnable baseline is never cheaper than the plan; when the plan *is* a baseline (no other
    extraction was cheaper) it says so. Only under ``--mesh`` can a baseline be out of the search's reach
    (one device, or a mesh other than the forced one); a cheaper one is then named with what to do.
    """
    plan = result.plan
    same = next(
        (name for name, b in result.baselines.items() if b.extraction is not None and b.extraction.plan is plan), None
    )
    note = f"the plan is the {same} baseline: no other extraction was cheaper" if same is not None else None
    cheaper = [
        (name, b)
        for name, b in result.baselines.items()
        if b.memory.fits
        and b.cost.total < plan.cost.total * (1 - 1e-9)
        and (b.trial is None or not b.trial.candidate)  # a returnable one is never cheaper (choose_trial's ceiling)
    ]
    if not cheaper:
        return PlanChoiceRecord(baseline=same, note=note)
    name, b = min(cheaper, key=lambda item: item[1].cost.total)
    why = f"it runs on {b.mesh if name != 'one_device' else 'one device'}, which the search did not consider: "
    why += f"`--mesh` forced {result.trial.label}"
    todo = "drop `--mesh` to let the search return it"
    return PlanChoiceRecord(
        baseline=same,
        note=note,
        cheaper_baseline=CheaperBaselineRecord(
            name=name,
            total_s=b.cost.total,
            note=f"{name} ({b.description}) costs {b.cost.total / plan.cost.total:.2f}× this plan: {why}; {todo}",
        ),
    )


def skip_deeper(trials: list[MeshTrial]) -> str | None:
    done = [t for t in trials if t.status == TrialStatus.OK and t.plan is not None and t.candidate]
    if not done:
        return None
    best = min(done, key=lambda t: t.plan.cost.total if t.plan else math.inf)
    assert best.plan is not None
    if len(best.mesh.axes) < 2 or len(uses_axes(best.plan)) < 2:
        return f"the best plan so far ({best.label}) does not use two axes; a third would not help"
    biggest = max((t.enodes for t in done if len(t.mesh.axes) == 2), default=0)
    if 4 * biggest > THREE_AXIS_NODE_BUDGET:
        return (
            f"a 3-axis e-graph would have about {4 * biggest} e-nodes (budget {THREE_AXIS_NODE_BUDGET}); "
            "pass `--mesh` to force one"
        )
    return None


def no_plan_fits(trials: list[MeshTrial], machine: Machine) -> str:
    """The mesh search's infeasibility: the smallest plan of any candidate mesh, in ``memory``'s one wording."""
    tried = [t for t in trials if t.min_memory is not None and t.candidate]
    if not tried:
        return "no plan fits in device memory"
    best = min(tried, key=lambda t: t.min_memory.total if t.min_memory else math.inf)
    assert best.min_memory is not None
    return infeasible_message("plan", f"mesh {best.label}", best.min_memory, machine.name, machine.device_count)
