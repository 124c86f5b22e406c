"""The ranks of ``check --training``: processes started here (``torch.multiprocessing``, gloo on the CPU; no
torchrun), each training the plan for K steps and writing what it saw (losses, its gradient and weight pieces,
its ledger of collectives) for :mod:`unity_eq.train.check` to compare.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unity_eq.errors import OptionError, RuntimeBackendError, UnityEqError
from unity_eq.train.predict import Key, predicted_pipeline, priced_gradless
from unity_eq.train.torch_ops import array_of

__all__ = ["TrainJob", "free_port", "init_rank", "make_optimizer", "spawn_ranks"]


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

    torch.set_num_threads(rank_threads(world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _rank_main(rank: int, world: int, port: int, job: TrainJob) -> None:
    """One rank of ``check --training``: K steps, its pieces and ledger written to ``job.out_dir``."""
    import torch.distributed as dist

    out = Path(job.out_dir)
    try:
        init_rank(rank, world, port)
        from unity_eq.train.load import load_rank

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
                grads = [(n, r.box, array_of(g) if g is not None else None) for n, r, g in trainer.pieces("grads")]
            opt.step()
            if k == 0:  # after the step: ZeRO all-gathers the updated weights there
                ledger = trainer.ledger.as_rows()
        weights = [(n, r.box, array_of(w)) for n, r, w in trainer.pieces("weights") if w is not None]
        result = {
            "losses": losses,
            "grads": grads,
            "weights": weights,
            "ledger": ledger,
            "gradless": sorted(trainer.plan_module.gradless),
            "deferred": dict(trainer.plan_module.deferred),
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
        for text in priced_gradless(trainer.record, trainer.plan_module.gradless)
    ]
    return notes + [
        f"weight {s.name!r} is trained by several stages: its gradients are summed over them (an all-reduce on "
        f"ranks {list(s.group.ranks)} that plan.json does not price)"
        for s in trainer.shared
    ]


def rank_threads(world: int) -> int:
    """Intra-op threads of each of ``world`` ranks on this machine: its cores shared among them."""
    return max(1, (os.cpu_count() or 1) // world)


def start_method(world: int) -> str:
    """``fork`` where each rank runs one thread: the ranks inherit this process's imports (torch, the frontend),
    which under load took most of a check's time when each rank imported them again. ``spawn`` where a rank
    gets several: this process has already run torch's OpenMP thread pool (the one-device reference trains
    first), and a forked child that enters a parallel region of it waits for threads that do not exist in it:
    a one-rank check on a machine of 2 cores hung so, float32 or bfloat16."""
    return "fork" if rank_threads(world) == 1 else "spawn"


def spawn_ranks(world: int, job: TrainJob) -> list[dict[str, Any]]:
    """Run ``job`` on ``world`` processes; their results in rank order, or the first failed rank's error (the
    others are stopped: torch's spawn terminates them)."""
    import logging

    import torch.multiprocessing as mp

    logger = logging.getLogger("torch.multiprocessing.spawn")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "Terminating process N via signal SIGTERM" lines: the error says it
    try:
        mp.start_processes(
            _rank_main, args=(world, free_port(), job), nprocs=world, join=True, start_method=start_method(world)
        )
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
