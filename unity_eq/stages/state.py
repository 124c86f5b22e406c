"""Sharded weight state over the data-parallel axis (ZeRO, Rajbhandari et al., 2020; PyTorch FSDP).

Each stage's weights live on its ``d`` data-parallel replicas. In training every replica holds, per byte of
16-bit weight, the gradient (1 byte) and the optimizer state (Adam's two fp32 moments and an fp32 master
copy: 6 bytes; ``memory.weight_state_factor``). Sharding trades memory for traffic, by ZeRO level (ZeRO's
paper says "stage"; here a stage is a pipeline stage only):

=====  =====================================  ======================================================
level  bytes per device                       traffic per step on the data-parallel axis
=====  =====================================  ======================================================
0      W + G + O                              all-reduce of the gradients
1      W + G + O/d                            reduce-scatter of the gradients + all-gather of the
                                              updated weights (the all-reduce's volume)
2      W + (G + O)/d                          per microbatch a reduce-scatter of the gradients (a
                                              device keeps only its shard, so it cannot accumulate
                                              the others'), per step the all-gather of the weights
3      (W + G + O)/d + two pieces' weights    per microbatch: all-gather each piece's weights for the
       gathered at a time                     forward and again for the backward, reduce-scatter its
                                              gradients
=====  =====================================  ======================================================

Prices come from the cost model's collectives on the data-parallel axis of the stage mesh, so a ``d`` group
that spans nodes pays the network. Inference has no gradients or optimizer state: level 3 then shards the
weights alone (all-gathered before each use).
"""

from __future__ import annotations

from unity_eq.cost import CostModel

__all__ = [
    "ZERO_STAGES",
    "microbatch_traffic_s",
    "optimizer_update_s",
    "resident_bytes",
    "shard_factors",
    "step_traffic_s",
]

ZERO_STAGES = (0, 1, 2, 3)


def shard_factors(zero: int, dp: int) -> tuple[float, float, float]:
    """The fractions of its weights, gradients and optimizer state a device keeps under ZeRO level ``zero``."""
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero: expected one of {ZERO_STAGES}, got {zero}")
    part = 1.0 / dp
    return ((1.0, 1.0, 1.0), (1.0, 1.0, part), (1.0, part, part), (part, part, part))[zero]


def resident_bytes(weights: float, state: float, zero: int, dp: int, trainable: float | None = None) -> float:
    """Bytes a device keeps of a piece's ``weights`` and their ``state`` under ZeRO level ``zero`` over ``dp``
    replicas: the state's first ``trainable`` bytes are the gradient, the rest the optimizer's (the table above).
    ``trainable``: the bytes of the weights that are parameters (``memory.MemoryUsage.trainable``; None: all of
    them); the rest are constants (a folded mask, a scalar), which no level shards: like FSDP's buffers, every
    replica keeps them whole. One formula for cutting stages and for the footprint an infeasible search reports."""
    weight_f, gradient_f, optimizer_f = shard_factors(zero, dp)
    sharded = weights if trainable is None else trainable
    constants = weights - sharded
    return constants + sharded * weight_f + min(state, sharded) * gradient_f + max(0.0, state - sharded) * optimizer_f


def step_traffic_s(zero: int, weights: float, dp: int, model: CostModel, training: bool, axis: str = "d") -> float:
    """Once per step: the gradients' all-reduce (level 0), or reduce-scatter + all-gather of the updated
    weights (level 1: the same volume, priced as one all-reduce), or the all-gather alone (level 2, whose
    gradients were reduce-scattered microbatch by microbatch); level 3 synchronizes per microbatch.
    ``weights``: the bytes of the trainable weights (a constant has no gradient and never changes)."""
    if not training or dp == 1 or zero == 3:
        return 0.0
    if zero == 2:
        return model.all_gather(axis, weights)
    return model.gradient_all_reduce(axis, weights)


def microbatch_traffic_s(
    zero: int, weights: float, dp: int, model: CostModel, training: bool, axis: str = "d"
) -> float:
    """Per microbatch: level 2 reduce-scatters the gradients (a device keeps only its shard, so it cannot
    accumulate the others'); level 3 also all-gathers the weights for the forward and again for the backward.
    ``weights``: the bytes of the trainable weights (constants are not sharded, so never gathered)."""
    if dp == 1 or zero < 2:
        return 0.0
    scatter = model.reduce_scatter(axis, weights) if training else 0.0
    if zero == 2:
        return scatter
    return (2 if training else 1) * model.all_gather(axis, weights) + scatter


def optimizer_update_s(resident_bytes: float, bandwidth: float) -> float:
    """The optimizer's update after the last microbatch: it reads and writes the weights and their state a
    device keeps (``resident_bytes``) at memory ``bandwidth`` (bytes/s). One formula for a pipeline stage and
    for the SPMD search's plan, so the training search compares the two on the same terms."""
    return 2 * resident_bytes / bandwidth
