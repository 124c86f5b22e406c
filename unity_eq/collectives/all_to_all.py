"""All-to-all: chunk ``i`` along ``split_dim`` of every member's piece, concatenated along ``concat_dim`` in
group order, on rank ``i`` (plan.json collective ``all_to_all``: a resharding ``S(split_dim)`` from
``S(concat_dim)``). The runtime runs it; no rule makes it yet (see :mod:`.reduce_scatter`)."""

from __future__ import annotations

from unity_eq.collectives.base import Collective, communicator_op, ring_price

ALL_TO_ALL = Collective(
    name="all_to_all",
    dims=("split_dim", "concat_dim"),
    placement=("S({concat_dim})", "S({split_dim})"),
    # each rank sends (n-1)/n of its piece, 1/n to every other member
    price=ring_price("all_to_all", "src"),
    lowering="cut",
    label="all-to-all",
    run=communicator_op("all_to_all", "split_dim", "concat_dim"),
)
