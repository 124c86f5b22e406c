"""Transformer blocks at real sizes, built directly as an ir.Graph (imported by tests; nothing collected here).

Weights are zero-stride numpy arrays (``np.broadcast_to``): encoding, saturation and extraction read only
shapes, so a 4096 × 16384 weight costs nothing to build. Never lower these graphs.
"""

from __future__ import annotations

import numpy as np

from unity_eq.ir import Graph, Node, TensorType

__all__ = ["BlockBuilder", "transformer_graph"]


class BlockBuilder:
    """Collects nodes, types and (zero-stride) weights of a graph over activations [batch, seq, hidden]."""

    def __init__(self, batch: int, seq: int, hidden: int, dtype: str = "float16") -> None:
        self.batch, self.seq, self.hidden, self.dtype = batch, seq, hidden, dtype
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.weights: dict[str, np.ndarray] = {}

    def t(self, *shape: int) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def weight(self, name: str, *shape: int) -> str:
        self.weights[name] = np.broadcast_to(np.zeros((), self.dtype), shape)
        self.types[name] = self.t(*shape)
        return name

    def const(self, name: str, values: list[int]) -> str:
        self.weights[name] = np.asarray(values, np.int64)
        self.types[name] = TensorType((len(values),), "int64")
        return name

    def op(self, op_type: str, inputs: list[str], out: str, shape: tuple[int, ...], **attrs: object) -> str:
        self.nodes.append(Node(out, op_type, tuple(inputs), (out,), dict(attrs)))
        self.types[out] = self.t(*shape)
        return out

    def linear(self, x: str, prefix: str, fan_in: int, fan_out: int) -> str:
        b, s = self.batch, self.seq
        w = self.weight(f"{prefix}.weight", fan_in, fan_out)
        bias = self.weight(f"{prefix}.bias", fan_out)
        mm = self.op("MatMul", [x, w], f"{prefix}.matmul", (b, s, fan_out))
        return self.op("Add", [mm, bias], f"{prefix}.out", (b, s, fan_out))

    def layer_norm(self, x: str, prefix: str) -> str:
        h = self.hidden
        scale, bias = self.weight(f"{prefix}.scale", h), self.weight(f"{prefix}.bias", h)
        return self.op(
            "LayerNormalization", [x, scale, bias], f"{prefix}.out", (self.batch, self.seq, h), axis=-1, epsilon=1e-5
        )

    def mlp(self, x: str, prefix: str, ffn: int, activation: str = "Relu") -> str:
        """Pre-LN MLP block with a residual: x + W2·act(W1·LN(x) + b1) + b2 (``activation``: Relu, or Gelu as
        GPT has it)."""
        b, s, h = self.batch, self.seq, self.hidden
        up = self.linear(self.layer_norm(x, f"{prefix}.ln"), f"{prefix}.up", h, ffn)
        act = self.op(activation, [up], f"{prefix}.{activation.lower()}", (b, s, ffn))
        down = self.linear(act, f"{prefix}.down", ffn, h)
        return self.op("Add", [x, down], f"{prefix}.residual", (b, s, h))

    def attention(self, x: str, prefix: str, heads: int) -> str:
        """Pre-LN multi-head self-attention block with a residual."""
        b, s, h = self.batch, self.seq, self.hidden
        d = h // heads
        heads_shape = self.const(f"{prefix}.heads_shape", [b, s, heads, d])
        hidden_shape = self.const(f"{prefix}.hidden_shape", [b, s, h])
        ln = self.layer_norm(x, f"{prefix}.ln")
        proj = {}
        for name, perm, shape in (("q", [0, 2, 1, 3], (b, heads, s, d)), ("k", [0, 2, 3, 1], (b, heads, d, s))):
            lin = self.linear(ln, f"{prefix}.{name}", h, h)
            split = self.op("Reshape", [lin, heads_shape], f"{prefix}.{name}.heads", (b, s, heads, d))
            proj[name] = self.op("Transpose", [split], f"{prefix}.{name}.t", shape, perm=perm)
        lin = self.linear(ln, f"{prefix}.v", h, h)
        split = self.op("Reshape", [lin, heads_shape], f"{prefix}.v.heads", (b, s, heads, d))
        proj["v"] = self.op("Transpose", [split], f"{prefix}.v.t", (b, heads, s, d), perm=[0, 2, 1, 3])
        scores = self.op("MatMul", [proj["q"], proj["k"]], f"{prefix}.scores", (b, heads, s, s))
        probs = self.op("Softmax", [scores], f"{prefix}.probs", (b, heads, s, s), axis=-1)
        context = self.op("MatMul", [probs, proj["v"]], f"{prefix}.context", (b, heads, s, d))
        back = self.op("Transpose", [context], f"{prefix}.context.t", (b, s, heads, d), perm=[0, 2, 1, 3])
        merged = self.op("Reshape", [back, hidden_shape], f"{prefix}.merged", (b, s, h))
        out = self.linear(merged, f"{prefix}.o", h, h)
        return self.op("Add", [x, out], f"{prefix}.residual", (b, s, h))

    def graph(self, name: str, x: str, y: str) -> Graph:
        types = {x: self.t(self.batch, self.seq, self.hidden), **self.types}
        return Graph(name, {x: types[x]}, [y], self.nodes, self.weights, types, 18)


def transformer_graph(
    blocks: str = "am",
    *,
    batch: int = 1,
    seq: int = 512,
    hidden: int = 4096,
    ffn: int = 16384,
    heads: int = 32,
    layers: int = 1,
    dtype: str = "float16",
    activation: str = "Relu",
) -> Graph:
    """``layers`` repetitions of ``blocks`` ('a' attention, 'm' MLP) on X [batch, seq, hidden]; the MLPs'
    ``activation`` is Relu or Gelu (GPT's)."""
    builder = BlockBuilder(batch, seq, hidden, dtype)
    x = "X"
    for layer in range(layers):
        for i, kind in enumerate(blocks):
            prefix = f"l{layer}.{kind}{i}"
            x = builder.mlp(x, prefix, ffn, activation) if kind == "m" else builder.attention(x, prefix, heads)
    builder.nodes.append(Node("output", "Identity", (x,), ("Y",)))
    builder.types["Y"] = builder.t(batch, seq, hidden)
    return builder.graph(f"transformer-{blocks}x{layers}", "X", "Y")
