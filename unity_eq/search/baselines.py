"""The baselines a plan is compared with (one device, data parallel, tensor parallel), priced on the same e-graphs
and cost model as the plan.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from unity_eq.cost import Cost, CostModel, Objective
from unity_eq.extract import Extraction, Restriction
from unity_eq.ir import Mesh
from unity_eq.machine import Machine
from unity_eq.memory import MemoryUsage, plan_memory
from unity_eq.plan import CollectiveStep, Plan
from unity_eq.planfile import BaselineRecord
from unity_eq.planfile.axes import axis_info
from unity_eq.report import device_span, parallelism
from unity_eq.search.meshes import fastest_device
from unity_eq.search.runner import MeshRunner
from unity_eq.search.trial import MeshTrial, TrialStatus, trial_row


@dataclass
class Baseline:
    """A hand-made strategy priced under the same cost model."""

    name: str
    description: str
    mesh: str
    cost: Cost
    memory: MemoryUsage
    sharded: bool  # False when the restriction left nothing to shard (it is the one-device plan)
    devices_used: int = 1  # devices doing distinct work (the rest repeat them)
    devices: int = 1  # devices of its mesh
    trial: MeshTrial | None = None  # the mesh whose e-graph it was extracted from (None: one device)
    extraction: Extraction | None = None

    def to_record(self, plan_cost: float) -> BaselineRecord:
        """As plan.json's ``baselines`` holds it, with its ratio to the plan's cost ``plan_cost``."""
        return BaselineRecord(
            description=self.description,
            mesh=self.mesh,
            devices=self.devices,
            devices_used=self.devices_used,
            total_s=self.cost.total,
            compute_s=self.cost.compute,
            communication_s=self.cost.comm,
            memory_bytes=self.memory.total,
            fits=self.memory.fits,
            sharded=self.sharded,
            ratio=self.cost.total / plan_cost if plan_cost > 0 else None,
        )


def is_sharded(plan: Plan) -> bool:
    return any(isinstance(s, CollectiveStep) for s in plan.steps)


def uses_axes(plan: Plan) -> set[str]:
    """The mesh axes the plan's parallel steps use."""
    return {s.axis for s in plan.steps if isinstance(s, CollectiveStep)}


def baseline_of(
    name: str, description: str, mesh: str, trial: MeshTrial, extraction: Extraction, usage: MemoryUsage
) -> Baseline:
    """A baseline extracted from ``trial``'s e-graph, with how many of its devices do distinct work."""
    plan = extraction.plan
    return Baseline(
        name,
        description,
        mesh,
        plan.cost,
        usage,
        is_sharded(plan),
        devices_used=parallelism(plan).devices_used,
        devices=plan.mesh.size,
        trial=trial,
        extraction=extraction,
    )


def flat_trial(trials: Sequence[MeshTrial]) -> MeshTrial | None:
    """The 1-axis mesh over all devices (the baselines are priced on its e-graph)."""
    return next((t for t in trials if t.extractions and len(t.mesh.axes) == 1 and not t.scope), None)


def one_device_trial(
    trials: list[MeshTrial], runner: MeshRunner, machine: Machine, objective: Objective, candidate: bool
) -> MeshTrial | None:
    """The one-device plan on the fastest device as a mesh of its own: the 1-axis mesh's e-graph with nothing
    partitioned, priced on that device alone. A candidate (the search may return it) unless ``--mesh``
    forced another mesh; on a one-device machine it is the 1-axis mesh itself."""
    flat = flat_trial(trials)
    if flat is None:
        return None
    if flat.mesh.size == 1:  # its extraction with nothing partitioned joins the mesh's options
        extraction = runner.extractors[flat.label].extract(Restriction.one_device())
        flat.extractions.append((extraction, plan_memory(extraction.plan)))
        return flat
    fastest = fastest_device(machine)
    single = Mesh(flat.mesh.axes, (1,) * len(flat.mesh.axes), (fastest,))
    model = CostModel(machine, single, objective, profile=runner.profile)
    trial = MeshTrial(
        single,
        tuple(axis_info(model, a) for a in single.axes),
        candidate=candidate,
        scope=device_span((fastest,)),
        device_kind=machine.devices[fastest].name,
        enodes=flat.enodes,
        stop_reason=flat.stop_reason,
        saturation=flat.saturation,
        encoding=flat.encoding,
        egraph_of=flat.label,
    )
    row = trial_row(trial)
    runner.tracker.start(row, f"pricing mesh {flat.label}'s e-graph with nothing partitioned")
    start = time.perf_counter()
    extractor = runner.extractors[flat.label].reprice(model)
    extraction = extractor.extract(Restriction.one_device())
    memory = plan_memory(extraction.plan)
    runner.extractors[trial.label] = extractor
    trial.extractions.append((extraction, memory))
    trial.extract_s = time.perf_counter() - start
    trial.min_memory = memory
    trial.reason = f"the one_device baseline: mesh {flat.label}'s e-graph with nothing partitioned"
    if memory.fits:
        trial.status, trial.plan, trial.memory = TrialStatus.OK, extraction.plan, memory
        trial.extraction = extraction.restriction.name
        cost = f"{extraction.plan.cost.total * 1e3:.3f} ms"
    else:
        trial.status, cost = TrialStatus.INFEASIBLE, "does not fit"
    runner.tracker.finish(row, f"one device, {cost}")
    return trial


def price_baselines(
    trials: list[MeshTrial], runner: MeshRunner, machine: Machine, one_trial: MeshTrial | None
) -> dict[str, Baseline]:
    done = [t for t in trials if t.extractions]
    found: dict[str, Baseline] = {}
    flat = flat_trial(trials)
    if one_trial is not None:
        one, memory = next((e, m) for e, m in one_trial.extractions if e.restriction.name == "one_device")
        found["one_device"] = Baseline(
            "one_device",
            f"the model on one {machine.devices[one_trial.mesh.devices[0]].name}",
            "1",
            one.plan.cost,
            memory,
            False,
            trial=one_trial,
            extraction=one,
        )
    if flat is not None:
        dp = {e.restriction.name: (e, m) for e, m in flat.extractions if e.penalty == 0}
        if "data_parallel" in dp:
            extraction, usage = dp["data_parallel"]
            description = (
                f"every weight whole on all {flat.mesh.size} devices, every op split along a weight-free dimension "
                "(its batch where it divides)"
            )
        elif "weights_whole" in dp:
            extraction, usage = dp["weights_whole"]
            description = (
                f"no op can be split without splitting a weight everywhere; the best plan with every weight "
                f"whole on all {flat.mesh.size} devices"
            )
        if "data_parallel" in dp or "weights_whole" in dp:
            found["data_parallel"] = baseline_of("data_parallel", description, flat.label, flat, extraction, usage)
    tp: list[tuple[MeshTrial, str, Extraction, MemoryUsage]] = []
    for trial in done:
        for extraction, usage in trial.extractions:
            name = extraction.restriction.name
            if name.startswith("tensor_parallel:") and extraction.penalty == 0:
                tp.append((trial, name.split(":", 1)[1], extraction, usage))
    if tp:
        fitting = [item for item in tp if item[3].fits] or tp
        trial, axis, extraction, usage = min(fitting, key=lambda item: item[2].plan.cost.total)
        size = trial.mesh.axis_size(axis)
        where = next(a for a in trial.axes if a.name == axis)
        span = "across nodes" if where.spans_nodes else "inside a node"
        found["tensor_parallel"] = baseline_of(
            "tensor_parallel",
            f"tensor parallel over {size} devices ({span}, axis {axis} of mesh {trial.label})",
            f"{trial.label} (axis {axis})",
            trial,
            extraction,
            usage,
        )
    return found
