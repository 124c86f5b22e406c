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
(negative axes, ``-1`` in Reshape shapes, default kernel shapes) so that equal computations are equal terms:
each family's ``normalize`` (unity_eq/egraph/typed_nodes.py calls it).

Every other operator is carried opaquely as ``(Opaque "OpType" "key" inputs index)`` and stays replicated.

``rules/schema.egg`` is generated from the registry: run ``python -m unity_eq.ops`` after changing it (a test
checks the file is current).

==============  ================================================================================================
module          what it holds
==============  ================================================================================================
spec            ``Family``, ``Arg``, ``OpSpec``: the value types
family          ``OpFamily`` (every hook the stages call), ``OpCase``, ``NodeView``, ``ShapeError``
tensors, cases  what the families' semantics and instance generators share
registry        every family: ``FAMILIES``, ``OPS``, ``family_for``, ``spec_for``, ``rule_file_for``
schema          rendering rules/schema.egg and the generated elementwise rules
elementwise     the unary and broadcast ops (Relu … Cast, Add … Clip); their axioms in elementwise_axioms
matmul          MatMul, Gemm
normalization   Softmax, LogSoftmax, LayerNormalization
conv            Conv
pooling         MaxPool, AveragePool, the global poolings
channel_norm    LRN, BatchNormalization
reshape         Flatten, Reshape, Squeeze, Unsqueeze, Transpose, Expand
slicing         Concat, Split, Slice, Gather; their axioms in slicing_axioms
reduce          ReduceSum, ReduceMean, ReduceMax, ReduceMin
space_to_depth  SpaceToDepth, the family added as a plug-in (docs/architecture.md)
==============  ================================================================================================
"""

from __future__ import annotations

from unity_eq.ops.family import OpFamily
from unity_eq.ops.registry import FAMILIES, OPS, PLUGINS, family_for, plugin_for, rule_file_for, spec_for
from unity_eq.ops.schema import generated_files, main, render_elementwise_rules, render_schema
from unity_eq.ops.spec import Arg, Family, OpSpec

__all__ = [
    "FAMILIES",
    "OPS",
    "PLUGINS",
    "Arg",
    "Family",
    "OpFamily",
    "OpSpec",
    "family_for",
    "generated_files",
    "main",
    "plugin_for",
    "render_elementwise_rules",
    "render_schema",
    "rule_file_for",
    "spec_for",
]
