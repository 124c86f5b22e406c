"""Partition: each device keeps its chunk of a replicated value along ``dim`` (plan step ``Slice``).

Nothing moves in the forward pass: a weight or an input is sliced when loaded (free); an activation is copied
locally. In training its backward pass all-gathers the activation's gradient."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unity_eq.collectives.base import Collective, CollectiveStep, Prices
from unity_eq.cost.records import ZERO, Cost


@dataclass(frozen=True)
class Slice(CollectiveStep):
    out: str
    src: str
    dim: int
    axis: str

    @property
    def kind(self) -> Collective:
        return PARTITION


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """Free for weights, constants and inputs (sliced when loaded); a local copy of an activation, and in training the
    all-gather of its gradient (none for an integer or bool one: ``nograd``)."""
    if source in ("weight", "constant", "input"):
        return ZERO
    cost = model.local_copy(src_bytes / model.mesh.axis_size(axis))
    if model.objective.training and source != "nograd":  # an integer or bool activation has no gradient
        cost = cost + Cost(comm=model.all_gather(axis, src_bytes))
    return cost


def torch_op(tensor: Any, group: Any, fields: Mapping[str, Any]) -> Any:
    """The torch backend's op (autograd-aware; torch is imported only here, when a plan trains)."""
    from unity_eq.collectives import torch_autograd

    return torch_autograd.partition(tensor, group, fields["dim"])


PARTITION = Collective(
    name="partition",
    dims=("dim",),
    placement=("R", "S({dim})"),
    price=price,
    lowering="slice",
    label="slice",
    term="Partition",
    step=Slice,
    record_kind="partition",
    backward_op="all-gather",
    local=True,
    torch_op=torch_op,
)
