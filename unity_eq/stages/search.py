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

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from unity_eq.cost import CostModel, Objective
from unity_eq.errors import InfeasiblePlanError, OptionError
from unity_eq.ir import Mesh
from unity_eq.machine import Machine
from unity_eq.stages.partition import StageFunctions, partition
from unity_eq.stages.pieces import PieceCost, PieceTable
from unity_eq.stages.schedule import SCHEDULES, bubble_fraction, in_flight, pipeline_seconds
from unity_eq.stages.state import ZERO_STAGES, microbatch_traffic_s, shard_factors, step_traffic_s

__all__ = ["StageConfig", "StageFilter", "StageMemory", "StagePlan", "evaluate", "group_sizes", "stage_search"]

RECOMPUTE = ("none", "full")
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
    capacity: float

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.sync_s

    @property
    def peak_bytes(self) -> float:
        return max(m.total for m in self.memory)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.stage_s, self.config.microbatches)


def group_sizes(machine: Machine) -> list[int]:
    """Tensor-group sizes: the divisors of a node's device count (tensor parallelism stays inside a node)."""
    counts = np.bincount(machine.node_array) if machine.device_count else np.ones(1, dtype=np.int64)
    per_node = int(counts[counts > 0].min())
    return [g for g in range(1, per_node + 1) if per_node % g == 0 and machine.device_count % g == 0]


def _stage_mesh(config: StageConfig, devices: int) -> Mesh:
    sizes = {"p": config.stages, "d": config.data, "t": config.tensor}
    axes = tuple(config.order)
    if math.prod(sizes[a] for a in axes) != devices:
        raise ValueError(f"{config.describe()} uses {config.stages * config.data * config.tensor} of {devices} devices")
    return Mesh(axes, tuple(sizes[a] for a in axes))


def _pick(options: list[PieceCost], policy: str) -> PieceCost:
    if policy == "fastest":
        return min(options, key=lambda c: (c.step_s, c.activation_bytes + c.weight_bytes))
    if policy == "sharded":
        least = min(c.weight_bytes for c in options)
        return min((c for c in options if c.weight_bytes <= 1.25 * least), key=lambda c: (c.step_s, c.activation_bytes))
    return min(options, key=lambda c: (c.activation_bytes + c.weight_bytes + c.state_bytes, c.step_s))


def evaluate(
    config: StageConfig, table: PieceTable, machine: Machine, objective: Objective, batch: int
) -> StagePlan | None:
    """Price ``config``: cut the pieces into stages and return the plan, or None when no cut fits memory or
    the configuration does not divide the batch and devices."""
    if config.data * config.microbatch * config.microbatches != batch:
        return None
    if (config.tensor, config.microbatch) not in table.options:
        return None
    training = objective.training
    model = CostModel(machine, _stage_mesh(config, machine.device_count), objective)
    pieces = [_pick(o, config.policy) for o in table.costs(config.tensor, config.microbatch)]
    weight_f, gradient_f, optimizer_f = shard_factors(config.zero, config.data)
    recompute = training and config.recompute == "full"
    dp = config.data

    zero_s = [microbatch_traffic_s(config.zero, c.weight_bytes, dp, model, training) for c in pieces]
    seconds = [c.step_s + (c.forward_s if recompute else 0.0) + z for c, z in zip(pieces, zero_s, strict=True)]
    fixed = [
        c.weight_bytes * weight_f
        + min(c.state_bytes, c.weight_bytes) * gradient_f
        + max(0.0, c.state_bytes - c.weight_bytes) * optimizer_f
        for c in pieces
    ]
    held = [c.input_bytes if recompute else c.activation_bytes for c in pieces]
    largest_weights = max(c.weight_bytes for c in pieces)
    largest_activation = max(c.activation_bytes for c in pieces) if recompute or not training else 0.0
    send = [model.send("p", c.output_bytes) if config.stages > 1 else 0.0 for c in pieces]

    def extra_seconds(stage: int, i: int, j: int) -> float:
        forward = send[j - 1] if stage < config.stages - 1 else 0.0
        backward = send[i - 1] if training and stage > 0 else 0.0  # the input's gradient goes back
        return forward + backward

    def extra_bytes(stage: int, i: int, j: int) -> float:
        gathered = 2 * largest_weights if config.zero == 3 and dp > 1 else 0.0
        return gathered + largest_activation

    def copies(stage: int) -> int:
        return in_flight(config.schedule, stage, config.stages, config.microbatches, training)

    functions = StageFunctions(seconds, fixed, held, extra_seconds, extra_bytes, copies)
    capacity = model.memory_capacity()
    cuts = partition(functions, config.stages, capacity)
    if cuts is None:
        return None
    stage_s = tuple(functions.seconds(s, i, j) for s, (i, j) in enumerate(cuts))
    memory = []
    sync = 0.0
    bandwidth = min(machine.devices[d].memory_bandwidth for d in range(machine.device_count)) * machine.efficiency
    for s, (i, j) in enumerate(cuts):
        weights = sum(c.weight_bytes for c in pieces[i:j])
        kept = functions.nbytes(s, i, j) - (functions.fixed[j] - functions.fixed[i])
        resident = functions.fixed[j] - functions.fixed[i]
        local_weights = weights * weight_f
        memory.append(StageMemory(local_weights, resident - local_weights, kept))
        group = sum(c.gradient_s for c in pieces[i:j])
        update = 2 * (resident if training else 0.0) / bandwidth  # the optimizer reads and writes its state
        sync = max(sync, step_traffic_s(config.zero, weights, dp, model, training) + group + update)
    return StagePlan(
        config,
        tuple(cuts),
        stage_s,
        pipeline_seconds(stage_s, config.microbatches),
        sync,
        tuple(memory),
        capacity,
    )


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def configurations(
    table: PieceTable, devices: int, batch: int, micro_sizes: Sequence[int], training: bool, pipeline: bool = True
) -> Iterator[StageConfig]:
    """Every configuration the table can price (``pipeline=False``: one stage only)."""
    pieces = len(table.pieces)
    groups = sorted({g for g, _ in table.options})
    for tensor in groups:
        for stages in _divisors(devices // tensor) if pipeline else [1]:
            if stages > pieces or devices % (tensor * stages):
                continue
            data = devices // (tensor * stages)
            for micro in micro_sizes:
                if batch % (data * micro):
                    continue
                microbatches = batch // (data * micro)
                for recompute in RECOMPUTE if training else ("none",):
                    for zero in ZERO_STAGES if data > 1 else (0,):
                        for schedule in SCHEDULES if training and stages > 1 else ("1f1b",):
                            for order in ORDERS if stages > 1 and data > 1 else ("pdt",):
                                for policy in POLICIES:
                                    yield StageConfig(
                                        stages,
                                        data,
                                        tensor,
                                        micro,
                                        microbatches,
                                        schedule,
                                        recompute,
                                        zero,
                                        order,
                                        policy,
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
) -> StageSearch:
    """The cheapest configuration that fits (among those ``only`` admits); InfeasiblePlanError names the
    smallest footprint found and what would make it fit, OptionError says when ``only`` admits none."""
    if len({d.name for d in machine.devices}) > 1:
        raise OptionError(
            f"the stage search needs one kind of device; {machine.name} has several. Plan it without `--pipeline`."
        )
    best: StagePlan | None = None
    flat: StagePlan | None = None
    smallest: tuple[float, StageConfig] | None = None
    evaluated = fitting = 0
    for config in configurations(table, machine.device_count, batch, micro_sizes, objective.training):
        if only is not None and not only.admits(config):
            continue
        evaluated += 1
        plan = evaluate(config, table, machine, objective, batch)
        if plan is None:
            footprint = _footprint(config, table, objective)
            if smallest is None or footprint < smallest[0]:
                smallest = (footprint, config)
            continue
        fitting += 1
        if best is None or _rank(plan) < _rank(best):
            best = plan
        if config.stages == 1 and (flat is None or _rank(plan) < _rank(flat)):
            flat = plan
    if only is not None and evaluated == 0:
        raise OptionError(
            f"{only.describe()}: no configuration of {machine.device_count} devices and a batch of {batch} "
            f"(microbatches of {', '.join(map(str, micro_sizes))}) has them; stages × tensor must divide the "
            "devices, tensor the devices of a node, and the microbatches the batch per replica."
        )
    if best is None:
        raise InfeasiblePlanError(_infeasible(smallest, machine))
    return StageSearch(best, flat, evaluated, fitting)


def _footprint(config: StageConfig, table: PieceTable, objective: Objective) -> float:
    """Bytes per device with every piece spread evenly over the stages (a lower bound of the real cut)."""
    if (config.tensor, config.microbatch) not in table.options:
        return math.inf
    pieces = [_pick(o, "smallest") for o in table.costs(config.tensor, config.microbatch)]
    weight_f, gradient_f, optimizer_f = shard_factors(config.zero, config.data)
    resident = sum(
        c.weight_bytes * weight_f
        + min(c.state_bytes, c.weight_bytes) * gradient_f
        + max(0.0, c.state_bytes - c.weight_bytes) * optimizer_f
        for c in pieces
    )
    recompute = objective.training and config.recompute == "full"
    held = sum(c.input_bytes if recompute else c.activation_bytes for c in pieces)
    copies = in_flight(config.schedule, 0, config.stages, config.microbatches, objective.training)
    return (resident + copies * held) / config.stages


def _infeasible(smallest: tuple[float, StageConfig] | None, machine: Machine) -> str:
    capacity = min(machine.usable_memory(d) for d in range(machine.device_count))
    if smallest is None:
        return "no stage configuration divides the batch and the devices; pass a batch the devices divide."
    need, config = smallest
    factor = need / capacity
    return (
        f"no stage configuration fits: the smallest ({config.describe()}) needs about {need / 2**30:.1f} GiB per "
        f"device of {capacity / 2**30:.1f} GiB ({factor:.1f}×); use about {math.ceil(factor) * machine.device_count} "
        "devices, a smaller batch, or devices with more memory."
    )
