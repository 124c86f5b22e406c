"""Device files a user can read in Netron: the source model's names, and every collective cut described.

The transformer on 8 devices has a MatMul the rewrites made (one MatMul for the q, k and v projections, over
the three weights concatenated): it has no node in the source model, yet is named after the ones it replaces.
The MLP on 2 devices trained has a forward all-reduce.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from unity_eq import optimize
from unity_eq.lower import META_COLLECTIVES


@pytest.fixture(scope="module")
def plans(examples: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("names")
    optimize(examples / "transformer.onnx", devices=8, mesh="8", output_dir=out / "transformer")
    optimize(examples / "mlp.onnx", devices=2, objective="training", output_dir=out / "mlp")
    return {"transformer": out / "transformer", "mlp": out / "mlp"}


def _source_names(model: Path) -> set[str]:
    graph = onnx.load(str(model)).graph
    return {n.name for n in graph.node} | {v.name for v in [*graph.input, *graph.output, *graph.initializer]}


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_every_node_and_tensor_is_named_after_the_source_model(
    examples: Path, plans: dict[str, Path], name: str
) -> None:
    source = _source_names(examples / f"{name}.onnx")
    device = onnx.load(str(plans[name] / "device_1.onnx"))
    tensors = {t for n in device.graph.node for t in [*n.input, *n.output]} | {n.name for n in device.graph.node}
    plan_ids = sorted(t for t in tensors if re.search(r"\buq\.\d+", t))
    assert not plan_ids, plan_ids
    for node in device.graph.node:
        # `attn.q.matmul/Slice`, `fc1.weight[S(1)]`, `attn.q.matmul+attn.k.matmul/MatMul`, `X/Slice.starts`, and
        # a node named after a tensor the lowering numbered apart from another (`attn.context[S(0)].1/Transpose`)
        base = re.sub(r"/.*$", "", re.sub(r"\[[^\]]*\]", "", node.name))
        parts = re.split(r"\+", re.sub(r"\.\d+$", "", base))
        assert all(p in source for p in parts), (node.name, node.op_type)


def test_the_fused_qkv_matmul_and_its_weight_are_named_after_what_they_replace(plans: dict[str, Path]) -> None:
    device = onnx.load(str(plans["transformer"] / "device_0.onnx"))
    fused = [n for n in device.graph.node if n.op_type == "MatMul" and "+" in n.name]
    assert [n.name for n in fused] == ["attn.q.matmul+attn.k.matmul+attn.v.matmul/MatMul"]
    assert fused[0].input[1] == "attn.q.weight+attn.k.weight+attn.v.weight"
    assert fused[0].input[1] in {i.name for i in device.graph.initializer}


@pytest.mark.parametrize("name", ["transformer", "mlp"])
def test_every_collective_cut_is_described_in_the_device_file(plans: dict[str, Path], name: str) -> None:
    meta = json.loads((plans[name] / "plan.json").read_text())
    assert meta["collectives"]
    for rank in range(len(meta["files"])):
        device = onnx.load(str(plans[name] / f"device_{rank}.onnx"))
        cuts = json.loads({p.key: p.value for p in device.metadata_props}[META_COLLECTIVES])
        assert len(cuts) == len(meta["collectives"])
        docs = {v.name: v.doc_string for v in [*device.graph.input, *device.graph.output]}
        for cut, planned in zip(cuts, meta["collectives"], strict=True):
            for key in ("kind", "axis", "dim", "bytes", "src", "dst"):
                assert cut[key] == planned[key], key
            assert cut["peers"] == next(g for g in planned["groups"] if rank in g)
            described = (
                f"collective {planned['id']}: {planned['kind']}"
                + (" (sum)" if planned["kind"] == "all_reduce" else "")
                + f" on mesh axis {planned['axis']}"
                + (f" (dim {planned['dim']})" if planned["dim"] is not None else "")
                + f" with ranks {cut['peers']}, {planned['bytes']} bytes per rank"
            )
            assert docs[planned["src"]] == f"sent to {described}"
            assert docs[planned["dst"]] == f"result of {described}"
