"""GPT models shaped as in Megatron-LM's scaling study, built directly as an ir.Graph with zero-stride weights
(nothing is materialized: planning reads shapes only).

A model is a token embedding (Gather) plus learned positions, ``layers`` pre-LN transformer layers
(attention with ``heads`` heads, MLP of 4·hidden with GeLU), a final LayerNorm and the logits (hidden ×
vocabulary), in 16-bit. Narayanan et al. (SC'21) use vocabulary 51,200 and sequence 2,048 throughout.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from blocks import BlockBuilder  # tests/blocks.py: the zero-stride graph builder

from unity_eq.ir import Graph, Node, TensorType

VOCAB = 51200
SEQ = 2048


@dataclass(frozen=True)
class Gpt:
    """A GPT configuration: ``params`` is the nominal size in billions, for labels."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = VOCAB
    seq: int = SEQ

    def parameters(self) -> float:
        """Parameters: 12·l·h² (+13·l·h biases and norms) + (V + s)·h embeddings (Megatron's count)."""
        h, layer_count = self.hidden, self.layers
        return 12 * layer_count * h * h * (1 + 13 / (12 * h) + (self.vocab + self.seq) / (12 * layer_count * h))

    def flops_per_step(self, batch: int, recompute: bool = True) -> float:
        """Megatron's formula (Narayanan et al., eq. 3): 96·B·s·l·h²·(1 + s/6h + V/16lh) with full activation
        recomputation: what its TFLOP/s per GPU are computed from. The logits (6·B·s·h·V) are not recomputed,
        so without recomputation it is 72·B·s·l·h²·(1 + s/6h + V/12lh)."""
        h, s, layer_count = self.hidden, self.seq, self.layers
        factor, logits = (96, 16) if recompute else (72, 12)
        return factor * batch * s * layer_count * h * h * (1 + s / (6 * h) + self.vocab / (logits * layer_count * h))

    def graph(self, batch: int) -> Graph:
        """The model at ``batch`` sequences."""
        b, s, h = batch, self.seq, self.hidden
        builder = BlockBuilder(b, s, h, "float16")
        table = builder.weight("embed.tokens", self.vocab, h)
        positions = builder.weight("embed.positions", s, h)
        builder.types["ids"] = TensorType((b, s), "int64")
        tokens = builder.op("Gather", [table, "ids"], "embed.gather", (b, s, h), axis=0)
        x = builder.op("Add", [tokens, positions], "embed.out", (b, s, h))
        for layer in range(self.layers):
            x = builder.attention(x, f"l{layer}.a", self.heads)
            x = _gelu_mlp(builder, x, f"l{layer}.m", 4 * h)
        x = builder.layer_norm(x, "final.ln")
        head = builder.weight("head.weight", h, self.vocab)
        logits = builder.op("MatMul", [x, head], "logits", (b, s, self.vocab))
        builder.nodes.append(Node("output", "Identity", (logits,), ("Y",)))
        builder.types["Y"] = builder.t(b, s, self.vocab)
        return Graph(self.name, {"ids": builder.types["ids"]}, ["Y"], builder.nodes, builder.weights, builder.types, 20)


def _gelu_mlp(builder: BlockBuilder, x: str, prefix: str, ffn: int) -> str:
    """Pre-LN MLP with GeLU and a residual (GPT's)."""
    b, s, h = builder.batch, builder.seq, builder.hidden
    up = builder.linear(builder.layer_norm(x, f"{prefix}.ln"), f"{prefix}.up", h, ffn)
    act = builder.op("Gelu", [up], f"{prefix}.gelu", (b, s, ffn))
    down = builder.linear(act, f"{prefix}.down", ffn, h)
    return builder.op("Add", [x, down], f"{prefix}.residual", (b, s, h))


# Narayanan et al., SC'21, Table 1 (weak scaling, A100-80GB, 8 per node, 8 × 200 Gb/s HDR InfiniBand per node;
# vocabulary 51,200, sequence 2,048): model, heads, hidden, layers, Megatron's t and p, GPUs, batch, measured
# TFLOP/s per GPU. The 175B row is GPT-3 as trained in the paper's section 5 (t=8, p=16 on 1,024 GPUs,
# ~140 TFLOP/s per GPU; batch 1,536 as in GPT-3).
@dataclass(frozen=True)
class MegatronRow:
    model: Gpt
    tensor: int
    stages: int
    gpus: int
    batch: int
    tflops: float

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.stages)


ROWS = {
    "1.7B": MegatronRow(Gpt("gpt-1.7B", 24, 2304, 24), 1, 1, 32, 512, 137),
    "3.6B": MegatronRow(Gpt("gpt-3.6B", 30, 3072, 32), 2, 1, 64, 512, 138),
    "18B": MegatronRow(Gpt("gpt-18.4B", 40, 6144, 48), 8, 1, 256, 1024, 135),
    "175B": MegatronRow(Gpt("gpt-175B", 96, 12288, 96), 8, 16, 1024, 1536, 140),
    "530B": MegatronRow(Gpt("gpt-529.6B", 105, 20480, 128), 8, 35, 2520, 2520, 163),
    "1T": MegatronRow(Gpt("gpt-1008B", 128, 25600, 160), 8, 64, 3072, 3072, 163),
}

_ = np  # numpy is BlockBuilder's; imported so a reader sees the weights are numpy views
