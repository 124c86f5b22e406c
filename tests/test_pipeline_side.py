"""Pipelines of real exports with an attention mask (issue 26): GPT-2, BERT and LLaMA built by transformers from
small configs (random weights, nothing downloaded), exported with ``attention_mask`` and a dynamic batch. The
extended mask is a side tensor (docs/scale.md): made in stage 0, read by every layer, so stage 0 sends it to
every later stage that reads it. Before, a plan of 2 or more stages crashed while lowering (``KeyError`` in
the encoder: the later stages read a mask nobody gave them). And each stage is lowered from the piece plans the
stage search priced, not planned again: the files are what plan.json's predicted step prices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from test_stages import _layered_model

pytest.importorskip("torch")
pytest.importorskip("transformers")

from model_zoo import export_masked_transformer, masked_inputs

from unity_eq import check
from unity_eq.cost import OBJECTIVES, CostModel
from unity_eq.ir import Mesh
from unity_eq.lower.pipeline import lower_pipeline
from unity_eq.machine import Machine, default_machine
from unity_eq.memory import kept_names, plan_memory
from unity_eq.planfile.pipeline import read_pipeline_record
from unity_eq.rulefile.manifest import default_rule_files, load_rule_files
from unity_eq.runtime.checker import run_original
from unity_eq.runtime.pipeline import load_pipeline_dir, run_pipeline
from unity_eq.search.meshes import device_groups
from unity_eq.split import split_graph
from unity_eq.stages.pieces import GraphAt, PieceTable, price_pieces
from unity_eq.stages.record import pipeline_record
from unity_eq.stages.run import graph_at_batch
from unity_eq.stages.schedule import in_flight
from unity_eq.stages.search import (
    StageConfig,
    StageFilter,
    StagePlan,
    StageSearch,
    evaluate,
    side_receives,
    stage_search,
)

KINDS = ("gpt2", "bert", "llama")
BATCH = 12  # 2, 3 or 4 stages of one device each on 12 devices: 6, 4 or 3 replicas, microbatches of 1
TRAINING = OBJECTIVES["training"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each kind exported once (2 layers, hidden 64, sequence 16, vocabulary 256)."""
    tmp = tmp_path_factory.mktemp("masked")
    return {kind: export_masked_transformer(kind, tmp / f"{kind}.onnx") for kind in KINDS}


@pytest.fixture(scope="module")
def priced(exported: dict[str, Path]) -> dict[str, tuple[Path, GraphAt, PieceTable]]:
    """Each kind's pieces priced once (tensor groups of 1, microbatches of 1, training)."""
    rules = load_rule_files(default_rule_files(False))
    machine = default_machine(BATCH)
    found = {}
    for kind, path in exported.items():
        graph_at = graph_at_batch(path, None, BATCH).graph_at
        table = price_pieces(graph_at, (1,), [1], machine, TRAINING, rules, groups=device_groups(machine))
        found[kind] = (path, graph_at, table)
    return found


def _lower(
    table: PieceTable, graph_at: GraphAt, machine: Machine, best: StagePlan, out: Path, batch: int = BATCH
) -> Path:
    """``best`` lowered as ``optimize --pipeline`` lowers its choice (plan.json, then a directory per stage)."""
    micro = best.config.microbatch
    found = StageSearch(best, None, 1, 1)
    record = pipeline_record(found, table, graph_at(micro), machine, TRAINING, batch, 0.0, (micro,))
    split = split_graph(graph_at(micro))
    assert split is not None
    lower_pipeline(record, best, split, machine, out)
    return out


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_masked_exports_lower_and_check_in_stages(
    priced: dict[str, tuple[Path, GraphAt, PieceTable]], kind: str, stages: int, tmp_path: Path
) -> None:
    path, graph_at, table = priced[kind]
    machine = default_machine(BATCH)
    best = stage_search(table, machine, TRAINING, BATCH, (1,), StageFilter(stages, 1)).best
    assert len(best.cuts) == stages
    plan = _lower(table, graph_at, machine, best, tmp_path / "plan")
    record = read_pipeline_record(plan / "plan.json")
    first, *later = record.stages
    # stage 0 makes the mask and sends it to every later stage that reads it (each holds an attention block
    # here, except a stage of BERT's feed-forward blocks alone)
    assert first.side_sends and not first.side_receives
    readers = [stage for stage in later if stage.side_receives]
    assert readers and all(set(stage.side_receives) <= set(first.side_sends) for stage in readers)
    for stage in readers:
        meta = json.loads((plan / str(stage.directory) / "plan.json").read_text())
        assert list(meta["model"]["inputs"]) == [stage.receives, *stage.side_receives]
    # rows padded differently: a mask routed to the wrong stage or microbatch changes the outputs
    outcome = check(path, plan, inputs=masked_inputs(BATCH))
    assert outcome.passed, outcome.describe()


def test_stage_zero_pays_for_the_side_tensors_it_sends(priced: dict[str, tuple[Path, GraphAt, PieceTable]]) -> None:
    """A send of the mask per later stage that reads it, once per microbatch, on the link between the two."""
    _, _, table = priced["gpt2"]
    machine = default_machine(4)
    mask_bytes = sum(table.side_bytes[1].values())
    assert mask_bytes > 0
    config = StageConfig(stages=4, data=1, tensor=1, microbatch=1, microbatches=4, schedule="gpipe")
    plan = evaluate(config, table, machine, TRAINING, 4)
    assert plan is not None
    without = PieceTable(table.pieces, table.options, table.signatures)  # the same pieces, no side tensors
    plain = evaluate(config, without, machine, TRAINING, 4)
    assert plain is not None and plain.cuts == plan.cuts
    link = CostModel(machine, Mesh(("p",), (2,), (0, 1)), TRAINING)  # one node: every pair of devices alike
    readers = sum(1 for names in side_receives(table.pieces, plan.cuts) if names)
    assert readers >= 1
    assert plan.stage_s[0] - plain.stage_s[0] == pytest.approx(readers * link.send("p", mask_bytes), rel=1e-9)
    assert plan.stage_s[1:] == plain.stage_s[1:]


def test_under_mpiexec_stage_zero_sends_the_mask_to_every_stage(
    priced: dict[str, tuple[Path, GraphAt, PieceTable]], tmp_path: Path
) -> None:
    """One process per stage (3 stages, 3 microbatches): the mask goes from rank 0 to ranks 1 and 2 point to
    point, microbatch by microbatch; the outputs match onnxruntime on the original and the local backend."""
    from test_mpi import unity_eq

    path, graph_at, table = priced["llama"]
    machine = default_machine(3)
    best = stage_search(table, machine, TRAINING, 3, (1,), StageFilter(3, 1)).best
    plan = _lower(table, graph_at, machine, best, tmp_path / "plan")
    record = read_pipeline_record(plan / "plan.json")
    assert sum(1 for stage in record.stages if stage.side_receives) >= 1
    inputs = masked_inputs(3)
    np.savez(tmp_path / "in.npz", **inputs)
    proc, _ = unity_eq(
        3, "run", str(plan), "--backend", "mpi", "--inputs", str(tmp_path / "in.npz"), "--outputs",
        str(tmp_path / "out.npz"), "-q", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = dict(np.load(tmp_path / "out.npz"))
    local = run_pipeline(load_pipeline_dir(plan), inputs)
    expected = run_original(path, inputs, list(local))
    for name, value in got.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(value, local[name], rtol=1e-6, atol=1e-7)


def _step_seconds(stage_dir: Path) -> float:
    meta = json.loads((stage_dir / "plan.json").read_text())
    return sum(step["compute_s"] + step["communication_s"] for step in meta["steps"])


def _output_bytes(stage_dir: Path, name: str) -> float:
    output = json.loads((stage_dir / "plan.json").read_text())["model"]["outputs"][name]
    return float(np.prod(output["shape"]) * np.dtype(output["dtype"]).itemsize)


def test_cli_pipeline_of_gpt2_with_a_mask_writes_what_it_priced(exported: dict[str, Path], tmp_path: Path) -> None:
    """The reported failure, through the command line: GPT-2 with a mask in 2 stages plans, lowers and checks.
    Then the lowered stage plans are priced again, step by step, with the sends between the stages: that is
    the step time plan.json predicts (inference: no gradient, one device per stage, 2 microbatches)."""
    model = exported["gpt2"]
    plan = tmp_path / "plan"
    proc = run_cli(
        "optimize", str(model), "--devices", "2", "--pipeline", "--batch", "2", "--objective", "inference",
        "--stages", "2", "--tensor", "1", "--microbatches", "2", "-o", str(plan), "--no-generated-rules", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    outcome = check(model, plan, inputs=masked_inputs(2))
    assert outcome.passed, outcome.describe()
    text = run_cli("explain", str(plan))
    record = read_pipeline_record(plan / "plan.json")
    # each later stage's line names what it receives, the main tensor as well as the side ones (the main one
    # was left out before issue 26's audit)
    stage1 = next(line for line in text.stdout.splitlines() if line.lstrip().startswith("stage   1:"))
    assert text.returncode == 0 and f"receives {record.stages[1].receives} from stage 0" in stage1, text.stdout
    assert "receives side tensors" in stage1, stage1

    machine = default_machine(2)
    inference = OBJECTIVES["inference"]
    link = CostModel(machine, Mesh(("p",), (2,), (0, 1)), inference)
    first, second = record.stages
    assert first.sends is not None and first.side_sends == second.side_receives and second.side_receives
    sent = _output_bytes(plan / "stage0", first.sends)
    side = sum(_output_bytes(plan / "stage0", name) for name in first.side_sends)
    taus = [
        _step_seconds(plan / "stage0") + link.send("p", sent) + link.send("p", side),
        _step_seconds(plan / "stage1"),
    ]
    assert [s.seconds for s in record.stages] == pytest.approx(taus, rel=1e-9)
    m = record.chosen.microbatches
    assert m == 2 and record.chosen.sync_s == 0
    assert record.chosen.step_s == pytest.approx(sum(taus) + (m - 1) * max(taus), rel=1e-9)


def test_the_memory_policy_chosen_is_the_plan_written(tmp_path: Path) -> None:
    """With the ``smallest`` policy (each piece's plan of least memory: tensor parallel on 2 devices, where the
    fastest plan of the first piece replicates its weights), the stage plans written are the chosen piece plans:
    their weights per device and their cost, not the fastest plan a second search would find."""
    model = _layered_model(tmp_path / "layers.onnx", layers=2, hidden=256, seq=64)
    onnx_model = onnx.load(model)
    onnx_model.ir_version = 10  # check runs the original in onnxruntime
    onnx.save(onnx_model, model)
    machine = default_machine(4)
    graph_at = graph_at_batch(model, None, 8).graph_at
    rules = load_rule_files(default_rule_files(False))
    table = price_pieces(graph_at, (4,), [2], machine, TRAINING, rules, groups=device_groups(machine))
    plans = {}
    for policy in ("fastest", "smallest"):
        config = StageConfig(stages=2, data=1, tensor=2, microbatch=4, microbatches=2, policy=policy)
        found = evaluate(config, table, machine, TRAINING, 8)
        assert found is not None
        plans[policy] = found
    small, fast = plans["smallest"], plans["fastest"]
    assert sum(c.weight_bytes for c in small.pieces) < sum(c.weight_bytes for c in fast.pieces)
    out = _lower(table, graph_at, machine, small, tmp_path / "plan", batch=8)
    for s, (i, j) in enumerate(small.cuts):
        meta = json.loads((out / f"stage{s}" / "plan.json").read_text())
        chosen = small.pieces[i:j]
        assert meta["memory"]["weight_bytes"] == pytest.approx(sum(c.weight_bytes for c in chosen), rel=1e-9)
        priced = sum(c.plan.cost.total for c in chosen if c.plan is not None)
        assert meta["cost"]["total_s"] == pytest.approx(priced, rel=1e-9)
    outcome = check(model, out)
    assert outcome.passed, outcome.describe()


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_stage_holds_its_side_tensors_once_per_microbatch_in_flight(
    priced: dict[str, tuple[Path, GraphAt, PieceTable]], kind: str, recompute: str
) -> None:
    """Each stage holds the side tensors of a microbatch (received, or made by stage 0) until that
    microbatch's backward: once per microbatch in flight, however many of its layers read them. Keeping
    activations, those some layer's backward keeps; recomputing, every one its layers read (the forward runs
    again). Before, a stage's memory counted a mask its backward keeps once per layer that keeps it, and
    recomputing, not at all."""
    _, _, table = priced[kind]
    machine = default_machine(4)
    sizes = table.side_bytes[1]
    config = StageConfig(4, 1, 1, 1, 4, schedule="1f1b", recompute=recompute)
    plan = evaluate(config, table, machine, TRAINING, 4)
    plain = evaluate(config, PieceTable(table.pieces, table.options, table.signatures), machine, TRAINING, 4)
    assert plan is not None and plain is not None and plan.cuts == plain.cuts
    chosen = iter(plan.pieces)
    extras: list[float] = []
    kept_by_stage: list[bool] = []
    for s, (i, j) in enumerate(plan.cuts):
        copies = in_flight("1f1b", s, 4, 4, True)
        reads = {name for piece in table.pieces[i:j] for name in piece.side_in}
        kept: set[str] = set()
        for piece in table.pieces[i:j]:
            cost = next(chosen)
            assert cost.plan is not None
            # the stage counts them, not the layers (their plans keep them: counted apart, not per layer)
            own = (*piece.side_in, *piece.side_out)
            kept |= kept_names(cost.plan, own)
            whole = plan_memory(cost.plan, keep_outputs=piece.stream_out is None).activations
            apart = sum(sizes.get(name, 0.0) for name in kept_names(cost.plan, own))
            assert cost.activation_bytes == pytest.approx(whole - apart)
        held = reads if recompute == "full" else kept
        extra = plan.memory[s].activations - plain.memory[s].activations
        assert extra == pytest.approx(copies * sum(sizes[name] for name in held)), (s, held)
        extras.append(extra)
        kept_by_stage.append(bool(kept))
    if recompute == "full":
        assert any(extra > 0 for extra in extras[1:])  # a later stage holds the mask it received
    else:  # the exports' attention fuses (rules/algebra/attention_exports.egg), and the fused op's backward
        # keeps its mask (ops/attention.py ``saved``): a stage holds it iff one of its layers keeps it
        assert [extra > 0 for extra in extras] == kept_by_stage and any(kept_by_stage)


SLOW_TWO_NODES = """
name = "slow"
[devices.gpu]
peak_tflops = { float32 = 0.1, float16 = 1 }
memory_bandwidth_gbs = 1000
memory_gib = 80
[links.fast]
bandwidth_gbs = 100
latency_us = 2
[links.net]
bandwidth_gbs = 0.1
latency_us = 5
[[nodes]]
devices = { gpu = 1 }
link = "fast"
network = "net"
"""


def test_the_training_search_pipelines_bert_with_a_mask_and_check_passes(tmp_path: Path) -> None:
    """`optimize --objective training` (no `--pipeline`) on a BERT export with a mask, on two nodes of one slow
    device each (weights large next to the activations: sharing gradients over the network costs more than
    pipelining, test_training_search.py): it picks 2 stages by itself, lowers them with the mask sent from stage
    0, and `check` passes. Before side tensors crossed stages this crashed (`KeyError` in the encoder)."""
    model = export_masked_transformer("bert", tmp_path / "bert.onnx", hidden=256, seq=8, heads=4)
    machine = tmp_path / "slow.toml"
    machine.write_text(SLOW_TWO_NODES)
    plan = tmp_path / "plan"
    proc = run_cli(
        "optimize", str(model), "--machine", str(machine), "--nodes", "2", "--objective", "training",
        "--batch", "4", "-o", str(plan), "--no-generated-rules", "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "pipeline chosen" in proc.stdout
    record = read_pipeline_record(plan / "plan.json")
    assert record.chosen.stages == 2 and record.lowered
    assert record.spmd is not None and record.spmd.step_s is not None and record.chosen.step_s <= record.spmd.step_s
    assert record.stages[0].side_sends and record.stages[1].side_receives
    checked = run_cli("check", str(model), str(plan), "-q")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "match:" in checked.stdout
