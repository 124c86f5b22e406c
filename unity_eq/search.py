"""Mesh search, memory-aware extraction and the baselines a plan is compared with.

For a machine of N devices the search tries the logical meshes of 1 to 3 axes whose sizes multiply to N,
laid over the devices in machine order (node by node; rank = row-major coordinate, last axis fastest), so an
axis's groups sit inside one node or span nodes depending on its stride. Meshes are pruned before any
saturation:

* **equivalent**: two meshes whose axes have the same sizes and the same placement on the machine (ranks per
  node, nodes, links) cost the same up to renaming axes: only the first is kept (on one node of 8, 2×4 and
  4×2 are one mesh);
* **misaligned**: an axis whose groups sit differently (one inside a node, another across two) or hold an
  unequal number of ranks on their nodes;
* **useless**: an axis size that divides no dimension of any tensor (no rule could use it), except on the
  1-axis mesh, which is always tried (the baselines are priced on it);
* **deeper only when it helps**: 3-axis meshes are tried only when the best plan so far is on a 2-axis mesh
  and uses both axes, and only while the e-graph stays under a size budget (a 3-axis e-graph is about 4×
  a 2-axis one).

On a machine with several kinds of device or node (device_groups), each group of one kind gets the same
meshes over its devices alone (label ``x=4 on devices 0-3``), unless another group dominates it (as many
devices, as fast, as large, as well linked). The one-device plan on the fastest device (the ``one_device``
baseline, ``x=1 on device D``) is a candidate mesh too, so a plan may leave devices idle (plan.json
``parallelism`` says so).

Each remaining mesh is saturated (up to two at a time, in worker processes) and extracted several ways: the
unrestricted greedy extraction, and the same e-graph restricted to the baselines' e-nodes (data parallel
on the 1-axis mesh, tensor parallel on each axis). Every one of these is a valid plan of the mesh and the
cheapest that fits in memory is the mesh's plan, so a plan never costs more than a baseline it reports (a
tie-break between plans within TIE_TOLERANCE never picks one dearer than such a baseline; plan.json's
``extraction.plan_choice`` names a cheaper baseline the search cannot return, which happens only under
``--mesh``: one device or a baseline on another mesh). When no extraction of a mesh fits, extraction is
repeated with a growing penalty on per-device bytes (``penalty_rounds``). The search keeps the cheapest mesh;
plan.json lists every mesh with its cost and time, and why the others were skipped.

Baselines (same model, same cost model): ``one_device`` is the original graph on the fastest device;
``data_parallel`` keeps every weight whole on all N devices (one mesh axis) and splits work only along
weight-free dimensions; ``tensor_parallel`` is the best plan that uses one mesh axis, splits weights and never
partitions an input or activation, as Megatron-LM (the other devices, if any, replicate it).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from unity_eq.blocks import BlockSaturation, saturate_pieces
from unity_eq.cost import INFERENCE, Cost, CostModel, Objective, axis_info
from unity_eq.egraph import EGraphData, Encoding, Limits, SaturationResult, encode, parse_serialized, saturate
from unity_eq.errors import ExtractionError, InfeasiblePlanError, OptionError
from unity_eq.extract import Extraction, Extractor, Restriction
from unity_eq.extract.blocks import BlockExtractor
from unity_eq.files import raise_if_stopped
from unity_eq.ir import AXIS_NAMES, Graph, Mesh, machine_order
from unity_eq.machine import GroupTopology, Machine
from unity_eq.memory import MemoryUsage, plan_memory
from unity_eq.plan import AllGather, AllReduce, Plan, Replicated, Slice
from unity_eq.profile_table import ProfileTable
from unity_eq.progress import LineTracker, Tracker
from unity_eq.report import device_span, parallelism
from unity_eq.rulesets import RuleFile
from unity_eq.split import BlockSplit, split_graph

__all__ = ["Baseline", "MeshTrial", "SearchResult", "candidate_meshes", "search"]

PENALTY_ROUNDS = 6
PENALTY_GROWTH = 4.0
THREE_AXIS_NODE_BUDGET = 60_000
TIE_TOLERANCE = 0.01  # plans within 1% of the cheapest are ties: the model cannot tell them apart

Say = Callable[[str], None]


# ----------------------------------------------------------------------------------------------------------
# Candidate meshes


def _factorizations(n: int, max_axes: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n into 1..max_axes factors, each at least 2 (n itself when n < 2).

    Walks n's divisors (at most a few hundred below 2**20), not every integer up to n."""
    if n < 2:
        return [(max(n, 1),)]
    divisors = _divisors(n)
    found: list[tuple[int, ...]] = []

    def rec(rest: int, prefix: tuple[int, ...]) -> None:
        if rest == 1:
            if prefix:
                found.append(prefix)
            return
        if len(prefix) == max_axes:
            return
        for f in divisors:
            if f > rest:
                break
            if f >= 2 and rest % f == 0:
                rec(rest // f, (*prefix, f))

    rec(n, ())
    return sorted(found, key=lambda sizes: (len(sizes), sizes))


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _mesh_key(model: CostModel) -> tuple[Any, ...]:
    return tuple(sorted(repr((model.mesh.axis_size(a), model.group_topologies(a))) for a in model.mesh.axes))


def _misaligned(model: CostModel) -> str | None:
    for axis in model.mesh.axes:
        tops: set[GroupTopology] = set(model.group_topologies(axis))
        if len({(t.k, t.m) for t in tops}) > 1:
            return f"axis {axis}'s groups sit differently on the nodes"
        if model.uneven_groups(axis):
            return f"axis {axis} holds an unequal number of ranks on its nodes"
    return None


def _usable_sizes(graph: Graph) -> set[int]:
    """Every axis size that divides some tensor dimension (the divisors ≥ 2 of the dimensions)."""
    dims = {d for t in graph.types.values() for d in t.shape if d > 1}
    return {n for d in dims for n in _divisors(d) if n >= 2}


@dataclass
class MeshTrial:
    """One mesh of the search and what became of it."""

    mesh: Mesh
    axes: list[dict[str, Any]]
    status: str = "pending"  # ok, infeasible (nothing fits), skipped, failed
    reason: str = ""
    plan: Plan | None = None
    memory: MemoryUsage | None = None
    extraction: str = ""
    penalty_rounds: int = 0
    penalty: float = 0.0
    enodes: int = 0
    stop_reason: str = ""
    saturate_s: float = 0.0
    extract_s: float = 0.0
    saturation: SaturationResult | None = None
    encoding: Encoding | None = None
    extractions: list[tuple[Extraction, MemoryUsage]] = field(default_factory=list)
    min_memory: MemoryUsage | None = None
    candidate: bool = True  # False for a mesh evaluated only for a baseline (under `--mesh`)
    scope: str = ""  # the devices of a mesh over part of the machine (``devices 0-3``); "" for all of them
    device_kind: str = ""  # their kind, with scope
    egraph_of: str = ""  # the mesh whose e-graph it reuses (the one-device plan), instead of saturating its own

    @property
    def label(self) -> str:
        return mesh_label(self.mesh) + (f" on {self.scope}" if self.scope else "")

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"mesh": self.label, "axes": self.axes, "status": self.status}
        if self.scope:
            entry["devices"] = self.scope.split(" ", 1)[1]
            entry["device_count"] = self.mesh.size
            entry["device_kind"] = self.device_kind
        if self.reason:
            entry["reason"] = self.reason
        if self.plan is not None:
            entry["cost_s"] = self.plan.cost.total
            entry["compute_s"] = self.plan.cost.compute
            entry["communication_s"] = self.plan.cost.comm
            entry["extraction"] = self.extraction
        if self.memory is not None:
            entry["memory_bytes"] = self.memory.total
        if self.min_memory is not None and self.status == "infeasible":
            entry["min_memory_bytes"] = self.min_memory.total
        if self.status in ("ok", "infeasible", "failed") or self.saturate_s:
            entry["enodes"] = self.enodes
            entry["stop_reason"] = self.stop_reason
            entry["penalty_rounds"] = self.penalty_rounds
            entry["seconds"] = {"saturate": round(self.saturate_s, 3), "extract": round(self.extract_s, 3)}
        if self.egraph_of:
            entry["egraph_of"] = self.egraph_of
        if not self.candidate:
            entry["baseline_only"] = True
        return entry


def mesh_label(mesh: Mesh) -> str:
    return ",".join(f"{a}={n}" for a, n in zip(mesh.axes, mesh.sizes, strict=True))


def candidate_meshes(
    machine: Machine, graph: Graph, objective: Objective = INFERENCE, max_axes: int = 3
) -> list[MeshTrial]:
    """Every factorization of the machine's devices into 1..max_axes axes; pruned ones carry their reason.

    On a machine of several kinds of device or node (see device_groups), the same again over each kind's
    devices alone (after the meshes over all devices), unless another group dominates it."""
    n = machine.device_count
    usable = _usable_sizes(graph)
    trials = _meshes_over(machine, machine_order(n), "", "", usable, objective, max_axes)
    groups = device_groups(machine)
    if len(groups) < 2:
        return trials
    for group in groups:
        if len(group) < 2:
            continue  # one device alone: the one-device plan (on the fastest device) stands for it
        ids = machine_order(len(group)) if group == tuple(range(len(group))) else group
        scope = device_span(group)
        kind = machine.devices[group[0]].name
        better = next((g for g in groups if g is not group and _dominates(machine, g, group)), None)
        if better is not None:  # one entry for the group: none of its meshes is laid out
            trial = MeshTrial(Mesh(("x",), (len(ids),), ids), [], scope=scope, device_kind=kind)
            trial.status = "skipped"
            trial.reason = (
                f"dominated: {device_span(better)} ({machine.devices[better[0]].name}) are as many, no slower, "
                f"no smaller and no worse linked than {scope} ({kind}); no mesh over them is tried"
            )
            trials.append(trial)
            continue
        trials += _meshes_over(machine, ids, scope, kind, usable, objective, max_axes)
    return trials


def _meshes_over(
    machine: Machine,
    devices: tuple[int, ...],
    scope: str,
    kind: str,
    usable: set[int],
    objective: Objective,
    max_axes: int,
) -> list[MeshTrial]:
    """The meshes over ``devices`` (all the machine's when ``scope`` is empty), pruned."""
    n = len(devices)
    trials: list[MeshTrial] = []
    seen: dict[tuple[Any, ...], str] = {}
    for sizes in _factorizations(n, max_axes):
        mesh = Mesh(AXIS_NAMES[: len(sizes)], sizes, devices)
        model = CostModel(machine, mesh, objective)
        trial = MeshTrial(mesh, [axis_info(model, a) for a in mesh.axes], scope=scope, device_kind=kind)
        trials.append(trial)
        if n < 2:
            continue
        useless = [s for s in sizes if s not in usable]
        # the 1-axis mesh over all devices is always tried: the baselines are priced on it
        if useless and (len(sizes) > 1 or scope):
            trial.status, trial.reason = "skipped", f"no tensor dimension divides by {useless[0]}"
            continue
        bad = _misaligned(model)
        if bad:
            trial.status, trial.reason = "skipped", f"misaligned: {bad}"
            continue
        key = _mesh_key(model)
        if key in seen:
            trial.status, trial.reason = "skipped", f"equivalent to {seen[key]}"
            continue
        seen[key] = trial.label
    return trials


def device_groups(machine: Machine) -> list[tuple[int, ...]]:
    """The machine's devices grouped by kind: the same device on nodes of the same kind (link, network and
    NICs), in machine order. One group (the whole machine) when the machine is homogeneous."""
    names = {d.name for d in machine.devices}
    node_kind, _ = machine.node_kinds
    if len(names) == 1 and len(set(node_kind.tolist())) <= 1:
        return [machine_order(machine.device_count)]
    groups: dict[tuple[str, int], list[int]] = {}
    for device, (spec, node) in enumerate(zip(machine.devices, machine.node_of, strict=True)):
        groups.setdefault((spec.name, int(node_kind[node])), []).append(device)
    return [tuple(g) for g in groups.values()]


def _dominates(machine: Machine, better: tuple[int, ...], worse: tuple[int, ...]) -> bool:
    """Whether the group ``better`` would give every mesh of ``worse`` a plan at least as cheap: as many
    devices, spread alike over their nodes, each at least as fast and large, on links at least as good."""
    if len(better) != len(worse):
        return False
    per_node = [sorted(Counter(machine.node_of[d] for d in g).values()) for g in (better, worse)]
    if per_node[0] != per_node[1]:
        return False
    a, b = machine.devices[better[0]], machine.devices[worse[0]]
    if a.memory < b.memory or a.memory_bandwidth < b.memory_bandwidth:
        return False
    if any(a.peak(dtype) < b.peak(dtype) for dtype in set(a.flops) | set(b.flops)):
        return False
    na, nb = machine.node(machine.node_of[better[0]]), machine.node(machine.node_of[worse[0]])
    if na.link.bandwidth < nb.link.bandwidth or na.link.latency > nb.link.latency:
        return False
    if nb.network is None:
        return True
    if na.network is None:
        return per_node[0][0] == len(better)  # one node: no network used
    return na.network.bandwidth * na.nics >= nb.network.bandwidth * nb.nics and na.network.latency <= nb.network.latency


# ----------------------------------------------------------------------------------------------------------
# Baselines


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

    def to_json(self, plan_cost: float) -> dict[str, Any]:
        return {
            "description": self.description,
            "mesh": self.mesh,
            "devices": self.devices,
            "devices_used": self.devices_used,
            "total_s": self.cost.total,
            "compute_s": self.cost.compute,
            "communication_s": self.cost.comm,
            "memory_bytes": self.memory.total,
            "fits": self.memory.fits,
            "sharded": self.sharded,
            "ratio": self.cost.total / plan_cost if plan_cost > 0 else None,
        }


def _is_sharded(plan: Plan) -> bool:
    return any(isinstance(s, Slice | AllGather | AllReduce | Replicated) for s in plan.steps)


def uses_axes(plan: Plan) -> set[str]:
    """The mesh axes the plan's parallel steps use."""
    return {s.axis for s in plan.steps if isinstance(s, Slice | AllGather | AllReduce | Replicated)}


def _baseline_of(
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
        _is_sharded(plan),
        devices_used=parallelism(plan)["devices_used"],
        devices=plan.mesh.size,
        trial=trial,
        extraction=extraction,
    )


# ----------------------------------------------------------------------------------------------------------
# The search


@dataclass
class SearchResult:
    plan: Plan
    trial: MeshTrial
    trials: list[MeshTrial]
    baselines: dict[str, Baseline]
    extractors: dict[str, Extractor | BlockExtractor] = field(default_factory=dict)  # mesh label -> extractor
    tie_break: dict[str, Any] | None = None  # set when a tie went to a plan that communicates less
    split: BlockSplit | None = None  # the pieces, when the model was optimized block by block

    def report(self) -> dict[str, Any]:
        """The plan.json fields of the search: mesh_search, baselines, memory handling."""
        cost = self.plan.cost.total
        return {
            "mesh_search": {
                "chosen": self.trial.label,
                "tried": [t.to_json() for t in self.trials if t.status != "skipped"],
                "runner_up": _runner_up(self.trials, self.trial),
                "skipped": [{"mesh": t.label, "reason": t.reason} for t in self.trials if t.status == "skipped"],
            },
            "baselines": {name: b.to_json(cost) for name, b in self.baselines.items()},
            "blocks": self.split.to_json() if self.split is not None else None,
            "extraction": {
                "method": "greedy DAG" + ("" if self.trial.extraction == "greedy" else f", {self.trial.extraction}"),
                "restriction": self.trial.extraction,
                "memory_penalty_rounds": self.trial.penalty_rounds,
                "memory_penalty_s_per_byte": self.trial.penalty,
                "memory_handling": _memory_handling(self.trial),
                "tie_break": self.tie_break,
                "plan_choice": _plan_choice(self),
            },
            "parallelism": parallelism(self.plan),
        }


def _memory_handling(trial: MeshTrial) -> str:
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


def _runner_up(trials: list[MeshTrial], chosen: MeshTrial) -> dict[str, Any] | None:
    others = [t for t in trials if t is not chosen and t.status == "ok" and t.candidate and t.plan is not None]
    if not others:
        return None
    best = min(others, key=lambda t: t.plan.cost.total if t.plan else math.inf)
    assert best.plan is not None
    return {"mesh": best.label, "cost_s": best.plan.cost.total}


BLOCK_MIN_NODES = 150


def choose_split(graph: Graph, blocks: str) -> BlockSplit | None:
    """The pieces to optimize separately, or None for the whole graph at once."""
    if blocks not in ("auto", "on", "off"):
        raise OptionError(f"`--blocks`: expected auto, on or off, got {blocks!r}.")
    if blocks == "off" or (blocks == "auto" and len(graph.nodes) < BLOCK_MIN_NODES):
        return None
    split = split_graph(graph)
    if split is None or (blocks == "auto" and len(split.distinct) == len(split.pieces)):
        return None  # nothing repeats: one saturation of the whole graph finds more
    return split


def search(
    graph: Graph,
    machine: Machine,
    objective: Objective,
    rules: list[RuleFile],
    limits: Limits | None = None,
    *,
    mesh: Mesh | None = None,
    max_axes: int = 3,
    say: Say | None = None,
    workers: int = 2,
    profile: ProfileTable | None = None,
    blocks: str = "auto",
    tracker: Tracker | None = None,
) -> SearchResult:
    """Find the cheapest plan that fits over the candidate meshes (or the one forced ``mesh``).

    ``profile`` (a table from ``unity-eq profile``) prices the ops it measured with their measured times.
    ``blocks`` (``auto``, ``on``, ``off``): optimize the model piece by piece (see unity_eq.blocks); ``auto``
    does so when it has at least BLOCK_MIN_NODES nodes and repeated pieces.
    ``tracker`` hears each mesh's progress (row ``mesh x=2,y=4``: saturation iterations, extraction, the
    result) and the baselines' (row ``baselines``); without one, ``say`` gets a line when a mesh starts and ends.
    """
    say = say or (lambda _m: None)
    tracker = tracker or LineTracker(say)
    split = choose_split(graph, blocks)
    if split is not None:
        say(f"optimizing block by block: {split.summary()}")
    limits = limits or Limits()
    n = machine.device_count
    flat = Mesh(("x",), (n,), tuple(range(n)))
    if mesh is not None:
        model = CostModel(machine, mesh, objective)
        trials = [MeshTrial(mesh, [axis_info(model, a) for a in mesh.axes])]
        if mesh.sizes != flat.sizes and n > 1:
            baseline_only = MeshTrial(flat, [axis_info(CostModel(machine, flat, objective), "x")], candidate=False)
            trials.append(baseline_only)
    else:
        trials = candidate_meshes(machine, graph, objective, max_axes)

    runner = _Runner(graph, machine, objective, rules, limits, say, tracker, workers, profile, split)
    first = [t for t in trials if t.status == "pending" and len(t.mesh.axes) <= 2]
    runner.run(first)
    deeper = [t for t in trials if t.status == "pending" and len(t.mesh.axes) == 3]
    if deeper:
        if mesh is not None:
            runner.run(deeper)
        else:
            reason = _skip_deeper(trials)
            if reason:
                for t in deeper:
                    t.status, t.reason = "skipped", reason
            else:
                runner.run(deeper)

    one_trial = _one_device_trial(trials, runner, machine, objective, candidate=mesh is None)
    if one_trial is not None and one_trial not in trials:
        trials.append(one_trial)
    candidates = [t for t in trials if t.candidate and t.status == "ok" and t.plan is not None]
    if not candidates:
        failed = [t for t in trials if t.status == "failed"]
        if failed and not any(t.status == "infeasible" for t in trials):
            raise ExtractionError(f"no mesh produced a plan: {failed[0].label}: {failed[0].reason}")
        raise InfeasiblePlanError(_infeasible_message(trials, machine))
    tracker.start("baselines", "pricing one device, data parallel, tensor parallel")
    baselines = _baselines(trials, runner, machine, one_trial)
    tracker.finish("baselines", ", ".join(f"{name} {b.cost.total * 1e3:.3f} ms" for name, b in baselines.items()))
    best, tie_break = _choose(candidates, _ceiling(baselines))
    assert best.plan is not None
    return SearchResult(best.plan, best, trials, baselines, runner.extractors, tie_break, split)


def _ceiling(baselines: dict[str, Baseline]) -> float:
    """The cost the plan may not exceed: the cheapest baseline that fits and that the search could return
    itself (one extracted from a candidate mesh's e-graph)."""
    returnable = [
        b.cost.total
        for b in baselines.values()
        if b.memory.fits and b.extraction is not None and b.trial is not None and b.trial.candidate
    ]
    return min(returnable, default=math.inf)


def _choose(candidates: list[MeshTrial], ceiling: float = math.inf) -> tuple[MeshTrial, dict[str, Any] | None]:
    """The cheapest plan that fits over all meshes and extractions; plans within TIE_TOLERANCE of it are ties,
    and among ties the one with the least communication wins (the least certain part of the model) — but
    never one that costs more than ``ceiling``: a plan reported next to a cheaper baseline would be a lie."""
    options = [(t, e, m) for t in candidates for e, m in t.extractions if m.fits]
    cheapest = min(options, key=lambda o: (o[1].plan.cost.total, len(o[0].mesh.axes)))
    limit = min(cheapest[1].plan.cost.total * (1 + TIE_TOLERANCE), max(ceiling, cheapest[1].plan.cost.total))
    ties = [o for o in options if o[1].plan.cost.total <= limit]
    # exact ties go to a mesh over all devices (as on a homogeneous machine), then to the fewest devices
    trial, extraction, memory = min(
        ties,
        key=lambda o: (
            o[1].plan.cost.comm,
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
        f"({extraction.plan.cost.comm * 1e3:.3f} ms instead of {cheapest[1].plan.cost.comm * 1e3:.3f} ms)"
    )
    cheaper = f"{cheapest[0].label}" + (
        "" if cheapest[1].restriction.name == "greedy" else f" ({cheapest[1].restriction.name})"
    )
    return trial, {
        "tolerance": TIE_TOLERANCE,
        "cheapest": {
            "mesh": cheapest[0].label,
            "extraction": cheapest[1].restriction.name,
            "total_s": cheapest[1].plan.cost.total,
            "communication_s": cheapest[1].plan.cost.comm,
        },
        "reason": reason,
        "note": (
            f"{cheaper} is predicted {cheapest[1].plan.cost.total * 1e3:.3f} ms, "
            f"{1 - cheapest[1].plan.cost.total / extraction.plan.cost.total:.1%} less than this plan; {reason}"
        ),
    }


def _plan_choice(result: SearchResult) -> dict[str, Any]:
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
    choice: dict[str, Any] = {"baseline": same}
    if same is not None:
        choice["note"] = f"the plan is the {same} baseline: no other extraction was cheaper"
    cheaper = [
        (name, b)
        for name, b in result.baselines.items()
        if b.memory.fits
        and b.cost.total < plan.cost.total * (1 - 1e-9)
        and (b.trial is None or not b.trial.candidate)  # a returnable one is never cheaper (_choose's ceiling)
    ]
    if cheaper:
        name, b = min(cheaper, key=lambda item: item[1].cost.total)
        why = f"it runs on {b.mesh if name != 'one_device' else 'one device'}, which the search did not consider: "
        why += f"`--mesh` forced {result.trial.label}"
        todo = "drop `--mesh` to let the search return it"
        choice["cheaper_baseline"] = {
            "name": name,
            "total_s": b.cost.total,
            "note": f"{name} ({b.description}) costs {b.cost.total / plan.cost.total:.2f}× this plan: {why}; {todo}",
        }
    return choice


def _skip_deeper(trials: list[MeshTrial]) -> str | None:
    done = [t for t in trials if t.status == "ok" and t.plan is not None and t.candidate]
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


def _infeasible_message(trials: list[MeshTrial], machine: Machine) -> str:
    tried = [t for t in trials if t.min_memory is not None and t.candidate]
    if not tried:
        return "no plan fits in device memory"
    best = min(tried, key=lambda t: t.min_memory.total if t.min_memory else math.inf)
    mem = best.min_memory
    assert mem is not None
    return (
        f"no plan fits in device memory: the smallest plan found (mesh {best.label}) needs "
        f"{gib(mem.total)} per device ({gib(mem.weights)} weights, {gib(mem.weight_state)} gradients and "
        f"optimizer state, {gib(mem.activations)} activations); the devices of {machine.name} have "
        f"{gib(mem.capacity)} usable. Use more devices (`--nodes`), devices with more memory, or a smaller batch."
    )


def gib(nbytes: float) -> str:
    """Bytes as GiB with enough digits to tell small amounts apart."""
    value = nbytes / 2**30
    return f"{value:.2f} GiB" if value >= 1 else f"{value:.3f} GiB"


class _Runner:
    """Saturates meshes (two at a time: the engine runs in worker processes) and extracts their plans."""

    def __init__(
        self,
        graph: Graph,
        machine: Machine,
        objective: Objective,
        rules: list[RuleFile],
        limits: Limits,
        say: Say,
        tracker: Tracker,
        workers: int,
        profile: ProfileTable | None = None,
        split: BlockSplit | None = None,
    ) -> None:
        self.graph = graph
        self.machine = machine
        self.profile = profile
        self.split = split
        self.blocks: dict[str, BlockSaturation] = {}
        self.objective = objective
        self.rules = rules
        self.limits = limits
        self.say = say
        self.tracker = tracker
        self.workers = max(1, workers)
        self.extractors: dict[str, Extractor | BlockExtractor] = {}
        self.data: dict[str, EGraphData] = {}

    def run(self, trials: Sequence[MeshTrial]) -> None:
        if not trials:
            return
        for trial in trials:
            self.tracker.queue(_row(trial))
        with ThreadPoolExecutor(max_workers=min(self.workers, len(trials))) as pool:
            futures: list[tuple[MeshTrial, Future[tuple[Encoding, SaturationResult, float]]]] = [
                (t, pool.submit(self._saturate, t)) for t in trials
            ]
            for trial, future in futures:
                try:
                    encoding, saturation, seconds = future.result()
                except Exception as exc:  # a mesh whose saturation fails is reported, the others go on
                    from unity_eq.errors import UnityEqError

                    if not isinstance(exc, UnityEqError):
                        raise
                    trial.status, trial.reason = "failed", str(exc)
                    self.tracker.finish(_row(trial), f"failed: {exc}")
                    continue
                trial.encoding, trial.saturation, trial.saturate_s = encoding, saturation, seconds
                trial.enodes, trial.stop_reason = saturation.enodes, saturation.stop_reason.value
                self._extract(trial)

    def _saturate(self, trial: MeshTrial) -> tuple[Encoding, SaturationResult, float]:
        raise_if_stopped()  # SIGTERM/SIGINT: the meshes still queued are not started
        start = time.perf_counter()
        row = _row(trial)
        if self.split is not None:
            self.tracker.start(row, f"saturating {len(self.split.distinct)} distinct pieces")
            pieces = len(self.split.distinct)
            done = iter(range(1, pieces + 1))

            def piece_done(message: str) -> None:
                self.tracker.update(row, f"saturated {next(done)} of {pieces} pieces ({message})")

            blocks = saturate_pieces(self.split, trial.mesh, self.rules, self.limits, piece_done)
            self.blocks[trial.label] = blocks
            return blocks.solutions[next(iter(blocks.solutions))].encoding, blocks.total, time.perf_counter() - start
        encoding = encode(self.graph, trial.mesh)
        self.tracker.start(row, "saturating")

        def iteration(phase: str, number: int, enodes: int, _seconds: float) -> None:
            self.tracker.update(row, f"saturating: {phase} iteration {number}, {enodes} e-nodes")

        result = saturate(self.rules, encoding, self.limits, iteration)
        return encoding, result, time.perf_counter() - start

    def _extract(self, trial: MeshTrial) -> None:
        assert trial.encoding is not None and trial.saturation is not None
        start = time.perf_counter()
        model = CostModel(self.machine, trial.mesh, self.objective, profile=self.profile)
        extractor: Extractor | BlockExtractor
        if trial.label in self.blocks:
            extractor = BlockExtractor(self.blocks[trial.label], self.graph, model)
        else:
            data = parse_serialized(trial.saturation.serialized)
            extractor = Extractor(data, trial.encoding, self.graph, model)
            self.data[trial.label] = data
        self.extractors[trial.label] = extractor
        variants = [Restriction()]
        if len(trial.mesh.axes) == 1:
            variants += [Restriction.data_parallel(), Restriction.data_parallel(strict=False)]
        variants += [Restriction.tensor_parallel(a) for a in trial.mesh.axes]
        for restriction in variants:
            self.tracker.update(_row(trial), f"extracting ({restriction.name}), {trial.enodes} e-nodes")
            try:
                extraction = extractor.extract(restriction)
            except ExtractionError:
                if restriction.name == "greedy":
                    raise
                continue
            trial.extractions.append((extraction, plan_memory(extraction.plan)))
        cheapest = min(trial.extractions, key=lambda em: em[0].plan.cost.total)
        if not cheapest[1].fits and trial.candidate:
            self._penalize(trial, extractor, cheapest)
        fitting = [(e, m) for e, m in trial.extractions if m.fits]
        if fitting:
            extraction, memory = min(fitting, key=lambda em: em[0].plan.cost.total)
            trial.status = "ok"
            trial.plan, trial.memory = extraction.plan, memory
            trial.extraction, trial.penalty = extraction.restriction.name, extraction.penalty
        else:
            trial.status = "infeasible"
            trial.reason = "no extraction fits in device memory"
        everything = [m for _, m in trial.extractions]
        trial.min_memory = min(everything, key=lambda m: m.total) if everything else None
        trial.extract_s = time.perf_counter() - start
        cost = f"{trial.plan.cost.total * 1e3:.3f} ms" if trial.plan else "does not fit"
        self.tracker.finish(_row(trial), f"{trial.enodes} e-nodes, {cost} ({trial.saturate_s + trial.extract_s:.1f} s)")

    def _penalize(
        self, trial: MeshTrial, extractor: Extractor | BlockExtractor, cheapest: tuple[Extraction, MemoryUsage]
    ) -> None:
        """The cheapest extraction does not fit: re-extract with a growing penalty on per-device bytes until
        one fits (or the rounds run out). The extractions join the mesh's candidates."""
        base, memory = cheapest
        penalty = base.plan.cost.total / max(memory.total, 1.0)
        previous, stalled = memory.total, 0
        for round_ in range(1, PENALTY_ROUNDS + 1):
            extraction = extractor.extract(Restriction(), penalty)
            usage = plan_memory(extraction.plan)
            trial.extractions.append((extraction, usage))
            trial.penalty_rounds = round_
            self.say(
                f"mesh {trial.label}: memory penalty round {round_}: needs {gib(usage.total)} per device "
                f"of {gib(usage.capacity)}"
            )
            if usage.fits:
                return
            if usage.total >= previous * (1 - 1e-9):
                stalled += 1
                if stalled == 2:
                    return  # the penalty no longer changes the plan: no plan of this mesh fits
            else:
                stalled = 0
            previous = usage.total
            penalty *= PENALTY_GROWTH


def _row(trial: MeshTrial) -> str:
    """The progress row of a mesh (``mesh x=2,y=4``)."""
    return f"mesh {trial.label}"


def fastest_device(machine: Machine) -> int:
    """The machine's fastest device (peak float32 FLOP/s, then memory bandwidth; the first of equals)."""
    kinds: dict[str, int] = {}
    for device, spec in enumerate(machine.devices):
        kinds.setdefault(spec.name, device)
    return max(
        kinds.values(), key=lambda d: (machine.devices[d].peak("float32"), machine.devices[d].memory_bandwidth, -d)
    )


def _flat_trial(trials: Sequence[MeshTrial]) -> MeshTrial | None:
    """The 1-axis mesh over all devices (the baselines are priced on its e-graph)."""
    return next((t for t in trials if t.extractions and len(t.mesh.axes) == 1 and not t.scope), None)


def _one_device_trial(
    trials: list[MeshTrial], runner: _Runner, machine: Machine, objective: Objective, candidate: bool
) -> MeshTrial | None:
    """The one-device plan on the fastest device as a mesh of its own: the 1-axis mesh's e-graph with nothing
    partitioned, priced on that device alone. A candidate (the search may return it) unless ``--mesh``
    forced another mesh; on a one-device machine it is the 1-axis mesh itself."""
    flat = _flat_trial(trials)
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
        [axis_info(model, a) for a in single.axes],
        candidate=candidate,
        scope=device_span((fastest,)),
        device_kind=machine.devices[fastest].name,
        enodes=flat.enodes,
        stop_reason=flat.stop_reason,
        saturation=flat.saturation,
        encoding=flat.encoding,
        egraph_of=flat.label,
    )
    row = _row(trial)
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
        trial.status, trial.plan, trial.memory = "ok", extraction.plan, memory
        trial.extraction = extraction.restriction.name
        cost = f"{extraction.plan.cost.total * 1e3:.3f} ms"
    else:
        trial.status, cost = "infeasible", "does not fit"
    runner.tracker.finish(row, f"one device, {cost}")
    return trial


def _baselines(
    trials: list[MeshTrial], runner: _Runner, machine: Machine, one_trial: MeshTrial | None
) -> dict[str, Baseline]:
    done = [t for t in trials if t.extractions]
    found: dict[str, Baseline] = {}
    flat = _flat_trial(trials)
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
            found["data_parallel"] = _baseline_of("data_parallel", description, flat.label, flat, extraction, usage)
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
        where = next(a for a in trial.axes if a["name"] == axis)
        span = "across nodes" if where["spans_nodes"] else "inside a node"
        found["tensor_parallel"] = _baseline_of(
            "tensor_parallel",
            f"tensor parallel over {size} devices ({span}, axis {axis} of mesh {trial.label})",
            f"{trial.label} (axis {axis})",
            trial,
            extraction,
            usage,
        )
    return found
