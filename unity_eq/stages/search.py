"""The stage search: pipeline stages × data-parallel replicas × tensor groups, microbatches, schedule,
recomputation and sharded weight state, priced by the cost model over intra-op plans from the e-graph.

Unity's PCG writes a pipeline as ``Batch`` (split the batch into ``m`` microbatches) and ``Pipeline``
(stage ``s`` runs pieces ``i..j`` on its own sub-mesh); the intra-op plan of each piece on a sub-mesh is
what saturation and extraction already find. This module is the inter-op level (as Alpa's and Piper's
two-level search): for every way to lay ``N = p · d · t`` devices out (tensor groups inside a node, ranks
ordered so ``t`` is fastest, then ``d`` and ``p`` or ``p`` and ``d``: the costs pick which crosses nodes), every
microbatch size, schedule (:mod:`.schedule`), recomputation (none: keep every activation for the backward;
full: keep each piece's input and run its forward again) and ZeRO level (:mod:`unity_eq.memory`), the pieces are cut
into ``p`` stages (:mod:`.partition`) and the step is priced:

    step = Σ_s τ_s + (m − 1) · max_s τ_s + max_s (gradient sync_s + optimizer_s)

with ``τ_s`` a stage's forward and backward of one microbatch — its pieces' compute and group collectives,
recomputed forwards, ZeRO-3's per-microbatch gathers, and the activations it sends to the next stage and
the gradients it sends back, over the links the two stages sit on. The cheapest configuration whose every
stage fits in device memory wins; when none fits, :func:`stage_search` says by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unity_eq.cost import Objective, cheaper
from unity_eq.errors import InfeasiblePlanError, OptionError
from unity_eq.machine import Machine
from unity_eq.memory import MemoryUsage, infeasible_message, resident_bytes, shard_factors
from unity_eq.search.meshes import device_groups
from unity_eq.stages.config import (
    StageConfig,
    StageFilter,
    configurations,
    group_sizes,
    priced_pairs,
    static_batch_note,
)
from unity_eq.stages.evaluate import StagePlan, evaluate, pick, side_receives
from unity_eq.stages.pieces import PieceTable
from unity_eq.stages.schedule import in_flight

__all__ = [
    "StageConfig",
    "StageFilter",
    "StagePlan",
    "StageSearch",
    "evaluate",
    "group_sizes",
    "priced_pairs",
    "side_receives",
    "stage_search",
    "static_batch_note",
]


def _simplicity(plan: StagePlan) -> tuple[int, int, int]:
    """What breaks a tie: no recomputation, less weight-state sharding, fewer stages (the simpler first)."""
    c = plan.config
    return (int(c.recompute != "none"), c.zero, c.stages)


def _better(plan: StagePlan, than: StagePlan | None) -> bool:
    """The tie rule (``cost.cheaper``): cheaper by more than rounding noise, or a tie and simpler."""
    if than is None or cheaper(plan.step_s, than.step_s):
        return True
    return not cheaper(than.step_s, plan.step_s) and _simplicity(plan) < _simplicity(than)


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
    capacity = min(machine.usable_memory(d) for d in range(machine.device_count))
    memo: dict[Any, Any] = {}
    best: StagePlan | None = None
    flat: StagePlan | None = None
    smallest: tuple[MemoryUsage, StageConfig] | None = None
    evaluated = fitting = 0
    for config in configurations(table, groups, batch, micro_sizes, objective.training):
        if only is not None and not only.admits(config):
            continue
        evaluated += 1
        plan = evaluate(config, table, machine, objective, batch, groups, memo)
        if plan is None:
            if config.stages < min_stages:
                continue
            footprint = _footprint(config, table, objective, capacity)
            if smallest is None or footprint.total < smallest[0].total:
                smallest = (footprint, config)
            continue
        fitting += 1
        if config.stages >= min_stages and _better(plan, best):
            best = plan
        if config.stages == 1 and _better(plan, flat):
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


def _footprint(config: StageConfig, table: PieceTable, objective: Objective, capacity: float) -> MemoryUsage:
    """Bytes per device with every piece spread evenly over the stages (a lower bound of the real cut)."""
    if (config.tensor, config.microbatch, config.groups[0]) not in table.options:
        return MemoryUsage(math.inf, 0.0, 0.0, capacity)
    pieces = [pick(o, "smallest") for o in table.costs(config.tensor, config.microbatch, config.groups[0])]
    resident = sum(
        resident_bytes(c.weight_bytes, c.state_bytes, config.zero, config.data, c.trainable_bytes) for c in pieces
    )
    weights = sum(c.weight_bytes for c in pieces) * shard_factors(config.zero, config.data)[0]
    recompute = objective.training and config.recompute != "none"
    held = sum(c.input_bytes if recompute else c.activation_bytes for c in pieces)
    copies = in_flight(config.schedule, 0, config.stages, config.microbatches, objective.training)
    return MemoryUsage(
        weights / config.stages, (resident - weights) / config.stages, copies * held / config.stages, capacity
    )


def _infeasible(
    smallest: tuple[MemoryUsage, StageConfig] | None, machine: Machine, static_batch: int | None = None
) -> str:
    if smallest is None and static_batch is not None:
        return f"no stage configuration fits the devices: {static_batch_note(static_batch)}."
    if smallest is None:
        return "no stage configuration divides the batch and the devices; pass a batch the devices divide."
    usage, config = smallest
    what = f"{config.describe()}; a lower bound, its pieces spread evenly over the stages"
    return infeasible_message("stage configuration", what, usage, machine.name, machine.device_count)
