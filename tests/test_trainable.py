"""One definition of "trainable" (ir.WeightOrigin, decided in the frontend): a folded causal mask and a scalar
constant get no gradient all-reduce, no gradient memory and no optimizer state; a tied weight's state is counted
once; plan.json records every weight's origin; `check --training` agrees with the prices; a weight that looks
like parameters the exporter merged is refused, or declared (`--parameters`, `--shared`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from unity_eq.cost import CostModel
from unity_eq.driver.request import parameter_map
from unity_eq.errors import ModelError, OptionError
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Mesh, WeightOrigin
from unity_eq.machine import default_machine

D, S, B = 256, 128, 32  # large enough that two devices split the batch (a data-parallel plan)
WEIGHT = D * D * 4  # one float32 projection, bytes


def masked_attention(path: Path) -> Path:
    """One attention head ``Y = softmax(q kᵀ · scale + mask) v · Wqᵀ``: three parameters, Wq also used
    transposed (the frontend folds ``Transpose(Wq)`` into a weight of its own, a tie), a causal mask folded
    from ``ConstantOfShape``/``Trilu`` and a scalar ``scale`` initializer (as torch's exporter writes sqrt(d))."""
    rng = np.random.default_rng(0)

    def weight(name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32), name)

    inits = [
        weight("Wq"),
        weight("Wk"),
        weight("Wv"),
        numpy_helper.from_array(np.array(1 / np.sqrt(D), np.float32), "scale"),
        numpy_helper.from_array(np.array([S, S], np.int64), "mask_shape"),
        numpy_helper.from_array(np.array(-1e9, np.float32), "neg"),
    ]
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["mask_shape"], ["ones"], value=one),
        helper.make_node("Trilu", ["ones"], ["lower"], upper=0),
        helper.make_node("Sub", ["ones", "lower"], ["upper"]),
        helper.make_node("Mul", ["upper", "neg"], ["mask"]),
        helper.make_node("MatMul", ["X", "Wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["X", "Wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["X", "Wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s0"], name="qk"),
        helper.make_node("Mul", ["s0", "scale"], ["s1"], name="scaled"),
        helper.make_node("Add", ["s1", "mask"], ["s2"], name="masked"),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["h"], name="pv"),
        helper.make_node("Transpose", ["Wq"], ["WqT"], perm=[1, 0], name="tie"),
        helper.make_node("MatMul", ["h", "WqT"], ["Y"], name="out"),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [B, S, D])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [B, S, D])
    model = helper.make_model(
        helper.make_graph(nodes, "masked", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def attention(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The model and its data-parallel training plan on two devices."""
    root = tmp_path_factory.mktemp("trainable")
    model = masked_attention(root / "attention.onnx")
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "-o", str(root / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    return model, root / "plan"


def test_the_frontend_says_where_each_weight_comes_from(tmp_path: Path) -> None:
    graph = load_onnx(masked_attention(tmp_path / "m.onnx"))
    origins = graph.weight_origins()
    assert origins["Wk"] == WeightOrigin("parameter", ("Wk",))
    assert origins["WqT"] == WeightOrigin("folded", ("Wq",), ("Transpose",))
    assert origins["mask"] == WeightOrigin.constant(("ConstantOfShape", "Trilu", "Sub", "Mul"))
    assert origins["scale"] == WeightOrigin.constant()
    assert graph.constants() == {"mask", "scale"}
    assert graph.ambiguous_weights() == {}


def test_constants_are_priced_without_gradients_and_a_tied_weight_once(attention: tuple[Path, Path]) -> None:
    """The hand count: Wq, Wk, Wv are the parameters (3 × 256 KiB); WqT is Wq's transpose (stored, and its
    gradient all-reduced as the ranks do, but no second optimizer state); the mask and the scale are
    constants. Before, the mask and the scale were priced a gradient all-reduce, and every weight byte
    (the mask, the scale and WqT included) carried gradient and Adam state."""
    _, plan_dir = attention
    plan = json.loads((plan_dir / "plan.json").read_text())
    replicates = {s["src"]: s["communication_s"] for s in plan["steps"] if s["kind"] == "replicate"}
    assert set(replicates) == {"Wq", "Wk", "Wv", "WqT", "mask", "scale"}, "expected a data-parallel plan"
    assert replicates["mask"] == 0.0 and replicates["scale"] == 0.0
    one = CostModel(default_machine(2), Mesh(("x",), (2,)), "training").gradient_all_reduce("x", WEIGHT)
    assert plan["cost"]["communication_by_axis"]["x"]["gradient_s"] == pytest.approx(4 * one, rel=1e-12)
    memory = plan["memory"]
    assert memory["weight_bytes"] == 4 * WEIGHT + S * S * 4 + 4  # what is stored: Wq, Wk, Wv, WqT, mask, scale
    assert memory["gradient_bytes"] == 3 * WEIGHT  # Wq once
    assert memory["weight_state_bytes"] == 3 * (3 * WEIGHT)  # float32: gradient + Adam's two moments
    weights = plan["weights"]
    assert weights["WqT"] == {"trainable": True, "how": "folded", "sources": ["Wq"], "ops": ["Transpose"]}
    assert weights["Wk"] == {"trainable": True, "how": "parameter", "sources": ["Wk"]}
    assert weights["mask"]["trainable"] is False and weights["mask"]["how"] == "constant"
    assert weights["scale"] == {"trainable": False, "how": "constant"}


def test_check_training_agrees_with_the_prices(attention: tuple[Path, Path]) -> None:
    """The ranks issue no collective for the constants, and plan.json prices none: the note that it priced one
    where no gradient flows is gone, and the counts match. Three gradient all-reduces of the 4 x 256 KiB: Wk
    and Wv in one bucket (train/buckets.py), and Wq and its folded transpose WqT one each inside autograd
    (a weight also read through a folded weight is not bucketed: docs/training.md)."""
    model, plan_dir = attention
    result = run_cli("check", str(model), str(plan_dir), "--training", "--loss", "mean", "--steps", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no gradient flows" not in result.stderr
    assert "ok collectives all_reduce on axis x (gradient), rank 0: issued 3 (1048576 bytes), plan.json prices 3" in (
        result.stdout
    )
    assert "ok gradient of 'Wq'" in result.stdout


def test_a_parameter_map_decides_what_trains(attention: tuple[Path, Path], tmp_path: Path) -> None:
    """`--parameters` names the source model's parameters: Wv left out is a constant (a float buffer the
    exporter wrote looks like a parameter otherwise): no gradient, no state."""
    model, _ = attention
    (tmp_path / "params.json").write_text(json.dumps(["Wq", "Wk"]))
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "--parameters", str(tmp_path / "params.json"), "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["weights"]["Wv"]["trainable"] is False
    assert plan["memory"]["gradient_bytes"] == 2 * WEIGHT
    assert next(s for s in plan["steps"] if s["kind"] == "replicate" and s["src"] == "Wv")["communication_s"] == 0.0


def test_parameters_the_file_lacks_are_one_error(attention: tuple[Path, Path], tmp_path: Path) -> None:
    """A listed parameter that is no initializer (an optimizing exporter renamed its transpose) would silently
    stay untrained while the rest trains: `optimize` refuses in one line naming it and the way out."""
    model, _ = attention
    (tmp_path / "params.json").write_text(json.dumps(["Wq", "Wk", "Wv", "proj.weight"]))
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "--parameters", str(tmp_path / "params.json"), "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 2, made.stderr
    errors = [line for line in made.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "proj.weight" in errors[0] and "optimize=False" in errors[0], made.stderr
    assert not (tmp_path / "plan").exists()


def test_a_parameter_map_that_is_not_one_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"Wq": 3}')
    with pytest.raises(OptionError, match="expected a JSON list of parameter names or an object"):
        parameter_map(tmp_path / "bad.json")
    with pytest.raises(OptionError, match="not JSON"):
        (tmp_path / "worse.json").write_text("[")
        parameter_map(tmp_path / "worse.json")
    assert parameter_map({"ln.weight": ["a.ln.weight", "b.ln.weight"]}) == {"ln.weight": ("a.ln.weight", "b.ln.weight")}


def norms(path: Path) -> Path:
    """Two LayerNormalizations reading one scale and one bias, as torch's dynamo exporter leaves two freshly
    initialized LayerNorms (equal values merged into one initializer)."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.ones(64, np.float32), "ln.weight"),
        numpy_helper.from_array(np.full(64, 0.5, np.float32), "ln.bias"),
        numpy_helper.from_array(w, "fc.weight"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["X", "ln.weight", "ln.bias"], ["a"], axis=-1, name="norm1"),
        helper.make_node("MatMul", ["a", "fc.weight"], ["b"], name="fc"),
        helper.make_node("LayerNormalization", ["b", "ln.weight", "ln.bias"], ["Y"], axis=-1, name="norm2"),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [64, 32, 64])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [64, 32, 64])
    model = helper.make_model(
        helper.make_graph(nodes, "norms", [x], [y], initializer=inits), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_weight_that_looks_merged_is_refused_unless_declared(tmp_path: Path) -> None:
    """plan.json marks the shared scale and bias ambiguous; `check --training` refuses in one line naming the
    way out; `--shared` (the source model does share them) trains them, and a `--parameters` map saying they
    are two parameters each is refused before any rank starts."""
    from unity_eq.train.check import check_training

    model = norms(tmp_path / "norms.onnx")
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    weights = json.loads((tmp_path / "plan" / "plan.json").read_text())["weights"]
    assert weights["ln.weight"]["ambiguous"] == "read as input 1 of 2 LayerNormalization nodes (norm1, norm2)"
    assert "ambiguous" not in weights["fc.weight"]
    refused = run_cli("check", str(model), str(tmp_path / "plan"), "--training", "--loss", "mean", "--steps", "1")
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "weight 'ln.bias' is read as input 2 of 2 LayerNormalization" in errors[0]
    assert "('ln.weight' likewise)" in errors[0] and "`--shared ln.bias --shared ln.weight`" in errors[0]
    shared = run_cli("check", str(model), str(tmp_path / "plan"), "--training", "--loss", "mean", "--steps", "1",
                     "--shared", "ln.weight", "--shared", "ln.bias")  # fmt: skip
    assert shared.returncode == 0, shared.stdout + shared.stderr
    assert "ok gradient of 'ln.weight'" in shared.stdout

    (tmp_path / "map.json").write_text(json.dumps({"ln.weight": ["h.0.ln.weight", "h.1.ln.weight"],
                                                   "ln.bias": ["h.0.ln.bias"], "fc.weight": "fc.weight"}))  # fmt: skip
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "--parameters", str(tmp_path / "map.json"), "-o", str(tmp_path / "mapped"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    plan = json.loads((tmp_path / "mapped" / "plan.json").read_text())
    assert plan["weights"]["ln.weight"]["merged"] == ["h.0.ln.weight", "h.1.ln.weight"]
    assert "ambiguous" not in plan["weights"]["ln.weight"]
    # two parameters' gradients and state for the merged scale, one for the bias, one for fc.weight
    assert plan["memory"]["gradient_bytes"] == 3 * 64 * 4 + 64 * 64 * 4
    with pytest.raises(ModelError, match=r"holds the source parameters h\.0\.ln\.weight, h\.1\.ln\.weight"):
        check_training(model, tmp_path / "mapped", None, loss="mean", steps=1)
