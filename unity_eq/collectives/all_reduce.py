"""All-reduce: the group's partial sums added in group order (e-graph ``Reduce``, plan step ``AllReduce``,
plan.json collective ``all_reduce``)."""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.collectives.base import AxisStep, Collective, autograd_op, communicator_op, ring_price


@dataclass(frozen=True)
class AllReduce(AxisStep):
    """Sum ``src``'s partial values over ``axis`` into ``out``."""


ALL_REDUCE = Collective(
    name="all_reduce",
    dims=(),
    placement=("P", "R"),
    price=ring_price("all_reduce"),  # the ring all-reduce of the result's bytes
    lowering="cut",
    label="all-reduce",
    term="Reduce",
    step=AllReduce,
    record_kind="reduce",
    run=communicator_op("all_reduce"),
    keeps_weights=False,
    metadata_name="all_reduce (sum)",
    torch_op=autograd_op("all_reduce"),
)
