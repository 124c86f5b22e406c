"""Collectives as plug-ins: one module per kind, each holding one :class:`Collective` (its e-graph term and
placement change, its price, how lowering writes it, its plan step, its runtime op, its plan.json names, its
label in explain and pictures, and a slot for a torch op); :mod:`.registry` is what the engine dispatches through.

==================  ==============  ===============  ===============  ================  ====================
module              e-graph term    plan step        step record      runtime kind      placement on axis
==================  ==============  ===============  ===============  ================  ====================
``partition``       ``Partition``   ``Slice``        ``partition``    (local)           R -> S(dim)
``all_gather``      ``Combine``     ``AllGather``    ``combine``      ``all_gather``    S(dim) -> R
``replicate``       ``Replicate``   ``Replicated``   ``replicate``    (local)           R -> R (D)
``all_reduce``      ``Reduce``      ``AllReduce``    ``reduce``       ``all_reduce``    P -> R
``reduce_scatter``  —               —                —                ``reduce_scatter``  P -> S(dim)
``all_to_all``      —               —                —                ``all_to_all``    S(c) -> S(s)
==================  ==============  ===============  ===============  ================  ====================

Adding a kind: a module here (its :class:`Collective`, and a :class:`CollectiveStep` subclass when plans use
it), one entry in :data:`registry.COLLECTIVES`, its constructor and rules in a rule file, a record in
``planfile/steps.py`` when plans write it, and a test (docs/architecture.md, "Extension points").
"""

from __future__ import annotations

from unity_eq.collectives.all_gather import ALL_GATHER, AllGather
from unity_eq.collectives.all_reduce import ALL_REDUCE, AllReduce
from unity_eq.collectives.all_to_all import ALL_TO_ALL
from unity_eq.collectives.base import Collective, CollectiveStep, Communicator, TorchOp
from unity_eq.collectives.partition import PARTITION, Slice
from unity_eq.collectives.reduce_scatter import REDUCE_SCATTER
from unity_eq.collectives.registry import (
    BY_NAME,
    BY_RECORD_KIND,
    BY_TERM,
    COLLECTIVES,
    RUNTIME_FIELDS,
    TERMS,
    by_term,
    torch_op,
)
from unity_eq.collectives.replicate import REPLICATE, Replicated

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "ALL_TO_ALL",
    "BY_NAME",
    "BY_RECORD_KIND",
    "BY_TERM",
    "COLLECTIVES",
    "PARTITION",
    "REDUCE_SCATTER",
    "REPLICATE",
    "RUNTIME_FIELDS",
    "TERMS",
    "AllGather",
    "AllReduce",
    "Collective",
    "CollectiveStep",
    "Communicator",
    "Replicated",
    "Slice",
    "TorchOp",
    "by_term",
    "torch_op",
]
