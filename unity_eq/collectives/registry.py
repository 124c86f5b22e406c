"""Every collective kind, and the look-ups the engine dispatches through (the names are never copied).

The order of :data:`COLLECTIVES` is the order of the e-graph's parallel constructors wherever a list of them is
enumerated (the verifier's default op set), so it is part of behaviour: new kinds go at the end.
"""

from __future__ import annotations

from collections.abc import Mapping

from unity_eq.collectives.all_gather import ALL_GATHER
from unity_eq.collectives.all_reduce import ALL_REDUCE
from unity_eq.collectives.all_to_all import ALL_TO_ALL
from unity_eq.collectives.base import Collective, TorchOp
from unity_eq.collectives.partition import PARTITION
from unity_eq.collectives.reduce_scatter import REDUCE_SCATTER
from unity_eq.collectives.replicate import REPLICATE
from unity_eq.errors import RuntimeBackendError

__all__ = [
    "BY_NAME",
    "BY_RECORD_KIND",
    "BY_TERM",
    "COLLECTIVES",
    "RUNTIME_FIELDS",
    "TERMS",
    "backward_kind",
    "by_term",
    "torch_op",
]

COLLECTIVES: tuple[Collective, ...] = (PARTITION, ALL_GATHER, REPLICATE, ALL_REDUCE, REDUCE_SCATTER, ALL_TO_ALL)

BY_NAME: Mapping[str, Collective] = {c.name: c for c in COLLECTIVES}

#: e-graph constructor -> kind, for the kinds with a term (the parallel ops of the e-graph)
BY_TERM: Mapping[str, Collective] = {c.term: c for c in COLLECTIVES if c.term is not None}

#: the e-graph's parallel constructors, in registry order (``Partition``, ``Combine``, ``Replicate``, ``Reduce``)
TERMS: tuple[str, ...] = tuple(BY_TERM)

#: plan.json step record ``kind`` -> collective kind
BY_RECORD_KIND: Mapping[str, Collective] = {c.record_kind: c for c in COLLECTIVES if c.record_kind is not None}

#: plan.json ``collectives[].kind`` the runtime executes -> the integer fields each needs
RUNTIME_FIELDS: Mapping[str, tuple[str, ...]] = {c.name: c.dims for c in COLLECTIVES if c.communicates}


def by_term(term: str) -> Collective | None:
    """The kind an e-graph constructor is, or None for any other constructor."""
    return BY_TERM.get(term)


def backward_kind(kind: Collective) -> Collective | None:
    """The kind a kind's backward pass runs on the gradient (a partition's all-gather, a replicate's
    all-reduce), or None: what ``check --training`` expects the ranks to issue for its step."""
    if kind.backward_op is None:
        return None
    return next(c for c in COLLECTIVES if c.label == kind.backward_op)


def torch_op(name: str) -> TorchOp:
    """The torch backend's op for the kind ``name`` (its slot in :class:`~unity_eq.collectives.base.Collective`)."""
    kind = BY_NAME.get(name)
    if kind is None or kind.torch_op is None:
        raise RuntimeBackendError(f"collective {name!r} has no torch op: the torch backend cannot run it")
    return kind.torch_op
