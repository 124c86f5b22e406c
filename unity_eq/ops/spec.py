"""The value types of the tensor language: op families, constructor arguments and op specs.

Bottom of the ops package: no other module of unity_eq is imported here, so every stage can name these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Arg",
    "Family",
    "OpSpec",
    "float_attr",
    "int_attr",
    "ints_attr",
    "static",
    "str_attr",
    "tensor",
]


class Family(Enum):
    """How an operator's outputs relate to its inputs, which decides how it may be sharded and costed.

    The order is the language's: ``rules/schema.egg`` declares the constructors kind by kind in this order."""

    UNARY = "unary"  # elementwise, one tensor input
    BROADCAST = "broadcast"  # elementwise over several numpy-broadcast inputs
    MATMUL = "matmul"
    GEMM = "gemm"
    SOFTMAX = "softmax"  # normalizes along `axis`
    LAYERNORM = "layernorm"  # normalizes along dims >= `axis`
    CONV = "conv"
    POOL = "pool"  # windowed per (batch, channel)
    LRN = "lrn"  # windowed across channels
    BATCHNORM = "batchnorm"
    RESHAPE = "reshape"  # Reshape, Flatten, Squeeze, Unsqueeze: data moves as in memory order
    TRANSPOSE = "transpose"
    CONCAT = "concat"
    SPLIT = "split"
    SLICE = "slice"
    EXPAND = "expand"
    GATHER = "gather"
    REDUCE = "reduce"
    PLUGIN = "plugin"  # a family of its own module (unity_eq/ops/registry.py): its hooks say what it does


@dataclass(frozen=True)
class Arg:
    """One constructor argument.

    ``kind`` is ``input`` (from the ONNX node's inputs, by position) or ``attr`` (from its attributes);
    ``sort`` is the egglog sort: ``T``, ``TList``, ``IVec``, ``i64``, ``f64`` or ``String``.
    ``default`` is used when the ONNX node leaves the value out (``None``: required, or filled by the frontend).
    """

    name: str
    sort: str
    kind: str = "attr"
    default: object = None
    optional: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: Family
    args: tuple[Arg, ...]
    multi_output: bool = False  # every output is its own term, with the output index as last argument
    linear: bool = False  # f(sum of pieces) == sum of f(pieces): Partial passes through
    # a multi-output op's argument that lists the sizes of its outputs, one per output (Split's ``split``)
    output_sizes: str | None = None
    # pure data layout (no arithmetic: reshape, transpose, concat, split): over weights alone it is evaluated
    # once when the plan is lowered (an initializer), so extraction prices it at nothing
    foldable: bool = False

    @property
    def tensor_args(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.args) if a.sort in ("T", "TList"))

    def arg_index(self, name: str) -> int:
        """The position of argument ``name`` among the constructor's arguments (an e-node's ``args``)."""
        return next(i for i, a in enumerate(self.args) if a.name == name)

    def input_index(self, name: str) -> int:
        """The position of input argument ``name`` among the ONNX node's inputs (a plan step's ``inputs``)."""
        return [a.name for a in self.args if a.kind == "input"].index(name)

    def output_sizes_in(self, args: Sequence[object]) -> Sequence[int] | None:
        """The sizes of the outputs as an instance's constructor arguments ``args`` list them (as many as it
        has outputs; empty when the argument was left out); None for an op without such an argument."""
        if self.output_sizes is None:
            return None
        sizes = args[self.arg_index(self.output_sizes)]
        assert isinstance(sizes, Sequence)
        return sizes

    def egg_sorts(self) -> list[str]:
        sorts = [a.sort for a in self.args]
        if self.multi_output:
            sorts.append("i64")
        return sorts


def tensor(name: str, optional: bool = False) -> Arg:
    return Arg(name, "T", "input", optional=optional)


def static(name: str, optional: bool = False) -> Arg:
    return Arg(name, "IVec", "input", default=(), optional=optional)


def int_attr(name: str, default: object = None) -> Arg:
    return Arg(name, "i64", "attr", default)


def float_attr(name: str, default: object = None) -> Arg:
    return Arg(name, "f64", "attr", default)


def str_attr(name: str, default: object = None) -> Arg:
    return Arg(name, "String", "attr", default)


def ints_attr(name: str) -> Arg:
    return Arg(name, "IVec", "attr", default=())
