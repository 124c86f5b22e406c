"""All-to-all: chunk ``i`` along ``split_dim`` of every member's piece, concatenated along ``concat_dim`` in
group order, on rank ``i`` (plan.json collective ``all_to_all``: a resharding ``S(split_dim)`` from
``S(concat_dim)``). The runtime runs it; no rule makes it yet (see :mod:`.reduce_scatter`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from unity_eq.collectives.base import Collective, Communicator, Prices
from unity_eq.cost.records import Cost


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """Each rank sends (n-1)/n of its piece, 1/n to every other member."""
    return Cost(comm=model.all_to_all(axis, src_bytes))


def run(comm: Communicator, array: np.ndarray, group: Sequence[int], dims: Mapping[str, int]) -> np.ndarray:
    return comm.all_to_all(array, group, dims["split_dim"], dims["concat_dim"])


ALL_TO_ALL = Collective(
    name="all_to_all",
    dims=("split_dim", "concat_dim"),
    placement=("S({concat_dim})", "S({split_dim})"),
    price=price,
    lowering="cut",
    label="all-to-all",
    run=run,
)
