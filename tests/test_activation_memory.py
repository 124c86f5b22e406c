"""Training memory keeps what each op's backward pass needs (unity_eq/memory.py, the families' ``saved`` hooks):
real saturation and extraction on one device, figures derived by hand from the rule.

The rule, per op: MatMul keeps both operands (a weight's bytes are the weights'), Gelu its input, Relu and
Softmax their output, LayerNormalization its input; Add keeps nothing; Reshape and Transpose are views of their
input; the plan's output is kept (the loss reads it). A storage counts once however many ops keep it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
from blocks import transformer_graph

from unity_eq import optimize
from unity_eq.ir import Graph, Node, TensorType
from unity_eq.machine import Machine, machine_from_toml, presets_dir
from unity_eq.memory import plan_memory
from unity_eq.ops import registry
from unity_eq.ops.spec import OpSpec
from unity_eq.plan import Compute
from unity_eq.rulefile.manifest import default_rule_files


def _one_h100() -> Machine:
    data = tomllib.loads((presets_dir() / "h100x8.toml").read_text())
    data["nodes"][0]["devices"] = {"H100-SXM-80G": 1}
    return machine_from_toml(data, "h100x1")


def _activations(graph: Graph, rule_files: list[Path] | None = None) -> float:
    plan = optimize(graph, machine=_one_h100(), mesh="1", objective="training", rule_files=rule_files).plan
    return plan_memory(plan).activations


def _plan_ops(graph: Graph, rule_files: list[Path] | None = None) -> set[str]:
    plan = optimize(graph, machine=_one_h100(), mesh="1", objective="training", rule_files=rule_files).plan
    return {step.op_type for step in plan.steps if isinstance(step, Compute)}


def _rules_without_attention_fusion() -> list[Path]:
    """The default manifest less the attention rules (rules/algebra/attention.egg and attention_exports.egg):
    the layer stays the eager composition."""
    return [p for p in default_rule_files() if p.name not in ("attention.egg", "attention_exports.egg")]


def _input_names(spec: OpSpec) -> list[str]:
    return [arg.name for arg in spec.args if arg.kind == "input"]


@pytest.mark.parametrize("op", sorted(registry.OPS))
def test_every_typed_op_says_what_its_backward_keeps(op: str) -> None:
    """Registry-wide, like test_engine's checks: a family without ``saved`` would leave its ops at the
    conservative guess (every input kept) silently; the names must be the op's own input arguments."""
    family, spec = registry.family_for(op), registry.OPS[op]
    assert family is not None and family.saved is not None, f"op family of {op} has no `saved` hook"
    saved = family.saved(op)
    inputs = _input_names(spec)
    assert set(saved.inputs) <= set(inputs), (op, saved.inputs, inputs)
    assert saved.view is None or saved.view in inputs, (op, saved.view)
    assert not (saved.view and (saved.inputs or saved.output)), f"{op}: a view keeps nothing of its own"
    has_list = any(arg.sort == "TList" for arg in spec.args)
    assert not (has_list and saved.inputs), f"{op}: inputs after a TList have no fixed position in a plan step"


def _view_chain() -> Graph:
    """X[64, 32] → MatMul(X, W) → Add(bias) → Reshape [8, 8, 32] → Transpose → Mul(t, t) → Y: X is kept (the
    MatMul's activation operand), the Add's output once (the Mul keeps its input twice, and it is a view of the
    Add's output), Y as the output; the MatMul's output (only the Add reads it) is not."""
    t = lambda *s: TensorType(tuple(s), "float32")  # noqa: E731
    return Graph(
        "view-chain",
        {"X": t(64, 32)},
        ["Y"],
        [
            Node("mm", "MatMul", ("X", "W"), ("h",)),
            Node("bias", "Add", ("h", "b"), ("z",)),
            Node("split", "Reshape", ("z", "shape"), ("r",)),
            Node("swap", "Transpose", ("r",), ("p",), {"perm": [1, 0, 2]}),
            Node("square", "Mul", ("p", "p"), ("Y",)),
        ],
        {
            "W": np.zeros((32, 32), np.float32),
            "b": np.zeros((32,), np.float32),
            "shape": np.array([8, 8, 32], np.int64),
        },
        {
            "X": t(64, 32),
            "W": t(32, 32),
            "b": t(32),
            "shape": TensorType((3,), "int64"),
            "h": t(64, 32),
            "z": t(64, 32),
            "r": t(8, 8, 32),
            "p": t(8, 8, 32),
            "Y": t(8, 8, 32),
        },
        18,
    )


def test_a_kept_tensor_counts_once_and_views_and_adds_not_at_all() -> None:
    tensor = 64 * 32 * 4  # every activation of the chain has 2,048 float32 elements
    assert _activations(_view_chain()) == 3 * tensor  # X, z (kept by Mul through two views, twice), Y


@pytest.mark.parametrize(
    ("activation", "mlp"),
    [("Gelu", 20), ("Relu", 12)],
    ids=["gelu", "relu"],
)
def test_a_transformer_layer_keeps_what_megatron_counts_less_dropout(activation: str, mlp: int) -> None:
    """One pre-LN layer, float16, b=2, s=64, h=128, a=4, ffn=4h, attention left eager (no fusion rule). Attention
    keeps its input (2sbh, LayerNorm), the LayerNorm's output (2, the q/k/v MatMuls'), q and k (4, the score
    MatMul's), the softmax's output (2as²b, also the context MatMul's), v (2) and the context (2, the output
    projection's): 12sbh + 2as²b, Korthikanti's 11sbh + 5as²b less its dropout masks (sbh, as²b) and dropout
    output (2as²b). The MLP keeps its input (2), the LayerNorm's output (2) and, with Gelu, Gelu's input and
    output (8 + 8: 20, Korthikanti's 19 less the dropout mask, plus the LayerNorm input he counts apart); with
    Relu, only Relu's output, which the second MatMul keeps too (8: 12). Plus the layer's output, which the loss
    reads (2sbh)."""
    b, s, h, a = 2, 64, 128, 4
    graph = transformer_graph("am", batch=b, seq=s, hidden=h, ffn=4 * h, heads=a, activation=activation)
    sbh = s * b * h
    eager = _rules_without_attention_fusion()
    assert "Attention" not in _plan_ops(graph, eager)
    assert _activations(graph, eager) == (12 + mlp + 2) * sbh + 2 * a * s * s * b


@pytest.mark.parametrize(
    ("activation", "mlp"),
    [("Gelu", 20), ("Relu", 12)],
    ids=["gelu", "relu"],
)
def test_fused_attention_keeps_no_score_matrix(activation: str, mlp: int) -> None:
    """The same layer with the shipped rules: attention fuses (rules/algebra/attention.egg) and, as a flash
    kernel, keeps Q, Kᵀ, V and its output but not the softmax's as²b matrix: Korthikanti's selective
    recomputation of the attention core, so the 2as²b term of the eager layer goes and nothing replaces it
    (the per-row log-sum-exp is left out, ops/attention.py ``saved``)."""
    b, s, h, a = 2, 64, 128, 4
    graph = transformer_graph("am", batch=b, seq=s, hidden=h, ffn=4 * h, heads=a, activation=activation)
    sbh = s * b * h
    assert "Attention" in _plan_ops(graph)
    assert _activations(graph) == (12 + mlp + 2) * sbh


def test_an_opaque_op_keeps_every_input() -> None:
    """An op without a family (carried opaquely) is assumed to need all its inputs: in the chain above, an
    opaque op in place of the bias Add keeps the MatMul's output too."""
    graph = _view_chain()
    graph.nodes[1] = Node("bias", "BiasAdd2", ("h", "b"), ("z",), domain="com.example")
    tensor = 64 * 32 * 4
    assert _activations(graph) == 4 * tensor  # X, h (the opaque op's input), z, Y; b is a weight
