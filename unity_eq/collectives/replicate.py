"""Replicate: a replicated value read by sharded work (plan step ``Replicated``).

Nothing happens in the forward pass (lowering aliases the result to its source); in training its backward pass
all-reduces the gradient: a weight's (bucketed with the others) or an activation's."""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.collectives.base import AxisStep, Collective, Prices, autograd_op
from unity_eq.cost.records import ZERO, Cost


@dataclass(frozen=True)
class Replicated(AxisStep):
    """``out`` is ``src``, read by sharded work on ``axis``."""


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """Free for inference, for inputs, constants (``ir.WeightOrigin``) and integer or bool activations
    (``nograd``): no gradient; in training the gradient all-reduce (a weight's shares its bucket's latency)."""
    if not model.objective.training or source in ("input", "constant", "nograd"):
        return ZERO
    if source == "weight":
        return Cost(comm=model.gradient_all_reduce(axis, src_bytes))
    return Cost(comm=model.all_reduce(axis, src_bytes))


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
    torch_op=autograd_op("replicate", "phase"),
)
