"""What a collective kind is (:class:`Collective`), the plan step every kind's step derives from
(:class:`CollectiveStep`), the runtime's :class:`Communicator` and the slot for a torch op (:data:`TorchOp`).

A kind is one module of this package holding one :class:`Collective` value; :mod:`.registry` lists them, and
pricing, lowering, plan records, the runtime, the verifier's name sets, pictures and explain look a kind up
there instead of naming it. Nothing here imports the rest of the engine but the cost records, so the lowest
layers (planfile, runtime) can ask the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import numpy as np

from unity_eq.cost.records import Cost, Objective
from unity_eq.ir import Mesh

__all__ = [
    "AxisStep",
    "Collective",
    "CollectiveStep",
    "Communicator",
    "DimStep",
    "Lowering",
    "Price",
    "Prices",
    "RunOp",
    "TorchOp",
    "autograd_op",
    "communicator_op",
    "ring_price",
]


class Prices(Protocol):
    """What a kind's price reads of :class:`~unity_eq.cost.model.CostModel`: its mesh and objective and the ring
    formulas at an axis's slowest group (a protocol, so the kinds sit below the cost model: planfile and the
    runtime ask the registry without importing it)."""

    @property
    def mesh(self) -> Mesh: ...

    @property
    def objective(self) -> Objective: ...

    def local_copy(self, nbytes: float) -> Cost: ...

    def all_gather(self, axis: str, nbytes: float) -> float: ...

    def all_reduce(self, axis: str, nbytes: float) -> float: ...

    def reduce_scatter(self, axis: str, nbytes: float) -> float: ...

    def all_to_all(self, axis: str, nbytes: float) -> float: ...

    def gradient_all_reduce(self, axis: str, nbytes: float) -> float: ...


class Communicator(Protocol):
    """The collectives a rank needs. ``group`` lists the participating ranks (world ranks) in axis order.

    Every backend must return, bit for bit, what the reference functions of :mod:`unity_eq.runtime.collectives`
    compute from the pieces of the group in group order; pieces of one collective have equal shapes and dtypes.
    A kind's :attr:`Collective.run` calls one of these methods, so a backend implements each kind it runs.
    """

    rank: int

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray: ...

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray: ...

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray: ...

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray: ...

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None: ...

    def recv(self, source: int, tag: int = 0) -> np.ndarray: ...


#: A kind's price: ``(model, axis, source bytes, result bytes, source kind) -> Cost``. Bytes are per device (local
#: shapes); the source kind is ``weight``, ``input`` or ``activation`` (training prices a weight's gradient
#: all-reduce apart). The formulas are :class:`~unity_eq.cost.model.CostModel`'s collectives (NCCL's ring times of
#: :mod:`unity_eq.cost.collectives` at the axis's slowest group).
Price = Callable[[Prices, str, float, float, str], Cost]

#: A kind's runtime op on one rank: ``(communicator, this rank's piece, group ranks, the kind's dims) -> result``.
RunOp = Callable[[Communicator, np.ndarray, Sequence[int], Mapping[str, int]], np.ndarray]

#: The torch backend's op for a kind (unity_eq.train): ``(tensor, the backend's group on the step's mesh axis, the
#: step's fields: ``dim`` and, for ``replicate``, the gradient's ``phase``) -> tensor``, autograd-aware (its
#: backward is the kind's gradient collective; the autograd functions are :mod:`unity_eq.collectives.torch_autograd`,
#: imported only when the op runs, so planning never imports torch). ``None``: the kind has no torch op, and
#: :func:`unity_eq.collectives.registry.torch_op` says so in one error.
TorchOp = Callable[[Any, Any, Mapping[str, Any]], Any]

#: How lowering writes a step of the kind into a device graph: ``alias`` (no op: the result is its source),
#: ``slice`` (this rank's chunk along ``dim``: an ONNX Slice, or folded into a weight), ``cut`` (a communicating
#: collective: the device graph is cut, the runtime runs the kind's :attr:`Collective.run` between segments).
Lowering = Literal["alias", "slice", "cut"]


@dataclass(frozen=True)
class Collective:
    """Everything the engine knows about one collective kind, in one value (one module of this package each).

    ``term``/``step``/``record_kind`` are None for a kind the runtime runs but no plan writes yet (reduce-scatter,
    all-to-all): giving it an e-graph term (a rule file's constructor), a step class and a record makes it plannable.
    """

    name: str  # the kind's name: plan.json's ``collectives[].kind`` when it communicates
    dims: tuple[str, ...]  # the integer fields of its step, term and runtime record, in order
    placement: tuple[str, str]  # (source, result) state on its own axis; ``{dim}`` is filled from the step
    price: Price
    lowering: Lowering
    label: str  # how explain and pictures name it (``all-gather``)
    term: str | None = None  # its e-graph constructor: ``Term(x, *dims, axis)``
    step: type[CollectiveStep] | None = None  # its plan step
    record_kind: str | None = None  # its plan.json step record's ``kind``
    run: RunOp | None = None  # its runtime op (None: nothing moves at run time)
    backward_op: str | None = None  # the collective its backward pass runs on the gradient (``all-reduce``)
    local: bool = False  # nothing moves in the forward pass: the result is its source's kind (weight, input…)
    keeps_weights: bool = True  # of weights, its result is weight data (a gathered weight), not an activation
    weight_gradient: bool = False  # its backward pass is a weight's gradient all-reduce (data parallelism)
    torch_op: TorchOp | None = None  # the torch backend's op (see TorchOp)
    metadata_name: str = ""  # how a device file's metadata names it, when not ``name`` (``all_reduce (sum)``)

    @property
    def communicates(self) -> bool:
        """Runs between device-graph segments (plan.json lists it under ``collectives``)."""
        return self.run is not None

    def phase(self, source: str) -> str | None:
        """When it communicates (``forward``, ``backward``, ``gradient``) given its source's kind, or None."""
        if self.communicates:
            return "forward"
        if source == "activation":
            return "backward"
        return "gradient" if source == "weight" and self.weight_gradient else None

    def states(self, dims: Mapping[str, int]) -> tuple[str, str]:
        """Its (source, result) placement on its axis, as plan.json writes placements (``S(1)``, ``R``, ``P``)."""
        return self.placement[0].format(**dims), self.placement[1].format(**dims)

    def cut_label(self) -> str:
        """The kind as a device file's metadata names it (``all_gather``, ``all_reduce (sum)``)."""
        return self.metadata_name or self.name

    def __post_init__(self) -> None:
        if self.step is not None:  # the step class answers ``kind`` with this value (no property per kind)
            self.step.collective = self


def ring_price(formula: str, size: str = "out") -> Price:
    """A kind priced by one of the cost model's collectives (``all_gather``, ``all_reduce``…) on the result's
    bytes (``size="out"``) or the source's (``"src"``), whatever the source is."""
    if size not in ("out", "src"):
        raise ValueError(f"size: expected out or src, got {size!r}")

    def price(model: Prices, axis: str, src_bytes: float, out_bytes: float, source: str) -> Cost:
        seconds: float = getattr(model, formula)(axis, out_bytes if size == "out" else src_bytes)
        return Cost(comm=seconds)

    return price


def communicator_op(method: str, *dims: str) -> RunOp:
    """A kind's runtime op: the :class:`Communicator`'s ``method`` on the piece and the group, then the kind's
    ``dims`` in the method's order."""

    def run(comm: Communicator, array: np.ndarray, group: Sequence[int], values: Mapping[str, int]) -> np.ndarray:
        result: np.ndarray = getattr(comm, method)(array, group, *(values[d] for d in dims))
        return result

    return run


def autograd_op(function: str, *fields: str) -> TorchOp:
    """A kind's torch op: ``collectives.torch_autograd.<function>(tensor, group, *fields)``, torch imported only
    when it runs (a plan trains)."""

    def op(tensor: Any, group: Any, values: Mapping[str, Any]) -> Any:
        from unity_eq.collectives import torch_autograd

        return getattr(torch_autograd, function)(tensor, group, *(values[f] for f in fields))

    return op


S = TypeVar("S", bound="CollectiveStep")


class CollectiveStep:
    """The plan step of a collective kind (a frozen dataclass with ``out``, ``src``, its dims and ``axis``).

    Code that handles plan steps matches ``CollectiveStep()`` once and asks :attr:`kind`; each subclass is
    defined in its kind's module and names its :class:`Collective` there.
    """

    __slots__ = ()
    out: str
    src: str
    axis: str
    collective: ClassVar[Collective]  # set by the kind's Collective value, which names this class as its step

    @property
    def kind(self) -> Collective:
        return type(self).collective

    def dims(self) -> dict[str, int]:
        """The kind's integer fields by name (``{"dim": 1}`` for a gather along dim 1)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in self.kind.dims}  # type: ignore[arg-type]

    def renamed(self: S, name_of: Callable[[str], str]) -> S:
        """The same step over renamed tensors (pieces and pipeline stages stitched into one plan)."""
        return replace(self, out=name_of(self.out), src=name_of(self.src))  # type: ignore[type-var]


@dataclass(frozen=True)
class AxisStep(CollectiveStep):
    """The fields of a kind's step without dims: its result, its source and its mesh axis."""

    out: str
    src: str
    axis: str


@dataclass(frozen=True)
class DimStep(CollectiveStep):
    """The fields of a kind's step along one tensor dim: its result, its source, the dim and its mesh axis."""

    out: str
    src: str
    dim: int
    axis: str
