"""Element types of the tensor language: which dtypes each typed op accepts, which operands must share one, and
the dtype of its output (ONNX's type constraints, narrowed to what onnxruntime's CPU kernels implement).

One table serves the encoder and the verifier. The encoder types a node only when its tensors' dtypes are
ones this table allows (any other node stays opaque: nothing the verifier did not consider is rewritten), and
the verifier type-checks each rule's right-hand side against it for every dtype its left-hand side accepts
(verify/_types.py): a rewrite that is value-sound but builds a node onnxruntime refuses (a bool operand of
Mul, a float index of Gather) is refuted.

Dtypes are numpy names, as ``unity_eq.ir.TensorType.dtype`` spells them. Integer tensors get integer semantics
in the verifier (a truncating ``Div`` and ``ReduceMean``); overflow and wrap-around are not modelled, as
float rounding is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "INTEGER_DTYPES",
    "INTEGER_SENSITIVE",
    "OpTypes",
    "is_integer",
    "node_types_allowed",
    "onnx_dtype_name",
    "op_types",
]

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
SIGNED = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED = frozenset({"uint8", "uint16", "uint32", "uint64"})
INTEGER_DTYPES = SIGNED | UNSIGNED
NUMERIC = FLOAT_DTYPES | INTEGER_DTYPES
ALL_DTYPES = NUMERIC | {"bool"}

#: ops whose value on integer tensors is not their real value restricted to integers: the verifier checks a
#: rule that holds one of them on integer tensors again with integer semantics (truncating division)
INTEGER_SENSITIVE = frozenset({"Div", "ReduceMean"})

# TensorProto element types (onnx.TensorProto.DataType) by numpy name: what Cast's ``to`` names
_ONNX_CODES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
    "bfloat16": 16,
}
_BY_CODE = {code: name for name, code in _ONNX_CODES.items()}


def onnx_dtype_name(code: int) -> str | None:
    """The numpy name of an ONNX element type (Cast's ``to``), or None for one the language does not have."""
    return _BY_CODE.get(int(code))


def is_integer(dtype: str) -> bool:
    return dtype in INTEGER_DTYPES


@dataclass(frozen=True)
class OpTypes:
    """An op's type constraints. ``inputs``: the type variable of each tensor argument, by argument name (a
    ``TList``'s elements all take it); ``allowed``: the dtypes each type variable may be; ``output``: the
    output's type variable, a fixed dtype (``"=bool"``) or ``"=to"`` (Cast: the dtype its ``to`` names)."""

    inputs: Mapping[str, str]
    allowed: Mapping[str, frozenset[str]]
    output: str


def _same(args: tuple[str, ...], allowed: frozenset[str], output: str = "T") -> OpTypes:
    return OpTypes({a: "T" for a in args}, {"T": allowed}, output)


_MM_INTS = frozenset({"int32", "int64", "uint32", "uint64"})
_X = ("X",)
_AB = ("A", "B")

_TABLE: dict[str, OpTypes] = {
    # unary: ONNX's constraints, narrowed where onnxruntime has no kernel (Relu and LeakyRelu on integers)
    **{
        op: _same(_X, FLOAT_DTYPES)
        for op in (
            "Relu",
            "Sigmoid",
            "Tanh",
            "Exp",
            "Log",
            "Sqrt",
            "Reciprocal",
            "Softplus",
            "Softsign",
            "Floor",
            "Ceil",
            "Sin",
            "Cos",
            "Round",
            "HardSwish",
            "Mish",
            "LeakyRelu",
            "Elu",
            "Celu",
            "Selu",
            "ThresholdedRelu",
            "HardSigmoid",
            "Gelu",
        )
    },
    "Erf": _same(_X, FLOAT_DTYPES),
    "Neg": _same(_X, FLOAT_DTYPES | SIGNED),
    "Abs": _same(_X, NUMERIC),
    "Sign": _same(_X, NUMERIC),
    "Identity": _same(_X, ALL_DTYPES),
    "Not": _same(_X, frozenset({"bool"})),
    "IsNaN": OpTypes({"X": "T"}, {"T": FLOAT_DTYPES}, "=bool"),
    "Cast": OpTypes({"X": "T"}, {"T": ALL_DTYPES}, "=to"),
    # broadcasting
    **{op: _same(_AB, NUMERIC) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    "Pow": OpTypes({"A": "T", "B": "T1"}, {"T": FLOAT_DTYPES | {"int32", "int64"}, "T1": NUMERIC}, "T"),
    "Equal": OpTypes({"A": "T", "B": "T"}, {"T": ALL_DTYPES}, "=bool"),
    **{
        op: OpTypes({"A": "T", "B": "T"}, {"T": NUMERIC}, "=bool")
        for op in ("Less", "Greater", "LessOrEqual", "GreaterOrEqual")
    },
    **{op: _same(_AB, frozenset({"bool"})) for op in ("And", "Or", "Xor")},
    "PRelu": _same(_AB, FLOAT_DTYPES),
    "Where": OpTypes({"condition": "B", "X": "T", "Y": "T"}, {"B": frozenset({"bool"}), "T": ALL_DTYPES}, "T"),
    "Clip": _same(("input", "min", "max"), NUMERIC),
    # MatMul on integers: ONNX's int32/int64/uint32/uint64; Gemm: floats only (onnxruntime has no integer Gemm)
    "MatMul": _same(_AB, FLOAT_DTYPES | _MM_INTS),
    "Gemm": _same(("A", "B", "C"), FLOAT_DTYPES),
    "Softmax": _same(_X, FLOAT_DTYPES),
    "LogSoftmax": _same(_X, FLOAT_DTYPES),
    "LayerNormalization": _same(("X", "Scale", "B"), FLOAT_DTYPES),
    "BatchNormalization": OpTypes(
        {"X": "T", "scale": "T1", "B": "T1", "input_mean": "T2", "input_var": "T2"},
        {"T": FLOAT_DTYPES, "T1": FLOAT_DTYPES, "T2": FLOAT_DTYPES},
        "T",
    ),
    "LRN": _same(_X, FLOAT_DTYPES),
    "Conv": _same(("X", "W", "B"), FLOAT_DTYPES),
    "MaxPool": _same(_X, FLOAT_DTYPES | {"int8", "uint8"}),
    "AveragePool": _same(_X, FLOAT_DTYPES),
    "GlobalAveragePool": _same(_X, FLOAT_DTYPES),
    "GlobalMaxPool": _same(_X, FLOAT_DTYPES),
    # data movement: every dtype
    **{op: _same(("data",), ALL_DTYPES) for op in ("Reshape", "Squeeze", "Unsqueeze", "Transpose", "Slice")},
    "Flatten": _same(_X, ALL_DTYPES),
    "Concat": _same(("inputs",), ALL_DTYPES),
    "Split": _same(("input",), ALL_DTYPES),
    "Expand": _same(("input",), ALL_DTYPES),
    "Gather": OpTypes({"data": "T", "indices": "Tind"}, {"T": ALL_DTYPES, "Tind": frozenset({"int32", "int64"})}, "T"),
    **{op: _same(("data",), FLOAT_DTYPES | _MM_INTS) for op in ("ReduceSum", "ReduceMean")},
    **{op: _same(("data",), NUMERIC) for op in ("ReduceMax", "ReduceMin")},
    # the plug-in ops/attention.py (here, not its `types` hook: that module would import this one, which the
    # registry's import of it makes a cycle): floats only (softmax), every tensor of one dtype
    "Attention": _same(("Q", "KT", "V", "mask", "fill"), FLOAT_DTYPES),
}


def op_types(op: str) -> OpTypes | None:
    """The type constraints of a typed op (None for an op of a plug-in family that states none: the verifier
    then lets every operand be any dtype, and the output its first operand's)."""
    got = _TABLE.get(op)
    if got is not None:
        return got
    from unity_eq.ops.registry import family_for  # the registry imports the families, which import this

    family = family_for(op)
    return family.types(op) if family is not None and family.types is not None else None


def node_types_allowed(op: str, dtypes: Mapping[str, str | None]) -> bool:
    """Whether a node's operand dtypes (by argument name; None for an absent optional input or an unknown
    dtype) are ones the table allows, with the operands of one type variable sharing a dtype. A node that
    fails is carried opaquely: its types were never considered by the verifier."""
    types = op_types(op)
    if types is None:
        return True
    bound: dict[str, str] = {}
    for arg, dtype in dtypes.items():
        var = types.inputs.get(arg)
        if var is None or dtype is None:
            continue
        if dtype not in types.allowed[var] or bound.setdefault(var, dtype) != dtype:
            return False
    return True
