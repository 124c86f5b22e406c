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
        from unity_eq.train.session import load_rank, loss_of

        trainer = load_rank(job.plan_dir, job.model, shared=job.shared)
        opt = make_optimizer(job.optimizer, trainer.module.parameters(), job.lr)
        feeds = trainer.inputs(job.inputs)
        losses, grads, ledger = [], [], []
        for k in range(job.steps):
            opt.zero_grad()
            loss = loss_of(trainer.module(feeds), job.loss)
            loss.backward()
            losses.append(float(loss.detach()))
            if k == 0:
                grads = [
                    (n, r.box, p.grad.numpy().copy() if p.grad is not None else None) for n, r, p in trainer.shards()
                ]
                ledger = trainer.ledger.as_rows()
            opt.step()
        weights = [(n, r.box, p.detach().numpy().copy()) for n, r, p in trainer.shards()]
        result = {
            "losses": losses,
            "grads": grads,
            "weights": weights,
            "ledger": ledger,
            "gradless": sorted(trainer.module.gradless),
        }
        torch.save(result, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException as exc:
        message = str(exc) if isinstance(exc, UnityEqError) else f"{type(exc).__name__}: {exc}"
        code = exc.exit_code if isinstance(exc, UnityEqError) else 1
        (out / f"error{rank}.txt").write_text(f"{code}\n{message}\n{traceback.format_exc()}")
        raise SystemExit(1) from None


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


def reference_training(job: TrainJob) -> dict[str, Any]:
    """The original model trained on one device (this process), as the ranks train the plan."""
    from unity_eq.train.reference import OnnxModule
    from unity_eq.train.session import loss_of

    module = OnnxModule(job.model, trainable=job.trainable)
    opt = make_optimizer(job.optimizer, module.parameters(), job.lr)
    feeds = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in job.inputs.items()}
    losses, grads = [], {}
    for k in range(job.steps):
        opt.zero_grad()
        loss = loss_of(module(feeds), job.loss)
        loss.backward()
        losses.append(float(loss.detach()))
        if k == 0:
            grads = {n: (p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32))
                     for n, p in module.parameters_by_name().items()}  # fmt: skip
        opt.step()
    weights = {n: p.detach().numpy().copy() for n, p in module.parameters_by_name().items()}
    return {"losses": losses, "grads": grads, "weights": weights}


def _local_bytes(record: ExplainRecord, tid: str) -> int:
    t = record.tensors[tid]
    return int(np.prod(t.local_shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def predicted_collectives(record: ExplainRecord, skip: set[str] = frozenset()) -> dict[Key, list[int]]:  # type: ignore[assignment]
    """The collectives plan.json prices for one training step on every rank: (kind, axis, phase) -> [count,
    bytes per rank]. A combine is a forward all-gather, a reduce a forward all-reduce; a partition or replicate
    whose step has a communication price is a backward all-gather or all-reduce (phase ``gradient`` for a
    replicate of a tensor no model input flows into: a weight's gradient sync). ``skip``: steps whose backward
    carries no gradient at run time (priced, not needed)."""
    from unity_eq.train.rank import depends_on_inputs

    sizes = dict(zip(record.mesh.axes, record.mesh.sizes, strict=True))
    from_inputs = depends_on_inputs(record.steps)
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
                    phase = "backward" if src in from_inputs else "gradient"
                    add(("all_reduce", axis, phase), _local_bytes(record, src))
            case ComputeStepRecord() | InputStepRecord() | WeightStepRecord():
                pass
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


def _compare_collectives(result: TrainingCheck, record: ExplainRecord, ranks: Sequence[dict[str, Any]]) -> None:
    gradless = set(ranks[0]["gradless"])
    predicted = predicted_collectives(record, gradless)
    for text in _priced_gradless(record, gradless):
        result.notes.append(f"plan.json prices a gradient collective where no gradient flows: {text}")
    for rank, data in enumerate(ranks):
        issued = {(k, a, p): [c, b] for k, a, p, c, b in data["ledger"]}
        for key in sorted(set(predicted) | set(issued)):
            want, got = predicted.get(key, [0, 0]), issued.get(key, [0, 0])
            label = f"{key[0]} on axis {key[1]} ({key[2]})"
            ok = want == got
            if rank == 0 or not ok:
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
    shared: Sequence[str] = (),
) -> TrainingCheck:
    """Train ``plan_dir``'s ranks and the original ``model`` for ``steps`` steps and compare (module docstring)."""
    from unity_eq.runtime.checker import check_plan_is_of, random_inputs
    from unity_eq.runtime.plandir import check_inputs, load_plan_dir
    from unity_eq.train.session import read_training_plan, refuse_merged

    if steps < 1:
        raise OptionError(f"`--steps` must be at least 1, got {steps}.")
    if not Path(model).is_file():
        raise OptionError(f"{model}: model not found.")
    record = read_training_plan(plan_dir)
    plan = load_plan_dir(plan_dir, check_files=False)
    check_plan_is_of(model, plan)  # another model's plan: exit 2, as `check` says it
    refuse_merged(record, shared, model)
    feeds = check_inputs(plan, inputs if inputs is not None else random_inputs(plan.input_specs, seed))
    make_optimizer(optimizer, [torch.zeros(1, requires_grad=True)], lr)  # the option checked before any rank
    with tempfile.TemporaryDirectory(prefix="unity-eq-train-") as tmp:
        trainable = (
            frozenset(s for w in record.weights.values() if w.trainable for s in w.sources) if record.weights else None
        )
        job = TrainJob(str(plan_dir), str(model), feeds, steps, optimizer, lr, loss, tmp, tuple(shared), trainable)
        reference = reference_training(job)  # first: a model that cannot train fails before any rank starts
        ranks = spawn_ranks(len(record.mesh.ranks), job)
    result = TrainingCheck(tolerance)
    for k, (want, *got) in enumerate(zip(reference["losses"], *(r["losses"] for r in ranks), strict=True)):
        error = max(abs(g - want) / max(abs(want), 1e-30) for g in got)
        result.add(
            error <= tolerance, f"loss of step {k + 1}: {want:.6g} (one device), worst relative error {error:.2e}"
        )
    _compare_pieces(result, "gradient", [r["grads"] for r in ranks], reference["grads"])
    _compare_pieces(
        result, f"weight after {steps} {optimizer} step(s)", [r["weights"] for r in ranks], reference["weights"]
    )
    _compare_collectives(result, record, ranks)
    return result


def assert_training_check(result: TrainingCheck) -> None:
    failure = result.first_failure()
    if failure is not None:
        raise CheckFailed(f"training does not match one device: {failure}")
