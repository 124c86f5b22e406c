"""The steps of plan.json: one record per kind, told apart by ``kind`` (:data:`StepRecord` is their union); the
predicted seconds are there when the plan was priced step by step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

from unity_eq.planfile.codec import Record


@dataclass(frozen=True, kw_only=True)
class ComputeStepRecord(Record):
    KIND: ClassVar[str] = "compute"
    op: str
    inputs: tuple[str | tuple[int, ...] | None, ...]  # tensors, literals (a Reshape's shape), absent inputs
    outputs: tuple[str, ...]  # "" for an output nobody reads
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""
    node: str = ""  # the source model's node (its ONNX name), when the op is one of its: explain names it
    compute_s: float | None = None
    communication_s: float | None = None


# The step kinds with the same fields share one dataclass of them (its fields are their plan.json keys, in
# order); each kind below adds only its ``KIND``.


@dataclass(frozen=True, kw_only=True)
class _LoadStepFields(Record):  # a step that loads a named tensor: a model input or a weight
    out: str
    name: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class InputStepRecord(_LoadStepFields):
    KIND: ClassVar[str] = "input"


@dataclass(frozen=True, kw_only=True)
class WeightStepRecord(_LoadStepFields):
    KIND: ClassVar[str] = "weight"


@dataclass(frozen=True, kw_only=True)
class CollectiveStepRecord(Record):
    """The record of a collective kind's step (``KIND`` is the kind's ``record_kind`` in unity_eq.collectives):
    explain and the pictures match this class once and look the kind up by ``KIND``. A kind over an axis with no
    dim (reduce, replicate) derives from it directly."""

    out: str
    src: str
    axis: str
    compute_s: float | None = None
    communication_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class _DimStepFields(CollectiveStepRecord):  # a collective over an axis along a tensor dim: partition, combine
    dim: int


@dataclass(frozen=True, kw_only=True)
class PartitionStepRecord(_DimStepFields):
    KIND: ClassVar[str] = "partition"


@dataclass(frozen=True, kw_only=True)
class CombineStepRecord(_DimStepFields):
    KIND: ClassVar[str] = "combine"


@dataclass(frozen=True, kw_only=True)
class ReduceStepRecord(CollectiveStepRecord):
    KIND: ClassVar[str] = "reduce"


@dataclass(frozen=True, kw_only=True)
class ReplicateStepRecord(CollectiveStepRecord):
    KIND: ClassVar[str] = "replicate"


StepRecord = (
    ComputeStepRecord
    | InputStepRecord
    | WeightStepRecord
    | PartitionStepRecord
    | CombineStepRecord
    | ReduceStepRecord
    | ReplicateStepRecord
)

#: every step record class by its ``kind`` (a collective kind's step is written as ``BY_KIND[kind.record_kind]``)
BY_KIND: Mapping[str, Callable[..., StepRecord]] = {record.KIND: record for record in get_args(StepRecord)}
