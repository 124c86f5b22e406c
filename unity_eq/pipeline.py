"""The optimize pipeline: model → Graph → e-graph → saturated e-graph → Plan → plan directory.

Each stage is a function of the stage module it names; this module only strings them together, checks the
user's options before any work starts, times every stage, and reports progress through a callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from unity_eq.cost import OBJECTIVES
from unity_eq.egraph import Limits, SaturationResult
from unity_eq.errors import OptionError, PlanError, RuleError
from unity_eq.ir import Graph, Mesh
from unity_eq.lower import LoweredPlan, check_output_dir, lower, refuse_missing_weights, write_plan_dir, write_plan_only
from unity_eq.machine import Machine, default_machine
from unity_eq.memory import plan_memory
from unity_eq.plan import Plan
from unity_eq.planfile import DifferentiableRecord, IlpRecord, ProfileStatsRecord, SaturationRecord
from unity_eq.profile_table import ProfileTable, load_profile
from unity_eq.progress import Tracker
from unity_eq.report import cost_breakdown
from unity_eq.rulesets import default_rule_files, load_rule_files, rules_dir
from unity_eq.search import SearchResult, search
from unity_eq.stages.run import PipelineResult

if TYPE_CHECKING:
    import onnx

    from unity_eq.extract import Extraction

__all__ = ["OptimizeResult", "lower_stages", "machine_for", "optimize", "optimize_pipeline", "write_spmd"]

Progress = Callable[[str], None]


@dataclass
class OptimizeResult:
    plan: Plan
    graph: Graph
    lowered: LoweredPlan | None
    plan_dir: Path | None
    saturation: SaturationResult  # of the chosen mesh
    timings: dict[str, float] = field(default_factory=dict)
    search: SearchResult | None = None


def machine_for(
    devices: int | None,
    machine: Machine | str | Path | None,
    nodes: int | None = None,
    interconnect: str | None = None,
) -> Machine:
    if machine is not None and not isinstance(machine, Machine):
        from unity_eq.machine import load_machine

        machine = load_machine(machine, nodes=nodes, interconnect=interconnect)
    elif nodes is not None or interconnect is not None:
        raise OptionError(
            "`--nodes` and `--interconnect` need `--machine PRESET|FILE`, e.g. `--machine h100x8 --nodes 2`."
        )
    if machine is not None:
        if devices is not None and devices != machine.device_count:
            raise OptionError(
                f"`--devices` {devices} disagrees with the machine {machine.name!r} ({machine.device_count} devices). "
                "Pass one of them."
            )
        return machine
    if devices is None:
        raise OptionError("say how many devices: pass `--devices N` or `--machine FILE|PRESET`.")
    if devices < 1:
        raise OptionError(f"`--devices` must be at least 1, got {devices}.")
    return default_machine(devices)


def optimize(
    model: str | Path | Graph | onnx.ModelProto,
    *,
    devices: int | None = None,
    machine: Machine | str | Path | None = None,
    nodes: int | None = None,
    interconnect: str | None = None,
    output_dir: str | Path | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    objective: str = "inference",
    mesh: str | Mesh | None = None,
    max_axes: int = 3,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    generated_rules: bool = True,
    progress: Progress | None = None,
    profile: str | Path | ProfileTable | None = None,
    blocks: str = "auto",
    extractor: str = "greedy",
    ilp_time_limit: float = 60.0,
    tracker: Tracker | None = None,
    plan_only: bool = False,
    weight_inputs: Sequence[str] = (),
) -> OptimizeResult:
    """Find a parallel plan for ``model`` and, with ``output_dir``, write it as a plan directory.

    ``machine`` is a Machine, a preset name or a TOML file (``nodes``/``interconnect`` reshape a preset);
    ``devices`` alone means that many A100-80G in one node. Without ``mesh`` the search tries the meshes of
    1 to ``max_axes`` axes over all devices, over each kind's devices on a heterogeneous machine, and the
    model on the fastest device (see unity_eq.search), and keeps the cheapest plan that fits.
    ``profile`` (a table from ``unity-eq profile``) prices the ops it measured with their measured times.
    ``generated_rules=False`` leaves the generated rules (rules/generated/, docs/generate.md) out of the
    default manifest; ``rule_files`` replaces the manifest altogether.
    ``blocks`` (auto, on, off): optimize large models piece by piece, reusing repeated blocks.
    ``extractor="differentiable"`` re-extracts the chosen plan with the relaxed search (unity_eq.extract.
    differentiable, seeded with greedy's plan); ``extractor="ilp"`` does that, then solves exactly (HiGHS, the
    cheaper plan as incumbent, ``ilp_time_limit`` seconds); the cheapest plan that fits is kept, and plan.json's
    ``extraction`` says which extractor won (``winner``), by how much, and the gap the ILP proved.
    ``tracker`` (unity_eq.progress) hears each mesh's progress and the device files written; without one,
    ``progress`` gets a line when a mesh starts and ends.
    ``model`` may be an ``onnx.ModelProto`` in memory (checked as a file is, left unchanged).
    ``plan_only`` writes ``output_dir/plan.json`` alone (no device files, no weight read): a weight whose
    external data is absent is planned from its dtype and shape, and without ``plan_only`` such a model is
    refused (ModelError) before the search starts, since lowering would need the missing bytes.
    ``weight_inputs`` names model inputs that are weights (parameters exported as inputs): planned as
    weights (optimizer state, gradient all-reduce), with no bytes to lower (their values come at run time),
    so only plan-only plans are made of them.

    ``timings`` holds each stage's wall time (``load_s``, ``search_s``, ``ilp_s``, ``lower_s``, the whole
    ``wall_s``) and ``worker_s``, the meshes' saturation and extraction time summed over the workers that
    ran them side by side (more than ``search_s`` when two meshes ran at once).
    """
    say = progress or (lambda _msg: None)
    began = time.perf_counter()
    timings: dict[str, float] = {}
    chosen_machine = machine_for(devices, machine, nodes, interconnect)
    if objective not in OBJECTIVES:
        raise OptionError(f"`--objective`: expected inference or training, got {objective!r}.")
    goal = OBJECTIVES[objective]
    if extractor not in ("greedy", "differentiable", "ilp"):
        raise OptionError(f"`--extractor`: expected greedy, differentiable or ilp, got {extractor!r}.")
    if ilp_time_limit <= 0:
        raise OptionError(f"`--ilp-time-limit` must be positive, got {ilp_time_limit}.")
    if not 1 <= max_axes <= 3:
        raise OptionError(f"`--max-axes`: expected 1, 2 or 3, got {max_axes}.")
    if output_dir is not None:
        check_output_dir(Path(output_dir))
    forced: Mesh | None = None
    if isinstance(mesh, Mesh):
        if mesh.size != chosen_machine.device_count:
            raise OptionError(
                f"`--mesh` {mesh} has {mesh.size} devices, the machine has {chosen_machine.device_count}. "
                "Make them agree."
            )
        forced = mesh
    elif mesh is not None:
        forced = Mesh.parse(mesh, chosen_machine.device_count)
    if rule_files is not None:
        check_rule_files(rule_files)
    rules = load_rule_files(list(rule_files) if rule_files is not None else default_rule_files(generated_rules))
    table = load_profile(profile) if isinstance(profile, str | Path) else profile
    if table is not None:
        table.hits = table.misses = 0

    start = time.perf_counter()
    if isinstance(model, Graph):
        graph = model
    else:
        from unity_eq.frontends.onnx import load_onnx

        say(f"loading {model if isinstance(model, str | Path) else 'the model (in memory)'}")
        graph = load_onnx(model, input_shapes, weight_inputs)
    if output_dir is not None and not plan_only:
        refuse_missing_weights(graph)  # before the search: lowering would refuse it, minutes later
    timings["load_s"] = time.perf_counter() - start
    say(f"{graph.summary()}; machine {chosen_machine.describe()}")

    start = time.perf_counter()
    result = search(
        graph,
        chosen_machine,
        goal,
        rules,
        limits,
        mesh=forced,
        max_axes=max_axes,
        say=say,
        profile=table,
        blocks=blocks,
        tracker=tracker,
    )
    timings["search_s"] = time.perf_counter() - start
    trial = result.trial
    timings["saturate_s"] = sum(t.saturate_s for t in result.trials)
    timings["extract_s"] = sum(t.extract_s for t in result.trials)
    timings["worker_s"] = timings["saturate_s"] + timings["extract_s"]
    refined: Refined | None = None
    if extractor != "greedy":
        start = time.perf_counter()
        refined = _refine(result, extractor, ilp_time_limit, say)
        timings["ilp_s" if extractor == "ilp" else "differentiable_s"] = time.perf_counter() - start
    plan = result.plan
    assert trial.saturation is not None and trial.memory is not None
    plan.stats = replace(plan.stats, saturation=_saturation(trial.saturation, trial.enodes), timings=dict(timings))
    report = result.report()
    if refined is not None:
        assert report.extraction is not None
        extraction = replace(
            report.extraction,
            winner=refined.winner,
            winner_saving=refined.saving,
            differentiable=refined.differentiable,
            ilp=refined.ilp,
        )
        report = replace(report, extraction=extraction)
    plan.report = replace(report, memory=trial.memory.to_record(), cost=cost_breakdown(plan))
    if table is not None:
        device = table.meta.get("device", {}).get("description")
        plan.stats = replace(
            plan.stats, profile=ProfileStatsRecord(device=device, measured=table.hits, roofline=table.misses)
        )
        say(f"profile: {table.hits} of {table.hits + table.misses} op prices measured, the rest from the roofline")

    found = OptimizeResult(plan, graph, None, None, trial.saturation, timings, result)
    if output_dir is not None:
        write_spmd(found, Path(output_dir), plan_only, say, tracker)
    timings["wall_s"] = time.perf_counter() - began
    plan.stats = replace(plan.stats, timings=dict(timings))
    return found


def write_spmd(
    result: OptimizeResult, output_dir: Path, plan_only: bool, say: Progress, tracker: Tracker | None = None
) -> None:
    """Lower the plan and write its plan directory (plan.json alone with ``plan_only``), atomically; ``result``
    gets the lowered plan, the directory and ``lower_s``."""
    plan, graph = result.plan, result.graph
    start = time.perf_counter()
    if plan_only:
        result.lowered = lower(plan, graph, plan_only=True)
        result.plan_dir = write_plan_only(result.lowered, output_dir)
        result.timings["lower_s"] = time.perf_counter() - start
        return
    say("lowering to per-device ONNX")
    lowered = result.lowered = lower(plan, graph)
    row = "device files"
    if tracker is not None:
        tracker.start(row, f"writing 0 of {lowered.world_size}")

    def written(done: int, total: int) -> None:
        if tracker is not None:
            tracker.count(row, done, total, "written")

    result.plan_dir = write_plan_dir(lowered, output_dir, written)
    result.timings["lower_s"] = time.perf_counter() - start
    if tracker is not None:
        tracker.finish(row, f"{lowered.world_size} written to {result.plan_dir}")


def check_rule_files(paths: Sequence[Path]) -> None:
    """Parse and check the user's rule files once, before any search, with the parser `unity-eq verify` uses,
    then have egglog load them after the schema and analyses (as the engine workers will): an error is one
    ``file:line:col: …`` line here, not a failure inside every mesh's engine worker."""
    shipped = rules_dir().resolve()
    extra = [Path(p) for p in paths if not Path(p).resolve().is_relative_to(shipped)]
    if not extra:
        return
    from unity_eq.rulefile.load import display_path, load_program

    program, _ = load_program(extra, engine=False)  # raises RuleError on a syntax error, with file:line:col
    if program.errors:
        more = len(program.errors) - 1
        tail = f" ({more} more: run `unity-eq verify {' '.join(map(str, extra))}`)" if more else ""
        raise RuleError(program.errors[0] + tail)
    # then egglog itself loads exactly what every mesh's engine worker will load, once, here
    from unity_eq.enginecheck import engine_load_error

    files = load_rule_files([Path(p) for p in paths])
    error = engine_load_error([(display_path(f.path), f.text) for f in files])
    if error:
        raise RuleError(error)


@dataclass(frozen=True)
class Refined:
    """What ``--extractor differentiable``/``ilp`` found, for plan.json's ``extraction``."""

    winner: str
    saving: float
    differentiable: DifferentiableRecord | None
    ilp: IlpRecord | None


def _refine(result: SearchResult, method: str, time_limit: float, say: Progress) -> Refined:
    """Re-extract the chosen plan (same mesh, restriction and memory penalty) with the differentiable search and,
    for ``ilp``, the exact program after it; keep the cheapest plan that fits (greedy's unless one beats it)."""
    trial = result.trial
    chosen = next(e for e, _ in trial.extractions if e.plan is result.plan)
    what = "differentiable extraction" + (f", then the ILP up to {time_limit:g} s" if method == "ilp" else "")
    say(f"{what} of mesh {trial.label}")
    began = time.perf_counter()
    refined = result.extractors[trial.label].extract(chosen.restriction, chosen.penalty, method, time_limit)
    greedy_cost = result.plan.cost.total
    winner, best, memory = "greedy", result.plan, trial.memory
    plans = {name: refined.stages[name] for name in ("differentiable", "ilp") if name in refined.stages}
    fitting: dict[str, bool] = {}
    for name, plan in plans.items():
        usage = plan_memory(plan)
        fitting[name] = usage.fits
        if usage.fits and plan.cost.total < best.cost.total * (1 - 1e-12):
            winner, best, memory = name, plan, usage
    if winner != "greedy":
        result.plan, trial.plan, trial.memory = best, best, memory
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
    return Refined(winner, saving, differentiable, ilp)


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


def _saturation(saturation: SaturationResult, enodes: int) -> SaturationRecord:
    return SaturationRecord(
        stop_reason=saturation.stop_reason.value,
        iterations=saturation.iterations,
        enodes=enodes,
        seconds=round(saturation.seconds, 3),
        worker_peak_mib=round(saturation.worker_peak_mib, 1),
    )


def optimize_pipeline(
    model: str | Path,
    *,
    devices: int | None = None,
    machine: Machine | str | Path | None = None,
    nodes: int | None = None,
    interconnect: str | None = None,
    output_dir: str | Path | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    objective: str = "training",
    batch: int | None = None,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    generated_rules: bool = True,
    progress: Progress | None = None,
    plan_only: bool = False,
    stages: int | None = None,
    tensor: int | None = None,
    microbatches: int | None = None,
    extractor: str = "greedy",
) -> PipelineResult:
    """``optimize --pipeline``: the stage search (unity_eq.stages) over pipeline stages, data replicas and tensor
    groups, microbatches, schedule, recomputation and ZeRO. With ``output_dir``, a plan directory: plan.json and
    one SPMD plan directory per stage (``stage<s>/``, unity_eq.lower.pipeline) that ``run`` and ``check`` run;
    ``plan_only`` writes plan.json alone (weights may then be absent). ``batch``: samples per step (default: the
    model's batch, dimension 0 of its inputs). ``stages``, ``tensor`` and ``microbatches`` restrict the search
    to configurations with that many stages, devices per tensor group or microbatches per step. ``extractor``
    ``differentiable`` (or ``ilp``) adds each piece's differentiable extraction to its options."""
    from unity_eq.stages.run import graph_at_batch, plan_stages
    from unity_eq.stages.search import StageFilter

    say = progress or (lambda _msg: None)
    chosen_machine = machine_for(devices, machine, nodes, interconnect)
    if objective not in OBJECTIVES:
        raise OptionError(f"`--objective`: expected inference or training, got {objective!r}.")
    if batch is not None and batch < 1:
        raise OptionError(f"`--batch` must be at least 1, got {batch}.")
    if extractor not in ("greedy", "differentiable", "ilp"):
        raise OptionError(f"`--extractor`: expected greedy, differentiable or ilp, got {extractor!r}.")
    for name, value in (("--stages", stages), ("--tensor", tensor), ("--microbatches", microbatches)):
        if value is not None and value < 1:
            raise OptionError(f"`{name}` must be at least 1, got {value}.")
    only = StageFilter(stages, tensor, microbatches) if (stages, tensor, microbatches) != (None, None, None) else None
    target = Path(output_dir) if output_dir is not None else None
    if target is not None:
        check_output_dir(target)
    if rule_files is not None:
        check_rule_files(rule_files)
    rules = load_rule_files(list(rule_files) if rule_files is not None else default_rule_files(generated_rules))
    say(f"loading {model}")
    batched = graph_at_batch(Path(model), input_shapes, batch)
    lowering = target is not None and not plan_only
    if lowering:  # before the search: lowering would refuse it, minutes later
        refuse_missing_weights(batched.graph_at(batched.micro_sizes[0]))
    say(f"machine {chosen_machine.describe()}; batch {batched.batch} per step")
    goal = OBJECTIVES[objective]
    result = plan_stages(
        batched.graph_at,
        batched.batch,
        batched.micro_sizes,
        chosen_machine,
        goal,
        rules,
        limits,
        None if lowering else target,
        say,
        only,
        static_batch=batched.static_batch,
        extractor=extractor,
    )
    if lowering:
        assert target is not None
        lower_stages(result, batched.graph_at, chosen_machine, target, say)
    return result


def lower_stages(
    result: PipelineResult, graph_at: Callable[[int], Graph], machine: Machine, target: Path, say: Progress
) -> None:
    """Write the chosen pipeline as a plan directory per stage and the top plan.json (unity_eq.lower.pipeline),
    each stage stitched from the piece plans the stage search priced (no second search); ``result`` is
    updated in place."""
    from unity_eq.lower.pipeline import lower_pipeline
    from unity_eq.split import split_graph

    best = result.search.best
    say(f"lowering {len(best.cuts)} stage(s), each on a tensor group of {best.config.tensor} device(s)")
    split = split_graph(graph_at(best.config.microbatch))
    if split is None:
        raise PlanError(f"internal error: the model no longer splits at microbatch {best.config.microbatch}")
    result.record = lower_pipeline(result.record, best, split, machine, target, say)
    result.plan_dir = target
