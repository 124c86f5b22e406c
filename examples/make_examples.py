"""Write the bundled example models, ``examples/mlp.onnx`` and ``examples/transformer.onnx``.

Run ``python examples/make_examples.py``. The output is deterministic (fixed seed), so the checked-in files
can be regenerated bit for bit. Both models use opset 18 and IR version 8 (onnxruntime refuses the IR version
that ``onnx.helper.make_model`` writes by default), float32, static shapes and initializers for weights;
weights are normal samples scaled by 1/sqrt(fan_in), which keeps activations O(1).

- ``mlp``: ``Y = Relu(X @ W1 + b1) @ W2 + b2`` with X [8, 128, 256] and a hidden size of 1024.
- ``transformer``: one pre-LayerNorm encoder block (8 heads of 32, feed-forward 1024, GELU written with Erf).
- ``branches``: two projections of one input, concatenated, then an output projection:
  ``Y = Relu(Concat(X @ Wa, X @ Wb)) @ Wo`` with X [8, 128, 256] (a two-branch block, as in gated or multi-path
  layers). The generated rule ``Concat(MatMul(x, a), MatMul(x, b)) → MatMul(x, Concat(a, b))`` turns the two
  MatMuls and the Concat into one MatMul over concatenated weights (docs/generate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

BATCH, SEQ, HIDDEN, FFN, HEADS = 8, 128, 256, 1024, 8
HEAD_DIM = HIDDEN // HEADS
OPSET, IR_VERSION, SEED = 18, 8, 0
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Size:
    """The activations' ``[batch, seq, hidden]``, the feed-forward width and the attention heads."""

    batch: int = BATCH
    seq: int = SEQ
    hidden: int = HIDDEN
    ffn: int = FFN
    heads: int = HEADS

    @classmethod
    def parse(cls, text: str) -> Size:
        """``B,S,H,HEADS`` (feed-forward 4·H), as ``--transformer`` takes it."""
        batch, seq, hidden, heads = (int(v) for v in text.split(","))
        if hidden % heads:
            raise SystemExit(f"error: --transformer {text}: hidden size {hidden} is not a multiple of {heads} heads")
        return cls(batch, seq, hidden, 4 * hidden, heads)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # onnx's own dependency: numpy has no bfloat16

        return np.dtype(ml_dtypes.bfloat16)
    if name not in ("float32", "float16"):
        raise SystemExit(f"error: --dtype {name}: expected float32, float16 or bfloat16")
    return np.dtype(name)


class _Builder:
    """Collects nodes and initializers; names every node after its output."""

    def __init__(self, seed: int, size: Size = Size(), dtype: str = "float32") -> None:
        self.rng = np.random.default_rng(seed)
        self.size = size
        self.dtype = _numpy_dtype(dtype)  # float values are drawn in float32 (the same draws), stored in dtype
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        value = self.rng.standard_normal(shape).astype(np.float32) / np.float32(math.sqrt(fan_in))
        return self.const(name, value)

    def const(self, name: str, value: np.ndarray) -> str:
        if value.dtype == np.float32:
            value = value.astype(self.dtype)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def linear(self, x: str, prefix: str, fan_in: int, fan_out: int, out: str = "") -> str:
        """``x @ W + b``: a MatMul and an Add, the form exporters write for ``nn.Linear``."""
        w = self.weight(f"{prefix}.weight", (fan_in, fan_out), fan_in)
        b = self.weight(f"{prefix}.bias", (fan_out,), fan_in)
        return self.op("Add", [self.op("MatMul", [x, w], f"{prefix}.matmul"), b], out or f"{prefix}.out")

    def layer_norm(self, x: str, prefix: str) -> str:
        """LayerNormalization over the hidden dim; scale and bias are perturbed from 1 and 0 so that a
        wrongly sliced or dropped scale shows in numerical checks."""
        noise = self.rng.standard_normal((2, self.size.hidden)).astype(np.float32) * np.float32(0.1)
        scale = self.const(f"{prefix}.scale", 1 + noise[0])
        bias = self.const(f"{prefix}.bias", noise[1])
        return self.op("LayerNormalization", [x, scale, bias], f"{prefix}.out", axis=-1, epsilon=1e-5)

    def model(self, name: str, x: str, y: str) -> onnx.ModelProto:
        shape = [self.size.batch, self.size.seq, self.size.hidden]
        elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(x, elem, shape)],
            [helper.make_tensor_value_info(y, elem, shape)],
            self.initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="unity-eq",
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def make_mlp(seed: int = SEED) -> onnx.ModelProto:
    """X [8, 128, 256] → MatMul W1 → Add b1 → Relu → MatMul W2 → Add b2 → Y."""
    b = _Builder(seed)
    h = b.op("Relu", [b.linear("X", "fc1", HIDDEN, FFN)], "relu")
    b.linear(h, "fc2", FFN, HIDDEN, out="Y")
    return b.model("mlp", "X", "Y")


def make_transformer(seed: int = SEED, size: Size = Size(), dtype: str = "float32") -> onnx.ModelProto:
    """One pre-LN encoder block: X + Attn(LN(X)), then that + FFN(LN(that)); the bundled one at the default
    size, a GPU-sized one with ``--transformer`` (benchmarks/gpu.sh)."""
    b = _Builder(seed, size, dtype)
    head_dim = size.hidden // size.heads
    heads_shape = b.const("heads_shape", np.array([size.batch, size.seq, size.heads, head_dim], np.int64))
    hidden_shape = b.const("hidden_shape", np.array([size.batch, size.seq, size.hidden], np.int64))

    ln1 = b.layer_norm("X", "ln1")
    q, k, v = (
        b.op("Reshape", [b.linear(ln1, f"attn.{n}", size.hidden, size.hidden), heads_shape], f"attn.{n}.heads")
        for n in "qkv"
    )
    q = b.op("Transpose", [q], "attn.q.t", perm=[0, 2, 1, 3])  # [B, H, S, D]
    k = b.op("Transpose", [k], "attn.k.t", perm=[0, 2, 3, 1])  # [B, H, D, S]
    v = b.op("Transpose", [v], "attn.v.t", perm=[0, 2, 1, 3])  # [B, H, S, D]
    scale = b.const("attn.scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    scores = b.op("Mul", [b.op("MatMul", [q, k], "attn.scores"), scale], "attn.scaled")
    probs = b.op("Softmax", [scores], "attn.probs", axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v], "attn.context")], "attn.context.t", perm=[0, 2, 1, 3])
    merged = b.op("Reshape", [context, hidden_shape], "attn.merged")
    h = b.op("Add", ["X", b.linear(merged, "attn.o", size.hidden, size.hidden)], "residual1")

    ln2 = b.layer_norm(h, "ln2")
    up = b.linear(ln2, "ffn.up", size.hidden, size.ffn)
    half = b.const("gelu.half", np.array(0.5, np.float32))
    one = b.const("gelu.one", np.array(1.0, np.float32))
    sqrt2 = b.const("gelu.sqrt2", np.array(math.sqrt(2.0), np.float32))
    erf = b.op("Erf", [b.op("Div", [up, sqrt2], "gelu.div")], "gelu.erf")
    gelu = b.op("Mul", [b.op("Mul", [up, half], "gelu.half_x"), b.op("Add", [erf, one], "gelu.one_plus")], "gelu")
    down = b.linear(gelu, "ffn.down", size.ffn, size.hidden)
    b.op("Add", [h, down], "Y")
    return b.model("transformer", "X", "Y")


def make_branches(seed: int = SEED) -> onnx.ModelProto:
    """X [8, 128, 256] → Concat(X @ Wa, X @ Wb) [8, 128, 512] → Relu → MatMul Wo → Y [8, 128, 256]."""
    b = _Builder(seed)
    a = b.op("MatMul", ["X", b.weight("branch_a.weight", (HIDDEN, HIDDEN), HIDDEN)], "branch_a")
    c = b.op("MatMul", ["X", b.weight("branch_b.weight", (HIDDEN, HIDDEN), HIDDEN)], "branch_b")
    h = b.op("Relu", [b.op("Concat", [a, c], "branches", axis=-1)], "relu")
    b.op("MatMul", [h, b.weight("out.weight", (2 * HIDDEN, HIDDEN), 2 * HIDDEN)], "Y")
    return b.model("branches", "X", "Y")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the bundled example models (or one sized transformer).")
    parser.add_argument("--transformer", help="B,S,H,HEADS: write one transformer block of this size to --out")
    parser.add_argument("--out", type=Path, help="where --transformer writes its model")
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16 (--transformer only)")
    args = parser.parse_args()
    if args.transformer:
        if args.out is None:
            raise SystemExit("error: --transformer needs --out PATH")
        onnx.save(make_transformer(SEED, Size.parse(args.transformer), args.dtype), args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB)")
        return
    for name, make in (("mlp", make_mlp), ("transformer", make_transformer), ("branches", make_branches)):
        path = HERE / f"{name}.onnx"
        onnx.save(make(), path)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
