"""The SPMD driver: model → Graph → mesh search (saturation, extraction) → exact re-extraction → report → plan
directory.

Each pass is a function that takes the checked :class:`OptimizeRequest` and returns an immutable result; the
plan's report (plan.json's search fields, memory, cost breakdown, stats) is assembled once, by
:func:`finished_plan`, from those results, and nothing patches it afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unity_eq.cost import cheaper
from unity_eq.driver.request import OptimizeRequest, Planner, build_request, load_rules
from unity_eq.egraph import SaturationResult
from unity_eq.extract import ExtractionMethod
from unity_eq.ir import Graph
from unity_eq.lower import LoweredPlan, lower, refuse_missing_weights, write_plan_dir, write_plan_only
from unity_eq.memory import MemoryUsage, plan_memory
from unity_eq.plan import Plan
from unity_eq.planfile import (
    DifferentiableRecord,
    IlpRecord,
    ProfileStatsRecord,
    SaturationRecord,
    TrainingSearchRecord,
)
from unity_eq.profile_table import ProfileTable, load_profile
from unity_eq.progress import Tracker
from unity_eq.report import cost_breakdown
from unity_eq.search import SearchResult, search

if TYPE_CHECKING:
    import onnx

    from unity_eq.extract import Extraction

__all__ = ["OptimizeResult", "finished_plan", "optimize", "plan_spmd", "write_spmd"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OptimizeResult:
    """The SPMD driver's result: the plan (its report complete), the graph it plans, the search behind it, and
    with an output folder the lowered plan and where it was written."""

    plan: Plan
    graph: Graph
    lowered: LoweredPlan | None
    plan_dir: Path | None
    saturation: SaturationResult  # of the chosen mesh
    timings: Mapping[str, float] = field(default_factory=dict)
    search: SearchResult | None = None


@dataclass(frozen=True)
class Refinement:
    """What ``--extractor differentiable``/``ilp`` found, for plan.json's ``extraction``: which extractor's plan
    is kept (``winner``), its saving over greedy's, and each refining extractor's record."""

    winner: str
    saving: float
    differentiable: DifferentiableRecord | None
    ilp: IlpRecord | None


@dataclass(frozen=True)
class Refined:
    """What the re-extraction left: the search with the plan it keeps, and the report of the comparison."""

    search: SearchResult
    record: Refinement


def optimize(
    model: str | Path | Graph | onnx.ModelProto,
    request: OptimizeRequest | None = None,
    *,
    progress: Progress | None = None,
    tracker: Tracker | None = None,
    **options: Any,
) -> OptimizeResult:
    """Find a parallel SPMD plan for ``model`` and, with ``output_dir``, write it as a plan directory.

    Pass a request (:func:`unity_eq.driver.build_request`) or its options as keywords (``devices``,
    ``machine``, ``nodes``, ``interconnect``, ``output_dir``, ``input_shapes``, ``objective``, ``mesh``,
    ``max_axes``, ``limits``, ``rule_files``, ``generated_rules``, ``profile``, ``blocks``, ``extractor``,
    ``ilp_time_limit``, ``plan_only``, ``weight_inputs``; docs/usage.md). Without ``mesh`` the search tries
    the meshes of 1 to ``max_axes`` axes over all devices, over each kind's devices on a heterogeneous
    machine, and the model on the fastest device (unity_eq.search), and keeps the cheapest plan that fits.
    ``extractor="differentiable"`` re-extracts the chosen plan with the relaxed search (unity_eq.extract.
    differentiable, seeded with greedy's plan); ``extractor="ilp"`` does that, then solves exactly (HiGHS, the
    cheaper plan as incumbent); the cheapest plan that fits is kept, and plan.json's ``extraction`` says which
    extractor won (``winner``), by how much, and the gap the ILP proved.
    ``tracker`` (unity_eq.progress) hears each mesh's progress and the device files written; without one,
    ``progress`` gets a line when a mesh starts and ends. ``model`` may be an ``onnx.ModelProto`` in memory.
    ``plan_only`` writes ``output_dir/plan.json`` alone (no device files, no weight read); without it a model
    whose weights are absent is refused (ModelError) before the search starts.

    ``timings`` holds each pass's wall time (``load_s``, ``search_s``, ``ilp_s``, ``lower_s``, the whole
    ``wall_s``) and ``worker_s``, the meshes' saturation and extraction time summed over the workers that
    ran them side by side (more than ``search_s`` when two meshes ran at once).
    """
    if request is None:
        request = build_request(planner=Planner.SPMD, **options)
    elif options:
        raise TypeError(f"optimize: pass a request or options, not both (got {sorted(options)})")
    return plan_spmd(model, request, progress or (lambda _msg: None), tracker)


def plan_spmd(
    model: str | Path | Graph | onnx.ModelProto,
    request: OptimizeRequest,
    say: Progress,
    tracker: Tracker | None = None,
    training: TrainingSearchRecord | None = None,
    write: bool = True,
) -> OptimizeResult:
    """The SPMD search of ``request`` on ``model``, its report, and (with ``write`` and an output folder) its
    plan directory. ``training``: the training search's comparison, for the report."""
    began = time.perf_counter()
    timings: dict[str, float] = {}
    rules = load_rules(request)
    table = load_profile(request.profile) if isinstance(request.profile, Path) else request.profile
    if table is not None:
        table.hits = table.misses = 0

    start = time.perf_counter()
    graph = load_graph(model, request, say)
    timings["load_s"] = time.perf_counter() - start
    say(f"{graph.summary()}; machine {request.machine.describe()}")

    start = time.perf_counter()
    found = search(
        graph,
        request.machine,
        request.objective,
        rules,
        request.limits,
        mesh=request.mesh,
        max_axes=request.max_axes,
        say=say,
        profile=table,
        blocks=request.blocks,
        tracker=tracker,
    )
    timings["search_s"] = time.perf_counter() - start
    timings["saturate_s"] = sum(t.saturate_s for t in found.trials)
    timings["extract_s"] = sum(t.extract_s for t in found.trials)
    timings["worker_s"] = timings["saturate_s"] + timings["extract_s"]
    refinement: Refinement | None = None
    if request.extractor != ExtractionMethod.GREEDY:
        start = time.perf_counter()
        refined = refine(found, request.extractor, request.ilp_time_limit, say)
        found, refinement = refined.search, refined.record
        timings["ilp_s" if request.extractor == ExtractionMethod.ILP else "differentiable_s"] = (
            time.perf_counter() - start
        )
    if table is not None:
        say(f"profile: {table.hits} of {table.hits + table.misses} op prices measured, the rest from the roofline")
    plan = finished_plan(found, dict(timings), refinement, _profile_record(table), training)
    assert found.trial.saturation is not None
    result = OptimizeResult(plan, graph, None, None, found.trial.saturation, timings, found)
    if write and request.output_dir is not None:
        result = write_spmd(result, request.output_dir, request.plan_only, say, tracker)
    return replace(result, timings={**result.timings, "wall_s": time.perf_counter() - began})


def load_graph(model: str | Path | Graph | onnx.ModelProto, request: OptimizeRequest, say: Progress) -> Graph:
    """The model as a Graph (a Graph given is used as it is); a model whose weights are absent is refused
    here when the plan is to be lowered (lowering would refuse it, minutes later)."""
    if isinstance(model, Graph):
        graph = model
    else:
        from unity_eq.frontends.onnx import load_onnx

        say(f"loading {model if isinstance(model, str | Path) else 'the model (in memory)'}")
        graph = load_onnx(model, request.input_shapes, request.weight_inputs)
    if request.parameters is not None:
        graph = graph.with_parameters(request.parameters)
    if request.lowers:
        refuse_missing_weights(graph)
    return graph


def finished_plan(
    found: SearchResult,
    timings: dict[str, float],
    refinement: Refinement | None,
    profile: ProfileStatsRecord | None,
    training: TrainingSearchRecord | None = None,
) -> Plan:
    """The search's plan with its report and stats, assembled once from every pass's result."""
    plan, trial = found.plan, found.trial
    assert trial.saturation is not None and trial.memory is not None
    report = found.report()
    if refinement is not None:
        assert report.extraction is not None
        extraction = replace(
            report.extraction,
            winner=refinement.winner,
            winner_saving=refinement.saving,
            differentiable=refinement.differentiable,
            ilp=refinement.ilp,
        )
        report = replace(report, extraction=extraction)
    plan.report = replace(report, memory=trial.memory.to_record(), cost=cost_breakdown(plan), training_search=training)
    plan.stats = replace(
        plan.stats, saturation=_saturation(trial.saturation, trial.enodes), timings=timings, profile=profile
    )
    return plan


def with_training(result: OptimizeResult, training: TrainingSearchRecord) -> OptimizeResult:
    """The SPMD result with the training search's comparison in its report (before it is written); its stats
    keep the search's whole timings (``wall_s`` included)."""
    assert result.search is not None and result.plan_dir is None
    extraction = result.plan.report.extraction
    refinement = None
    if extraction is not None and (extraction.differentiable is not None or extraction.ilp is not None):
        winner, saving = extraction.winner or "greedy", extraction.winner_saving or 0.0
        refinement = Refinement(winner, saving, extraction.differentiable, extraction.ilp)
    plan = finished_plan(result.search, dict(result.timings), refinement, result.plan.stats.profile, training)
    return replace(result, plan=plan)


def write_spmd(
    result: OptimizeResult, output_dir: Path, plan_only: bool, say: Progress, tracker: Tracker | None = None
) -> OptimizeResult:
    """Lower the plan and write its plan directory (plan.json alone with ``plan_only``), atomically: the result
    with the lowered plan, the directory and ``lower_s``."""
    plan, graph = result.plan, result.graph
    start = time.perf_counter()
    if plan_only:
        lowered = lower(plan, graph, plan_only=True)
        plan_dir = write_plan_only(lowered, output_dir)
        return _written(result, lowered, plan_dir, time.perf_counter() - start)
    say("lowering to per-device ONNX")
    lowered = lower(plan, graph)
    row = "device files"
    if tracker is not None:
        tracker.start(row, f"writing 0 of {lowered.world_size}")

    def written(done: int, total: int) -> None:
        if tracker is not None:
            tracker.count(row, done, total, "written")

    plan_dir = write_plan_dir(lowered, output_dir, written)
    if tracker is not None:
        tracker.finish(row, f"{lowered.world_size} written to {plan_dir}")
    return _written(result, lowered, plan_dir, time.perf_counter() - start)


def _written(result: OptimizeResult, lowered: LoweredPlan, plan_dir: Path, seconds: float) -> OptimizeResult:
    return replace(result, lowered=lowered, plan_dir=plan_dir, timings={**result.timings, "lower_s": seconds})


def refine(found: SearchResult, method: str, time_limit: float, say: Progress) -> Refined:
    """Re-extract the chosen plan (same mesh, restriction and memory penalty) with the differentiable search and,
    for ``ilp``, the exact program after it; keep the cheapest plan that fits (greedy's unless one beats it)."""
    trial = found.trial
    chosen = next(e for e, _ in trial.extractions if e.plan is found.plan)
    what = "differentiable extraction" + (f", then the ILP up to {time_limit:g} s" if method == "ilp" else "")
    say(f"{what} of mesh {trial.label}")
    began = time.perf_counter()
    refined = found.extractors[trial.label].extract(chosen.restriction, chosen.penalty, method, time_limit)
    greedy_cost = found.plan.cost.total
    winner, best, memory = "greedy", found.plan, trial.memory
    plans = {name: refined.stages[name] for name in ("differentiable", "ilp") if name in refined.stages}
    fitting: dict[str, bool] = {}
    for name, plan in plans.items():
        usage = plan_memory(plan)
        fitting[name] = usage.fits
        if usage.fits and cheaper(plan.cost.total, best.cost.total):
            winner, best, memory = name, plan, usage
    saving = (greedy_cost - best.cost.total) / greedy_cost if greedy_cost > 0 else 0.0
    differentiable = _differentiable_record(refined, plans["differentiable"], fitting["differentiable"], greedy_cost)
    gaps = [r.gap for r in refined.ilp]
    ilp = None
    if method == "ilp":
        ilp = IlpRecord(
            greedy_total_s=greedy_cost,
            ilp_total_s=plans["ilp"].cost.total,
            kept=winner,
            programs=tuple(r.to_record() for r in refined.ilp),
            max_gap=max(gaps, default=0.0),
            all_optimal=all(r.optimal for r in refined.ilp),
        )
    gap = f", largest ILP gap {max(gaps, default=0.0):.1%}" if method == "ilp" else ""
    costs = ", ".join(f"{name} {plan.cost.total * 1e3:.4f} ms" for name, plan in plans.items())
    say(
        f"extractors: greedy {greedy_cost * 1e3:.4f} ms, {costs}{gap}; {winner} kept"
        + (f" ({saving:.2%} cheaper than greedy)" if winner != "greedy" else "")
        + f" ({time.perf_counter() - began:.1f} s)"
    )
    assert memory is not None
    search = _with_plan(found, best, memory) if winner != "greedy" else found
    return Refined(search, Refinement(winner, saving, differentiable, ilp))


def _differentiable_record(refined: Extraction, plan: Plan, fits: bool, greedy_cost: float) -> DifferentiableRecord:
    """plan.json's ``extraction.differentiable``: its plan against greedy's, and how the searches ran."""
    relaxed = refined.relaxed
    return DifferentiableRecord(
        greedy_total_s=greedy_cost,
        differentiable_total_s=plan.cost.total,
        improvement=(greedy_cost - plan.cost.total) / greedy_cost if greedy_cost > 0 else 0.0,
        fits=fits,
        programs=len(relaxed),
        improved_programs=sum(r.kept for r in relaxed),
        starts=relaxed[0].starts if relaxed else 0,
        steps=relaxed[0].steps if relaxed else 0,
        seconds=round(sum(r.seconds for r in relaxed), 3),
        device=relaxed[0].device if relaxed else "cpu",
    )


def _with_plan(found: SearchResult, plan: Plan, memory: MemoryUsage) -> SearchResult:
    """The search result with ``plan`` (and its memory) in place of the chosen mesh's plan."""
    trial = replace(found.trial, plan=plan, memory=memory)
    trials = [trial if t is found.trial else t for t in found.trials]
    return replace(found, plan=plan, trial=trial, trials=trials)


def _profile_record(table: ProfileTable | None) -> ProfileStatsRecord | None:
    if table is None:
        return None
    device = table.meta.get("device", {}).get("description")
    return ProfileStatsRecord(device=device, measured=table.hits, roofline=table.misses)


def _saturation(saturation: SaturationResult, enodes: int) -> SaturationRecord:
    return SaturationRecord(
        stop_reason=saturation.stop_reason.value,
        iterations=saturation.iterations,
        enodes=enodes,
        seconds=round(saturation.seconds, 3),
        worker_peak_mib=round(saturation.worker_peak_mib, 1),
    )
