"""``check --training``: train a plan for K steps on its ranks and compare with training the original model on one
device, with the same inputs and optimizer.

The ranks are processes started here (``torch.multiprocessing``, gloo on the CPU; no torchrun). Compared:

- the loss of every step;
- every weight's gradient of the first step, every rank's piece against the same region of the one-device
  gradient (so replicas that disagree fail, not only the piece one of them holds), and the whole gradient
  gathered back to the source shape covers every trained weight;
- the weights after K optimizer steps, the same way;
- the collectives the ranks issued in one step (forward, backward, gradient sync) per kind and mesh axis,
  count and bytes, against what plan.json priced (:func:`predicted_collectives`).

Relative error is ``max |plan - reference| / max |reference|`` per weight, as ``check`` measures outputs.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unity_eq.errors import CheckFailed, OptionError, RuntimeBackendError, UnityEqError
from unity_eq.planfile import (
    CombineStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    InputStepRecord,
    PartitionStepRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    WeightStepRecord,
)
from unity_eq.runtime.pipeline import PipelinePlan
from unity_eq.train.pipeline import DATA_AXIS, PIPELINE_AXIS, STAGES_AXIS, recomputes

__all__ = ["TrainingCheck", "check_training", "make_optimizer", "predicted_collectives"]

Key = tuple[str, str, str]  # (kind, axis, phase)


@dataclass(frozen=True)
class TrainJob:
    """What every rank of a check runs (picklable: it crosses to the spawned processes)."""

    plan_dir: str
    model: str
    inputs: Mapping[str, np.ndarray]
    steps: int
    optimizer: str
    lr: float
    loss: str | None
    out_dir: str
    zero: int = 0  # ZeRO level over ``zero_axis`` (unity_eq.train.zero)
    zero_axis: str | None = None
    recompute: bool = False  # the forward checkpointed (unity_eq.train.recompute)
    shared: tuple[str, ...] = ()
    #: the source parameters plan.json trains (``weights``), which the one-device reference trains too (None:
    #: a plan without the section, ``reference.trainable_names``)
    trainable: frozenset[str] | None = None


def make_optimizer(name: str, params: Any, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise OptionError(f"`--optimizer`: expected sgd or adamw, got {name!r}.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_rank(rank: int, world: int, port: int) -> None:
    """Join the ranks' gloo group on this machine; the CPU's cores shared among the ranks."""
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _rank_main(rank: int, world: int, port: int, job: TrainJob) -> None:
    """One rank of ``check --training``: K steps, its pieces and ledger written to ``job.out_dir``."""
    import torch.distributed as dist

    out = Path(job.out_dir)
    try:
        init_rank(rank, world, port)
        from unity_eq.train.pipeline import load_rank

        trainer = load_rank(
            job.plan_dir, job.model, zero=job.zero, zero_axis=job.zero_axis, recompute=job.recompute, loss=job.loss,
            shared=job.shared,
        )  # fmt: skip
        opt = trainer.optimizer(lambda params: make_optimizer(job.optimizer, params, job.lr))
        feeds = trainer.inputs(job.inputs)
        losses, grads, ledger = [], [], []
        for k in range(job.steps):
            opt.zero_grad()
            loss = trainer.forward_backward(feeds, job.loss)
            losses.append(float(loss))
            if k == 0:
                grads = [(n, r.box, g.numpy().copy() if g is not None else None) for n, r, g in trainer.pieces("grads")]
            opt.step()
            if k == 0:  # after the step: ZeRO all-gathers the updated weights there
                ledger = trainer.ledger.as_rows()
        weights = [(n, r.box, w.numpy().copy()) for n, r, w in trainer.pieces("weights") if w is not None]
        result = {
            "losses": losses,
            "grads": grads,
            "weights": weights,
            "ledger": ledger,
            "gradless": sorted(trainer.plan_module.gradless),
            "predicted": _rank_prediction(trainer),
            "notes": _rank_notes(trainer),
        }
        torch.save(result, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException as exc:
        message = str(exc) if isinstance(exc, UnityEqError) else f"{type(exc).__name__}: {exc}"
        code = exc.exit_code if isinstance(exc, UnityEqError) else 1
        (out / f"error{rank}.txt").write_text(f"{code}\n{message}\n{traceback.format_exc()}")
        raise SystemExit(1) from None


def _rank_prediction(trainer: Any) -> dict[Key, list[int]] | None:
    """A pipeline rank's collectives and sends as plan.json predicts them (None for an SPMD rank: the parent
    predicts those from plan.json alone)."""
    from unity_eq.train.pipeline import PipelineTrainer

    if not isinstance(trainer, PipelineTrainer):
        return None
    module = trainer.plan_module
    params = [
        (n, p.numel() * p.element_size(), str(p.dtype).removeprefix("torch."))
        for n, p in zip(module.param_names, module.param_list, strict=True)
    ]
    shared = [(s.name, int(np.prod(s.shape)) * module.param_list[s.index].element_size()) for s in trainer.shared]
    from unity_eq.train.pipeline_zero import priced_zero_bytes, zero_bucket_bytes

    return predicted_pipeline(
        trainer.plan,
        trainer.stage_records,
        trainer.stage,
        set(module.gradless),
        module.deferred,
        params,
        shared,
        trainer.zero,
        priced_zero_bytes(trainer.record, zero_bucket_bytes(trainer.module, trainer.zero_optimizer)),
    )


def _rank_notes(trainer: Any) -> list[str]:
    """What a pipeline rank runs that plan.json does not price: a gradient collective priced where none flows,
    a weight's gradient summed over the stages that train it."""
    from unity_eq.train.pipeline import PipelineTrainer

    if not isinstance(trainer, PipelineTrainer):
        return []
    notes = [
        f"plan.json prices a gradient collective where no gradient flows: {text}"
        for text in _priced_gradless(trainer.record, trainer.plan_module.gradless)
    ]
    return notes + [
        f"weight {s.name!r} is trained by several stages: its gradients are summed over them (an all-reduce on "
        f"ranks {list(s.group.ranks)} that plan.json does not price)"
        for s in trainer.shared
    ]


def spawn_ranks(world: int, job: TrainJob) -> list[dict[str, Any]]:
    """Run ``job`` on ``world`` processes; their results in rank order, or the first failed rank's error (the
    others are stopped: torch's spawn terminates them)."""
    import logging

    import torch.multiprocessing as mp

    logger = logging.getLogger("torch.multiprocessing.spawn")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "Terminating process N via signal SIGTERM" lines: the error says it
    try:
        # fork: the ranks inherit this process's imports (torch, the frontend), which under load took most of
        # a check's time when each rank imported them again; gloo and the CPU need nothing fork cannot give
        mp.start_processes(_rank_main, args=(world, free_port(), job), nprocs=world, join=True, start_method="fork")
    except mp.ProcessExitedException as exc:
        raise _rank_error(Path(job.out_dir), exc.error_index, exc.signal_name, exc.exit_code) from None
    except mp.ProcessRaisedException as exc:
        raise _rank_error(Path(job.out_dir), exc.error_index, None, None) from None
    finally:
        logger.setLevel(level)
    return [torch.load(Path(job.out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _rank_error(out: Path, rank: int, signal_name: str | None, exit_code: int | None) -> UnityEqError:
    """The error of the rank that failed first: the one it wrote, or how it died."""
    path = out / f"error{rank}.txt"
    if path.exists():
        code, message = path.read_text().split("\n", 2)[:2]
        return OptionError(message) if code == "2" else RuntimeBackendError(f"rank {rank}: {message}")
    how = f"killed by signal {signal_name}" if signal_name else f"exit code {exit_code}"
    return RuntimeBackendError(f"rank {rank} died ({how}); the other ranks are stopped")


def model_batch(model: str | Path) -> int | None:
    """The model's own batch (its first input's dimension 0) when static, else None."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    first = next((i for i in graph.input if i.name not in initializers), None)
    dims = first.type.tensor_type.shape.dim if first is not None else []
    return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0 else None


def reference_training(job: TrainJob) -> dict[str, Any]:
    """The original model trained on one device (this process), as the ranks train the plan. A batch larger
    than the model's own static batch (a pipeline plan's ``--batch``) runs in passes of the model's batch whose
    gradients accumulate, each pass's loss scaled as a pipeline scales its microbatches'
    (unity_eq.train.pipeline.microbatch_scale): the whole batch's loss and gradient."""
    from unity_eq.train.pipeline import microbatch_scale
    from unity_eq.train.reference import OnnxModule
    from unity_eq.train.session import loss_of

    module = OnnxModule(job.model, trainable=job.trainable)
    opt = make_optimizer(job.optimizer, module.parameters(), job.lr)
    feeds = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in job.inputs.items()}
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
            grads = {n: (p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32))
                     for n, p in module.parameters_by_name().items()}  # fmt: skip
        opt.step()
    weights = {n: p.detach().numpy().copy() for n, p in module.parameters_by_name().items()}
    return {"losses": losses, "grads": grads, "weights": weights, "magnitudes": magnitudes}


def _local_bytes(record: ExplainRecord, tid: str) -> int:
    t = record.tensors[tid]
    return int(np.prod(t.local_shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def predicted_collectives(
    record: ExplainRecord,
    skip: set[str] = frozenset(),  # type: ignore[assignment]
    zero: int = 0,
    zero_axis: str | None = None,
    recompute: bool = False,
) -> dict[Key, list[int]]:
    """The collectives plan.json prices for one training step on every rank: (kind, axis, phase) -> [count,
    bytes per rank]. A combine is a forward all-gather, a reduce a forward all-reduce; a partition or replicate
    whose step has a communication price is a backward all-gather or all-reduce (phase ``gradient`` for a
    replicate of a tensor no model input flows into: a weight's gradient sync). ``skip``: steps whose backward
    carries no gradient at run time (priced, not needed).

    ``zero``: ZeRO over ``zero_axis`` replaces the weights' gradient all-reduces on that axis by its own
    collectives on the same bytes (unity_eq.train.zero.zero_collectives, as the cost model prices them);
    ``recompute``: the forward's collectives again, in phase ``recompute`` (a recomputed forward repeats them, as
    the stage search prices it)."""
    from unity_eq.train.rank import depends_on_inputs
    from unity_eq.train.zero import zero_collectives

    sizes = dict(zip(record.mesh.axes, record.mesh.sizes, strict=True))
    from_inputs = depends_on_inputs(record.steps)
    sharded: dict[str, int] = {}  # dtype -> bytes of the weight gradients ZeRO reduce-scatters
    out: dict[Key, list[int]] = {}

    def add(key: Key, nbytes: int) -> None:
        if sizes[key[1]] > 1:
            entry = out.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += nbytes

    for step in record.steps:
        match step:
            case CombineStepRecord(out=o, axis=axis):
                add(("all_gather", axis, "forward"), _local_bytes(record, o))
            case ReduceStepRecord(out=o, axis=axis):
                add(("all_reduce", axis, "forward"), _local_bytes(record, o))
            case PartitionStepRecord(out=o, src=src, axis=axis):
                if (step.communication_s or 0) > 0 and o not in skip:
                    add(("all_gather", axis, "backward"), _local_bytes(record, src))
            case ReplicateStepRecord(out=o, src=src, axis=axis):
                if (step.communication_s or 0) > 0 and o not in skip:
                    if zero and axis == zero_axis and src not in from_inputs:  # a weight's: ZeRO sums it
                        dtype = record.tensors[src].dtype
                        sharded[dtype] = sharded.get(dtype, 0) + _local_bytes(record, src)
                        continue
                    phase = "backward" if src in from_inputs else "gradient"
                    add(("all_reduce", axis, phase), _local_bytes(record, src))
            case ComputeStepRecord() | InputStepRecord() | WeightStepRecord():
                pass
    if recompute:
        for (kind, axis, phase), (count, nbytes) in list(out.items()):
            if phase == "forward":
                out[(kind, axis, "recompute")] = [count, nbytes]
    if zero and zero_axis is not None and sizes[zero_axis] > 1:
        for key, (count, nbytes) in zero_collectives(zero, zero_axis, list(sharded.values())).items():
            entry = out.setdefault(key, [0, 0])
            entry[0] += count
            entry[1] += nbytes
    return out


def _priced_gradless(record: ExplainRecord, gradless: set[str]) -> list[str]:
    """Steps plan.json prices a gradient collective for where no gradient flows (a model input or a constant)."""
    return [
        f"{type(s).__name__.removesuffix('StepRecord').lower()} {s.out} ({s.src})"
        for s in record.steps
        if isinstance(s, PartitionStepRecord | ReplicateStepRecord)
        and s.out in gradless
        and (s.communication_s or 0) > 0
    ]


def relative_error(actual: np.ndarray, expected: np.ndarray, floor: float = 0.0) -> float:
    """``max |actual - expected| / max(max |expected|, floor)``."""
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, floor)
    diff = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))) if expected.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


@dataclass
class TrainingCheck:
    """What ``check --training`` measured: per line, a verdict and a sentence."""

    tolerance: float
    lines: list[tuple[bool, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, ok: bool, text: str) -> None:
        self.lines.append((ok, text))

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
    the largest element over every weight. A gradient that is zero in exact arithmetic (attention's key bias:
    softmax ignores a shift of a row) is float32 rounding noise in both runs, and noise has no relative error;
    an error above ``tolerance`` of the floor is still a mismatch."""
    floor = 1e-3 * max((float(np.max(np.abs(v))) for v in reference.values() if v.size), default=0.0)
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
        result.add(error <= result.tolerance, f"{what} of {name!r}: worst relative error {error:.2e} (rank {rank})")


def _compare_collectives(
    result: TrainingCheck, record: ExplainRecord | None, ranks: Sequence[dict[str, Any]], job: TrainJob
) -> None:
    """Every rank's ledger against plan.json's prediction (an SPMD plan's from ``record``; a pipeline rank
    predicts its own, from its stage's plan and the pipeline's plan.json)."""
    predicted: dict[Key, list[int]] = {}
    if record is not None:
        gradless = set(ranks[0]["gradless"])
        predicted = predicted_collectives(record, gradless, job.zero, job.zero_axis, job.recompute)
        for text in _priced_gradless(record, gradless):
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
    (unity_eq.train.session.load_rank), compared with the same one-device training."""
    from unity_eq.runtime.checker import check_plan_is_of
    from unity_eq.runtime.draws import random_inputs
    from unity_eq.runtime.pipeline import is_pipeline_dir, load_pipeline_dir
    from unity_eq.runtime.plandir import check_inputs, load_plan_dir
    from unity_eq.train.pipeline import refuse_ambiguous_pipeline, refuse_unbuilt
    from unity_eq.train.session import read_training_plan, refuse_merged, zero_data_axis
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
    result = TrainingCheck(tolerance)
    for k, (want, *got) in enumerate(zip(reference["losses"], *(r["losses"] for r in ranks), strict=True)):
        # a sum whose terms cancel (a LayerNorm output's) is judged against 1e-3 of its terms' magnitudes' sum,
        # as a tiny weight is against the largest: below that its value is float32 rounding on both sides
        floor = max(1e-3 * reference["magnitudes"][k], 1e-30)
        error = max(abs(g - want) / max(abs(want), floor) for g in got)
        result.add(
            error <= tolerance, f"loss of step {k + 1}: {want:.6g} (one device), worst relative error {error:.2e}"
        )
    _compare_pieces(result, "gradient", [r["grads"] for r in ranks], reference["grads"])
    _compare_pieces(
        result, f"weight after {steps} {optimizer} step(s)", [r["weights"] for r in ranks], reference["weights"]
    )
    _compare_collectives(result, record, ranks, job)
    return result


def assert_training_check(result: TrainingCheck) -> None:
    failure = result.first_failure()
    if failure is not None:
        raise CheckFailed(f"training does not match one device: {failure}")


# --- what plan.json predicts a pipeline rank issues ------------------------------------------------------------
def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _output_spec(record: ExplainRecord, name: str) -> tuple[tuple[int, ...], str]:
    out = record.model.outputs[name]
    return tuple(out.shape), out.dtype


def predicted_p2p(plan: PipelinePlan, records: Sequence[ExplainRecord], stage: int) -> dict[Key, list[int]]:
    """The sends and receives of one step on a rank of ``stage``, from plan.json: per microbatch, the activation
    to the next stage and its gradient back, from the previous stage likewise, and stage 0's side tensors to
    every later stage that reads them."""
    m = plan.microbatches
    out: dict[Key, list[int]] = {}

    def add(kind: str, phase: str, nbytes: int) -> None:
        entry = out.setdefault((kind, PIPELINE_AXIS, phase), [0, 0])
        entry[0] += m
        entry[1] += m * nbytes

    stages = plan.record.stages
    here = stages[stage]
    if here.sends is not None:
        shape, dtype = _output_spec(records[stage], here.sends)
        add("send", "forward", _nbytes(shape, dtype))
        if np.issubdtype(np.dtype(dtype), np.floating):
            add("recv", "backward", _nbytes(shape, dtype))
    if here.receives is not None:
        spec = records[stage].model.inputs[here.receives]
        add("recv", "forward", _nbytes(spec.shape, spec.dtype))
        if np.issubdtype(np.dtype(spec.dtype), np.floating):
            add("send", "backward", _nbytes(spec.shape, spec.dtype))
    for name in here.side_receives:
        spec = records[stage].model.inputs[name]
        add("recv", "side", _nbytes(spec.shape, spec.dtype))
    if stage == 0:
        for later in stages[1:]:
            for name in later.side_receives:
                shape, dtype = _output_spec(records[0], name)
                add("send", "side", _nbytes(shape, dtype))
    return out


def predicted_pipeline(
    plan: PipelinePlan,
    records: Sequence[ExplainRecord],
    stage: int,
    gradless: set[str],
    deferred: Mapping[str, str],
    params: Sequence[tuple[str, int, str]],
    shared: Sequence[tuple[str, int]] = (),
    zero: int = 0,
    dtype_bytes: Sequence[int] = (),
) -> dict[Key, list[int]]:
    """What one step on a rank of ``stage`` issues, as plan.json prices it: the stage plan's collectives
    (:func:`~unity_eq.train.check.predicted_collectives`) once per microbatch, except its weight-gradient
    all-reduces (``deferred``: replicate step → axis), once per step in buckets
    (:func:`unity_eq.train.buckets.deferred_collectives`); the data-axis all-reduce of the parameters
    (``params``: name, bytes, dtype, in the stage's parameter order; plan.json prices its time, ``sync_s``, not
    a count) in buckets, with more than one replica; the sum over the stages of each weight several stages
    train (``shared``: name, bytes of the whole weight; plan.json does not price it: ``check --training`` notes
    it); the point-to-point traffic
    (:func:`predicted_p2p`). A recomputing stage (:func:`recomputes`) issues its forward's collectives again
    (phase ``recompute``); under ZeRO (``zero``) the data-axis all-reduces are ZeRO's reduce-scatters and
    all-gathers per dtype (``dtype_bytes``: the stage's parameters' bytes per dtype), as
    :func:`unity_eq.train.zero.zero_collectives` prices them for ``m`` microbatches (level 1: one of each per
    step; 2: a reduce-scatter per microbatch, an all-gather per step; 3: per microbatch a forward and a
    backward all-gather and a reduce-scatter). Under ZeRO-2 and 3 the stage plan's weight-gradient
    all-reduces run per microbatch (``deferred`` is empty: unity_eq.train.pipeline_zero)."""
    from unity_eq.train.buckets import bucket_collectives, deferred_collectives
    from unity_eq.train.zero import zero_collectives

    record = records[stage]
    m = plan.microbatches
    again = recomputes(plan, stage)
    issued = predicted_collectives(record, gradless | set(deferred), recompute=again)
    out = {k: [c * m, b * m] for k, (c, b) in issued.items()}
    for axis, (count, nbytes) in deferred_collectives(record, deferred).items():
        entry = out.setdefault(("all_reduce", axis, "gradient"), [0, 0])
        entry[0] += count
        entry[1] += nbytes
    if plan.replicas > 1 and zero:
        for key, (count, nbytes) in zero_collectives(zero, DATA_AXIS, dtype_bytes, m).items():
            entry = out.setdefault(key, [0, 0])
            entry[0] += count
            entry[1] += nbytes
    elif plan.replicas > 1 and params:
        entry = out.setdefault(("all_reduce", DATA_AXIS, "gradient"), [0, 0])
        count, nbytes = bucket_collectives([(dtype, nbytes) for _, nbytes, dtype in params])
        entry[0] += count
        entry[1] += nbytes
    for _, nbytes in shared:
        entry = out.setdefault(("all_reduce", STAGES_AXIS, "gradient"), [0, 0])
        entry[0] += 1
        entry[1] += nbytes
    for key, value in predicted_p2p(plan, records, stage).items():
        out[key] = value
    return out
