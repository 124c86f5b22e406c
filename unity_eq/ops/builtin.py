"""The built-in op families: every ONNX operator with a typed constructor that ships with unity-eq.

Their shape inference and semantics for the verifier live in verify/_tensor.py, their instance generators in
verify/_gen.py and their FLOPs in unity_eq/cost.py, keyed by :class:`~unity_eq.ops.spec.Family`; a family
added as a plug-in keeps all of that in its own module instead (unity_eq/ops/registry.py, docs/architecture.md).
"""

from __future__ import annotations

from unity_eq.ops.spec import Arg, Family, OpSpec, int_attr, ints_attr, static, tensor

__all__ = ["BUILTIN_RULE_FILES", "builtin_specs"]

#: Where the parallel rules of each built-in family are (``explain`` names the file to extend).
BUILTIN_RULE_FILES: dict[Family, str] = {}


def builtin_specs() -> list[OpSpec]:
    x = tensor("X")
    specs: list[OpSpec] = [
        OpSpec("Flatten", Family.RESHAPE, (x, int_attr("axis", 1))),
        OpSpec("Reshape", Family.RESHAPE, (tensor("data"), static("shape"), int_attr("allowzero", 0))),
        OpSpec("Squeeze", Family.RESHAPE, (tensor("data"), static("axes", True))),
        OpSpec("Unsqueeze", Family.RESHAPE, (tensor("data"), static("axes"))),
        OpSpec("Transpose", Family.TRANSPOSE, (tensor("data"), ints_attr("perm"))),
        OpSpec("Concat", Family.CONCAT, (Arg("inputs", "TList", "input"), int_attr("axis"))),
        OpSpec("Split", Family.SPLIT, (tensor("input"), static("split", True), int_attr("axis", 0)), multi_output=True),
        OpSpec(
            "Slice",
            Family.SLICE,
            (tensor("data"), static("starts"), static("ends"), static("axes", True), static("steps", True)),
        ),
        OpSpec("Expand", Family.EXPAND, (tensor("input"), static("shape"))),
        OpSpec("Gather", Family.GATHER, (tensor("data"), tensor("indices"), int_attr("axis", 0))),
    ]
    return specs
