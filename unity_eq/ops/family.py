"""The plug-in shape of an op family: one value that says everything the stages need to know about its ops.

Every family, built-in or added later, is one module of ``unity_eq/ops/`` with its rule file: the registry puts
its specs in the language (so ``rules/schema.egg`` declares them), ``optimize`` loads its rule file, the cost
model asks it for FLOPs, ``explain`` names its rule file, and the verifier takes its shape inference, its
semantics (over the verifier's numpy or Z3 backend), the instances that make up its proof ranges and, where it
has them, the shape-generic prover's axioms from it. Nothing outside the module and its ``.egg`` file changes
(docs/architecture.md, "Adding an op family").

The hooks are plain functions so that a family module imports nothing heavier than numpy at load time: the
engine does not need z3, and the verifier passes its backend (and its axiom vocabulary) in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from unity_eq.ops.spec import OpSpec

__all__ = [
    "IndexShape",
    "Instance",
    "InstanceRanges",
    "LowerContext",
    "NodeView",
    "NotModeled",
    "OpCase",
    "OpFamily",
    "Saved",
    "ShapeError",
]

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """The arguments do not fit the op (the verifier skips such an instance; the engine never builds one)."""


class NotModeled(Exception):
    """A node the family's typed constructor does not model (an attribute value, a convention): the encoder
    carries it opaquely instead, so it runs as onnxruntime runs it but is never sharded."""


@dataclass(frozen=True)
class NodeView:
    """What a family's ``normalize`` and ``guard_facts`` see of an ONNX node: the shapes of the tensors it reads
    (by tensor name) and of its outputs (``None`` for an output nobody reads)."""

    op: str
    shapes: Mapping[str, Shape]
    outputs: tuple[Shape | None, ...]

    def shape(self, name: str) -> Shape:
        return self.shapes[name]

    def rank(self, name: str | None) -> int:
        """The rank of an input (0 for an absent one)."""
        return len(self.shapes[name]) if name else 0


class InstanceRanges(Protocol):
    """The proof ranges the verifier asks a family to cover (verify/_gen.py's GenConfig, docs/verify.md).

    ``dims``: the sizes every dimension takes; ``max_rank`` of free tensors and of the elementwise, MatMul and
    layout families; ``other_rank`` of the other families; ``rank4_dims``: the dims of rank-4 instances;
    ``sample``: a sample for the numeric back-up instead of every instance (never a proof)."""

    @property
    def dims(self) -> tuple[int, ...]: ...
    @property
    def max_rank(self) -> int: ...
    @property
    def other_rank(self) -> int: ...
    @property
    def rank4_dims(self) -> tuple[int, ...]: ...
    @property
    def sample(self) -> bool: ...


@dataclass(frozen=True)
class IndexShape:
    """The shape of a tensor of indices whose values lie in ``[-high, high)`` (Gather's ``indices``)."""

    shape: Shape
    high: int


@dataclass(frozen=True)
class OpCase:
    """One instance of an op for the verifier, by argument name: ``tensors`` maps a tensor argument to its shape
    (``None``: an absent optional input; a list of shapes: a ``TList``; an :class:`IndexShape`: a tensor of
    indices), ``attrs`` the attributes and static lists given (the
    others take the spec's defaults, float ones a free symbol), ``index`` the output of a multi-output op."""

    tensors: Mapping[str, Any]
    attrs: Mapping[str, Any]
    index: int | None = None


@dataclass(frozen=True)
class Saved:
    """What an op's backward pass keeps of its forward pass, as PyTorch's autograd saves it: what training
    memory counts as stored activations (``unity_eq/memory.py``).

    ``inputs``: the input arguments (by spec name) the backward reads (MatMul: both operands; Gelu: its input);
    a weight among them is counted with the weights, not as an activation. ``output``: the backward reads the
    op's outputs (Relu, Softmax, Sigmoid). ``view``: the input argument whose storage the output shares
    (Reshape, Transpose, Slice…: PyTorch returns a view, no copy), so saving the output keeps that input's
    storage alive and costs nothing more when it is saved too. ``Saved()``: the backward needs nothing (Add,
    Concat, comparisons)."""

    inputs: tuple[str, ...] = ()
    output: bool = False
    view: str | None = None


class LowerContext(Protocol):
    """What a family's ``lower`` hook may ask of the rank's graph being built (unity_eq/lower/builder.py):
    ``fresh(base)``: an unused value name; ``constant(array, base)``: an initializer's name; ``shape(i)`` and
    ``dtype(i)``: input ``i``'s local shape and numpy dtype (``None`` for an absent input); ``value(i)``: its
    values when it is a constant (a weight's piece), else ``None``; ``opset()``: the default-domain opset the
    rank's model is written at (at least the family's ``opset``)."""

    def fresh(self, base: str) -> str: ...
    def constant(self, array: Any, base: str) -> str: ...
    def shape(self, index: int) -> Shape | None: ...
    def dtype(self, index: int) -> Any: ...
    def value(self, index: int) -> Any: ...
    def opset(self) -> int: ...


#: What ``instances`` yields: an :class:`OpCase`, or ``(tensors, attrs)`` for short.
Instance = OpCase | tuple[Mapping[str, Any], Mapping[str, Any]]


@dataclass(frozen=True)
class OpFamily:
    """An op family: ops that share their semantics' shape and their rule file (MatMul and Gemm, the poolings…).

    ``infer_shape(op, args)``: the output shape, tensor arguments given as shapes (``ShapeError`` when they do
    not fit). ``evaluate(op, args, bk)``: the output as an array of the backend's scalars, tensor arguments as
    numpy object arrays of them; ``bk`` offers ``add``, ``mul``, ``where``, ``compare``… (verify/_tensor.py).
    ``instances(spec, ranges)``: every instance of the proof ranges, completely (a proof is exhaustive over
    them; docs/verify.md). ``flops(op, in_shapes, out_shape)``: floating-point operations on local shapes.
    ``ranges``: the ranges in words, for docs/verify.md. ``axioms(vocab)``: adds the shape-generic prover's
    axioms for the family's ops to the verifier's vocabulary (verify/_generic.py: ``vocab.add(group, axiom)``,
    ``vocab.op(name)``, ``vocab.symbols("x d i n")``); without it the family's rules are proven on every case
    of its ranges only. ``normalize(op, values, node)``: the encoder's argument values made canonical (negative
    axes, defaults ONNX leaves implicit, shapes read off the node), so that equal computations become equal
    terms; raises :class:`NotModeled` for a node the constructor cannot express. ``guard_facts(op, values,
    node)``: literal-keyed facts for the guards of its rules that egglog cannot compute (``("reduce-map",
    axes, keepdims, rank, d, d2)``: ints and int tuples). ``implied_attrs``: ONNX attributes an op's
    constructor states in another form (Split's ``num_outputs``: its sizes). ``saved(op)``: what the op's
    backward pass keeps (:class:`Saved`), for training memory; without it (a plug-in that does not say) every
    tensor input counts as kept, the conservative guess. ``types(op)``: the op's type constraints
    (:class:`unity_eq.ops.dtypes.OpTypes`) when it does not take every dtype; without it every operand may be
    any dtype and the output is its first operand's. ``lower(op, inputs, outputs, attrs, ctx)``: the ONNX nodes
    that compute the op on one rank (input and output value names given, ``""`` for an absent input), for an
    op that is no ONNX operator of that name and signature; without it the op is written as one node of its
    name with its attributes. ``opset``: the default-domain opset the ``lower`` hook wants (a plan that uses
    one of the family's ops is written at it, or above: ONNX imports one version of the default domain).
    """

    name: str
    specs: tuple[OpSpec, ...]
    rule_file: str  # relative to rules/, loaded by optimize and proven by verify
    infer_shape: Callable[[str, Sequence[Any]], Shape]
    evaluate: Callable[[str, Sequence[Any], Any], Any]
    instances: Callable[[OpSpec, InstanceRanges], Iterable[Instance]]
    flops: Callable[[str, Sequence[Sequence[int] | None], Sequence[int]], float]
    ranges: str = ""
    axioms: Callable[[Any], None] | None = None
    normalize: Callable[[str, dict[str, Any], NodeView], dict[str, Any]] | None = None
    guard_facts: Callable[[str, Mapping[str, Any], NodeView], Iterable[tuple[Any, ...]]] | None = None
    implied_attrs: Mapping[str, frozenset[str]] = field(default_factory=dict)
    saved: Callable[[str], Saved] | None = None
    types: Callable[[str], Any] | None = None  # op -> unity_eq.ops.dtypes.OpTypes (None: any dtype)
    # (op, inputs, outputs, attrs, ctx) -> a list of onnx.NodeProto
    lower: Callable[[str, Sequence[str], Sequence[str], Mapping[str, Any], LowerContext], list[Any]] | None = None
    opset: int = 0

    def __post_init__(self) -> None:
        if not self.specs:
            raise ValueError(f"op family {self.name} has no ops")
