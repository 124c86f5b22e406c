"""All-gather: the group's chunks along ``dim`` concatenated in axis order (e-graph ``Combine``, plan step
``AllGather``, plan.json collective ``all_gather``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.collectives.base import Collective, CollectiveStep, Communicator, Prices
from unity_eq.cost.records import Cost


@dataclass(frozen=True)
class AllGather(CollectiveStep):
    out: str
    src: str
    dim: int
    axis: str

    @property
    def kind(self) -> Collective:
        return ALL_GATHER


def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
    """The ring all-gather producing the result's bytes on each rank."""
    return Cost(comm=model.all_gather(axis, out_bytes))


def run(comm: Communicator, array: np.ndarray, group: Sequence[int], dims: Mapping[str, int]) -> np.ndarray:
    return comm.all_gather(array, group, dims["dim"])


def torch_op(tensor: Any, group: Any, fields: Mapping[str, Any]) -> Any:
    """The torch backend's op (autograd-aware; torch is imported only here, when a plan trains)."""
    from unity_eq.collectives import torch_autograd

    return torch_autograd.all_gather(tensor, group, fields["dim"])


ALL_GATHER = Collective(
    name="all_gather",
    dims=("dim",),
    placement=("S({dim})", "R"),
    price=price,
    lowering="cut",
    label="all-gather",
    term="Combine",
    step=AllGather,
    record_kind="combine",
    run=run,
    torch_op=torch_op,
)
