"""Training with a plan (unity_eq.train): the torch interpreter against onnxruntime, `check --training` on a
Megatron MLP (2 ranks), a 2x2 data x tensor parallel transformer (4 ranks), and deliberately wrong plans (a
gradient all-reduce dropped, a wrong slice), `train` under torchrun with a checkpoint saved and loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from conftest import EXAMPLES, run_cli, torchrun  # noqa: E402

from unity_eq.train.reference import OnnxModule  # noqa: E402


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Training plans, made once: mlp on 2 devices (Megatron), transformer on 4 (data parallel) and on a 2x2
    mesh (data x tensor parallel), mlp on a 2x2 mesh."""
    out = tmp_path_factory.mktemp("train-plans")
    made = {}
    for name, model, extra in [
        ("mlp2", "mlp", ["--devices", "2"]),
        ("tf4", "transformer", ["--devices", "4", "--mesh", "4"]),
        ("tf22", "transformer", ["--devices", "4", "--mesh", "2x2"]),
        ("mlp22", "mlp", ["--devices", "4", "--mesh", "2x2"]),
    ]:
        result = run_cli("optimize", str(EXAMPLES / f"{model}.onnx"), "--objective", "training", *extra,
                         "-o", str(out / name), "-q")  # fmt: skip
        assert result.returncode == 0, result.stderr
        made[name] = out / name
    return made


def _steps(plan: Path) -> list[dict]:
    return json.loads((plan / "plan.json").read_text())["steps"]


@pytest.mark.parametrize("name", ["mlp", "transformer", "branches"])
def test_torch_interpreter_matches_onnxruntime(name: str) -> None:
    """The reference side of `check --training` computes what onnxruntime computes."""
    path = EXAMPLES / f"{name}.onnx"
    x = np.random.default_rng(0).standard_normal((8, 128, 256)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    with torch.no_grad():
        got = OnnxModule(path)({"X": torch.from_numpy(x)})["Y"].numpy()
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-5


def test_check_training_megatron_mlp_on_2_ranks(plans: dict[str, Path]) -> None:
    steps = _steps(plans["mlp2"])
    assert any(s["kind"] == "reduce" for s in steps), "expected a tensor-parallel (Megatron) plan"
    result = run_cli("check", str(EXAMPLES / "mlp.onnx"), str(plans["mlp2"]), "--training", "--loss", "mean")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok gradient of 'fc1.weight'" in result.stdout
    assert "ok collectives all_reduce on axis x (forward), rank 0: issued 1" in result.stdout


def test_check_training_2x2_data_and_tensor_parallel_transformer(plans: dict[str, Path]) -> None:
    plan = json.loads((plans["tf22"] / "plan.json").read_text())
    reduces = {s["axis"] for s in plan["steps"] if s["kind"] == "reduce"}
    partitions = {s["axis"] for s in plan["steps"] if s["kind"] == "partition" and s["src"].endswith("weight")}
    assert reduces and partitions, "expected tensor-parallel layers (weights sharded, partial sums reduced)"
    result = run_cli("check", str(EXAMPLES / "transformer.onnx"), str(plans["tf22"]), "--training", "--loss", "mean",
                     "--optimizer", "adamw", "--lr", "1e-3", "--steps", "3")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for axis in ("x", "y"):  # both axes carry gradient all-reduces or activation-gradient all-reduces
        assert f"axis {axis}" in result.stdout


def test_check_training_fails_on_a_dropped_gradient_all_reduce(plans: dict[str, Path], tmp_path: Path) -> None:
    """A data-parallel plan whose ffn.down.weight replicate step is gone: each replica trains on its own batch
    shard's gradient."""
    plan = tmp_path / "plan"
    shutil.copytree(plans["tf4"], plan)
    meta = json.loads((plan / "plan.json").read_text())
    index = next(i for i, s in enumerate(meta["steps"]) if s["kind"] == "replicate" and s["src"] == "ffn.down.weight")
    step = meta["steps"][index]
    meta["steps"][index] = {"kind": "weight", "out": step["out"], "name": "ffn.down.weight"}
    (plan / "plan.json").write_text(json.dumps(meta))
    result = run_cli("check", str(EXAMPLES / "transformer.onnx"), str(plan), "--training", "--loss", "mean",
                     "--steps", "1")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: training does not match one device: gradient of 'ffn.down.weight'" in result.stderr
    # the float64 second opinion does not rescue a wrong plan: it measures it against float64 and keeps the verdict
    assert "the plan is beyond tolerance of the float64 result" in result.stderr


def test_check_training_float64_second_opinion_reports_what_it_measured(plans: dict[str, Path]) -> None:
    """With a tolerance below float32 rounding every comparison mismatches, so each is judged again against
    one-device training in float64, and the line gives both figures: the plan's error and one-device float32
    training's against float64. Both are float32 rounding (above 0, far below 1e-4), and the verdict stays."""
    result = run_cli(
        "check",
        str(EXAMPLES / "transformer.onnx"),
        str(plans["tf4"]),
        "--training",
        "--loss",
        "mean",
        "--steps",
        "1",
        "--tolerance",
        "1e-12",
    )  # fmt: skip (data parallel: sums in another order)
    assert result.returncode == 1, result.stdout + result.stderr
    found = re.findall(r"plan off by ([0-9.e+-]+), one-device float32 off by ([0-9.e+-]+)", result.stdout)
    assert len(found) >= 3, result.stdout  # gradients and weights that differ in float32 rounding
    for plan, one in found:
        assert 0 < float(plan) < 1e-5 and 0 < float(one) < 1e-5
    assert "the plan is beyond tolerance of the float64 result" in result.stdout


def test_a_mismatch_within_tolerance_of_float64_training_passes() -> None:
    """The merge of the second opinion: a float32 mismatch whose plan is within tolerance of float64 training
    passes; one beyond it keeps failing; a line without a measured quantity (coverage) is left alone."""
    from unity_eq.train.check import TrainingCheck, judged_again

    first = TrainingCheck(1e-4)
    first.add(False, "gradient of 'a': worst relative error 3.00e-04 (rank 0)", "gradient 'a'", 3e-4)
    first.add(False, "gradient of 'b': worst relative error 5.00e-01 (rank 1)", "gradient 'b'", 0.5)
    first.add(False, "gradient of 'c': the ranks' pieces cover 50% of it")
    first.add(True, "loss of step 1: 1.5 (one device), worst relative error 1.00e-07", "loss 1", 1e-7)
    plan64, ref64 = TrainingCheck(1e-4), TrainingCheck(1e-4)
    plan64.add(True, "", "gradient 'a'", 2e-5)
    plan64.add(False, "", "gradient 'b'", 0.5)
    ref64.add(False, "", "gradient 'a'", 3.1e-4)
    ref64.add(True, "", "gradient 'b'", 1e-6)
    again = judged_again(first, plan64, ref64)
    assert [ok for ok, _ in again.lines] == [True, False, False, True]
    assert "plan off by 2.00e-05, one-device float32 off by 3.10e-04; the plan is within" in again.lines[0][1]
    assert "plan off by 5.00e-01, one-device float32 off by 1.00e-06; the plan is beyond" in again.lines[1][1]
    assert again.lines[2:] == first.lines[2:]
    assert not again.passed and again.first_failure() == again.lines[1][1]


def test_check_training_fails_when_the_collectives_differ_from_the_prices(
    plans: dict[str, Path], tmp_path: Path
) -> None:
    """The ranks issue ffn.down.weight's gradient all-reduce, which a plan.json edited to price it at 0 does not
    predict: the gradients match, the collective count does not."""
    plan = tmp_path / "plan"
    shutil.copytree(plans["tf4"], plan)
    meta = json.loads((plan / "plan.json").read_text())
    step = next(s for s in meta["steps"] if s["kind"] == "replicate" and s["src"] == "ffn.down.weight")
    step["communication_s"] = 0.0
    (plan / "plan.json").write_text(json.dumps(meta))
    result = run_cli("check", str(EXAMPLES / "transformer.onnx"), str(plan), "--training", "--loss", "mean",
                     "--steps", "1")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ok gradient of 'ffn.down.weight'" in result.stdout
    assert "MISMATCH collectives all_reduce on axis x (gradient), rank 0: issued" in result.stdout


def test_check_training_fails_on_a_wrong_slice(plans: dict[str, Path], tmp_path: Path) -> None:
    """fc1.weight's chunk taken by the coordinate of the other mesh axis (same size, so the shapes still fit)."""
    plan = tmp_path / "plan"
    shutil.copytree(plans["mlp22"], plan)
    meta = json.loads((plan / "plan.json").read_text())
    step = next(s for s in meta["steps"] if s["kind"] == "partition" and s["src"] == "fc1.weight")
    step["axis"] = {"x": "y", "y": "x"}[step["axis"]]
    (plan / "plan.json").write_text(json.dumps(meta))
    result = run_cli("check", str(EXAMPLES / "mlp.onnx"), str(plan), "--training", "--loss", "sum", "--steps", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: training does not match one device" in result.stderr


def test_check_training_refuses_another_models_plan(plans: dict[str, Path]) -> None:
    result = run_cli("check", str(EXAMPLES / "transformer.onnx"), str(plans["mlp2"]), "--training", "--loss", "sum")
    assert result.returncode == 2
    assert "is not the model" in result.stderr and "Traceback" not in result.stderr


def test_a_damaged_pipeline_plan_is_refused_in_one_line(tmp_path: Path) -> None:
    """Pipeline plans train (tests/test_train_pipeline.py); one whose plan.json lacks its fields is refused as
    `run` refuses it."""
    (tmp_path / "plan.json").write_text(json.dumps({"format_version": 1, "plan": "pipeline"}))
    result = run_cli("check", str(EXAMPLES / "mlp.onnx"), str(tmp_path), "--training", "--loss", "sum")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "plan.json: missing field" in errors[0]


def _torchrun(n: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*torchrun(n), "-m", "unity_eq", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def test_train_under_torchrun_saves_and_loads_a_checkpoint(plans: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "mlp.pt"
    first = _torchrun(2, "train", str(plans["mlp2"]), "--steps", "2", "--loss", "mean", "--save", str(ckpt))
    assert first.returncode == 0, first.stdout + first.stderr
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in first.stdout.splitlines() if "loss" in line]
    assert len(losses) == 2 and losses[1] < losses[0]
    saved = torch.load(ckpt, weights_only=True)
    assert {k: list(v.shape) for k, v in saved.items()} == {
        "fc1.weight": [256, 1024],
        "fc1.bias": [1024],
        "fc2.weight": [1024, 256],
        "fc2.bias": [256],
    }  # the source model's names and shapes, gathered from the shards
    again = _torchrun(2, "train", str(plans["mlp2"]), "--steps", "1", "--loss", "mean", "--load", str(ckpt))
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = float(next(line for line in again.stdout.splitlines() if "loss" in line).split("loss ")[1].split(",")[0])
    assert resumed < losses[1]  # it continued from the trained weights
    wrong = _torchrun(1, "train", str(plans["mlp2"]), "--steps", "1", "--loss", "mean")
    assert wrong.returncode != 0
    errors = [line for line in wrong.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: world size: torchrun started 1 processes, the plan")
    # torchrun's launcher reports the failed child with a traceback of its own; none comes from unity-eq's code
    assert not [line for line in wrong.stderr.splitlines() if "File " in line and "unity_eq" in line]


def test_python_api_example_of_the_docs_runs(plans: dict[str, Path], tmp_path: Path) -> None:
    """docs/training.md's training loop, as written there, on the 2-rank MLP plan."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    code = text.split("## Your own training loop")[1].split("```python")[1].split("```")[0]
    script = tmp_path / "my_train.py"
    script.write_text(
        code.replace('"plan/"', repr(str(plans["mlp2"]))).replace('"model.pt"', repr(str(tmp_path / "m.pt")))
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*torchrun(2), str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(line.split()[1]) for line in result.stdout.splitlines()]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert set(torch.load(tmp_path / "m.pt", weights_only=True)) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def test_checkpoint_errors_are_one_line(tmp_path: Path) -> None:
    """A 1-rank plan in this process: a checkpoint missing a parameter, or with a wrong shape, is an OptionError
    naming it; the checkpoint is written whole (no temporary file left)."""
    import torch.distributed as dist

    from unity_eq.errors import OptionError
    from unity_eq.train import load_rank

    made = run_cli("optimize", str(EXAMPLES / "mlp.onnx"), "--devices", "1", "--objective", "training",
                   "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    from unity_eq.train.check import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        trainer = load_rank(tmp_path / "plan")
        good = tmp_path / "good.pt"
        trainer.save(good)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["good.pt", "plan"]
        saved = torch.load(good, weights_only=True)
        missing, wrong = dict(saved), dict(saved)
        del missing["fc2.bias"]
        wrong["fc1.weight"] = wrong["fc1.weight"][:, :3]
        torch.save(missing, tmp_path / "missing.pt")
        torch.save(wrong, tmp_path / "wrong.pt")
        with pytest.raises(OptionError, match=r"has no parameter 'fc2\.bias'"):
            trainer.load(tmp_path / "missing.pt")
        with pytest.raises(
            OptionError, match=r"parameter 'fc1.weight' has shape \[256, 3\], the model's is \[256, 1024\]"
        ):
            trainer.load(tmp_path / "wrong.pt")
        trainer.load(good)
    finally:
        dist.destroy_process_group()


def test_check_training_data_parallel_gpt2(tmp_path: Path) -> None:
    """A transformers GPT-2 (2 layers, random weights, attention mask) exported by torch's dynamo exporter,
    planned data parallel on 2 devices: every parameter's gradient matches one device; the exporter's scalar
    constants (GELU's, the mask's fill value) and the causal mask are not trained and plan.json prices them no
    gradient all-reduce (it did, and the check said so in a note)."""
    from model_zoo import export_masked_transformer, masked_inputs

    model = export_masked_transformer("gpt2", tmp_path / "gpt2.onnx", distinct=True)
    shapes = ["--input-shape", "input_ids=16x16", "--input-shape", "attention_mask=16x16"]
    made = run_cli("optimize", str(model), "--devices", "2", "--mesh", "2", "--objective", "training", *shapes,
                   "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert any(s["kind"] == "replicate" and s["src"] == "wte.weight" for s in _steps(tmp_path / "plan"))
    np.savez(tmp_path / "batch.npz", **masked_inputs(16))
    result = run_cli("check", str(model), str(tmp_path / "plan"), "--training", "--loss", "sum",
                     "--inputs", str(tmp_path / "batch.npz"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok gradient of 'wte.weight'" in result.stdout
    assert "ok gradient of 'h.1.attn.c_attn.weight'" in result.stdout
    assert "no gradient flows" not in result.stderr
    weights = json.loads((tmp_path / "plan" / "plan.json").read_text())["weights"]
    assert weights["bitwise_and"] == {"trainable": False, "how": "constant"}  # the causal mask (bool)
    assert not any(w.get("ambiguous") for w in weights.values())


def test_an_op_family_brings_its_own_torch_semantics(tmp_path: Path) -> None:
    """SpaceToDepth is a plug-in family with an `OpFamily.torch` hook (no entry in the torch backend's table):
    the interpreter runs it as onnxruntime does; an op with neither is refused naming the op and the node."""
    from onnx import TensorProto, helper

    from unity_eq.errors import PlanError
    from unity_eq.train.torch_ops import TORCH_OPS

    assert "SpaceToDepth" not in TORCH_OPS
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12, 4, 2])
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], name="s2d", blocksize=2)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    value = np.random.default_rng(0).standard_normal((2, 3, 8, 4)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": value}
    )
    got = OnnxModule(model)({"x": torch.from_numpy(value)})["y"].numpy()
    assert np.array_equal(got, expected[0])
    model.graph.node[0].op_type = "DepthToSpaceish"
    with pytest.raises(PlanError, match="op DepthToSpaceish \\(node s2d\\) has no PyTorch semantics"):
        OnnxModule(model)


def test_a_weight_the_frontend_folded_trains_its_source(tmp_path: Path) -> None:
    """``Y = Relu(X @ W + b) @ Transpose(W)``: the frontend folds ``Transpose(W)`` into an initializer of its own,
    which the ranks compute again from W's parameter, so W's gradient is whole (without that it was off by 73%).
    W is then held whole on each rank and its sharded uses all-gather their gradients, which plan.json does not
    price (it prices a folded weight as a weight of its own): the check says so and fails on the count."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 512)) / 16).astype(np.float32)
    b = (rng.standard_normal(512) / 16).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h0"], name="up"),
        helper.make_node("Add", ["h0", "b"], ["h1"], name="bias"),
        helper.make_node("Relu", ["h1"], ["h"], name="relu"),
        helper.make_node("Transpose", ["W"], ["Wt"], name="tie", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "Wt"], ["Y"], name="down"),
    ]
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [8, 64, 256])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, 64, 256])
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")]
    model = helper.make_model(helper.make_graph(nodes, "tied", [x], [y], initializer=inits),
                              opset_imports=[helper.make_opsetid("", 18)])  # fmt: skip
    model.ir_version = 8
    path = tmp_path / "tied.onnx"
    path.write_bytes(model.SerializeToString())
    made = run_cli("optimize", str(path), "--devices", "2", "--mesh", "2", "--objective", "training",
                   "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    steps = _steps(tmp_path / "plan")
    assert any(s["kind"] == "weight" and s["name"] == "Wt" for s in steps)  # the folded weight, as the plan has it
    result = run_cli("check", str(path), str(tmp_path / "plan"), "--training", "--loss", "mean", "--steps", "1")
    assert "ok gradient of 'W'" in result.stdout, result.stdout + result.stderr
    assert "ok loss of step 1" in result.stdout
    if any(s["kind"] == "partition" and s["src"] in ("W", "Wt") for s in steps):
        assert result.returncode == 1
        assert "MISMATCH collectives all_gather on axis x (backward), rank 0: issued" in result.stdout
    else:
        assert result.returncode == 0, result.stdout


def test_inputs_of_the_wrong_shape_are_one_line(plans: dict[str, Path], tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", X=np.zeros((4, 128, 256), np.float32))
    result = run_cli("check", str(EXAMPLES / "mlp.onnx"), str(plans["mlp2"]), "--training", "--loss", "sum",
                     "--inputs", str(tmp_path / "bad.npz"))  # fmt: skip
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: inputs: 'X' has shape [4, 128, 256], the plan was made for [8, 128, 256]. Re-run "
                      "`unity-eq optimize` with `--input-shape`."]  # fmt: skip


def test_check_training_llama_with_grouped_query_attention(tmp_path: Path) -> None:
    """A transformers LLaMA (4 heads reading 2 key/value heads, RMSNorm, rotary tables, SiLU MLP), exported by
    dynamo without its optimizer so every parameter keeps its name, planned with `--parameters` (the rotary
    tables the exporter writes as float initializers are then constants), trains on 2 ranks like one device:
    each of its 11 parameters' gradients in the source names, and the collectives the plan priced."""
    pytest.importorskip("transformers")
    from model_zoo import export_masked_transformer, masked_inputs

    params = tmp_path / "params.json"
    model = export_masked_transformer(
        "llama", tmp_path / "llama.onnx", layers=1, heads=4, kv_heads=2, distinct=True, parameters=params,
        optimize=False,
    )  # fmt: skip
    shapes = ("--input-shape", "input_ids=64x16", "--input-shape", "attention_mask=64x16")
    made = run_cli("optimize", str(model), "--objective", "training", "--devices", "2", "--mesh", "2", *shapes,
                   "--parameters", str(params), "-o", str(tmp_path / "plan"), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    np.savez(tmp_path / "batch.npz", **masked_inputs(64))
    result = run_cli("check", str(model), str(tmp_path / "plan"), "--training", "--loss", "sum", "--steps", "1",
                     "--inputs", str(tmp_path / "batch.npz"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trained = re.findall(r"ok gradient of '([^']+)'", result.stdout)
    assert sorted(trained) == sorted(json.loads(params.read_text())), trained
    assert "ok collectives all_reduce on axis x (gradient), rank 0" in result.stdout


@pytest.fixture(scope="module")
def one_device_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled transformer's one-device training plan: one rank, which one GPU can run under NCCL."""
    out = tmp_path_factory.mktemp("train-one") / "tf1"
    result = run_cli("optimize", str(EXAMPLES / "transformer.onnx"), "--objective", "training", "--devices", "1",
                     "-o", str(out), "-q")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


def _losses(stdout: str) -> list[float]:
    return [float(line.split("loss ")[1].split(",")[0]) for line in stdout.splitlines() if line.startswith("step ")]


def test_train_device_cuda_without_a_gpu_trains_on_the_cpu_with_one_note(one_device_plan: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: test_train_on_cuda_where_there_is_one runs instead")
    result = _torchrun(1, "train", str(one_device_plan), "--steps", "2", "--loss", "mean", "--device", "cuda")
    assert result.returncode == 0, result.stdout + result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == ["note: `--device cuda`: torch sees no CUDA device; training on the CPU (gloo)"], result.stderr
    losses = _losses(result.stdout)
    assert len(losses) == 2 and losses[1] < losses[0]


def test_train_on_cuda_where_there_is_one(one_device_plan: Path) -> None:
    """NCCL with one rank on the GPU: the loss falls as on the CPU, and the step time is reported beside the
    plan's prediction (benchmarks/gpu.sh measures the figures)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: test_train_device_cuda_without_a_gpu_trains_on_the_cpu_with_one_note runs instead")
    cpu = _torchrun(1, "train", str(one_device_plan), "--steps", "3", "--loss", "mean", "--device", "cpu")
    gpu = _torchrun(1, "train", str(one_device_plan), "--steps", "3", "--loss", "mean", "--device", "cuda")
    assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stdout + gpu.stderr + cpu.stderr
    assert not [line for line in gpu.stderr.splitlines() if line.startswith("note:")], gpu.stderr
    on_gpu, on_cpu = _losses(gpu.stdout), _losses(cpu.stdout)
    assert len(on_gpu) == 3 and on_gpu[2] < on_gpu[0]
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-3)  # float32 on both; the GPU sums in another order
    said = gpu.stdout + gpu.stderr  # the step-time summary is a message (stderr), the losses are output (stdout)
    assert "step time: measured" in said and "plan.json predicts" in said


def test_check_training_of_a_one_device_plan_finishes(one_device_plan: Path) -> None:
    """One rank, which gets every core: it used to be forked after the one-device reference had run torch's
    OpenMP pool, and hung in its first parallel region (unity_eq.train.spawn.start_method)."""
    result = run_cli("check", str(EXAMPLES / "transformer.onnx"), str(one_device_plan), "--training", "--steps", "1",
                     "--loss", "mean", timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok gradient of 'attn.q.weight'" in result.stdout


def test_a_bfloat16_model_trains_checks_and_saves_in_bfloat16(tmp_path: Path) -> None:
    """bfloat16 weights are parameters (ml_dtypes' bfloat16 is no numpy float), so they train, their gradients
    are all-reduced as priced, and the checkpoint keeps their type; `check --training` judges them with
    bfloat16's allowance, as `check` judges outputs."""
    sys.path.insert(0, str(EXAMPLES))
    import onnx
    from make_examples import Size, make_transformer

    model = tmp_path / "bf16.onnx"
    onnx.save(make_transformer(size=Size(4, 16, 64, 64 * 4, 4), dtype="bfloat16"), model)
    plan = tmp_path / "plan"
    made = run_cli("optimize", str(model), "--objective", "training", "--devices", "2", "--mesh", "2", "-o",
                   str(plan), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    weights = json.loads((plan / "plan.json").read_text())["weights"]
    assert weights["ffn.up.weight"]["trainable"] and weights["ln1.scale"]["trainable"]
    checked = run_cli("check", str(model), str(plan), "--training", "--steps", "2", "--loss", "mean", timeout=240)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok gradient of 'ffn.up.weight'" in checked.stdout
    ckpt = tmp_path / "bf16.pt"
    trained = _torchrun(2, "train", str(plan), "--steps", "2", "--loss", "mean", "--save", str(ckpt))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    saved = torch.load(ckpt, weights_only=True)
    assert saved["ffn.up.weight"].dtype == torch.bfloat16 and list(saved["ffn.up.weight"].shape) == [64, 256]


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_runs_in_torch_as_onnxruntime_runs_it(exclusive: int, reverse: int) -> None:
    """The exporters' position ids (``cumsum(mask) - 1``) are a CumSum in the original model, which `check
    --training`'s one-device reference runs in torch: it was refused there while `train` ran the plan (issue
    26's audit)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from unity_eq.train.torch_ops import TORCH_OPS

    x = np.random.default_rng(0).integers(0, 5, (2, 5)).astype(np.int64)
    node = helper.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 5]),
         helper.make_tensor_value_info("a", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 5])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for axis in (0, 1, -1):
        want = session.run(None, {"x": x, "a": np.array(axis)})[0]
        got = TORCH_OPS["CumSum"]([torch.tensor(x), torch.tensor(axis)], {"exclusive": exclusive, "reverse": reverse})
        np.testing.assert_array_equal(got[0].numpy(), want)
