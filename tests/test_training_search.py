"""One planner for training (unity_eq.driver.training): ``optimize --objective training`` weighs the SPMD search's plan
against pipelines of two or more stages on the same workload and writes the cheaper, with no ``--pipeline``.

The machines are made so the answer is known from the cost model's terms: on two nodes of one slow device each
(0.1 TFLOP/s, a 0.1 GB/s network) a model whose weights are large next to its activations pipelines (each
node computes half the layers, and only activations cross the network; the SPMD plans either all-reduce the
gradients of every weight over that network or leave one node idle); on one node of two such devices joined
by a fast link, a pipeline's bubble and sends cannot beat sharding over the link."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest
from conftest import run_cli
from test_stages import _layered_model

from unity_eq.errors import OptionError
from unity_eq.machine import load_machine
from unity_eq.planfile.pipeline import read_pipeline_record
from unity_eq.search.meshes import device_groups
from unity_eq.stages.run import graph_at_batch
from unity_eq.stages.search import group_sizes, priced_pairs

SLOW_TOML = """
name = "slow"
[devices.gpu]
peak_tflops = {{ float32 = 0.1, float16 = 1 }}
memory_bandwidth_gbs = 1000
memory_gib = 80
[links.fast]
bandwidth_gbs = 100
latency_us = 2
[links.net]
bandwidth_gbs = 0.1
latency_us = 5
[[nodes]]
devices = {{ gpu = {per_node} }}
link = "fast"
network = "net"
"""


def _machine(tmp_path: Path, per_node: int) -> Path:
    path = tmp_path / f"slow{per_node}.toml"
    path.write_text(SLOW_TOML.format(per_node=per_node))
    return path


def _static(path: Path, batch: int) -> Path:
    """The same model exported with a static batch: dimension 0 of its input and output fixed."""
    model = onnx.load(path)
    for value in (*model.graph.input, *model.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = batch
    static = path.with_name(path.stem + f"_b{batch}.onnx")
    onnx.save(model, static)
    return static


def test_a_dynamic_batch_is_tried_at_every_microbatch_size_that_divides_it(tmp_path: Path) -> None:
    model = _layered_model(tmp_path / "layers.onnx", layers=2)
    batched = graph_at_batch(model, None, 48)
    assert batched.micro_sizes == (1, 2, 3, 4, 6, 8, 12, 16, 24, 48) and batched.static_batch is None
    # priced: the pairs of layouts with 2+ stages; on 2 nodes of 2 (t=2 is a whole node's group, so p=2 and
    # d=1 with it: every size; t=1: p=2 with d=2, or p=4 with d=1), a 16 and 24 among them
    machine = load_machine(_machine(tmp_path, 2), nodes=2)
    pairs = priced_pairs(group_sizes(machine), device_groups(machine), 48, batched.micro_sizes, 2)
    assert {b for _, b in pairs} == set(batched.micro_sizes)
    # on one node of 2 a pipeline of 2 stages has single devices: a tensor group of 2 is left to the SPMD search
    one = load_machine(_machine(tmp_path, 2), nodes=1)
    assert {t for t, _ in priced_pairs(group_sizes(one), device_groups(one), 48, batched.micro_sizes, 2)} == {1}


def test_a_static_batch_that_does_not_divide_the_step_names_the_export(tmp_path: Path) -> None:
    model = _static(_layered_model(tmp_path / "layers.onnx", layers=2), 4)
    assert graph_at_batch(model, None, None).micro_sizes == (4,)
    with pytest.raises(OptionError) as caught:
        graph_at_batch(model, None, 6)
    message = str(caught.value)
    assert "static (4)" in message and "dynamic_shapes" in message and "`--batch N`" in message
    assert "divides the batch" not in message


def _flat(stdout: str) -> str:
    """The summary table's text with its frame and line wraps taken out (each row's cells read on)."""
    return " ".join(stdout.replace("│", " ").replace("┃", " ").split())


def test_training_pipelines_without_being_asked_where_pipelining_wins(tmp_path: Path) -> None:
    """Two nodes of one slow device: the training search picks 2 stages, writes the pipeline plan directory
    (a plan directory per stage), and its step is below the SPMD search's, both read from one plan.json."""
    model = _layered_model(tmp_path / "wide.onnx", hidden=256, seq=8)
    plan = tmp_path / "plan"
    args = ["optimize", str(model), "--machine", str(_machine(tmp_path, 1)), "--nodes", "2", "--objective"]
    proc = run_cli(*args, "training", "--batch", "16", "-o", str(plan), "--no-generated-rules", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "pipeline plan for" in proc.stdout and "pipeline chosen" in proc.stdout
    record = read_pipeline_record(plan / "plan.json")
    assert record.chosen.stages == 2 and record.lowered
    assert sorted(p.name for p in plan.iterdir()) == ["plan.json", "stage0", "stage1"]
    # the SPMD search's best on the same workload, priced as a step, is dearer than the pipeline chosen
    assert record.spmd is not None and record.spmd.step_s is not None and record.spmd.mesh is not None
    assert record.chosen.step_s < record.spmd.step_s
    # a step adds the optimizer's update to the SPMD plan's own cost
    assert record.spmd.step_s > record.spmd.cost_s  # type: ignore[operator]
    # every microbatch size that divides a replica's batch of 16 was priced, 8 and 16 included
    assert record.search.microbatch_sizes == (1, 2, 4, 8, 16) and record.search.static_batch is None
    text = run_cli("explain", str(plan))
    assert text.returncode == 0, text.stderr
    assert "SPMD search" in text.stdout and "the pipeline's" in text.stdout


def test_training_writes_the_spmd_plan_where_pipelining_loses_and_names_a_static_batch(tmp_path: Path) -> None:
    """One node of two devices on a fast link, a model exported with a static batch of 2: the SPMD plan is
    written (device files, an SPMD plan.json), and the summary says the static batch was the microbatch."""
    model = _static(_layered_model(tmp_path / "wide.onnx", hidden=256, seq=8), 2)
    plan = tmp_path / "plan"
    args = ["optimize", str(model), "--machine", str(_machine(tmp_path, 2)), "--objective", "training"]
    proc = run_cli(*args, "-o", str(plan), "--no-generated-rules", "-q")
    assert proc.returncode == 0, proc.stderr
    text = _flat(proc.stdout)
    meta = json.loads((plan / "plan.json").read_text())
    assert meta.get("plan") != "pipeline" and (plan / "device_0.onnx").exists()
    # both steps from this run, as ratios to the chosen one: the SPMD plan's is the chosen, the pipeline's above
    found = re.search(r"SPMD plan chosen; SPMD (\d+\.\d+)×, pipeline (\d+\.\d+)× the chosen step", text)
    assert found is not None, text
    assert float(found[1]) == 1.0 and float(found[2]) >= 1.0
    assert "the model's batch dimension is static (2): every microbatch is 2 samples" in text
    assert "dynamic_shapes" in text and "pass `--batch N`" in text
    # explain says it too, from plan.json: what the training search compared, and the static batch
    explained = run_cli("explain", str(plan))
    assert explained.returncode == 0, explained.stderr
    assert "the training search chose this SPMD plan" in explained.stdout and "the best pipeline" in explained.stdout
    assert "the model's batch dimension is static (2)" in explained.stdout


def test_training_refuses_before_any_search(tmp_path: Path) -> None:
    """Options that cannot apply and weights that cannot be lowered: one error line, nothing written."""
    model = _layered_model(tmp_path / "layers.onnx", layers=2)
    base = ["optimize", str(model), "--devices", "2", "--no-generated-rules", "-q", "-o", str(tmp_path / "plan")]
    proc = run_cli(*base, "--batch", "4")  # inference
    assert proc.returncode == 2 and "pass it with `--objective training` or `--pipeline`" in proc.stderr
    proc = run_cli(*base, "--objective", "training", "--batch", "4", "--mesh", "2")
    assert proc.returncode == 2 and "give its batch with `--input-shape`" in proc.stderr
    proc = run_cli(*base, "--objective", "training")  # a dynamic batch and no size for it
    assert proc.returncode == 2 and "pass `--batch N`" in proc.stderr
    weightless = onnx.load(model)
    path = tmp_path / "weightless.onnx"
    onnx.save(weightless, path, save_as_external_data=True, location="weightless.data", size_threshold=0)
    (tmp_path / "weightless.data").unlink()
    proc = run_cli(*base[:1], str(path), *base[2:], "--objective", "training", "--batch", "4")
    assert proc.returncode == 2 and "has no data" in proc.stderr and "`--plan-only`" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "plan").exists()


def test_a_batch_given_twice_with_different_sizes_is_refused(tmp_path: Path) -> None:
    """`--batch 8` with `--input-shape X=4x...`: the input shape's batch was ignored without a word (issue 26's
    audit); now the two must agree."""
    model = _layered_model(tmp_path / "layers.onnx", layers=2)
    shape = tuple(int(d.dim_value) for d in onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim[1:])
    name = onnx.load(str(model)).graph.input[0].name
    with pytest.raises(OptionError, match=r"`--batch 8` and `--input-shape .*=4x.*` disagree on the batch"):
        graph_at_batch(model, {name: (4, *shape)}, 8)
    assert graph_at_batch(model, {name: (8, *shape)}, 8).batch == 8
