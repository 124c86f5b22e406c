"""The stage search: pipeline stages × data-parallel replicas × tensor groups, microbatches, schedule,
recomputation and sharded weight state, priced by the cost model over intra-op plans from the e-graph.

Unity's PCG writes a pipeline as ``Batch`` (split the batch into ``m`` microbatches) and ``Pipeline``
(stage ``s`` runs pieces ``i..j`` on its own sub-mesh); the intra-op plan of each piece on a sub-mesh is
what saturation and extraction already find. This module is the inter-op level (as Alpa's and Piper's
two-level search): for every way to lay ``N = p · d · t`` devices out (tensor groups inside a node, ranks
ordered so ``t`` is fastest, then ``d`` and ``p`` or ``p`` and ``d``: the costs pick which crosses nodes), every
microbatch size, schedule (:mod:`.schedule`), recomputation (none: keep every activation for the backward;
full: keep each piece's input and run its forward again) and ZeRO stage (:mod:`.state`), the pieces are cut
into ``p`` stages (:mod:`.partition`) and the step is priced:

    step = Σ_s τ_s + (m − 1) · max_s τ_s + max_s (gradient sync_s + optimizer_s)

with ``τ_s`` a stage's forward and backward of one microbatch — its pieces' compute and group collectives,
recomputed forwards, ZeRO-3's per-microbatch gathers, and the activations it sends to the next stage and
the gradients it sends back, over the links the two stages sit on. The cheapest configuration whose every
stage fits in device memory wins; when none fits, :func:`stage_search` says by how much.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.cost import CostModel, Objective
from unity_eq.errors import InfeasiblePlanError, OptionError
from unity_eq.ir import Mesh
from unity_eq.machine import Machine
from unity_eq.search.meshes import device_groups
from unity_eq.split import Piece
from unity_eq.stages.arithmetic import shapes
from unity_eq.stages.partition import StageCuts, StageFunctions, partition
from unity_eq.stages.pieces import PieceCost, PieceTable
from unity_eq.stages.schedule import SCHEDULES, bubble_fraction, in_flight, pipeline_seconds
from unity_eq.stages.state import (
    ZERO_STAGES,
    microbatch_traffic_s,
    optimizer_update_s,
    shard_factors,
    step_traffic_s,
)

__all__ = [
    "StageConfig",
    "StageFilter",
    "StageMemory",
    "StagePlan",
    "evaluate",
    "group_sizes",
    "priced_pairs",
    "side_receives",
    "stage_search",
    "static_batch_note",
]

#: none: keep every activation; full: every stage keeps its pieces' inputs and recomputes; stage: each stage
#: recomputes only if keeping its activations would not fit (1F1B's first stages hold more microbatches)
RECOMPUTE = ("none", "full", "stage")
ORDERS = ("pdt", "dpt")  # rank order, slowest axis first: pipeline across data replicas, or the other way
#: Which intra-op plan of each piece: the cheapest; the cheapest of those that keep at most 1.25× the least
#: weight memory (sharded weights); the least memory.
POLICIES = ("fastest", "sharded", "smallest")


@dataclass(frozen=True)
class StageConfig:
    """One point of the search space."""

    stages: int
    data: int
    tensor: int
    microbatch: int  # samples per microbatch on one replica
    microbatches: int
    schedule: str = "1f1b"
    recompute: str = "none"
    zero: int = 0
    order: str = "pdt"
    policy: str = "fastest"
    groups: tuple[int, ...] = (0,)  # the machine's device groups (one kind each) in pipeline order

    def describe(self) -> str:
        return (
            f"t={self.tensor} p={self.stages} d={self.data}, {self.microbatches} microbatches of "
            f"{self.microbatch}, {self.schedule}, recompute {self.recompute}, ZeRO-{self.zero}"
        )


@dataclass(frozen=True)
class StageFilter:
    """The part of the configuration a user forced (``--stages``, ``--tensor``, ``--microbatches``): to run a
    chosen layout, or to test one; a field left None stays free for the search."""

    stages: int | None = None
    tensor: int | None = None
    microbatches: int | None = None

    def admits(self, config: StageConfig) -> bool:
        return all(
            want is None or want == have
            for want, have in (
                (self.stages, config.stages),
                (self.tensor, config.tensor),
                (self.microbatches, config.microbatches),
            )
        )

    def describe(self) -> str:
        given = (("--stages", self.stages), ("--tensor", self.tensor), ("--microbatches", self.microbatches))
        return ", ".join(f"`{name} {value}`" for name, value in given if value is not None)


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one stage."""

    weights: float
    weight_state: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.weight_state + self.activations


@dataclass(frozen=True)
class StagePlan:
    """A configuration with its stages and predicted step."""

    config: StageConfig
    cuts: tuple[tuple[int, int], ...]  # each stage's pieces [first, end)
    stage_s: tuple[float, ...]  # per microbatch
    pipeline_s: float
    sync_s: float  # gradient synchronization and optimizer update after the last microbatch (the slowest stage)
    memory: tuple[StageMemory, ...]
    capacities: tuple[float, ...]  # usable bytes per device of each stage
    devices: tuple[tuple[int, ...], ...] = ()  # each stage's devices (rank = device), replicas × tensor group
    recomputed: tuple[bool, ...] = ()  # whether each stage recomputes its activations
    #: the intra-op plan chosen for every piece (in model order, on its stage's device group): what lowering writes
    pieces: tuple[PieceCost, ...] = ()

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.sync_s

    @property
    def peak_bytes(self) -> float:
        return max(m.total for m in self.memory)

    @property
    def capacity(self) -> float:
        return min(self.capacities)

    @property
    def fits(self) -> bool:
        return all(m.total <= c for m, c in zip(self.memory, self.capacities, strict=True))

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.stage_s, self.config.microbatches)


def group_sizes(machine: Machine) -> list[int]:
    """Tensor-group sizes: the divisors of a node's device count (tensor parallelism stays inside a node)."""
    counts = np.bincount(machine.node_array) if machine.device_count else np.ones(1, dtype=np.int64)
    per_node = int(counts[counts > 0].min())
    return [g for g in range(1, per_node + 1) if per_node % g == 0 and machine.device_count % g == 0]


def _group_mesh(config: StageConfig, stages: int, devices: Sequence[int]) -> Mesh:
    """One device group's part of the layout: its ``stages`` stages × d × t over its devices, in order."""
    sizes = {"p": stages, "d": config.data, "t": config.tensor}
    axes = tuple(config.order)
    return Mesh(axes, tuple(sizes[a] for a in axes), tuple(devices))


def _stage_devices(config: StageConfig, stages: int, devices: Sequence[int], k: int) -> tuple[int, ...]:
    """The devices of the ``k``-th stage of a group: tensor group fastest, then the order's axes."""
    d, t = config.data, config.tensor
    if config.order == "pdt":
        return tuple(devices[k * d * t : (k + 1) * d * t])
    return tuple(devices[(r * stages + k) * t + j] for r in range(d) for j in range(t))


def _pick(options: list[PieceCost], policy: str) -> PieceCost:
    if policy == "fastest":
        return min(options, key=lambda c: (c.step_s, c.activation_bytes + c.weight_bytes))
    if policy == "sharded":
        least = min(c.weight_bytes for c in options)
        return min((c for c in options if c.weight_bytes <= 1.25 * least), key=lambda c: (c.step_s, c.activation_bytes))
    return min(options, key=lambda c: (c.activation_bytes + c.weight_bytes + c.state_bytes, c.step_s))


@dataclass
class _Group:
    """One device group's stages under a configuration: their cost model and per-piece arrays."""

    index: int
    devices: tuple[int, ...]
    stages: int
    model: CostModel
    pieces: list[PieceCost]
    keep: StageFunctions  # per piece: seconds, resident bytes, bytes per microbatch held, keeping activations
    redo: StageFunctions  # the same with full recomputation (each piece keeps its input, runs its forward again)
    capacity: float
    bandwidth: float


def _group(
    config: StageConfig, table: PieceTable, machine: Machine, objective: Objective, index: int, devices: tuple[int, ...]
) -> _Group:
    training = objective.training
    stages = len(devices) // (config.data * config.tensor)
    model = CostModel(machine, _group_mesh(config, stages, devices), objective)
    pieces = [_pick(o, config.policy) for o in table.costs(config.tensor, config.microbatch, index)]
    weight_f, gradient_f, optimizer_f = shard_factors(config.zero, config.data)
    zero_s = [microbatch_traffic_s(config.zero, c.weight_bytes, config.data, model, training) for c in pieces]
    seconds = [c.step_s + z for c, z in zip(pieces, zero_s, strict=True)]
    fixed = [
        c.weight_bytes * weight_f
        + min(c.state_bytes, c.weight_bytes) * gradient_f
        + max(0.0, c.state_bytes - c.weight_bytes) * optimizer_f
        for c in pieces
    ]
    # inference keeps nothing per microbatch: a stage's peak is its largest piece's (``largest_activation``)
    held = [c.activation_bytes for c in pieces] if training else [0.0] * len(pieces)
    keep = StageFunctions(seconds, fixed, held, _none, _none, _one)
    redo = StageFunctions(
        [t + c.forward_s for t, c in zip(seconds, pieces, strict=True)], fixed, [c.input_bytes for c in pieces],
        _none, _none, _one,
    )  # fmt: skip
    device = machine.devices[devices[0]]
    bandwidth = device.memory_bandwidth * machine.efficiency
    return _Group(index, devices, stages, model, pieces, keep, redo, model.memory_capacity(), bandwidth)


def _sends(
    config: StageConfig, layout: list[_Group], stage_group: list[_Group], machine: Machine, objective: Objective
) -> list[list[float]]:
    """Per stage boundary (stage s to s + 1), the time to send each piece's output across it. Boundaries
    inside one group share their prices (one link), and so do pieces whose outputs are the same size."""
    priced: dict[tuple[int, int], list[float]] = {}
    found: list[list[float]] = []
    for s in range(len(stage_group) - 1):
        a, b = stage_group[s], stage_group[s + 1]
        key = (id(a), id(b))
        if key not in priced:
            if a is b:
                model = a.model
            else:  # across two device groups: one device of each, over whatever links join them
                model = CostModel(machine, Mesh(("p",), (2,), (a.devices[-1], b.devices[0])), objective)
            by_size: dict[float, float] = {}
            for c in a.pieces:
                if c.output_bytes not in by_size:
                    by_size[c.output_bytes] = model.send("p", c.output_bytes)
            priced[key] = [by_size[c.output_bytes] for c in a.pieces]
        found.append(priced[key])
    return found


def side_receives(pieces: Sequence[Piece], cuts: Sequence[tuple[int, int]]) -> list[tuple[str, ...]]:
    """Per stage, the side tensors (``split``: an attention mask every layer reads, made by the first piece) it
    receives from stage 0, in order of first use; stage 0 makes them and receives none."""
    return [
        tuple(dict.fromkeys(name for piece in pieces[i:j] for name in piece.side_in)) if s else ()
        for s, (i, j) in enumerate(cuts)
    ]


def _side_links(config: StageConfig, layout: list[_Group], machine: Machine, objective: Objective) -> list[CostModel]:
    """Per later stage (1, 2, …), the link from stage 0 to it (one device of each: the first replica's first
    tensor rank): side tensors go point to point from stage 0 to every later stage that reads them, over
    whatever joins the two."""
    first = [_stage_devices(config, group.stages, group.devices, k)[0] for group in layout for k in range(group.stages)]
    return [CostModel(machine, Mesh(("p",), (2,), (first[0], device)), objective) for device in first[1:]]


def _side_seconds(links: list[CostModel], sizes: dict[str, float], reads: Sequence[Sequence[str]]) -> float:
    """Stage 0's time per microbatch sending each later stage the side tensors it reads (``reads`` per stage)."""
    return sum(
        links[s - 1].send("p", sum(sizes[name] for name in names)) for s, names in enumerate(reads) if s and names
    )


def evaluate(
    config: StageConfig,
    table: PieceTable,
    machine: Machine,
    objective: Objective,
    batch: int,
    groups: Sequence[tuple[int, ...]] | None = None,
    memo: dict[Any, Any] | None = None,
) -> StagePlan | None:
    """Price ``config``: cut the pieces into stages and return the plan, or None when no cut fits memory or
    the configuration does not divide the batch and devices. ``groups``: the machine's device groups
    (``search.device_groups``; computed when not given). ``memo``: a dict kept across calls on one table and
    machine, holding what configurations that differ only in schedule and recomputation share."""
    if config.data * config.microbatch * config.microbatches != batch:
        return None
    groups = list(groups) if groups is not None else device_groups(machine)
    if any((config.tensor, config.microbatch, g) not in table.options for g in config.groups):
        return None
    per_stage = config.data * config.tensor
    if any(len(groups[g]) % per_stage for g in config.groups):
        return None
    training = objective.training
    memo = memo if memo is not None else {}
    shared = (config.tensor, config.microbatch, config.policy, config.zero, config.data, config.order, config.groups)
    if shared not in memo:
        layout = [_group(config, table, machine, objective, g, groups[g]) for g in config.groups]
        stage_group = [group for group in layout for _ in range(group.stages)]
        memo[shared] = (layout, stage_group, _sends(config, layout, stage_group, machine, objective))
    layout, stage_group, sends = memo[shared]
    stage_index = [k for group in layout for k in range(group.stages)]
    if len(stage_group) != config.stages:
        return None
    sizes = table.side_bytes.get(config.microbatch, {})
    links: list[CostModel] = []
    side_bound = 0.0
    if sizes and config.stages > 1:
        if (shared, "side") not in memo:
            memo[(shared, "side")] = _side_links(config, layout, machine, objective)
        links = memo[(shared, "side")]
        # while cutting, stage 0 pays a send of every side tensor to every later stage (the cut is not known
        # yet, and this keeps stage 0's time independent of the later stages); the plan's figures are exact
        side_bound = _side_seconds(links, sizes, [tuple(sizes)] * config.stages)
    largest_weights = max(c.weight_bytes for g in layout for c in g.pieces)
    largest_activation = max(c.activation_bytes for g in layout for c in g.pieces)
    capacities = [g.capacity for g in stage_group]

    def bytes_with(f: StageFunctions, stage: int, i: int, j: int, redo: bool) -> float:
        copies = in_flight(config.schedule, stage, config.stages, config.microbatches, training)
        gathered = 2 * largest_weights if config.zero == 3 and config.data > 1 else 0.0
        # recomputing, a stage also holds one piece's activations at a time; inference holds its largest piece's
        working = largest_activation if redo or not training else 0.0
        return f.fixed[j] - f.fixed[i] + copies * (f.held[j] - f.held[i]) + gathered + working

    def recomputes(stage: int, i: int, j: int) -> bool:
        """Whether the stage recomputes: always, never, or (``stage``) when keeping would not fit."""
        if not training or config.recompute == "none":
            return False
        if config.recompute == "full":
            return True
        return bytes_with(stage_group[stage].keep, stage, i, j, False) > capacities[stage]

    def seconds(stage: int, i: int, j: int, side: float | None = None) -> float:
        group = stage_group[stage]
        f = group.redo if recomputes(stage, i, j) else group.keep
        forward = sends[stage][j - 1] if stage < config.stages - 1 else 0.0
        backward = sends[stage - 1][i - 1] if training and stage > 0 else 0.0  # the input's gradient goes back
        # side tensors carry no gradient back (a mask or a rotary table is computed from inputs alone)
        extra = (side_bound if side is None else side) if stage == 0 else 0.0
        return f.time[j] - f.time[i] + forward + backward + extra

    def nbytes(stage: int, i: int, j: int) -> float:
        redo = recomputes(stage, i, j)
        group = stage_group[stage]
        return bytes_with(group.redo if redo else group.keep, stage, i, j, redo)

    cuts = partition(StageCuts(len(table.pieces), seconds, nbytes), config.stages, capacities)
    if cuts is None:
        return None
    weight_f = shard_factors(config.zero, config.data)[0]
    side_exact = _side_seconds(links, sizes, side_receives(table.pieces, cuts)) if links else 0.0
    memory, stage_s, devices, redone = [], [], [], []
    chosen: list[PieceCost] = []
    sync = 0.0
    for s, (i, j) in enumerate(cuts):
        group = stage_group[s]
        resident = group.keep.fixed[j] - group.keep.fixed[i]
        weights = sum(c.weight_bytes for c in group.pieces[i:j])
        memory.append(StageMemory(weights * weight_f, resident - weights * weight_f, nbytes(s, i, j) - resident))
        stage_s.append(seconds(s, i, j, side_exact))
        chosen.extend(group.pieces[i:j])
        devices.append(_stage_devices(config, group.stages, group.devices, stage_index[s]))
        redone.append(recomputes(s, i, j))
        own = sum(c.gradient_s for c in group.pieces[i:j])
        update = optimizer_update_s(resident, group.bandwidth) if training else 0.0
        sync = max(sync, step_traffic_s(config.zero, weights, config.data, group.model, training) + own + update)
    return StagePlan(
        config,
        tuple(cuts),
        tuple(stage_s),
        pipeline_seconds(stage_s, config.microbatches),
        sync,
        tuple(memory),
        tuple(capacities),
        tuple(devices),
        tuple(redone),
        tuple(chosen),
    )


def _none(_stage: int, _i: int, _j: int) -> float:
    return 0.0


def _one(_stage: int) -> int:
    return 1


def priced_pairs(
    tensor_sizes: Sequence[int],
    groups: Sequence[Sequence[int]],
    batch: int,
    micro_sizes: Sequence[int],
    min_stages: int = 1,
) -> list[tuple[int, int]]:
    """The (tensor-group size, microbatch) pairs some layout with at least ``min_stages`` stages uses: only
    their pieces need saturating (the training search leaves one stage to the SPMD search, so a tensor group
    of a whole node on a one-node machine is never priced there)."""
    sizes = [len(g) for g in groups]
    found = shapes(sizes, tensor_sizes, None, batch, micro_sizes)
    return sorted({(s.tensor, s.microbatch) for s in found if s.stages >= min_stages})


def configurations(
    table: PieceTable,
    groups: Sequence[Sequence[int]],
    batch: int,
    micro_sizes: Sequence[int],
    training: bool,
    pipeline: bool = True,
) -> Iterator[StageConfig]:
    """Every configuration the table can price over the machine's device ``groups`` (``pipeline=False``:
    one stage only). Every group gets at least one stage, all of the same d × t devices; the groups are
    tried in every order along the pipeline. A layout whose pieces were not priced (``priced_pairs``) is
    left out."""
    sizes = [len(g) for g in groups]
    orders = list(itertools.permutations(range(len(groups))))
    tensors = sorted({t for t, _, _ in table.options})
    priced = {(t, b) for t, b, _ in table.options}
    for shape in shapes(sizes, tensors, len(table.pieces), batch, micro_sizes, pipeline):
        if (shape.tensor, shape.microbatch) not in priced:
            continue
        stages, data = shape.stages, shape.data
        choices = itertools.product(
            RECOMPUTE if training else ("none",),
            (ZERO_STAGES if training else (0, 3)) if data > 1 else (0,),
            SCHEDULES if training and stages > 1 else ("1f1b",),
            ORDERS if stages > 1 and data > 1 else ("pdt",),
            POLICIES,
            orders,
        )
        for recompute, zero, schedule, order, policy, layout in choices:
            yield StageConfig(
                stages,
                data,
                shape.tensor,
                shape.microbatch,
                shape.microbatches,
                schedule,
                recompute,
                zero,
                order,
                policy,
                layout,
            )


def static_batch_note(micro: int) -> str:
    """Why a model exported with a static batch gets fewer pipelines, and what to do about it."""
    return (
        f"the model's batch dimension is static ({micro}): every microbatch is {micro} samples, which limits "
        f"the stage search (microbatches of {micro} only; a batch per step of {micro} allows one microbatch); "
        "export it with a dynamic batch axis (torch.onnx.export(..., dynamo=True, dynamic_shapes={INPUT: "
        "{0: torch.export.Dim('batch')}}), or dynamic_axes={INPUT: {0: 'batch'}}) and pass `--batch N` to "
        "try every microbatch size that divides a replica's batch"
    )


def _rank(plan: StagePlan) -> tuple[float, int, int, int]:
    """Cheapest first; on a tie the simpler: no recomputation, less weight-state sharding, fewer stages."""
    c = plan.config
    return (round(plan.step_s, 12), int(c.recompute != "none"), c.zero, c.stages)


@dataclass
class StageSearch:
    """What :func:`stage_search` found."""

    best: StagePlan
    best_flat: StagePlan | None  # the best with one stage (no pipeline)
    evaluated: int
    fitting: int


def stage_search(
    table: PieceTable,
    machine: Machine,
    objective: Objective,
    batch: int,
    micro_sizes: Sequence[int],
    only: StageFilter | None = None,
    static_batch: int | None = None,
    min_stages: int = 1,
) -> StageSearch:
    """The cheapest configuration that fits (among those ``only`` admits); InfeasiblePlanError names the
    smallest footprint found and what would make it fit, OptionError says when ``only`` admits none.
    ``static_batch``: the model's own batch when it is static (the only microbatch), named in those errors
    since it, not the devices, is then what no configuration divides. ``min_stages``: the best has at least
    that many stages (2: the training search, whose one-stage case is the SPMD search's); ``best_flat`` is
    still the best one-stage configuration priced."""
    groups = device_groups(machine)
    memo: dict[Any, Any] = {}
    best: StagePlan | None = None
    flat: StagePlan | None = None
    smallest: tuple[float, StageConfig] | None = None
    evaluated = fitting = 0
    for config in configurations(table, groups, batch, micro_sizes, objective.training):
        if only is not None and not only.admits(config):
            continue
        evaluated += 1
        plan = evaluate(config, table, machine, objective, batch, groups, memo)
        if plan is None:
            if config.stages < min_stages:
                continue
            footprint = _footprint(config, table, objective)
            if smallest is None or footprint < smallest[0]:
                smallest = (footprint, config)
            continue
        fitting += 1
        if config.stages >= min_stages and (best is None or _rank(plan) < _rank(best)):
            best = plan
        if config.stages == 1 and (flat is None or _rank(plan) < _rank(flat)):
            flat = plan
    static = f" ({static_batch_note(static_batch)})" if static_batch is not None else ""
    if only is not None and evaluated == 0:
        limit = (
            f"the model's static batch {static_batch} is every microbatch{static}"
            if static_batch is not None
            else "the microbatches the batch per replica"
        )
        raise OptionError(
            f"{only.describe()}: no configuration of {machine.device_count} devices and a batch of {batch} "
            f"(microbatches of {', '.join(map(str, micro_sizes))}) has them; stages × tensor must divide the "
            f"devices, tensor the devices of a node, and {limit}."
        )
    if best is None:
        raise InfeasiblePlanError(_infeasible(smallest, machine, static_batch))
    return StageSearch(best, flat, evaluated, fitting)


def _footprint(config: StageConfig, table: PieceTable, objective: Objective) -> float:
    """Bytes per device with every piece spread evenly over the stages (a lower bound of the real cut)."""
    if (config.tensor, config.microbatch, config.groups[0]) not in table.options:
        return math.inf
    pieces = [_pick(o, "smallest") for o in table.costs(config.tensor, config.microbatch, config.groups[0])]
    weight_f, gradient_f, optimizer_f = shard_factors(config.zero, config.data)
    resident = sum(
        c.weight_bytes * weight_f
        + min(c.state_bytes, c.weight_bytes) * gradient_f
        + max(0.0, c.state_bytes - c.weight_bytes) * optimizer_f
        for c in pieces
    )
    recompute = objective.training and config.recompute != "none"
    held = sum(c.input_bytes if recompute else c.activation_bytes for c in pieces)
    copies = in_flight(config.schedule, 0, config.stages, config.microbatches, objective.training)
    return (resident + copies * held) / config.stages


def _infeasible(smallest: tuple[float, StageConfig] | None, machine: Machine, static_batch: int | None = None) -> str:
    capacity = min(machine.usable_memory(d) for d in range(machine.device_count))
    if smallest is None and static_batch is not None:
        return f"no stage configuration fits the devices: {static_batch_note(static_batch)}."
    if smallest is None:
        return "no stage configuration divides the batch and the devices; pass a batch the devices divide."
    need, config = smallest
    factor = need / capacity
    return (
        f"no stage configuration fits: the smallest ({config.describe()}) needs about {need / 2**30:.1f} GiB per "
        f"device of {capacity / 2**30:.1f} GiB ({factor:.1f}×); use about {math.ceil(factor) * machine.device_count} "
        "devices, a smaller batch, or devices with more memory."
    )
