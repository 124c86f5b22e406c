"""Replicate: a replicated value read by sharded work (plan step ``Replicated``).

Nothing happens in the forward pass (lowering aliases the result to its source); in training its backward pass
all-reduces the gradient: a weight's (bucketed with the others) or an activation's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unity_eq.collectives.base import Collective, CollectiveStep, Prices
from unity_eq.cost.records import ZERO, Cost


@dataclass(frozen=True)
class Replicated(CollectiveStep):
    out: str
    src: str
    axis: str

    @property
    def kind(self) -> Collective:
        return REPLICATE


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """Free for inference, for inputs, constants (``ir.WeightOrigin``) and integer or bool activations
    (``nograd``): no gradient; in training the gradient all-reduce (a weight's shares its bucket's latency)."""
    if not model.objective.training or source in ("input", "constant", "nograd"):
        return ZERO
    if source == "weight":
        return Cost(comm=model.gradient_all_reduce(axis, src_bytes))
    return Cost(comm=model.all_reduce(axis, src_bytes))


def torch_op(tensor: Any, group: Any, fields: Mapping[str, Any]) -> Any:
    """The torch backend's op (autograd-aware; torch is imported only here, when a plan trains)."""
    from unity_eq.collectives import torch_autograd

    return torch_autograd.replicate(tensor, group, fields["phase"])


REPLICATE = Collective(
    name="replicate",
    dims=(),
    placement=("R", "R"),
    price=price,
    lowering="alias",
    label="replicate",
    term="Replicate",
    step=Replicated,
    record_kind="replicate",
    backward_op="all-reduce",
    local=True,
    weight_gradient=True,
    torch_op=torch_op,
)
