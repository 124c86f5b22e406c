"""The stage search's space: one configuration (:class:`StageConfig`: pipeline stages × data replicas × tensor
groups, microbatches, schedule, recomputation, ZeRO level, rank order, piece policy), what a user may force
(:class:`StageFilter`), and every configuration a machine and batch allow (:func:`configurations`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from unity_eq.machine import Machine
from unity_eq.memory import ZERO_LEVELS
from unity_eq.stages.arithmetic import shapes
from unity_eq.stages.pieces import PieceTable
from unity_eq.stages.schedule import SCHEDULES

__all__ = [
    "ORDERS",
    "POLICIES",
    "RECOMPUTE",
    "StageConfig",
    "StageFilter",
    "configurations",
    "group_sizes",
    "priced_pairs",
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


def group_sizes(machine: Machine) -> list[int]:
    """Tensor-group sizes: the divisors of a node's device count (tensor parallelism stays inside a node)."""
    counts = np.bincount(machine.node_array) if machine.device_count else np.ones(1, dtype=np.int64)
    per_node = int(counts[counts > 0].min())
    return [g for g in range(1, per_node + 1) if per_node % g == 0 and machine.device_count % g == 0]


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
            (ZERO_LEVELS if training else (0, 3)) if data > 1 else (0,),
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
