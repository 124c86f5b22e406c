"""A ReduceMean loss shards: reduce-mean-split-reduced (rules/parallel/layout.egg) averages over another reduced
dim on each device and all-gathers only that small result, where the plan used to all-gather the whole
log-probability tensor before one replicated mean. The plans come from the real pipeline (egglog, cost model,
lowering) and run in onnxruntime against the original model."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unity_eq import optimize
from unity_eq.egraph import Limits, encode, parse_serialized, saturate
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ir import Mesh, Shard
from unity_eq.rulefile.manifest import load_rule_files
from unity_eq.runtime import check

# batch, sequence, hidden, vocabulary: the log-probs [16, 64, 2048] are 8 MiB, big enough that the cost model
# shards them on 8 devices (before the rule, its plan all-gathered them), small enough to check in a second
B, S, H, V = 16, 64, 32, 2048


def _loss_model(path: Path) -> Path:
    """logits = X @ W [B, S, V] → LogSoftmax over the vocabulary → ReduceMean over every axis (a scalar loss)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((H, V)) * 0.1).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["logits"], name="head"),
        helper.make_node("LogSoftmax", ["logits"], ["logprobs"], axis=-1, name="log_softmax"),
        helper.make_node("ReduceMean", ["logprobs"], ["loss"], keepdims=0, name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "mean_loss",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [B, S, H])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_a_mean_loss_gathers_only_small_partial_means_and_checks(tmp_path: Path) -> None:
    model = _loss_model(tmp_path / "loss.onnx")
    out = tmp_path / "plan"
    plan = optimize(model, devices=8, objective="training", mesh="8", output_dir=out).plan
    logprobs = [t.placement for t in plan.tensors.values() if t.value == "logprobs"]
    assert logprobs == [(Shard(0),)]  # the big tensor is computed sharded over the batch, and never gathered
    collectives = plan.collectives()
    assert collectives, "a mean over a sharded dim needs a collective"
    for step in collectives:
        # the vocabulary was averaged away on each device first: at most one value per (batch, position)
        assert math.prod(plan.tensors[step.src].shape) <= B * S, step
    result = check(model, out)  # every default draw: normal σ 1-1000, uniform ±100, integers ±8
    assert result.passed, result.describe()


def test_saturation_splits_the_mean_over_a_reduced_dim(tmp_path: Path) -> None:
    """The rule fires (the encoder gives it the reduce-map facts of a mean over each reduced axis alone, which
    egglog cannot compute), its new terms get a shape (else the extractor could not price them) and the
    e-graph keeps one placement per e-class."""
    graph = load_onnx(str(_loss_model(tmp_path / "loss.onnx")))
    encoding = encode(graph, Mesh(("x",), (8,)))
    assert "(reduce-map (vec-of 2) 1 3 0 0)" in encoding.program
    data = parse_serialized(saturate(load_rule_files(), encoding, Limits()).serialized)
    assert data.conflicts() == []
    gathered = set()
    for cls in data.classes.values():
        for node in cls.nodes:
            if node.op == "Combine" and cls.shape is not None:
                for child in data.classes[node.children[0]].nodes:
                    if child.op == "ReduceMean" and child.args[2] == 1 and len(child.args[1]) == 1:
                        gathered.add((cls.shape, node.args[1]))
    # every dim d divides by 8, so each can be the split one; each firing averages over one more of the other
    # dims first, so what is gathered is the loss's input with d whole and a non-empty set of the others at 1
    shape = (B, S, V)
    expected = set()
    for d in range(3):
        others = [i for i in range(3) if i != d]
        for size in (1, 2):
            for averaged in itertools.combinations(others, size):
                expected.add((tuple(1 if i in averaged else n for i, n in enumerate(shape)), d))
    assert gathered == expected


def _int_mean_model(path: Path) -> Path:
    """logits = X @ W in int64 [B, S, V] → ReduceMean over every axis: onnxruntime's integer mean truncates."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.integers(0, 9, (H, V)).astype(np.int64), "W")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["logits"], name="head"),
        helper.make_node("ReduceMean", ["logits"], ["loss"], keepdims=0, name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "int_mean",
        [helper.make_tensor_value_info("X", TensorProto.INT64, [B, S, H])],
        [helper.make_tensor_value_info("loss", TensorProto.INT64, [])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_an_int64_mean_is_never_split_into_truncated_partial_means(tmp_path: Path) -> None:
    """reduce-mean-split-reduced holds on floats only (each partial mean truncates on integers: the int64 mean of
    [[1, 2], [2, 3]] is 2, the mean of its row means 1 and 2 is 1), so its `(float-dtype (dtype a))` guard keeps
    it off an int64 ReduceMean: the plan's answer is exactly onnxruntime's on 2 and 4 devices."""
    import onnxruntime as ort

    from unity_eq.runtime import run_plan

    model = _int_mean_model(tmp_path / "int_mean.onnx")
    rng = np.random.default_rng(2)
    # non-negative values: each truncated partial mean loses 0.5 on average, so the mean of them is lower by
    # about 0.5 and truncates to one less (with values around 0 the errors would cancel)
    x = rng.integers(0, 10, (B, S, H)).astype(np.int64)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"X": x})
    for devices in (2, 4):
        out = tmp_path / f"plan{devices}"
        optimize(model, devices=devices, objective="training", mesh=str(devices), output_dir=out)
        got = run_plan(out, {"X": x})["loss"]
        assert got.dtype == np.int64 and np.array_equal(got, want), (devices, got, want)
