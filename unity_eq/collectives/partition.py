"""Partition: each device keeps its chunk of a replicated value along ``dim`` (plan step ``Slice``).

Nothing moves in the forward pass: a weight or an input is sliced when loaded (free); an activation is copied
locally. In training its backward pass all-gathers the activation's gradient."""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.collectives.base import Collective, DimStep, Prices, autograd_op
from unity_eq.cost.records import ZERO, Cost


@dataclass(frozen=True)
class Slice(DimStep):
    """Keep this device's chunk of ``src`` along ``dim`` (its index on ``axis``) as ``out``."""


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """Free for weights, constants and inputs (sliced when loaded); a local copy of an activation, and in training the
    all-gather of its gradient (none for an integer or bool one: ``nograd``)."""
    if source in ("weight", "constant", "input"):
        return ZERO
    cost = model.local_copy(src_bytes / model.mesh.axis_size(axis))
    if model.objective.training and source != "nograd":  # an integer or bool activation has no gradient
        cost = cost + Cost(comm=model.all_gather(axis, src_bytes))
    return cost


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
    torch_op=autograd_op("partition", "dim"),
)
