"""The tensor language: which ONNX operators are typed constructors, and how their arguments are laid out.

Every ONNX operator maps to an egglog constructor. The operators listed here are *typed*: the constructor is
named after the ONNX op and takes its arguments in a fixed order:

1. the ONNX inputs in ONNX order: tensors are terms of sort ``T`` (an absent optional input is ``(NoneT)``),
   inputs that must be constant integer lists (Reshape's ``shape``, Slice's ``starts``…) are ``IVec`` literals,
   and variadic inputs (Concat) are one ``TList``;
2. then every attribute of the spec, in the order listed, with its default filled in;
3. then, for operators with several outputs (Split), the output index.

So ``(MatMul a b)`` is ONNX MatMul, ``(Softmax x 2)`` is Softmax with ``axis=2`` and
``(Gemm a b c 1.0 1.0 0 1)`` is Gemm with ``transB=1``. The frontend normalizes what ONNX leaves implicit
(negative axes, ``-1`` in Reshape shapes, default kernel shapes) so that equal computations are equal terms.

Every other operator is carried opaquely as ``(Opaque "OpType" "key" inputs index)`` and stays replicated.

``rules/schema.egg`` is generated from this table: run ``python -m unity_eq.ops`` after changing it (a test
checks the file is current).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

__all__ = ["OPS", "Arg", "Family", "OpSpec", "render_schema", "spec_for"]


class Family(Enum):
    """How an operator's outputs relate to its inputs, which decides how it may be sharded and costed."""

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
    REDUCE = "reduce"
    GATHER = "gather"
    EXPAND = "expand"


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

    @property
    def tensor_args(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.args) if a.sort in ("T", "TList"))

    def egg_sorts(self) -> list[str]:
        sorts = [a.sort for a in self.args]
        if self.multi_output:
            sorts.append("i64")
        return sorts


def _t(name: str, optional: bool = False) -> Arg:
    return Arg(name, "T", "input", optional=optional)


def _static(name: str, optional: bool = False) -> Arg:
    return Arg(name, "IVec", "input", default=(), optional=optional)


def _i(name: str, default: object = None) -> Arg:
    return Arg(name, "i64", "attr", default)


def _f(name: str, default: object = None) -> Arg:
    return Arg(name, "f64", "attr", default)


def _s(name: str, default: object = None) -> Arg:
    return Arg(name, "String", "attr", default)


def _ints(name: str) -> Arg:
    return Arg(name, "IVec", "attr", default=())


def _specs() -> list[OpSpec]:
    U, B = Family.UNARY, Family.BROADCAST
    x = _t("X")
    specs: list[OpSpec] = []
    linear_unary = {"Neg", "Identity"}
    for name in [
        "Relu",
        "Sigmoid",
        "Tanh",
        "Exp",
        "Log",
        "Neg",
        "Sqrt",
        "Reciprocal",
        "Erf",
        "Abs",
        "Identity",
        "Softplus",
        "Softsign",
        "Floor",
        "Ceil",
        "Sin",
        "Cos",
        "Not",
        "Sign",
        "Round",
        "IsNaN",
        "HardSwish",
        "Mish",
    ]:
        specs.append(OpSpec(name, U, (x,), linear=name in linear_unary))
    specs += [
        OpSpec("LeakyRelu", U, (x, _f("alpha", 0.01))),
        OpSpec("Elu", U, (x, _f("alpha", 1.0))),
        OpSpec("Celu", U, (x, _f("alpha", 1.0))),
        OpSpec("Selu", U, (x, _f("alpha", 1.6732632423543772), _f("gamma", 1.0507009873554805))),
        OpSpec("ThresholdedRelu", U, (x, _f("alpha", 1.0))),
        OpSpec("HardSigmoid", U, (x, _f("alpha", 0.2), _f("beta", 0.5))),
        OpSpec("Gelu", U, (x, _s("approximate", "none"))),
        OpSpec("Cast", U, (x, _i("saturate", 1), _i("to"))),
    ]
    a, b = _t("A"), _t("B")
    for name in [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Max",
        "Min",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "PRelu",
    ]:
        specs.append(OpSpec(name, B, (a, b), linear=name in ("Add", "Sub")))
    specs += [
        OpSpec("Where", B, (_t("condition"), _t("X"), _t("Y"))),
        OpSpec("Clip", B, (_t("input"), _t("min", True), _t("max", True))),
        OpSpec("MatMul", Family.MATMUL, (a, b)),
        OpSpec(
            "Gemm",
            Family.GEMM,
            (a, b, _t("C", True), _f("alpha", 1.0), _f("beta", 1.0), _i("transA", 0), _i("transB", 0)),
        ),
        OpSpec("Softmax", Family.SOFTMAX, (x, _i("axis", -1))),
        OpSpec("LogSoftmax", Family.SOFTMAX, (x, _i("axis", -1))),
        OpSpec(
            "LayerNormalization",
            Family.LAYERNORM,
            (x, _t("Scale"), _t("B", True), _i("axis", -1), _f("epsilon", 1e-5), _i("stash_type", 1)),
        ),
        OpSpec(
            "Conv",
            Family.CONV,
            (
                x,
                _t("W"),
                _t("B", True),
                _s("auto_pad", "NOTSET"),
                _ints("dilations"),
                _i("group", 1),
                _ints("kernel_shape"),
                _ints("pads"),
                _ints("strides"),
            ),
        ),
        OpSpec(
            "MaxPool",
            Family.POOL,
            (
                x,
                _s("auto_pad", "NOTSET"),
                _i("ceil_mode", 0),
                _ints("dilations"),
                _ints("kernel_shape"),
                _ints("pads"),
                _i("storage_order", 0),
                _ints("strides"),
            ),
        ),
        OpSpec(
            "AveragePool",
            Family.POOL,
            (
                x,
                _s("auto_pad", "NOTSET"),
                _i("ceil_mode", 0),
                _i("count_include_pad", 0),
                _ints("dilations"),
                _ints("kernel_shape"),
                _ints("pads"),
                _ints("strides"),
            ),
        ),
        OpSpec("GlobalAveragePool", Family.POOL, (x,)),
        OpSpec("GlobalMaxPool", Family.POOL, (x,)),
        OpSpec("LRN", Family.LRN, (x, _f("alpha", 0.0001), _f("beta", 0.75), _f("bias", 1.0), _i("size"))),
        OpSpec(
            "BatchNormalization",
            Family.BATCHNORM,
            (
                x,
                _t("scale"),
                _t("B"),
                _t("input_mean"),
                _t("input_var"),
                _f("epsilon", 1e-5),
                _f("momentum", 0.9),
                _i("training_mode", 0),
            ),
        ),
        OpSpec("Flatten", Family.RESHAPE, (x, _i("axis", 1))),
        OpSpec("Reshape", Family.RESHAPE, (_t("data"), _static("shape"), _i("allowzero", 0))),
        OpSpec("Squeeze", Family.RESHAPE, (_t("data"), _static("axes", True))),
        OpSpec("Unsqueeze", Family.RESHAPE, (_t("data"), _static("axes"))),
        OpSpec("Transpose", Family.TRANSPOSE, (_t("data"), _ints("perm"))),
        OpSpec("Concat", Family.CONCAT, (Arg("inputs", "TList", "input"), _i("axis"))),
        OpSpec("Split", Family.SPLIT, (_t("input"), _static("split", True), _i("axis", 0)), multi_output=True),
        OpSpec(
            "Slice",
            Family.SLICE,
            (_t("data"), _static("starts"), _static("ends"), _static("axes", True), _static("steps", True)),
        ),
        OpSpec("Expand", Family.EXPAND, (_t("input"), _static("shape"))),
        OpSpec("Gather", Family.GATHER, (_t("data"), _t("indices"), _i("axis", 0))),
    ]
    for name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        specs.append(
            OpSpec(
                name,
                Family.REDUCE,
                (_t("data"), _static("axes", True), _i("keepdims", 1), _i("noop_with_empty_axes", 0)),
                linear=name == "ReduceSum",
            )
        )
    return specs


OPS: dict[str, OpSpec] = {s.name: s for s in _specs()}


def spec_for(op_type: str, domain: str = "") -> OpSpec | None:
    """The typed spec of an ONNX op, or None when it is carried opaquely."""
    if domain not in ("", "ai.onnx"):
        return None
    return OPS.get(op_type)


_SCHEMA_HEADER = """\
; The tensor language of unity-eq. GENERATED by `python -m unity_eq.ops` from unity_eq/ops.py: do not edit.
;
; A term of sort T denotes one tensor value distributed over the device mesh. Constructors named after ONNX
; ops take the ONNX inputs in ONNX order, then the attributes in the order of unity_eq/ops.py (see the
; comment on each line), then, for multi-output ops, the output index.

(sort IVec (Vec i64))

; How a tensor is laid out on one mesh axis: Replicate, Replicate made for sharded consumers (its gradient
; is all-reduced in training), Partial (pending sum), Shard along a dimension.
(datatype Pl (R) (D) (P) (S i64))

(datatype*
  (T
    (Input String)                       ; a model input, by name
    (Weight String)                      ; an initializer, by name
    (NoneT)                              ; an absent optional input
    (Tensor i64)                         ; names an original tensor in the encoding; never extracted
    (Opaque String String TList i64)     ; any other op: op type, node key, inputs, output index
    ; Parallel ops (DESIGN.md): each names a mesh axis.
    (Partition T i64 String)             ; Replicate -> Shard(dim): local slice
    (Combine T i64 String)               ; Shard(dim) -> Replicate: all-gather
    (Replicate T String)                 ; Replicate -> Replicate for sharded use (gradient all-reduce)
    (Reduce T String)                    ; Partial -> Replicate: all-reduce
"""

_SCHEMA_FOOTER = """\
  )
  (TList
    (TNil)
    (TCons T TList)
    (PList TList i64 String)))           ; every element partitioned (see analysis.egg)
"""


def render_schema(ops: Iterable[OpSpec] | None = None) -> str:
    """Render ``rules/schema.egg``: the sorts and every constructor of the language."""
    lines = [_SCHEMA_HEADER]
    for spec in ops or OPS.values():
        sig = " ".join(spec.egg_sorts())
        names = ", ".join(a.name for a in spec.args) + (", index" if spec.multi_output else "")
        lines.append(f"    ({spec.name} {sig}){' ' * max(1, 40 - len(spec.name) - len(sig) - 2)}; {names}\n")
    lines.append(_SCHEMA_FOOTER)
    return "".join(lines)


def _arg_vars(spec: OpSpec) -> list[str]:
    """Pattern variable names for a constructor's arguments: tensors a, b, c…; attributes by name."""
    tensor_names = iter("abcdefgh")
    out = []
    for arg in spec.args:
        if arg.sort == "T":
            out.append(next(tensor_names))
        else:
            out.append(arg.name.lower().replace("_", "-"))
    if spec.multi_output:
        out.append("index")
    return out


def _term(spec: OpSpec, args: list[str]) -> str:
    return f"({spec.name} {' '.join(args)})"


def _rule_name(spec: OpSpec, suffix: str) -> str:
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", spec.name).lower()
    return f"{kebab}-{suffix}"


def render_elementwise_rules(ops: Iterable[OpSpec] | None = None) -> str:
    """Render ``rules/parallel/elementwise.egg``: split rules for every unary and broadcast op.

    Unary ops split along any dimension. A broadcast op splits along an output dimension: each operand that
    has that dimension at full size is partitioned along it, and each operand broadcast along it is
    replicated. Every non-empty subset of partitioned operands gets a rule, so scalars and biases work.
    """
    out = [
        "; Split rules for elementwise ops. GENERATED by `python -m unity_eq.ops` from unity_eq/ops.py: do not\n"
        "; edit. Each rule rewrites a replicated op into the same op on shards, gathered back (Combine), so the\n"
        "; e-class keeps its placement; cancellation (redistribute.egg) then chains shards across ops.\n\n"
    ]
    for spec in ops or OPS.values():
        if spec.family is Family.UNARY:
            names = _arg_vars(spec)
            lhs = _term(spec, names)
            core = _term(spec, ["(Partition a d ax)", *names[1:]])
            out.append(
                f"(rewrite {lhs}\n         (Combine {core} d ax)\n"
                f'         :when ((can-split a d ax)) :ruleset parallel :name "{_rule_name(spec, "split")}")\n'
            )
        elif spec.family is Family.BROADCAST:
            names = _arg_vars(spec)
            lhs = _term(spec, names)
            tensors = [n for n, a in zip(names, spec.args, strict=False) if a.sort == "T"]
            operands = " ".join(f"(bcast-operand e {t})" for t in tensors)
            out.append(f"(rule ((= e {lhs})) ({operands}) :ruleset analysis)\n")
            for mask in range(1, 2 ** len(tensors)):
                split = [t for i, t in enumerate(tensors) if mask >> i & 1]
                args, guards = [], []
                for name in names:
                    if name in split:
                        args.append(f"(Partition {name} d{name} ax)")
                        guards.append(f"(bc-dim {name} {lhs} d d{name}) (can-split {name} d{name} ax)")
                    elif name in tensors:
                        args.append(f"(Replicate {name} ax)")
                        guards.append(f"(bc-bcast {name} {lhs} d) (placed {name} ax (R))")
                    else:
                        args.append(name)
                suffix = "split-" + "".join(split)
                out.append(
                    f"(rewrite {lhs}\n         (Combine {_term(spec, args)} d ax)\n"
                    f"         :when ({' '.join(guards)})\n"
                    f'         :ruleset parallel :name "{_rule_name(spec, suffix)}")\n'
                )
        if spec.family in (Family.UNARY, Family.BROADCAST):
            out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def generated_files() -> dict[Path, str]:
    """Every checked-in file generated from this table, with its expected content."""
    from unity_eq.rulesets import rules_dir

    root = rules_dir()
    return {
        root / "schema.egg": render_schema(),
        root / "parallel" / "elementwise.egg": render_elementwise_rules(),
    }


def main(argv: list[str] | None = None) -> int:
    """Regenerate the generated rule files (``--check`` only compares and exits 1 when stale)."""
    argv = sys.argv[1:] if argv is None else argv
    stale = 0
    for path, text in generated_files().items():
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if "--check" in argv:
            print(f"{path} is out of date: run `python -m unity_eq.ops`", file=sys.stderr)
            stale += 1
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
