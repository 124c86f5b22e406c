"""Pricing one configuration of the stage search (:func:`evaluate`): cut the pieces into pipeline stages that
fit in memory, and price the step (module docstring of :mod:`unity_eq.stages.search`). A stage's bytes per
device are a :class:`unity_eq.memory.MemoryUsage`, the record the SPMD search keeps too; what a device keeps of
its weights' state under ZeRO is :func:`unity_eq.memory.resident_bytes`; the ZeRO traffic and the
optimizer's update are the cost model's terms (``CostModel.zero_step_traffic``, ``zero_microbatch_traffic``,
``optimizer_update``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unity_eq.cost import CostModel, Objective
from unity_eq.ir import Mesh
from unity_eq.machine import Machine
from unity_eq.memory import MemoryUsage, resident_bytes, shard_factors
from unity_eq.search.meshes import device_groups
from unity_eq.split import Piece
from unity_eq.stages.config import StageConfig
from unity_eq.stages.partition import StageCuts, StageFunctions, partition
from unity_eq.stages.pieces import PieceCost, PieceTable
from unity_eq.stages.schedule import bubble_fraction, in_flight, pipeline_seconds

__all__ = ["StagePlan", "evaluate", "pick", "side_receives"]


@dataclass(frozen=True)
class StagePlan:
    """A configuration with its stages and predicted step."""

    config: StageConfig
    cuts: tuple[tuple[int, int], ...]  # each stage's pieces [first, end)
    stage_s: tuple[float, ...]  # per microbatch
    pipeline_s: float
    sync_s: float  # gradient synchronization and optimizer update after the last microbatch (the slowest stage)
    memory: tuple[MemoryUsage, ...]  # per stage, per device
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


def pick(options: list[PieceCost], policy: str) -> PieceCost:
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


def _group(
    config: StageConfig, table: PieceTable, machine: Machine, objective: Objective, index: int, devices: tuple[int, ...]
) -> _Group:
    training = objective.training
    stages = len(devices) // (config.data * config.tensor)
    model = CostModel(machine, _group_mesh(config, stages, devices), objective)
    pieces = [pick(o, config.policy) for o in table.costs(config.tensor, config.microbatch, index)]
    zero_s = [model.zero_microbatch_traffic(config.zero, c.trainable_bytes, config.data) for c in pieces]
    seconds = [c.step_s + z for c, z in zip(pieces, zero_s, strict=True)]
    fixed = [resident_bytes(c.weight_bytes, c.state_bytes, config.zero, config.data, c.trainable_bytes) for c in pieces]
    # inference keeps nothing per microbatch: a stage's peak is its largest piece's (``largest_activation``)
    held = [c.activation_bytes for c in pieces] if training else [0.0] * len(pieces)
    keep = StageFunctions(seconds, fixed, held, _none, _none, _one)
    redo = StageFunctions(
        [t + c.forward_s for t, c in zip(seconds, pieces, strict=True)], fixed, [c.input_bytes for c in pieces],
        _none, _none, _one,
    )  # fmt: skip
    return _Group(index, devices, stages, model, pieces, keep, redo, model.memory_capacity())


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


def _side_held(
    table: PieceTable,
    group: _Group,
    sizes: dict[str, float],
    i: int,
    j: int,
    redo: bool,
    memo: dict[tuple[int, int, int, bool], float],
) -> float:
    """Bytes of side tensors a stage of pieces [i, j) holds per microbatch in flight (training), each once
    however many of its pieces read it: those its pieces' backward keeps (``PieceCost.side_kept``; the pieces'
    activations leave them out), or, recomputing, every one its pieces read (the forward runs again before
    the backward). The stage receives them from stage 0 (or makes them, stage 0) with its microbatch."""
    key = (group.index, i, j, redo)
    if key not in memo:
        names: set[str] = set()
        for piece, cost in zip(table.pieces[i:j], group.pieces[i:j], strict=True):
            own = (*piece.side_in, *piece.side_out)
            names.update(piece.side_in if redo else (own[k] for k in cost.side_kept))
        memo[key] = sum(sizes.get(name, 0.0) for name in names)
    return memo[key]


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
    largest_weights = max(c.trainable_bytes for g in layout for c in g.pieces)  # ZeRO-3 gathers these
    largest_activation = max(c.activation_bytes for g in layout for c in g.pieces)
    capacities = [g.capacity for g in stage_group]

    side_memo: dict[tuple[int, int, int, bool], float] = {}

    def bytes_with(f: StageFunctions, stage: int, i: int, j: int, redo: bool) -> float:
        copies = in_flight(config.schedule, stage, config.stages, config.microbatches, training)
        gathered = 2 * largest_weights if config.zero == 3 and config.data > 1 else 0.0
        # recomputing, a stage also holds one piece's activations at a time; inference holds its largest piece's
        working = largest_activation if redo or not training else 0.0
        side = _side_held(table, stage_group[stage], sizes, i, j, redo, side_memo) if training and sizes else 0.0
        return f.fixed[j] - f.fixed[i] + copies * (f.held[j] - f.held[i] + side) + gathered + working

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
        weights = sum(c.trainable_bytes for c in group.pieces[i:j])
        constants = sum(c.weight_bytes - c.trainable_bytes for c in group.pieces[i:j])  # kept whole, no state
        held = nbytes(s, i, j) - resident
        stored = constants + weights * weight_f
        memory.append(MemoryUsage(stored, resident - stored, held, capacities[s]))
        stage_s.append(seconds(s, i, j, side_exact))
        chosen.extend(group.pieces[i:j])
        devices.append(_stage_devices(config, group.stages, group.devices, stage_index[s]))
        redone.append(recomputes(s, i, j))
        own = sum(c.gradient_s for c in group.pieces[i:j]) * weight_syncs_per_step(config)
        update = group.model.optimizer_update(resident - constants) if training else 0.0
        sync = max(sync, group.model.zero_step_traffic(config.zero, weights, config.data) + own + update)
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


def weight_syncs_per_step(config: StageConfig) -> int:
    """How often a stage runs its own weight-gradient all-reduces (over its tensor axes) in one step: once, on
    the accumulated gradients, except under ZeRO-2 and 3 over more than one replica, where each microbatch's
    gradients are reduce-scattered over the replicas as soon as they are made (unity_eq.train.pipeline_zero), so
    the tensor-axis all-reduces run before that, once per microbatch."""
    return config.microbatches if config.zero >= 2 and config.data > 1 else 1


def _none(_stage: int, _i: int, _j: int) -> float:
    return 0.0


def _one(_stage: int) -> int:
    return 1
