"""`check`: every device's weights compared bit for bit with the model's (:mod:`~unity_eq.runtime.weightcheck`),
then the original model and the plan on the same random inputs, float outputs compared within a tolerance and
integer and boolean outputs exactly."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.dtypes import is_float, relative_precision
from unity_eq.errors import CheckFailed, ModelError, OptionError, PlanError, RuntimeBackendError
from unity_eq.lower.onnxrt import make_session, missing_kernel
from unity_eq.planfile import InputRecord
from unity_eq.progress import Tracker
from unity_eq.runtime.devices import choose_device, run_in_batches, threads_per_rank
from unity_eq.runtime.execute import execute_local
from unity_eq.runtime.pipeline import PipelinePlan, read_plan, run_programs, stage_programs
from unity_eq.runtime.plandir import PlanDir, check_inputs
from unity_eq.runtime.reference64 import Float64Reference
from unity_eq.runtime.segments import build_rank_program
from unity_eq.runtime.weightcheck import check_weight_bytes


@dataclass(frozen=True)
class InputDraw:
    """One set of random inputs for ``check``: how float inputs are drawn, and the seed.

    ``normal``: N(0, scale²); ``uniform``: U(−scale, scale); ``integers``: whole numbers in [−scale, scale]
    (exact in float, so a plan that loses or adds a term shows as an exact error). Integer inputs always take
    values in the ranges that keep the model valid (:mod:`unity_eq.runtime.input_ranges`); booleans are fair coins.
    """

    kind: str
    scale: float
    seed: int

    def describe(self) -> str:
        what = {"normal": f"normal σ={self.scale:g}", "uniform": f"uniform ±{self.scale:g}"}
        return f"{what.get(self.kind, f'integers ±{self.scale:g}')}, seed {self.seed}"


def default_draws(seed: int = 0) -> list[InputDraw]:
    """What ``check`` tries by default: several seeds at unit scale, large scales (a rank that clips or
    saturates large values fails), a wide uniform and integer values."""
    return [
        InputDraw("normal", 1.0, seed),
        InputDraw("normal", 1.0, seed + 1),
        InputDraw("normal", 10.0, seed + 2),
        InputDraw("normal", 1000.0, seed + 3),
        InputDraw("uniform", 100.0, seed + 4),
        InputDraw("integers", 8.0, seed + 5),
    ]


def random_inputs(
    specs: Mapping[str, InputRecord] | Mapping[str, Mapping[str, Any]],
    seed: int = 0,
    int_bounds: Mapping[str, int] | None = None,
    draw: InputDraw | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """Deterministic random inputs: floats as ``draw`` says (default N(0, 1) with ``seed``), integers in
    ``int_ranges`` (inclusive) or [0, ``int_bounds``) or [0, 10), booleans.

    ``draw``'s seed replaces ``seed`` when given."""
    draw = draw or InputDraw("normal", 1.0, seed)
    rng = np.random.default_rng(draw.seed)
    out = {}
    for name, spec in specs.items():
        shape, dtype = _shape_and_dtype(spec)
        if is_float(dtype):  # numpy's floats and ml_dtypes' (bfloat16), which numpy calls kind "V"
            out[name] = _floats(rng, draw, shape).astype(dtype)
        elif dtype.kind in "iu":
            low, high = (int_ranges or {}).get(name, (0, max((int_bounds or {}).get(name, 10), 1) - 1))
            out[name] = rng.integers(low, high, size=shape, endpoint=True).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            raise RuntimeBackendError(
                f"inputs: cannot make random values of dtype {dtype} for {name!r}; pass `--inputs`"
            )
    return out


def _shape_and_dtype(spec: InputRecord | Mapping[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """An input's shape and dtype from plan.json's record, or from a ``{"shape", "dtype"}`` mapping (the API)."""
    if isinstance(spec, InputRecord):
        return spec.shape, np.dtype(spec.dtype)
    return tuple(spec["shape"]), np.dtype(spec["dtype"])


def _floats(rng: np.random.Generator, draw: InputDraw, shape: tuple[int, ...]) -> np.ndarray:
    if draw.kind == "normal":
        return rng.standard_normal(shape) * draw.scale
    if draw.kind == "uniform":
        return rng.uniform(-draw.scale, draw.scale, shape)
    if draw.kind == "integers":
        return rng.integers(-int(draw.scale), int(draw.scale), size=shape, endpoint=True).astype(np.float64)
    raise OptionError(f"input draw: expected normal, uniform or integers, got {draw.kind!r}")


@dataclass
class OutputComparison:
    name: str
    passed: bool
    max_abs_error: float
    relative_error: float
    index: tuple[int, ...]
    expected: float
    got: float
    inputs: str = ""  # which inputs gave this (the worst) error
    # "float64" when judged against the original model run in float64 (runtime/reference64.py) because the
    # float32 reference disagreed; float32_error is then the plan's relative error against the float32 reference
    reference: str = ""
    float32_error: float | None = None
    # measured when the float64 model ran (whatever its verdict): the plan's and onnxruntime's float32 result's
    # relative errors against it
    float64_error: float | None = None
    onnxruntime_error: float | None = None
    tolerance: float | None = None  # the tolerance this output was judged by (its dtype's: see tolerance_for)
    no_float64: str = ""  # why a mismatching float32 output had no float64 second opinion

    def describe_float64(self) -> str:
        """What the float64 second opinion measured on this output (empty when it was not asked): the plan's
        error and onnxruntime's float32 error against the float64 model, both measured, and the verdict."""
        if self.no_float64:
            return f"; {self.name!r}: no float64 second opinion ({self.no_float64})"
        if self.float64_error is None:
            return ""
        plan_vs_ort = self.float32_error if self.reference == "float64" else self.relative_error
        ort = f"{self.onnxruntime_error:.2e}" if self.onnxruntime_error is not None else "not measured"
        verdict = "within" if self.reference == "float64" else "beyond"
        return (
            f"; {self.name!r} against the original model run in float64: plan off by {self.float64_error:.2e}, "
            f"onnxruntime's float32 result off by {ort} (plan vs onnxruntime {plan_vs_ort:.2e}); the plan is "
            f"{verdict} tolerance of the float64 result"
        )


@dataclass
class CheckResult:
    """The worst error of every output of the original model over every set of inputs tried."""

    outputs: list[OutputComparison]
    tolerance: float
    draws: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputComparison:
        return max(self.outputs, key=lambda o: (not o.passed, o.relative_error))

    def describe(self) -> str:
        w = self.worst
        verdict = "match" if self.passed else "MISMATCH"
        tried = f" over {len(self.draws)} input sets" if len(self.draws) > 1 else ""
        where = f" ({w.inputs})" if w.inputs else ""
        allowed = w.tolerance if w.tolerance is not None else self.tolerance
        exact = "; integers and booleans exactly" if isinstance(w.expected, int) else ""
        text = (
            f"{verdict}: {len(self.outputs)} output(s){tried}; worst {w.name!r} relative error "
            f"{w.relative_error:.2e} (tolerance {allowed:.3g}{exact}){where}, max abs error "
            f"{w.max_abs_error:.3g} at {list(w.index)}: expected {_shown(w.expected)}, got {_shown(w.got)}"
        )
        for o in self.outputs:
            text += o.describe_float64()
        return text


def _shown(value: float) -> str:
    """A value in a message: an integer in full (two int64 that differ in the last digit must read apart)."""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def compare_outputs(
    expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tolerance: float = 1e-4
) -> CheckResult:
    """Relative error of each output: max |a − b| / max |a|. Integers and booleans must match exactly, in
    their own dtype (see :func:`_compare_exact`); equal values (infinities included) and NaN against NaN count
    as equal."""
    results = []
    for name, ref in expected.items():
        ref = np.asarray(ref)
        out = np.asarray(got[name])
        if ref.shape != out.shape:
            results.append(OutputComparison(name, False, float("inf"), float("inf"), (), float("nan"), float("nan")))
            continue
        if ref.size == 0:
            results.append(OutputComparison(name, ref.dtype == out.dtype, 0.0, 0.0, (), 0.0, 0.0))
            continue
        if ref.dtype.kind in "iub":
            results.append(_compare_exact(name, ref, out))
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        same = (ref == out) | (np.isnan(ref) & np.isnan(out)) if ref.dtype.kind == "f" else ref == out
        diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
        index = np.unravel_index(int(np.argmax(diff)), ref.shape)
        max_abs = float(diff[index])
        finite = np.isfinite(ref) if ref.dtype.kind == "f" else np.ones(ref.shape, bool)
        scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
        relative = max_abs / max(scale, 1e-30)
        allowed = tolerance_for(ref.dtype, tolerance)
        passed = relative <= allowed
        results.append(
            OutputComparison(
                name,
                passed,
                max_abs,
                relative,
                tuple(int(i) for i in index),
                float(ref[index]),
                float(out[index]),
                tolerance=allowed,
            )
        )
    return CheckResult(results, tolerance)


#: A narrow float output is allowed this many units of its type's precision (relative to the output's largest
#: value): ten roundings' worth, as a plan's sum in another order, or its partial sums rounded to the type
#: before an all-reduce, may be that far from the original's.
PRECISION_UNITS = 10


def tolerance_for(dtype: np.dtype, tolerance: float) -> float:
    """The relative error an output of ``dtype`` may have: ``tolerance`` (`--tolerance`, meant for float32), or
    :data:`PRECISION_UNITS` times the type's machine epsilon when that is larger: 9.8e-3 for float16, 7.8e-2
    for bfloat16 (7 bits of mantissa), against 1e-4 for float32 and float64."""
    return max(tolerance, PRECISION_UNITS * relative_precision(dtype)) if is_float(dtype) else tolerance


def _compare_exact(name: str, ref: np.ndarray, out: np.ndarray) -> OutputComparison:
    """An integer or boolean output: every element equal, compared in the integers themselves (an int64 above
    2**53 differs from its neighbour, which a float64 difference would call 0) and in the same dtype (a plan
    that returns floats where the model returns integers is wrong even when the values agree)."""
    differ = ref != out if ref.dtype == out.dtype else np.ones(ref.shape, bool)
    if not differ.any():
        return OutputComparison(name, True, 0.0, 0.0, (), 0.0, 0.0)
    index = tuple(int(i) for i in np.argwhere(differ)[0])
    expected, got = ref[index].item(), out[index].item()
    error = abs(int(expected) - int(got)) if isinstance(got, int | bool) else abs(float(expected) - float(got))
    scale = max(int(np.max(np.abs(ref.astype(np.float64)))), 1)
    return OutputComparison(name, False, float(max(error, 1)), float(max(error, 1)) / scale, index, expected, got)


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
    execute, where = _executor(plan, pipeline, device)
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
    plan: PlanDir, pipeline: PipelinePlan | None, device: str
) -> tuple[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]], str]:
    """The plan's ranks loaded once (after the original model's session is gone), as a function of checked
    inputs, and what runs them in words."""
    if pipeline is not None:
        stages = stage_programs(pipeline, device)
        return (lambda feeds: run_programs(pipeline, stages, feeds)), pipeline.describe()
    world = plan.world_size
    choices = [choose_device(device, rank) for rank in range(world)]
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

    graph = load_onnx(model_path, {name: spec.shape for name, spec in specs.items()})
    return integer_input_ranges(graph, str(model_path))


def assert_check(result: CheckResult) -> None:
    if not result.passed:
        raise CheckFailed(result.describe())
