"""The built-in op families: every ONNX operator with a typed constructor that ships with unity-eq.

Their shape inference and semantics for the verifier live in verify/_tensor.py, their instance generators in
verify/_gen.py and their FLOPs in unity_eq/cost.py, keyed by :class:`~unity_eq.ops.spec.Family`; a family
added as a plug-in keeps all of that in its own module instead (unity_eq/ops/registry.py, docs/architecture.md).
"""

from __future__ import annotations

from unity_eq.ops.spec import Arg, Family, OpSpec, float_attr, int_attr, ints_attr, static, str_attr, tensor

__all__ = ["BUILTIN_RULE_FILES", "builtin_specs"]

#: Where the parallel rules of each built-in family are (``explain`` names the file to extend).
BUILTIN_RULE_FILES = {
    Family.UNARY: "rules/parallel/elementwise.egg",
    Family.BROADCAST: "rules/parallel/elementwise.egg",
    Family.MATMUL: "rules/parallel/matmul.egg",
    Family.GEMM: "rules/parallel/matmul.egg",
    Family.CONV: "rules/parallel/conv.egg",
    Family.POOL: "rules/parallel/conv.egg",
    Family.LRN: "rules/parallel/conv.egg",
    Family.BATCHNORM: "rules/parallel/conv.egg",
}


def builtin_specs() -> list[OpSpec]:
    U, B = Family.UNARY, Family.BROADCAST
    x = tensor("X")
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
        OpSpec("LeakyRelu", U, (x, float_attr("alpha", 0.01))),
        OpSpec("Elu", U, (x, float_attr("alpha", 1.0))),
        OpSpec("Celu", U, (x, float_attr("alpha", 1.0))),
        OpSpec("Selu", U, (x, float_attr("alpha", 1.6732632423543772), float_attr("gamma", 1.0507009873554805))),
        OpSpec("ThresholdedRelu", U, (x, float_attr("alpha", 1.0))),
        OpSpec("HardSigmoid", U, (x, float_attr("alpha", 0.2), float_attr("beta", 0.5))),
        OpSpec("Gelu", U, (x, str_attr("approximate", "none"))),
        OpSpec("Cast", U, (x, int_attr("saturate", 1), int_attr("to"))),
    ]
    a, b = tensor("A"), tensor("B")
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
        OpSpec("Where", B, (tensor("condition"), tensor("X"), tensor("Y"))),
        OpSpec("Clip", B, (tensor("input"), tensor("min", True), tensor("max", True))),
        OpSpec("MatMul", Family.MATMUL, (a, b)),
        OpSpec(
            "Gemm",
            Family.GEMM,
            (
                a,
                b,
                tensor("C", True),
                float_attr("alpha", 1.0),
                float_attr("beta", 1.0),
                int_attr("transA", 0),
                int_attr("transB", 0),
            ),
        ),
        OpSpec("Softmax", Family.SOFTMAX, (x, int_attr("axis", -1))),
        OpSpec("LogSoftmax", Family.SOFTMAX, (x, int_attr("axis", -1))),
        OpSpec(
            "LayerNormalization",
            Family.LAYERNORM,
            (
                x,
                tensor("Scale"),
                tensor("B", True),
                int_attr("axis", -1),
                float_attr("epsilon", 1e-5),
                int_attr("stash_type", 1),
            ),
        ),
        OpSpec(
            "Conv",
            Family.CONV,
            (
                x,
                tensor("W"),
                tensor("B", True),
                str_attr("auto_pad", "NOTSET"),
                ints_attr("dilations"),
                int_attr("group", 1),
                ints_attr("kernel_shape"),
                ints_attr("pads"),
                ints_attr("strides"),
            ),
        ),
        OpSpec(
            "MaxPool",
            Family.POOL,
            (
                x,
                str_attr("auto_pad", "NOTSET"),
                int_attr("ceil_mode", 0),
                ints_attr("dilations"),
                ints_attr("kernel_shape"),
                ints_attr("pads"),
                int_attr("storage_order", 0),
                ints_attr("strides"),
            ),
        ),
        OpSpec(
            "AveragePool",
            Family.POOL,
            (
                x,
                str_attr("auto_pad", "NOTSET"),
                int_attr("ceil_mode", 0),
                int_attr("count_include_pad", 0),
                ints_attr("dilations"),
                ints_attr("kernel_shape"),
                ints_attr("pads"),
                ints_attr("strides"),
            ),
        ),
        OpSpec("GlobalAveragePool", Family.POOL, (x,)),
        OpSpec("GlobalMaxPool", Family.POOL, (x,)),
        OpSpec(
            "LRN",
            Family.LRN,
            (x, float_attr("alpha", 0.0001), float_attr("beta", 0.75), float_attr("bias", 1.0), int_attr("size")),
        ),
        OpSpec(
            "BatchNormalization",
            Family.BATCHNORM,
            (
                x,
                tensor("scale"),
                tensor("B"),
                tensor("input_mean"),
                tensor("input_var"),
                float_attr("epsilon", 1e-5),
                float_attr("momentum", 0.9),
                int_attr("training_mode", 0),
            ),
        ),
        OpSpec("Flatten", Family.RESHAPE, (x, int_attr("axis", 1)), foldable=True),
        OpSpec("Reshape", Family.RESHAPE, (tensor("data"), static("shape"), int_attr("allowzero", 0)), foldable=True),
        OpSpec("Squeeze", Family.RESHAPE, (tensor("data"), static("axes", True)), foldable=True),
        OpSpec("Unsqueeze", Family.RESHAPE, (tensor("data"), static("axes")), foldable=True),
        OpSpec("Transpose", Family.TRANSPOSE, (tensor("data"), ints_attr("perm")), foldable=True),
        OpSpec("Concat", Family.CONCAT, (Arg("inputs", "TList", "input"), int_attr("axis")), foldable=True),
        OpSpec(
            "Split",
            Family.SPLIT,
            (tensor("input"), static("split", True), int_attr("axis", 0)),
            multi_output=True,
            output_sizes="split",
            foldable=True,
        ),
        OpSpec(
            "Slice",
            Family.SLICE,
            (tensor("data"), static("starts"), static("ends"), static("axes", True), static("steps", True)),
        ),
        OpSpec("Expand", Family.EXPAND, (tensor("input"), static("shape"))),
        OpSpec("Gather", Family.GATHER, (tensor("data"), tensor("indices"), int_attr("axis", 0))),
    ]
    for name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        specs.append(
            OpSpec(
                name,
                Family.REDUCE,
                (tensor("data"), static("axes", True), int_attr("keepdims", 1), int_attr("noop_with_empty_axes", 0)),
                linear=name == "ReduceSum",
            )
        )
    return specs
