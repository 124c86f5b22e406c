"""All-gather: the group's chunks along ``dim`` concatenated in axis order (e-graph ``Combine``, plan step
``AllGather``, plan.json collective ``all_gather``)."""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.collectives.base import Collective, DimStep, autograd_op, communicator_op, ring_price


@dataclass(frozen=True)
class AllGather(DimStep):
    """Gather ``src``'s chunks along ``dim`` over ``axis`` into ``out``."""


ALL_GATHER = Collective(
    name="all_gather",
    dims=("dim",),
    placement=("S({dim})", "R"),
    price=ring_price("all_gather"),  # the ring all-gather producing the result's bytes on each rank
    lowering="cut",
    label="all-gather",
    term="Combine",
    step=AllGather,
    record_kind="combine",
    run=communicator_op("all_gather", "dim"),
    torch_op=autograd_op("all_gather", "dim"),
)
