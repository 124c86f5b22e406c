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
    "COMPUTE_CLASSES",
    "FREE",
    "HOOKS",
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
    "Work",
]

Shape = tuple[int, ...]

#: The efficiency classes of ops (machine files give an efficiency per class and device kind): ``gemm``, the
#: tensor-core kernels (MatMul, Gemm, Conv); ``memory``, the streaming memory-bound kernels (elementwise,
#: normalizations, reductions, Gather's contiguous rows); ``layout``, the data-movement copies (Transpose,
#: Expand, Split, Concat, Slice: strided reads or writes, slower than a streaming kernel over the same bytes);
#: ``attention``, a fused attention kernel (flash): its own fraction of the peak, measured far below a GEMM's
#: (the softmax between its products, and a float32 kernel without tensor cores).
COMPUTE_CLASSES = ("gemm", "memory", "layout", "attention")


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
    ``sample``: a sample for the numeric back-up instead of every instance (never a proof); ``wide``: sizes a
    family keeps small for z3 range over ``dims`` too (the verifier's size sweep: numeric, never a proof)."""

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
    @property
    def wide(self) -> bool: ...


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


@dataclass(frozen=True)
class Work:
    """One pass of an op (its forward or its backward) on local shapes, as the roofline prices it: ``flops``,
    the elements it reads (``read``) and writes (``written``), of the op's element type (the cost model
    multiplies by its itemsize), and the ``kernels`` it launches (each pays the machine's launch floor).

    ``Work()`` with ``kernels=0`` is free: a view (Reshape in onnxruntime, the backward of a Reshape in
    PyTorch) or a gradient that is another tensor's buffer (Add's gradient of an operand of the output's shape
    is the output's gradient itself)."""

    flops: float = 0.0
    read: float = 0.0
    written: float = 0.0
    kernels: float = 1.0
    #: the efficiency class this work runs at where it is not the op's (Attention's bfloat16 lowering writes
    #: MatMuls and a Softmax, streaming kernels, not the fused kernel its class describes); None: the op's
    compute_class: str | None = None

    def __add__(self, other: Work) -> Work:
        return Work(
            self.flops + other.flops,
            self.read + other.read,
            self.written + other.written,
            self.kernels + other.kernels,
            self.compute_class if self.compute_class == other.compute_class else None,
        )

    @property
    def elements(self) -> float:
        """Elements moved: read plus written."""
        return self.read + self.written


#: No work at all: a view, or a pass that produces nothing.
FREE = Work(kernels=0.0)

#: A family's forward or backward work on local shapes: ``(op, in_shapes, out_shape)`` (list inputs flattened,
#: as :meth:`OpFamily.flops` gets them); None for an op it does not model (the cost model's default then).
WorkFn = Callable[[str, Sequence[Sequence[int] | None], Sequence[int]], "Work | None"]
#: The forward work of what lowering writes for the op in this dtype, where that is not the op's own kernel:
#: ``(op, in_shapes, out_shape, dtype, attrs)`` (``attrs``: the family's ``priced_attrs`` by name); None where
#: lowering writes the op's kernel.
LoweredWorkFn = Callable[[str, Sequence[Sequence[int] | None], Sequence[int], str, Mapping[str, Any]], "Work | None"]


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
    tensor input counts as kept, the conservative guess. ``forward_work(op, in_shapes, out_shape)``: the
    forward pass's :class:`Work` where it is not "read every input, write the output, one kernel, ``flops``"
    (a view moves nothing; Gather reads the rows it gathers, not the table); None (the hook or its answer):
    that default. ``backward_work(op, in_shapes, out_shape)``: the backward pass's :class:`Work`, as PyTorch's
    autograd runs it: the gradients it produces (every floating-point operand's, but for one-element operands:
    constants such as a scale), what it re-reads (the saved tensors), the reduction of a broadcast operand's
    gradient, its kernels; without it (or when it answers None) the backward is priced as the objective's flat
    ``backward_factor`` × the forward time, the conservative guess a plug-in gets. ``compute_class``: the
    efficiency class of its ops in the machine file (:data:`COMPUTE_CLASSES`, docs/machines.md); ``memory``
    unless it says; ``compute_classes``: an op's own where it differs from its family's (Gather's rows are
    contiguous: a streaming copy, where Split's and Slice's are strided). ``types(op)``: the op's type constraints
    (:class:`unity_eq.ops.dtypes.OpTypes`) when it does not take every dtype; without it every operand may be
    any dtype and the output is its first operand's. ``torch(op, inputs, attrs)``: the op in PyTorch, for
    training a plan (unity_eq/train).
    ``lower(op, inputs, outputs, attrs, ctx)``: the ONNX nodes
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
    # PyTorch semantics for the torch backend (unity_eq/train): ``torch(op, inputs, attrs)`` -> the outputs, a list
    # of torch tensors (inputs are torch tensors, None for an absent optional one; attrs as plain values). The
    # family module imports torch inside the function only. Without it, unity_eq/train/torch_ops.py's table
    # serves the op, or the op is refused before any rank starts.
    torch: Callable[[str, Sequence[Any], Mapping[str, Any]], Sequence[Any]] | None = None
    forward_work: WorkFn | None = None
    backward_work: WorkFn | None = None
    # the device program's forward where lowering writes something else than the op's kernel for a dtype (an
    # inference plan runs that program; a training plan runs the torch backend, whose kernel forward_work prices)
    lowered_work: LoweredWorkFn | None = None
    # the attributes its prices read (``lowered_work``'s: Attention's scale and causal add passes to the
    # composition lowering writes), carried in the op's cost instance from its e-node or plan step
    priced_attrs: tuple[str, ...] = ()
    compute_class: str = "memory"  # one of COMPUTE_CLASSES: which of the machine's efficiencies applies
    compute_classes: Mapping[str, str] = field(default_factory=dict)  # an op's own class, where it differs
    # (op, inputs, outputs, attrs, ctx) -> a list of onnx.NodeProto
    lower: Callable[[str, Sequence[str], Sequence[str], Mapping[str, Any], LowerContext], list[Any]] | None = None
    opset: int = 0

    def __post_init__(self) -> None:
        if not self.specs:
            raise ValueError(f"op family {self.name} has no ops")
        for kind in (self.compute_class, *self.compute_classes.values()):
            if kind not in COMPUTE_CLASSES:
                raise ValueError(f"op family {self.name}: compute class {kind!r}, expected one of {COMPUTE_CLASSES}")

    def op_class(self, op: str) -> str:
        """The efficiency class of one of its ops: ``compute_classes[op]``, else ``compute_class``."""
        return self.compute_classes.get(op, self.compute_class)

    @staticmethod
    def hooks_in(namespace: Mapping[str, Any]) -> dict[str, Any]:
        """The hooks a family module defines (``OpFamily(name=..., **OpFamily.hooks_in(globals()))``): its own
        functions named after the hook fields (:data:`HOOKS`), so a module states each hook once, by its name,
        and a hook it does not define keeps the field's default. A function imported from elsewhere is not
        taken (pass it by keyword, as SpaceToDepth passes ``torch``)."""
        module = namespace["__name__"]
        found = {name: namespace.get(name) for name in HOOKS}
        return {name: fn for name, fn in found.items() if callable(fn) and getattr(fn, "__module__", None) == module}


#: The hook fields of :class:`OpFamily` a family module may supply as functions of the same name.
HOOKS = (
    "infer_shape",
    "evaluate",
    "instances",
    "flops",
    "axioms",
    "normalize",
    "guard_facts",
    "saved",
    "types",
    "torch",
    "forward_work",
    "backward_work",
    "lowered_work",
    "lower",
)
