"""Reduce-scatter: chunk ``i`` along ``dim`` of the group-order sum, on rank ``i`` of the group (plan.json
collective ``reduce_scatter``). The runtime runs it; no rule makes it yet, so it has no e-graph term, plan step
or step record: adding them (a ``P -> S(dim)`` constructor in a rule file, a step class here, a record in
planfile/steps.py) makes it plannable."""

from __future__ import annotations

from unity_eq.collectives.base import Collective, communicator_op, ring_price

REDUCE_SCATTER = Collective(
    name="reduce_scatter",
    dims=("dim",),
    placement=("P", "S({dim})"),
    # the ring reduce-scatter of the source's bytes (the all-gather's mirror image)
    price=ring_price("reduce_scatter", "src"),
    lowering="cut",
    label="reduce-scatter",
    run=communicator_op("reduce_scatter", "dim"),
    keeps_weights=False,
)
