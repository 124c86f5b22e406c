"""The plan's parallel ops as autograd functions on torch.distributed groups: one function per kind.

The gradient convention (Megatron's f and g, DESIGN.md "What a term means"): on every rank, the gradient of a
replicated tensor is the whole gradient, the gradient of a shard is the shard of the gradient, and the gradient
of a partial tensor is the whole gradient (its pieces sum to the value, so each piece's gradient is the sum's).
Each op's backward keeps that convention, and issues exactly the collective the cost model prices for it:

==================  ===============================  ==============================================
plan step           forward                          backward
==================  ===============================  ==============================================
``combine``         all-gather along ``dim``         this rank's chunk of the gradient (free)
``reduce``          all-reduce (sum)                 identity (free)
``partition``       this rank's chunk (free)         all-gather of the gradient along ``dim``
``replicate``       identity (free)                  all-reduce of the gradient
==================  ===============================  ==============================================

A ``partition`` of a weight is free in both directions: the rank's parameter is the chunk (unity_eq.train.rank).
A ``replicate``'s backward runs only where a gradient flows (autograd calls it only then): a replicated model
input or constant costs nothing.

Every collective issued is recorded in the :class:`Ledger` given (kind, mesh axis, phase, bytes per rank of
the gathered or reduced tensor), so ``check --training`` compares what ran with what plan.json priced.
Reductions sum the pieces in group order (all-gather, then one addition at a time) on gloo, so every rank of a
group holds the same bits, as the runtime's other backends do; NCCL uses its all-reduce.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "AxisGroup",
    "Ledger",
    "all_gather",
    "all_reduce",
    "all_reduce_gradient",
    "partition",
    "replicate",
    "world_sum",
]

FORWARD, BACKWARD, GRADIENT = "forward", "backward", "gradient"


@dataclass
class Ledger:
    """The collectives a rank issued: (kind, axis, phase) -> [count, bytes per rank]."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    bytes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: while set, a ``forward`` collective is counted under this phase instead (``recompute``: a forward run
    #: again by the backward, unity_eq.train.recompute)
    relabel: str | None = None

    def record(self, kind: str, axis: str, phase: str, nbytes: int) -> None:
        if self.relabel is not None and phase == FORWARD:
            phase = self.relabel
        self.counts[(kind, axis, phase)] += 1
        self.bytes[(kind, axis, phase)] += nbytes

    def clear(self) -> None:
        self.counts.clear()
        self.bytes.clear()

    def as_rows(self) -> list[tuple[str, str, str, int, int]]:
        return sorted((*key, self.counts[key], self.bytes[key]) for key in self.counts)


@dataclass
class AxisGroup:
    """This rank's group on one mesh axis: the ranks (axis order), its index among them, the process group."""

    axis: str
    ranks: tuple[int, ...]
    index: int
    group: Any  # torch.distributed.ProcessGroup (None: a one-rank group, nothing to communicate)
    ledger: Ledger
    ordered_sum: bool = True  # gloo: all-gather and sum in group order (equal bits on every rank)

    @property
    def size(self) -> int:
        return len(self.ranks)


def _gather_pieces(x: torch.Tensor, g: AxisGroup) -> list[torch.Tensor]:
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(g.size)]
    dist.all_gather(pieces, x, group=g.group)
    return pieces


def _gather(x: torch.Tensor, g: AxisGroup, dim: int, phase: str) -> torch.Tensor:
    if g.size == 1:
        return x
    out = torch.cat(_gather_pieces(x, g), dim=dim)
    g.ledger.record("all_gather", g.axis, phase, out.numel() * out.element_size())
    return out


def _sum(x: torch.Tensor, g: AxisGroup, phase: str) -> torch.Tensor:
    if g.size == 1:
        return x
    g.ledger.record("all_reduce", g.axis, phase, x.numel() * x.element_size())
    if not g.ordered_sum:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=g.group)
        return out
    pieces = _gather_pieces(x, g)
    total = pieces[0].clone()
    for piece in pieces[1:]:
        total += piece
    return total


def world_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over every rank of the default group, in place, outside the ledger: for reporting (a
    pipeline step's loss, which only the last stage computes), not a collective of the plan."""
    dist.all_reduce(value)
    return value


def _chunk(x: torch.Tensor, g: AxisGroup, dim: int) -> torch.Tensor:
    size = x.shape[dim] // g.size
    return x.narrow(dim, g.index * size, size)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: AxisGroup, dim: int) -> torch.Tensor:
        ctx.g, ctx.dim = g, dim
        return _gather(x, g, dim, FORWARD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _chunk(grad, ctx.g, ctx.dim).contiguous(), None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: AxisGroup) -> torch.Tensor:
        return _sum(x, g, FORWARD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _Partition(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: AxisGroup, dim: int) -> torch.Tensor:
        ctx.g, ctx.dim = g, dim
        return _chunk(x, g, dim).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather(grad, ctx.g, ctx.dim, BACKWARD), None, None


class _Replicate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: AxisGroup, phase: str) -> torch.Tensor:
        ctx.g, ctx.phase = g, phase
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _sum(grad, ctx.g, ctx.phase), None, None


def all_gather(x: torch.Tensor, g: AxisGroup, dim: int) -> torch.Tensor:
    """``combine``: Shard(dim) -> Replicate; the backward takes this rank's chunk."""
    return _AllGather.apply(x, g, dim)


def all_reduce(x: torch.Tensor, g: AxisGroup) -> torch.Tensor:
    """``reduce``: Partial -> Replicate; the backward is the identity."""
    return _AllReduce.apply(x, g)


def partition(x: torch.Tensor, g: AxisGroup, dim: int) -> torch.Tensor:
    """``partition`` of an activation: this rank's chunk; the backward all-gathers the gradient."""
    if not x.requires_grad:
        return _chunk(x, g, dim).contiguous()
    return _Partition.apply(x, g, dim)


def replicate(x: torch.Tensor, g: AxisGroup, phase: str) -> torch.Tensor:
    """``replicate``: identity; the backward all-reduces the gradient (``phase``: backward for an activation,
    gradient for a weight)."""
    if not x.requires_grad:
        return x
    return _Replicate.apply(x, g, phase)


def all_reduce_gradient(grad: torch.Tensor, g: AxisGroup) -> torch.Tensor:
    """A weight's accumulated gradient summed over ``g`` outside autograd (phase ``gradient``): the sync after a
    pipeline stage's last microbatch, once per step."""
    return _sum(grad, g, GRADIENT)


def gather_object_pieces(x: torch.Tensor, ranks: Sequence[int], group: Any) -> list[torch.Tensor]:
    """Every rank's ``x`` (equal shapes) on every rank of ``group`` (checkpoints, gradients gathered back)."""
    pieces = [torch.empty_like(x) for _ in ranks]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return pieces
