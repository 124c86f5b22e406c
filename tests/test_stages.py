"""The stage search (unity_eq.stages): schedules, ZeRO, the stage cut, and a real search over pieces saturated by
egglog. Expected values are derived from the formulas in the modules' docstrings, by hand."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from blocks import transformer_graph
from conftest import run_cli

from unity_eq.cost import TRAINING, CostModel
from unity_eq.errors import InfeasiblePlanError
from unity_eq.ir import Mesh
from unity_eq.machine import load_machine
from unity_eq.memory import shard_factors
from unity_eq.planfile.pipeline import read_pipeline_record
from unity_eq.rulefile.manifest import default_rule_files, load_rule_files
from unity_eq.stages import StageConfig, StagePlan, evaluate, price_pieces, stage_search
from unity_eq.stages.config import RECOMPUTE, configurations
from unity_eq.stages.partition import StageCuts, StageFunctions, partition
from unity_eq.stages.schedule import bubble_fraction, in_flight, pipeline_seconds

MACHINE_TOML = """
name = "tiny"
[devices.gpu]
peak_tflops = {{ float32 = 10, float16 = 100 }}
memory_bandwidth_gbs = 1000
memory_gib = {memory}
[links.fast]
bandwidth_gbs = 100
latency_us = 2
[links.net]
bandwidth_gbs = 10
latency_us = 5
[[nodes]]
devices = {{ gpu = 2 }}
link = "fast"
network = "net"
"""


def test_equal_stages_take_m_plus_p_minus_one_turns() -> None:
    assert pipeline_seconds([2.0] * 4, 8) == pytest.approx((8 + 4 - 1) * 2.0)
    assert bubble_fraction([2.0] * 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction([2.0], 8) == 0.0
    # the slowest stage sets the pace: 1 + 3 + 1 for the first microbatch, 3 more for each other
    assert pipeline_seconds([1.0, 3.0, 1.0], 4) == pytest.approx(5 + 3 * 3)


def test_1f1b_holds_fewer_microbatches_than_gpipe() -> None:
    assert [in_flight("1f1b", s, 4, 8, True) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight("gpipe", s, 4, 8, True) for s in range(4)] == [8, 8, 8, 8]
    assert in_flight("1f1b", 0, 4, 2, True) == 2  # never more than there are microbatches
    assert in_flight("gpipe", 0, 4, 8, False) == 1  # inference keeps one


def test_zero_stages_shard_state_then_weights() -> None:
    assert shard_factors(0, 4) == (1.0, 1.0, 1.0)
    assert shard_factors(1, 4) == (1.0, 1.0, 0.25)
    assert shard_factors(2, 4) == (1.0, 0.25, 0.25)
    assert shard_factors(3, 4) == (0.25, 0.25, 0.25)


def test_zero_traffic_follows_the_collectives_of_the_data_axis() -> None:
    machine = load_machine("a100x8", nodes=2, interconnect="ib200")
    model = CostModel(machine, Mesh(("p", "d", "t"), (1, 2, 8)), TRAINING)
    w = 2**30
    # stages 0 and 1: one all-reduce per step, nothing per microbatch
    assert model.zero_step_traffic(0, w, 2) == model.zero_step_traffic(1, w, 2) == model.gradient_all_reduce("d", w)
    assert model.zero_microbatch_traffic(1, w, 2) == 0.0
    # stage 2: reduce-scatter per microbatch, all-gather per step; stage 3: two all-gathers and a reduce-scatter
    assert model.zero_microbatch_traffic(2, w, 2) == model.reduce_scatter("d", w)
    assert model.zero_step_traffic(2, w, 2) == model.all_gather("d", w)
    assert model.zero_microbatch_traffic(3, w, 2) == pytest.approx(
        2 * model.all_gather("d", w) + model.reduce_scatter("d", w)
    )
    assert model.zero_step_traffic(3, w, 2) == 0.0
    assert model.zero_step_traffic(0, w, 1) == 0.0  # one replica: nothing to synchronize


def _functions(seconds: list[float], fixed: list[float], held: list[float], copies: list[int]) -> StageFunctions:
    return StageFunctions(seconds, fixed, held, lambda s, i, j: 0.0, lambda s, i, j: 0.0, lambda s: copies[s])


def test_partition_balances_the_slowest_stage() -> None:
    f = _functions([1.0] * 8, [0.0] * 8, [0.0] * 8, [1, 1])
    assert partition(f, 2, 1e9) == [(0, 4), (4, 8)]
    f = _functions([4.0, 1.0, 1.0, 1.0, 1.0], [0.0] * 5, [0.0] * 5, [1, 1])
    assert partition(f, 2, 1e9) == [(0, 1), (1, 5)]  # 4 | 4 beats 5 | 3
    assert partition(f, 6, 1e9) is None  # more stages than pieces


def test_partition_finds_a_cut_when_sending_between_stages_costs_more_than_computing() -> None:
    # four 1 s pieces whose outputs take 100 s to send (the last one's is the model output: nothing to send);
    # two stages of two pieces: 2 s of compute + 100 s forward (stage 0) or + 100 s backward (stage 1)
    send = [100.0, 100.0, 100.0, 0.0]

    def seconds(stage: int, i: int, j: int) -> float:
        return (j - i) + (send[j - 1] if stage == 0 else 0.0) + (send[i - 1] if stage == 1 else 0.0)

    assert partition(StageCuts(4, seconds, lambda s, i, j: 0.0), 2, 1.0) == [(0, 2), (2, 4)]


def test_partition_moves_pieces_off_the_stage_that_holds_more_microbatches() -> None:
    # 1F1B over 2 stages: stage 0 holds 2 microbatches of activations, stage 1 one. Four equal pieces of 1 byte
    # of activation: 2 + 2 pieces need 4 bytes on stage 0, so with 3 bytes stage 0 must take one piece.
    f = _functions([1.0] * 4, [0.0] * 4, [1.0] * 4, [2, 1])
    assert partition(f, 2, 4.0) == [(0, 2), (2, 4)]
    assert partition(f, 2, 3.0) == [(0, 1), (1, 4)]
    assert partition(f, 2, 1.5) is None


@pytest.fixture(scope="module")
def tiny_table() -> object:
    machine = load_machine("a100x8", nodes=1)
    rules = load_rule_files(default_rule_files(False))

    def graph_at(batch: int):  # type: ignore[no-untyped-def]
        return transformer_graph("am", batch=batch, seq=16, hidden=32, ffn=64, heads=2, layers=4, dtype="float32")

    return price_pieces(graph_at, [1, 2], [1, 2], machine, TRAINING, rules)


def _tiny_machine(tmp_path: Path, memory_gib: float, nodes: int = 2):  # type: ignore[no-untyped-def]
    path = tmp_path / "tiny.toml"
    path.write_text(MACHINE_TOML.format(memory=memory_gib))
    return load_machine(path, nodes=nodes)


def test_pieces_are_saturated_once_per_group_and_microbatch(tiny_table) -> None:  # type: ignore[no-untyped-def]
    assert sorted(tiny_table.options) == [(1, 1, 0), (1, 2, 0), (2, 1, 0), (2, 2, 0)]
    # cuts after each residual; a 7-node MLP is below split.MIN_PIECE_NODES, so it joins the next attention:
    # [a0] [m0 a1] [m1 a2] [m2 a3] [m3 + the output]
    assert len(tiny_table.pieces) == 5
    for options in tiny_table.options.values():
        assert len(options) == 5 and all(options)
    # piece 1 is [m0 a1] on one device: MLP LN 2·32, up 32·64 + 64, down 64·32 + 32; attention LN 2·32, four
    # linears 32·32 + 32; float32
    weights = (64 + 32 * 64 + 64 + 64 * 32 + 32 + 64 + 4 * (32 * 32 + 32)) * 4
    assert {c.weight_bytes for c in tiny_table.costs(1, 1)[1]} == {weights}
    # training keeps a gradient and Adam's two moments per float32 weight: 3× its bytes
    assert {c.state_bytes for c in tiny_table.costs(1, 1)[1]} == {3 * weights}


def test_the_search_keeps_the_cheapest_configuration_that_fits(tiny_table, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    machine = _tiny_machine(tmp_path, 80)
    found = stage_search(tiny_table, machine, TRAINING, 8, [1, 2])
    every = [
        evaluate(c, tiny_table, machine, TRAINING, 8)
        for c in configurations(tiny_table, [(0, 1, 2, 3)], 8, [1, 2], True)
    ]
    fitting = [p for p in every if p is not None and p.fits]
    assert len(every) == found.evaluated and len(fitting) == found.fitting
    assert found.best.step_s == min(p.step_s for p in fitting)
    assert found.best_flat is not None
    assert found.best_flat.step_s == min(p.step_s for p in fitting if p.config.stages == 1)
    # a pipeline of 2 stages over this machine's 2 nodes is among them, its stages cover every piece in order
    piped = [p for p in fitting if p.config.stages == 2]
    assert piped and all(p.cuts[0][0] == 0 and p.cuts[0][1] == p.cuts[1][0] and p.cuts[1][1] == 5 for p in piped)


def test_a_smaller_machine_gets_a_plan_with_less_memory(tiny_table, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    roomy = stage_search(tiny_table, _tiny_machine(tmp_path, 80), TRAINING, 8, [1, 2]).best
    capacity = roomy.peak_bytes * 0.9  # 90% of what the fastest plan needs
    tight = stage_search(tiny_table, _tiny_machine(tmp_path, capacity / 2**30 / 0.9), TRAINING, 8, [1, 2]).best
    assert tight.peak_bytes <= capacity < roomy.peak_bytes
    assert tight.step_s >= roomy.step_s


def test_recomputation_trades_time_for_memory(tiny_table, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    machine = _tiny_machine(tmp_path, 80)
    keep = evaluate(StageConfig(2, 2, 1, 1, 4, "1f1b", "none", 0), tiny_table, machine, TRAINING, 8)
    redo = evaluate(StageConfig(2, 2, 1, 1, 4, "1f1b", "full", 0), tiny_table, machine, TRAINING, 8)
    gpipe = evaluate(StageConfig(2, 2, 1, 1, 4, "gpipe", "none", 0), tiny_table, machine, TRAINING, 8)
    assert keep is not None and redo is not None and gpipe is not None
    assert redo.step_s > keep.step_s
    assert sum(m.activations for m in redo.memory) < sum(m.activations for m in keep.memory)
    assert gpipe.step_s == pytest.approx(keep.step_s)  # same time, more microbatches held
    assert gpipe.memory[0].activations > keep.memory[0].activations


def _priced(step: float, zero: int) -> StagePlan:
    return StagePlan(StageConfig(2, 2, 1, 1, 4, zero=zero), ((0, 1), (1, 2)), (step / 2,), step, 0.0, (), ())


def test_the_stage_search_ties_within_rounding_noise_and_takes_the_simpler() -> None:
    """The tie rule (``cost.cheaper``): steps within 1e-12 of each other tie, and the lower ZeRO level wins in
    either order; a step cheaper by more (1e-9) wins even with the higher ZeRO level."""
    from unity_eq.stages.search import _better

    simple, sharded = _priced(1.0, zero=0), _priced(1.0 - 1e-13, zero=1)
    assert _better(simple, sharded) and not _better(sharded, simple)
    cheaper = _priced(1.0 - 1e-9, zero=1)
    assert _better(cheaper, simple) and not _better(simple, cheaper)


def test_nothing_fits_says_by_how_much(tiny_table, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    machine = _tiny_machine(tmp_path, 1e-6)
    # the mesh search's wording (memory.infeasible_message): the smallest footprint by kind, against the capacity
    with pytest.raises(
        InfeasiblePlanError,
        match=r"no stage configuration fits in device memory: the smallest found \(.*\) needs .* GiB per device "
        r"\(.* weights, .* gradients and optimizer state, .* activations\); the devices of .* have .* usable "
        r"\(\d+\.\d×\)\. Use about \d+ devices",
    ):
        stage_search(tiny_table, machine, TRAINING, 8, [1, 2])


def _layered_model(path: Path, layers: int = 4, hidden: int = 32, seq: int = 8) -> Path:
    """Pre-LN MLP layers over X [N, seq, hidden] with a dynamic batch N, 8 nodes a layer (one piece each)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "X"
    for k in range(layers):
        p = f"l{k}"

        def weight(name: str, *shape: int) -> str:
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name))
            return name

        nodes += [
            helper.make_node(
                "LayerNormalization", [x, weight(f"{p}.g", hidden), weight(f"{p}.b", hidden)], [f"{p}.ln"]
            ),
            helper.make_node("MatMul", [f"{p}.ln", weight(f"{p}.w1", hidden, 2 * hidden)], [f"{p}.up"]),
            helper.make_node("Add", [f"{p}.up", weight(f"{p}.b1", 2 * hidden)], [f"{p}.upb"]),
            helper.make_node("Relu", [f"{p}.upb"], [f"{p}.act"]),
            helper.make_node("MatMul", [f"{p}.act", weight(f"{p}.w2", 2 * hidden, hidden)], [f"{p}.down"]),
            helper.make_node("Add", [f"{p}.down", weight(f"{p}.b2", hidden)], [f"{p}.downb"]),
            helper.make_node("Mul", [f"{p}.downb", weight(f"{p}.s", hidden)], [f"{p}.scaled"]),
            helper.make_node("Add", [x, f"{p}.scaled"], [f"{p}.out"]),
        ]
        x = f"{p}.out"
    nodes.append(helper.make_node("Identity", [x], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", seq, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", seq, hidden])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_optimize_pipeline_writes_a_plan_explain_reads_and_run_refuses(tmp_path: Path) -> None:
    model = _layered_model(tmp_path / "layers.onnx")
    machine = tmp_path / "tiny.toml"
    machine.write_text(MACHINE_TOML.format(memory=80))
    plan = tmp_path / "plan"
    args = ["optimize", str(model), "--machine", str(machine), "--nodes", "2", "--objective", "training"]
    proc = run_cli(*args, "--pipeline", "--batch", "8", "--plan-only", "-o", str(plan), "--no-generated-rules", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "pipeline plan for" in proc.stdout
    assert sorted(p.name for p in plan.iterdir()) == ["plan.json"]
    record = read_pipeline_record(plan / "plan.json")
    assert record.batch == 8 and record.devices == 4
    c = record.chosen
    assert c.tensor * c.stages * c.data == 4 and c.data * c.microbatch * c.microbatches == 8
    # a dynamic batch: every microbatch size that divides the batch of 8 (a replica's batch divides it too)
    assert record.search.microbatch_sizes == (1, 2, 4, 8) and record.search.pieces == 4
    # the stages cover the pieces in order, each once
    assert [s.pieces[0] for s in record.stages] == [0, *(s.pieces[1] for s in record.stages[:-1])]
    assert record.stages[-1].pieces[1] == 4
    text = run_cli("explain", str(plan))
    assert text.returncode == 0, text.stderr
    assert "stage" in text.stdout and "schedule of the first" in text.stdout
    picture = run_cli("explain", str(plan), "--format", "svg")
    assert picture.returncode == 0, picture.stderr
    assert (plan / "plan.svg").read_text().startswith("<svg")
    for command in ("run", "check"):
        extra = [str(plan)] if command == "run" else [str(model), str(plan)]
        refused = run_cli(command, *extra)
        assert refused.returncode == 2
        assert "pipeline plan" in refused.stderr and "not lowered" in refused.stderr
        assert "Traceback" not in refused.stderr
    # a damaged plan.json: one error line naming the field, never a traceback
    raw = json.loads((plan / "plan.json").read_text())
    damages = {
        "stages": lambda r: r.update(stages=[]),
        "chosen.microbatches": lambda r: r["chosen"].update(microbatches=0),
        "stages[0].index": lambda r: [st.update(index=st["index"] + 1) for st in r["stages"]],
        "stages[0].pieces": lambda r: r["stages"][0].update(pieces=[0]),
        "stages[0].seconds": lambda r: r["stages"][0].update(seconds=-1.0),
        "stages[].seconds": lambda r: [st.update(seconds=0.0) for st in r["stages"]],
        "chosen.step_s": lambda r: r["chosen"].update(step_s=0.0),
    }
    for field, damage in damages.items():
        broken = copy.deepcopy(raw)
        damage(broken)
        (plan / "plan.json").write_text(json.dumps(broken))
        for fmt in ("text", "svg"):
            proc = run_cli("explain", str(plan), "--format", fmt)
            assert proc.returncode == 2 and f"field {field!r}" in proc.stderr, (field, proc.stderr)
            assert "Traceback" not in proc.stderr


def test_optimize_pipeline_refuses_options_that_do_not_apply(tmp_path: Path) -> None:
    model = _layered_model(tmp_path / "layers.onnx", layers=2)
    proc = run_cli("optimize", str(model), "--devices", "2", "--pipeline", "--mesh", "2", "--batch", "4")
    assert proc.returncode == 2 and "`--mesh` do not apply to `--pipeline`" in proc.stderr
    proc = run_cli("optimize", str(model), "--devices", "2", "--batch", "4")
    assert proc.returncode == 2 and "pass it with `--objective training` or `--pipeline`" in proc.stderr
    proc = run_cli("optimize", str(model), "--devices", "2", "--pipeline")
    assert proc.returncode == 2 and "pass `--batch N`" in proc.stderr


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_simulated_schedule_agrees_with_the_formulas(schedule: str) -> None:
    from unity_eq.stages.timeline import simulate

    stages, microbatches = 4, 6
    slots = simulate([3.0] * stages, microbatches, schedule, True)
    assert len(slots) == 2 * stages * microbatches
    assert max(s.end for s in slots) == pytest.approx(pipeline_seconds([3.0] * stages, microbatches))
    for stage in range(stages):
        # the most microbatches whose forward has started and whose backward has not ended: what it keeps
        events = sorted((s.end, -1) if s.backward else (s.start, 1) for s in slots if s.stage == stage)
        held = peak = 0
        for _, change in events:
            held += change
            peak = max(peak, held)
        assert peak == in_flight(schedule, stage, stages, microbatches, True)
    # a stage never runs two things at once, and a backward never starts before the next stage's backward ends
    by_stage = sorted(slots, key=lambda s: (s.stage, s.start))
    assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(by_stage) if a.stage == b.stage)
    ends = {(s.stage, s.microbatch, s.backward): s.end for s in slots}
    assert all(s.start >= ends[(s.stage + 1, s.microbatch, True)] - 1e-12 for s in slots if s.backward and s.stage < 3)


HETERO_TOML = """
name = "fast-and-slow"
launch_overhead_us = 0.001
[devices.fast]
peak_tflops = { float32 = 2 }
memory_bandwidth_gbs = 100000
memory_gib = 80
[devices.slow]
peak_tflops = { float32 = 0.5 }
memory_bandwidth_gbs = 100000
memory_gib = 80
[links.fast]
bandwidth_gbs = 100
latency_us = 2
[links.net]
bandwidth_gbs = 10
latency_us = 5
[[nodes]]
devices = { fast = 2 }
link = "fast"
network = "net"
[[nodes]]
devices = { slow = 2 }
link = "fast"
network = "net"
"""


def test_on_two_kinds_of_device_the_faster_stages_get_more_layers(tmp_path: Path) -> None:
    from unity_eq.search.meshes import device_groups

    path = tmp_path / "hetero.toml"
    path.write_text(HETERO_TOML)
    machine = load_machine(path)
    groups = device_groups(machine)
    assert [len(g) for g in groups] == [2, 2]

    def graph_at(batch: int):  # type: ignore[no-untyped-def]
        return transformer_graph("m", batch=batch, seq=64, hidden=256, ffn=1024, layers=8, dtype="float32")

    table = price_pieces(
        graph_at, [1], [1, 2], machine, TRAINING, load_rule_files(default_rule_files(False)), groups=groups
    )
    # every piece is 4× slower on a slow device (compute bound: a launch floor of 1 ns, ample memory bandwidth)
    fast, slow = table.costs(1, 1, 0), table.costs(1, 1, 1)
    assert [min(o.compute_s for o in s) for s in slow] == pytest.approx(
        [4 * min(o.compute_s for o in f) for f in fast], rel=1e-3
    )
    found = stage_search(table, machine, TRAINING, 4, [1])
    best = found.best
    kinds = [machine.devices[d[0]].name for d in best.devices]
    assert set(kinds) == {"fast", "slow"}
    layers = {kind: sum(j - i for (i, j), k in zip(best.cuts, kinds, strict=True) if k == kind) for kind in kinds}
    assert layers["fast"] > layers["slow"]
    assert found.best_flat is None  # one stage cannot span two kinds of device


def test_per_stage_recomputation_recomputes_only_the_stages_that_would_not_fit(tiny_table, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    roomy = _tiny_machine(tmp_path, 80)
    keep = evaluate(StageConfig(4, 1, 1, 1, 8, "1f1b", "none", 0), tiny_table, roomy, TRAINING, 8)
    assert keep is not None
    # a device a little smaller than the fullest stage needs when keeping every activation
    tight = _tiny_machine(tmp_path, (keep.peak_bytes - 1000) / 0.9 / 2**30)
    plans = {r: evaluate(StageConfig(4, 1, 1, 1, 8, "1f1b", r, 0), tiny_table, tight, TRAINING, 8) for r in RECOMPUTE}
    full, stage = plans["full"], plans["stage"]
    assert full is not None and stage is not None
    assert all(full.recomputed) and stage.fits and full.fits
    assert any(stage.recomputed) and not all(stage.recomputed)  # only where keeping would not fit
    assert stage.step_s < full.step_s  # the others keep their activations and run no second forward


def test_zero2_prices_the_tensor_axis_gradient_syncs_per_microbatch() -> None:
    """Under ZeRO-2/3 over replicas a stage reduce-scatters each microbatch's gradients as they are made, so its
    tensor-axis weight-gradient all-reduces run per microbatch (train/pipeline_zero.py); the stage search
    prices what runs (evaluate multiplies a stage's ``gradient_s`` by this): m of them, where ZeRO-0/1 and one
    replica run one per step on the accumulated gradients."""
    from unity_eq.stages.evaluate import weight_syncs_per_step

    def syncs(zero: int, data: int) -> int:
        return weight_syncs_per_step(StageConfig(2, data, 2, 1, 4, "1f1b", "none", zero))

    assert [syncs(z, 2) for z in (0, 1, 2, 3)] == [1, 1, 4, 4]
    assert syncs(2, 1) == syncs(3, 1) == 1  # one replica: nothing is reduce-scattered
