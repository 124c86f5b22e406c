"""Training pipeline plans (unity_eq.train.pipeline): the bundled transformer cut into 2 stages, its microbatches
run in the plan's schedule on gloo ranks, checked against one-device training (loss, every gradient, the
weights after SGD steps within 1e-5; the collectives and point-to-point sends against plan.json), a plan with
a dropped gradient all-reduce failing, the schedules' order, and `train` under torchrun.

The transformer's batch is static (8), so each microbatch is 8 samples and a batch of 16 or 32 is 2 or 4 of
them; the one-device reference runs it in passes of 8 whose gradients accumulate (the whole batch's
gradient for a mean loss)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import EXAMPLES, run_cli, torchrun  # noqa: E402

from unity_eq.stages.schedule import in_flight  # noqa: E402
from unity_eq.train.pipeline import schedule_order  # noqa: E402

MODEL = EXAMPLES / "transformer.onnx"
TOLERANCE = "1e-5"


def _lower(table, graph_at, machine, config, out: Path) -> Path:  # type: ignore[no-untyped-def]
    """``config`` priced and lowered as ``optimize --pipeline`` lowers the search's choice."""
    from unity_eq.cost import OBJECTIVES
    from unity_eq.lower.pipeline import lower_pipeline
    from unity_eq.split import split_graph
    from unity_eq.stages.record import pipeline_record
    from unity_eq.stages.search import StageSearch, evaluate

    training = OBJECTIVES["training"]
    batch = config.data * config.microbatches * config.microbatch
    best = evaluate(config, table, machine, training, batch)
    assert best is not None, config
    record = pipeline_record(StageSearch(best, None, 1, 1), table, graph_at(8), machine, training, batch, 0.0, (8,))
    split = split_graph(graph_at(8))
    assert split is not None
    lower_pipeline(record, best, split, machine, out)
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """On 4 devices: 2 stages × 2 replicas (GPipe, ZeRO-0; ZeRO-1, 2 and 3), 2 stages × tensor groups of 2 (1F1B),
    2 microbatches each; and the search's own choice on 2 devices for a batch of 16 (1F1B, 1 replica)."""
    from unity_eq.cost import OBJECTIVES
    from unity_eq.machine import default_machine
    from unity_eq.rulefile.manifest import default_rule_files, load_rule_files
    from unity_eq.search.meshes import device_groups
    from unity_eq.stages.pieces import price_pieces
    from unity_eq.stages.run import graph_at_batch
    from unity_eq.stages.search import StageConfig

    out = tmp_path_factory.mktemp("pipeline-train")
    machine = default_machine(4)
    graph_at = graph_at_batch(MODEL, None, 32).graph_at
    rules = load_rule_files(default_rule_files(False))
    table = price_pieces(graph_at, (8,), [1, 2], machine, OBJECTIVES["training"], rules, groups=device_groups(machine))
    made = {}
    for name, config in {
        "gpipe_d2": StageConfig(stages=2, data=2, tensor=1, microbatch=8, microbatches=2, schedule="gpipe"),
        "zero1_d2": StageConfig(
            stages=2, data=2, tensor=1, microbatch=8, microbatches=2, zero=1, recompute="full", schedule="gpipe"
        ),
        "zero2_d2": StageConfig(stages=2, data=2, tensor=1, microbatch=8, microbatches=2, zero=2),
        "zero3_d2": StageConfig(stages=2, data=2, tensor=1, microbatch=8, microbatches=2, zero=3, schedule="gpipe"),
        "1f1b_t2": StageConfig(stages=2, data=1, tensor=2, microbatch=8, microbatches=2, schedule="1f1b"),
    }.items():
        made[name] = _lower(table, graph_at, machine, config, out / name)
    searched = out / "searched"
    result = run_cli("optimize", str(MODEL), "--devices", "2", "--pipeline", "--objective", "training",
                     "--batch", "16", "--stages", "2", "--tensor", "1", "--microbatches", "2", "-o", str(searched),
                     "-q")  # fmt: skip
    assert result.returncode == 0, result.stderr
    made["searched"] = searched
    return made


def _chosen(plan: Path) -> dict:
    return json.loads((plan / "plan.json").read_text())["chosen"]


def _check(plan: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", str(MODEL), str(plan), "--training", "--loss", "mean", "--tolerance", TOLERANCE, *extra)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 2), (2, 5), (3, 4), (4, 2)])
def test_schedule_order_runs_each_microbatch_once_and_holds_what_the_cost_model_says(
    schedule: str, stages: int, microbatches: int
) -> None:
    """Every microbatch's forward before its backward, backwards in microbatch order (the next stage's order),
    and at most ``in_flight`` microbatches held at once: the memory the stage search priced."""
    for stage in range(stages):
        order = schedule_order(schedule, stage, stages, microbatches)
        every = [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
        assert sorted(order) == sorted(every)
        assert [i for what, i in order if what == "B"] == list(range(microbatches))
        held, peak = 0, 0
        for what, i in order:
            assert what == "F" or ("F", i) in order[: order.index((what, i))]
            held += 1 if what == "F" else -1
            peak = max(peak, held)
        assert peak == in_flight(schedule, stage, stages, microbatches, True)


def test_the_searched_1f1b_plan_trains_like_one_device(plans: dict[str, Path]) -> None:
    """`optimize --pipeline`'s own plan: 2 stages on 2 ranks, 2 microbatches of 8, 1F1B."""
    chosen = _chosen(plans["searched"])
    assert (chosen["stages"], chosen["data"], chosen["microbatches"], chosen["schedule"]) == (2, 1, 2, "1f1b")
    result = _check(plans["searched"], "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok gradient of 'attn.q.weight': worst relative error" in result.stdout  # stage 0's
    assert "ok gradient of 'ffn.down.weight': worst relative error" in result.stdout  # stage 1's
    assert "ok weight after 2 sgd step(s) of 'ln2.scale'" in result.stdout
    # the residual stream [8, 128, 256] float32 (1 MiB) goes forward and its gradient back, per microbatch
    assert "ok collectives send on axis pipeline (forward), rank 0: issued 2 (2097152 bytes)" in result.stdout
    assert "ok collectives send on axis pipeline (backward), rank 1: issued 2 (2097152 bytes)" in result.stdout


def test_load_rank_refuses_zero_or_recompute_for_a_pipeline_plan(plans: dict[str, Path]) -> None:
    """The one loader for both kinds of plan: a pipeline plan carries its own ZeRO level and recomputation, so
    asking for them is one OptionError, before any process group is needed."""
    from unity_eq.errors import OptionError
    from unity_eq.train import load_rank

    refused = "is a pipeline plan: its ZeRO level and recomputation"
    with pytest.raises(OptionError, match=refused):
        load_rank(plans["searched"], zero=1)
    with pytest.raises(OptionError, match=refused):
        load_rank(plans["searched"], recompute=True)


def test_gpipe_with_two_replicas_per_stage_trains_like_one_device(plans: dict[str, Path]) -> None:
    """4 ranks: each stage's 2 replicas sum their gradients once per step (axis data), after 2 microbatches each
    of a batch of 32."""
    assert _chosen(plans["gpipe_d2"])["schedule"] == "gpipe"
    result = _check(plans["gpipe_d2"], "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(4):  # the stage's gradients (1 or 2 MiB) in one 25 MiB bucket: one all-reduce per step
        assert f"ok collectives all_reduce on axis data (gradient), rank {rank}: issued 1 (" in result.stdout
    assert "(rank 3)" in result.stdout  # replica 1 of the last stage compared too


def test_a_dropped_gradient_all_reduce_in_a_stage_fails(plans: dict[str, Path], tmp_path: Path) -> None:
    """Tensor groups of 2 (each stage's plan splits its microbatch over them): stage 1's ffn.down.weight loses
    its gradient all-reduce, so each rank steps on half the microbatch's gradient; and stage 0's plan.json
    stops pricing attn.q.weight's all-reduce, which the ranks still issue (once per step, after the last
    microbatch): the gradients there match, the count does not. Stage 0's other weights still match."""
    plan = tmp_path / "plan"
    shutil.copytree(plans["1f1b_t2"], plan)
    stage1 = json.loads((plan / "stage1" / "plan.json").read_text())
    index = next(i for i, s in enumerate(stage1["steps"]) if s["kind"] == "replicate" and s["src"] == "ffn.down.weight")
    stage1["steps"][index] = {"kind": "weight", "out": stage1["steps"][index]["out"], "name": "ffn.down.weight"}
    (plan / "stage1" / "plan.json").write_text(json.dumps(stage1))
    stage0 = json.loads((plan / "stage0" / "plan.json").read_text())
    step = next(s for s in stage0["steps"] if s["kind"] == "replicate" and s["src"] == "attn.q.weight")
    step["communication_s"] = 0.0
    (plan / "stage0" / "plan.json").write_text(json.dumps(stage0))
    result = _check(plan, "--steps", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: training does not match one device" in result.stderr
    assert "MISMATCH gradient of 'ffn.down.weight'" in result.stdout
    assert "ok gradient of 'attn.q.weight'" in result.stdout
    assert "ok loss of step 1" in result.stdout  # the forward is the same
    # stage 0's 10 weight gradients (q, k, v, o weights and biases, ln1's two) go in one bucket: plan.json now
    # prices 9 of them, 256 KiB fewer than the bucket the ranks all-reduce
    lines = [line for line in result.stdout.splitlines() if "all_reduce on axis x (gradient), rank 0" in line]
    assert len(lines) == 1 and lines[0].startswith("MISMATCH"), result.stdout
    assert "issued 1 (1054720 bytes), plan.json prices 1 (792576 bytes)" in lines[0], lines[0]


def test_weight_gradients_are_all_reduced_in_the_cost_models_buckets(
    plans: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensor groups of 2 whose stage 0 plan all-reduces its 10 whole weights' gradients over axis x once per
    step: with buckets of 300 KiB (the cost model's are 25 MiB, larger than the whole stage), packed in the
    weights' sorted order — [attn.k.bias, attn.k.weight, attn.o.bias], [attn.o.weight, attn.q.bias],
    [attn.q.weight, attn.v.bias], [attn.v.weight, ln1.bias, ln1.scale] (each weight 256 KiB, each vector
    1 KiB) — 4 all-reduces carry the 1054720 bytes; stage 1's 5 carry its 2104320; the training still matches
    one device."""
    from unity_eq.train import buckets
    from unity_eq.train.check import check_training

    monkeypatch.setattr(buckets, "bucket_size", lambda: 300 * 1024)
    result = check_training(MODEL, plans["1f1b_t2"], None, steps=1, loss="mean", tolerance=float(TOLERANCE))
    assert result.passed, result.first_failure()
    texts = [text for _, text in result.lines]
    # stage 1 (ranks 2, 3): [ffn.down.bias], [ffn.down.weight], [ffn.up.bias], [ffn.up.weight] (1 MiB each, alone),
    # [ln2.bias, ln2.scale]
    for rank, count, nbytes in ((0, 4, 1054720), (1, 4, 1054720), (2, 5, 2104320), (3, 5, 2104320)):
        want = (
            f"collectives all_reduce on axis x (gradient), rank {rank}: issued {count} ({nbytes} bytes), plan.json "
            f"prices {count} ({nbytes} bytes)"
        )
        assert want in texts, [t for t in texts if "axis x (gradient)" in t]


def test_pack_keeps_one_dtype_per_bucket_and_a_large_weight_alone() -> None:
    from unity_eq.train.buckets import pack

    """Buckets of 100 bytes: two float32 gradients that fit share one, a 200-byte one is alone, the next float32
    opens a new bucket, the float16 ones share theirs; buckets in the order they close, then the open ones."""
    entries = [("float32", 40), ("float16", 10), ("float32", 50), ("float32", 200), ("float16", 80), ("float32", 30)]
    assert pack(entries, 100) == [[0, 2], [3], [5], [1, 4]]
    assert pack(entries, 0) == [[0], [2], [1], [3], [5], [4]]  # no bucketing: one all-reduce per gradient


def test_zero1_with_recomputation_trains_like_one_device(plans: dict[str, Path]) -> None:
    """The plan's own choice: ZeRO-1 over each stage's 2 replicas (one reduce-scatter and one all-gather of the
    stage's weights per step on axis data, in place of an all-reduce per weight) and every stage recomputing
    its forward (its collectives and its compute again in the backward)."""
    chosen = _chosen(plans["zero1_d2"])
    assert (chosen["zero"], chosen["recompute"], chosen["data"]) == (1, "full", 2)
    result = _check(plans["zero1_d2"], "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(4):
        assert f"ok collectives reduce_scatter on axis data (gradient), rank {rank}: issued 1" in result.stdout
        assert f"ok collectives all_gather on axis data (gradient), rank {rank}: issued 1" in result.stdout
    assert "all_reduce on axis data" not in result.stdout
    assert "ok weight after 2 sgd step(s) of 'ffn.down.weight'" in result.stdout


def _zero_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "on axis data" in line]


def test_zero2_trains_like_one_device(plans: dict[str, Path]) -> None:
    """ZeRO-2 over each stage's 2 replicas (1F1B, 2 microbatches): a reduce-scatter of the stage's gradients
    after each microbatch's backward and one all-gather of the weights in the step, as
    CostModel.zero_microbatch_traffic and zero_step_traffic price them; each of the stage's float32 weight
    bytes carried once per collective (no all-reduce on the data axis)."""
    chosen = _chosen(plans["zero2_d2"])
    assert (chosen["zero"], chosen["data"], chosen["microbatches"]) == (2, 2, 2)
    result = _check(plans["zero2_d2"], "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(4):
        assert f"ok collectives reduce_scatter on axis data (gradient), rank {rank}: issued 2" in result.stdout
        assert f"ok collectives all_gather on axis data (gradient), rank {rank}: issued 1" in result.stdout
    assert len(_zero_lines(result.stdout)) == 8, result.stdout  # nothing else on the data axis
    for stage, rank in ((0, 0), (1, 3)):  # each reduce-scatter carries the stage's priced gradient bytes
        memory = json.loads((plans["zero2_d2"] / f"stage{stage}" / "plan.json").read_text())["memory"]
        line = f"reduce_scatter on axis data (gradient), rank {rank}: issued 2 ({2 * int(memory['gradient_bytes'])} "
        assert line in result.stdout, result.stdout
    assert "ok weight after 2 sgd step(s) of 'ffn.down.weight'" in result.stdout


def test_zero3_trains_like_one_device(plans: dict[str, Path]) -> None:
    """ZeRO-3 (GPipe, 2 microbatches): per microbatch the stage's weights all-gathered for the forward and
    again for the backward, and their gradients reduce-scattered; nothing once per step."""
    chosen = _chosen(plans["zero3_d2"])
    assert (chosen["zero"], chosen["data"], chosen["schedule"]) == (3, 2, "gpipe")
    result = _check(plans["zero3_d2"], "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(4):
        for kind, phase in (("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "gradient")):
            assert f"ok collectives {kind} on axis data ({phase}), rank {rank}: issued 2" in result.stdout
    assert len(_zero_lines(result.stdout)) == 12, result.stdout
    assert "ok gradient of 'attn.q.weight'" in result.stdout and "(rank 3)" in result.stdout


def _check_in_process(plan: Path) -> str:
    """``check --training`` in this process: its ranks are forked from it, so a fault patched in here runs
    there."""
    from unity_eq.train.check import check_training

    result = check_training(MODEL, plan, None, steps=1, loss="mean", tolerance=float(TOLERANCE))
    assert not result.passed
    return str(result.first_failure())


def test_zero2_run_as_zero1_fails_on_the_count(plans: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A ZeRO-2 that keeps the microbatches' gradients and reduce-scatters them once in the step (ZeRO-1's
    collectives): the gradients and weights still match, the reduce-scatters per step do not."""
    from unity_eq.train.zero import ZeroOptimizer

    monkeypatch.setattr(ZeroOptimizer, "_after_gradient", lambda self, param: None)
    failure = _check_in_process(plans["zero2_d2"])
    assert "reduce_scatter on axis data (gradient)" in failure and "issued 1" in failure, failure
    assert "plan.json prices 2" in failure, failure


def test_zero3_without_the_sum_over_replicas_fails(plans: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """ZeRO-3 whose reduce-scatter keeps this replica's chunk of its own gradient (the other replica's half of
    the batch dropped): a gradient mismatch."""
    from unity_eq.train import zero

    monkeypatch.setattr(zero, "reduce_scatter", _own_chunk)
    failure = _check_in_process(plans["zero3_d2"])
    assert failure.startswith("gradient of "), failure


def _own_chunk(flat, g, phase, nbytes):  # type: ignore[no-untyped-def]
    """A wrong reduce-scatter: counted as the real one, but no sum over the group."""
    g.ledger.record("reduce_scatter", g.axis, phase, nbytes)
    size = flat.numel() // g.size
    return flat[g.index * size : (g.index + 1) * size].clone()


def test_zero2_of_a_weight_two_stages_train_is_refused_before_any_rank_starts(plans: dict[str, Path]) -> None:
    """A weight that two stages train (stage 1's plan also loads stage 0's attn.q.weight) under ZeRO-2: its sum
    over the stages needs the whole gradient, which ZeRO-2 does not keep: one PlanError naming it."""
    import dataclasses

    from unity_eq.errors import PlanError
    from unity_eq.planfile import WeightStepRecord, read_explain_record
    from unity_eq.train.pipeline_zero import refuse_zero_shared

    plan = plans["zero2_d2"]
    records = [read_explain_record(plan / f"stage{s}" / "plan.json") for s in range(2)]
    refuse_zero_shared(plan, 2, 2, records)  # the plan as made: no weight in both stages
    step = next(s for s in records[0].steps if isinstance(s, WeightStepRecord) and s.name == "attn.q.weight")
    records[1] = dataclasses.replace(
        records[1],
        steps=(*records[1].steps, step),
        tensors={**records[1].tensors, step.out: records[0].tensors[step.out]},
        weights={**records[1].weights, step.name: records[0].weights[step.name]},
    )
    refuse_zero_shared(plan, 1, 2, records)  # ZeRO-1 keeps whole gradients: it runs
    with pytest.raises(PlanError, match=r"weight 'attn\.q\.weight' is trained by stages 0 and 1.*ZeRO-2"):
        refuse_zero_shared(plan, 2, 2, records)
    bare = [dataclasses.replace(r, weights={}) for r in records]  # a plan written before plan.json's `weights`
    with pytest.raises(PlanError, match=r"weight 'attn\.q\.weight' is trained by stages 0 and 1"):
        refuse_zero_shared(plan, 3, 2, bare)


def _torchrun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [*torchrun(n), "-m", "unity_eq", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)


def test_train_runs_a_pipeline_plan_under_torchrun(plans: dict[str, Path], tmp_path: Path) -> None:
    """The first step's loss is the one-device loss of the same seeded batch (`train`'s default inputs); the
    checkpoint gathers both stages' weights under the source names."""
    ckpt = tmp_path / "tf.pt"
    result = _torchrun(2, "train", str(plans["searched"]), "--steps", "2", "--loss", "mean", "--save", str(ckpt))
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in result.stdout.splitlines() if "loss" in line]
    assert len(losses) == 2 and losses[1] < losses[0]
    from unity_eq.runtime.draws import random_inputs
    from unity_eq.runtime.pipeline import load_pipeline_dir
    from unity_eq.train.reference import OnnxModule

    x = torch.from_numpy(random_inputs(load_pipeline_dir(plans["searched"]).whole.input_specs, 0)["X"])
    with torch.no_grad():  # the mean over the batch of 16: the mean of its two halves' means
        expected = float(sum(OnnxModule(MODEL)({"X": half})["Y"].mean() for half in (x[:8], x[8:])) / 2)
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    saved = torch.load(ckpt, weights_only=True)
    assert {"attn.q.weight", "ffn.down.weight", "ln1.scale", "ln2.scale"} <= set(saved)
    assert list(saved["ffn.up.weight"].shape) == [256, 1024]
    wrong = _torchrun(1, "train", str(plans["searched"]), "--steps", "1", "--loss", "mean")
    errors = [line for line in wrong.stderr.splitlines() if line.startswith("error:")]
    assert wrong.returncode != 0 and len(errors) == 1
    assert errors[0].startswith("error: world size: torchrun started 1 processes, the plan")


def test_bert_with_its_attention_mask_trains_in_two_stages(tmp_path: Path) -> None:
    """A transformers BERT (2 layers, random weights) exported with ``attention_mask`` and a dynamic batch: stage
    0 sends the extended mask to stage 1 per microbatch (rows padded differently, so a mask of the wrong
    microbatch changes the gradients); the exporter's one initializer for equal LayerNorm weights is trained by
    both stages, its gradient summed over them; the token-type embedding the frontend folded (a Gather at the
    ids' shape) is computed again from its parameter. The step-1 loss is a sum of LayerNorm outputs that cancels
    to rounding noise, so the tolerance is the default 1e-4 (the gradients match to about 1e-6)."""
    pytest.importorskip("transformers")
    import numpy as np
    from model_zoo import export_masked_transformer, masked_inputs

    model = export_masked_transformer("bert", tmp_path / "bert.onnx")
    plan = tmp_path / "plan"
    made = run_cli("optimize", str(model), "--devices", "2", "--pipeline", "--objective", "training", "--batch", "4",
                   "--stages", "2", "--tensor", "1", "--microbatches", "2", "-o", str(plan), "-q")  # fmt: skip
    assert made.returncode == 0, made.stderr
    stages = json.loads((plan / "plan.json").read_text())["stages"]
    assert stages[0]["side_sends"] and stages[1]["side_receives"] == stages[0]["side_sends"]
    np.savez(tmp_path / "batch.npz", **masked_inputs(4))
    args = ("check", str(model), str(plan), "--training", "--loss", "sum", "--steps", "2",
            "--inputs", str(tmp_path / "batch.npz"))  # fmt: skip
    # the exporter made one initializer of the layers' equal LayerNorm weights: each stage reads it once, the
    # whole model twice, so it is refused (judged on the whole model) until the user says it is shared
    refused = run_cli(*args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "embeddings.LayerNorm.weight" in errors[0], refused.stderr
    flags = re.findall(r"--shared (\S+?)[` ]", errors[0])
    assert "embeddings.LayerNorm.weight" in flags
    result = run_cli(*args, *(arg for name in flags for arg in ("--shared", name)))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("embeddings.word_embeddings.weight", "embeddings.token_type_embeddings.weight",
                 "embeddings.LayerNorm.weight", "pooler.dense.weight"):  # fmt: skip
        assert f"ok gradient of {name!r}" in result.stdout
    assert "ok collectives send on axis pipeline (side), rank 0: issued 2" in result.stdout
    assert "weight 'embeddings.LayerNorm.weight' is trained by several stages" in result.stderr
    for line in result.stdout.splitlines():
        if line.startswith("ok gradient"):
            assert float(line.split("error ")[1].split()[0]) < 1e-5, line
