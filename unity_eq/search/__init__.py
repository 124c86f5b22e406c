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

=============  =============================================================================================
module         what it does
=============  =============================================================================================
meshes         candidate meshes over the machine's devices, pruned (equivalent, misaligned, useless)
trial          ``MeshTrial``: one mesh's saturation, extractions and verdict
baselines      the one-device, data- and tensor-parallel baselines, priced on the same e-graphs
choose         choosing among meshes: ties, the baseline ceiling, why deeper meshes were skipped
runner         saturating meshes in worker processes and extracting each (memory penalties)
=============  =============================================================================================
"""

from __future__ import annotations

from unity_eq.cost import CostModel, Objective
from unity_eq.egraph import Limits
from unity_eq.errors import ExtractionError, InfeasiblePlanError, OptionError
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import Machine
from unity_eq.planfile.axes import axis_info
from unity_eq.profile_table import ProfileTable
from unity_eq.progress import LineTracker, Tracker
from unity_eq.rulefile.manifest import RuleFile
from unity_eq.search.baselines import Baseline, one_device_trial, price_baselines
from unity_eq.search.choose import SearchResult, baseline_ceiling, choose_trial, no_plan_fits, skip_deeper
from unity_eq.search.meshes import candidate_meshes, device_groups
from unity_eq.search.runner import MeshRunner
from unity_eq.search.trial import MeshTrial, Say, TrialStatus
from unity_eq.split import BlockSplit, split_graph

__all__ = [
    "Baseline",
    "MeshTrial",
    "SearchResult",
    "TrialStatus",
    "candidate_meshes",
    "device_groups",
    "search",
]

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
        trials = [MeshTrial(mesh, tuple(axis_info(model, a) for a in mesh.axes))]
        if mesh.sizes != flat.sizes and n > 1:
            baseline_only = MeshTrial(flat, (axis_info(CostModel(machine, flat, objective), "x"),), candidate=False)
            trials.append(baseline_only)
    else:
        trials = candidate_meshes(machine, graph, objective, max_axes)

    runner = MeshRunner(graph, machine, objective, rules, limits, say, tracker, workers, profile, split)
    first = [t for t in trials if t.status == TrialStatus.PENDING and len(t.mesh.axes) <= 2]
    runner.run(first)
    deeper = [t for t in trials if t.status == TrialStatus.PENDING and len(t.mesh.axes) == 3]
    if deeper:
        if mesh is not None:
            runner.run(deeper)
        else:
            reason = skip_deeper(trials)
            if reason:
                for t in deeper:
                    t.status, t.reason = TrialStatus.SKIPPED, reason
            else:
                runner.run(deeper)

    one_trial = one_device_trial(trials, runner, machine, objective, candidate=mesh is None)
    if one_trial is not None and one_trial not in trials:
        trials.append(one_trial)
    candidates = [t for t in trials if t.candidate and t.status == TrialStatus.OK and t.plan is not None]
    if not candidates:
        failed = [t for t in trials if t.status == TrialStatus.FAILED]
        if failed and not any(t.status == TrialStatus.INFEASIBLE for t in trials):
            raise ExtractionError(f"no mesh produced a plan: {failed[0].label}: {failed[0].reason}")
        raise InfeasiblePlanError(no_plan_fits(trials, machine))
    tracker.start("baselines", "pricing one device, data parallel, tensor parallel")
    baselines = price_baselines(trials, runner, machine, one_trial)
    tracker.finish("baselines", ", ".join(f"{name} {b.cost.total * 1e3:.3f} ms" for name, b in baselines.items()))
    best, tie_break = choose_trial(candidates, baseline_ceiling(baselines))
    assert best.plan is not None
    return SearchResult(best.plan, best, trials, baselines, runner.extractors, tie_break, split)
