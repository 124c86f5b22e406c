"""SpaceToDepth, the op family added as a plug-in (unity_eq/ops/space_to_depth.py + its rule file): its rules
are proven and its unsound look-alikes refuted by Z3 through the family's own semantics and ranges, the e-graph
shards it along the batch and the height, and a plan that shards it lowers, runs and matches onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from unity_eq.egraph import Limits, encode, parse_serialized, saturate
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Mesh
from unity_eq.ops.registry import PLUGINS, check_plugin_kinds, plugin_for
from unity_eq.ops.space_to_depth import SPACE_TO_DEPTH
from unity_eq.ops.spec import Family
from unity_eq.rulefile.manifest import DEFAULT_RULE_FILES, load_rule_files, rules_dir

RULES = rules_dir() / "parallel" / "space_to_depth.egg"


def _model(path: Path, n: int, c: int, hw: int, block: int, out_c: int) -> Path:
    """X [n, c, hw, hw] → SpaceToDepth(block) → 1×1 Conv to out_c channels → Relu."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((out_c, c * block * block, 1, 1)).astype(np.float32), "W")
    nodes = [
        helper.make_node("SpaceToDepth", ["X"], ["s"], blocksize=block, name="s2d"),
        helper.make_node("Conv", ["s", "W"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["Y"], name="relu"),
    ]
    out_shape = [n, out_c, hw // block, hw // block]
    graph = helper.make_graph(
        nodes,
        "s2d",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n, c, hw, hw])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out_shape)],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_the_family_is_registered_as_a_plug_in() -> None:
    assert plugin_for("SpaceToDepth") in PLUGINS
    assert "parallel/space_to_depth.egg" in DEFAULT_RULE_FILES  # optimize loads it without a manifest edit


def test_a_plug_in_cannot_claim_a_built_in_kind() -> None:
    """The verifier gives the built-in kinds the built-in families' assumptions (an elementwise op commutes with
    every slicing, a proof about one stands for all): a plug-in op declared UNARY would be proven against them,
    not against its own semantics, so the registry refuses it."""
    import dataclasses

    spec = dataclasses.replace(SPACE_TO_DEPTH.specs[0], name="ReverseLast", family=Family.UNARY)
    impostor = dataclasses.replace(SPACE_TO_DEPTH, name="reverse", specs=(spec,))
    with pytest.raises(ValueError, match=r"ReverseLast has kind Family\.UNARY"):
        check_plugin_kinds([impostor])
    check_plugin_kinds(PLUGINS)


def test_its_semantics_are_onnx_reference() -> None:
    """The family's numpy semantics (what Z3 checks the rules against) equal onnxruntime's SpaceToDepth."""
    import onnxruntime as ort

    family = plugin_for("SpaceToDepth")
    assert family is not None
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    node = helper.make_node("SpaceToDepth", ["X"], ["Y"], blocksize=2)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"X": x})[0]
    assert family.infer_shape("SpaceToDepth", [x.shape, 2]) == expected.shape
    np.testing.assert_array_equal(family.evaluate("SpaceToDepth", [x, 2], None), expected)


def test_its_rules_are_proven_and_look_alikes_refuted(tmp_path: Path) -> None:
    proc = run_cli("verify", str(RULES), "--cross-check", "0", "--quiet", "--json", "-")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert {r["name"]: r["status"] for r in report["rules"]} == {
        "analysis shape": "proven",  # the file's own shape fact (line 5), checked against the family's infer_shape
        "analysis dtype": "proven",  # its dtype fact (line 8), checked against the op's types (its operand's)
        "space-to-depth-split-batch": "proven",
        "space-to-depth-split-height": "proven",
        "space-to-depth-split-width": "proven",
    }
    bad = tmp_path / "bad.egg"
    bad.write_text(
        # channels interleave: output channel (i*b + j)*C + c reads every input channel
        "(rewrite (SpaceToDepth x b) (Combine (SpaceToDepth (Partition x 1 ax) b) 1 ax)\n"
        '         :when ((can-split x 1 ax)) :ruleset parallel :name "bad-split-channels")\n'
        # without the guard a device's rows need not be whole blocks
        "(rewrite (SpaceToDepth x b) (Combine (SpaceToDepth (Partition x 2 ax) b) 2 ax)\n"
        '         :when ((can-split x 2 ax)) :ruleset parallel :name "bad-split-height-unguarded")\n'
    )
    proc = run_cli("verify", str(bad), "--cross-check", "0", "--quiet", "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    statuses = {r["name"]: r["status"] for r in json.loads(proc.stdout)["rules"]}
    assert statuses == {"bad-split-channels": "refuted", "bad-split-height-unguarded": "refuted"}


def test_saturation_shards_it_along_the_height(tmp_path: Path) -> None:
    """Batch 1: only the height (and width) can split, by whole blocks of rows per device."""
    graph = load_onnx(_model(tmp_path / "h.onnx", n=1, c=4, hw=16, block=2, out_c=8))
    result = saturate(load_rule_files(), encode(graph, Mesh(("x",), (4,))), Limits())
    data = parse_serialized(result.serialized)
    assert data.conflicts() == []
    split_dims = set()
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op == "SpaceToDepth":
                for child in data.classes[node.children[0]].nodes:
                    if child.op == "Partition":
                        split_dims.add(child.args[1])
    assert split_dims == {2, 3}


@pytest.mark.parametrize("devices", [4])
def test_a_plan_that_shards_it_runs_and_checks(tmp_path: Path, devices: int) -> None:
    model = _model(tmp_path / "b.onnx", n=32, c=32, hw=64, block=2, out_c=256)
    proc = run_cli("optimize", str(model), "--devices", str(devices), "-q", "-o", str(tmp_path / "plan"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if s.get("op") == "SpaceToDepth"]
    assert plan["tensors"][step["inputs"][0]]["placement"] == ["S(0)"]  # sharded on the batch, not copied
    proc = run_cli("check", str(model), str(tmp_path / "plan"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
