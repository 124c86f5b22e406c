"""Activation memory per GPT layer against Korthikanti et al.: `python -m benchmarks.activations`.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys'23), count the
bytes a GPT layer keeps for its backward pass in 16-bit: ``s·b·h·(34 + 5·a·s/h)`` without parallelism, and
their reductions under tensor parallelism (t ways), tensor + sequence parallelism and recomputation. This
builds one pre-LN GPT layer (tests/blocks.py, Gelu MLP of 4h, float16, b=1, s=2048) at three widths, runs the
real search and extraction for training on one H100 and on meshes of t = 2, 4, 8 H100s (one axis, every
device on NVLink), and reports unity-eq's activation bytes per device and layer (``plan_memory``, less the
layer's output, which the next layer's LayerNorm keeps and the formula counts there) against the formulas,
with and without the dropout terms our graphs do not have. It also prices GPT-2 XL (1.5 B: 48 layers,
h=1600, a=25, s=1024) data parallel on 8 GPUs per device before and after the per-op rule (``--gpt2-batch``
sequences per GPU), from one layer × 48.

Writes benchmarks/results/activations.json and activations.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GIB = 1 << 30
SEQ = 2048
WIDTHS = ((2304, 24), (6144, 48), (12288, 96))  # GPT-3 XL (1.3B), a 6144 and a 12288-wide (175B) layer
TP = (1, 2, 4, 8)


@dataclass(frozen=True)
class Shape:
    s: int
    b: int
    h: int
    a: int

    @property
    def sbh(self) -> float:
        return float(self.s * self.b * self.h)

    @property
    def attention(self) -> float:
        """``a·s/h``: the softmax's ``a·s²·b`` elements over ``s·b·h``."""
        return self.a * self.s / self.h


def korthikanti(shape: Shape, t: int, dropout: bool = True) -> dict[str, float]:
    """The paper's bytes per layer (Table 2) at tensor parallelism ``t``. ``dropout=False`` takes out what our
    graphs have no op for: the two dropout masks after attention and after the MLP (sbh, 1 byte each), the
    softmax's dropout mask (a·s²·b) and its output (2·a·s²·b, which the context MatMul keeps instead of the
    softmax's output: without dropout it keeps the softmax's output, counted once)."""
    masks = 2.0 if dropout else 0.0
    scores = 5.0 if dropout else 2.0
    x = shape.attention
    return {
        "none": shape.sbh * (32 + masks + scores * x),
        "tensor": shape.sbh * (8 + masks + 24 / t + scores * x / t),
        "tensor_sequence": shape.sbh / t * (32 + masks + scores * x),
        "selective_recompute": shape.sbh / t * (32 + masks),
        "full_recompute": 2 * shape.sbh,
    }


def machine(devices: int) -> Any:
    """h100x8's node with ``devices`` GPUs (one NVLink domain)."""
    from unity_eq.machine import machine_from_toml, presets_dir

    data = tomllib.loads((presets_dir() / "h100x8.toml").read_text())
    data["nodes"][0]["devices"] = {"H100-SXM-80G": devices}
    return machine_from_toml(data, f"h100x{devices}")


def every_output(plan: Any) -> float:
    """The rule before the families' ``saved`` hooks: every activation the forward pass makes, kept."""
    from unity_eq.memory import tensor_kinds
    from unity_eq.plan import LoadWeight, Replicated, step_outputs

    kinds = tensor_kinds(plan)
    return float(
        sum(
            plan.tensors[name].local_bytes(plan.mesh)
            for step in plan.steps
            if not isinstance(step, Replicated | LoadWeight)
            for name in step_outputs(step)
            if kinds.get(name) != "weight"
        )
    )


def layer(shape: Shape, t: int, gpt2: bool = False) -> dict[str, Any]:
    """One layer's plan for training on ``t`` GPUs and its memory per device."""
    sys.path.insert(0, str(ROOT / "tests"))
    from blocks import transformer_graph

    from unity_eq import optimize
    from unity_eq.memory import plan_memory, tensor_kinds
    from unity_eq.plan import Slice

    graph = transformer_graph(
        "am", batch=shape.b, seq=shape.s, hidden=shape.h, ffn=4 * shape.h, heads=shape.a, activation="Gelu"
    )
    start = time.perf_counter()
    plan = optimize(graph, machine=machine(t), mesh=str(t), objective="training").plan
    wall = time.perf_counter() - start
    usage = plan_memory(plan)
    kinds = tensor_kinds(plan)
    output = plan.tensors[plan.outputs["Y"]].local_bytes(plan.mesh)
    return {
        "devices": t,
        "weights_sharded": any(isinstance(s, Slice) and kinds.get(s.src) == "weight" for s in plan.steps),
        "collectives": len(plan.collectives()),
        "activation_bytes": usage.activations - output,
        "every_output_bytes": every_output(plan) - output,
        "weight_and_state_bytes": usage.weights + usage.weight_state,
        "search_s": round(wall, 2),
    }


def gpt_layers() -> list[dict[str, Any]]:
    rows = []
    for h, a in WIDTHS:
        shape = Shape(SEQ, 1, h, a)
        for t in TP:
            row = {"h": h, "a": a, "s": SEQ, "b": 1, **layer(shape, t)}
            row["korthikanti"] = korthikanti(shape, t)
            row["korthikanti_no_dropout"] = korthikanti(shape, t, dropout=False)
            row["sbh"] = shape.sbh
            rows.append(row)
            print(f"h={h} t={t}: {row['activation_bytes'] / shape.sbh:.2f} sbh", file=sys.stderr)
    return rows


def gpt2_xl(batch: int) -> dict[str, Any]:
    """GPT-2 XL data parallel on 8 GPUs: 48 × one layer's memory per device (embeddings and the loss left out)."""
    shape = Shape(1024, batch * 8, 1600, 25)  # the global batch: 8 ranks × ``batch``
    row = layer(shape, 8)
    return {
        "layers": 48,
        "batch_per_gpu": batch,
        "weights_sharded": row["weights_sharded"],
        "weight_and_state_gib": 48 * row["weight_and_state_bytes"] / GIB,
        "activations_before_gib": 48 * row["every_output_bytes"] / GIB,
        "activations_after_gib": 48 * row["activation_bytes"] / GIB,
        "total_before_gib": 48 * (row["weight_and_state_bytes"] + row["every_output_bytes"]) / GIB,
        "total_after_gib": 48 * (row["weight_and_state_bytes"] + row["activation_bytes"]) / GIB,
        "korthikanti_no_dropout_gib": 48 * korthikanti(Shape(1024, batch, 1600, 25), 1, False)["none"] / GIB,
    }


EXPLAINED = (
    "Where ours differs from the paper, and why:",
    "",
    "- **t = 1** equals the formula without dropout: the two LayerNorms' inputs (4), the q/k/v MatMuls' input",
    "  (2), q and k (4), the softmax's output (2·a·s²·b: the context MatMul keeps it too, once), v (2), the",
    "  output projection's input (2), the MLP's input (2), Gelu's input (8) and output (8, the second MatMul's",
    "  input). Our separate q/k/v linears change nothing: they read one LayerNorm output, kept once, and the",
    "  e-graph fuses them into one MatMul over a Concat of the weights, which is a weight, not an activation.",
    "  With Relu instead of Gelu the MLP keeps 8 s·b·h less (Relu keeps its output, the second MatMul's input).",
    "- **t = 2** equals Megatron's tensor parallelism without dropout: the search finds that plan.",
    "- **t = 4, 8** lie between tensor parallelism and tensor + sequence parallelism: the search also shards",
    "  some of the tensors Megatron keeps whole on every rank (the LayerNorms' inputs and outputs), which is",
    "  part of what sequence parallelism does. It stays above tensor + sequence parallelism because a tensor",
    "  an all-gather makes is kept whole where Megatron-LM keeps the shard and gathers again in the backward.",
    "- **Recomputation** (selective, full) is not modelled yet: those columns are the paper's, for reference.",
)


def render(rows: list[dict[str, Any]], xl: dict[str, Any]) -> str:
    lines = [
        "# Activation memory per GPT layer against Korthikanti et al. (MLSys'23)",
        "",
        "`python -m benchmarks.activations`: one pre-LN GPT layer (Gelu MLP of 4h, float16, s=2048, b=1), the",
        "real search for training on t H100s (mesh `t`), unity-eq's activation bytes per device and layer",
        "(`plan_memory`, less the layer's output, which the next layer keeps), in units of s·b·h, against the",
        "paper's formulas. *No dropout*: the formula less the terms of the dropouts our graphs do not have (two",
        "masks of sbh, the attention dropout's mask a·s²·b and output 2·a·s²·b: 34 → 32, 5as/h → 2as/h).",
        "*Before*: every activation the forward pass makes, the rule this replaces.",
        "",
        "| h | a | t | weights sharded | before | ours | no parallelism | tensor parallel | tensor + sequence"
        " | selective recompute | full recompute |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        sbh, k, n = row["sbh"], row["korthikanti"], row["korthikanti_no_dropout"]

        def pair(key: str, k: dict[str, float] = k, n: dict[str, float] = n, sbh: float = sbh) -> str:
            return f"{k[key] / sbh:.2f} ({n[key] / sbh:.2f})"

        lines.append(
            f"| {row['h']} | {row['a']} | {row['devices']} | {'yes' if row['weights_sharded'] else 'no'}"
            f" | {row['every_output_bytes'] / sbh:.2f} | **{row['activation_bytes'] / sbh:.2f}** | {pair('none')}"
            f" | {pair('tensor')} | {pair('tensor_sequence')} | {pair('selective_recompute')}"
            f" | {pair('full_recompute')} |"
        )
    lines += [
        "",
        "Formula columns: the paper's figure (no dropout in parentheses), in s·b·h.",
        "",
        *EXPLAINED,
        "",
        f"GPT-2 XL (48 layers, h=1600, a=25, s=1024), data parallel on 8 GPUs, {xl['batch_per_gpu']} sequences per",
        f"GPU, 48 × one layer (embeddings, logits and loss left out): weights and Adam state"
        f" {xl['weight_and_state_gib']:.1f} GiB; activations {xl['activations_before_gib']:.1f} GiB before,"
        f" {xl['activations_after_gib']:.1f} GiB after (Korthikanti without dropout:"
        f" {xl['korthikanti_no_dropout_gib']:.1f} GiB); total {xl['total_before_gib']:.1f} →"
        f" {xl['total_after_gib']:.1f} GiB per device.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2-batch", type=int, default=8, help="GPT-2 XL sequences per GPU (default 8)")
    args = parser.parse_args()
    rows = gpt_layers()
    xl = gpt2_xl(args.gpt2_batch)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "activations.json").write_text(json.dumps({"layers": rows, "gpt2_xl": xl}, indent=1) + "\n")
    (RESULTS / "activations.md").write_text(render(rows, xl))
    print(render(rows, xl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
