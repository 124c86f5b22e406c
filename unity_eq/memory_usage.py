"""The memory record of one device, and what a device keeps of its weights' state under ZeRO.

What a plan keeps (its weights, their state, its activations) is :mod:`unity_eq.memory`'s; this module holds the
record every search keeps (:class:`MemoryUsage`), the one infeasibility message, and the ZeRO table below, which
the stage search and the training search's SPMD step read without a plan.

Sharded weight state over the data-parallel axis (ZeRO, Rajbhandari et al., 2020; PyTorch FSDP), for the
pipeline stages (``unity_eq.stages``): each stage's weights live on its ``d`` data-parallel replicas, and in
training every replica holds, per byte of 16-bit weight, the gradient (1 byte) and the optimizer state (Adam's
two fp32 moments and an fp32 master copy: 6 bytes; :func:`weight_state_factor`). Sharding trades memory for
traffic, by ZeRO level (ZeRO's paper says "stage"; here a stage is a pipeline stage only). The traffic is the
cost model's (``CostModel.zero_step_traffic``, ``zero_microbatch_traffic``), on the data axis of the stage's
mesh, so a ``d`` group that spans nodes pays the network:

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

Inference has no gradients or optimizer state: level 3 then shards the weights alone (all-gathered before each
use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

from unity_eq.planfile import MemoryUsageRecord

__all__ = [
    "ZERO_LEVELS",
    "ByteFields",
    "MemoryUsage",
    "gib",
    "infeasible_message",
    "resident_bytes",
    "shard_factors",
    "weight_state_factor",
]

ZERO_LEVELS = (0, 1, 2, 3)


def weight_state_factor(itemsize: int) -> float:
    """Bytes of gradient + optimizer state per byte of weight in training (Adam, fp32 moments)."""
    extra = itemsize + 8 + (4 if itemsize < 4 else 0)
    return extra / itemsize


def shard_factors(zero: int, dp: int) -> tuple[float, float, float]:
    """The fractions of its weights, gradients and optimizer state a device keeps under ZeRO level ``zero``."""
    if zero not in ZERO_LEVELS:
        raise ValueError(f"zero: expected one of {ZERO_LEVELS}, got {zero}")
    part = 1.0 / dp
    return ((1.0, 1.0, 1.0), (1.0, 1.0, part), (1.0, part, part), (part, part, part))[zero]


def resident_bytes(weights: float, state: float, zero: int, dp: int, trainable: float | None = None) -> float:
    """Bytes a device keeps of a piece's ``weights`` and their ``state`` under ZeRO level ``zero`` over ``dp``
    replicas: the state's first ``trainable`` bytes are the gradient, the rest the optimizer's (the table above).
    ``trainable``: the bytes of the weights that are parameters (``MemoryUsage.trainable``; None: all of
    them); the rest are constants (a folded mask, a scalar), which no level shards: like FSDP's buffers, every
    replica keeps them whole. One formula for cutting stages and for the footprint an infeasible search reports."""
    weight_f, gradient_f, optimizer_f = shard_factors(zero, dp)
    sharded = weights if trainable is None else trainable
    constants = weights - sharded
    return constants + sharded * weight_f + min(state, sharded) * gradient_f + max(0.0, state - sharded) * optimizer_f


class ByteFields(TypedDict):
    """A usage's bytes under their plan.json keys: the ``memory`` section and each pipeline stage write these
    four alike (:meth:`MemoryUsage.byte_fields`)."""

    weight_bytes: float
    weight_state_bytes: float
    activation_bytes: float
    total_bytes: float


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes per device; ``capacity`` is the usable memory of the smallest device of the mesh."""

    weights: float
    weight_state: float
    activations: float
    capacity: float
    #: training: the bytes of the gradients (the trainable weights, each source parameter once); None when
    #: not counted (inference, or a usage assembled elsewhere: then every weight byte is taken as trainable)
    gradients: float | None = None

    @property
    def trainable(self) -> float:
        """The bytes of trainable weights: what the gradient collectives and ZeRO's sharding move."""
        return self.weights if self.gradients is None else self.gradients

    @property
    def total(self) -> float:
        return self.weights + self.weight_state + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def byte_fields(self) -> ByteFields:
        """Its bytes as plan.json's records name them (``memory``, a pipeline stage's)."""
        return {
            "weight_bytes": self.weights,
            "weight_state_bytes": self.weight_state,
            "activation_bytes": self.activations,
            "total_bytes": self.total,
        }

    def to_record(self) -> MemoryUsageRecord:
        """As plan.json's ``memory`` holds it."""
        return MemoryUsageRecord(
            **self.byte_fields(), capacity_bytes=self.capacity, fits=self.fits, gradient_bytes=self.gradients
        )


def gib(nbytes: float) -> str:
    """Bytes as GiB with enough digits to tell small amounts apart."""
    value = nbytes / 2**30
    return f"{value:.2f} GiB" if value >= 1 else f"{value:.3f} GiB"


def infeasible_message(what: str, smallest: str, usage: MemoryUsage, machine: str, devices: int) -> str:
    """The one message of a search whose every candidate overflows device memory (``what``: its candidates,
    ``plan`` or ``stage configuration``): the ``smallest`` one's ``usage`` by kind against the usable memory of
    ``machine``'s devices, and roughly how many ``devices`` would hold it."""
    factor = usage.total / usage.capacity if usage.capacity > 0 else math.inf
    more = f"about {math.ceil(factor) * devices} devices" if math.isfinite(factor) else "more devices"
    return (
        f"no {what} fits in device memory: the smallest found ({smallest}) needs {gib(usage.total)} per device "
        f"({gib(usage.weights)} weights, {gib(usage.weight_state)} gradients and optimizer state, "
        f"{gib(usage.activations)} activations); the devices of {machine} have {gib(usage.capacity)} usable "
        f"({factor:.1f}×). Use {more} (`--nodes`), devices with more memory, or a smaller batch."
    )
