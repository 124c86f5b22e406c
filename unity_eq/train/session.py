"""Training a plan in this process, one rank of it: the Python API (docs/training.md).

:func:`unity_eq.train.load.load_rank` reads a plan directory for this process's rank of ``torch.distributed``
(started by torchrun, or by :func:`unity_eq.train.spawn.spawn_ranks`) and returns a :class:`RankTrainer`
(an SPMD plan's; this module holds it and the helpers both kinds of plan load with): its ``module`` is a
``torch.nn.Module`` whose parameters are this rank's shards; call it on the model inputs, take the loss,
``backward()``, step any optimizer over ``module.parameters()``, and :meth:`RankTrainer.save` a checkpoint of
the whole model in the source model's parameter names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.errors import OptionError, PlanError
from unity_eq.planfile import ExplainRecord, read_explain_record
from unity_eq.train.rank import RankModule, Region
from unity_eq.train.torch_ops import array_of, tensor_of
from unity_eq.train.zero import Zero3Module, ZeroOptimizer

__all__ = ["RankTrainer", "loss_of", "mesh_groups", "read_training_plan"]


def read_training_plan(plan_dir: str | Path) -> ExplainRecord:
    """plan.json of an SPMD plan directory, checked as ``run`` checks it. A pipeline plan (callers ask
    ``is_pipeline_dir`` first and train it with unity_eq.train.pipeline) is refused: a plan-only or damaged one
    with its own error."""
    import json

    from unity_eq.runtime.plandir import load_plan_dir

    root = Path(plan_dir)
    try:
        kind = json.loads((root / "plan.json").read_text()).get("plan")
    except (OSError, ValueError, AttributeError):
        kind = None  # load_plan_dir says what is wrong with the directory
    if kind == "pipeline":
        from unity_eq.runtime.pipeline import load_pipeline_dir

        load_pipeline_dir(root)  # a plan-only or damaged pipeline plan: the error `run` gives
        raise PlanError(f"{root}: a pipeline plan, not an SPMD plan: unity_eq.train.pipeline trains it.")
    load_plan_dir(root, check_files=False)  # the checks `run` makes: a plan directory, not plan-only, collectives
    return read_explain_record(root / "plan.json")


def mesh_groups(record: ExplainRecord) -> dict[str, list[tuple[int, ...]]]:
    """Every mesh axis's groups (ranks differing only along it, in axis order), as plan.json's collectives name
    them."""
    sizes = list(record.mesh.sizes)
    ranks = np.arange(int(np.prod(sizes)), dtype=np.int64).reshape(sizes)
    return {
        axis: [tuple(int(r) for r in row) for row in np.moveaxis(ranks, i, -1).reshape(-1, sizes[i]).tolist()]
        for i, axis in enumerate(record.mesh.axes)
    }


def make_groups(record: ExplainRecord, rank: int, ledger: coll.Ledger, ordered_sum: bool) -> dict[str, coll.AxisGroup]:
    """This rank's process group on every mesh axis. Every rank creates every group, in the same order, as
    torch.distributed requires."""
    out: dict[str, coll.AxisGroup] = {}
    for axis, groups in mesh_groups(record).items():
        for ranks in groups:
            group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                out[axis] = coll.AxisGroup(axis, ranks, ranks.index(rank), group, ledger, ordered_sum)
    return out


def loss_of(outputs: Mapping[str, torch.Tensor], how: str | None) -> torch.Tensor:
    """The loss: the model's first output when it is a scalar, else ``how`` (``sum`` or ``mean``) over it."""
    first = next(iter(outputs.values()))
    if how is None:
        if first.numel() != 1:
            name = next(iter(outputs))
            raise OptionError(
                f"the model's first output {name!r} has shape {list(first.shape)}, not a scalar loss. Pass "
                "`--loss sum` or `--loss mean` to train on its sum or mean."
            )
        return first.reshape(())
    if how == "sum":
        return first.sum()
    if how == "mean":
        return first.mean()
    raise OptionError(f"`--loss`: expected sum or mean, got {how!r}.")


def resolve_device(device: str, ranks_here: int = 1) -> tuple[str, str]:
    """``cpu`` or ``cuda`` for ``--device cpu|cuda|auto``, and a note when ``cuda`` was asked for and the CPU is
    what runs (torch sees no CUDA device: GPU code falls back, it does not crash). ``ranks_here`` ranks on this
    node need as many GPUs: NCCL refuses two ranks on one GPU, so fewer is one error before any collective."""
    if device not in ("cpu", "cuda", "auto"):
        raise OptionError(f"`--device`: expected cpu, cuda or auto, got {device!r}.")
    if device == "cpu":
        return "cpu", ""
    if not torch.cuda.is_available():
        note = "" if device == "auto" else "`--device cuda`: torch sees no CUDA device; training on the CPU (gloo)"
        return "cpu", note
    count = torch.cuda.device_count()
    if ranks_here > count and device == "auto":
        return "cpu", f"`--device auto`: {ranks_here} ranks on this node and {count} GPU(s); training on the CPU (gloo)"
    if ranks_here > count:
        raise OptionError(
            f"`--device {device}`: {ranks_here} ranks on this node and {count} GPU{'s' if count != 1 else ''}; NCCL "
            "runs one rank per GPU. Use a plan of at most that many devices per node, or `--device cpu`."
        )
    return "cuda", ""


def pick_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda`` (one GPU per local rank) or ``auto`` (cuda when available); ``cuda`` without a CUDA
    device is the CPU (:func:`resolve_device` says so once)."""
    if resolve_device(device)[0] == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def check_world_size(plan_dir: str | Path, world: int, what: str, detail: str = "") -> None:
    """Refuse a torch.distributed world whose size is not the plan's ``world`` ranks (``what``: the plan's kind,
    ``detail``: its layout in words), saying how to start it."""
    if dist.get_world_size() != world:
        raise OptionError(
            f"world size: {dist.get_world_size()} processes were started, the {what} in {plan_dir} has {world} "
            f"ranks{detail}. Run `torchrun --nproc_per_node {world} -m unity_eq train {plan_dir}`."
        )


def source_model(model: str | Path | None, recorded: str | Path) -> Path:
    """The ONNX model whose weights start training: ``model``, or the one plan.json says the plan was made from
    (``recorded``); refused when it is not there."""
    source = Path(model) if model is not None else Path(recorded)
    if not source.is_file():
        raise OptionError(
            f"{source}: the model the plan was made from is not there; its weights start training. Pass the model "
            "(`--model`) or a checkpoint (`--load`)."
        )
    return source


def rank_device(device: str, rank: int, ordered_sum: bool | None) -> tuple[torch.device, bool]:
    """This rank's device (``LOCAL_RANK`` picks its GPU) and whether its collectives sum in rank order
    (``ordered_sum``; by default on the CPU: gloo all-gathers and sums in group order, equal bits on every rank)."""
    torch_device = pick_device(device, int(os.environ.get("LOCAL_RANK", rank)))
    return torch_device, torch_device.type == "cpu" if ordered_sum is None else ordered_sum


@dataclass
class RankTrainer:
    """One rank's training state: the module to call (its parameters are what this rank trains: its shards of
    the plan's weights, or under ZeRO-3 its shards of those), the plan's :class:`RankModule` it runs, its
    ledger of collectives, and the ZeRO level over the data axis (``zero_group``), if any."""

    record: ExplainRecord
    rank: int
    module: torch.nn.Module
    ledger: coll.Ledger
    device: torch.device
    rank_module: RankModule | None = None  # None: ``module`` is the RankModule itself
    zero: int = 0
    zero_group: coll.AxisGroup | None = None
    zero_optimizer: ZeroOptimizer | None = None  # ZeRO-1/2: made by :meth:`optimizer`

    def __post_init__(self) -> None:
        if self.rank_module is None:
            assert isinstance(self.module, RankModule)
            self.rank_module = self.module

    @property
    def plan_module(self) -> RankModule:
        assert self.rank_module is not None
        return self.rank_module

    @property
    def world_size(self) -> int:
        return len(self.record.mesh.ranks)

    def optimizer(self, make: Callable[[Any], torch.optim.Optimizer]) -> Any:
        """The optimizer ``make(params)`` over what this rank trains: ZeRO-1/2 wrap it in a
        :class:`~unity_eq.train.zero.ZeroOptimizer` (it steps this rank's shard, then all-gathers the weights);
        otherwise (ZeRO-3's module already holds shards) it is ``make(module.parameters())``."""
        if self.zero in (1, 2):
            assert self.zero_group is not None
            sharded, plain = self._zero_split()
            self.zero_optimizer = ZeroOptimizer(sharded, self.zero_group, self.zero, make, plain)
            return self.zero_optimizer
        return make(self.module.parameters())

    def _zero_split(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        """The parameters ZeRO shards and those it leaves whole: an SPMD plan's choice
        (unity_eq.train.zero_plan); a pipeline stage's replicas sum every weight, so ZeRO takes them all."""
        if self.plan_module.zero_params is None:
            return list(self.module.parameters()), []
        return self.plan_module.zero_split()

    def inputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Model inputs as tensors on this rank's device (every rank passes the whole batch)."""
        return {name: tensor_of(a, self.device) for name, a in arrays.items()}

    def shards(self) -> list[tuple[str, Region, torch.nn.Parameter]]:
        return self.plan_module.named_shards()

    def pieces(self, what: str = "weights") -> list[tuple[str, Region, torch.Tensor | None]]:
        """This rank's piece of every weight it trains (or its gradient: ``what="grads"``, the one summed over
        the plan's axes), where it lies in the source weight: under ZeRO gathered back from the data axis's
        shards (not counted in the ledger: a diagnostic). Every rank must call it under ZeRO."""
        shards = self.shards()
        values: list[torch.Tensor | None]
        if self.zero == 3:
            assert isinstance(self.module, Zero3Module)
            values = list(self.module.full_weights() if what == "weights" else self.module.full_gradients())
        elif what == "grads" and self.zero_optimizer is not None:
            summed = dict(zip(map(id, self.zero_optimizer.params), self.zero_optimizer.full_gradients(), strict=True))
            values = [summed.get(id(p), p.grad) for _, _, p in shards]
        else:
            values = [p.detach() if what == "weights" else p.grad for _, _, p in shards]
        return [(name, region, value) for (name, region, _), value in zip(shards, values, strict=True)]

    def forward_backward(self, batch: Mapping[str, torch.Tensor], how: str | None) -> torch.Tensor:
        """One step's forward and backward on the whole batch (the plan's collectives run in both); returns the
        loss. A pipeline rank runs its schedule here instead (unity_eq.train.pipeline.PipelineTrainer)."""
        loss = loss_of(self.module(batch), how)
        loss.backward()
        return loss.detach()

    def gather_full(self, what: str = "weights") -> dict[str, np.ndarray] | None:
        """The whole model's weights (or gradients: ``what="grads"``) in the source names, assembled from every
        rank's shards; returned on rank 0 (None elsewhere). Every rank must call it."""
        mine = []
        for name, region, value in self.pieces(what):
            if value is None:
                value = torch.zeros(tuple(n for _, n in region.box))
            mine.append((name, region.box, array_of(value)))
        pieces: list[Any] = [None] * self.world_size
        dist.all_gather_object(pieces, mine)
        if self.rank != 0:
            return None
        return assemble(pieces, self.plan_module.source_shapes)

    def save(self, path: str | Path) -> Path | None:
        """Write the whole model's weights in the source names (safetensors when installed, else torch's
        format), atomically, from rank 0. Every rank must call it."""
        from unity_eq.train.checkpoint import write_checkpoint

        full = self.gather_full("weights")
        if full is None:
            return None
        return write_checkpoint(Path(path), full)

    def load(self, path: str | Path) -> None:
        """Set this rank's shards from a checkpoint of the whole model (source names and shapes)."""
        from unity_eq.train.checkpoint import read_checkpoint

        full = read_checkpoint(Path(path))
        values = []
        for name, region, _ in self.shards():
            if name not in full:
                raise OptionError(f"`--load` {path}: has no parameter {name!r}, which the plan trains.")
            value = full[name]
            expected = self.plan_module.source_shapes[name]
            if tuple(value.shape) != expected:
                raise OptionError(
                    f"`--load` {path}: parameter {name!r} has shape {list(value.shape)}, the model's is "
                    f"{list(expected)}. Load a checkpoint of this model."
                )
            values.append(tensor_of(value[region.index()], self.device))
        if isinstance(self.module, Zero3Module):
            self.module.set_full(values)
            return
        with torch.no_grad():
            for (_, _, param), piece in zip(self.shards(), values, strict=True):
                param.copy_(piece)
        if self.zero_optimizer is not None:
            by_param = {id(param): piece for (_, _, param), piece in zip(self.shards(), values, strict=True)}
            self.zero_optimizer.sharded.set_full([by_param[id(p)] for p in self.zero_optimizer.params])


def assemble(pieces: Sequence[Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Whole tensors from every rank's ``(name, box, value)`` pieces (replicas write the same region)."""
    out: dict[str, np.ndarray] = {}
    for rank_pieces in pieces:
        for name, box, value in rank_pieces:
            if name not in out:
                out[name] = np.zeros(shapes[name], value.dtype)
            out[name][tuple(slice(s, s + n) for s, n in box)] = value
    return out


def zero_data_axis(record: ExplainRecord, zero: int, axis: str | None) -> str | None:
    """The mesh axis ZeRO shards over (None without ZeRO): ``axis``, or the mesh's only axis."""
    if zero == 0:
        return None
    axes = list(record.mesh.axes)
    if axis is None:
        if len(axes) != 1:
            raise OptionError(
                f"ZeRO-{zero}: the plan's mesh has axes {', '.join(axes)}; say which is the data axis "
                "(`--zero-axis AXIS`; in Python `zero_axis=`)."
            )
        axis = axes[0]
    if axis not in axes:
        raise OptionError(f"ZeRO-{zero}: the plan's mesh has no axis {axis!r} (its axes: {', '.join(axes)}).")
    return axis
