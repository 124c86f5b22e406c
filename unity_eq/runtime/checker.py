"""`check`: every device's weights compared bit for bit with the model's (:mod:`~unity_eq.runtime.weightcheck`),
then the original model and the plan on the same random inputs (:mod:`~unity_eq.runtime.draws`), float outputs
compared within a tolerance and integer and boolean outputs exactly (:mod:`~unity_eq.runtime.comparison`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from unity_eq.errors import CheckFailed, ModelError, PlanError, RuntimeBackendError
from unity_eq.lower.onnxrt import make_session, missing_kernel
from unity_eq.progress import Tracker
from unity_eq.runtime.comparison import CheckResult, OutputComparison, compare_outputs
from unity_eq.runtime.devices import choose_device, device_notes, run_in_batches, threads_per_rank
from unity_eq.runtime.draws import InputDraw, default_draws, random_inputs
from unity_eq.runtime.execute import execute_local
from unity_eq.runtime.pipeline import PipelinePlan, read_plan, run_programs, stage_programs
from unity_eq.runtime.plandir import PlanDir, check_inputs
from unity_eq.runtime.reference64 import Float64Reference
from unity_eq.runtime.segments import build_rank_program
from unity_eq.runtime.weightcheck import check_weight_bytes


def _original_session(model_path: str | Path) -> Any:
    try:
        return make_session(str(model_path), ["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime refuses the model
        missing = missing_kernel(exc, model_path)
        if missing is not None:  # a valid model (bfloat16 MatMul): `check` needs it on the CPU, where it cannot run
            raise RuntimeBackendError(
                f"{model_path}: {missing.describe()}, so `check` cannot run the original model (it runs it on the "
                "CPU); check a model whose ops onnxruntime's CPU provider implements at its types."
            ) from None
        raise RuntimeBackendError(
            f"{model_path}: onnxruntime cannot load the original model: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else type(exc).__name__


def _run_original(
    session: Any, model_path: str | Path, inputs: Mapping[str, np.ndarray], output_names: list[str], what: str
) -> dict[str, np.ndarray]:
    try:
        values = run_in_batches(session, output_names, inputs)
    except Exception as exc:  # the original model fails on these inputs: a problem of the inputs, not the plan
        raise RuntimeBackendError(
            f"{model_path}: the original model fails on {what}: {_first_line(exc)}. Pass valid inputs with `--inputs`."
        ) from None
    return dict(zip(output_names, values, strict=True))


def run_original(
    model_path: str | Path, inputs: Mapping[str, np.ndarray], output_names: list[str]
) -> dict[str, np.ndarray]:
    """The reference: the original model in onnxruntime on the CPU."""
    return _run_original(_original_session(model_path), model_path, inputs, output_names, "the inputs given")


def check(
    model_path: str | Path,
    plan_dir: str | Path,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    tolerance: float = 1e-4,
    device: str = "cpu",
    draws: Sequence[InputDraw] | None = None,
    on_progress: Callable[[str], None] | None = None,
    tracker: Tracker | None = None,
) -> CheckResult:
    """Run the original model and the plan on the same inputs and compare every output.

    Without ``inputs``, every draw of ``draws`` (default :func:`default_draws` from ``seed``) is tried and the
    worst error of each output is kept. Raises :class:`RuntimeBackendError` (exit 2) when the original model
    fails on the inputs, and :class:`CheckFailed` (exit 1) when the plan fails to run on inputs the original
    accepts. ``on_progress`` hears a line per input set; ``tracker`` (unity_eq.progress) counts them (row
    ``check``)."""
    tracker = tracker or Tracker()
    loaded = read_plan(plan_dir)
    pipeline = loaded if isinstance(loaded, PipelinePlan) else None
    plan = loaded.whole if isinstance(loaded, PipelinePlan) else loaded  # whole: the pipeline's inputs
    check_plan_is_of(model_path, plan)
    check_weights_present(model_path)
    directories = pipeline.stages if pipeline is not None else [plan]
    if on_progress:
        on_progress(
            f"comparing the weights of {sum(d.world_size for d in directories)} device file(s) with the model's"
        )
    shapes = {name: spec.shape for name, spec in directories[0].input_specs.items()}
    check_weight_bytes(model_path, directories, shapes)
    trials: list[tuple[str, Callable[[], dict[str, np.ndarray]]]]
    if inputs is not None:
        given = check_inputs(plan, inputs)
        trials = [("the inputs given", lambda: given)]
    else:
        ranges = default_int_ranges(model_path, plan)
        trials = [(d.describe(), _drawer(plan, d, ranges)) for d in (draws or default_draws(seed))]
    if on_progress:
        on_progress(f"running the original model on {len(trials)} set(s) of inputs")
    expected_by_trial = _expected_outputs(model_path, plan.output_names, trials)
    execute, where = _executor(plan, pipeline, device, on_progress)
    worst: dict[str, OutputComparison] = {}
    wide = Float64Reference(model_path)
    tracker.start("check", f"{len(trials)} input set(s) on {where}")
    for done, ((what, make), expected) in enumerate(zip(trials, expected_by_trial, strict=True)):
        if on_progress:
            on_progress(f"checking on {what}")
        tracker.update("check", f"{done} of {len(trials)} input sets checked; now {what}")
        feeds = make()
        try:
            got = execute(feeds)
        except RuntimeBackendError as exc:
            raise CheckFailed(f"{plan.path}: the plan fails on {what}, where the original model runs: {exc}") from None
        first = compare_outputs(expected, got, tolerance).outputs
        for o in second_opinion(first, wide, feeds, got, tolerance, expected):
            o.inputs = what
            old = worst.get(o.name)
            if old is None or (not o.passed, o.relative_error) > (not old.passed, old.relative_error):
                worst[o.name] = o
    tracker.finish("check", f"{len(trials)} input set(s) checked")
    return CheckResult([worst[name] for name in plan.output_names], tolerance, [what for what, _ in trials])


def second_opinion(
    comparisons: list[OutputComparison],
    wide: Float64Reference,
    feeds: Mapping[str, np.ndarray],
    got: Mapping[str, np.ndarray],
    tolerance: float,
    expected: Mapping[str, np.ndarray] | None = None,
) -> list[OutputComparison]:
    """Float32 outputs that mismatch are judged again against the model run in float64; an output that
    matches it passes (with its float32 error kept), one that does not keeps its float32 verdict. Either way
    the figures measured are kept: the plan's error against float64 and, given ``expected`` (onnxruntime's
    float32 outputs), onnxruntime's; without a float64 model the reason is kept instead."""
    failed = [o.name for o in comparisons if not o.passed and np.asarray(got[o.name]).dtype == np.float32]
    if not failed:
        return comparisons
    reference = wide.run(feeds, failed)
    if reference is None:
        for o in comparisons:
            o.no_float64 = (wide.reason or "onnxruntime cannot run the model in float64") if o.name in failed else ""
        return comparisons
    again = {o.name: o for o in compare_outputs(reference, {n: got[n] for n in failed}, tolerance).outputs}
    ort = compare_outputs(reference, {n: expected[n] for n in failed}, tolerance).outputs if expected else []
    ort_error = {o.name: o.relative_error for o in ort}
    result = []
    for o in comparisons:
        second = again.get(o.name)
        if second is None:
            result.append(o)
            continue
        kept = second if second.passed else o
        if second.passed:
            second.reference, second.float32_error = "float64", o.relative_error
        kept.float64_error, kept.onnxruntime_error = second.relative_error, ort_error.get(o.name)
        result.append(kept)
    return result


def _executor(
    plan: PlanDir, pipeline: PipelinePlan | None, device: str, on_note: Callable[[str], None] | None = None
) -> tuple[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]], str]:
    """The plan's ranks loaded once (after the original model's session is gone), as a function of checked
    inputs, and what runs them in words; ``on_note`` hears the device notes (CUDA not usable: the CPU)."""
    if pipeline is not None:
        stages = stage_programs(pipeline, device, on_note)
        return (lambda feeds: run_programs(pipeline, stages, feeds)), pipeline.describe()
    world = plan.world_size
    choices = [choose_device(device, rank) for rank in range(world)]
    if on_note is not None:
        for note in device_notes(choices):
            on_note(note)
    programs = [build_rank_program(plan, r, choices[r].providers, threads_per_rank(world)) for r in range(world)]
    return (lambda feeds: execute_local(programs, feeds)), f"{world} rank(s)"


def check_plan_is_of(model_path: str | Path, plan: PlanDir) -> None:
    """Refuse (exit 2) a model the plan was not made from: plan.json's ``model.fingerprint`` (what the model
    computes, weights' values aside) differs from the file's. Plans written before the fingerprint: no check."""
    recorded = plan.record.fingerprint
    if not recorded:
        return
    from unity_eq.frontends.onnx_read import file_fingerprint

    if file_fingerprint(model_path) != recorded:
        made_from = plan.record.source or plan.record.model_name
        raise PlanError(
            f"{model_path}: is not the model {plan.path} was made from ({made_from}: other nodes, inputs or "
            "weight shapes). Pass that model, or run `unity-eq optimize` on this one."
        )


def check_weights_present(model_path: str | Path) -> None:
    """Refuse (exit 2) a model whose external weight data is absent: ``check`` runs the original model, which
    needs every weight, and onnxruntime's own error would not say which file is missing."""
    from unity_eq.frontends.onnx_read import read_model

    missing = read_model(Path(model_path), str(model_path)).missing
    if missing:
        name, why = next(iter(missing.items()))
        raise ModelError(
            f"{model_path}: weight {name!r} has no data ({why}); `check` runs the original model, which needs "
            "every weight. Put the weight data next to the model."
        )


def _expected_outputs(
    model_path: str | Path, output_names: list[str], trials: Sequence[tuple[str, Callable[[], dict[str, np.ndarray]]]]
) -> list[dict[str, np.ndarray]]:
    """The original model's outputs on every trial's inputs. Its session is closed before the plan's ranks
    load, so ``check`` holds the model's weights once (the original's, then the plan's), not twice; only
    the outputs are kept, and each trial's inputs are made again (deterministically) for the plan."""
    original = _original_session(model_path)
    expected = [_run_original(original, model_path, make(), output_names, what) for what, make in trials]
    del original
    return expected


def _drawer(
    plan: PlanDir, draw: InputDraw, ranges: Mapping[str, tuple[int, int]]
) -> Callable[[], dict[str, np.ndarray]]:
    """Inputs of one draw, made when needed (one draw's inputs in memory at a time)."""
    return lambda: check_inputs(plan, random_inputs(plan.input_specs, draw=draw, int_ranges=ranges))


def default_int_ranges(model_path: str | Path, plan: PlanDir) -> dict[str, tuple[int, int]]:
    """Integer ranges that keep the original model valid (see :mod:`unity_eq.runtime.input_ranges`)."""
    specs = plan.input_specs
    if not any(np.dtype(spec.dtype).kind in "iu" for spec in specs.values()):
        return {}
    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.runtime.input_ranges import integer_input_ranges

    graph = load_onnx(model_path, _model_shapes(model_path, {name: spec.shape for name, spec in specs.items()}))
    return integer_input_ranges(graph, str(model_path))


def _model_shapes(model_path: str | Path, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """``shapes`` with every dim the model declares static kept as it declares it: a pipeline plan made with
    ``--batch`` from a model exported with a static batch runs the original in passes of its own batch, and
    the integer ranges do not depend on the batch (issue 26's audit: `check` without `--inputs` refused such
    a plan, naming an `--input-shape` the user never passed)."""
    proto = onnx.load(str(model_path), load_external_data=False)
    out = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    for value in proto.graph.input:
        if value.name not in out:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) == len(out[value.name]):
            out[value.name] = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else n
                for d, n in zip(dims, out[value.name], strict=True)
            )
    return out


def assert_check(result: CheckResult) -> None:
    if not result.passed:
        raise CheckFailed(result.describe())
