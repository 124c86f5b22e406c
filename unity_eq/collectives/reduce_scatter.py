"""Reduce-scatter: chunk ``i`` along ``dim`` of the group-order sum, on rank ``i`` of the group (plan.json
collective ``reduce_scatter``). The runtime runs it; no rule makes it yet, so it has no e-graph term, plan step
or step record: adding them (a ``P -> S(dim)`` constructor in a rule file, a step class here, a record in
planfile/steps.py) makes it plannable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from unity_eq.collectives.base import Collective, Communicator, Prices
from unity_eq.cost.records import Cost


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """The ring reduce-scatter of the source's bytes (the all-gather's mirror image)."""
    return Cost(comm=model.reduce_scatter(axis, src_bytes))


def run(comm: Communicator, array: np.ndarray, group: Sequence[int], dims: Mapping[str, int]) -> np.ndarray:
    return comm.reduce_scatter(array, group, dims["dim"])


REDUCE_SCATTER = Collective(
    name="reduce_scatter",
    dims=("dim",),
    placement=("P", "S({dim})"),
    price=price,
    lowering="cut",
    label="reduce-scatter",
    run=run,
    keeps_weights=False,
)
