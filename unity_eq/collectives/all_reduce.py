"""All-reduce: the group's partial sums added in group order (e-graph ``Reduce``, plan step ``AllReduce``,
plan.json collective ``all_reduce``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.collectives.base import Collective, CollectiveStep, Communicator, Prices
from unity_eq.cost.records import Cost


@dataclass(frozen=True)
class AllReduce(CollectiveStep):
    out: str
    src: str
    axis: str

    @property
    def kind(self) -> Collective:
        return ALL_REDUCE


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """The ring all-reduce of the result's bytes."""
    return Cost(comm=model.all_reduce(axis, out_bytes))


def run(comm: Communicator, array: np.ndarray, group: Sequence[int], dims: Mapping[str, int]) -> np.ndarray:
    return comm.all_reduce(array, group)


def torch_op(tensor: Any, group: Any, fields: Mapping[str, Any]) -> Any:
    """The torch backend's op (autograd-aware; torch is imported only here, when a plan trains)."""
    from unity_eq.collectives import torch_autograd

    return torch_autograd.all_reduce(tensor, group)


ALL_REDUCE = Collective(
    name="all_reduce",
    dims=(),
    placement=("P", "R"),
    price=price,
    lowering="cut",
    label="all-reduce",
    term="Reduce",
    step=AllReduce,
    record_kind="reduce",
    run=run,
    keeps_weights=False,
    metadata_name="all_reduce (sum)",
    torch_op=torch_op,
)
