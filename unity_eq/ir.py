"""The tensor-graph IR: plain data that every stage reads and no stage mutates.

A :class:`Graph` is what a frontend produces and what the e-graph encoder consumes: a topologically ordered
list of :class:`Node` (one ONNX operator application each), the :class:`TensorType` of every tensor, the
model's inputs and outputs, and its initializers (weights and constants) as numpy arrays.

Placements (``Replicate``, ``Shard``, ``Partial``: how a tensor lies over one mesh axis) are
:mod:`unity_eq.placement`'s, re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unity_eq.dtypes import as_dtype, is_float
from unity_eq.errors import OptionError
from unity_eq.placement import Partial, Placement, Replicate, Shard, parse_placement

__all__ = [
    "Graph",
    "Mesh",
    "Node",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "TensorType",
    "WeightOrigin",
    "divisors",
    "is_parameter_type",
    "parse_placement",
]


@dataclass(frozen=True)
class TensorType:
    """Static shape and element type of a tensor. ``dtype`` is a numpy dtype name such as ``float32``."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Node:
    """One operator application. ``inputs`` uses ``""`` for an absent optional input, as ONNX does.

    ``attrs`` holds Python values (int, float, str, lists of those, or ONNX ``TensorProto``/``GraphProto``
    for the rare attributes that are tensors or subgraphs).
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""


#: The float types a parameter is trained in: float8 and float4 initializers are quantized weights, stored
#: and read, not trained (and the torch backend has no such tensors).
_PARAMETER_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_parameter_type(dtype: str | np.dtype[Any], rank: int) -> bool:
    """Whether an initializer of the source file with this dtype and rank is one of the model's parameters: a
    float tensor of rank 1 or more. Integer and bool ones are shapes, indices and masks; a float scalar is an
    exporter's constant (GELU's 0.5, a Pow's exponent, sqrt(d), a mask's fill value: torch's dynamo exporter
    writes them as initializers), never a module's parameter. The one rule the frontend, the cost model, the
    memory model and the torch backend share (docs/training.md, "What is trainable")."""
    return rank >= 1 and as_dtype(dtype).name in _PARAMETER_DTYPES


#: how a weight of the graph comes from the source model's parameters (plan.json ``weights[].how``)
ORIGIN_KINDS = ("parameter", "folded", "constant")


@dataclass(frozen=True)
class WeightOrigin:
    """Where a weight of the graph (an initializer, as the frontend left it) comes from.

    ``how``: ``parameter`` — an initializer of the source file that is a parameter (:func:`is_parameter_type`),
    ``sources`` its own name; ``folded`` — a tensor the frontend computed from initializers (``ops``, e.g. a
    ``Transpose`` of a weight it made an initializer), of which ``sources`` are the parameters; ``constant`` —
    no parameter flows into it (a causal mask folded from ``Trilu``/``ConstantOfShape``, a shape, a scalar, an
    integer table), or it is not a float tensor. Only a parameter or a folded float weight is trainable: it gets
    a gradient, its gradient is all-reduced, its sources carry optimizer state (once per source parameter,
    however many weights are made of it: a tied weight is counted once)."""

    how: str = "parameter"
    sources: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    #: the source model's parameters this one initializer stands for, when a parameter map says it is several
    #: (``Graph.with_parameters``): the exporter merged them; no plan can train them apart
    merged: tuple[str, ...] = ()

    @property
    def trainable(self) -> bool:
        return self.how != "constant" and bool(self.sources)

    @staticmethod
    def constant(ops: tuple[str, ...] = ()) -> WeightOrigin:
        return WeightOrigin("constant", (), ops)


def default_origin(name: str, dtype: str, rank: int) -> WeightOrigin:
    """The origin of a weight no frontend described (a graph or plan made in memory): a parameter of its own
    name when :func:`is_parameter_type`, else a constant."""
    if dtype != "none" and is_parameter_type(dtype, rank):
        return WeightOrigin("parameter", (name,))
    return WeightOrigin.constant()


@dataclass
class Graph:
    """A whole model with static shapes, ready to be encoded.

    Invariants (the frontend guarantees them): ``nodes`` are in topological order; every tensor name that
    appears as a node input, a graph input, an output or an initializer has an entry in ``types``; the
    model inputs (``inputs``) and the initializers are disjoint.
    """

    name: str
    inputs: dict[str, TensorType]
    outputs: list[str]
    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    types: dict[str, TensorType]
    opset: int
    extra_opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int = 8
    source: str = ""
    #: :func:`unity_eq.frontends.onnx_read.model_fingerprint` of the file it was read from ("" when built in
    #: memory)
    fingerprint: str = ""
    #: initializers known by dtype and shape only (their external data is absent: the arrays are zero-stride
    #: stand-ins), each with why; the search plans with them, lowering refuses them (see ``lower.lower``)
    missing_weights: dict[str, str] = field(default_factory=dict)
    #: where each initializer comes from (the frontend fills it; a weight missing here is described by
    #: :func:`default_origin`): which are trainable, and the source parameters they are made of
    origins: dict[str, WeightOrigin] = field(default_factory=dict)
    #: True when the user said which initializers are parameters (``with_parameters``): then nothing is
    #: guessed, and ``ambiguous_weights`` is empty
    declared: bool = False

    def with_parameters(self, parameters: Mapping[str, Sequence[str]]) -> Graph:
        """This graph with its parameters as the user declares them (``optimize --parameters``): ``parameters``
        maps an initializer of the source file to the source model's parameter(s) it holds (one: it is that
        parameter; several: the exporter merged them, ``WeightOrigin.merged``). Every other initializer is a
        constant (a float buffer the exporter wrote, such as a rotary table), and a weight the frontend folded
        keeps only the declared parameters among its sources. A declared parameter the file lacks is an error:
        the plan would silently leave it untrained (an optimizing exporter renames transposed weights)."""
        # an initializer, or the source of one the frontend folded (a transpose of it)
        known = set(self.initializers) | {s for name in self.initializers for s in self.origin(name).sources}
        absent = sorted(name for name in parameters if name not in known)
        if absent:
            shown = ", ".join(absent[:3]) + (f", … ({len(absent)} in all)" if len(absent) > 3 else "")
            raise OptionError(
                f"`--parameters` names parameters that are not initializers of {self.source or 'the model'}: "
                f"{shown}. A plan could not train them, and would train the rest of the model without them. "
                "torch's dynamo exporter, when it optimizes, writes a weight's transpose as a new initializer and "
                "drops biases of zeros: export with `torch.onnx.export(..., dynamo=True, optimize=False)` to keep "
                "every parameter under its name, or leave out of the list what the source model really lacks."
            )
        origins: dict[str, WeightOrigin] = {}
        for name in self.initializers:
            old = self.origin(name)
            if name in parameters:
                names = tuple(parameters[name])
                array = self.initializers[name]
                if not is_float(array.dtype):
                    raise OptionError(
                        f"`--parameters`: {name!r} is a {array.dtype.name} tensor, not a float one; it cannot be a "
                        "parameter."
                    )
                origins[name] = WeightOrigin("parameter", (name,), (), names if len(names) > 1 else ())
            elif old.how == "folded":
                sources = tuple(s for s in old.sources if s in parameters)
                merged = tuple(n for s in sources for n in parameters[s] if len(parameters[s]) > 1)
                folded = WeightOrigin("folded", sources, old.ops, merged)
                origins[name] = folded if sources else WeightOrigin.constant(old.ops)
            else:
                origins[name] = WeightOrigin.constant(old.ops)
        return dataclasses.replace(self, origins=origins, declared=True)

    def origin(self, name: str) -> WeightOrigin:
        """The origin of initializer ``name`` (:class:`WeightOrigin`)."""
        found = self.origins.get(name)
        if found is not None:
            return found
        array = self.initializers[name]
        return default_origin(name, array.dtype.name, array.ndim)

    def constants(self) -> frozenset[str]:
        """The initializers that are not trainable: no gradient, no gradient collective, no optimizer state."""
        return frozenset(name for name in self.initializers if not self.origin(name).trainable)

    def weight_origins(self) -> dict[str, WeightOrigin]:
        """Every initializer's origin, in the graph's order."""
        return {name: self.origin(name) for name in self.initializers}

    def ambiguous_weights(self) -> dict[str, str]:
        """Trainable weights that may be several source parameters merged into one, each with why.

        torch's dynamo exporter (its default ``optimize``) merges initializers with equal values: the freshly
        initialized LayerNorm scales of every layer become one initializer that every layer's
        LayerNormalization reads. The ONNX file cannot tell that from a weight the source model really shares
        (ALBERT's layers), so what is flagged is the pattern: one parameter read by two or more nodes of the
        same op at the same input position. A tied embedding (a Gather and a MatMul of its transpose) is not
        flagged; a merge whose copies are read by different ops is not detected (docs/training.md). Empty when
        the user declared the parameters (``with_parameters``)."""
        if self.declared:
            return {}
        uses: dict[tuple[str, str, int], list[str]] = {}
        for node in self.nodes:
            for position, name in enumerate(node.inputs):
                if name in self.initializers and self.origin(name).trainable:
                    uses.setdefault((name, node.op_type, position), []).append(node.name)
        found: dict[str, str] = {}
        for (name, op, position), nodes in uses.items():
            if len(nodes) > 1 and name not in found:
                shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
                found[name] = f"read as input {position} of {len(nodes)} {op} nodes ({shown})"
        return found

    def producers(self) -> dict[str, Node]:
        """Map each tensor name to the node that produces it."""
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Map each tensor name to the nodes that read it, in graph order."""
        found: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    found.setdefault(name, []).append(node)
        return found

    def iter_tensors(self) -> Iterator[tuple[str, TensorType]]:
        yield from self.types.items()

    @property
    def weight_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.initializers.values())

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for node in self.nodes:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        top = ", ".join(f"{k}×{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
        return (
            f"{self.name}: {len(self.nodes)} nodes ({top}), {len(self.inputs)} inputs, "
            f"{len(self.initializers)} initializers ({self.weight_bytes / 2**20:.1f} MiB), opset {self.opset}"
        )


@functools.lru_cache(maxsize=8)
def divisors(n: int) -> list[int]:
    """Every positive divisor of ``n``, ascending: the sizes a mesh axis, a tensor group or a microbatch count
    over ``n`` devices or samples can take (the mesh search and the stage search both enumerate them)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@functools.lru_cache(maxsize=8)
def machine_order(n: int) -> tuple[int, ...]:
    """``(0, 1, …, n-1)``: ranks on the machine's devices in order. One shared tuple per size, so the many meshes
    of a search over 100k devices share it (and cost models recognise it by identity)."""
    return tuple(range(n))


#: The default names of a mesh's axes, in order (`--mesh 2x4` is x=2,y=4).
AXIS_NAMES = ("x", "y", "z")


@dataclass(frozen=True)
class Mesh:
    """A logical device mesh: named axes with sizes, laid over machine devices.

    Rank r has mesh coordinates ``coords(r)`` in row-major order (the last axis varies fastest), and runs on
    machine device ``devices[r]``. Parallel ops name an axis; the devices that communicate for them are the
    ranks that differ only in that axis's coordinate (``group``).
    """

    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    devices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.axes) != len(self.sizes):
            raise ValueError(f"mesh: {len(self.axes)} axis names for {len(self.sizes)} sizes")
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"mesh: axis names must be distinct, got {self.axes}")
        if any(n < 1 for n in self.sizes):
            raise ValueError(f"mesh: axis sizes must be positive, got {self.sizes}")
        if not self.devices:
            object.__setattr__(self, "devices", machine_order(math.prod(self.sizes)))
        if len(self.devices) != math.prod(self.sizes):
            raise ValueError(f"mesh: {len(self.devices)} devices for a mesh of {math.prod(self.sizes)} ranks")

    @classmethod
    def parse(cls, text: str, devices: int) -> Mesh:
        """``x=2,y=4`` (or ``2x4``) → a Mesh over the first devices; the sizes must multiply to ``devices``."""
        text = text.strip()
        pairs: list[tuple[str, int]] = []
        try:
            if "=" in text:
                for i, part in enumerate(text.split(",")):
                    name, _, size = part.partition("=")
                    pairs.append((name.strip() or AXIS_NAMES[i], int(size)))
            else:
                pairs = [(AXIS_NAMES[i], int(n)) for i, n in enumerate(re.split(r"[x×*,]", text))]
        except (ValueError, IndexError):
            raise OptionError(f"`--mesh`: expected sizes like `2x4` or `dp=2,tp=4`, got {text!r}") from None
        sizes = [n for _, n in pairs]
        if not pairs or len(pairs) > 3 or any(n < 1 for n in sizes):
            raise OptionError(f"`--mesh`: expected 1 to 3 positive axis sizes, got {text!r}")
        product = 1
        for n in sizes:
            product *= n
        if product != devices:
            raise OptionError(f"`--mesh` {text!r} has {product} devices, the machine has {devices}. Make them agree.")
        try:
            return cls(tuple(n for n, _ in pairs), tuple(sizes))
        except ValueError as exc:
            raise OptionError(f"`--mesh`: {exc}") from None

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def axis_size(self, axis: str) -> int:
        return self.sizes[self.axes.index(axis)]

    def coords(self, rank: int) -> tuple[int, ...]:
        out = []
        for n in reversed(self.sizes):
            out.append(rank % n)
            rank //= n
        return tuple(reversed(out))

    def rank_of(self, coords: tuple[int, ...]) -> int:
        rank = 0
        for c, n in zip(coords, self.sizes, strict=True):
            rank = rank * n + c
        return rank

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks that share every coordinate with ``rank`` except along ``axis``, in axis order."""
        i = self.axes.index(axis)
        stride = math.prod(self.sizes[i + 1 :])
        base = rank - self.coords(rank)[i] * stride
        return tuple(base + c * stride for c in range(self.sizes[i]))

    def group_matrix(self, axis: str) -> np.ndarray:
        """Every communication group along ``axis`` as one row of ranks (in axis order), rows in the order of
        their first rank: O(ranks) whatever the mesh, so 100k-device meshes stay cheap."""
        i = self.axes.index(axis)
        ranks = np.arange(self.size, dtype=np.int64).reshape(self.sizes)
        return np.moveaxis(ranks, i, -1).reshape(-1, self.sizes[i])

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every communication group along ``axis`` (a partition of all ranks), in the order of their first rank."""
        return [tuple(row) for row in self.group_matrix(axis).tolist()]

    def __str__(self) -> str:
        return " × ".join(f"{a}={n}" for a, n in zip(self.axes, self.sizes, strict=True))
