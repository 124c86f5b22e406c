"""Fused attention from the spellings exporters really write (rules/algebra/attention_exports.egg, shipped and
certified): transformers' default attention (scaled_dot_product_attention: the NaN fill) through the
TorchScript exporter, its "eager" attention (scores scaled by a constant), and LLaMA's grouped-query attention
(K/V repeated to every head) sharded by heads; each export is made here, small, and the plan that uses the
fused op computes the original outputs in onnxruntime. Unsound look-alikes of the rules are refuted by the
verifier. (The dynamo exports of GPT-2, BERT and LLaMA with the NaN fill: tests/test_attention.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from model_zoo import export_masked_transformer, masked_inputs

from unity_eq import check, optimize
from unity_eq.rulefile.certificate import load_certificate
from unity_eq.rulefile.manifest import DEFAULT_RULE_FILES, rules_dir
from unity_eq.verify import Options, load_program, verify_rules
from unity_eq.verify._bounded import prove_bounded
from unity_eq.verify._generic import prove_generic
from unity_eq.verify._guards import DerivedFacts

SEQ = 8
SHAPES = {"input_ids": (2, SEQ), "attention_mask": (2, SEQ)}
EXPORT_RULES = "algebra/attention_exports.egg"


def _export(folder: Path, name: str, kind: str, **options: Any) -> Path:
    """One layer, hidden 32, 4 heads (head dim 8: the scale 1/sqrt(8) is no power of two, so a factor moved
    from the scores onto Q rounds differently and the check's tolerance is exercised)."""
    pytest.importorskip("transformers")
    return export_masked_transformer(kind, folder / f"{name}.onnx", layers=1, hidden=32, heads=4, seq=SEQ, **options)


def _plan_ops(result: Any) -> list[str]:
    return [getattr(step, "op_type", "") for step in result.plan.steps]


def _optimize_and_check(model: Path, out: Path, devices: int, inputs: dict[str, Any] | None = None) -> Any:
    """Optimize with the shipped rules only (no opt-out for unproven ones), then check the plan. A training plan:
    it runs the fused kernel (the torch backend's), so the fused term is what it prices; an inference plan lowers
    a masked term as its composition (onnxruntime's fused kernel zeroes a fully masked row), whose price is the
    unfused chain's, so either may be chosen there."""
    result = optimize(model, devices=devices, output_dir=out, input_shapes=SHAPES, objective="training")
    ops = _plan_ops(result)
    assert ops.count("Attention") == 1 and "Softmax" not in ops, ops
    outcome = check(model, out, inputs=inputs if inputs is not None else masked_inputs(2, seq=SEQ))
    assert outcome.passed, outcome.describe()
    return result


def test_the_export_rules_ship_with_a_certificate() -> None:
    """In the manifest, and every rewrite of the file proven for every shape (generic), not left out."""
    assert EXPORT_RULES in DEFAULT_RULE_FILES
    assert not (rules_dir() / "algebra" / "attention_nan_fill.egg").exists()
    cert = load_certificate(rules_dir() / "proofs.json")
    for name in ("attention-fuse-mask-nan-fill", "attention-fuse-nan-fill", "attention-fuse-scaled-mask",
                 "attention-fuse-scaled"):  # fmt: skip
        assert cert.rules[name]["proof"] == "generic", name


def test_eager_attention_scaled_scores_fuses_and_checks(tmp_path: Path) -> None:
    """transformers' eager attention: Softmax(MatMul(Q, Kᵀ) * c + mask) @ V with c = 1/sqrt(8) of rank 0. The
    fused op takes Q * c; on 2 devices the plan computes the original output."""
    model = _export(tmp_path, "gpt2_eager", "gpt2", attention="eager")
    _optimize_and_check(model, tmp_path / "plan", devices=2)


def test_torchscript_export_with_an_infinite_mask_fuses_and_checks(tmp_path: Path) -> None:
    """The TorchScript exporter writes the NaN fill with a fill of shape [1] and a causal mask of -inf (not
    the dtype's minimum): with padding, a row can see no key at all, its softmax is NaN and the fill gives 0.
    The fused op (ONNX Attention) gives such a row what the composition gives."""
    model = _export(tmp_path, "gpt2_ts", "gpt2", dynamo=False)
    inputs = masked_inputs(2, seq=SEQ)
    inputs["attention_mask"][1, :3] = 0  # left padding: the first query rows of batch 1 see only padding
    _optimize_and_check(model, tmp_path / "plan", devices=1, inputs=inputs)


#: Two devices that compute slowly for their link: every op pays to shard (docs/machines.md's fields).
SLOW_DEVICES = """
name = "slow-pair"
[devices.slow]
peak_tflops = { float32 = 0.001 }
memory_bandwidth_gbs = 0.01
memory_gib = 16
[links.fast]
bandwidth_gbs = 1000
latency_us = 0.001
[[nodes]]
devices = { slow = 2 }
link = "fast"
"""


def test_grouped_query_attention_fuses_and_shards_by_heads(tmp_path: Path) -> None:
    """LLaMA with 2 key/value heads for 4 query heads: the export repeats K/V to every head (Unsqueeze, Expand,
    Reshape) before the NaN-fill spelling, so the fused op reads the repeated K/V. One sequence (the batch
    cannot split) on devices that compute slowly for their link: the fused op is sharded by heads (its Q
    S(1)), and the plan computes the original output."""
    model = _export(tmp_path, "llama_gqa", "llama", kv_heads=2)
    machine = tmp_path / "slow.toml"
    machine.write_text(SLOW_DEVICES)
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    result = optimize(
        model, devices=2, output_dir=tmp_path / "plan", input_shapes=shapes, machine=machine, objective="training"
    )  # fmt: skip  (the fused kernel runs in training: _optimize_and_check)
    ops = _plan_ops(result)
    assert ops.count("Attention") == 1 and "Softmax" not in ops, ops
    record = json.loads((tmp_path / "plan" / "plan.json").read_text())
    (step,) = [s for s in record["steps"] if s.get("op") == "Attention"]
    assert record["tensors"][step["inputs"][0]]["placement"] == ["S(1)"], step
    inputs = {name: value[:1] for name, value in masked_inputs(2, seq=SEQ).items()}
    outcome = check(model, tmp_path / "plan", inputs=inputs)
    assert outcome.passed, outcome.describe()


# ----------------------------------------------------------------------------------------------------------
# Unsound look-alikes: the verifier refutes them (bounded counterexample; no generic proof)

_LOOK_ALIKES = {
    # the mask scaled with the scores: the fused op scales Q (the scores) only
    "scale-over-the-mask": """
(rewrite (MatMul (Softmax (Mul (Add (MatMul q kt) m) c) 3) v)
         (Attention (Mul q c) kt v m (NoneT) 1.0 0)
         :when ((= 4 (vec-length (shape q))) (= 4 (vec-length (shape kt))) (= 4 (vec-length (shape v)))
                (= 0 (vec-length (shape c))) (<= (vec-length (shape m)) 4))
         :ruleset algebra :name "scale-over-the-mask")
""",
    # the factor moved onto V: it scales the output, not the scores inside the softmax
    "scale-on-v": """
(rewrite (MatMul (Softmax (Mul (MatMul q kt) c) 3) v)
         (Attention q kt (Mul v c) (NoneT) (NoneT) 1.0 0)
         :when ((= 4 (vec-length (shape q))) (= 4 (vec-length (shape kt))) (= 4 (vec-length (shape v)))
                (= 0 (vec-length (shape c))))
         :ruleset algebra :name "scale-on-v")
""",
    # the softmax over the queries (axis 2), not the keys: the fused op normalizes each query's row
    "softmax-over-queries": """
(rewrite (MatMul (Where (IsNaN (Softmax (MatMul q kt) 2)) f (Softmax (MatMul q kt) 2)) v)
         (Attention q kt v (NoneT) f 1.0 0)
         :when ((= 4 (vec-length (shape q))) (= 4 (vec-length (shape kt))) (= 4 (vec-length (shape v))))
         :ruleset algebra :name "softmax-over-queries")
""",
    # the mask transposed (keys by queries) and fused as it was: a causal mask would hide the past
    "mask-transposed": """
(rewrite (MatMul (Softmax (Add (MatMul q kt) (Transpose m p)) 3) v)
         (Attention q kt v m (NoneT) 1.0 0)
         :when ((= 4 (vec-length (shape q))) (= 4 (vec-length (shape kt))) (= 4 (vec-length (shape v)))
                (= 4 (vec-length (shape m))) (= p (vec-of 0 1 3 2)))
         :ruleset algebra :name "mask-transposed")
""",
}


def _look_alike(name: str, folder: Path) -> Any:
    path = folder / f"{name}.egg"
    path.write_text(_LOOK_ALIKES[name])
    return path


def test_verify_refutes_an_unsound_look_alike(tmp_path: Path) -> None:
    """`unity-eq verify`'s verdict (the API the command runs) on the scale moved onto V: refuted, with a
    counterexample, and no generic proof."""
    result = verify_rules([_look_alike("scale-on-v", tmp_path)], options=Options(jobs=1, numeric=False))
    assert result.errors == [], result.errors
    (report,) = result.rules
    assert report.status == "refuted" and report.counterexample is not None, (report.status, report.message)
    assert report.generic is not None and not report.generic.proven


@pytest.mark.parametrize("name", sorted(set(_LOOK_ALIKES) - {"scale-on-v"}))
def test_unsound_look_alikes_are_refuted(name: str, tmp_path: Path) -> None:
    """The verifier's two proofs of each other look-alike, as verify runs them, but the bounded one lazily
    (it stops at the first counterexample instead of enumerating every case first, as a verify run does to
    check the smallest first): a counterexample, and no generic proof."""
    program, _files = load_program([_look_alike(name, tmp_path)])
    assert program.errors == [], program.errors
    rule = program.rules[-1]
    facts = DerivedFacts(program.analyses)
    bounded = prove_bounded(rule, facts, lazy=True)
    assert bounded.status == "refuted" and bounded.counterexample is not None, (bounded.status, bounded.reason)
    assert not prove_generic(rule, facts, 500, True).proven


def _divided_attention(path: Path, divisor: float) -> Path:
    """BERT's attention as transformers wrote it before the sdpa default (and as many hand-written models do):
    scores divided by sqrt(d), an additive mask input, 4 heads of 8 (hidden 32, sequence 8)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    b, s, h, heads = 2, SEQ, 32, 4
    d = h // heads
    inits = [numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32) / 4, n)
             for n in ("wq", "wk", "wv", "wo")]  # fmt: skip
    inits += [
        numpy_helper.from_array(np.array([b, s, heads, d], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([b, s, h], np.int64), "hidden_shape"),
        numpy_helper.from_array(np.array(divisor, np.float32), "sqrt_d"),
    ]
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            helper.make_node("MatMul", ["X", f"w{name}"], [f"{name}.mm"], name=f"{name}.mm"),
            helper.make_node("Reshape", [f"{name}.mm", "heads_shape"], [f"{name}.heads"], name=f"{name}.heads"),
            helper.make_node("Transpose", [f"{name}.heads"], [f"{name}.t"], name=f"{name}.t", perm=perm),
        ]
    nodes += [
        helper.make_node("MatMul", ["q.t", "k.t"], ["scores"], name="scores"),
        helper.make_node("Div", ["scores", "sqrt_d"], ["scaled"], name="scaled"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"], name="masked"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="probs", axis=-1),
        helper.make_node("MatMul", ["probs", "v.t"], ["context"], name="context"),
        helper.make_node("Transpose", ["context"], ["context.t"], name="context.t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context.t", "hidden_shape"], ["merged"], name="merged"),
        helper.make_node("MatMul", ["merged", "wo"], ["Y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "divided_attention",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [b, s, h]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, s]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [b, s, h])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_scores_divided_by_sqrt_d_fuse_and_check(tmp_path: Path) -> None:
    """`Div(MatMul(Q, Kᵀ), sqrt(d))`: the fused op divides Q instead, for a float divisor the encoder knows has
    no zero (`nonzero-values`), and the plan computes the original outputs."""
    import numpy as np

    model = _divided_attention(tmp_path / "divided.onnx", float(np.sqrt(8.0)))
    result = optimize(model, devices=2, output_dir=tmp_path / "plan")
    ops = _plan_ops(result)
    assert ops.count("Attention") == 1 and "Softmax" not in ops, ops
    rng = np.random.default_rng(1)
    mask = np.where(rng.random((2, 1, 1, SEQ)) < 0.25, -1e4, 0.0).astype(np.float32)
    inputs = {"X": rng.standard_normal((2, SEQ, 32)).astype(np.float32), "mask": mask}
    outcome = check(model, tmp_path / "plan", inputs=inputs)
    assert outcome.passed, outcome.describe()


def test_a_divisor_that_may_be_zero_does_not_fuse(tmp_path: Path) -> None:
    """Divided by 0 the scores are no numbers, and the two sides' infinities differ (verify refutes the rule
    without the `nonzero-values` guard): the encoder states no such fact for a 0, and the scores stay unfused."""
    model = _divided_attention(tmp_path / "zero.onnx", 0.0)
    result = optimize(model, devices=1, output_dir=tmp_path / "plan", plan_only=True)
    ops = _plan_ops(result)
    assert "Attention" not in ops and "Softmax" in ops, ops
