"""``check --training``: train a plan for K steps on its ranks and compare with training the original model on one
device, with the same inputs and optimizer.

The ranks are processes started here (``torch.multiprocessing``, gloo on the CPU; no torchrun:
:mod:`unity_eq.train.spawn`). Compared:

- the loss of every step;
- every weight's gradient of the first step, every rank's piece against the same region of the one-device
  gradient (so replicas that disagree fail, not only the piece one of them holds), and the whole gradient
  gathered back to the source shape covers every trained weight;
- the weights after K optimizer steps, the same way;
- the collectives the ranks issued in one step (forward, backward, gradient sync) per kind and mesh axis,
  count and bytes, against what plan.json priced (:func:`unity_eq.train.predict.predicted_spmd`: the weight
  gradients' all-reduces in the cost model's buckets).

Relative error is ``max |plan - reference| / max |reference|`` per weight, as ``check`` measures outputs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unity_eq.errors import CheckFailed, ModelError, OptionError
from unity_eq.planfile import ExplainRecord
from unity_eq.train.predict import Key, predicted_collectives, predicted_spmd, priced_gradless
from unity_eq.train.spawn import TrainJob, free_port, init_rank, make_optimizer, spawn_ranks
from unity_eq.train.torch_ops import array_of, tensor_of

__all__ = [
    "TrainingCheck",
    "assert_training_check",
    "check_training",
    "free_port",
    "init_rank",
    "make_optimizer",
    "predicted_collectives",
]


def model_batch(model: str | Path) -> int | None:
    """The model's own batch (its first input's dimension 0) when static, else None."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    first = next((i for i in graph.input if i.name not in initializers), None)
    dims = first.type.tensor_type.shape.dim if first is not None else []
    return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else None


def reference_training(job: TrainJob, float64: bool = False) -> dict[str, Any]:
    """The original model trained on one device (this process), as the ranks train the plan. A batch larger
    than the model's own static batch (a pipeline plan's ``--batch``) runs in passes of the model's batch whose
    gradients accumulate, each pass's loss scaled as a pipeline scales its microbatches'
    (unity_eq.train.pipeline.microbatch_scale): the whole batch's loss and gradient. ``float64``: the same
    training with every float32 weight, input and constant made float64 (the second opinion's reference)."""
    import onnx

    from unity_eq.runtime.reference64 import widen_to_float64
    from unity_eq.train.pipeline import microbatch_scale
    from unity_eq.train.reference import OnnxModule
    from unity_eq.train.session import loss_of

    source: str | onnx.ModelProto = job.model
    if float64:
        wide = widen_to_float64(onnx.load(job.model))
        if wide is None:
            raise ModelError(f"{job.model}: the model has subgraphs, so it has no float64 copy")
        source = wide
    module = OnnxModule(source, trainable=job.trainable)
    opt = make_optimizer(job.optimizer, module.parameters(), job.lr)
    feeds = {name: tensor_of(_widened(a) if float64 else a) for name, a in job.inputs.items()}
    batch = len(next(iter(feeds.values())))
    own = model_batch(job.model) or batch
    passes = batch // own if own < batch and batch % own == 0 else 1
    size = batch // passes
    scale = microbatch_scale(job.model, job.loss, passes)
    losses, grads, magnitudes = [], {}, []
    for k in range(job.steps):
        opt.zero_grad()
        total, magnitude = 0.0, 0.0
        for i in range(passes):
            outputs = module({n: v[i * size : (i + 1) * size] for n, v in feeds.items()})
            loss = loss_of(outputs, job.loss) * scale
            loss.backward()
            total += float(loss.detach())
            with torch.no_grad():  # the loss's own scale: the same sum or mean of the terms' magnitudes
                magnitude += float(loss_of({n: v.abs() for n, v in outputs.items()}, job.loss)) * abs(scale)
        losses.append(total)
        magnitudes.append(magnitude)
        if k == 0:
            grads = {n: (array_of(p.grad) if p.grad is not None else np.zeros(p.shape, np.float32))
                     for n, p in module.parameters_by_name().items()}  # fmt: skip
        opt.step()
    weights = {n: array_of(p) for n, p in module.parameters_by_name().items()}
    return {"losses": losses, "grads": grads, "weights": weights, "magnitudes": magnitudes}


def noise_share(values: Iterable[np.ndarray]) -> float:
    """The share of the largest value below which a value is rounding noise on both sides: ``1e-3`` (float32
    rounding is far below it), or the machine epsilon of the narrowest float type trained, where that is larger
    (7.8e-3 for bfloat16, whose 8-bit mantissa rounds each sum to that share of its largest term)."""
    from unity_eq.dtypes import is_float, relative_precision

    return max([1e-3] + [relative_precision(v.dtype) for v in values if is_float(v.dtype)])


def _tolerance_of(weights: Iterable[np.ndarray], tolerance: float) -> float:
    """``--tolerance`` (meant for float32), or more for a model that trains narrower weights: the loosest of
    their types' allowances (``runtime.comparison.tolerance_for``: 7.8e-2 for bfloat16, as ``check`` allows its
    outputs)."""
    from unity_eq.dtypes import is_float
    from unity_eq.runtime.comparison import tolerance_for

    narrow = [w.dtype for w in weights if is_float(w.dtype) and w.dtype.itemsize < 4]  # float32's is `--tolerance`
    return max((tolerance_for(d, tolerance) for d in narrow), default=tolerance)


def _widened(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64) if array.dtype == np.float32 else array


def relative_error(actual: np.ndarray, expected: np.ndarray, floor: float = 0.0) -> float:
    """``max |actual - expected| / max(max |expected|, floor)``."""
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, floor)
    diff = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))) if expected.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


@dataclass
class TrainingCheck:
    """What ``check --training`` measured: per line, a verdict and a sentence. A line that compares numbers
    has a key (``loss 1``, ``gradient 'w'``, ...) and its measured error in ``errors``, so that the float64
    second opinion can judge the same quantity again (:func:`second_opinion`)."""

    tolerance: float
    lines: list[tuple[bool, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)

    def add(self, ok: bool, text: str, key: str | None = None, error: float | None = None) -> None:
        self.lines.append((ok, text))
        self.keys.append(key)
        if key is not None and error is not None:
            self.errors[key] = error

    @property
    def passed(self) -> bool:
        return all(ok for ok, _ in self.lines)

    def first_failure(self) -> str | None:
        return next((text for ok, text in self.lines if not ok), None)


def _compare_pieces(
    result: TrainingCheck, what: str, ranks: Sequence[list[Any]], reference: Mapping[str, np.ndarray]
) -> None:
    """Every rank's pieces against the reference's regions; every trained weight covered.

    A weight whose values are far smaller than the model's largest is judged against a floor: ``1e-3`` of
    the largest element over every weight (:func:`noise_share`: more for a narrower type). A gradient that is
    zero in exact arithmetic (attention's key bias: softmax ignores a shift of a row) is rounding noise in both
    runs, and noise has no relative error; an error above ``tolerance`` of the floor is still a mismatch."""
    largest = max((float(np.max(np.abs(v.astype(np.float64)))) for v in reference.values() if v.size), default=0.0)
    floor = noise_share(reference.values()) * largest
    worst: dict[str, tuple[float, int]] = {}
    covered: dict[str, np.ndarray] = {}
    for rank, pieces in enumerate(ranks):
        for name, box, value in pieces:
            if name not in reference:
                result.add(False, f"{what} of {name!r}: the plan trains a weight the model does not train")
                continue
            index = tuple(slice(s, s + n) for s, n in box)
            expected = reference[name][index]
            got = value if value is not None else np.zeros_like(expected)
            error = relative_error(got, expected, floor)
            error = float("inf") if np.isnan(error) else error
            if error >= worst.get(name, (-1.0, 0))[0]:
                worst[name] = (error, rank)
            mask = covered.setdefault(name, np.zeros(reference[name].shape, bool))
            mask[index] = True
    for name in sorted(reference):
        if name not in covered:
            if np.any(reference[name] != 0) and what == "gradient":
                result.add(False, f"{what} of {name!r}: no rank trains it (the one-device gradient is not zero)")
            continue
        if not covered[name].all():
            result.add(False, f"{what} of {name!r}: the ranks' pieces cover {covered[name].mean():.0%} of it")
            continue
        error, rank = worst[name]
        result.add(
            error <= result.tolerance,
            f"{what} of {name!r}: worst relative error {error:.2e} (rank {rank})",
            f"{what} {name!r}",
            error,
        )


def _compare_collectives(
    result: TrainingCheck, record: ExplainRecord | None, ranks: Sequence[dict[str, Any]], job: TrainJob
) -> None:
    """Every rank's ledger against plan.json's prediction (an SPMD plan's from ``record``; a pipeline rank
    predicts its own, from its stage's plan and the pipeline's plan.json)."""
    predicted: dict[Key, list[int]] = {}
    if record is not None:
        gradless = set(ranks[0]["gradless"])
        predicted = predicted_spmd(record, gradless, ranks[0]["deferred"], job.zero, job.zero_axis, job.recompute)
        for text in priced_gradless(record, gradless):
            result.notes.append(f"plan.json prices a gradient collective where no gradient flows: {text}")
    result.notes.extend(dict.fromkeys(text for data in ranks for text in data["notes"]))
    for rank, data in enumerate(ranks):
        if data.get("predicted") is not None:
            predicted = data["predicted"]
        issued = {(k, a, p): [c, b] for k, a, p, c, b in data["ledger"]}
        for key in sorted(set(predicted) | set(issued)):
            want, got = predicted.get(key, [0, 0]), issued.get(key, [0, 0])
            label = f"{key[0]} on axis {key[1]} ({key[2]})"
            ok = want == got
            if rank == 0 or not ok or data.get("predicted") is not None:  # a pipeline's stages differ: each rank
                result.add(
                    ok,
                    f"collectives {label}, rank {rank}: issued {got[0]} ({got[1]} bytes), plan.json prices {want[0]} "
                    f"({want[1]} bytes)",
                )


def check_training(
    model: str | Path,
    plan_dir: str | Path,
    inputs: Mapping[str, np.ndarray] | None,
    *,
    steps: int = 2,
    optimizer: str = "sgd",
    lr: float = 1e-2,
    loss: str | None = None,
    tolerance: float = 1e-4,
    seed: int = 0,
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
    shared: Sequence[str] = (),
) -> TrainingCheck:
    """Train ``plan_dir``'s ranks and the original ``model`` for ``steps`` steps and compare (module docstring).
    ``zero``, ``zero_axis``, ``recompute``: the ranks train with ZeRO over that mesh axis and recomputation
    (unity_eq.train.load.load_rank), compared with the same one-device training."""
    from unity_eq.runtime.checker import check_plan_is_of
    from unity_eq.runtime.draws import random_inputs
    from unity_eq.runtime.pipeline import is_pipeline_dir, load_pipeline_dir
    from unity_eq.runtime.plandir import check_inputs, load_plan_dir
    from unity_eq.train.pipeline import refuse_ambiguous_pipeline, refuse_unbuilt
    from unity_eq.train.session import read_training_plan, zero_data_axis
    from unity_eq.train.weights import refuse_merged
    from unity_eq.train.zero import check_level

    if steps < 1:
        raise OptionError(f"`--steps` must be at least 1, got {steps}.")
    if not Path(model).is_file():
        raise OptionError(f"{model}: model not found.")
    record: ExplainRecord | None = None
    if is_pipeline_dir(plan_dir):
        if zero or recompute:
            raise OptionError(
                f"{plan_dir} is a pipeline plan: its ZeRO level and recomputation are plan.json's choice "
                "(`chosen.zero`, `chosen.recompute`); `--zero`/`--recompute` apply to SPMD plans only."
            )
        pipeline = load_pipeline_dir(plan_dir)
        refuse_unbuilt(pipeline)  # before any rank starts
        plan, world = pipeline.whole, pipeline.world_size
        first = pipeline.stages[0].input_specs  # the microbatch: a static-batch export's own batch
        refuse_ambiguous_pipeline(model, {name: tuple(spec.shape) for name, spec in first.items()}, shared)
    else:
        record = read_training_plan(plan_dir)
        zero_axis = zero_data_axis(record, check_level(zero), zero_axis)
        plan, world = load_plan_dir(plan_dir, check_files=False), len(record.mesh.ranks)
    check_plan_is_of(model, plan)  # another model's plan: exit 2, as `check` says it
    if record is not None:
        refuse_merged(record, shared, model)
    feeds = check_inputs(plan, inputs if inputs is not None else random_inputs(plan.input_specs, seed))
    make_optimizer(optimizer, [torch.zeros(1, requires_grad=True)], lr)  # the option checked before any rank
    with tempfile.TemporaryDirectory(prefix="unity-eq-train-") as tmp:
        trainable = (
            frozenset(s for w in record.weights.values() if w.trainable for s in w.sources)
            if record is not None and record.weights
            else None
        )
        job = TrainJob(
            str(plan_dir), str(model), feeds, steps, optimizer, lr, loss, tmp, zero, zero_axis, recompute,
            tuple(shared), trainable,
        )  # fmt: skip
        reference = reference_training(job)  # first: a model that cannot train fails before any rank starts
        ranks = spawn_ranks(world, job)
    result = TrainingCheck(_tolerance_of(reference["weights"].values(), tolerance))
    _compare_values(result, reference, ranks, steps, optimizer)
    if any(not ok and key is not None for (ok, _), key in zip(result.lines, result.keys, strict=True)):
        result = second_opinion(result, job, reference, ranks)
    _compare_collectives(result, record, ranks, job)
    return result


def _compare_values(
    result: TrainingCheck, reference: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]], steps: int, optimizer: str
) -> None:
    """The ranks' losses, first-step gradients and final weights against ``reference``'s (one device)."""
    for k, (want, *got) in enumerate(zip(reference["losses"], *(r["losses"] for r in ranks), strict=True)):
        # a sum whose terms cancel (a LayerNorm output's) is judged against 1e-3 of its terms' magnitudes' sum,
        # as a tiny weight is against the largest: below that its value is float32 rounding on both sides
        floor = max(noise_share(reference["weights"].values()) * reference["magnitudes"][k], 1e-30)
        error = max(abs(g - want) / max(abs(want), floor) for g in got)
        result.add(
            error <= result.tolerance,
            f"loss of step {k + 1}: {want:.6g} (one device), worst relative error {error:.2e}",
            f"loss {k + 1}",
            error,
        )
    _compare_pieces(result, "gradient", [r["grads"] for r in ranks], reference["grads"])
    _compare_pieces(
        result, f"weight after {steps} {optimizer} step(s)", [r["weights"] for r in ranks], reference["weights"]
    )


def _as_rank(reference: Mapping[str, Any]) -> dict[str, Any]:
    """One-device training's results shaped as one rank's, each weight one whole piece."""

    def whole(values: Mapping[str, np.ndarray]) -> list[Any]:
        return [(name, [(0, n) for n in v.shape], v) for name, v in values.items()]

    return {"losses": reference["losses"], "grads": whole(reference["grads"]), "weights": whole(reference["weights"])}


def second_opinion(
    result: TrainingCheck, job: TrainJob, reference: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]]
) -> TrainingCheck:
    """Mismatching lines judged again against one-device training in float64, as ``check`` judges outputs
    (unity_eq.runtime.checker.second_opinion): the plan may sum in another order than one device, and over
    many terms the float32 one-device result is not always the accurate side. A line whose plan is within
    tolerance of the float64 training passes; either way the line says both figures measured (the plan's and
    one-device float32 training's error against float64). Without a float64 run the float32 verdicts stand,
    with a note saying why."""
    steps = len(reference["losses"])
    try:
        wide = reference_training(job, float64=True)
    except (ModelError, RuntimeError, TypeError, NotImplementedError) as exc:  # an op without a float64 kernel
        result.notes.append(f"no float64 second opinion: {str(exc).strip().splitlines()[0][:300]}")
        return result
    plan64, ref64 = TrainingCheck(result.tolerance), TrainingCheck(result.tolerance)
    _compare_values(plan64, wide, ranks, steps, job.optimizer)
    _compare_values(ref64, wide, [_as_rank(reference)], steps, job.optimizer)
    return judged_again(result, plan64, ref64)


def judged_again(result: TrainingCheck, plan64: TrainingCheck, ref64: TrainingCheck) -> TrainingCheck:
    """``result`` with each mismatching keyed line judged by ``plan64`` (the plan against float64 training):
    it passes when the plan is within tolerance there; ``ref64`` (one-device float32 training against
    float64) gives the other figure the line reports."""
    again = TrainingCheck(result.tolerance, notes=list(result.notes))
    for (ok, text), key in zip(result.lines, result.keys, strict=True):
        error = result.errors.get(key) if key is not None else None
        if ok or key is None or key not in plan64.errors:
            again.add(ok, text, key, error)
            continue
        plan, one = plan64.errors[key], ref64.errors.get(key)
        within = plan <= result.tolerance
        one_text = f"{one:.2e}" if one is not None else "not measured"
        again.add(
            within,
            f"{text}; against one-device training in float64: plan off by {plan:.2e}, one-device float32 off by "
            f"{one_text}; the plan is {'within' if within else 'beyond'} tolerance of the float64 result",
            key,
            error,
        )
    return again


def assert_training_check(result: TrainingCheck) -> None:
    failure = result.first_failure()
    if failure is not None:
        raise CheckFailed(f"training does not match one device: {failure}")
